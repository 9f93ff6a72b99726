"""Detecting a diverged trial from its training losses.

A trial is *diverged* (status ``INFEASIBLE``) as soon as

* a batch loss is NaN or infinite, or
* the running mean of the batch losses exceeds ``DIVERGENCE_FACTOR`` times the start loss.

The start loss is the first batch loss (measured before the first update, when a freshly
initialised classifier or language model sits near ``log(num_classes)`` on every example, so it is a
stable reference at any batch size), floored at ``MIN_REFERENCE_LOSS`` so that a near-zero start
cannot make ordinary noise look like divergence. The running mean is an exponential moving average
with decay ``SMOOTHING`` (about a 10-update window): one unlucky batch at batch size 1 cannot end a
trial, while a loss that really blows up crosses the threshold within a few updates (or turns NaN).
"""

from __future__ import annotations

import math

__all__ = ["DIVERGENCE_FACTOR", "MIN_REFERENCE_LOSS", "SMOOTHING", "DivergenceMonitor"]

DIVERGENCE_FACTOR = 10.0
"""A running loss this many times the start loss means the trial diverged."""

MIN_REFERENCE_LOSS = 1.0
"""Floor (in loss units, nats for cross-entropy) on the start loss used as the reference."""

SMOOTHING = 0.9
"""Decay of the exponential moving average of batch losses."""


class DivergenceMonitor:
    """Feed it every batch loss; :meth:`diverged` says whether the trial must stop as INFEASIBLE."""

    __slots__ = ("factor", "start_loss", "running_loss", "threshold")

    def __init__(self, factor: float = DIVERGENCE_FACTOR) -> None:
        self.factor = float(factor)
        self.start_loss: float | None = None
        self.running_loss: float | None = None
        self.threshold = math.inf

    def diverged(self, loss: float) -> bool:
        """Record one batch loss; return True if the trial has diverged."""
        if not math.isfinite(loss):
            return True
        if self.start_loss is None:
            self.start_loss = self.running_loss = loss
            self.threshold = self.factor * max(loss, MIN_REFERENCE_LOSS)
            return False
        self.running_loss = SMOOTHING * self.running_loss + (1.0 - SMOOTHING) * loss
        return self.running_loss > self.threshold
