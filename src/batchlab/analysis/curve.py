"""The steps-to-result curve: one object whether the NQM computed it or a sweep measured it.

Conventions (docs/methods.md, "Steps to result and brackets")
--------------------------------------------------------------
* ``steps`` counts optimizer updates: the first update count ``t`` after which the goal is met
  (the NQM's first passage; a measured run's first qualifying evaluation step).
* Each reached value is a *bracket* ``(steps_lower, steps]``: the true first passage lies after the
  evaluation before the reaching one (``steps_lower``) and at or before the reaching one. When the
  whole ``steps_lower`` field is ``None`` the steps are exact first passages (the NQM), i.e. the
  bracket is ``(steps - 1, steps]``.
* A batch size whose goal was not reached within its budget has ``steps = None``. It stays in the
  curve (plots and tables show it). When ``censored_at`` is known there, it is a *censored*
  observation ``S > censored_at`` and enters fits as such; otherwise it is left out of fits.
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
        steps_lower: ``None`` (exact first passages: bracket ``(steps - 1, steps]``), or one entry per
            batch size: the evaluation step before the reaching one (``0 <= steps_lower < steps``),
            ``None`` where not reached (or where the bracket is unknown: then ``steps - 1`` is used).
        censored_at: ``None`` or one entry per batch size: where the goal was not reached, the step
            the trials were followed to (``S > censored_at``); ``None`` where reached or unknown.
    """

    batch_sizes: tuple[int, ...]
    steps: tuple[int | None, ...]
    label: str = ""
    metadata: dict = field(default_factory=dict)
    steps_lower: tuple[int | None, ...] | None = None
    censored_at: tuple[int | None, ...] | None = None

    def __post_init__(self) -> None:
        name = f"steps curve {self.label!r}"
        if len(self.batch_sizes) != len(self.steps):
            raise BatchlabError(f"{name}: {len(self.batch_sizes)} batch sizes but {len(self.steps)} step counts")
        if any(int(b) <= 0 for b in self.batch_sizes):
            raise BatchlabError(f"{name}: batch sizes must be positive, got {list(self.batch_sizes)}")
        if any(b2 <= b1 for b1, b2 in zip(self.batch_sizes, self.batch_sizes[1:])):
            raise BatchlabError(f"{name}: batch sizes must be strictly increasing, got {list(self.batch_sizes)}")
        if any(s is not None and s < 0 for s in self.steps):
            raise BatchlabError(f"{name}: step counts must be >= 0, got {list(self.steps)}")
        for field_name in ("steps_lower", "censored_at"):
            values = getattr(self, field_name)
            if values is None:
                continue
            values = tuple(None if v is None else int(v) for v in values)
            object.__setattr__(self, field_name, values)
            if len(values) != len(self.batch_sizes):
                raise BatchlabError(
                    f"{name}: {field_name} has {len(values)} entries for {len(self.batch_sizes)} batch sizes"
                )
        if self.steps_lower is not None:
            for b, s, low in zip(self.batch_sizes, self.steps, self.steps_lower):
                if low is None:
                    continue
                if s is None:
                    raise BatchlabError(f"{name}: steps_lower at batch size {b} must be None where the goal was not reached")
                if s == 0:
                    raise BatchlabError(
                        f"{name}: the goal was already met at step 0 (before any update) at batch size {b}: "
                        "steps to result 0 cannot be fitted or scaled; choose a stricter goal"
                    )
                if not 0 <= low < s:
                    raise BatchlabError(
                        f"{name}: steps_lower at batch size {b} must satisfy 0 <= steps_lower < steps, got {low} and {s}"
                    )
        if self.censored_at is not None:
            for b, s, c in zip(self.batch_sizes, self.steps, self.censored_at):
                if c is None:
                    continue
                if s is not None:
                    raise BatchlabError(f"{name}: censored_at at batch size {b} must be None where the goal was reached")
                if c < 0:
                    raise BatchlabError(f"{name}: censored_at at batch size {b} must be >= 0, got {c}")

    @classmethod
    def from_points(
        cls,
        points: Iterable[tuple[int, int | None]],
        label: str = "",
        metadata: dict | None = None,
        steps_lower: Sequence[int | None] | None = None,
        censored_at: Sequence[int | None] | None = None,
    ) -> "StepsCurve":
        """Build a curve from ``(batch_size, steps_or_None)`` pairs in any order.

        ``steps_lower`` and ``censored_at``, when given, are aligned with ``points`` (same order) and
        are sorted with them. Batch sizes must be whole numbers (``4`` or ``4.0``); a fractional one
        raises :class:`BatchlabError` rather than being truncated.
        """
        points = list(points)
        fractional = [b for b, _ in points if not float(b).is_integer()]
        if fractional:
            raise BatchlabError(f"steps curve {label!r}: batch sizes must be whole numbers, got {fractional}")
        extras = {}
        for name, values in (("steps_lower", steps_lower), ("censored_at", censored_at)):
            if values is not None:
                values = list(values)
                if len(values) != len(points):
                    raise BatchlabError(f"steps curve {label!r}: {name} has {len(values)} entries for {len(points)} points")
                extras[name] = values
        order = sorted(range(len(points)), key=lambda i: int(points[i][0]))
        ordered = [(int(points[i][0]), None if points[i][1] is None else int(points[i][1])) for i in order]
        return cls(
            batch_sizes=tuple(b for b, _ in ordered),
            steps=tuple(s for _, s in ordered),
            label=label,
            metadata=dict(metadata or {}),
            **{name: tuple(values[i] for i in order) for name, values in extras.items()},
        )

    @property
    def reached(self) -> tuple[bool, ...]:
        """Whether the goal was reached at each batch size."""
        return tuple(s is not None for s in self.steps)

    @property
    def exact(self) -> bool:
        """True when the steps are exact first passages (no ``steps_lower`` given)."""
        return self.steps_lower is None

    def brackets(self) -> list[tuple[int, int] | None]:
        """``(steps_lower, steps)`` per batch size (``None`` where not reached); ``steps - 1`` when unknown."""
        out = []
        for i, s in enumerate(self.steps):
            if s is None:
                out.append(None)
                continue
            low = None if self.steps_lower is None else self.steps_lower[i]
            out.append((max(s - 1, 0) if low is None else low, s))
        return out

    def censoring(self) -> list[int | None]:
        """``censored_at`` per batch size (``None`` where reached or unknown)."""
        return [None] * len(self.steps) if self.censored_at is None else list(self.censored_at)

    def reached_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(batch_sizes, steps)`` as float arrays restricted to the reached points."""
        pairs = [(b, s) for b, s in zip(self.batch_sizes, self.steps) if s is not None]
        if not pairs:
            return np.empty(0), np.empty(0)
        b, s = zip(*pairs)
        return np.asarray(b, dtype=float), np.asarray(s, dtype=float)

    def to_dict(self) -> dict:
        """JSON-ready points: ``batch_size``, ``steps``, ``steps_lower``, ``censored_at`` per batch size."""
        brackets = self.brackets()
        censoring = self.censoring()
        return {
            "label": self.label,
            "exact_first_passage": self.exact,
            "points": [
                {"batch_size": int(b), "steps": s, "steps_lower": None if br is None else br[0], "censored_at": c}
                for b, s, br, c in zip(self.batch_sizes, self.steps, brackets, censoring)
            ],
        }


def curve_from_arrays(
    batch_sizes: Sequence[float],
    steps: Sequence[float | None],
    label: str = "",
    metadata: dict | None = None,
    steps_lower: Sequence[float | None] | None = None,
    censored_at: Sequence[float | None] | None = None,
) -> StepsCurve:
    """Build a :class:`StepsCurve` from arrays; NaN, inf or None steps mean "not reached".

    ``steps_lower`` and ``censored_at`` (optional, aligned with ``batch_sizes``) follow the same rule:
    NaN, inf or None is "none".
    """

    def clean(values):
        if values is None:
            return None
        out = []
        for v in values:
            missing = v is None or not np.isfinite(float(v))
            out.append(None if missing else int(round(float(v))))
        return out

    cleaned = clean(steps)
    points = [(int(b), s) for b, s in zip(batch_sizes, cleaned)]
    return StepsCurve.from_points(
        points, label=label, metadata=metadata, steps_lower=clean(steps_lower), censored_at=clean(censored_at)
    )


def bracket_text(steps: int | None, steps_lower: int | None, censored_at: int | None,
                 unreached: str = "not reached") -> str:
    """How tables print one batch size's steps to result (docs/methods.md, "Resolution brackets"):
    ``(steps_lower, steps]`` when reached, ``steps`` alone when exact (``steps_lower`` None), ``0 (met
    before any update)`` when the goal was met at step 0, ``> censored_at`` when censored, else
    ``unreached``."""
    if steps is not None:
        if steps == 0:
            return "0 (met before any update)"
        return str(steps) if steps_lower is None else f"({steps_lower}, {steps}]"
    if censored_at is not None:
        return f"> {censored_at}"
    return unreached
