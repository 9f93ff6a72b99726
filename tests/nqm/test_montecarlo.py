import numpy as np
import pytest

from batchlab.nqm.dynamics import Algorithm, losses_at_steps, moment_recurrence
from batchlab.nqm.montecarlo import simulate_losses
from batchlab.nqm.problem import from_eigenvalues, power_law

STEPS = [0, 1, 3, 10, 40, 150]


def _z_scores(problem, algorithm, lr, batch_size, runs, seed, **hyper):
    exact = losses_at_steps(moment_recurrence(problem, algorithm, lr, **hyper), batch_size, STEPS)[0]
    mc = simulate_losses(problem, algorithm, lr, batch_size, STEPS, runs=runs, seed=seed, **hyper)
    z = (mc.mean - exact) / np.maximum(mc.standard_error, 1e-300)
    return z[1:]  # step 0 is the same sample for every algorithm


@pytest.mark.parametrize(
    "name, p, hyper",
    [
        ("sgd", 0.0, {}),
        ("sgd", 0.5, {}),
        ("momentum", 0.0, {"momentum": 0.9}),
        ("momentum", 0.25, {"momentum": 0.5}),
        ("nesterov", 0.0, {"momentum": 0.9}),
        ("ema", 0.0, {"ema_decay": 0.9}),
        ("momentum+ema", 0.5, {"momentum": 0.7, "ema_decay": 0.8}),
    ],
)
def test_monte_carlo_agrees_with_exact_recurrence(name, p, hyper):
    problem = power_law(1.0, 1.0, 12)
    z = _z_scores(problem, Algorithm(name, p), 0.3, 4.0, runs=3000, seed=1, **hyper)
    # 5 correlated checks per case at 4.5 sigma: a false alarm is vanishingly rare, a wrong matrix is not.
    assert np.all(np.abs(z) < 4.5), z


def test_monte_carlo_degenerate_ema_case():
    # lr 0.1, decay 0.9, h = 1: 1 - lr h equals the decay (defective transition matrix).
    problem = from_eigenvalues([1.0])
    z = _z_scores(problem, Algorithm("ema"), 0.1, 1.0, runs=20000, seed=2, ema_decay=0.9)
    assert np.all(np.abs(z) < 4.5), z


def test_monte_carlo_detects_a_wrong_recurrence():
    # The same check must fail against a different algorithm's exact curve (the test can fail).
    problem = power_law(1.0, 1.0, 12)
    exact_wrong = losses_at_steps(moment_recurrence(problem, Algorithm("nesterov"), 0.3, momentum=0.9), 4.0, STEPS)[0]
    mc = simulate_losses(problem, Algorithm("momentum"), 0.3, 4.0, STEPS, runs=3000, seed=1, momentum=0.9)
    assert np.max(np.abs((mc.mean - exact_wrong) / mc.standard_error)[1:]) > 6
