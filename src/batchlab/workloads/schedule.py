"""When a trial evaluates: dense early, regular later.

Steps count optimizer updates; a measurement at step ``t`` is taken after ``t`` updates. The schedule
for a budget of ``total_steps`` is the union of

- an **early, geometric** part: 1, then each next step ``max(s + 1, ceil(s * early_ratio))`` while it is
  below the regular interval (so the first updates, where the metrics change fastest, are resolved);
- a **regular** part: every ``interval = ceil(total_steps / num_regular)`` steps, and ``total_steps``.

With the defaults (``num_regular=25``, ``early_ratio=1.5``) a 2,000-step trial evaluates at
1, 2, 3, 5, 8, 12, 18, 27, 41, 62, 80, 160, ..., 2000 (35 evaluations), so steps to a goal reached
late are resolved to 1/25 of the budget and early ones to 50%. Few evaluations keep their cost small
beside training; ask for more (``num_regular``) when steps to result must be resolved finely.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from batchlab.errors import BatchlabError


@dataclass(frozen=True)
class EvaluationSchedule:
    """Parameters of :func:`evaluation_steps` (see the module docstring)."""

    num_regular: int = 25
    early_ratio: float = 1.5

    def __post_init__(self) -> None:
        if not isinstance(self.num_regular, int) or self.num_regular < 1:
            raise BatchlabError(f"num_regular must be an integer >= 1, got {self.num_regular!r}")
        if not self.early_ratio > 1.0:
            raise BatchlabError(f"early_ratio must be > 1, got {self.early_ratio!r}")

    def steps(self, total_steps: int) -> list[int]:
        """Return the sorted, distinct evaluation steps in ``[1, total_steps]``, ending at ``total_steps``."""
        return evaluation_steps(total_steps, num_regular=self.num_regular, early_ratio=self.early_ratio)


def evaluation_steps(total_steps: int, num_regular: int = 25, early_ratio: float = 1.5) -> list[int]:
    """Return the evaluation steps for a budget of ``total_steps`` updates (see the module docstring)."""
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise BatchlabError(f"total_steps must be an integer >= 1, got {total_steps!r}")
    EvaluationSchedule(num_regular, early_ratio)  # validates the parameters
    interval = max(1, math.ceil(total_steps / num_regular))
    steps = set(range(interval, total_steps + 1, interval))
    steps.add(total_steps)
    step = 1
    while step < min(interval, total_steps):
        steps.add(step)
        step = max(step + 1, math.ceil(step * early_ratio))
    return sorted(steps)
