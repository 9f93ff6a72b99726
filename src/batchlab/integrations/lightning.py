"""PyTorch Lightning callbacks: the gradient noise scale of the run, and a batch-size schedule in examples.

* :class:`NoiseScaleCallback` attaches a :class:`batchlab.probes.tracker.NoiseScaleTracker` to the
  ``LightningModule`` and logs B_simple with its interval through the trainer's loggers.
* :class:`BatchSizeSchedule` follows a :class:`batchlab.integrations.schedule.BatchSizeSchedule` by
  setting ``trainer.accumulate_grad_batches`` at optimizer-step boundaries, rescales the learning rate
  for the batch size by a rule, and owns the learning rate: ``lr = base_lr x lr_schedule(examples
  consumed) x rule factor``, so the LR schedule is counted in examples and a ramp neither stretches
  nor cuts it.

How Lightning 2.x runs a step (``lightning.pytorch.loops``), which both callbacks rely on: under
automatic optimization each micro-batch runs ``on_train_batch_start``, the ``training_step`` whose loss
is divided by ``trainer.accumulate_grad_batches`` (A), and ``backward``; gradients are zeroed before the
micro-batch whose index in the epoch ``batch_idx`` satisfies ``batch_idx % A == 0``, and the optimizer
steps after the one with ``(batch_idx + 1) % A == 0`` or at the last batch of the epoch. At that step
the precision plugin runs the closure (the last backward), unscales the gradients (16-bit AMP's
``GradScaler``), calls ``on_before_optimizer_step``, then clips the gradients
(``gradient_clip_val``), then ``optimizer.step()``. So ``on_before_optimizer_step`` sees ``.grad`` after
accumulation (and DDP's all-reduce), before clipping.

Counting: the *examples of a micro-batch* are its leading dimension (Lightning's own
``extract_batch_size``, or a ``batch_size_fn``); the *examples of a step* are the sum over its
micro-batches and over workers; *examples consumed* are those of all completed optimizer steps.
Definitions of everything logged: docs/methods.md, "Batch-size schedules and the Lightning callbacks".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from batchlab.errors import BatchlabError, checked_int, one_line
from batchlab.integrations import schedule as _schedule
from batchlab.integrations.metrics import check_resumed_settings, checked_options, logged_metrics
from batchlab.probes.tracker import NoiseScaleTracker


def _examples_in(batch, batch_size_fn: Callable | None) -> int:
    if batch_size_fn is not None:
        size = batch_size_fn(batch)
    else:
        try:
            size = extract_batch_size(batch)
        except (MisconfigurationException, RecursionError) as exc:  # a batch without tensors; too deep a nesting
            raise BatchlabError(f"cannot count the examples of a batch ({one_line(exc)}); pass batch_size_fn=") from None
    return checked_int("a micro-batch's example count", size, 1)


def _scaler(trainer: pl.Trainer):
    """The precision plugin's ``GradScaler`` (16-bit mixed precision), else None."""
    return getattr(trainer.precision_plugin, "scaler", None)


def _overflowed(scaler, optimizer) -> bool:
    """Whether the ``GradScaler`` found inf/NaN in this step's gradients (so it skips ``optimizer.step``):
    its per-device found-inf flags from the ``unscale_`` Lightning runs before ``on_before_optimizer_step``
    (one flag per device, no pass over the gradients). An optimizer that unscales in its own ``step``
    (fused Adam) has no flags yet: not detected."""
    found = scaler._found_inf_per_device(optimizer)
    return any(bool(flag.item()) for flag in found.values())


def _loader_batch_size(trainer: pl.Trainer) -> int | None:
    loader = trainer.train_dataloader
    if isinstance(loader, (Mapping, list, tuple)):
        return None
    return getattr(loader, "batch_size", None)


def _fitting_with_automatic_optimization(callback: str, stage: str, pl_module: pl.LightningModule,
                                        advice: str = "") -> bool:
    """Whether ``setup`` runs for fitting (else the callback has nothing to set up); a module with
    manual optimization is a one-line error (the callbacks follow Lightning's automatic steps)."""
    if stage != "fit":
        return False
    if not pl_module.automatic_optimization:
        raise BatchlabError(f"{callback} supports automatic optimization only (this module sets "
                            f"automatic_optimization = False){advice}")
    return True


def _log(pl_module: pl.LightningModule, metrics: dict[str, float]) -> None:
    for name, value in metrics.items():
        pl_module.log(name, float(value), on_step=True, on_epoch=False, batch_size=1, sync_dist=False)


# ---------------------------------------------------------------------------------------------------
# The noise scale


class NoiseScaleCallback(Callback):
    """Running B_simple of the run, measured from the gradients Lightning computes, logged through its loggers.

    ``every``: measure one optimizer step in ``every`` (the others cost nothing); ``beta``: the
    tracker's EMA decay per measured step (``None``: the plain mean); ``per_layer``: also log each
    module's tr(Sigma) and |G|^2; ``level``: the two-sided level of B_simple's interval; ``prefix``: of
    every logged name; ``batch_size_fn(batch) -> int``: a micro-batch's examples (default: its leading
    dimension, Lightning's ``extract_batch_size``). Resuming a checkpoint measured with another
    ``beta`` or ``every`` is refused.

    The tracker (``self.tracker``) is attached to the module at ``on_train_start`` (after
    ``configure_model``, the strategy's wrapping and the checkpoint's restore) and updated in
    ``on_before_optimizer_step`` once per optimizer step, with ``batch_size`` = the examples of the
    step's micro-batches x ``trainer.world_size`` and the loss factor 1/A (A =
    ``trainer.accumulate_grad_batches``, times the GradScaler's scale under 16-bit AMP), so
    ``trace_sigma`` and ``grad_norm_sq`` are those of the unscaled mean loss. Its reading
    (``self.reading``, :meth:`NoiseScaleTracker.reading`, taken when the tracker measured a step
    since the last one and the trainer has a logger, and at the end of training) is logged with
    ``pl_module.log`` at every optimizer step from the first measured one on (the reading as of the
    last measured step), only when the trainer has a logger, as
    :func:`batchlab.integrations.metrics.logged_metrics`. The small gradients are the micro-batches' (under accumulation) and each worker's local one (under DDP): a
    run on one device needs ``accumulate_grad_batches >= 2`` (or a :class:`BatchSizeSchedule` whose
    first batch is >= 2 micro-batches). A measured step is left out (its gradients dropped with
    :meth:`NoiseScaleTracker.discard`, counted in ``skipped_steps``; the next step is measured
    instead) when it has a single micro-batch on one device (an epoch's last, partial step: one
    batch size), micro-batches of unequal size on any worker (an epoch's last, smaller batch with
    ``drop_last=False``; the estimate assumes equal ones), or inf/NaN gradients the GradScaler skips
    (16-bit AMP overflow; read from its found-inf flags). ``drop_last=True`` avoids the first two.
    FSDP1 (``FSDPStrategy``) is refused; the state (tracker, ``skipped_steps``) is saved in checkpoints.
    """

    def __init__(self, every: int = 1, beta: float | None = 0.99, per_layer: bool = False, level: float = 0.9,
                 prefix: str = "noise_scale/", batch_size_fn: Callable[[Any], int] | None = None):
        every, beta, level = checked_options(every, beta, level)
        if not isinstance(prefix, str):
            raise BatchlabError(f"NoiseScaleCallback: prefix must be a string, got {prefix!r}")
        self.every, self.beta, self.per_layer, self.level, self.prefix = every, beta, bool(per_layer), level, prefix
        self._read_at: int | None = None  # tracker.steps when self.reading was taken
        self.batch_size_fn = batch_size_fn
        self.tracker: NoiseScaleTracker | None = None
        self.reading: dict | None = None
        self.skipped_steps = 0
        self._sizes: list[int] = []
        self._state: dict | None = None

    # -- setup --------------------------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not _fitting_with_automatic_optimization("NoiseScaleCallback", stage, pl_module,
                                                    "; use NoiseScaleTracker in your training_step instead"):
            return
        if isinstance(trainer.strategy, FSDPStrategy):
            raise BatchlabError("NoiseScaleCallback does not support FSDPStrategy (FSDP1 flattens the parameters it "
                                "would hook); use strategy='ddp' or ModelParallelStrategy (FSDP2, fully_shard)")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # here, not in setup: configure_model, the strategy's wrapping/sharding and the checkpoint's
        # callback state (restored after setup under some strategies) all come before on_train_start
        if not any(p.requires_grad for p in pl_module.parameters()):
            raise BatchlabError(f"NoiseScaleCallback: {type(pl_module).__name__} has no trainable parameters "
                                "(no parameter requires grad), so there is no gradient to measure")
        self._check_two_batch_sizes(trainer)
        if self.tracker is not None:
            self.tracker.remove()
        # under 16-bit AMP Lightning unscales .grad before on_before_optimizer_step while the hooks saw
        # scaled gradients: read the big gradient at the end of the last backward pass instead
        grad_at = "backward" if _scaler(trainer) is not None else "update"
        self.tracker = NoiseScaleTracker(pl_module, beta=self.beta, every=self.every, sync=True, grad_at=grad_at)
        if self._state is not None:  # resuming: load_state_dict ran before (skipped_steps restored there)
            check_resumed_settings("NoiseScaleCallback", self._state, self.beta, self.every)
            self.tracker.load_state_dict(self._state)
            self._state = None
        else:  # a fresh fit (also of a callback used before)
            self.skipped_steps = 0
        self.reading, self._read_at = None, None
        self._refresh_reading()
        self._sizes = []

    def _refresh_reading(self) -> None:
        """``self.reading`` as of the tracker's last measured step (taken only when it changed: a
        reading folds the recorded steps and solves Fieller's quadratic)."""
        if self.tracker is not None and self.tracker.steps and self._read_at != self.tracker.steps:
            self.reading = self.tracker.reading(level=self.level)
            self._read_at = self.tracker.steps

    def _check_two_batch_sizes(self, trainer: pl.Trainer) -> None:
        if trainer.world_size > 1:
            return
        schedules = [c for c in trainer.callbacks if isinstance(c, BatchSizeSchedule)]
        if schedules:
            first = schedules[0].first_accumulation(trainer)
            if first < 2:
                raise BatchlabError(
                    f"NoiseScaleCallback on one device needs >= 2 micro-batches per step, but the batch-size schedule "
                    f"starts at one micro-batch ({schedules[0].schedule.batch_sizes[0]} {schedules[0].schedule.unit}); "
                    "start it at >= 2 micro-batches (a smaller micro_batch_size) or run data parallel")
        elif trainer.accumulate_grad_batches < 2:
            raise BatchlabError(
                "NoiseScaleCallback on one device with accumulate_grad_batches=1 sees only one batch size; "
                "set Trainer(accumulate_grad_batches >= 2) (micro-batches) or run data parallel (devices >= 2)")

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and self.tracker is not None:
            self.tracker.remove()

    # -- the step -----------------------------------------------------------------------------------

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._sizes.append(_examples_in(batch, self.batch_size_fn))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._refresh_reading()

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer) -> None:
        sizes, self._sizes = self._sizes, []
        if not sizes or self.tracker is None:  # a step without a micro-batch of ours (a manual call): nothing recorded
            return
        self._fold(trainer, pl_module, optimizer, sizes)
        if trainer.loggers:
            self._refresh_reading()
        if trainer.loggers and self.reading is not None:
            # at every optimizer step, not only the measured ones, so that whichever steps the logger keeps
            # (log_every_n_steps) carry the reading as of the last measured step
            _log(pl_module, self.logged_values())

    def _fold(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer, sizes: list[int]) -> None:
        """This optimizer step into the tracker: measured, left out (``skipped_steps``) or only counted."""
        tracker = self.tracker
        world = trainer.world_size
        if tracker.calls % tracker.every:  # not a measured step: the tracker only counts the call
            tracker.update(pl_module, batch_size=sum(sizes) * world, world_size=world)
            return
        k_min = k_max = len(sizes)
        b_min, b_max = min(sizes), max(sizes)
        if world > 1:  # every worker takes the same decision (the update may all-reduce)
            local = torch.tensor([k_max, -k_min, b_max, -b_min], dtype=torch.int64, device=trainer.strategy.root_device)
            gathered = trainer.strategy.all_gather(local).reshape(-1, 4).amax(0)
            k_max, k_min, b_max, b_min = int(gathered[0]), -int(gathered[1]), int(gathered[2]), -int(gathered[3])
        scaler = _scaler(trainer)
        scaled = scaler is not None and scaler.is_enabled()
        # left out: unequal micro-batches (the estimate assumes equal ones), one micro-batch on one device
        # (one batch size), a step the GradScaler skips (inf/NaN gradients would poison the running sums)
        if k_min != k_max or b_min != b_max or k_max * world < 2 or (scaled and _overflowed(scaler, optimizer)):
            tracker.discard()
            self.skipped_steps += 1
            return
        grad_scale = 1.0 / trainer.accumulate_grad_batches  # Lightning divides each micro-batch's loss by A
        if scaled:
            grad_scale *= float(scaler.get_scale())
        tracker.update(pl_module, batch_size=k_max * b_max * world, world_size=world, grad_scale=grad_scale)

    def logged_values(self) -> dict[str, float]:
        """The metrics of the last reading, by logged name (:func:`batchlab.integrations.metrics.logged_metrics`):
        ``b_simple`` (only when resolved), ``b_simple_low``, ``b_simple_high`` (only when bounded),
        ``trace_sigma``, ``grad_norm_sq``, and with ``per_layer`` each module's
        ``layer/<module>/trace_sigma`` and ``.../grad_norm_sq``; finite values only."""
        per_layer = self.tracker.per_layer if self.per_layer and self.tracker is not None else None
        return logged_metrics(self.reading, per_layer, self.prefix)

    # -- checkpoints --------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {"tracker": None if self.tracker is None else self.tracker.state_dict(),
                "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore :meth:`state_dict`: the counters now, the tracker's running state into the tracker
        built at the next ``on_train_start`` (Lightning restores callbacks before it, after ``setup``
        under some strategies)."""
        self.skipped_steps = int(state_dict.get("skipped_steps", 0))
        self._state = state_dict.get("tracker")


# ---------------------------------------------------------------------------------------------------
# The batch-size schedule


class BatchSizeSchedule(Callback):
    """Follow a batch-size schedule in examples (or tokens) by gradient accumulation, and own the learning rate.

    ``schedule``: a :class:`batchlab.integrations.schedule.BatchSizeSchedule`, its dict form, or the path
    of its file. ``micro_batch_size``: examples per micro-batch per worker (default: the train
    dataloader's ``batch_size``); every scheduled batch size must be ``micro_batch_size x world_size x
    k`` for a whole k. ``base_batch_size``: the batch size ``base_lr`` belongs to (default: the
    schedule's first). ``base_lr``: default each optimizer parameter group's ``lr`` at the start of
    training. ``rule``: ``"linear"``, ``"sqrt"``, ``"none"`` or a table ``{batch_size: lr}`` (the first
    parameter group's rate; other groups keep their ratio to it); see
    :func:`~batchlab.integrations.schedule.rescaled_learning_rate`. ``lr_schedule``: a multiplier
    f(examples consumed) (:func:`~batchlab.integrations.schedule.examples_lr_schedule`, or any callable;
    default constant 1). ``tokens_per_example``: for a schedule in tokens, the tokens of one example
    (fixed-length sequences): micro-batches are then ``micro_batch_size x tokens_per_example`` tokens;
    ``tokens_fn(batch) -> int``: count a micro-batch's tokens instead (e.g. non-padding tokens) for
    the consumption count. ``batch_size_fn(batch) -> int``: a micro-batch's examples (default: its
    leading dimension). ``prefix``: of the logged names.

    At the first micro-batch of each optimizer step (``on_train_batch_start``) the callback reads the
    schedule at the examples consumed so far and sets ``trainer.accumulate_grad_batches`` = k for that
    batch size. Lightning zeroes and steps by ``batch_idx % k`` within the epoch, so a change of k takes
    effect at the first step boundary whose ``batch_idx`` (counted from the epoch's start) is a multiple
    of the new k: a change waits fewer than lcm(k_old, k_new) micro-batches (k_new - k_old when k_new is
    a multiple of k_old). It then sets every group's ``lr = base_lr x lr_schedule(consumed) x
    factor(batch size in effect)``. The epoch's last step may hold fewer micro-batches (Lightning steps
    there whatever k is, and still divides the loss by k): its examples are counted as they are.

    This callback owns the learning rate: a trainer with an ``lr_scheduler`` configured is refused (give
    the schedule as ``lr_schedule=`` in examples instead), as is ``Trainer(accumulate_grad_batches != 1)``
    (the callback sets it), manual optimization, and more than one optimizer. Bad input (a schedule that
    is not increasing, a batch size the accumulation cannot reach, a learning-rate table that misses a
    scheduled size) is a one-line :class:`BatchlabError` at construction or before the first batch.

    Logged at each optimizer step when the trainer has a logger: ``<prefix>batch_size`` (examples, or
    tokens, in the step, all workers), ``<prefix>accumulate_grad_batches`` (k in effect),
    ``<prefix>consumed`` (examples or tokens consumed before the step) and ``<prefix>lr`` (the first
    group's; ``<prefix>lr/group<i>`` for the others). State (consumed, steps, k) is saved in checkpoints.
    """

    def __init__(self, schedule, micro_batch_size: int | None = None, base_batch_size: int | None = None,
                 base_lr: float | None = None, rule="linear", lr_schedule: Callable[[int], float] | None = None, *,
                 tokens_per_example: int | None = None, tokens_fn: Callable[[Any], int] | None = None,
                 batch_size_fn: Callable[[Any], int] | None = None, prefix: str = "batch_schedule/"):
        schedule = _schedule.coerce_schedule(schedule)
        self.schedule = schedule
        self.micro_batch_size = None if micro_batch_size is None else checked_int("micro_batch_size", micro_batch_size, 1)
        self.base_batch_size = schedule.batch_sizes[0] if base_batch_size is None else \
            checked_int("base_batch_size", base_batch_size, 1)
        if base_lr is not None and (isinstance(base_lr, bool) or not isinstance(base_lr, (int, float))
                                    or not math.isfinite(base_lr) or base_lr < 0):
            raise BatchlabError(f"BatchSizeSchedule callback: base_lr must be a finite number >= 0, got {base_lr!r}")
        self.base_lr = None if base_lr is None else float(base_lr)
        self.rule = _schedule.checked_rule(rule, schedule.batch_sizes)
        if lr_schedule is not None and not callable(lr_schedule):
            raise BatchlabError(f"BatchSizeSchedule callback: lr_schedule must be a callable f(examples consumed), "
                                f"got {type(lr_schedule).__name__}")
        self.lr_schedule = lr_schedule
        self.tokens_per_example = _schedule.checked_tokens_per_example(schedule, tokens_per_example)
        if tokens_fn is not None and schedule.unit != "tokens":
            raise BatchlabError("BatchSizeSchedule callback: tokens_fn applies to a batch-size schedule in tokens; "
                                "this one is in examples")
        self.tokens_fn = tokens_fn
        self.batch_size_fn = batch_size_fn
        self.prefix = prefix
        # progress (checkpointed)
        self.consumed = 0  # examples (tokens) of completed optimizer steps, all workers
        self.steps = 0  # completed optimizer steps
        self.accumulation = None  # k in effect
        self.lr: list[float] = []  # each group's learning rate of the current step
        self.history: list[dict] = []  # per step: step, consumed, batch_size, accumulate_grad_batches, lr
        self._base_lrs: list[float] | None = None
        self._micro: int | None = None
        self._world = 1
        self._pos = 0  # micro-batches of the current step so far
        self._step_units = 0  # examples (tokens) of the current step so far, this worker

    # -- setup --------------------------------------------------------------------------------------

    def _per_pass(self, micro: int) -> int:
        return micro * (self.tokens_per_example or 1)

    def _check_reachable(self, micro: int, world: int) -> None:
        for size in self.schedule.batch_sizes:
            _schedule.accumulation_steps(size, self._per_pass(micro), world)

    def first_accumulation(self, trainer: pl.Trainer) -> int:
        """k of the schedule's first batch size on this trainer (micro-batches per worker)."""
        micro = self._resolve_micro(trainer)
        return _schedule.accumulation_steps(self.schedule.batch_sizes[0], self._per_pass(micro), trainer.world_size)

    def _resolve_micro(self, trainer: pl.Trainer) -> int:
        if self.micro_batch_size is not None:
            return self.micro_batch_size
        size = _loader_batch_size(trainer)
        if size is None:
            raise BatchlabError("BatchSizeSchedule callback: cannot read the micro-batch size from the train dataloader "
                                "(no batch_size attribute); pass micro_batch_size=")
        return int(size)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not _fitting_with_automatic_optimization("BatchSizeSchedule callback", stage, pl_module):
            return
        if trainer.accumulate_grad_batches != 1:
            raise BatchlabError(f"BatchSizeSchedule callback sets the accumulation itself; remove "
                                f"Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches})")
        if any(type(c).__name__ == "GradientAccumulationScheduler" for c in trainer.callbacks):
            raise BatchlabError("BatchSizeSchedule callback and GradientAccumulationScheduler both set the "
                                "accumulation; use one")
        if self.micro_batch_size is not None:
            self._check_reachable(self.micro_batch_size, trainer.world_size)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.lr_scheduler_configs:
            raise BatchlabError("BatchSizeSchedule callback owns the learning rate, but configure_optimizers also returns "
                                "an lr_scheduler; remove it and pass its shape as lr_schedule=f(examples consumed) "
                                "(batchlab.integrations.schedule.examples_lr_schedule)")
        if len(trainer.optimizers) != 1:
            raise BatchlabError(f"BatchSizeSchedule callback needs exactly one optimizer, got {len(trainer.optimizers)}")
        self._micro = self._resolve_micro(trainer)
        self._world = trainer.world_size
        self._check_reachable(self._micro, self._world)
        groups = trainer.optimizers[0].param_groups
        if self._base_lrs is None or len(self._base_lrs) != len(groups):
            if self.base_lr is not None:
                self._base_lrs = [self.base_lr] * len(groups)
            else:
                self._base_lrs = [float(g["lr"]) for g in groups]
        if isinstance(self.rule, dict) and self._base_lrs[0] == 0 and len(groups) > 1:
            raise BatchlabError("BatchSizeSchedule callback: a learning-rate table needs a nonzero first group lr "
                                "to keep the other groups' ratios")
        self.accumulation = self._accumulation_for(self.schedule.batch_size_at(self.consumed)) \
            if self.accumulation is None else self.accumulation
        trainer.accumulate_grad_batches = self.accumulation
        self._pos, self._step_units = 0, 0

    def _accumulation_for(self, batch_size: int) -> int:
        return _schedule.accumulation_steps(batch_size, self._per_pass(self._micro), self._world)

    def batch_size_in_effect(self) -> int:
        """The nominal batch size of the current step: k x micro-batch x world size (examples or tokens)."""
        return self.accumulation * self._per_pass(self._micro) * self._world

    def learning_rates(self, batch_size: int, consumed: int) -> list[float]:
        """Each parameter group's learning rate for a step of ``batch_size`` after ``consumed``:
        ``base_lr x lr_schedule(consumed) x factor(batch_size)``."""
        shape = 1.0 if self.lr_schedule is None else float(self.lr_schedule(consumed))
        if not math.isfinite(shape) or shape < 0:
            raise BatchlabError(f"lr_schedule({consumed}) returned {shape!r}; it must be a finite number >= 0")
        if isinstance(self.rule, dict):
            peak = self.rule[batch_size]
            return [peak * (b / self._base_lrs[0] if self._base_lrs[0] else 1.0) * shape for b in self._base_lrs]
        return [_schedule.rescaled_learning_rate(b, self.base_batch_size, batch_size, self.rule) * shape
                for b in self._base_lrs]

    # -- the step -----------------------------------------------------------------------------------

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._pos == 0:
            target = self._accumulation_for(self.schedule.batch_size_at(self.consumed))
            if target != self.accumulation and batch_idx % target == 0:
                self.accumulation = target
                trainer.accumulate_grad_batches = target
            if trainer.accumulate_grad_batches != self.accumulation:
                raise BatchlabError(f"trainer.accumulate_grad_batches was changed to {trainer.accumulate_grad_batches} "
                                    f"outside the BatchSizeSchedule callback (it set {self.accumulation})")
            self.lr = self.learning_rates(self.batch_size_in_effect(), self.consumed)
            for group, lr in zip(trainer.optimizers[0].param_groups, self.lr):
                group["lr"] = lr
        self._pos += 1
        if self.tokens_fn is not None:
            # an int, or anything with __index__ (a 0-dim integer tensor such as mask.sum())
            units = checked_int("tokens_fn's token count (its return value)", self.tokens_fn(batch), 0)
        else:
            units = _examples_in(batch, self.batch_size_fn) * (self.tokens_per_example or 1)
        self._step_units += units

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer) -> None:
        if self._pos == 0:
            return
        units = self._step_units
        if self._world > 1:
            # int64: exact for any count (float32 is exact only to 2^24)
            total = trainer.strategy.reduce(torch.tensor(units, dtype=torch.int64, device=trainer.strategy.root_device),
                                            reduce_op="sum")
            units = int(total)
        record = {"step": self.steps, "consumed": self.consumed, "batch_size": units,
                  "accumulate_grad_batches": self.accumulation, "micro_batches": self._pos, "lr": list(self.lr)}
        self.history.append(record)
        if trainer.loggers:
            metrics = {"batch_size": units, "accumulate_grad_batches": self.accumulation, "consumed": self.consumed,
                       "lr": self.lr[0]}
            metrics.update({f"lr/group{i}": lr for i, lr in enumerate(self.lr) if i > 0})
            _log(pl_module, {self.prefix + k: v for k, v in metrics.items()})
        self.consumed += units
        self.steps += 1
        self._pos, self._step_units = 0, 0

    # -- checkpoints --------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {"consumed": self.consumed, "steps": self.steps, "accumulation": self.accumulation,
                "base_lrs": self._base_lrs, "schedule": self.schedule.to_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        if state_dict.get("schedule") != self.schedule.to_dict():
            raise BatchlabError("BatchSizeSchedule callback: the checkpoint was written with a different batch-size schedule")
        self.consumed = int(state_dict["consumed"])
        self.steps = int(state_dict["steps"])
        self.accumulation = state_dict.get("accumulation")
        self._base_lrs = state_dict.get("base_lrs")


__all__ = ["BatchSizeSchedule", "NoiseScaleCallback"]
