"""The exact expected-loss curve of one NQM configuration, with divergence reported, not hidden.

:func:`loss_curve` is the library behind ``batchlab nqm curve``: the expected loss after each step
``0..N`` (``every="1"``) or at about 200 log-spaced steps (``every="log"``), for one algorithm, learning
rate, batch size and (where the algorithm has them) momentum and EMA decay.

Divergence. An unstable configuration (e.g. SGD with ``lr h_max >= 2``) makes the expected loss grow
geometrically until it overflows float64; from then on it is ``inf`` (or ``nan``). Such values are not
numbers a JSON reader accepts, so :class:`LossCurve` reports them: ``diverged`` is True when some
loss of the curve is not finite, and ``diverged_at_step`` is the first listed step whose loss is not
finite (with ``every="log"`` the overflow happened after the previous listed step and at or before this
one). :meth:`LossCurve.rows` gives ``None`` for those losses.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from batchlab.errors import BatchlabError
from batchlab.nqm.algorithms import Algorithm, get_nqm_algorithm, nqm_algorithm_names
from batchlab.nqm.problem import Problem, fits_in_memory

MAX_DENSE_STEPS = 20_000_000
"""Most steps listed one by one (``every="1"``); longer curves need ``every="log"``."""

LOG_POINTS = 200
"""Number of log-spaced steps (before removing duplicates) of ``every="log"``."""

_ROWS_BLOCK = 1 << 16  # steps converted to Python numbers at a time by LossCurve.rows


def _every_step(last: int) -> np.ndarray:
    return np.arange(last + 1)


def _log_steps(last: int) -> np.ndarray:
    return np.unique(np.concatenate([[0], np.round(np.geomspace(1, last, LOG_POINTS)).astype(np.int64)]))


def _dense(rec, batch_size, at):
    from batchlab.nqm.dynamics import dense_losses

    return dense_losses(rec, batch_size, int(at[-1]))[0]


def _sparse(rec, batch_size, at):
    from batchlab.nqm.dynamics import losses_at_steps

    return losses_at_steps(rec, batch_size, at)[0]


EVERY = {"1": (_every_step, _dense), "log": (_log_steps, _sparse)}
"""``every`` -> (the listed steps for a last step N, how their losses are computed)."""


@dataclass(frozen=True)
class LossCurve:
    """The exact expected loss ``losses[i]`` after ``steps[i]`` updates (``steps[0] = 0``, the initial loss).

    ``diverged``: some loss is not finite (overflowed float64); ``diverged_at_step``: the first listed
    step whose loss is not finite (None if none).
    """

    steps: np.ndarray
    losses: np.ndarray

    @property
    def diverged(self) -> bool:
        return not bool(np.all(np.isfinite(self.losses)))

    @property
    def diverged_at_step(self) -> int | None:
        bad = np.flatnonzero(~np.isfinite(self.losses))
        return int(self.steps[bad[0]]) if bad.size else None

    def rows(self) -> Iterator[dict]:
        """``{"step": t, "loss": L(t)}`` per listed step, in order; a loss that is not finite is ``None``.

        An iterator, made a block of steps at a time, so a curve of :data:`MAX_DENSE_STEPS` steps streams
        without a list of millions of dicts."""
        for start in range(0, self.steps.size, _ROWS_BLOCK):
            block = slice(start, start + _ROWS_BLOCK)
            for t, loss in zip(self.steps[block].tolist(), self.losses[block].tolist()):
                yield {"step": t, "loss": loss if math.isfinite(loss) else None}

    def final_loss(self) -> float | None:
        """The loss at the last listed step (None if not finite)."""
        last = float(self.losses[-1])
        return last if np.isfinite(last) else None


def check_curve_options(algorithm: Algorithm, momentum: float | None, ema_decay: float | None) -> None:
    """One-line errors when the algorithm needs a momentum / EMA decay that is missing, or is given one
    it does not use (which algorithms use what is read from the registry)."""
    name = algorithm.name
    if algorithm.uses_momentum and momentum is None:
        raise BatchlabError(f"optimizer {name!r} needs --momentum")
    if algorithm.uses_ema and ema_decay is None:
        raise BatchlabError(f"optimizer {name!r} needs --ema-decay")
    if momentum is not None and not algorithm.uses_momentum:
        users = ", ".join(n for n in nqm_algorithm_names() if get_nqm_algorithm(n).uses_momentum)
        raise BatchlabError(f"--momentum does not apply to optimizer {name!r}; use one of {users}")
    if ema_decay is not None and not algorithm.uses_ema:
        users = ", ".join(n for n in nqm_algorithm_names() if get_nqm_algorithm(n).ema)
        raise BatchlabError(f"--ema-decay does not apply to optimizer {name!r}; use one of {users}")


def loss_curve(
    problem: Problem,
    algorithm: Algorithm,
    learning_rate: float,
    batch_size: float,
    steps: int,
    momentum: float | None = None,
    ema_decay: float | None = None,
    every: str = "1",
) -> LossCurve:
    """The exact expected loss of one configuration at steps ``0..steps`` (``every="1"``) or at about
    :data:`LOG_POINTS` log-spaced steps from 0 to ``steps`` (``every="log"``).

    Bad input (batch size, steps, ``every``, a missing or inapplicable momentum / EMA decay, learning
    rate) is a one-line :class:`BatchlabError`; running out of memory too
    (:func:`batchlab.nqm.problem.fits_in_memory`).
    """
    from batchlab.nqm.dynamics import moment_recurrence

    if not 0 < batch_size < float("inf"):
        raise BatchlabError(f"batch size must be > 0 and finite, got {batch_size:g}")
    if steps < 1:
        raise BatchlabError(f"--steps must be >= 1, got {steps}")
    if every not in EVERY:
        raise BatchlabError(f"--every must be '1' or 'log', got {every!r}")
    check_curve_options(algorithm, momentum, ema_decay)
    if every == "1" and steps > MAX_DENSE_STEPS:
        raise BatchlabError(f"--steps {steps} is too many for every step; use --every log")
    listed, losses_of = EVERY[every]
    with fits_in_memory(problem):
        rec = moment_recurrence(problem, algorithm, learning_rate, momentum, ema_decay)
        at = listed(steps)
        losses = losses_of(rec, batch_size, at)
    return LossCurve(np.asarray(at), np.asarray(losses))


__all__ = ["EVERY", "LossCurve", "check_curve_options", "loss_curve"]
