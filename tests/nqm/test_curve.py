"""The loss curve of one configuration: exact values, divergence reported."""

import json

import numpy as np
import pytest

from batchlab.errors import BatchlabError
from batchlab.nqm.algorithms import Algorithm
from batchlab.nqm.curve import loss_curve
from batchlab.nqm.dynamics import losses_at_steps, moment_recurrence
from batchlab.nqm.problem import power_law


def test_a_stable_curve_is_the_exact_loss():
    problem = power_law(1.0, 1.0, 30)
    curve = loss_curve(problem, Algorithm("momentum"), 0.2, 8, 40, momentum=0.5)
    exact = losses_at_steps(moment_recurrence(problem, Algorithm("momentum"), 0.2, momentum=0.5), 8, np.arange(41))[0]
    np.testing.assert_allclose(curve.losses, exact, rtol=1e-12)
    assert curve.diverged is False and curve.diverged_at_step is None and curve.final_loss() == curve.losses[-1]


def test_a_diverging_curve_says_where_and_its_rows_are_strict_json():
    problem = power_law(1.0, 1.0, 30)
    curve = loss_curve(problem, Algorithm("sgd"), 3.0, 4, 1000)  # |1 - 3 h_1| = 2: the loss grows like 4^t
    assert curve.diverged is True
    k = curve.diverged_at_step
    assert 400 < k < 600 and np.isfinite(curve.losses[k - 1]) and not np.isfinite(curve.losses[k])
    rows = list(curve.rows())
    assert len(rows) == 1001 and [r["step"] for r in rows] == list(range(1001))
    text = "\n".join(json.dumps(row, allow_nan=False) for row in rows)  # raises on inf / nan
    assert rows[k]["loss"] is None and rows[k - 1]["loss"] == curve.losses[k - 1] and curve.final_loss() is None
    assert "Infinity" not in text and "NaN" not in text
    logged = loss_curve(problem, Algorithm("sgd"), 3.0, 4, 1000, every="log")
    assert logged.diverged and logged.diverged_at_step >= k  # the first listed step at or after the overflow
    before = logged.steps[logged.steps < logged.diverged_at_step]
    assert before.size and before[-1] < k


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"algorithm": Algorithm("momentum")}, "needs --momentum"),
        ({"algorithm": Algorithm("ema")}, "needs --ema-decay"),
        ({"momentum": 0.9}, "--momentum does not apply to optimizer 'sgd'; use one of momentum, nesterov"),
        ({"ema_decay": 0.9}, "--ema-decay does not apply to optimizer 'sgd'; use one of ema, momentum+ema"),
        ({"every": "2"}, "--every must be '1' or 'log'"),
        ({"steps": 0}, "--steps must be >= 1"),
        ({"batch_size": float("inf")}, "batch size must be > 0 and finite"),
    ],
)
def test_bad_input_is_a_one_line_error(kwargs, fragment):
    args = {"algorithm": Algorithm("sgd"), "learning_rate": 0.1, "batch_size": 4, "steps": 10, **kwargs}
    with pytest.raises(BatchlabError) as info:
        loss_curve(power_law(1.0, 1.0, 10), **args)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_rows_stream_every_step_across_blocks():
    from batchlab.nqm.curve import LossCurve

    n = 3 * (1 << 16) + 5  # more than one block of rows
    losses = np.linspace(1.0, 0.5, n)
    losses[-3:] = np.inf
    rows = LossCurve(np.arange(n), losses).rows()
    assert not isinstance(rows, list)  # streamed, not built whole
    rows = list(rows)
    assert [r["step"] for r in rows] == list(range(n)) and [r["loss"] for r in rows[:-3]] == losses[:-3].tolist()
    assert [r["loss"] for r in rows[-3:]] == [None, None, None]
