"""Learning-rate multipliers: linear decay (Shallue) and warmup."""

import pytest

from batchlab.optim.schedules import learning_rate_multiplier, multiplier_function


def test_constant_has_no_scheduler():
    assert multiplier_function(None, 0.0, 0) is None
    assert learning_rate_multiplier(123) == 1.0


@pytest.mark.parametrize("t", [0, 1, 5, 9, 10, 11, 100])
def test_linear_decay_formula(t):
    alpha, T = 0.01, 10
    assert learning_rate_multiplier(t, T, alpha) == pytest.approx(1 - (1 - alpha) * min(t, T) / T)


def test_warmup_multiplies_decay():
    f = multiplier_function(8, 0.0, 4)
    assert [f(t) for t in range(10)] == pytest.approx(
        [0.25 * 1.0, 0.5 * 0.875, 0.75 * 0.75, 1.0 * 0.625, 0.5, 0.375, 0.25, 0.125, 0.0, 0.0]
    )
