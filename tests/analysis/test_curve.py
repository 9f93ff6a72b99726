import pytest

from batchlab.analysis.curve import StepsCurve, curve_from_arrays
from batchlab.errors import BatchlabError


def test_from_points_sorts_and_keeps_censored_points():
    curve = StepsCurve.from_points([(8, None), (2, 100), (4.0, 60)], label="c")
    assert curve.batch_sizes == (2, 4, 8) and curve.steps == (100, 60, None)
    assert curve.reached == (True, True, False)
    b, s = curve.reached_arrays()
    assert b.tolist() == [2.0, 4.0] and s.tolist() == [100.0, 60.0]
    assert curve.exact and curve.brackets() == [(99, 100), (59, 60), None]
    assert curve.censoring() == [None, None, None]


@pytest.mark.parametrize("batch_size", [2.5, 0.5])
def test_fractional_batch_sizes_are_refused_not_truncated(batch_size):
    with pytest.raises(BatchlabError, match=r"batch sizes must be whole numbers, got \[" + str(batch_size)):
        StepsCurve.from_points([(batch_size, 10), (8, 5)], label="c")


def test_curve_from_arrays_treats_nan_and_inf_as_not_reached():
    curve = curve_from_arrays([1, 2, 4], [10.4, float("nan"), float("inf")])
    assert curve.steps == (10, None, None)


def test_brackets_and_censoring_travel_with_their_points():
    curve = StepsCurve.from_points(
        [(64, None), (4, 400), (16, 120)], steps_lower=[None, 380, 100], censored_at=[3000, None, None]
    )
    assert curve.batch_sizes == (4, 16, 64)
    assert curve.steps_lower == (380, 100, None) and curve.censored_at == (None, None, 3000)
    assert curve.brackets() == [(380, 400), (100, 120), None]
    assert not curve.exact
    data = curve.to_dict()["points"]
    assert data[2] == {"batch_size": 64, "steps": None, "steps_lower": None, "censored_at": 3000}
    arrays = curve_from_arrays([4, 16, 64], [400, 120, float("inf")], steps_lower=[380, 100, None],
                               censored_at=[None, None, 3000.0])
    assert arrays == StepsCurve(curve.batch_sizes, curve.steps, "", {}, curve.steps_lower, curve.censored_at)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"steps_lower": (10, None)}, "0 <= steps_lower < steps"),  # steps_lower >= steps
        ({"steps_lower": (-1, None)}, "0 <= steps_lower < steps"),
        ({"steps_lower": (5, 3)}, "must be None where the goal was not reached"),
        ({"censored_at": (3, None)}, "must be None where the goal was reached"),
        ({"censored_at": (None, -3)}, "must be >= 0"),
        ({"censored_at": (None,)}, "censored_at has 1 entries for 2 batch sizes"),
    ],
)
def test_bracket_and_censoring_validation(kwargs, fragment):
    with pytest.raises(BatchlabError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        StepsCurve(batch_sizes=(1, 2), steps=(10, None), **kwargs)


def test_bracket_text_names_a_goal_met_before_any_update():
    from batchlab.analysis.curve import bracket_text

    assert bracket_text(0, 0, None) == "0 (met before any update)"  # it read "(0, 0]"
    assert bracket_text(12, 11, None) == "(11, 12]" and bracket_text(12, None, None) == "12"
    assert bracket_text(None, None, 400) == "> 400" and bracket_text(None, None, None, unreached="") == ""
