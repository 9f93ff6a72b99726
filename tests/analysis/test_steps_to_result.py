import math

import numpy as np
import pytest

from analysis_fixtures import trial
from batchlab.analysis.selection import Selection
from batchlab.analysis.steps_to_result import (
    effective_learning_rate,
    steps_curve,
    steps_to_result,
    steps_to_result_many,
    trial_first_steps,
    trial_steps_by_batch_size,
)
from batchlab.errors import BatchlabError

W = "mnist/simple_cnn_base/sgd"
M = "val/classification_error"


def curve(pairs, metric=M):
    return [(step, {metric: value}) for step, value in pairs]


def by_batch(results):
    return {r.batch_size: r for r in results}


def test_strict_comparison_equal_value_does_not_reach(make_con):
    con = make_con([trial(W, 8, 1, curve([(10, 0.02), (20, 0.01), (30, 0.0099)]), learning_rate=0.1)])
    (r,) = steps_to_result(con, W, M, 0.01)
    assert r.steps == 30 and r.trial_id == 1 and r.value == pytest.approx(0.0099)
    (r,) = steps_to_result(con, W, M, 0.0099)
    assert not r.reached and r.steps is None and r.trial_id is None and r.parameters == {}


def test_earliest_step_of_each_trial_then_minimum_over_trials(make_con):
    con = make_con(
        [
            # trial 1 dips below at 20, rises above, then below again: its first qualifying step is 20.
            trial(W, 8, 1, curve([(10, 0.5), (20, 0.005), (30, 0.5), (40, 0.001)]), learning_rate=0.1),
            trial(W, 8, 2, curve([(10, 0.5), (15, 0.009), (40, 0.0001)]), learning_rate=0.2),
            trial(W, 8, 3, curve([(5, 0.5), (50, 0.0)]), learning_rate=0.3),
        ]
    )
    (r,) = steps_to_result(con, W, M, 0.01)
    assert (r.steps, r.trial_id, r.n_trials, r.n_reached) == (15, 2, 3, 3)
    assert r.parameters == {"learning_rate": 0.2}


def test_ties_go_to_the_lower_trial_id(make_con):
    rows = curve([(10, 0.5), (20, 0.001)])
    con = make_con(
        [
            trial(W, 8, 7, rows, learning_rate=0.7),
            trial(W, 8, 3, curve([(10, 0.5), (20, 0.009)]), learning_rate=0.3),
            trial(W, 8, 5, rows, learning_rate=0.5),
        ]
    )
    (r,) = steps_to_result(con, W, M, 0.01)
    assert (r.steps, r.trial_id) == (20, 3)
    assert r.value == pytest.approx(0.009)


def test_only_complete_trials_by_default_and_statuses_option(make_con):
    con = make_con(
        [
            trial(W, 8, 1, curve([(10, 0.001)]), status="INCOMPLETE", learning_rate=1.0),
            trial(W, 8, 2, curve([(10, 0.5), (20, 0.001)]), status="INFEASIBLE", learning_rate=2.0),
            trial(W, 8, 3, curve([(30, 0.001)]), learning_rate=3.0),
        ]
    )
    (r,) = steps_to_result(con, W, M, 0.01)
    assert (r.steps, r.trial_id, r.n_trials) == (30, 3, 1)
    (r,) = steps_to_result(con, W, M, 0.01, statuses=("COMPLETE", "INCOMPLETE"))
    assert (r.steps, r.trial_id, r.n_trials) == (10, 1, 2)
    (r,) = steps_to_result(con, W, M, 0.01, statuses=("COMPLETE", "INFEASIBLE"))
    assert (r.steps, r.trial_id) == (20, 2)
    with pytest.raises(BatchlabError, match="unknown trial status 'DONE'"):
        steps_to_result(con, W, M, 0.01, statuses=("DONE",))


def test_max_trials_keeps_the_first_complete_trials_in_id_order(make_con):
    con = make_con(
        [
            trial(W, 8, 1, curve([(50, 0.001)]), learning_rate=1.0),
            trial(W, 8, 2, curve([(40, 0.001)]), status="INFEASIBLE", learning_rate=2.0),  # not counted
            trial(W, 8, 4, curve([(30, 0.001)]), learning_rate=4.0),
            trial(W, 8, 9, curve([(10, 0.001)]), learning_rate=9.0),
        ]
    )
    assert steps_to_result(con, W, M, 0.01, max_trials=1)[0].steps == 50
    (r,) = steps_to_result(con, W, M, 0.01, max_trials=2)
    assert (r.steps, r.trial_id, r.n_trials) == (30, 4, 2)
    assert steps_to_result(con, W, M, 0.01, max_trials=3)[0].steps == 10
    assert steps_to_result(con, W, M, 0.01, max_trials=100)[0].n_trials == 3


def test_maximize_uses_strictly_greater(make_con):
    metric = "val/average_precision"
    con = make_con(
        [
            trial("oi/resnet_50/nesterov_momentum", 64, 1, curve([(10, 0.2), (20, 0.31), (30, 0.32)], metric)),
            trial("oi/resnet_50/nesterov_momentum", 64, 2, curve([(10, 0.2), (25, 0.4)], metric)),
        ]
    )
    (r,) = steps_to_result(con, "oi/resnet_50/nesterov_momentum", metric, 0.31, maximize=True)
    assert (r.steps, r.trial_id) == (25, 2)
    # Without maximize, "beats 0.31" means below it: the first rows already are.
    (r,) = steps_to_result(con, "oi/resnet_50/nesterov_momentum", metric, 0.31)
    assert (r.steps, r.trial_id) == (10, 1)


def test_nan_and_inf_never_reach_the_goal(make_con):
    con = make_con([trial(W, 8, 1, curve([(10, float("nan")), (20, float("inf")), (30, float("-inf")), (40, 0.5)]))])
    assert not steps_to_result(con, W, M, 0.7, maximize=True)[0].reached
    assert steps_to_result(con, W, M, 0.7)[0].steps == 40


def test_uneven_evaluation_steps_no_interpolation(make_con):
    # Evaluations at irregular steps; the goal is crossed between 100 and 1000: the answer is 1000,
    # not an interpolated step.
    con = make_con([trial(W, 8, 1, curve([(1, 0.9), (3, 0.5), (100, 0.02), (1000, 0.001), (1001, 0.0)]))])
    assert steps_to_result(con, W, M, 0.01)[0].steps == 1000


def test_missing_batch_sizes_and_unreached_are_reported(make_con):
    con = make_con(
        [
            trial(W, 1, 1, curve([(100, 0.001)])),
            trial(W, 2, 1, curve([(60, 0.5)])),  # never reaches
            trial(W, 4, 1, curve([(10, 0.001)]), status="INFEASIBLE"),  # no COMPLETE trial
            trial(W, 8, 1, curve([(20, 0.001)], metric="val/cross_entropy_error")),  # other metric only
        ],
        extra_studies=[(W, 16)],  # a study without trials
    )
    results = steps_to_result(con, W, M, 0.01)
    assert [r.batch_size for r in results] == [1, 2, 4, 8, 16]
    assert [r.steps for r in results] == [100, None, None, None, None]
    assert [r.n_trials for r in results] == [1, 1, 0, 1, 0]
    c = steps_curve(results)
    assert c.batch_sizes == (1, 2, 4, 8, 16) and c.steps == (100, None, None, None, None)
    assert c.label == W


def test_step_budget_and_example_budget(make_con):
    con = make_con(
        [
            trial(W, 4, 1, curve([(10, 0.5), (100, 0.001)])),
            trial(W, 16, 1, curve([(10, 0.5), (50, 0.001)])),
            trial(W, 16, 2, curve([(20, 0.005)])),
        ]
    )
    assert [r.steps for r in steps_to_result(con, W, M, 0.01)] == [100, 20]
    assert [r.steps for r in steps_to_result(con, W, M, 0.01, step_budget=99)] == [None, 20]
    assert [r.steps for r in steps_to_result(con, W, M, 0.01, step_budget=100)] == [100, 20]
    assert [r.steps for r in steps_to_result(con, W, M, 0.01, step_budget=19)] == [None, None]
    # Example budget: B * step <= E. 4 * 100 = 400; 16 * 20 = 320.
    assert [r.steps for r in steps_to_result(con, W, M, 0.01, example_budget=400)] == [100, 20]
    assert [r.steps for r in steps_to_result(con, W, M, 0.01, example_budget=399)] == [None, 20]
    assert [r.steps for r in steps_to_result(con, W, M, 0.01, example_budget=319)] == [None, None]


def test_workloads_do_not_mix_and_many_selections_in_one_query(make_con):
    other = "mnist/fc_1024/sgd"
    con = make_con(
        [
            trial(W, 8, 1, curve([(10, 0.02), (20, 0.005)])),
            trial(other, 8, 1, curve([(5, 0.005)])),
        ]
    )
    selections = [Selection(W, M, 0.01), Selection(other, M, 0.01), Selection(W, M, 0.03)]
    a, b, c = steps_to_result_many(con, selections)
    assert [r.steps for r in a] == [20] and [r.steps for r in b] == [5] and [r.steps for r in c] == [10]
    assert a[0].workload == W and b[0].workload == other


def test_unknown_workload_and_metric_errors_list_what_exists(make_con):
    con = make_con([trial(W, 8, 1, curve([(10, 0.02)]))])
    with pytest.raises(BatchlabError, match=r"unknown workload 'mnist/simple_cnn_base/sdg' \(did you mean"):
        steps_to_result(con, "mnist/simple_cnn_base/sdg", M, 0.01)
    with pytest.raises(BatchlabError, match=r"unknown metric 'val/accuracy'.*known: val/classification_error"):
        steps_to_result(con, W, "val/accuracy", 0.01)
    with pytest.raises(BatchlabError, match="goal must be a finite number"):
        steps_to_result(con, W, M, float("nan"))
    with pytest.raises(BatchlabError, match="max_trials must be a positive integer"):
        steps_to_result(con, W, M, 0.01, max_trials=0)
    with pytest.raises(BatchlabError, match="step_budget must be a positive integer"):
        steps_to_result(con, W, M, 0.01, step_budget=-5)


def test_effective_learning_rate_and_result_dict(make_con):
    con = make_con([trial(W, 8, 1, curve([(10, 0.005)]), learning_rate=0.1, momentum=0.9)])
    (r,) = steps_to_result(con, W, M, 0.01)
    assert r.effective_learning_rate == pytest.approx(1.0)
    d = r.to_dict()
    assert d["batch_size"] == 8 and d["steps"] == 10 and d["reached"] is True and d["trial_id"] == 1
    assert d["parameters"] == {"learning_rate": 0.1, "momentum": 0.9} and d["examples"] == 80
    assert effective_learning_rate(0.1, None) == 0.1
    assert effective_learning_rate(None, 0.9) is None
    assert math.isinf(effective_learning_rate(0.1, 1.0))


def test_trial_first_steps_per_trial_table(make_con):
    con = make_con(
        [
            trial(W, 8, 2, curve([(10, 0.5), (20, 0.005)])),
            trial(W, 8, 1, curve([(10, 0.5)])),
            trial(W, 16, 1, curve([(5, 0.001)])),
        ]
    )
    frame = trial_first_steps(con, Selection(W, M, 0.01))
    assert list(frame["batch_size"]) == [8, 8, 16] and list(frame["trial_id"]) == [1, 2, 1]
    # not reached is inf (NaN is kept for raced trials whose first step is unknown)
    assert list(frame["first_step"]) == [np.inf, 20.0, 5.0]
    assert frame["raced_at"].isna().all() and frame["value_bound"].isna().all()
    steps = trial_steps_by_batch_size(frame)
    assert set(steps) == {8, 16}
    np.testing.assert_array_equal(steps[8], [np.inf, 20.0])


def test_selections_sharing_a_scan_keep_their_own_goal_and_budget(make_con):
    # Several goals and budgets on one (workload, metric, direction) share one narrowed scan,
    # bounded by the loosest goal and budget; each selection must still get its exact answer,
    # the same as when it is asked alone.
    con = make_con(
        [
            trial(W, 8, 1, curve([(10, 0.04), (20, 0.02), (40, 0.005), (80, 0.001)])),
            trial(W, 8, 2, curve([(15, 0.03), (30, 0.009)])),
            trial(W, 8, 3, curve([(5, 0.5), (60, float("-inf")), (70, float("nan"))])),
        ]
    )
    selections = [
        Selection(W, M, 0.01),
        Selection(W, M, 0.05),
        Selection(W, M, 0.002),
        Selection(W, M, 0.01, step_budget=35),
        Selection(W, M, 0.05, step_budget=12),
        Selection(W, M, 0.01, example_budget=8 * 30),
        Selection(W, M, 0.02, maximize=True),
    ]
    together = steps_to_result_many(con, selections)
    alone = [steps_to_result_many(con, [s])[0] for s in selections]
    assert together == alone
    assert [(r[0].steps, r[0].trial_id) for r in together] == [
        (30, 2), (10, 1), (80, 1), (30, 2), (10, 1), (30, 2), (5, 3)]


def test_scans_over_adjacent_and_separate_workloads_do_not_mix(make_con):
    # Adjacent selected workloads share one range scan, non-adjacent ones get their own; a
    # workload in between that nobody asked for (here reaching the goal first) never leaks in.
    a, b, c = "a/m/sgd", "b/m/sgd", "c/m/sgd"
    con = make_con(
        [
            trial(a, 8, 1, curve([(10, 0.5), (40, 0.001)])),
            trial(b, 8, 1, curve([(1, 0.001)])),
            trial(c, 8, 1, curve([(30, 0.001)])),
            trial(c, 16, 1, curve([(2, 0.001)], metric="val/other")),
        ]
    )
    for names in ([a, c], [a, b, c], [c, a]):
        results = steps_to_result_many(con, [Selection(w, M, 0.01) for w in names])
        got = {per[0].workload: [(r.batch_size, r.steps) for r in per] for per in results}
        expected = {a: [(8, 40)], b: [(8, 1)], c: [(8, 30), (16, None)]}
        assert got == {w: expected[w] for w in names}
    assert steps_to_result_many(con, [Selection("d/m/sgd", M, 0.01)], check=False) == [[]]


# --- resolution brackets -------------------------------------------------------------------------


def test_brackets_steps_lower_and_censored_at(make_con):
    con = make_con(
        [
            # B=8: best trial 1 reaches at 20 (evaluated before at 10); trial 2 reaches at 30 after an
            # evaluation at 15; steps_lower is the smallest preceding evaluation over reaching trials.
            trial(W, 8, 1, curve([(10, 0.5), (20, 0.005), (40, 0.001)])),
            trial(W, 8, 2, curve([(5, 0.5), (15, 0.5), (30, 0.001)])),
            trial(W, 8, 3, curve([(2, 0.5), (400, 0.5)])),  # never reaches: no say in steps_lower
            # B=16: reached at the first evaluation: steps_lower 0.
            trial(W, 16, 1, curve([(7, 0.001)])),
            # B=32: a NaN evaluation is still an evaluation.
            trial(W, 32, 1, curve([(10, float("nan")), (25, 0.001)])),
            # B=64: not reached; trials last evaluated at 300 and 200: S > 200.
            trial(W, 64, 1, curve([(100, 0.5), (300, 0.4)])),
            trial(W, 64, 2, curve([(50, 0.5), (200, 0.3)])),
        ],
        extra_studies=[(W, 128)],  # no trials: nothing to bound it
    )
    got = {r.batch_size: (r.steps, r.steps_lower, r.censored_at) for r in steps_to_result(con, W, M, 0.01)}
    assert got == {8: (20, 10, None), 16: (7, 0, None), 32: (25, 10, None), 64: (None, None, 200),
                   128: (None, None, None)}
    # A step budget bounds the last evaluation too: within 150 steps both B=64 trials stop at 100 and 50.
    r64 = by_batch(steps_to_result(con, W, M, 0.01, step_budget=150))[64]
    assert (r64.steps, r64.censored_at) == (None, 50)
    d = by_batch(steps_to_result(con, W, M, 0.01))[8].to_dict()
    assert (d["steps"], d["steps_lower"], d["censored_at"]) == (20, 10, None)
    frame = trial_first_steps(con, Selection(W, M, 0.01))
    row = frame[(frame.batch_size == 8) & (frame.trial_id == 2)].iloc[0]
    assert (row.first_step, row.prev_step, row.last_step) == (30.0, 15.0, 30.0)


def test_brackets_contain_the_true_first_passage_of_synthetic_trials(make_con):
    # Each synthetic trial has a known loss curve exp(-t / tau) (first passage t* = the first integer
    # t with exp(-t / tau) < goal) but is evaluated only on an irregular schedule. The bracket
    # (steps_lower, steps] must contain the true steps to result min_i t*_i at every batch size.
    rng = np.random.default_rng(7)
    goal = 0.05
    trials, truth = [], {}
    for b in (4, 8, 16, 32, 64, 128):
        taus = rng.uniform(5.0, 400.0, size=5)
        first = [int(math.floor(tau * math.log(1 / goal))) + 1 for tau in taus]
        truth[b] = min(first)
        for i, tau in enumerate(taus):
            steps = np.unique(np.round(np.geomspace(1, 4000, rng.integers(8, 40)) * rng.uniform(0.8, 1.2)).astype(int))
            rows = [(int(t), {M: math.exp(-t / tau)}) for t in steps]
            trials.append(trial(W, b, i + 1, rows))
    con = make_con(trials)
    for r in steps_to_result(con, W, M, goal):
        assert r.reached and r.steps_lower < truth[r.batch_size] <= r.steps, (r.batch_size, r.steps_lower, r.steps)


def test_steps_curve_carries_the_brackets(make_con):
    con = make_con([trial(W, 8, 1, curve([(10, 0.5), (20, 0.005)])), trial(W, 16, 1, curve([(30, 0.5)]))])
    c = steps_curve(steps_to_result(con, W, M, 0.01), metadata={"goal": 0.01})
    assert c.batch_sizes == (8, 16) and c.steps == (20, None) and c.metadata == {"goal": 0.01}
    assert c.steps_lower == (10, None) and c.censored_at == (None, 30)


# --- studies ---------------------------------------------------------------------------------------

DEFINITIONS = {
    "aaaaaaaaaaaa": {"batch_size": 8, "train_steps": 3000, "train_examples": 55000, "source": "batchlab"},
    "bbbbbbbbbbbb": {"batch_size": 8, "train_steps": 100, "train_examples": 2000, "sweep": "sw1", "source": "batchlab"},
    "cccccccccccc": {"batch_size": 16, "train_steps": 100, "train_examples": 2000, "sweep": "sw1", "source": "batchlab"},
}


@pytest.fixture
def two_studies(make_con):
    return make_con(
        [
            trial(W, 8, 1, curve([(100, 0.5), (1680, 0.005)]), study="aaaaaaaaaaaa"),
            trial(W, 8, 2, curve([(50, 0.5), (90, 0.008)]), study="bbbbbbbbbbbb"),
            trial(W, 8, 3, curve([(50, 0.5), (100, 0.02)]), study="bbbbbbbbbbbb"),
            trial(W, 16, 1, curve([(40, 0.005)]), study="cccccccccccc"),
        ],
        definitions=DEFINITIONS,
    )


def test_trials_of_two_study_definitions_at_one_batch_size_are_refused(two_studies):
    with pytest.raises(BatchlabError) as info:
        steps_to_result(two_studies, W, M, 0.01)
    message = str(info.value)
    assert "\n" not in message and f"workload {W!r} batch size 8" in message
    assert "aaaaaaaaaaaa (B=8, 3000 steps, 55000 train examples" in message
    assert "bbbbbbbbbbbb (B=8, 100 steps, 2000 train examples" in message and "sweep sw1" in message
    assert "--study ID" in message and "--mix-studies" in message
    with pytest.raises(BatchlabError, match="--mix-studies"):
        trial_first_steps(two_studies, Selection(W, M, 0.01))


def test_select_one_study_or_a_sweep_or_mix_explicitly(two_studies):
    (r,) = steps_to_result(two_studies, W, M, 0.01, studies=["aaaaaaaaaaaa"])
    assert (r.batch_size, r.steps, r.n_trials, r.study_ids, r.mixed_studies) == (8, 1680, 1, ["aaaaaaaaaaaa"], False)
    results = steps_to_result(two_studies, W, M, 0.01, studies=["sw1"])
    assert [(r.batch_size, r.steps, r.n_trials, r.study_ids) for r in results] == [
        (8, 90, 2, ["bbbbbbbbbbbb"]), (16, 40, 1, ["cccccccccccc"])]
    results = steps_to_result(two_studies, W, M, 0.01, mix_studies=True)
    assert [(r.batch_size, r.steps, r.mixed_studies) for r in results] == [(8, 90, True), (16, 40, False)]
    assert results[0].to_dict()["study_ids"] == ["aaaaaaaaaaaa", "bbbbbbbbbbbb"]
    assert results[0].to_dict()["mixed_studies"] is True
    frame = trial_first_steps(two_studies, Selection(W, M, 0.01, studies=("sw1",)))
    assert list(frame.trial_id) == [2, 3, 1] and set(frame.study_id) == {"bbbbbbbbbbbb", "cccccccccccc"}
    assert Selection(W, M, 0.01, studies="sw1").describe()["studies"] == ["sw1"]


def test_unknown_study_lists_the_known_ones(two_studies):
    with pytest.raises(BatchlabError) as info:
        steps_to_result(two_studies, W, M, 0.01, studies=["zzz"])
    message = str(info.value)
    assert "unknown study 'zzz'" in message and "aaaaaaaaaaaa (" in message and "sweeps: sw1" in message


# --- stop at goal -----------------------------------------------------------------------------------

STOP = {"s1": {"batch_size": 8, "train_steps": 1000, "stop_rule": {"metric": M, "goal": 0.02, "maximize": False}}}


@pytest.fixture
def stopped(make_con):
    return make_con(
        [
            trial(W, 8, 1, curve([(10, 0.5), (40, 0.03), (80, 0.015)]), status="STOPPED_AT_GOAL", study="s1"),
            trial(W, 8, 2, curve([(10, 0.5), (500, 0.1), (1000, 0.05)]), study="s1"),
        ],
        definitions=STOP,
    )


def test_stopped_trials_answer_their_stop_goal_or_looser(stopped):
    (r,) = steps_to_result(stopped, W, M, 0.02)
    assert (r.steps, r.trial_id, r.n_trials) == (80, 1, 2)
    assert steps_to_result(stopped, W, M, 0.04)[0].steps == 40
    (r,) = steps_to_result(stopped, W, M, 0.01, statuses=("COMPLETE",))  # left out: no error
    assert (r.steps, r.n_trials) == (None, 1)


@pytest.mark.parametrize(
    "goal, kwargs, reason",
    [
        (0.01, {}, "goal 0.01 is stricter"),
        (0.5, {"metric": "val/cross_entropy_error"}, "another metric"),
        (0.01, {"maximize": True}, "the other direction"),
    ],
)
def test_an_analysis_stopped_trials_cannot_answer_is_refused(stopped, goal, kwargs, reason):
    metric = kwargs.pop("metric", M)
    with pytest.raises(BatchlabError) as info:
        steps_to_result_many(stopped, [Selection(W, metric, goal, **kwargs)], check=False)
    message = str(info.value)
    assert "\n" not in message and "batch size 8" in message and "study s1 stopped at their goal" in message
    assert reason in message and f"metric {M} and a goal >= 0.02 (the stop goal or looser)" in message


# --- trial counts like the paper -----------------------------------------------------------------


def test_paper_trial_counts():
    from batchlab.analysis.selection import paper_max_trials

    assert paper_max_trials("lm1b/lstm/nesterov_momentum") == 50
    assert paper_max_trials("common_crawl/transformer_base/nesterov_momentum") == 50
    assert paper_max_trials("lm1b/transformer_shallow/sgd") == 50
    assert paper_max_trials("lm1b/transformer_shallow/nesterov_momentum") == 100
    assert paper_max_trials("mnist/simple_cnn_base/sgd") == 100


def test_auto_max_trials_uses_the_paper_rule_for_release_workloads(make_con):
    release = [trial(W, 8, i, curve([(1000 - i, 0.001)]), source="batch_science") for i in range(1, 102)]
    release += [trial(W, 16, i, curve([(500, 0.001)]), source="batch_science") for i in range(1, 4)]
    con = make_con(release)
    with pytest.raises(BatchlabError) as info:
        steps_to_result(con, W, M, 0.01, max_trials="auto")
    message = str(info.value)
    assert "\n" not in message and "batch size 16 has 3 trials" in message
    assert "fewer than the paper's first 100" in message and "--max-trials all" in message
    results = steps_to_result(con, W, M, 0.01, max_trials="all")
    assert [(r.steps, r.n_trials, r.max_trials) for r in results] == [(899, 101, None), (500, 3, None)]
    con = make_con(release[:101])
    (r,) = steps_to_result(con, W, M, 0.01, max_trials="auto")
    assert (r.steps, r.trial_id, r.n_trials, r.max_trials) == (900, 100, 100, 100)  # trial 101 is not used
    assert r.to_dict()["max_trials"] == 100


def test_auto_max_trials_uses_every_trial_elsewhere_and_words_are_checked(make_con):
    con = make_con([trial(W, 8, i, curve([(100 - i, 0.001)])) for i in range(1, 4)])
    (r,) = steps_to_result(con, W, M, 0.01, max_trials="auto")
    assert (r.steps, r.n_trials, r.max_trials) == (97, 3, None)
    assert Selection(W, M, 0.01, max_trials="ALL").max_trials == "all"
    assert steps_to_result(con, W, M, 0.01, max_trials=2)[0].max_trials == 2
    with pytest.raises(BatchlabError, match="max_trials must be a positive integer, 'all' or 'auto'"):
        Selection(W, M, 0.01, max_trials="some")
