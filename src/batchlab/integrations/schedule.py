"""Batch-size schedules counted in examples (or tokens), the accumulation that reaches them, the LR rule.

A :class:`BatchSizeSchedule` says which batch size a run uses once it has consumed a given number of
training examples (or tokens): ``points = ((0, 64), (40_000, 128), (120_000, 256))`` trains at 64
examples per optimizer step from the start, at 128 from the step that begins with 40,000 examples
consumed, at 256 from 120,000 on. *Consumed* counts the examples (tokens) of every completed optimizer
step, over all micro-batches and all data-parallel workers; the batch size is read at the start of a
step, so a step never straddles two batch sizes.

The same schedule is written by ``batchlab probe branched`` and read by the callbacks
(:mod:`batchlab.integrations.lightning`, :mod:`batchlab.integrations.huggingface`); its file form is
``{"format": "batchlab.batch_size_schedule", "version": 1, "unit": "examples", "points":
[{"start": 0, "batch_size": 64}, ...]}`` (:meth:`BatchSizeSchedule.save`, :meth:`~BatchSizeSchedule.load`).
:meth:`BatchSizeSchedule.to_olmo_core` gives the arguments of OLMo-core's ``BatchSizeSchedulerCallback``.

A trainer reaches a batch size B with micro-batches of m examples on n workers by accumulating
k = B / (m n) micro-batches per step (:func:`accumulation_steps`); the learning rate follows the batch
size by a rule (:func:`rescaled_learning_rate`), and a learning-rate *schedule* is best written as a
function of examples consumed (:func:`examples_lr_schedule`), so that a ramp, which changes how many
steps a given number of examples takes, neither stretches nor cuts it.

Nothing here imports an optional library. Definitions: docs/methods.md, "Batch-size schedules and the
Lightning callbacks".
"""

from __future__ import annotations

import itertools
import json
import math
import numbers
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from batchlab.atomic import os_error_text, write_stream_atomic
from batchlab.errors import BatchlabError, checked_int, decode_utf8, one_line, printable

FORMAT = "batchlab.batch_size_schedule"
VERSION = 1
UNITS = ("examples", "tokens")
RULES = ("linear", "sqrt", "none")
LR_SHAPES = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class BatchSizeSchedule:
    """Batch size (examples, or tokens, per optimizer step, all workers) as a step function of consumption.

    ``points``: ``(start, batch_size)`` pairs; ``start`` strictly increasing from 0 (examples or tokens
    consumed before the step), ``batch_size`` strictly increasing integers >= 1 (a schedule grows the
    batch; a constant batch is one point). ``unit``: ``"examples"`` or ``"tokens"`` (both ``start``
    and ``batch_size`` are in it). Validation raises a one-line :class:`BatchlabError`.
    """

    points: tuple[tuple[int, int], ...]
    unit: str = "examples"

    def __post_init__(self):
        if self.unit not in UNITS:
            raise BatchlabError(f"unknown batch-size schedule unit {printable(repr(self.unit))}; known: {', '.join(UNITS)}")
        raw = self.points
        if isinstance(raw, (str, bytes, Mapping)) or not hasattr(raw, "__iter__"):
            raise BatchlabError(f"batch-size schedule points must be a list of (start, batch_size) pairs, got {one_line(repr(raw))}")
        points = []
        for i, point in enumerate(raw):
            if isinstance(point, (str, bytes)) or not hasattr(point, "__len__") or len(point) != 2:
                raise BatchlabError(f"batch-size schedule point {i} must be a (start, batch_size) pair, got {one_line(repr(point))}")
            start = checked_int(f"batch-size schedule point {i}: start", point[0], 0)
            size = checked_int(f"batch-size schedule point {i}: batch_size", point[1], 1)
            points.append((start, size))
        if not points:
            raise BatchlabError("a batch-size schedule needs at least one (start, batch_size) point")
        if points[0][0] != 0:
            raise BatchlabError(f"a batch-size schedule must start at 0 {self.unit}, its first point starts at {points[0][0]}")
        for (s0, b0), (s1, b1) in itertools.pairwise(points):
            if s1 <= s0:
                raise BatchlabError(f"batch-size schedule starts must be strictly increasing, got {s0} then {s1}")
            if b1 <= b0:
                raise BatchlabError(
                    f"batch-size schedule is not increasing: batch size {b0} at {s0} then {b1} at {s1} "
                    "(each point must have a larger batch size than the one before)")
        object.__setattr__(self, "points", tuple(points))

    @property
    def starts(self) -> list[int]:
        """Where each batch size begins, in ``unit`` consumed."""
        return [s for s, _ in self.points]

    @property
    def batch_sizes(self) -> list[int]:
        """The batch sizes in order (strictly increasing)."""
        return [b for _, b in self.points]

    def batch_size_at(self, consumed: int) -> int:
        """The batch size of a step that begins after ``consumed`` examples (tokens): the last point
        whose ``start <= consumed``."""
        consumed = checked_int("consumed", consumed, 0)
        size = self.points[0][1]
        for start, b in self.points:
            if start > consumed:
                break
            size = b
        return size

    # -- files --------------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """The JSON form: ``{"format", "version", "unit", "points": [{"start", "batch_size"}, ...]}``."""
        return {"format": FORMAT, "version": VERSION, "unit": self.unit,
                "points": [{"start": s, "batch_size": b} for s, b in self.points]}

    @classmethod
    def from_dict(cls, d) -> BatchSizeSchedule:
        """Read :meth:`to_dict`'s form; anything else is a one-line :class:`BatchlabError`."""
        if not isinstance(d, Mapping):
            raise BatchlabError(f"a batch-size schedule must be a JSON object with format {FORMAT!r}, got {type(d).__name__}")
        if d.get("format") != FORMAT:
            raise BatchlabError(f"not a batch-size schedule: format {printable(repr(d.get('format')))}, expected {FORMAT!r}")
        if d.get("version") != VERSION:
            raise BatchlabError(f"batch-size schedule version {printable(repr(d.get('version')))}; known: {VERSION}")
        extra = sorted(set(d) - {"format", "version", "unit", "points"})
        if extra:
            raise BatchlabError(f"batch-size schedule has unknown keys {', '.join(map(printable, extra))}; "
                                "known: format, version, unit, points")
        points = d.get("points")
        if not isinstance(points, list):
            raise BatchlabError("batch-size schedule 'points' must be a list of {\"start\", \"batch_size\"} objects")
        pairs = []
        for i, p in enumerate(points):
            if not isinstance(p, Mapping) or set(p) != {"start", "batch_size"}:
                raise BatchlabError(f"batch-size schedule point {i} must be an object with exactly start and batch_size, "
                                    f"got {one_line(json.dumps(p, default=str))}")
            pairs.append((p["start"], p["batch_size"]))
        if "unit" not in d:  # required: a schedule in tokens read as examples would be silently wrong
            raise BatchlabError(f"batch-size schedule has no 'unit'; allowed: {', '.join(UNITS)}")
        return cls(tuple(pairs), unit=d["unit"])

    def save(self, path: str | os.PathLike) -> Path:
        """Write the JSON form to ``path`` atomically (a reader sees the old file or the whole new one)."""
        data = (json.dumps(self.to_dict(), indent=2) + "\n").encode()
        try:
            return write_stream_atomic(path, lambda handle: handle.write(data))
        except OSError as exc:
            raise BatchlabError(f"cannot write batch-size schedule: {os_error_text(exc)}") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> BatchSizeSchedule:
        """Read a file :meth:`save` wrote; a missing, unreadable or malformed file is a one-line
        :class:`BatchlabError` naming it."""
        name = printable(str(path))
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise BatchlabError(f"cannot read batch-size schedule: {os_error_text(exc)}") from None
        text = decode_utf8(raw, f"batch-size schedule {name}")
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BatchlabError(f"batch-size schedule {name} is not JSON: {one_line(exc)}") from None
        try:
            return cls.from_dict(d)
        except BatchlabError as exc:
            raise BatchlabError(f"{name}: {exc}") from None

    # -- other trainers -----------------------------------------------------------------------------

    def to_olmo_core(self, sequence_length: int | None = None) -> dict:
        """The keyword arguments of OLMo-core's ``BatchSizeSchedulerCallback`` (olmo_core.train.callbacks):
        ``{"batch_sizes": [tokens, ...], "schedule": [{"value": tokens, "unit": "tokens"}, ...]}``.

        OLMo-core counts the global batch size (``data_loader.global_batch_size``) in tokens, and each
        ``schedule`` entry is a ``Duration`` (``Duration.tokens(value)``) at which the batch size at the
        same index applies; the first must be at 0, and each batch size must be a whole multiple of the
        one before. A schedule in examples needs ``sequence_length`` (tokens per example, a fixed-length
        sequence) to convert; a schedule in tokens takes none. Build the callback with
        ``BatchSizeSchedulerCallback(batch_sizes=d["batch_sizes"], schedule=[Duration.tokens(e["value"])
        for e in d["schedule"]])``.
        """
        if self.unit == "tokens":
            if sequence_length is not None:
                raise BatchlabError("to_olmo_core: this schedule is already in tokens; pass no sequence_length")
            factor = 1
        else:
            if sequence_length is None:
                raise BatchlabError("to_olmo_core: OLMo-core counts tokens; pass sequence_length (tokens per example) "
                                    "for a schedule in examples")
            factor = checked_int("sequence_length", sequence_length, 1)
        sizes = [b * factor for b in self.batch_sizes]
        for a, b in itertools.pairwise(sizes):
            if b % a:
                raise BatchlabError(f"OLMo-core only increases the batch size by a whole factor; {b} is not a multiple of {a} "
                                    "(choose batch sizes that double, e.g.)")
        return {"batch_sizes": sizes, "schedule": [{"value": s * factor, "unit": "tokens"} for s in self.starts]}


def accumulation_steps(batch_size: int, micro_batch_size: int, world_size: int = 1) -> int:
    """Micro-batches per worker per optimizer step, k = ``batch_size`` / (``micro_batch_size`` x ``world_size``).

    All three count examples (or all tokens): ``batch_size`` per optimizer step over all workers,
    ``micro_batch_size`` per worker per forward/backward pass. A one-line :class:`BatchlabError`
    when k is not a whole number >= 1, naming the reachable batch sizes.
    """
    batch_size = checked_int("batch_size", batch_size, 1)
    micro_batch_size = checked_int("micro_batch_size", micro_batch_size, 1)
    world_size = checked_int("world_size", world_size, 1)
    per_pass = micro_batch_size * world_size
    if batch_size % per_pass:
        reachable = ", ".join(str(per_pass * k) for k in range(1, 5))
        raise BatchlabError(
            f"batch size {batch_size} is not reachable by gradient accumulation with micro-batches of {micro_batch_size} "
            f"on {world_size} worker(s) ({per_pass} per pass); reachable: {reachable}, ... (multiples of {per_pass})")
    return batch_size // per_pass


def checked_rule(rule, batch_sizes=()) -> str | dict[int, float]:
    """``rule`` as :func:`rescaled_learning_rate` takes it: ``"linear"``, ``"sqrt"``, ``"none"``, or a table
    ``{batch_size: lr}`` (int keys >= 1; string keys of digits, as JSON writes them, are read as ints;
    positive finite learning rates). A table must hold every size in ``batch_sizes``. Else a one-line
    :class:`BatchlabError`."""
    if isinstance(rule, str):
        if rule not in RULES:
            raise BatchlabError(f"unknown learning-rate rule {printable(repr(rule))}; known: {', '.join(RULES)}, "
                                "or a table {batch_size: lr}")
        return rule
    if not isinstance(rule, Mapping):
        raise BatchlabError(f"learning-rate rule must be one of {', '.join(RULES)} or a table {{batch_size: lr}}, "
                            f"got {one_line(repr(rule))}")
    table: dict[int, float] = {}
    for key, lr in rule.items():
        if isinstance(key, str) and key.isdigit():
            key = int(key)
        key = checked_int("learning-rate table batch size", key, 1)
        if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not (math.isfinite(lr) and lr > 0):
            raise BatchlabError(f"learning-rate table: the rate for batch size {key} must be a positive number, got {lr!r}")
        table[key] = float(lr)
    if not table:
        raise BatchlabError("learning-rate table is empty; give {batch_size: lr} for every batch size the schedule uses")
    missing = sorted({int(b) for b in batch_sizes} - set(table))
    if missing:
        raise BatchlabError(f"learning-rate table has no rate for batch size(s) {', '.join(map(str, missing))}; "
                            f"it covers {', '.join(map(str, sorted(table)))}")
    return table


def rescaled_learning_rate(base_lr: float, base_batch_size: int, batch_size: int, rule) -> float:
    """The learning rate at ``batch_size`` given ``base_lr`` at ``base_batch_size`` (both in the same unit).

    ``rule``: ``"linear"``: base_lr x B / B0 (SGD's linear scaling); ``"sqrt"``: base_lr x sqrt(B / B0)
    (Adam-type optimizers; OLMo-core's rule); ``"none"``: base_lr; a table ``{batch_size: lr}``: the
    table's rate at B (``base_lr`` and ``base_batch_size`` are then unused), a one-line
    :class:`BatchlabError` when B is not in it.
    """
    rule = checked_rule(rule, (batch_size,) if not isinstance(rule, str) else ())
    batch_size = checked_int("batch_size", batch_size, 1)
    if isinstance(rule, dict):
        return rule[batch_size]
    base_batch_size = checked_int("base_batch_size", base_batch_size, 1)
    if isinstance(base_lr, bool) or not isinstance(base_lr, numbers.Real) or not math.isfinite(base_lr) or base_lr < 0:
        raise BatchlabError(f"base_lr must be a finite number >= 0, got {base_lr!r}")
    ratio = batch_size / base_batch_size
    if rule == "linear":
        return float(base_lr) * ratio
    if rule == "sqrt":
        return float(base_lr) * math.sqrt(ratio)
    return float(base_lr)


@dataclass(frozen=True)
class ExamplesLRSchedule:
    """A learning-rate multiplier as a function of examples (or tokens) consumed; see :func:`examples_lr_schedule`."""

    shape: str
    total: int
    warmup: int = 0
    final_factor: float = 0.0

    def __call__(self, consumed: int) -> float:
        """The multiplier (in [final_factor, 1] after warmup; 0 -> 1 linearly during it) after ``consumed``."""
        consumed = max(0, min(int(consumed), self.total))
        if consumed < self.warmup:
            return consumed / self.warmup
        if self.shape == "constant" or self.total == self.warmup:
            return 1.0
        progress = (consumed - self.warmup) / (self.total - self.warmup)
        if self.shape == "linear":
            decay = 1.0 - progress
        else:  # cosine
            decay = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.final_factor + (1.0 - self.final_factor) * decay


def examples_lr_schedule(shape: str, total_examples: int, warmup_examples: int = 0,
                         final_factor: float = 0.0) -> Callable[[int], float]:
    """A learning-rate multiplier f(examples consumed), for a schedule that a batch-size ramp does not distort.

    ``shape``: ``"constant"``, ``"linear"`` (decay to ``final_factor`` at ``total_examples``) or
    ``"cosine"`` (half a cosine from 1 to ``final_factor``); ``warmup_examples``: a linear warmup from 0
    to 1 over the first examples (f(0) = 0: the first step then does not move the weights; start the
    count at one step's examples to avoid it). Past ``total_examples`` f stays at its final value.
    Examples (or tokens, consistently with the batch-size schedule) are counted as in
    :class:`BatchSizeSchedule`: those of completed optimizer steps, all workers. The learning rate of a
    step is ``peak x f(consumed before the step)``, with the peak rescaled for the step's batch size
    by :func:`rescaled_learning_rate`. Any callable of the same form works in its place.
    """
    if shape not in LR_SHAPES:
        raise BatchlabError(f"unknown learning-rate schedule shape {printable(repr(shape))}; known: {', '.join(LR_SHAPES)}")
    total = checked_int("total_examples", total_examples, 1)
    warmup = checked_int("warmup_examples", warmup_examples, 0)
    if warmup > total:
        raise BatchlabError(f"warmup_examples ({warmup}) must be <= total_examples ({total})")
    if isinstance(final_factor, bool) or not isinstance(final_factor, numbers.Real) or not 0.0 <= final_factor <= 1.0:
        raise BatchlabError(f"final_factor must be a number in [0, 1], got {final_factor!r}")
    return ExamplesLRSchedule(shape, total, warmup, float(final_factor))


def coerce_schedule(schedule) -> BatchSizeSchedule:
    """``schedule`` as a :class:`BatchSizeSchedule`: one as is, its dict form (:meth:`~BatchSizeSchedule.from_dict`)
    or the path of its file (:meth:`~BatchSizeSchedule.load`); anything else is a one-line :class:`BatchlabError`."""
    if isinstance(schedule, BatchSizeSchedule):
        return schedule
    if isinstance(schedule, (str, os.PathLike)):
        return BatchSizeSchedule.load(schedule)
    if isinstance(schedule, Mapping):
        return BatchSizeSchedule.from_dict(schedule)
    raise BatchlabError("batch-size schedule must be a batchlab BatchSizeSchedule, its dict form or a file path, "
                        f"got {type(schedule).__name__}")


def checked_tokens_per_example(schedule: BatchSizeSchedule, tokens_per_example) -> int | None:
    """``tokens_per_example`` (the tokens of one example: fixed-length sequences) for ``schedule``: an
    integer >= 1, required for a schedule in tokens (to turn examples into tokens); ``None`` for one in
    examples, where giving it is an error. Bad input is a one-line :class:`BatchlabError`."""
    if schedule.unit == "tokens":
        if tokens_per_example is None:
            raise BatchlabError("a batch-size schedule in tokens needs tokens_per_example (the tokens of one example, "
                                "a fixed length) to count examples; or write the schedule in examples")
        return checked_int("tokens_per_example", tokens_per_example, 1)
    if tokens_per_example is not None:
        raise BatchlabError("tokens_per_example applies to a batch-size schedule in tokens; this one is in examples")
    return None


__all__ = ["FORMAT", "RULES", "UNITS", "VERSION", "BatchSizeSchedule", "ExamplesLRSchedule", "accumulation_steps",
           "checked_rule", "checked_tokens_per_example", "coerce_schedule", "examples_lr_schedule",
           "rescaled_learning_rate"]
