import pytest

from batchlab.errors import BatchlabError
from batchlab.workloads.schedule import EvaluationSchedule, evaluation_steps


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
    assert EvaluationSchedule(num_regular=4, early_ratio=2.0).steps(100) == [1, 2, 4, 8, 16, 25, 50, 75, 100]


@pytest.mark.parametrize("kwargs", [{"total_steps": 0}, {"total_steps": 10, "num_regular": 0}, {"total_steps": 10, "early_ratio": 1.0}])
def test_bad_settings(kwargs):
    with pytest.raises(BatchlabError):
        evaluation_steps(**kwargs)
