"""Monte Carlo simulation of the NQM's actual stochastic updates, to check the exact moment recurrences.

The updates are written out directly from their definitions (each base update's ``sample`` in
:mod:`batchlab.nqm.algorithms`, not the matrices of :mod:`batchlab.nqm.dynamics`), with
``x_0 ~ N(0, s0)`` and batch-gradient noise ``eps ~ N(0, c / B)`` (numpy ``Generator``). Each entry of a
binned problem is simulated as one direction and weighted by its count, which leaves the expected loss
unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from batchlab.errors import BatchlabError
from batchlab.nqm.dynamics import Algorithm, check_learning_rate, check_momentum
from batchlab.nqm.problem import Problem


@dataclass(frozen=True)
class MonteCarloLosses:
    """Sample mean and standard error of the loss over ``runs`` independent runs, at ``steps``."""

    steps: np.ndarray
    mean: np.ndarray
    standard_error: np.ndarray
    runs: int


def simulate_losses(
    problem: Problem,
    algorithm: Algorithm,
    learning_rate: float,
    batch_size: float,
    steps,
    runs: int = 2000,
    momentum: float | None = None,
    ema_decay: float | None = None,
    seed: int = 0,
) -> MonteCarloLosses:
    """Simulate ``runs`` independent trainings and record the loss of the evaluated iterate at ``steps``.

    SGD:       ``x <- x - lr h^-p (h x + eps)``
    momentum:  ``v <- mu v - lr h^-p (h x + eps)``, ``x <- x + v``
    Nesterov:  ``v <- mu v - lr h^-p (h (x + mu v) + eps)``, ``x <- x + v``
    EMA:       ``x_ema <- gamma x_ema + (1 - gamma) x`` after each update (``x_ema_0 = x_0``); the loss is
               evaluated at ``x_ema``.
    """
    lr = float(check_learning_rate(learning_rate))
    if not batch_size > 0:
        raise BatchlabError(f"batch size must be > 0, got {batch_size}")
    steps = np.asarray(sorted(set(int(s) for s in steps)), dtype=np.int64)
    if steps.size == 0 or steps[0] < 0:
        raise BatchlabError("steps must be a non-empty list of integers >= 0")
    mu = float(check_momentum(0.0 if momentum is None else momentum)) if algorithm.uses_momentum else None
    sample = algorithm.update.sample  # the base update, written out on samples (batchlab.nqm.algorithms)
    if algorithm.uses_ema:
        gamma = float(check_momentum(0.0 if ema_decay is None else ema_decay, "EMA decay"))
    rng = np.random.default_rng(seed)
    h, c = problem.curvature, problem.noise
    gain = lr * h ** (-float(algorithm.precondition))
    noise_sd = np.sqrt(c / batch_size)
    weights = problem.loss_weights
    x = rng.standard_normal((runs, h.size)) * np.sqrt(problem.initial_second_moment)
    v = np.zeros_like(x)
    x_ema = x.copy()
    means, errors = [], []

    def record():
        evaluated = x_ema if algorithm.uses_ema else x
        loss = (evaluated**2) @ weights
        means.append(loss.mean())
        errors.append(loss.std(ddof=1) / np.sqrt(runs))

    t = 0
    for target in steps:
        while t < target:
            eps = rng.standard_normal(x.shape) * noise_sd
            x, v = sample(x, v, gain, h, eps, mu)
            if algorithm.uses_ema:
                x_ema = gamma * x_ema + (1.0 - gamma) * x
            t += 1
        record()
    return MonteCarloLosses(steps=steps, mean=np.asarray(means), standard_error=np.asarray(errors), runs=runs)
