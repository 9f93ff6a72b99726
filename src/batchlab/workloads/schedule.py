"""When a trial evaluates: the goal metric at a bounded relative resolution, every metric more sparsely.

Steps count optimizer updates; a measurement at step ``t`` is taken after ``t`` updates. Steps to a
result are read at evaluation steps only, so a measured value is an interval: (the evaluation
before the reaching one, the reaching one]. A schedule spaced as a fraction of the budget makes that
interval depend on the budget (a regular interval of ``budget / 25`` turns a true 121 into 240 at a
3,000-step budget); a schedule whose consecutive steps stay within a fixed ratio bounds the
*relative* width whatever the budget. The default schedule has two parts (docs/methods.md,
"Evaluation schedule and resolution"):

- **resolution steps** (:func:`resolution_steps`): every step while ``1/r`` is larger than the step,
  then geometric, each next step ``max(s + 1, floor(s * (1 + r)))``, and the budget. Consecutive
  steps ``a < b`` therefore satisfy ``b <= max(a + 1, (1 + r) a)``: a first passage read at ``b`` lies
  in ``(a, b]``, a relative width of at most ``r`` (5% by default) or a single step. At these steps a
  trial measures its goal metric's split (``val/*``) only.
- **full steps** (:func:`evaluation_steps`, the earlier schedule): 1, then geometric with
  ``early_ratio`` up to a regular interval of ``ceil(total_steps / num_regular)``, and the budget. At
  these steps a trial measures every metric (``train/*`` and ``val/*``).

The number of resolution steps grows with the logarithm of the budget: about
``2 / r + ln(T r / 2) / ln(1 + r)`` (every step up to ``2 / r``, where ``floor(s (1 + r))`` first
exceeds ``s + 1``, then geometric): 134 at T = 3,000 and r = 5%, against 36 full evaluations. A trial
measures them all (``refine="dense"``) or, by default, only those in the bracket where its goal is
first met, by replaying that stretch of training (:mod:`batchlab.train.trial`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from batchlab.errors import BatchlabError

DEFAULT_RESOLUTION = 0.05


def check_resolution(resolution: float) -> float:
    """``resolution`` as a float if it is a number in (0, 1); BatchlabError otherwise."""
    if isinstance(resolution, bool) or not isinstance(resolution, (int, float)) or not 0.0 < resolution < 1.0:
        raise BatchlabError(f"resolution must be a number in (0, 1) (relative spacing of evaluations, e.g. 0.05), got {resolution!r}")
    return float(resolution)


def _check_total(total_steps) -> int:
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise BatchlabError(f"total_steps must be an integer >= 1, got {total_steps!r}")
    return total_steps


def resolution_steps(total_steps: int, resolution: float = DEFAULT_RESOLUTION) -> list[int]:
    """Evaluation steps in ``[1, total_steps]`` whose consecutive members are within a factor ``1 + resolution``.

    Every step ``1, 2, ...`` while ``1 / resolution`` is larger than the step, then each next step
    ``max(s + 1, floor(s * (1 + resolution)))`` (still every step while that floor is ``s + 1``: up to
    step 40 at r = 0.05), and always ``total_steps``.
    For consecutive steps ``a < b``: ``b <= max(a + 1, (1 + resolution) * a)``. Independent of the
    budget: the steps below ``total_steps`` are the same for every budget that exceeds them.
    """
    _check_total(total_steps)
    r = check_resolution(resolution)
    steps = []
    step = 1
    while step < total_steps:
        steps.append(step)
        step = max(step + 1, math.floor(step * (1.0 + r) + 1e-9))
    steps.append(total_steps)
    return steps


def schedule_resolution(steps) -> float:
    """The largest relative gap ``b / a - 1`` over consecutive steps ``a < b`` of ``steps`` that are more
    than one step apart (0.0 when every gap is a single step); a step 0 is skipped."""
    ordered = sorted({int(s) for s in steps if int(s) > 0})
    gaps = [b / a - 1.0 for a, b in zip(ordered, ordered[1:]) if b - a > 1]
    return round(max(gaps, default=0.0), 9)  # 0.05, not 0.050000000000000044


@dataclass(frozen=True)
class EvaluationSchedule:
    """Parameters of a workload's default schedule (see the module docstring).

    ``num_regular`` and ``early_ratio`` set the full steps (:func:`evaluation_steps`); ``resolution``
    the resolution steps (:func:`resolution_steps`), or ``None`` for none (the full steps alone, the
    schedule batchlab used before resolution steps existed).
    """

    num_regular: int = 25
    early_ratio: float = 1.5
    resolution: float | None = DEFAULT_RESOLUTION

    def __post_init__(self) -> None:
        if isinstance(self.num_regular, bool) or not isinstance(self.num_regular, int) or self.num_regular < 1:
            raise BatchlabError(f"num_regular must be an integer >= 1, got {self.num_regular!r}")
        if isinstance(self.early_ratio, bool) or not isinstance(self.early_ratio, (int, float)) or not self.early_ratio > 1.0:
            raise BatchlabError(f"early_ratio must be > 1, got {self.early_ratio!r}")
        if self.resolution is not None:
            check_resolution(self.resolution)

    def full_steps(self, total_steps: int) -> list[int]:
        """Steps at which every metric is measured (dense early, regular later, ending at ``total_steps``)."""
        return evaluation_steps(total_steps, num_regular=self.num_regular, early_ratio=self.early_ratio)

    def goal_steps(self, total_steps: int) -> list[int]:
        """Resolution steps (empty when ``resolution`` is None)."""
        if self.resolution is None:
            _check_total(total_steps)
            return []
        return resolution_steps(total_steps, self.resolution)

    def steps(self, total_steps: int) -> list[int]:
        """Every evaluation step: the sorted union of :meth:`full_steps` and :meth:`goal_steps`."""
        return sorted(set(self.full_steps(total_steps)) | set(self.goal_steps(total_steps)))

    def describe(self) -> dict:
        """JSON-ready parameters."""
        return {"num_regular": self.num_regular, "early_ratio": self.early_ratio, "resolution": self.resolution}


def evaluation_steps(total_steps: int, num_regular: int = 25, early_ratio: float = 1.5) -> list[int]:
    """The full steps for a budget of ``total_steps`` updates: 1, then each next step
    ``max(s + 1, ceil(s * early_ratio))`` below the regular interval ``ceil(total_steps / num_regular)``,
    then every interval, and ``total_steps``. Its resolution depends on the budget (1/``num_regular`` of
    it late, ``early_ratio - 1`` early); :func:`resolution_steps` is the schedule whose resolution does not."""
    _check_total(total_steps)
    EvaluationSchedule(num_regular, early_ratio, None)  # validates the parameters
    interval = max(1, math.ceil(total_steps / num_regular))
    steps = set(range(interval, total_steps + 1, interval))
    steps.add(total_steps)
    step = 1
    while step < min(interval, total_steps):
        steps.add(step)
        step = max(step + 1, math.ceil(step * early_ratio))
    return sorted(steps)
