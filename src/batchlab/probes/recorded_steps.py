"""Measured steps a :class:`~batchlab.probes.tracker.NoiseScaleTracker` has recorded and not folded yet, and their fold.

A usual step (every parameter tensor reached by every backward pass, in the same hook order, no
collective) is recorded as its raw gradient norms: the k passes' norms of each tensor, then the
``.grad`` norms, as Python floats (CPU) or one stacked tensor (an accelerator: no device-to-host
copy per step). :func:`folded` turns a chunk of such steps into the running state at once,
vectorized over the steps: the per-step |G|^2 and tr(Sigma) of each tensor
(:func:`batchlab.probes.noise_scale.moments_from_norms`'s arithmetic), then the chunk folds of
:mod:`batchlab.probes.running_moments`. It never modifies its inputs, so the tracker can fold a copy
for a reading and commit only at fixed points.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from batchlab.probes.running_moments import RatioMoments, TensorSums


class RunningState(NamedTuple):
    """The tracker's running state as of its last measured step: the per-tensor sums, the interval's
    moments, the measured ``steps``, the ``nonfinite_steps`` left out, the ``last`` step's values and
    the bias-corrected ``totals`` (trace_sigma, grad_norm_sq) over the tensors."""

    sums: TensorSums | None
    moments: RatioMoments
    steps: int
    nonfinite_steps: int
    last: dict | None
    totals: tuple[float, float]


class RecordedSteps(NamedTuple):
    """Steps of one shape: ``micro_batches`` (k) backward passes, each delivering every tensor once in
    the hook order ``order``; per step, ``rows`` holds the passes' norms then the ``.grad`` norms
    (parameter order), ``sizes`` (B, b, grad_scale^2)."""

    micro_batches: int
    order: list[int]
    rows: list
    sizes: list[tuple[float, float, float]]

    def to_state(self) -> dict:
        """JSON-able form (a tracker state's ``recorded`` entry); a non-finite norm (a step not
        folded yet, on an accelerator) as None, so that the state is strict JSON."""
        return {"micro_batches": self.micro_batches, "order": list(self.order),
                "norms": [[v if math.isfinite(v) else None for v in row] for row in host_matrix(self.rows).tolist()],
                "sizes": [list(s) for s in self.sizes]}

    @classmethod
    def from_state(cls, state: dict) -> RecordedSteps:
        """:meth:`to_state`'s output back, as host rows (None: NaN)."""
        return cls(int(state["micro_batches"]), [int(i) for i in state["order"]],
                   [[math.nan if v is None else float(v) for v in row] for row in state["norms"]],
                   [(float(a), float(b), float(c)) for a, b, c in state["sizes"]])

    def nonfinite_rows(self) -> int:
        """How many recorded steps have a non-finite norm (left out when folded)."""
        return int((~np.isfinite(host_matrix(self.rows)).all(1)).sum()) if self.rows else 0


def running_state(sums: TensorSums | None, moments: RatioMoments, steps: int, nonfinite_steps: int,
                  last: dict | None, beta: float | None) -> RunningState:
    """A :class:`RunningState` with its totals: each tensor bias-corrected by its own weight, summed."""
    if sums is None:
        return RunningState(sums, moments, steps, nonfinite_steps, last, (math.nan, math.nan))
    s, g2 = sums.corrected(beta)
    return RunningState(sums, moments, steps, nonfinite_steps, last, (float(s.sum()), float(g2.sum())))


def host_row(values: list[torch.Tensor]) -> list[float]:
    """Host (CPU) 0-d tensors as Python floats: ``item()`` is the cheapest way off a CPU tensor."""
    return [v.item() for v in values]


def device_row(values: list[torch.Tensor]):
    """One tensor of many 0-d accelerator tensors (one kernel, no device-to-host copy); Python floats
    (one copy each) when they are on different devices."""
    try:
        return torch.stack(values)
    except RuntimeError:
        return [float(v) for v in values]


def host_matrix(rows: list) -> np.ndarray:
    """Recorded steps' norms as a float64 (steps, width) array: one device-to-host copy for the tensor rows."""
    on_device = [i for i, r in enumerate(rows) if isinstance(r, torch.Tensor)]
    if not on_device:
        return np.array(rows, dtype=float)
    out = np.empty((len(rows), len(rows[on_device[0]])))
    host = [i for i in range(len(rows)) if not isinstance(rows[i], torch.Tensor)]
    if host:
        out[host] = np.array([rows[i] for i in host], dtype=float)
    try:
        out[on_device] = torch.stack([rows[i] for i in on_device]).double().cpu().numpy()
    except RuntimeError:  # rows on different devices
        out[on_device] = np.array([rows[i].double().cpu().numpy() for i in on_device])
    return out


def folded(state: RunningState, recorded: RecordedSteps, natural: list[int], beta: float | None) -> RunningState:
    """``state`` with the ``recorded`` steps folded in (``natural``: the parameter order, ``list(range(n))``).

    Per step and tensor, small = the mean over the k passes of the squared norms / grad_scale^2, big
    = the squared ``.grad`` norm / (k^2 grad_scale^2), then |G|^2 = (B big - b small) / (B - b) and
    tr(Sigma) = (small - big) / (1/b - 1/B). A step with a non-finite value is left out and counted.
    """
    k, n = recorded.micro_batches, len(natural)
    values = host_matrix(recorded.rows)
    values *= values
    m = len(values)
    small = values[:, : k * n].reshape(m, k, n).sum(1) / k
    if recorded.order != natural:  # each pass's hook order, back to parameter order
        unordered, small = small, np.empty_like(small)
        small[:, recorded.order] = unordered
    sizes = np.array(recorded.sizes)
    big_b, b, scale2 = sizes[:, :1], sizes[:, 1:2], sizes[:, 2:]
    small, big = small / scale2, values[:, k * n:] / (k * k * scale2)
    g2 = (big_b * big - b * small) / (big_b - b)
    s = (small - big) / (1.0 / b - 1.0 / big_b)
    finite = np.isfinite(g2).all(1) & np.isfinite(s).all(1)
    nonfinite = state.nonfinite_steps + int(m - finite.sum())
    if not finite.all():
        g2, s, sizes = g2[finite], s[finite], sizes[finite]
    if len(g2) == 0:
        return state._replace(nonfinite_steps=nonfinite)
    sums = state.sums.folded(g2, s, beta)
    x, y = s.sum(1), g2.sum(1)
    steps = state.steps + len(x)
    last = {"step": steps, "small_batch_size": float(sizes[-1, 1]), "batch_size": int(sizes[-1, 0]),
            "grad_norm_sq": float(y[-1]), "trace_sigma": float(x[-1])}
    return running_state(sums, state.moments.folded(x, y, beta), steps, nonfinite, last, beta)


__all__ = ["RecordedSteps", "RunningState", "device_row", "folded", "host_matrix", "host_row", "running_state"]
