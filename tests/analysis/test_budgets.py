import numpy as np
import pytest

from analysis_fixtures import trial
from batchlab.analysis.budgets import best_measurement, best_measurement_by_budget
from batchlab.errors import BatchlabError

W = "mnist/simple_cnn_base/sgd"
M = "val/classification_error"


def curve(pairs, metric=M):
    return [(step, {metric: value}) for step, value in pairs]


@pytest.fixture
def con(make_con):
    return make_con(
        [
            trial(W, 4, 1, curve([(10, 0.30), (100, 0.05), (400, 0.02)]), learning_rate=0.1),
            trial(W, 4, 2, curve([(10, 0.20), (100, 0.05), (300, 0.03)]), learning_rate=0.2),
            trial(W, 4, 3, curve([(5, 0.001)]), status="INFEASIBLE", learning_rate=9.0),
            trial(W, 16, 1, curve([(10, 0.10), (30, float("nan")), (50, 0.04)]), learning_rate=0.4),
        ],
        extra_studies=[(W, 64)],
    )


def test_best_measurement_any_step_any_trial(con):
    best = best_measurement(con, W, M)
    assert [(b.batch_size, b.value, b.step, b.trial_id) for b in best] == [
        (4, 0.02, 400, 1),
        (16, 0.04, 50, 1),
        (64, None, None, None),
    ]
    assert best[0].parameters == {"learning_rate": 0.1}


def test_best_measurement_ties_go_to_earlier_step_then_lower_trial(con):
    # Under a step budget of 100 both trials at B=4 reach 0.05 at step 100: trial 1 wins.
    best = best_measurement(con, W, M, step_budget=100)
    assert (best[0].value, best[0].step, best[0].trial_id) == (0.05, 100, 1)


def test_best_measurement_budgets_statuses_maximize(con):
    assert best_measurement(con, W, M, step_budget=50)[0].value == 0.2
    # Example budget 400 examples: B=4 keeps step <= 100, B=16 keeps step <= 25.
    best = best_measurement(con, W, M, example_budget=400)
    assert [b.value for b in best] == [0.05, 0.10, None]
    assert best_measurement(con, W, M, statuses=("COMPLETE", "INFEASIBLE"))[0].value == 0.001
    assert best_measurement(con, W, M, max_trials=1, step_budget=350)[0].value == 0.05
    assert [b.value for b in best_measurement(con, W, M, maximize=True)] == [0.30, 0.10, None]


def test_best_measurement_by_budget_matches_single_queries(con):
    sweep = best_measurement_by_budget(con, W, M, [400, 50, 100], kind="step")
    assert sweep.budgets == (50, 100, 400) and sweep.batch_sizes == (4, 16, 64)
    for i, budget in enumerate(sweep.budgets):
        single = [b.value for b in best_measurement(con, W, M, step_budget=budget)]
        np.testing.assert_array_equal(sweep.best[i], [np.nan if v is None else v for v in single])
    sweep = best_measurement_by_budget(con, W, M, [400, 1000], kind="example", maximize=True)
    np.testing.assert_array_equal(sweep.best, [[0.30, 0.10, np.nan], [0.30, 0.10, np.nan]])


def test_budget_errors(con):
    with pytest.raises(BatchlabError, match="unknown budget kind 'epoch'"):
        best_measurement_by_budget(con, W, M, [10], kind="epoch")
    with pytest.raises(BatchlabError, match="step budget must be a positive integer"):
        best_measurement_by_budget(con, W, M, [0])
    with pytest.raises(BatchlabError, match="unknown metric"):
        best_measurement(con, W, "val/accuracy")
    with pytest.raises(BatchlabError, match="unknown workload"):
        best_measurement(con, "x/y/z", M)


def test_best_measurement_studies_and_trial_counts(make_con):
    definitions = {"s1": {"batch_size": 4, "train_steps": 100}, "s2": {"batch_size": 4, "train_steps": 10, "sweep": "sw"}}
    con = make_con(
        [
            trial(W, 4, 1, curve([(10, 0.30), (100, 0.05)]), study="s1"),
            trial(W, 4, 2, curve([(10, 0.20)]), study="s2"),
            trial(W, 16, 1, curve([(10, 0.10)]), study="s3"),
        ],
        definitions=definitions,
    )
    with pytest.raises(BatchlabError, match=r"batch size 4: the selected trials come from 2 studies.*--mix-studies"):
        best_measurement(con, W, M)
    assert [b.value for b in best_measurement(con, W, M, studies=["s1"])] == [0.05]
    assert [b.value for b in best_measurement(con, W, M, studies=["sw"])] == [0.20]
    assert [b.value for b in best_measurement(con, W, M, mix_studies=True)] == [0.05, 0.10]
    sweep = best_measurement_by_budget(con, W, M, [10, 100], studies=["s1", "s3"])
    np.testing.assert_array_equal(sweep.best, [[0.30, 0.10], [0.05, 0.10]])
    with pytest.raises(BatchlabError, match="unknown study 'nope'"):
        best_measurement(con, W, M, studies=["nope"])
    # the paper's first-N rule applies to imported release trials only
    assert [b.value for b in best_measurement(con, W, M, max_trials="auto", mix_studies=True)] == [0.05, 0.10]
    release = make_con([trial(W, 4, i, curve([(10, 0.5 - i / 1000)]), source="batch_science") for i in range(1, 4)])
    with pytest.raises(BatchlabError, match="batch size 4 has 3 trials .*fewer than the paper's first 100"):
        best_measurement(release, W, M, max_trials="auto")
    assert best_measurement(release, W, M, max_trials="all")[0].value == pytest.approx(0.497)


def test_stopped_at_goal_trials_are_analysed_by_default(make_con):
    con = make_con([trial(W, 4, 1, curve([(10, 0.30), (20, 0.01)]), status="STOPPED_AT_GOAL")])
    assert best_measurement(con, W, M)[0].value == 0.01
    assert best_measurement(con, W, M, statuses=("COMPLETE",))[0].value is None
