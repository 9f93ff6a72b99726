"""The steps-to-result curve: one object whether the NQM computed it or a sweep measured it.

Conventions
-----------
* ``steps`` counts optimizer updates: the first update count ``t`` after which the goal is met
  (the NQM's first passage; a measured run's first qualifying evaluation step).
* A batch size whose goal was not reached within its budget has ``steps = None`` and is *censored*:
  it is kept in the curve (so plots and tables can show it) but left out of fits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from batchlab.errors import BatchlabError


@dataclass(frozen=True)
class StepsCurve:
    """Steps to result as a function of batch size.

    Attributes:
        batch_sizes: strictly increasing positive batch sizes (examples per step).
        steps: updates needed at each batch size, ``None`` where the goal was not reached.
        label: a name for legends and tables (e.g. ``"sgd p=0"`` or a workload name).
        metadata: free-form JSON-serialisable details (goal, metric, optimizer, ...).
    """

    batch_sizes: tuple[int, ...]
    steps: tuple[int | None, ...]
    label: str = ""
    metadata: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.batch_sizes) != len(self.steps):
            raise BatchlabError(
                f"steps curve {self.label!r}: {len(self.batch_sizes)} batch sizes but {len(self.steps)} step counts"
            )
        if any(int(b) <= 0 for b in self.batch_sizes):
            raise BatchlabError(f"steps curve {self.label!r}: batch sizes must be positive, got {list(self.batch_sizes)}")
        if any(b2 <= b1 for b1, b2 in zip(self.batch_sizes, self.batch_sizes[1:])):
            raise BatchlabError(f"steps curve {self.label!r}: batch sizes must be strictly increasing, got {list(self.batch_sizes)}")
        if any(s is not None and s < 0 for s in self.steps):
            raise BatchlabError(f"steps curve {self.label!r}: step counts must be >= 0, got {list(self.steps)}")

    @classmethod
    def from_points(
        cls, points: Iterable[tuple[int, int | None]], label: str = "", metadata: dict | None = None
    ) -> "StepsCurve":
        """Build a curve from ``(batch_size, steps_or_None)`` pairs in any order.

        Batch sizes must be whole numbers (``4`` or ``4.0``); a fractional one raises
        :class:`BatchlabError` rather than being truncated.
        """
        points = list(points)
        fractional = [b for b, _ in points if not float(b).is_integer()]
        if fractional:
            raise BatchlabError(f"steps curve {label!r}: batch sizes must be whole numbers, got {fractional}")
        ordered = sorted((int(b), None if s is None else int(s)) for b, s in points)
        return cls(
            batch_sizes=tuple(b for b, _ in ordered),
            steps=tuple(s for _, s in ordered),
            label=label,
            metadata=dict(metadata or {}),
        )

    @property
    def reached(self) -> tuple[bool, ...]:
        """Whether the goal was reached at each batch size."""
        return tuple(s is not None for s in self.steps)

    def reached_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(batch_sizes, steps)`` as float arrays restricted to the reached points."""
        pairs = [(b, s) for b, s in zip(self.batch_sizes, self.steps) if s is not None]
        if not pairs:
            return np.empty(0), np.empty(0)
        b, s = zip(*pairs)
        return np.asarray(b, dtype=float), np.asarray(s, dtype=float)


def curve_from_arrays(
    batch_sizes: Sequence[float], steps: Sequence[float | None], label: str = "", metadata: dict | None = None
) -> StepsCurve:
    """Build a :class:`StepsCurve` from arrays; NaN, inf or None steps mean "not reached"."""
    points = []
    for b, s in zip(batch_sizes, steps):
        missing = s is None or not np.isfinite(float(s))
        points.append((int(b), None if missing else int(round(float(s)))))
    return StepsCurve.from_points(points, label=label, metadata=metadata)
