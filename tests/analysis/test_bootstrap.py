import json

import numpy as np
import pytest

from analysis_fixtures import trial
from batchlab.analysis.bootstrap import bootstrap_critical_batch_size, critical_batch_size_with_intervals
from batchlab.analysis.critical_batch_size import REGISTRY, fit_steps_curve
from batchlab.analysis.selection import Selection
from batchlab.analysis.steps_to_result import steps_curve, steps_to_result
from batchlab.errors import BatchlabError

W = "mnist/simple_cnn_base/sgd"
M = "val/classification_error"
BATCH_SIZES = 2 ** np.arange(0, 12)
# Evaluation steps on a ~4% log grid: measured steps to result are always evaluation steps.
EVAL_GRID = np.unique(np.round(np.geomspace(1, 1e7, 400)))


def synthetic_trials(s_min, b_crit, n_trials, seed, miss=0.3):
    """Each trial's first qualifying step: the true S(B) times a random slowdown, on the eval grid;
    a fraction ``miss`` of trials never reach the goal."""
    rng = np.random.default_rng(seed)
    out = {}
    for b in BATCH_SIZES:
        raw = s_min * (1 + b_crit / b) * np.exp(rng.exponential(0.3, size=n_trials))
        steps = EVAL_GRID[np.searchsorted(EVAL_GRID, raw)]
        steps[rng.random(n_trials) < miss] = np.inf
        out[int(b)] = steps
    return out


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_seed_must_be_a_non_negative_integer(seed):
    data = synthetic_trials(1000.0, 64.0, 3, seed=1)
    with pytest.raises(BatchlabError, match="seed must be an integer >= 0"):
        bootstrap_critical_batch_size(data, n_boot=5, seed=seed)


def test_same_seed_same_answer_intervals_do_not_depend_on_the_seed():
    data = synthetic_trials(1000.0, 64.0, 10, seed=1)
    a = bootstrap_critical_batch_size(data, n_boot=60, seed=3)
    b = bootstrap_critical_batch_size(data, n_boot=60, seed=3)
    c = bootstrap_critical_batch_size(data, n_boot=60, seed=4)
    assert json.dumps(a.to_dict()) == json.dumps(b.to_dict())
    # the intervals and the point estimate do not resample; the seed only drives the regime shares
    assert a.intervals == c.intervals and a.fit == c.fit


def test_point_estimate_is_the_plain_fit_and_lies_in_its_interval():
    data = synthetic_trials(1000.0, 64.0, 10, seed=2)
    est = bootstrap_critical_batch_size(data, n_boot=60, seed=0, level=0.9)
    point_steps = [(b, None if not np.isfinite(s.min()) else int(s.min())) for b, s in data.items()]
    from batchlab.analysis.curve import StepsCurve

    from batchlab.analysis.scatter import scatter_from_trials

    # the one fit: the minima's curve under the trials' own scatter
    assert est.fit == fit_steps_curve(StepsCurve.from_points(point_steps), scatter=scatter_from_trials(data))
    assert est.fit.scatter_source in ("trials", "residuals") and est.fit.scatter_dof > 0
    data_read = {d.name for d in REGISTRY if d.source == "data"}
    for name, (low, high) in est.intervals.items():
        if name in data_read:
            assert (low, high) == (None, None), name
            continue
        assert low <= est.estimates[name] <= high, name
    summary = est.to_dict()
    assert set(summary["critical_batch_sizes"]) == {d.name for d in REGISTRY}
    assert summary["bootstrap"] == {"n_boot": 60, "n_failed": 0, "n_undetermined": 0, "level": 0.9, "seed": 0}
    assert summary["fit_intervals"]["s_min"]["low"] <= summary["fit"]["s_min"]
    assert summary["critical_batch_sizes"]["perfect_scaling_end"]["low"] is None  # data-read: no interval
    assert summary["b0"] == 1 and summary["points_used"] == 12 and summary["batch_size_range"] == [1, 2048]


def test_identical_trials_give_certain_regimes():
    steps = {int(b): np.full(5, float(1000 * (1 + 64 / b))) for b in BATCH_SIZES}
    est = bootstrap_critical_batch_size(steps, n_boot=30, seed=0)
    assert est.estimates["mccandlish_b_crit"] == pytest.approx(64.0, rel=1e-3)
    low, high = est.intervals["mccandlish_b_crit"]
    assert low == pytest.approx(64.0, rel=0.02) and high == pytest.approx(64.0, rel=0.02)
    for row in est.regimes:
        assert row["regime_fractions"][row["regime"]] == 1.0
        assert row["steps_interval"] == [None, row["steps"]]
    regimes = [r["regime"] for r in est.regimes]
    assert regimes[0] == "perfect_scaling" and regimes[-1] == "maximal_data_parallelism"


def test_failed_resamples_are_counted_and_warned_about():
    # Three batch sizes, each with one reaching trial out of two: a replicate misses a batch size with
    # probability 1/4, and has < 2 reached with probability 3 * 3/4 * (1/4)^2 + (1/4)^3 = 0.156.
    data = {1: np.array([4000.0, np.inf]), 2: np.array([np.inf, 2100.0]), 4: np.array([1100.0, np.inf])}
    est = bootstrap_critical_batch_size(data, n_boot=400, seed=0)
    assert 35 <= est.n_failed <= 90
    assert any("fewer than two reached batch sizes" in w for w in est.warnings)
    # two trials: the upper bound of the best-of-2 median is the second-best trial, never reached here
    assert est.regimes[0]["steps_interval"] == [None, None]
    assert "never reached" in est.regimes[0]["steps_interval_note"]


def test_too_few_reached_points_and_bad_arguments():
    with pytest.raises(BatchlabError, match="need at least 2 batch sizes"):
        bootstrap_critical_batch_size({1: np.array([10.0]), 2: np.array([np.inf]), 4: np.empty(0)}, n_boot=5)
    data = synthetic_trials(1000.0, 64.0, 3, seed=0)
    with pytest.raises(BatchlabError, match="n_boot must be a positive integer"):
        bootstrap_critical_batch_size(data, n_boot=0)
    with pytest.raises(BatchlabError, match="level must be in"):
        bootstrap_critical_batch_size(data, level=1.0)
    with pytest.raises(BatchlabError, match=r"tolerance must be in \(0, 1\)"):
        bootstrap_critical_batch_size(data, tolerance=1.0)


def test_brackets_and_censoring_reach_the_fit():
    data = {16: np.array([64000.0, 70000.0]), 64: np.array([16500.0]), 256: np.array([4600.0, 5000.0]),
            1024: np.array([np.inf, np.inf]), 4096: np.array([np.inf])}
    est = bootstrap_critical_batch_size(data, n_boot=20, steps_lower={16: 60000, 64: 15000, 256: 4000},
                                        censored_at={1024: 3000, 4096: 3000})
    assert est.curve.steps_lower == (60000, 15000, 4000, None, None)
    assert est.curve.censored_at == (None, None, None, 3000, 3000)
    assert est.fit.n_censored == 2 and est.fit.predicted_steps(1024) > 3000
    assert [r["regime"] for r in est.regimes][3:] == [None, None]


def test_more_trials_give_narrower_b_crit_intervals():
    widths = {}
    for k in (3, 40):
        est = bootstrap_critical_batch_size(synthetic_trials(1000.0, 64.0, k, seed=100, miss=0.0), n_boot=10, seed=0)
        low, high = est.intervals["mccandlish_b_crit"]
        widths[k] = high / low
    assert widths[40] < widths[3]


def test_from_store_views_matches_steps_to_result(make_con):
    rows = lambda s: [(s // 2, {M: 0.5}), (s, {M: 0.001})]  # noqa: E731
    trials = []
    for b in (1, 2, 4, 8, 16, 32):
        s = int(200 * (1 + 8 / b))
        trials += [trial(W, b, 1, rows(s)), trial(W, b, 2, rows(s + 7)), trial(W, b, 3, [(10, {M: 0.9})])]
    con = make_con(trials, extra_studies=[(W, 64)])
    est = critical_batch_size_with_intervals(con, Selection(W, M, 0.01), n_boot=40, seed=0)
    results = steps_to_result(con, W, M, 0.01)
    assert est.curve.steps == steps_curve(results).steps
    assert est.curve.steps_lower[0] == results[0].steps_lower  # brackets from the store: (s // 2, s]
    assert est.curve.batch_sizes[-1] == 64 and est.curve.steps[-1] is None
    assert est.estimates["mccandlish_b_crit"] == pytest.approx(8.0, rel=0.05)
    assert est.curve.metadata["goal"] == 0.01


def test_regime_fractions_use_the_given_b0():
    """Review fix: the trial-resampled regime shares ignored ``b0`` and measured perfect scaling from the
    smallest reached batch size, so batch sizes below the given B0 (no regime) got perfect-scaling shares."""
    steps = {int(b): np.full(3, float(1000 * (1 + 64 / b))) for b in BATCH_SIZES}
    b0 = int(BATCH_SIZES[3])
    est = bootstrap_critical_batch_size(steps, n_boot=20, seed=0, b0=b0)
    for row in est.regimes:
        if row["batch_size"] < b0:
            assert row["regime"] is None
        # identical trials: every replicate reads the point estimate's regimes, from the same B0
        if row["regime"] is None:
            assert all(v == 0 for v in row["regime_fractions"].values())
        else:
            assert row["regime_fractions"][row["regime"]] == 1.0


def test_fit_with_intervals_is_the_bootstraps_fit():
    """The one shared fit (analysis/bootstrap.py fit_with_intervals): the bootstrap's fit, estimates,
    intervals and notes are its output for the minima's curve and the trials' scatter (the same path)."""
    from batchlab.analysis.bootstrap import fit_with_intervals
    from batchlab.analysis.curve import StepsCurve
    from batchlab.analysis.scatter import scatter_from_trials

    data = synthetic_trials(1000.0, 64.0, 6, seed=4)
    est = bootstrap_critical_batch_size(data, n_boot=5, level=0.8)
    curve = StepsCurve.from_points([(b, None if not np.isfinite(s.min()) else int(s.min())) for b, s in data.items()])
    one = fit_with_intervals(curve, level=0.8, scatter=scatter_from_trials(data))
    assert one.fit == est.fit and one.estimates == est.estimates and one.intervals == est.intervals
    assert one.notes == est.interval_notes and set(one.warnings) <= set(est.warnings)
    with pytest.raises(BatchlabError, match=r"level must be in \(0, 1\), got 1.5"):
        fit_with_intervals(curve, level=1.5)


def test_bound_shares_count_every_resampled_curve():
    """Issue 21: each bound's share of the trial-resampled curves (regimes.bound_shares). Known truth:
    the same resampled curves read one by one (no deduplication) give the same shares; identical trials
    give the point estimate's bound with share 1."""
    from batchlab.analysis.bootstrap import _resampled_steps
    from batchlab.analysis.curve import curve_from_arrays
    from batchlab.analysis.regimes import bound_shares, read_regimes

    data = synthetic_trials(1000.0, 64.0, 3, seed=7, miss=0.2)
    est = bootstrap_critical_batch_size(data, n_boot=150, seed=5)
    shares = est.to_dict()["bound_shares"]
    sizes = sorted(data)
    reps = _resampled_steps([data[b] for b in sizes], 150, np.random.default_rng(5))
    censored = [None] * len(sizes)
    read = []
    for row in reps:
        curve = curve_from_arrays(np.array(sizes, dtype=float), row, censored_at=censored)
        b0 = est.data_regimes["b0"] if np.isfinite(row[sizes.index(est.data_regimes["b0"])]) else None
        try:
            read.append(read_regimes(curve, 0.1, b0=b0) if sum(curve.reached) >= 2 else None)
        except BatchlabError:
            read.append(None)
    assert shares == bound_shares(read)
    for bound in ("perfect_scaling_end", "maximal_parallelism_start"):
        assert shares[bound]["n_replicates"] == 150
        assert sum(s["share"] for s in shares[bound]["shares"]) == pytest.approx(1.0)
        assert len(shares[bound]["shares"]) > 1  # 3 trials per batch size: the resamples disagree
    same = {b: np.full(4, 1000.0 * (1 + 64 / b)).round() for b in sizes}
    certain = bootstrap_critical_batch_size(same, n_boot=20).to_dict()
    for bound in ("perfect_scaling_end", "maximal_parallelism_start"):
        value = certain["critical_batch_sizes"][bound]["value"]
        assert certain["bound_shares"][bound]["shares"] == [{"value": value, "share": 1.0}]


def test_bound_shares_count_undetermined_resamples_as_not_read():
    """Raced trials: a resample holding only the unknown trial at B = 4 is undetermined; it counts as
    not read (the shares stay shares of every replicate)."""
    sizes = [1, 2, 4, 8, 16, 32]
    data = {b: np.array([1000.0 * (1 + 8 / b)]).round() for b in sizes}
    data[4] = np.array([3000.0, np.nan])
    unknown = {4: np.array([np.nan, 3500.0])}  # the raced trial stopped past the known best: determined
    est = bootstrap_critical_batch_size(data, n_boot=200, seed=1, unknown_from=unknown)
    shares = est.bound_shares["perfect_scaling_end"]
    assert 0 < est.n_undetermined < 200 and shares["n_replicates"] == 200
    assert shares["null_shares"].get("not_read", 0) >= est.n_undetermined / 200


def test_a_second_trial_unreached_within_its_budget_is_censored_in_the_trials_scatter(make_con):
    # K = 2 everywhere. B = 1, 2, 4: both trials reach (an event, spacing log(s2 / s)); B = 8, 16, 32: the
    # second runs to step 2s without reaching: censored there, exposure log 2 and no event (it used to be
    # left out, which biased the tail scale low). Known truth: the censored-exponential MLE by hand.
    reach = lambda s: [(s // 2, {M: 0.5}), (s, {M: 0.001})]  # noqa: E731
    trials, events, exposure = [], 0, 0.0
    for b in (1, 2, 4, 8, 16, 32):
        s = int(200 * (1 + 8 / b))
        trials.append(trial(W, b, 1, reach(s)))
        if b <= 4:
            s2 = int(1.1 * s)
            trials.append(trial(W, b, 2, reach(s2)))
            events, exposure = events + 1, exposure + np.log(s2 / s)
        else:
            trials.append(trial(W, b, 2, [(s // 2, {M: 0.5}), (2 * s, {M: 0.2})]))
            exposure += np.log(2.0)
    con = make_con(trials)
    est = critical_batch_size_with_intervals(con, Selection(W, M, 0.01), n_boot=20, seed=0)
    scatter = est.interval_notes["mccandlish_b_crit"]["trials_scatter"]
    assert scatter["tail_scale"] == pytest.approx(exposure / events, rel=1e-12)
    assert (scatter["n_studies"], scatter["n_censored"], scatter["n_dropped"]) == (3, 3, 0)
    # without the budget (the array call alone) those studies are left out, and said to be
    steps = {b: np.array([int(200 * (1 + 8 / b)), np.inf if b > 4 else int(1.1 * int(200 * (1 + 8 / b)))])
             for b in (1, 2, 4, 8, 16, 32)}
    bare = bootstrap_critical_batch_size(steps, n_boot=20).interval_notes["mccandlish_b_crit"]["trials_scatter"]
    assert bare["n_dropped"] == 3 and bare["tail_scale"] < scatter["tail_scale"]
    budget = {b: 2.0 * int(200 * (1 + 8 / b)) for b in (8, 16, 32)}
    given = bootstrap_critical_batch_size(steps, n_boot=20, budget=budget).interval_notes["mccandlish_b_crit"]
    assert given["trials_scatter"]["tail_scale"] == pytest.approx(scatter["tail_scale"], rel=1e-12)
