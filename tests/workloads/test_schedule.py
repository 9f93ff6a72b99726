import pytest

from batchlab.errors import BatchlabError
from batchlab.train.evaluation import bracket
from batchlab.workloads.schedule import EvaluationSchedule, evaluation_steps, resolution_steps, schedule_resolution


def test_dense_early_regular_later():
    steps = evaluation_steps(2000, num_regular=40, early_ratio=1.25)
    assert steps[:5] == [1, 2, 3, 4, 5]
    assert steps[-1] == 2000 and steps == sorted(set(steps))
    regular = [s for s in steps if s >= 50]
    assert regular == list(range(50, 2001, 50))
    early = [s for s in steps if s < 50]
    gaps = [b / a for a, b in zip(early, early[1:])]
    assert all(g <= 2.0 for g in gaps)
    assert evaluation_steps(2000)[:11] == [1, 2, 3, 5, 8, 12, 18, 27, 41, 62, 80]  # the defaults


@pytest.mark.parametrize("total", [1, 2, 7, 39, 41, 1000, 12345])
def test_always_within_budget_and_ending_at_it(total):
    steps = evaluation_steps(total, num_regular=10, early_ratio=2.0)
    assert steps[0] >= 1 and steps[-1] == total
    assert all(1 <= s <= total for s in steps) and steps == sorted(set(steps))


def test_configurable():
    assert len(evaluation_steps(10000, num_regular=100)) > len(evaluation_steps(10000, num_regular=10))
    old = EvaluationSchedule(num_regular=4, early_ratio=2.0, resolution=None)  # the schedule before resolution steps
    assert old.steps(100) == old.full_steps(100) == [1, 2, 4, 8, 16, 25, 50, 75, 100] and old.goal_steps(100) == []
    new = EvaluationSchedule(num_regular=4, early_ratio=2.0)
    assert new.full_steps(100) == old.steps(100) and new.goal_steps(100) == resolution_steps(100)
    assert new.steps(100) == sorted(set(old.steps(100)) | set(resolution_steps(100)))


def test_resolution_steps_every_step_then_geometric():
    steps = resolution_steps(3000)
    assert steps[:40] == list(range(1, 41))  # every step while 1/r = 20 is larger, and floor(s * 1.05) = s + 1 up to 40
    assert steps[40:45] == [42, 44, 46, 48, 50] and steps[-1] == 3000 and steps == sorted(set(steps))
    assert all(b <= max(a + 1, 1.05 * a) for a, b in zip(steps, steps[1:]))
    assert schedule_resolution(steps) == pytest.approx(0.05, abs=0.002)
    assert len(steps) == 134  # about 1/r + ln(T r) / ln(1 + r) evaluations: logarithmic in the budget
    assert resolution_steps(1) == [1] and resolution_steps(5, 0.5) == [1, 2, 3, 4, 5]
    assert resolution_steps(100, 0.5) == [1, 2, 3, 4, 6, 9, 13, 19, 28, 42, 63, 94, 100]


@pytest.mark.parametrize("resolution", [0.01, 0.05, 0.1, 0.3, 0.9])
def test_resolution_is_independent_of_the_budget(resolution):
    long = resolution_steps(20000, resolution)
    for total in (7, 100, 999, 3000, 12345):
        short = resolution_steps(total, resolution)
        assert short[:-1] == [s for s in long if s < total] and short[-1] == total


@pytest.mark.parametrize("resolution", [0.05, 0.2])
def test_bracket_of_every_first_passage_is_within_the_bound(resolution):
    # A metric that passes the goal at step t (and stays past it) is first seen at the first
    # evaluation s >= t; the bracket (previous evaluation, s] contains t and is at most 1 + r wide.
    steps = resolution_steps(5000, resolution)
    for truth in range(1, 5001):
        upper = next(s for s in steps if s >= truth)
        lower = bracket(steps, upper)
        assert lower < truth <= upper and upper <= max(lower + 1, (1 + resolution) * lower)


@pytest.mark.parametrize("resolution", [0, 1, -0.1, 1.5, float("nan"), "0.05", True])
def test_bad_resolution_is_one_line(resolution):
    with pytest.raises(BatchlabError, match="resolution must be a number in \\(0, 1\\)") as err:
        resolution_steps(100, resolution)
    assert "\n" not in str(err.value)
    with pytest.raises(BatchlabError, match="resolution must be"):
        EvaluationSchedule(resolution=resolution)


@pytest.mark.parametrize("kwargs", [{"total_steps": 0}, {"total_steps": 10, "num_regular": 0}, {"total_steps": 10, "early_ratio": 1.0}])
def test_bad_settings(kwargs):
    with pytest.raises(BatchlabError):
        evaluation_steps(**kwargs)
