import numpy as np
import pytest

from batchlab.errors import BatchlabError
from batchlab.nqm.dynamics import Algorithm, dense_losses, losses_at_steps, moment_recurrence
from batchlab.nqm.problem import from_eigenvalues, zhang2019_binned
from batchlab.nqm.steps import (
    check_target,
    first_passage_candidates,
    official_low,
    steps_to_target,
)


def _bisection_low(loss, high):
    """The notebook's search: keep loss(low) >= C and loss(high) < C; assumes a monotone loss."""
    low = 0
    while high - low > 1:
        mid = (low + high) // 2
        if loss(mid):
            high = mid
        else:
            low = mid
    return low


def test_first_passage_on_oscillating_momentum_curve():
    # Under-damped heavy ball on two directions: the loss oscillates around the target before settling.
    problem = from_eigenvalues([1.0, 0.05])
    rec = moment_recurrence(problem, Algorithm("momentum"), 0.5, momentum=0.9)
    batch_size, target = 1e6, 0.05
    curve = dense_losses(rec, batch_size, 4000)[0]
    below = curve < target
    first = int(np.argmax(below))
    assert below[first] and not below[first + 1 :].all()  # it crosses, then comes back above: non-monotone
    result = steps_to_target(rec, batch_size, target, 10**6)
    assert result.reached and result.steps == first and result.certified == "dense"
    assert result.official_low == first - 1
    assert result.final_loss == pytest.approx(curve[first])
    # The notebook's bisection lands on a later crossing, and so does the lifting candidate alone.
    bisect = _bisection_low(lambda k: losses_at_steps(rec, batch_size, [k])[0, 0] < target, 10**6) + 1
    assert bisect > first
    assert first_passage_candidates(rec, [batch_size], target, 10**6)[0, 0] > first


def test_sgd_first_passage_is_certified_by_laguerre_and_matches_dense():
    problem = zhang2019_binned()
    rec = moment_recurrence(problem, Algorithm("sgd"), 0.2)
    result = steps_to_target(rec, 64, 0.05, 10**7)
    curve = dense_losses(rec, 64, result.steps + 10)[0]
    assert result.certified == "laguerre"
    assert result.steps == int(np.argmax(curve < 0.05))
    assert official_low(result.steps) == result.steps - 1 and official_low(1) == 1


def test_not_reached_is_explicit():
    problem = zhang2019_binned()
    rec = moment_recurrence(problem, Algorithm("sgd"), 1e-4)
    result = steps_to_target(rec, 4, 0.01, 1000)
    assert result.reached is False and result.steps is None and result.official_low is None
    assert result.final_loss == pytest.approx(losses_at_steps(rec, 4, [1000])[0, 0])
    assert result.certified == "laguerre"


def test_budget_is_respected_exactly():
    problem = zhang2019_binned()
    rec = moment_recurrence(problem, Algorithm("sgd"), 0.2)
    steps = steps_to_target(rec, 64, 0.05, 10**7).steps
    assert steps_to_target(rec, 64, 0.05, steps).steps == steps
    assert steps_to_target(rec, 64, 0.05, steps - 1).reached is False


def test_target_validation():
    with pytest.raises(BatchlabError, match="> 0"):
        check_target(0.0, 4.7)
    with pytest.raises(BatchlabError, match="below the initial loss"):
        check_target(5.0, 4.7)
