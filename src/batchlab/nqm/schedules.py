"""Learning-rate and batch-size schedules for the NQM.

What is exact and what is not:

* A schedule is a list of :class:`Segment` s, each with a constant learning-rate factor and batch size.
  The moment recurrences over a segment are exact (powers of the augmented map), so any
  piecewise-constant schedule (constant, PWC, batch-size schedule ``B(t)``) is evaluated exactly.
* ``linear`` decay and ``warmup + cosine`` change the learning rate every step. Up to
  ``max_segments`` (default 256) steps of change they are represented step by step, i.e. exactly; a
  longer decay is represented by ``max_segments`` equal-length constant pieces at the factor of each
  piece's midpoint step. The dynamics of that piecewise schedule are still exact; the schedule itself is
  then the stated approximation (``Segment`` lists say which).
* The optimised PWC schedule (:func:`optimal_pwc_sgd`) follows the official protocol (docs/methods.md, "Learning-rate schedules"):
  ``K`` pieces of equal length ``k``, ``log lr`` optimised with L-BFGS-B (analytic adjoint gradient) for
  the loss after ``K k`` steps, outer binary search on ``k``. The optimiser is local, so its steps are an
  upper bound on the best PWC schedule. Only plain SGD (any p) is supported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from batchlab.errors import BatchlabError, unknown_name_error
from batchlab.nqm.dynamics import Algorithm, apply, map_power, moment_recurrence
from batchlab.nqm.problem import Problem
from batchlab.nqm.steps import check_target, first_passage_candidates

SCHEDULES = ("constant", "pwc:K", "linear", "cosine")


@dataclass(frozen=True)
class Segment:
    """``length`` updates at ``lr_factor * lr`` and batch size ``batch_size`` (None: the caller's B)."""

    length: int
    lr_factor: float = 1.0
    batch_size: float | None = None


def parse_schedule(text: str) -> tuple[str, int | None]:
    """``constant``, ``linear``, ``cosine`` or ``pwc:K`` -> ``(kind, K)``."""
    if text in ("constant", "linear", "cosine"):
        return text, None
    if text.startswith("pwc:"):
        try:
            pieces = int(text[4:])
        except ValueError:
            pieces = 0
        if pieces < 1:
            raise BatchlabError(f"schedule {text!r}: pwc needs a positive number of pieces, e.g. pwc:10")
        return "pwc", pieces
    raise unknown_name_error("schedule", text, SCHEDULES)


def linear_decay_segments(decay_steps: int, end_factor: float = 0.0, max_segments: int = 256) -> list[Segment]:
    """LR factor ``1 - (1 - end_factor) t / decay_steps`` for ``t < decay_steps``, then ``end_factor`` forever.

    A factor of exactly 0 is replaced by ``1e-12`` of the base LR in the final segment (an LR of 0 never
    reaches any target, the tail must still be a valid update).
    """
    _check_schedule(decay_steps, end_factor)
    return _sampled_segments(lambda t: 1.0 - (1.0 - end_factor) * t / decay_steps, decay_steps, end_factor, max_segments)


def warmup_cosine_segments(
    warmup_steps: int, decay_steps: int, end_factor: float = 0.0, max_segments: int = 256
) -> list[Segment]:
    """Linear warmup from ``1/warmup_steps`` to 1 over ``warmup_steps``, then cosine to ``end_factor`` over
    ``decay_steps``, then ``end_factor`` forever."""
    _check_schedule(decay_steps, end_factor)
    if int(warmup_steps) != warmup_steps or warmup_steps < 0:
        raise BatchlabError(f"warmup steps must be an integer >= 0, got {warmup_steps}")
    total = int(warmup_steps) + int(decay_steps)

    def factor(t):
        t = np.asarray(t, dtype=float)
        warm = (t + 1.0) / max(warmup_steps, 1)
        progress = (t - warmup_steps) / decay_steps
        cosine = end_factor + (1.0 - end_factor) * 0.5 * (1.0 + np.cos(np.pi * np.clip(progress, 0.0, 1.0)))
        return np.where(t < warmup_steps, warm, cosine)

    return _sampled_segments(factor, total, end_factor, max_segments)


def batch_size_segments(pieces) -> list[Segment]:
    """A piecewise-constant batch-size schedule from ``[(steps, batch_size), ...]`` (last piece repeats)."""
    segments = []
    for steps, batch_size in pieces:
        if int(steps) != steps or steps < 1 or not batch_size > 0:
            raise BatchlabError(f"batch-size schedule pieces need steps >= 1 and batch size > 0, got ({steps}, {batch_size})")
        segments.append(Segment(int(steps), 1.0, float(batch_size)))
    if not segments:
        raise BatchlabError("batch-size schedule is empty")
    return segments


def _check_schedule(decay_steps, end_factor) -> None:
    if int(decay_steps) != decay_steps or decay_steps < 1:
        raise BatchlabError(f"decay steps must be a positive integer, got {decay_steps}")
    if not 0.0 <= end_factor <= 1.0:
        raise BatchlabError(f"end factor must be in [0, 1], got {end_factor}")


def _sampled_segments(factor, length: int, end_factor: float, max_segments: int) -> list[Segment]:
    length = int(length)
    if length <= max_segments:
        bounds = np.arange(length + 1)
    else:
        bounds = np.unique(np.round(np.linspace(0, length, max_segments + 1)).astype(np.int64))
    segments = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        point = lo if hi - lo == 1 else 0.5 * (lo + hi - 1)
        segments.append(Segment(int(hi - lo), float(max(factor(point), 1e-12))))
    segments.append(Segment(0, max(end_factor, 1e-12)))  # length 0 marks "forever" (the tail)
    return segments


def first_passage_scheduled(
    problem: Problem,
    algorithm: Algorithm,
    learning_rate,
    segments: list[Segment],
    target: float,
    max_steps: int,
    batch_size: float | None = None,
    momentum=None,
    ema_decay=None,
) -> np.ndarray:
    """Lifting candidates (first passage when the loss is monotone within each segment), shape ``(G,)``.

    Segments are run in order; a segment of length 0 (or the last one) lasts until ``max_steps``. Within a
    segment the candidate comes from binary lifting from the segment's start state; -1 = not reached.
    """
    lr = np.atleast_1d(np.asarray(learning_rate, dtype=float))
    target = check_target(target, problem.initial_loss())
    G = lr.size
    result = np.full(G, -1, dtype=np.int64)
    state = None
    t0 = 0
    for index, segment in enumerate(segments):
        b = segment.batch_size if segment.batch_size is not None else batch_size
        if b is None or not b > 0:
            raise BatchlabError("a batch size > 0 is needed for every schedule segment")
        last = index == len(segments) - 1 or segment.length == 0
        length = max_steps - t0 if last else min(segment.length, max_steps - t0)
        if length <= 0:
            break
        rec = moment_recurrence(problem, algorithm, lr * segment.lr_factor, momentum, ema_decay)
        if state is None:
            state = rec.initial_state(1)
        open_ = result < 0
        found = first_passage_candidates(rec, [b], target, length, initial=state)[:, 0]
        result = np.where(open_ & (found >= 0), t0 + found, result)
        if last:
            break
        state = apply(*map_power(rec, length), state, 1.0 / b)
        t0 += length
    return result


# --- the official optimised piecewise-constant schedule (plain SGD) --------------------------------------


def _pwc_loss_and_gradient(log_lr, k, h_step, h_noise, c_over_b, s0, weights):
    """Loss after K pieces of k SGD steps and its gradient w.r.t. ``log lr`` (adjoint, exact).

    Per direction: ``z = lr h^(1-p)``, ``beta = (1 - z)^2``, ``s* = lr h^(-1-p) c / (B (2 - z))`` (the exact
    SGD steady state), ``s <- beta^k (s - s*) + s*`` per piece. The forward pass is a loop over the K pieces
    (the state entering each piece is needed); everything else is one ``(K, J)`` array operation, with the
    adjoint ``weights * prod_{l > i} beta_l^k`` as a reversed cumulative product.
    """
    lr = np.exp(log_lr)
    K = lr.size
    z = lr[:, None] * h_step[None, :]
    one_minus_z = 1.0 - z
    beta = one_minus_z * one_minus_z
    two_minus_z = 2.0 - z
    steady = lr[:, None] * h_noise[None, :] * c_over_b / two_minus_z
    with np.errstate(under="ignore", invalid="ignore"):
        decay_before_last = beta ** max(k - 1, 0)  # beta^(k-1), reused by the gradient
        decay = decay_before_last * beta if k > 0 else np.ones_like(beta)
        inputs = np.empty((K, s0.size))
        s = s0
        for i, (d, st) in enumerate(zip(decay, steady)):
            inputs[i] = s
            s = d * (s - st) + st
        loss = float(weights @ s)
        # adjoint[i] = weights * prod_{l > i} decay[l]
        adjoint = np.ones((K, s0.size))
        if K > 1:
            adjoint[:-1] = np.cumprod(decay[:0:-1], axis=0)[::-1]
        adjoint *= weights
        ddecay = (k * decay_before_last) * (-2.0 * one_minus_z * h_step) if k > 0 else np.zeros_like(z)
        dsteady = 2.0 * h_noise * c_over_b / (two_minus_z * two_minus_z)
        ds_dlr = ddecay * (inputs - steady) + (1.0 - decay) * dsteady
    grad = np.einsum("ij,ij->i", adjoint, ds_dlr) * lr
    return loss, grad


@dataclass(frozen=True)
class PWCResult:
    """An optimised K-piece schedule: ``steps = pieces * piece_length`` updates (``None`` if not reached)."""

    batch_size: float
    pieces: int
    piece_length: int | None
    steps: int | None
    learning_rates: tuple[float, ...]
    final_loss: float

    @property
    def reached(self) -> bool:
        return self.steps is not None


def optimal_pwc_sgd(
    problem: Problem,
    precondition: float,
    batch_size: float,
    target: float,
    pieces: int,
    upper_k: int | None = None,
    max_piece_length: int = 10**8,
) -> PWCResult:
    """Smallest piece length ``k`` whose optimised K-piece schedule ends below ``target`` (docs/methods.md, "Learning-rate schedules").

    The search keeps ``loss(low) >= target`` and ``loss(high) < target``. ``upper_k`` (e.g. from the
    constant-LR result, which a PWC schedule can imitate) narrows the bracket when it is feasible; the
    lower end starts at the Bayes bound (no estimator from ``B K k`` samples can beat it).
    """
    Algorithm("sgd", precondition)
    target = check_target(target, problem.initial_loss())
    p = float(precondition)
    h, c = problem.curvature, problem.noise
    h_step, h_noise = h ** (1.0 - p), h ** (-1.0 - p)
    s0, weights = problem.initial_second_moment.astype(float), problem.loss_weights
    bound = np.log(2.0 / (1.0 + 10.0 ** (-4.0 * (1.0 - p)) + 1e-4))
    cache: dict[int, tuple[float, np.ndarray]] = {}
    start = np.full(pieces, -5.0)

    def optimised(k: int):
        if k not in cache:
            # warm start from the nearest piece length already optimised (the official code starts
            # every search from log lr = -5; the first optimisation here does too)
            near = min(cache, key=lambda q: abs(q - k)) if cache else None
            x0 = cache[near][1] if near is not None else start
            fun = lambda x: _pwc_loss_and_gradient(x, k, h_step, h_noise, c / batch_size, s0, weights)  # noqa: E731
            from scipy.optimize import minimize  # lazy: scipy.optimize costs ~0.5 s of start-up

            res = minimize(fun, np.minimum(x0, bound), jac=True, method="L-BFGS-B", bounds=[(None, bound)] * pieces)
            value, x = float(res.fun), res.x
            cache[k] = (value, x)
        return cache[k]

    low = max(int(bayes_lower_bound_steps(problem, target, batch_size) // pieces) - 1, 0)
    high = max_piece_length
    if upper_k is not None and upper_k > low and optimised(int(upper_k))[0] < target:
        high = int(upper_k)
    elif optimised(high)[0] >= target:
        value, x = optimised(high)
        return PWCResult(batch_size, pieces, None, None, tuple(np.exp(x)), value)
    # Bracketing search: alternate log-log interpolation of the optimised loss with bisection. The
    # invariant (loss(low) >= target > loss(high)) is the official one, so for a monotone optimised
    # loss the answer equals plain bisection's, in fewer optimisations.
    interpolate = False
    while high - low > 1:
        mid = (low + high) // 2
        if interpolate and low in cache and high in cache and low > 0:
            y0, y1 = np.log(cache[low][0]), np.log(cache[high][0])
            if y0 > y1:
                x0, x1 = np.log(low), np.log(high)
                guess = np.exp(x0 + (np.log(target) - y0) * (x1 - x0) / (y1 - y0))
                mid = int(min(max(round(float(guess)), low + 1), high - 1))
        interpolate = not interpolate
        if optimised(mid)[0] < target:
            high = mid
        else:
            low = mid
    value, x = optimised(high)
    return PWCResult(batch_size, pieces, high, pieces * high, tuple(float(v) for v in np.exp(x)), value)


def bayes_lower_bound_steps(problem: Problem, target: float, batch_size: float) -> float:
    """Rigorous lower bound on steps: ``N / B`` for the smallest sample count N whose Bayes risk is < target.

    With prior ``x ~ N(0, s0)`` and N per-example gradients ``h x + eps``, ``eps ~ N(0, c)``, the posterior
    variance is ``1 / (1/s0 + N h^2 / c)``; no estimator (so no training algorithm) does better on average.
    For large N this approaches ``D / (2 N)``, the paper's information-theoretic bound.
    """
    h, c, s0, w = problem.curvature, problem.noise, problem.initial_second_moment, problem.loss_weights

    def risk(n):
        with np.errstate(divide="ignore"):
            return float(w @ (1.0 / (1.0 / np.maximum(s0, 1e-300) + n * h**2 / np.maximum(c, 1e-300))))

    lo, hi = 0.0, 1.0
    while risk(hi) >= target:
        hi *= 2.0
        if hi > 1e30:
            return float("inf")
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if risk(mid) < target else (mid, hi)
    return lo / float(batch_size)


__all__ = [
    "SCHEDULES",
    "Segment",
    "PWCResult",
    "parse_schedule",
    "linear_decay_segments",
    "warmup_cosine_segments",
    "batch_size_segments",
    "first_passage_scheduled",
    "optimal_pwc_sgd",
    "bayes_lower_bound_steps",
    "scheduled_loss_at_step",
]


def scheduled_loss_at_step(
    problem: Problem,
    algorithm: Algorithm,
    learning_rate: float,
    segments: list[Segment],
    step: int,
    batch_size: float | None = None,
    momentum=None,
    ema_decay=None,
) -> float:
    """Exact expected loss after ``step`` updates of one configuration under a segment schedule."""
    state = None
    t0 = 0
    for index, segment in enumerate(segments):
        b = segment.batch_size if segment.batch_size is not None else batch_size
        last = index == len(segments) - 1 or segment.length == 0
        length = step - t0 if last else min(segment.length, step - t0)
        rec = moment_recurrence(problem, algorithm, learning_rate * segment.lr_factor, momentum, ema_decay)
        if state is None:
            state = rec.initial_state(1)
        if length > 0:
            state = apply(*map_power(rec, length), state, 1.0 / b)
            t0 += length
        if last or t0 >= step:
            return float(rec.loss(state)[0, 0])
    return float("nan")  # pragma: no cover - the last segment always returns
