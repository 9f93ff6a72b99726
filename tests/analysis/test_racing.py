"""Analyses on raced studies (docs/methods.md, "Racing"): a raced store, made by cutting the trials of
a full-protocol store the way racing stops them, must give the full protocol's steps to result and
steps intervals, and refuse what it cannot know."""

import math

import numpy as np
import pytest

from analysis_fixtures import race_trials, trial
from batchlab.analysis.bootstrap import (
    best_of_k_upper,
    bootstrap_critical_batch_size,
    critical_batch_size_with_intervals,
    kth_smallest,
)
from batchlab.analysis.budgets import best_measurement, best_measurement_by_budget
from batchlab.analysis.metaparameters import RACED, trial_outcomes
from batchlab.analysis.selection import Selection
from batchlab.analysis.steps_to_result import (
    steps_to_result,
    trial_first_steps,
    trial_unknown_from_by_batch_size,
    trial_steps_by_batch_size,
)
from batchlab.errors import BatchlabError

W = "mnist/fc_64_64_64/momentum"
M = "val/classification_error"
GOAL = 0.05
STEPS = list(range(10, 401, 10))
BATCH_SIZES = (8, 16, 32, 64, 128)


def study(b):
    return f"race{b}"


DEFINITIONS = {study(b): {"race": {"keep": 2}, "stop_rule": {"metric": M, "goal": GOAL, "maximize": False}}
               for b in BATCH_SIZES}


def full_trials(seed=0, k=8):
    """K trials per batch size with exponential error curves to a floor (some floors above the goal),
    evaluated every 10 steps up to 400; trials 1 and 2 of B=32 meet the goal at the same step (a tie)."""
    rng = np.random.default_rng(seed)
    trials = []
    for b in BATCH_SIZES:
        tau = 40.0 * (1 + 16 / b)
        for t in range(1, k + 1):
            scale, floor = tau * rng.uniform(0.6, 2.0), rng.uniform(0.0, 0.08)
            if b == 32 and t == 2:  # the same curve as trial 1: a tie at the best step
                scale, floor = trials[-1]["_curve"]
            rows = [(s, {M: floor + (1 - floor) * math.exp(-s / scale)}) for s in STEPS]
            record = trial(W, b, t, rows, study=study(b), learning_rate=0.01 * t, momentum=1 - 0.5 ** t)
            record["_curve"] = (scale, floor)
            trials.append(record)
    for record in trials:
        del record["_curve"]
    return trials


@pytest.fixture(scope="module")
def stores():
    from analysis_fixtures import tables_from_trials
    from batchlab.analysis.tables import connect_tables

    full = full_trials()
    raced = race_trials(full, M, GOAL, keep=2)
    assert sum(t["status"] == "RACED" for t in raced) >= 10  # the fixture really races
    cons = [connect_tables(**tables_from_trials(x, definitions=DEFINITIONS)) for x in (full, raced)]
    yield cons
    for con in cons:
        con.close()


def fields(results):
    return [(r.batch_size, r.steps, r.trial_id, r.steps_lower, r.censored_at, r.value, r.parameters, r.n_trials)
            for r in results]


@pytest.mark.parametrize("goal", [GOAL, 0.08, 0.3])  # the stop goal and looser ones
def test_steps_to_result_equals_the_full_protocol(stores, goal):
    full, raced = stores
    want, got = steps_to_result(full, W, M, goal), steps_to_result(raced, W, M, goal)
    assert fields(got) == fields(want)
    assert all(r.reached for r in want)
    assert sum(r.n_raced for r in got) >= 10 and all(r.n_raced == 0 for r in want)
    assert any(g.n_reached < w.n_reached for g, w in zip(got, want)) or goal != GOAL  # unknowns are not "reached"
    assert got[0].to_dict()["n_raced"] == got[0].n_raced


def test_budgets_within_every_raced_curve_are_exact_for_steps(stores):
    full, raced = stores
    for budget in (30, 60):
        assert fields(steps_to_result(raced, W, M, 0.3, step_budget=budget)) == fields(
            steps_to_result(full, W, M, 0.3, step_budget=budget))


def test_raced_trials_are_unknown_not_unreached(stores):
    _, raced = stores
    frame = trial_first_steps(raced, Selection(W, M, GOAL))
    is_raced = frame["status"] == "RACED"
    assert frame.loc[is_raced, "first_step"].isna().all()
    assert (frame.loc[is_raced, "raced_at"] == [int(x) for x in frame.loc[is_raced, "last_step"]]).all()
    assert not frame.loc[~is_raced, "first_step"].isna().any()
    steps, bounds = trial_steps_by_batch_size(frame), trial_unknown_from_by_batch_size(frame)
    for b in steps:
        assert (np.isnan(steps[b]) == ~np.isnan(bounds[b])).all()  # NaN never became inf or a number
    # an unknown first step is past the trial's rows and at least the race bound (the 2nd best's step)
    for b, group in frame[is_raced].groupby("batch_size"):
        second = sorted(frame[(frame.batch_size == b) & ~is_raced]["first_step"])[1]
        assert (group["unknown_from"] == np.fmax(group["raced_at"] + 1, second)).all()


def test_steps_intervals_and_fit_equal_the_full_protocol(stores):
    full, raced = stores
    selection = Selection(W, M, GOAL)
    want = critical_batch_size_with_intervals(full, selection, n_boot=200, seed=3)
    got = critical_batch_size_with_intervals(raced, selection, n_boot=200, seed=3)
    assert got.fit == want.fit and got.intervals == want.intervals and got.estimates == want.estimates
    for w, g in zip(want.regimes, got.regimes):
        assert g["steps_interval"] == w["steps_interval"] and g["steps_interval_order"] == 2
        assert g["steps_interval_note"] == w["steps_interval_note"]
        assert (g["steps"], g["steps_lower"], g["censored_at"], g["n_trials"]) == (
            w["steps"], w["steps_lower"], w["censored_at"], w["n_trials"])
    assert sum(r["steps_interval"][1] is not None for r in got.regimes) >= 3
    assert want.n_undetermined == 0 and got.n_undetermined > 0
    assert any(f"{got.n_undetermined} of 200 resampled curves are undetermined (racing" in x for x in got.warnings)
    assert got.to_dict()["bootstrap"]["n_undetermined"] == got.n_undetermined


def test_stricter_goal_is_refused_not_reported(stores):
    _, raced = stores
    with pytest.raises(BatchlabError, match=r"is not determined: .*RACED trial.*raced study race\d+ .*keep 2, stop goal "
                                            f"{M} < 0.05.*re-run the study without --race") as info:
        steps_to_result(raced, W, M, 0.02)
    assert "\n" not in str(info.value)
    with pytest.raises(BatchlabError, match="is not determined"):
        trial_first_steps(raced, Selection(W, M, 0.02))
    with pytest.raises(BatchlabError, match="is not determined"):
        critical_batch_size_with_intervals(raced, Selection(W, M, 0.02), n_boot=10)


def test_a_first_n_cut_that_leaves_only_raced_trials_is_refused(make_con):
    trials = [trial(W, 8, t, [(s, {M: v}) for s, v in rows], study="s")
              for t, rows in ((1, [(10, 0.5), (20, 0.3)]), (2, [(10, 0.5), (20, 0.04)]), (3, [(10, 0.5), (20, 0.03)]))]
    trials[0]["status"] = "RACED"  # stopped at 20: trials 2 and 3 met the goal by then
    con = make_con(trials, definitions={"s": {"race": {"keep": 2}}})
    assert steps_to_result(con, W, M, 0.05)[0].steps == 20
    # the first-N cut itself is not determined: the full protocol may have ended trial 1 INFEASIBLE
    with pytest.raises(BatchlabError, match=r"the first 1 of 3 trials include 1 RACED trial\(s\), whose later status"):
        steps_to_result(con, W, M, 0.05, max_trials=1)
    with pytest.raises(BatchlabError, match=r"the first 2 of 3 trials include 1 RACED"):
        steps_to_result(con, W, M, 0.05, max_trials=2)


def test_kth_smallest_is_used_only_where_determined():
    nan, inf = np.nan, np.inf
    assert kth_smallest(np.array([30.0, inf, 10.0]), 2) == 30.0
    assert kth_smallest(np.array([30.0, nan, 10.0]), 2, np.array([nan, 40.0, nan])) == 30.0
    assert kth_smallest(np.array([30.0, nan, 10.0]), 2, np.array([nan, 20.0, nan])) is None  # might be 25
    assert kth_smallest(np.array([30.0, nan, 10.0]), 2) is None  # no bound given
    assert kth_smallest(np.array([inf, nan, 10.0]), 2, np.array([nan, 500.0, nan])) is None  # not "never reached"
    assert kth_smallest(np.array([nan, 10.0]), 2, np.array([20.0, nan])) is None
    values, bounds = np.array([10.0, 30.0, nan, nan]), np.array([nan, nan, 30.0, 30.0])
    upper, k, _ = best_of_k_upper(values, 0.9, bounds)
    assert (upper, k) == (30.0, 2)
    assert best_of_k_upper(values, 0.9)[0] is None and best_of_k_upper(values, 0.9, bounds - 1)[0] is None


def test_unknown_kth_trial_gets_a_racing_note_and_undetermined_replicates_are_left_out():
    nan = np.nan
    steps = {8: np.array([100.0, 120.0, nan, nan]), 16: np.array([60.0, nan, nan, nan]), 32: np.array([40.0, 45.0])}
    raced_at = {8: np.array([nan, nan, 130.0, 140.0]), 16: np.array([nan, 60.0, 60.0, 60.0]),
                32: np.array([nan, nan])}
    est = bootstrap_critical_batch_size(steps, n_boot=100, seed=0, unknown_from=raced_at)
    rows = {r["batch_size"]: r for r in est.regimes}
    assert rows[8]["steps_interval"] == [None, 120] and rows[8]["n_unknown"] == 2
    assert rows[16]["steps_interval"] == [None, None]
    assert rows[16]["steps_interval_note"] == "unknown: the 2nd best trial was stopped by racing"
    assert est.curve.steps == (100, 60, 40)
    assert 0 < est.n_undetermined < 100
    assert any("resampled curves are undetermined" in w for w in est.warnings)
    for row in est.regimes:  # lower bounds; with the undetermined share they sum to 1 (those reading regimes)
        shares = [v for v in row["regime_fractions"].values() if v is not None]
        assert all(0 <= v <= 1 for v in shares)
        assert 0 < row["regime_fractions_undetermined"] < 1
        assert sum(shares) + row["regime_fractions_undetermined"] <= 1 + 1e-12
    with pytest.raises(BatchlabError, match=r"not determined at batch size\(s\) \[16\]"):
        bootstrap_critical_batch_size(steps | {16: np.array([nan, 70.0])}, n_boot=10,
                                      unknown_from=raced_at | {16: np.array([50.0, nan])})


def test_best_measurement_refuses_raced_studies_unless_every_curve_is_complete(stores):
    full, raced = stores
    with pytest.raises(BatchlabError, match=r"raced study race\d+ stopped trial \d+ at step \d+ .*under no budget "
                                            r".*re-run the study without --race") as info:
        best_measurement(raced, W, M)
    assert "\n" not in str(info.value)
    with pytest.raises(BatchlabError, match="under step budget 400"):
        best_measurement(raced, W, M, step_budget=400)
    with pytest.raises(BatchlabError, match="re-run the study without --race"):
        best_measurement_by_budget(raced, W, M, [20, 400])
    smallest = int(trial_first_steps(raced, Selection(W, M, GOAL)).query("status == 'RACED'")["raced_at"].min())
    assert best_measurement(raced, W, M, step_budget=smallest) == best_measurement(full, W, M, step_budget=smallest)
    got = best_measurement_by_budget(raced, W, M, [10, smallest])
    want = best_measurement_by_budget(full, W, M, [10, smallest])
    np.testing.assert_array_equal(got.best, want.best)
    assert best_measurement(raced, W, M, statuses=("COMPLETE",))  # leaving the raced trials out is allowed


def test_scatter_outcomes_show_raced_trials_as_their_own_class(stores):
    full, raced = stores
    want, got = trial_outcomes(full, Selection(W, M, GOAL)), trial_outcomes(raced, Selection(W, M, GOAL))
    is_raced = (got["status"] == "RACED").to_numpy()
    assert (got.loc[is_raced, "outcome"] == RACED).all() and got.loc[is_raced, "first_step"].isna().all()
    assert (got.loc[~is_raced, "outcome"] == want.loc[~is_raced, "outcome"]).all()
    assert (got["best"] == want["best"]).all()
    assert set(want.loc[is_raced, "outcome"]) <= {"reached", "not_reached"}  # what the full run said of them


def test_ties_and_looser_goals_on_a_small_raced_study(make_con):
    rows = {1: [0.9, 0.5, 0.2, 0.1], 2: [0.9, 0.3, 0.04, 0.01], 3: [0.9, 0.6, 0.04, 0.02], 4: [0.9, 0.8, 0.07, 0.03],
            5: [0.9, 0.9, 0.9, 0.9]}
    full = [trial(W, 8, t, [(s, {M: v}) for s, v in zip((10, 20, 30, 40), values)], study="s", learning_rate=0.1 * t)
            for t, values in rows.items()]
    raced = race_trials(full, M, 0.05, keep=2)
    assert [t["status"] for t in raced] == ["RACED", "COMPLETE", "COMPLETE", "RACED", "RACED"]
    # trials 4 and 5 stop at 20, before the best step 30: (30, 4) > the bound (30, 3)
    assert [t["rows"][-1][0] for t in raced] == [30, 40, 40, 20, 20]
    definition = {"race": {"keep": 2}, "stop_rule": {"metric": M, "goal": 0.05, "maximize": False}}
    cons = [make_con(x, definitions={"s": definition}) for x in (full, raced)]
    for goal in (0.05, 0.1, 0.25, 0.55):  # trials 2 and 3 tie at 30 for 0.05: the lower id wins
        want, got = (steps_to_result(con, W, M, goal)[0] for con in cons)
        assert fields([got]) == fields([want]), goal
    assert steps_to_result(cons[1], W, M, 0.05)[0].trial_id == 2
    # a budget before the race bound (30): the raced trials (rows end at 20) cannot reach it within 25
    want, got = (steps_to_result(con, W, M, 0.05, step_budget=25)[0] for con in cons)
    assert fields([got]) == fields([want]) and not got.reached and got.censored_at == 20
    frame = trial_first_steps(cons[1], Selection(W, M, 0.05, step_budget=25))
    assert list(frame["first_step"]) == [np.inf] * 5 and frame["unknown_from"].isna().all()
    assert np.isnan(trial_first_steps(cons[1], Selection(W, M, 0.05, step_budget=35))["first_step"][3])
    assert steps_to_result(cons[1], W, M, 0.25)[0].n_reached == 3  # raced trial 1 met the looser goal
    with pytest.raises(BatchlabError, match="stopped at step 20 without meeting it before the best known trial "
                                            r"reached it \(40 steps\)"):
        steps_to_result(cons[1], W, M, 0.015)
    # without its stop rule the race bound is unknown: only the rows' end counts, and 20 < 30 is refused
    con = make_con(raced, definitions={"s": {"race": {"keep": 2}}})
    with pytest.raises(BatchlabError, match=r"raced study s \(keep 2\), e.g. trial 4, stopped at step 20"):
        steps_to_result(con, W, M, 0.05)
