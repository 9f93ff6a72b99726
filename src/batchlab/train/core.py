"""The training core shared by one trial (:mod:`batchlab.train.trial`) and K vectorized trials
(:mod:`batchlab.sweep.vectorized`): the step loop, the bookkeeping of an evaluation, the replay of
the goal's bracket, and how batches reach the device.

Both paths are written as the same three pieces, parameterised by what differs between them (one
model and its optimizer, or K stacked parameter sets and a vectorized update):

* :func:`train_loop` runs the updates and the evaluation schedule: ``update(step)`` for each
  0-based step (batches from :class:`batchlab.train.sampling.BatchSampler`, divergence from
  :class:`batchlab.train.divergence.DivergenceMonitor`), ``evaluate(step)`` after ``step`` updates
  at each scheduled step; either may stop the run.
* :class:`TrialProgress` is one trial's state machine, fed one evaluation at a time: it records the
  row, marks a non-finite evaluation ``INFEASIBLE``, and when the goal is first met asks for the
  replay of the bracket before it settles ``steps_to_goal``, ``steps_lower`` and the status
  (``COMPLETE``, ``STOPPED_AT_GOAL``, ``INFEASIBLE``, or ``RACED`` when racing stopped it:
  :mod:`batchlab.train.race`; docs/methods.md, "Evaluation schedule and resolution", "Racing").
  :func:`evaluate_trials` drives it for every trial evaluated at one step.
* :func:`replay_bracket` trains a copy of the trial(s) from the last evaluation before the goal was
  met, measuring the goal split at the resolution steps in between, given ``advance(step)`` (one
  update of the copy) and ``measure(trial, step)``.

Data: :func:`device_split` moves an in-memory :class:`batchlab.workloads.data.TensorSplit` to the
trial's device once; :func:`batch_source` gives the function from sampled indices (CPU) to a batch on
the device (for a ``Dataset`` split, each batch is collated on the CPU and then moved).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Hashable

import torch

from batchlab.train.evaluation import bracket, goal_reached

__all__ = [
    "COMPLETE", "INFEASIBLE", "RACED", "STOPPED_AT_GOAL", "TrialProgress", "batch_source", "device_split", "evaluate_trials",
    "finite", "replay_bracket", "replay_steps", "train_loop",
]

COMPLETE, STOPPED_AT_GOAL, INFEASIBLE, RACED = "COMPLETE", "STOPPED_AT_GOAL", "INFEASIBLE", "RACED"

Row = dict[str, float]


def finite(metrics: Mapping[str, float]) -> bool:
    """Whether every value of an evaluation is finite (a non-finite one makes the trial INFEASIBLE)."""
    return all(math.isfinite(v) for v in metrics.values())


class TrialProgress:
    """The measurements, status and steps to the goal of one trial, evaluation by evaluation.

    Per evaluation: :meth:`evaluated` records the row unless it is the first to meet the goal; then
    the caller replays the bracket (or not) and calls :meth:`settle_goal` with the replayed rows and
    the first replayed step meeting the goal (``None`` if none). Rules (``run_trial``'s contract):

    * a non-finite value: the row is recorded, status ``INFEASIBLE``, the trial stops;
    * the goal first met at step ``t`` with replayed rows meeting it first at ``s < t``:
      ``steps_to_goal = s``; with ``stop_at_goal`` the trial stops there (``STOPPED_AT_GOAL``,
      ``steps = s``: the updates past ``s`` are discarded) without recording ``t``;
    * otherwise ``t`` is recorded and ``steps_to_goal = t``; with ``stop_at_goal`` the trial stops,
      ``STOPPED_AT_GOAL`` if ``t`` is before the budget (``COMPLETE`` at the very last step);
    * ``steps_lower`` is the evaluation step before ``steps_to_goal`` (0 if none);
    * :meth:`raced` (racing, :mod:`batchlab.train.race`): status ``RACED``, the trial stops at this
      evaluation (``steps`` = updates run).

    ``on_record(row)`` is called for each recorded row, in order (the store's writer, a callback).
    """

    __slots__ = ("metric", "goal", "maximize", "stop_at_goal", "total_steps", "measurements", "status", "steps",
                 "steps_to_goal", "steps_lower", "stopped", "stopped_at", "_on_record", "_pending")

    def __init__(self, *, metric: str, goal: float, maximize: bool, stop_at_goal: bool, total_steps: int,
                 on_record: Callable[[Row], None] | None = None) -> None:
        self.metric, self.goal, self.maximize = metric, float(goal), bool(maximize)
        self.stop_at_goal, self.total_steps = bool(stop_at_goal), int(total_steps)
        self.measurements: list[Row] = []
        self.status = COMPLETE
        self.steps = 0  # updates run; the loop keeps it current (see finish)
        self.steps_to_goal: int | None = None
        self.steps_lower: int | None = None
        self.stopped = False
        self.stopped_at: int | None = None  # a replayed step the trial stopped at (STOPPED_AT_GOAL)
        self._on_record = on_record
        self._pending: Row | None = None

    @property
    def searching(self) -> bool:
        """Still running and the goal not yet met (its state is worth a replay snapshot)."""
        return self.steps_to_goal is None and not self.stopped

    def meets_goal(self, metrics: Mapping[str, float]) -> bool:
        """Whether these metrics hold the goal metric and it beats the goal."""
        return self.metric in metrics and goal_reached(metrics[self.metric], self.goal, self.maximize)

    def record(self, row: Row) -> None:
        self.measurements.append(row)
        if self._on_record is not None:
            self._on_record(row)

    def evaluated(self, step: int, metrics: Mapping[str, float]) -> bool:
        """Take the evaluation at ``step``; True when it is the first to meet the goal (then call
        :meth:`settle_goal`, after replaying the bracket if the trial refines it)."""
        row = {"step": step, **metrics}
        if not finite(metrics):
            self.record(row)
            self.status, self.stopped = INFEASIBLE, True
            return False
        if self.steps_to_goal is None and self.meets_goal(metrics):
            self._pending = row
            return True
        self.record(row)
        return False

    def settle_goal(self, replayed: Sequence[Row] = (), found: int | None = None) -> None:
        """Finish the evaluation that first met the goal: record the ``replayed`` rows (resolution
        steps inside the bracket), then apply the rules of the class docstring."""
        row, self._pending = self._pending, None
        step = row["step"]
        for refined in replayed:
            self.record(refined)
        if found is not None:
            self.steps_to_goal = found
            self.steps_lower = bracket([m["step"] for m in self.measurements], found)
            if self.stop_at_goal:  # stopped where a run measuring every resolution step would have
                self.status, self.stopped, self.stopped_at, self.steps = STOPPED_AT_GOAL, True, found, found
                return
        self.record(row)
        if self.steps_to_goal is None:
            self.steps_to_goal = step
            self.steps_lower = bracket([m["step"] for m in self.measurements], step)
        if self.stop_at_goal:
            self.stopped = True
            if step < self.total_steps:
                self.status = STOPPED_AT_GOAL

    def diverged(self) -> None:
        """The training loss diverged (:class:`batchlab.train.divergence.DivergenceMonitor`)."""
        self.status, self.stopped = INFEASIBLE, True

    def raced(self) -> None:
        """Racing stopped the trial at this evaluation: it can no longer be among its study's best
        (:mod:`batchlab.train.race`); status ``RACED``."""
        self.status, self.stopped = RACED, True

    def finish(self, step: int) -> None:
        """Set ``steps`` when the loop ended after ``step`` updates (a replayed stop keeps its step)."""
        self.steps = self.stopped_at if self.stopped_at is not None else step


def evaluate_trials(
    step: int,
    trials: Iterable[tuple[Hashable, TrialProgress]],
    measure: Callable[[Hashable], Row],
    replay: Callable[[dict[Hashable, TrialProgress], int], dict[Hashable, tuple[list[Row], int | None]]] | None,
    racer: Any = None,
) -> None:
    """One evaluation at ``step`` of the running ``trials`` (``(key, progress)`` pairs, in order).

    ``measure(key)`` gives a trial's metrics now; ``replay(reached, step)`` (``None``: no replay) the
    replayed rows and first goal step of the trials that first meet the goal here, all together;
    ``racer`` (a :class:`batchlab.train.race.Racer`, ``None``: no racing) then stops the trials that
    can no longer be among their study's best (status ``RACED``).
    """
    trials = list(trials)
    reached = {key: progress for key, progress in trials if progress.evaluated(step, measure(key))}
    if reached:
        refined = replay(reached, step) if replay is not None else {}
        for key, progress in reached.items():
            progress.settle_goal(*refined.get(key, ((), None)))
    if racer is not None:
        racer.after_evaluation(step, trials)


def replay_steps(refine_steps: Sequence[int], begin: int, upto: int) -> list[int]:
    """The resolution steps a replay from the snapshot at ``begin`` measures, towards the evaluation at
    ``upto`` that first met the goal: those strictly between, and ``0`` itself when the snapshot is the
    initial model and ``0`` is a resolution step (the trial did not measure the model before its first
    update: a goal met there is steps to result 0, not ``(0, first evaluation]``)."""
    return [s for s in refine_steps if begin < s < upto or s == begin == 0]


def replay_bracket(
    trials: Mapping[Hashable, TrialProgress],
    steps: Sequence[int],
    start: int,
    advance: Callable[[int], Any],
    measure: Callable[[Hashable, int], Row],
) -> dict[Hashable, tuple[list[Row], int | None]]:
    """Replay a copy of ``trials`` from ``start`` through the resolution ``steps`` of the bracket.

    ``advance(step)`` runs update ``step`` (0-based) of the copy (of every trial in it, the same
    batches as the live run: the trial is deterministic); at each step of ``steps`` (sorted, all
    after ``start``, or ``start`` itself when it is 0: :func:`replay_steps`) ``measure(key, step)`` measures the goal split of each trial still searching.
    A trial stops searching at its first step meeting the goal or a non-finite measurement; the
    replay ends when none searches. Returns ``{key: (rows, first step meeting the goal or None)}``.
    A measured row may be a goal check's flagged bound (:func:`batchlab.train.evaluation.measure_goal`),
    whose value decides ``meets_goal`` as the true value would.
    """
    found: dict[Hashable, tuple[list[Row], int | None]] = {key: ([], None) for key in trials}
    searching = dict(trials)
    step = start
    for target in steps:
        while step < target:
            advance(step)
            step += 1
        for key, progress in list(searching.items()):
            metrics = measure(key, target)
            found[key][0].append({"step": target, **metrics})
            if not finite(metrics):
                del searching[key]
            elif progress.meets_goal(metrics):
                found[key] = (found[key][0], target)
                del searching[key]
        if not searching:
            break
    return found


def train_loop(total: int, schedule: Iterable[int], update: Callable[[int], bool], evaluate: Callable[[int], bool]) -> int:
    """Run updates ``0..total-1`` and the evaluations at ``schedule`` (sorted steps in ``0..total``);
    return the number of updates run.

    ``update(step)`` runs update ``step`` and returns True when training must stop (diverged);
    ``evaluate(step)`` is called after ``step`` updates at each scheduled step (at 0 before any) and
    returns True when training must stop. Nothing else happens per step: this is the hot loop.
    """
    evaluations = iter(schedule)
    next_eval = next(evaluations, None)
    step, stop = 0, False
    if next_eval == 0:
        stop = evaluate(0)
        next_eval = next(evaluations, None)
    while not stop and step < total:
        stop = update(step)
        step += 1
        if not stop and step == next_eval:
            stop = evaluate(step)
            next_eval = next(evaluations, None)
    return step


def device_split(split: Any, device: torch.device) -> Any:
    """``split`` with its tensors on ``device`` when it is an in-memory tensor split (moved once);
    any other split unchanged (its batches are moved one by one, :func:`batch_source`)."""
    from batchlab.workloads.data import TensorSplit

    if device.type == "cpu" or not isinstance(split, TensorSplit):
        return split
    return TensorSplit(split.x.to(device), split.y.to(device))


def batch_source(split: Any, device: torch.device) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """``indices -> (inputs, targets)`` on ``device`` for ``split`` (after :func:`device_split`).

    The indices are CPU tensors (:class:`batchlab.train.sampling.BatchSampler`). On the CPU this is
    ``split.batch`` itself (for a tensor split, ``index_select`` on ``x`` and ``y``); on another
    device a tensor split gathers on the device, any other split collates on the CPU and moves the
    batch (``non_blocking``: the copy overlaps the previous step).
    """
    from batchlab.workloads.data import TensorSplit

    if device.type == "cpu":
        return split.batch
    if isinstance(split, TensorSplit) and split.x.device == device:
        batch = split.batch

        def gather(indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return batch(indices.to(device, non_blocking=True))

        return gather

    def collate(indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = split.batch(indices)
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    return collate
