import numpy as np
import pytest

from analysis_fixtures import trial
from batchlab.analysis.metaparameters import (
    linear_heuristic,
    optimal_metaparameters,
    square_root_heuristic,
    trial_outcomes,
)
from batchlab.analysis.selection import Selection
from batchlab.analysis.steps_to_result import steps_to_result

W = "mnist/simple_cnn_base/nesterov_momentum"
M = "val/classification_error"


def curve(pairs):
    return [(step, {M: value}) for step, value in pairs]


@pytest.fixture
def con(make_con):
    return make_con(
        [
            trial(W, 8, 1, curve([(100, 0.005)]), learning_rate=0.01, momentum=0.9),
            trial(W, 8, 5, curve([(100, 0.5)]), learning_rate=0.001, momentum=0.99),
            trial(W, 8, 3, curve([(5, float("nan"))]), status="INFEASIBLE", learning_rate=5.0, momentum=0.999),
            trial(W, 8, 9, curve([(5, float("nan"))]), status="INFEASIBLE", learning_rate=6.0, momentum=0.999),
            trial(W, 8, 4, curve([(50, 0.005)]), status="INCOMPLETE", learning_rate=1.0, momentum=0.0),
            trial(W, 32, 1, curve([(40, 0.005)]), learning_rate=0.04, momentum=0.9),
            trial(W, 32, 2, curve([(40, 0.005)]), learning_rate=0.05, momentum=0.5),
            trial(W, 128, 1, curve([(10, 0.004)]), learning_rate=0.2, momentum=0.95),
            trial(W, 512, 1, curve([(10, 0.5)]), learning_rate=0.2, momentum=0.95),
        ]
    )


def test_heuristic_lines_are_anchored_at_the_smallest_batch_size():
    np.testing.assert_allclose(linear_heuristic([2, 4, 16], 2, 0.1), [0.1, 0.2, 0.8])
    np.testing.assert_allclose(square_root_heuristic([2, 8, 32], 2, 0.1), [0.1, 0.2, 0.4])


def test_optimal_metaparameters_of_the_best_trials(con):
    opt = optimal_metaparameters(steps_to_result(con, W, M, 0.01))
    np.testing.assert_array_equal(opt.batch_sizes, [8, 32, 128])  # 512 not reached
    np.testing.assert_allclose(opt.values["learning_rate"], [0.01, 0.04, 0.2])  # tie at 32 -> trial 1
    np.testing.assert_allclose(opt.values["momentum"], [0.9, 0.9, 0.95])
    np.testing.assert_allclose(opt.values["effective_learning_rate"], [0.1, 0.4, 4.0])
    lines = opt.heuristics("effective_learning_rate")
    np.testing.assert_allclose(lines["linear"], [0.1, 0.4, 1.6])
    np.testing.assert_allclose(lines["square_root"], [0.1, 0.2, 0.4])
    rows = opt.to_rows()
    assert rows[0] == {"batch_size": 8, "learning_rate": 0.01, "momentum": 0.9, "effective_learning_rate": pytest.approx(0.1)}


def test_optimal_metaparameters_without_momentum(make_con):
    w = "mnist/fc_1024/sgd"
    con = make_con([trial(w, 2, 1, curve([(10, 0.0)]), learning_rate=0.5), trial(w, 4, 1, curve([(5, 0.0)]), learning_rate=1.0)])
    opt = optimal_metaparameters(steps_to_result(con, w, M, 0.01))
    assert not opt.has("momentum") and opt.heuristics("momentum") == {}
    np.testing.assert_allclose(opt.values["effective_learning_rate"], [0.5, 1.0])


def test_trial_outcomes_for_the_scatter(con):
    frame = trial_outcomes(con, Selection(W, M, 0.01))
    at8 = frame[frame.batch_size == 8]
    assert list(at8.trial_id) == [1, 3, 5, 9]  # the INCOMPLETE trial 4 is left out
    assert list(at8.outcome) == ["reached", "diverged", "not_reached", "diverged"]
    assert list(at8.best) == [True, False, False, False]
    assert at8.effective_learning_rate.iloc[0] == pytest.approx(0.1)
    assert frame[frame.batch_size == 32].best.tolist() == [True, False]
    assert frame[frame.batch_size == 512].outcome.tolist() == ["not_reached"]
    # max_trials: diverged trials after the last selected trial's id are dropped.
    limited = trial_outcomes(con, Selection(W, M, 0.01, max_trials=2))
    assert list(limited[limited.batch_size == 8].trial_id) == [1, 3, 5]
