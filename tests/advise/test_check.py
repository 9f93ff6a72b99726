"""advise's check run (batchlab.advise.check): one real trial of a tiny MNIST setting with a loose goal,
compared with predicted intervals that cover its steps to the goal and ones that do not; a budget too
small to reach the goal; the updates counted against the updates the trial really ran; the record's
round trip; bad predicted intervals in one line."""

import json
import math

import pytest

from batchlab.advise.check import CheckResult, check_recommendation, within_prediction
from batchlab.errors import BatchlabError

# A loose goal that fc_64_64_64 on 2,048 images at B = 64, lr 0.2 passes in about a hundred steps.
SETTING = dict(workload="mnist/fc_64_64_64", optimizer="sgd", batch_size=64, hyperparameters={"learning_rate": 0.2})
OPTIONS = dict(device="cpu", train_examples=2048, goal=0.2, seed=1000003)


@pytest.fixture(scope="module")
def reached():
    """The check run with a generous budget and a wide prediction, plus the updates the trial ran
    (every update draws its batch from the trial's sampler once, live or replayed)."""
    from batchlab.train.sampling import BatchSampler

    calls = [0]
    original = BatchSampler.indices

    def counted(self, step):
        calls[0] += 1
        return original(self, step)

    BatchSampler.indices = counted
    try:
        result = check_recommendation(**SETTING, **OPTIONS, steps=2000, predicted_low=1, predicted_high=1900)
    finally:
        BatchSampler.indices = original
    return result, calls[0]


def test_a_check_that_reaches_the_goal_inside_the_prediction(reached):
    result, updates = reached
    assert result.reached and result.status == "STOPPED_AT_GOAL"
    assert 0 < result.steps < 2000 and result.steps_lower < result.steps
    assert result.steps - result.steps_lower <= max(1, math.ceil(0.05 * result.steps_lower))  # the 5% resolution
    assert result.within is True
    assert result.examples == updates * 64  # live and replayed updates, each counted once
    assert result.examples >= result.steps * 64
    assert result.seconds > 0 and result.steps_budget == 2000 and result.seed == 1000003
    assert result.hyperparameters == {"learning_rate": 0.2}
    # the goal metric's values: steps ascending, the last one (at steps) meets the goal
    steps = [s for s, _ in result.measurements]
    assert steps == sorted(steps) and steps[0] <= result.steps_lower
    assert all(value < 0.2 for s, value in result.measurements if s == result.steps)
    text = result.text()
    assert text == (f"check: B=64, seed 1000003: reached the goal at step {result.steps} "
                    f"(bracket ({result.steps_lower}, {result.steps}]), inside the predicted [1, 1900]")


def test_within_follows_the_prediction(reached):
    result, _ = reached
    low, steps = result.steps_lower, result.steps
    assert within_prediction(steps, low, steps, steps)          # the prediction is the step itself
    assert within_prediction(steps, low, low + 0.5, steps + 50)  # overlaps the bracket's inside
    assert not within_prediction(steps, low, steps + 1, 10 * steps)  # moved above the bracket
    assert not within_prediction(steps, low, 0, low)             # ends where the bracket opens (excluded)
    assert within_prediction(0, 0, 0, 10) and not within_prediction(0, 0, 1, 10)  # goal met at step 0

    moved = check_recommendation(**SETTING, **OPTIONS, steps=2000, predicted_low=10 * steps,
                                 predicted_high=20 * steps)
    assert moved.reached and moved.steps == steps  # the same trial: the same steps (deterministic)
    assert moved.within is False
    assert "outside the predicted" in moved.text()


def test_a_budget_too_small_is_not_reached(reached):
    result, _ = reached
    budget = max(1, result.steps_lower // 2)
    short = check_recommendation(**SETTING, **OPTIONS, steps=budget, predicted_low=1, predicted_high=None)
    assert short.reached is False and short.within is None
    assert short.steps is None and short.steps_lower is None
    assert short.status == "COMPLETE" and short.examples == budget * 64
    assert short.predicted_high == math.inf
    assert short.text() == (f"check: B=64, seed 1000003: not reached within the budget of {budget} steps "
                            "(predicted [1, inf])")
    data = json.loads(json.dumps(short.to_dict()))
    assert data["predicted_high"] is None
    assert CheckResult.from_dict(data) == short


def test_round_trip(reached):
    result, _ = reached
    data = json.loads(json.dumps(result.to_dict()))
    assert data["text"] == result.text()
    assert CheckResult.from_dict(data) == result


@pytest.mark.parametrize("low, high, fragment", [
    (-1, 10, "predicted low must be"),
    (float("nan"), 10, "predicted low must be"),
    (20, 10, "predicted high must be"),
    (1, "x", "predicted high must be"),
])
def test_bad_predictions_are_one_line_errors(low, high, fragment):
    with pytest.raises(BatchlabError) as info:
        check_recommendation(**SETTING, **OPTIONS, steps=10, predicted_low=low, predicted_high=high)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_no_prediction_is_said_and_round_trips(reached):
    result, _ = reached
    unpredicted = check_recommendation(**SETTING, **OPTIONS, steps=result.steps, predicted_low=None, predicted_high=None)
    assert unpredicted.reached and unpredicted.within is None
    assert (unpredicted.predicted_low, unpredicted.predicted_high) == (None, None)
    assert unpredicted.text().endswith("; no predicted interval to compare with")
    assert CheckResult.from_dict(json.loads(json.dumps(unpredicted.to_dict()))) == unpredicted
