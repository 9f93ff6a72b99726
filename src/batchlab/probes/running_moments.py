"""Running weighted moments of per-step noise-scale estimates: what :class:`~batchlab.probes.tracker.NoiseScaleTracker` keeps between steps.

Two small immutable records, each folding in a chunk of m measured steps (oldest first) at once and
returning the new record, so the tracker can fold steps as they come, in chunks, or fold a copy
to read without committing:

* :class:`TensorSums`: per parameter tensor, the running |G|^2 and tr(Sigma) (an exponential
  moving average with decay ``beta``, not bias-corrected, with its weight 1 - beta^n; or, with
  ``beta=None``, the plain mean over the n steps that measured the tensor);
* :class:`RatioMoments`: the weighted moments of the per-step totals (x_t, y_t) = (tr Sigma_t,
  |G|^2_t), weights beta^(steps - t) (``beta=None``: 1): sum of weights, sum of squared weights,
  weighted means and the weighted sums of squared deviations, from which Fieller's interval for
  the ratio of the weighted means is read (:meth:`RatioMoments.interval`; docs/methods.md,
  "NoiseScaleTracker").

A chunk of m steps is folded in closed form (its EMA weights beta^(m - 1 - j), the merge of two
sets of weighted moments of Chan, Golub and LeVeque), which equals folding its steps one by one up
to floating-point rounding; folding the same steps in the same chunks gives the same bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from batchlab.probes.noise_scale import Interval, fieller_weighted


def step_weights(m: int, beta: float | None) -> np.ndarray:
    """The relative weights of m steps folded together, oldest first: beta^(m - 1 - j) (``beta=None``: 1)."""
    if beta is None:
        return np.ones(m)
    return beta ** np.arange(m - 1, -1, -1, dtype=float)


@dataclass(frozen=True)
class TensorSums:
    """Per parameter tensor: ``weight`` (EMA: 1 - beta^n, plain mean: n, for the n steps that measured
    it), the running ``grad_norm_sq`` and ``trace_sigma`` (EMA not bias-corrected). Arrays of one
    entry per tensor, never modified in place."""

    weight: np.ndarray
    grad_norm_sq: np.ndarray
    trace_sigma: np.ndarray

    @classmethod
    def empty(cls, n: int) -> TensorSums:
        return cls(np.zeros(n), np.zeros(n), np.zeros(n))

    def folded(self, g2: np.ndarray, s: np.ndarray, beta: float | None) -> TensorSums:
        """These sums with m steps that measured every tensor folded in: ``g2``, ``s`` of shape (m, n)."""
        m = len(g2)
        if beta is None:
            weight = self.weight + m
            return TensorSums(weight, self.grad_norm_sq + (g2.sum(0) - m * self.grad_norm_sq) / weight,
                              self.trace_sigma + (s.sum(0) - m * self.trace_sigma) / weight)
        decay, w = beta ** m, step_weights(m, beta) * (1.0 - beta)
        return TensorSums(1.0 - (1.0 - self.weight) * decay, decay * self.grad_norm_sq + w @ g2,
                          decay * self.trace_sigma + w @ s)

    def folded_some(self, index: np.ndarray, g2: np.ndarray, s: np.ndarray, beta: float | None) -> TensorSums:
        """These sums with one step that measured only the tensors ``index`` folded in (the others keep
        their values and weights, so each tensor averages the steps it had a gradient in)."""
        weight, grad_norm_sq, trace_sigma = self.weight.copy(), self.grad_norm_sq.copy(), self.trace_sigma.copy()
        if beta is None:
            weight[index] += 1.0
            grad_norm_sq[index] += (g2 - grad_norm_sq[index]) / weight[index]
            trace_sigma[index] += (s - trace_sigma[index]) / weight[index]
        else:
            weight[index] = 1.0 - (1.0 - weight[index]) * beta
            grad_norm_sq[index] = beta * grad_norm_sq[index] + (1.0 - beta) * g2
            trace_sigma[index] = beta * trace_sigma[index] + (1.0 - beta) * s
        return TensorSums(weight, grad_norm_sq, trace_sigma)

    def corrected(self, beta: float | None) -> tuple[np.ndarray, np.ndarray]:
        """Per tensor, the running (trace_sigma, grad_norm_sq): bias-corrected by each tensor's own
        weight; a tensor never measured is 0 (left out of the sums)."""
        measured = self.weight > 0
        s, g2 = np.zeros(len(self.weight)), np.zeros(len(self.weight))
        if beta is None:
            s[measured], g2[measured] = self.trace_sigma[measured], self.grad_norm_sq[measured]
        else:
            s[measured] = self.trace_sigma[measured] / self.weight[measured]
            g2[measured] = self.grad_norm_sq[measured] / self.weight[measured]
        return s, g2


@dataclass(frozen=True)
class RatioMoments:
    """Weighted moments of replicates (x_t, y_t): ``weight`` = sum w, ``weight_sq`` = sum w^2,
    ``mean`` = the weighted means, ``m2`` = sum w (v - mean)(v - mean)^T (2 x 2, row-major)."""

    weight: float = 0.0
    weight_sq: float = 0.0
    mean: tuple[float, float] = (0.0, 0.0)
    m2: tuple[float, float, float] = (0.0, 0.0, 0.0)  # (xx, xy, yy)

    def folded(self, x: np.ndarray, y: np.ndarray, beta: float | None) -> RatioMoments:
        """These moments with m new replicates (oldest first) appended: the earlier weights times
        beta^m, the new ones beta^(m - 1 - j)."""
        m = len(x)
        w = step_weights(m, beta)
        wc = float(w.sum())
        mx, my = float(w @ x) / wc, float(w @ y) / wc
        dx, dy = x - mx, y - my
        chunk_m2 = (float(w @ (dx * dx)), float(w @ (dx * dy)), float(w @ (dy * dy)))
        decay = 1.0 if beta is None else beta ** m
        old_w = self.weight * decay
        total = old_w + wc
        if old_w == 0.0:
            return RatioMoments(wc, float(w @ w), (mx, my), chunk_m2)
        ex, ey = mx - self.mean[0], my - self.mean[1]
        f = old_w * wc / total
        m2 = (self.m2[0] * decay + chunk_m2[0] + ex * ex * f, self.m2[1] * decay + chunk_m2[1] + ex * ey * f,
              self.m2[2] * decay + chunk_m2[2] + ey * ey * f)
        return RatioMoments(total, self.weight_sq * decay * decay + float(w @ w),
                            (self.mean[0] + ex * wc / total, self.mean[1] + ey * wc / total), m2)

    @property
    def effective_steps(self) -> float:
        """n_eff = (sum w)^2 / sum w^2 (plain mean: the number of replicates)."""
        return self.weight * self.weight / self.weight_sq if self.weight_sq > 0 else 0.0

    def interval(self, numerator: float, denominator: float, level: float, method: str) -> Interval:
        """Fieller's interval for ``numerator / denominator`` (the running weighted means) at the
        two-sided ``level``, with Var(weighted mean) = s^2 sum w^2 / (sum w)^2, s^2 = m2 / (sum w -
        sum w^2 / sum w) and n_eff - 1 degrees of freedom; both ends ``None`` below two effective
        replicates."""
        n_eff = self.effective_steps
        if n_eff - 1.0 <= 1e-9 or not math.isfinite(numerator) or not math.isfinite(denominator):
            return Interval(None, None, level, method)
        w, w2 = self.weight, self.weight_sq
        scale = (w2 / (w * w)) / (w - w2 / w)
        return fieller_weighted(numerator, denominator, self.m2[0] * scale, self.m2[2] * scale, self.m2[1] * scale,
                                n_eff - 1.0, level, method)

    def to_state(self) -> dict:
        """JSON-able form (the tracker's state ``interval`` entry)."""
        return {"weight": self.weight, "weight_sq": self.weight_sq, "mean": list(self.mean),
                "m2": [[self.m2[0], self.m2[1]], [self.m2[1], self.m2[2]]]}

    @classmethod
    def from_state(cls, state: dict) -> RatioMoments:
        mean, m2 = [float(v) for v in state["mean"]], [[float(v) for v in row] for row in state["m2"]]
        if len(mean) != 2 or len(m2) != 2 or any(len(row) != 2 for row in m2):
            raise ValueError("interval mean must have 2 entries and m2 be 2 x 2")
        return cls(float(state["weight"]), float(state["weight_sq"]), (mean[0], mean[1]), (m2[0][0], m2[0][1], m2[1][1]))


__all__ = ["RatioMoments", "TensorSums", "step_weights"]
