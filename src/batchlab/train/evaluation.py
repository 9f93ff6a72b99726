"""When a trial evaluates, and what one evaluation measures.

A *measurement* is one evaluation at one step: ``{"step": t, "<split>/<metric>": value, ...}`` with
the release's metric names (``train/cross_entropy_error``, ``val/classification_error``, ...), taken
after ``t`` updates, by ``workload.evaluate`` on each split (the workload caps the training split to
a fixed subset).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence

import torch

from batchlab.errors import BatchlabError

__all__ = ["evaluation_schedule", "every_n_steps", "measure", "goal_reached"]


def every_n_steps(total_steps: int, every: int) -> list[int]:
    """A regular schedule: steps ``every, 2*every, ...`` plus ``total_steps`` itself."""
    if every < 1:
        raise BatchlabError(f"evaluation interval must be >= 1 step, got {every}")
    steps = list(range(every, total_steps + 1, every))
    if not steps or steps[-1] != total_steps:
        steps.append(total_steps)
    return steps


def evaluation_schedule(default: Iterable[int], total_steps: int, override: Sequence[int] | None = None) -> list[int]:
    """The sorted, distinct steps at which a trial of ``total_steps`` updates evaluates.

    ``default`` is the workload's schedule (``workload.evaluation_steps(total_steps)``: dense early,
    regular later); ``override`` replaces it. Either way ``total_steps`` is included, so every trial
    that runs its full budget ends with a measurement. Step 0 (before any update) is allowed.

    Raises:
        BatchlabError: a step outside ``0..total_steps`` or not an integer.
    """
    chosen = list(default if override is None else override)
    steps = set()
    for step in chosen:
        try:
            step = operator.index(step)
        except TypeError:
            raise BatchlabError(f"evaluation steps must be integers, got {step!r}") from None
        if not 0 <= step <= total_steps:
            raise BatchlabError(f"evaluation step {step} is out of range; allowed: 0 to {total_steps} (the step budget)")
        steps.add(step)
    steps.add(total_steps)
    return sorted(steps)


def measure(workload, model: torch.nn.Module, splits: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """Evaluate ``model`` on each split, returning ``{"<split>/<metric>": value}`` as Python floats.

    ``splits`` maps a split name (``"train"``, ``"val"``) to its ``(x, y)``. The model is put in eval
    mode under ``torch.no_grad`` and returned to its previous mode afterwards.
    """
    was_training = model.training
    model.eval()
    metrics: dict[str, float] = {}
    try:
        with torch.no_grad():
            for split, (x, y) in splits.items():
                for name, value in workload.evaluate(model, x, y, split=split).items():
                    metrics[name] = float(value)
    finally:
        model.train(was_training)
    return metrics


def goal_reached(value: float, goal: float, maximize: bool) -> bool:
    """Whether a metric value strictly beats the goal (``value < goal``, or ``>`` when maximizing)."""
    if not math.isfinite(value):
        return False
    return value > goal if maximize else value < goal
