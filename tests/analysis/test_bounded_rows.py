"""Bounded measurement rows (docs/methods.md, "Bounded measurements"): a row ``<metric>:bound`` flags
the ``<metric>`` row at its step as a lower (+1) or upper (-1) bound; it decides the goal only when the
bound does, and it is never read as a value or listed as a metric."""

import pytest

from analysis_fixtures import trial
from batchlab.analysis.budgets import best_measurement
from batchlab.analysis.selection import Selection, check_selection, metric_names
from batchlab.analysis.steps_to_result import steps_to_result, trial_first_steps
from batchlab.errors import BatchlabError

W = "mnist/fc_64_64_64/sgd"
M = "val/classification_error"
FLAG = M + ":bound"


def bounded(step20_value, flag, last=0.03):
    """Exact rows at 10 (0.5) and 30 (``last``); the row at 20 is a bound with ``flag``."""
    return [(10, {M: 0.5}), (20, {M: step20_value, FLAG: flag}), (30, {M: last})]


@pytest.mark.parametrize(
    "value, flag, maximize, goal, first, prev",
    [
        (0.04, -1.0, False, 0.05, 20, 10),  # true <= 0.04 < 0.05: met at 20
        (0.04, 1.0, False, 0.05, 30, 10),  # true >= 0.04: undecided, ignored (not even a miss)
        (0.2, 1.0, False, 0.05, 30, 20),  # true >= 0.2 >= 0.05: a miss
        (0.05, 1.0, False, 0.05, 30, 20),  # true >= 0.05 = goal: a miss (strict goal)
        (0.2, -1.0, False, 0.05, 30, 10),  # true <= 0.2: undecided
        (0.95, 1.0, True, 0.9, 20, 10),  # maximize: true >= 0.95 > 0.9: met
        (0.95, -1.0, True, 0.9, None, None),  # true <= 0.95: undecided; 0.5 and 0.03 miss
        (0.6, -1.0, True, 0.9, None, None),  # true <= 0.6 <= 0.9: a miss
    ],
)
def test_a_bound_decides_the_goal_only_when_it_can(make_con, value, flag, maximize, goal, first, prev):
    con = make_con([trial(W, 8, 1, bounded(value, flag))])
    frame = trial_first_steps(con, Selection(W, M, goal, maximize=maximize))
    row = frame.iloc[0]
    if first is None:
        assert row.first_step == float("inf")
    else:
        assert (row.first_step, row.prev_step) == (first, prev)
        (result,) = steps_to_result(con, W, M, goal, maximize=maximize)
        assert (result.steps, result.steps_lower) == (first, prev)
        assert result.value_bound == (int(flag) if first == 20 else None)
        assert result.to_dict()["value_bound"] == result.value_bound


def test_an_undecided_last_row_is_not_a_censoring_bound(make_con):
    con = make_con([trial(W, 8, 1, [(10, {M: 0.5}), (20, {M: 0.2, FLAG: -1.0})])])
    (result,) = steps_to_result(con, W, M, 0.05)
    assert not result.reached and result.censored_at == 10  # S > 10 is known, S > 20 is not
    con = make_con([trial(W, 8, 1, [(10, {M: 0.5}), (20, {M: 0.2, FLAG: 1.0})])])
    assert steps_to_result(con, W, M, 0.05)[0].censored_at == 20


def test_bound_flags_are_not_metrics(make_con):
    con = make_con([trial(W, 8, 1, bounded(0.04, -1.0))])
    assert metric_names(con, W) == [M]
    with pytest.raises(BatchlabError, match=r"holds the bound flags of 'val/classification_error', not a metric; "
                                            r"allowed: val/classification_error$"):
        check_selection(con, Selection(W, FLAG, 0.5))
    with pytest.raises(BatchlabError, match="unknown metric"):
        best_measurement(con, W, FLAG)


def test_best_measurement_skips_bounded_rows(make_con):
    con = make_con([trial(W, 8, 1, [(10, {M: 0.5}), (20, {M: 0.01, FLAG: -1.0}), (30, {M: 0.03})])])
    (best,) = best_measurement(con, W, M)
    assert (best.value, best.step) == (0.03, 30)
    (best,) = best_measurement(con, W, M, step_budget=20)
    assert (best.value, best.step) == (0.5, 10)
