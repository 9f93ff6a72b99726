import pytest

from batchlab.analysis.curve import StepsCurve, curve_from_arrays
from batchlab.errors import BatchlabError


def test_from_points_sorts_and_keeps_censored_points():
    curve = StepsCurve.from_points([(8, None), (2, 100), (4.0, 60)], label="c")
    assert curve.batch_sizes == (2, 4, 8) and curve.steps == (100, 60, None)
    assert curve.reached == (True, True, False)
    b, s = curve.reached_arrays()
    assert b.tolist() == [2.0, 4.0] and s.tolist() == [100.0, 60.0]


@pytest.mark.parametrize("batch_size", [2.5, 0.5])
def test_fractional_batch_sizes_are_refused_not_truncated(batch_size):
    with pytest.raises(BatchlabError, match=r"batch sizes must be whole numbers, got \[" + str(batch_size)):
        StepsCurve.from_points([(batch_size, 10), (8, 5)], label="c")


def test_curve_from_arrays_treats_nan_and_inf_as_not_reached():
    curve = curve_from_arrays([1, 2, 4], [10.4, float("nan"), float("inf")])
    assert curve.steps == (10, None, None)
