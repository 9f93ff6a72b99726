"""The gradient noise scale and batch-size schedules inside a Hugging Face ``transformers.Trainer``.

* :class:`NoiseScaleCallback` (a ``transformers.TrainerCallback``) keeps a
  :class:`batchlab.probes.tracker.NoiseScaleTracker` on the Trainer's model and adds its reading to the
  Trainer's own logs (the key set of :func:`batchlab.integrations.metrics.logged_metrics`, the same as
  the Lightning callback's: ``noise_scale/b_simple``, ``noise_scale/b_simple_low``,
  ``noise_scale/b_simple_high``, ``noise_scale/trace_sigma``, ``noise_scale/grad_norm_sq``, optionally
  ``noise_scale/layer/<layer>/trace_sigma`` and ``.../grad_norm_sq``), so they reach whatever
  ``TrainingArguments.report_to`` names (TensorBoard, Weights & Biases, ...) next to the loss.
  Install it with :func:`add_noise_scale_callback`, which puts it ahead of the reporting callbacks
  (a callback passed as ``Trainer(callbacks=[...])`` runs *after* them, too late to add to what they
  write).
* A callback cannot change the Trainer's batch size, so a batch-size schedule is followed by the data
  loader instead: :class:`ScheduledBatchSampler` yields, for optimizer step t, the
  ``gradient_accumulation_steps`` micro-batches of that step's batch size B_t (read from a
  :class:`batchlab.integrations.schedule.BatchSizeSchedule` at the examples consumed before the step),
  each split evenly over the data-parallel ranks, and :class:`ScheduledTrainer` (a ``Trainer``
  subclass) feeds it through ``get_train_dataloader``, sets ``max_steps`` to the schedule's number of
  steps for ``total_examples``, and replaces the learning-rate scheduler by one counted in examples:
  the learning rate of step t is ``learning_rate x shape(examples before t) x rule(B_t)``.

Counting (docs/methods.md, "The Hugging Face callback and schedules in ``transformers.Trainer``"): an
*optimizer step* is one ``optimizer.step()`` of the Trainer (``state.global_step``); its *examples*
are the rows (leading dimension) of all micro-batches of the step on all data-parallel processes.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator

import torch
import transformers
from torch.utils.data import DataLoader, Sampler
from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import ExportableState

from batchlab.errors import BatchlabError, checked_int, one_line, printable
from batchlab.integrations.metrics import check_resumed_settings, checked_options, logged_metrics
from batchlab.integrations.schedule import (
    BatchSizeSchedule,
    checked_rule,
    checked_tokens_per_example,
    coerce_schedule,
    rescaled_learning_rate,
)
from batchlab.probes.tracker import NoiseScaleTracker

#: The prefix of every key :class:`NoiseScaleCallback` adds to the Trainer's logs.
PREFIX = "noise_scale/"
#: Keys looked at first for a micro-batch's number of rows (its leading dimension).
_ROW_KEYS = ("input_ids", "labels", "inputs_embeds", "pixel_values", "input_values", "input_features")


def _reporting(args) -> list[str]:
    """The integrations ``args.report_to`` names (an empty list for ``"none"``)."""
    report_to = args.report_to
    if report_to is None:
        return []
    if isinstance(report_to, str):
        report_to = [report_to]
    return [r for r in report_to if r != "none"]


def _rows(args: tuple, kwargs: dict) -> int | None:
    """The leading dimension of a forward call's batch: the first of :data:`_ROW_KEYS` that is a tensor,
    else the first tensor argument; None when the call has no tensor with a dimension."""
    for key in _ROW_KEYS:
        value = kwargs.get(key)
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return None


def _trainable(model) -> bool:
    return model is not None and any(p.requires_grad for p in model.parameters())


class NoiseScaleCallback(TrainerCallback, ExportableState):
    """Logs the running gradient noise scale B_simple (examples) of a ``transformers.Trainer`` run.

    At ``on_train_begin`` a :class:`~batchlab.probes.tracker.NoiseScaleTracker` (``grad_at="backward"``)
    is attached to the Trainer's model and a forward pre-hook counts each training micro-batch's rows.
    The two batch sizes of the estimate are a micro-batch (its rows on one process) and the optimizer
    step's batch (all micro-batches, all processes): with ``per_device_train_batch_size`` m,
    ``gradient_accumulation_steps`` k and n processes, m and k m n examples. The step's big gradient
    is read at the end of its last backward pass, *before* the Trainer clips it (``max_grad_norm``, at
    the optimizer step) or unscales it (``fp16``), so the estimate does not depend on clipping. The
    loss factor passed as ``grad_scale`` is the scaler's scale (``fp16``) / k_t, k_t the step's
    micro-batches: the Trainer divides each micro-batch's loss by k_t (a model normalizing by
    ``num_items_in_batch`` divides by the step's item count, the same 1/k_t for micro-batches of equal
    counts), so ``trace_sigma`` and ``grad_norm_sq`` are those of the unscaled mean loss, as in the
    Lightning callback. The tracker is folded at ``on_optimizer_step``; a measured step whose
    micro-batches differ in size or number on any process (a short last batch of an epoch, a
    length-balancing sampler), that has one micro-batch on one process (one batch size), or whose
    update the gradient scaler skipped (inf/NaN gradients, ``optimizer.step_was_skipped``) is left
    out (:meth:`NoiseScaleTracker.discard`; the next step is measured instead) and counted in
    :attr:`skipped_steps` (the tracker's formula needs equal micro-batches).

    At each of the Trainer's log events (``logging_steps``) after a new measured step the reading
    (``tracker.reading(level)``) is added to the logs as
    :func:`batchlab.integrations.metrics.logged_metrics` (finite values only; ``noise_scale/b_simple``
    only when resolved; per layer only tr(Sigma) and |G|^2, which need no interval). They reach
    ``report_to`` only when this callback runs before the
    reporting callbacks: install it with :func:`add_noise_scale_callback`; ``on_train_begin`` raises
    when it was given as ``Trainer(callbacks=[...])`` while ``report_to`` names an integration. With
    ``report_to="none"`` nothing is written anywhere (the values stay in ``state.log_history`` and on
    :attr:`reading`).

    ``beta``, ``every``: as :class:`NoiseScaleTracker` (EMA decay per measured step, ``None`` for the
    plain mean; measure one step in ``every``). ``level``: the interval's coverage. Bad settings
    (a model without trainable parameters; ``gradient_accumulation_steps=1`` on one process, which
    gives only one batch size; ``restore_callback_states_from_checkpoint=True``, with which the
    Trainer would replace this callback by a new one behind the reporting callbacks) raise a one-line
    :class:`BatchlabError` when the Trainer is built or training starts.

    Checkpoints: an ``ExportableState``: :meth:`state` (the tracker's ``state_dict`` and
    :attr:`skipped_steps`) is written into each checkpoint's ``trainer_state.json``, and on
    ``train(resume_from_checkpoint=...)`` ``on_train_begin`` restores it into the new tracker from the
    resumed ``state.stateful_callbacks``, so the estimate continues where the checkpoint left it.
    """

    def __init__(self, *, beta: float | None = 0.99, every: int = 1, level: float = 0.9, per_layer: bool = False):
        self.every, self.beta, self.level = checked_options(every, beta, level)
        self.per_layer = bool(per_layer)
        self.tracker: NoiseScaleTracker | None = None
        self.skipped_steps = 0
        self.ahead_of_reporters = False  # set by add_noise_scale_callback
        self._model = None
        self._hook = None
        self._micro_rows: list[int] = []
        self._grad_scale = 1.0
        self._logged_steps = 0

    # -- checks -------------------------------------------------------------------------------------

    @staticmethod
    def _check(args, model) -> None:
        if model is not None and not _trainable(model):
            raise BatchlabError("NoiseScaleCallback: the model has no trainable parameters (requires_grad=False "
                                "everywhere); it measures gradients of a model being trained")
        if args.restore_callback_states_from_checkpoint:
            raise BatchlabError(
                "NoiseScaleCallback restores its own state on resume; set restore_callback_states_from_checkpoint="
                "False (with True the Trainer replaces it by a new callback behind the report_to callbacks)")
        if args.gradient_accumulation_steps < 2 and args.world_size < 2:
            raise BatchlabError(
                "NoiseScaleCallback needs two batch sizes per step, got gradient_accumulation_steps=1 on one process: "
                "set gradient_accumulation_steps >= 2 (e.g. halve per_device_train_batch_size and set it to 2) or train "
                "on >= 2 processes")

    def on_init_end(self, args, state, control, model=None, **kwargs):
        self._check(args, model)

    # -- training -----------------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._check(args, model)
        if model is None:
            raise BatchlabError("NoiseScaleCallback: the Trainer passed no model to on_train_begin")
        reporters = _reporting(args)
        if reporters and not self.ahead_of_reporters:
            raise BatchlabError(
                f"NoiseScaleCallback runs after the report_to callbacks ({', '.join(map(printable, reporters))}) and "
                "cannot add to what they log: install it with "
                "batchlab.integrations.huggingface.add_noise_scale_callback(trainer) instead of Trainer(callbacks=[...])")
        self.detach()
        self.tracker = NoiseScaleTracker(model, beta=self.beta, every=self.every, grad_at="backward")
        self.skipped_steps = 0
        saved = state.stateful_callbacks.get(type(self).__name__) if state.global_step > 0 else None
        if isinstance(saved, list):  # several callbacks of this class: the Trainer keeps a list
            saved = saved[0]
        if saved and saved.get("attributes", {}).get("tracker_state") is not None:  # resuming a checkpoint
            check_resumed_settings("NoiseScaleCallback", saved["attributes"]["tracker_state"], self.beta, self.every)
            self.tracker.load_state_dict(saved["attributes"]["tracker_state"])
            self.skipped_steps = int(saved["attributes"].get("skipped_steps", 0))
        self._model = model
        self._hook = model.register_forward_pre_hook(self._count_rows, with_kwargs=True)
        self._micro_rows = []
        self._logged_steps = 0

    def state(self) -> dict:
        """The ``ExportableState`` form the Trainer saves in checkpoints: the options as ``args``, the
        tracker's ``state_dict`` (JSON-able) and :attr:`skipped_steps` as ``attributes``."""
        return {"args": {"beta": self.beta, "every": self.every, "level": self.level, "per_layer": self.per_layer},
                "attributes": {"tracker_state": None if self.tracker is None else self.tracker.state_dict(),
                               "skipped_steps": self.skipped_steps}}

    def _count_rows(self, module, args, kwargs):
        if not module.training or not torch.is_grad_enabled():
            return
        rows = _rows(args, kwargs)
        if rows is None:
            raise BatchlabError("NoiseScaleCallback cannot count the examples of a micro-batch: the model's forward "
                                "got no tensor argument with a batch dimension")
        self._micro_rows.append(rows)
        return

    def on_step_begin(self, args, state, control, **kwargs):
        self._micro_rows = []

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        # the scale the step's gradients carried in backward (fp16); the scaler updates it in step()
        scaler = getattr(optimizer, "scaler", None)
        self._grad_scale = float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        tracker = self.tracker
        if tracker is None:
            return
        measured = tracker.calls % tracker.every == 0
        rows, self._micro_rows = self._micro_rows, []
        nominal = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        if not measured:  # the tracker only counts the call (nothing was recorded)
            tracker.update(self._model, batch_size=nominal, world_size=args.world_size)
            return
        k_min = k_max = len(rows)
        r_min, r_max = (min(rows), max(rows)) if rows else (0, 0)
        if args.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            import torch.distributed as dist

            device = torch.device("cpu") if dist.get_backend() == "gloo" else args.device
            t = torch.tensor([k_max, -k_min, r_max, -r_min], dtype=torch.int64, device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # every process takes the same decision
            k_max, k_min, r_max, r_min = (int(t[0]), -int(t[1]), int(t[2]), -int(t[3]))
        skipped = bool(getattr(optimizer, "step_was_skipped", False))
        # left out: a skipped update, unequal micro-batches, or one micro-batch on one process (one batch size)
        if skipped or not rows or k_min != k_max or r_min != r_max or k_max * args.world_size < 2:
            tracker.discard()
            self.skipped_steps += 1
            return
        # the Trainer divided each of the k micro-batches' losses by k (and fp16 multiplied by the scale)
        tracker.update(self._model, batch_size=k_max * r_max * args.world_size, world_size=args.world_size,
                       grad_scale=self._grad_scale / k_max)

    # -- logging ------------------------------------------------------------------------------------

    @property
    def reading(self) -> dict | None:
        """The tracker's reading (:meth:`NoiseScaleTracker.reading` at ``level``), None before training."""
        return None if self.tracker is None else self.tracker.reading(level=self.level)

    def logged_values(self) -> dict[str, float]:
        """The keys and finite values this callback logs now:
        :func:`batchlab.integrations.metrics.logged_metrics` of the reading (see the class docstring)."""
        if self.tracker is None or self.tracker.steps == 0:
            return {}
        return logged_metrics(self.tracker.reading(level=self.level),
                              self.tracker.per_layer if self.per_layer else None, PREFIX)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or self.tracker is None or self.tracker.steps <= self._logged_steps:
            return
        values = self.logged_values()
        self._logged_steps = self.tracker.steps
        logs.update(values)
        # Trainer.log appended a copy of ``logs`` to log_history before on_log: keep it the same
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(values)

    def on_train_end(self, args, state, control, **kwargs):
        self.detach()

    def detach(self) -> None:
        """Remove the tracker's hooks and the row counter (the reading stays)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.tracker is not None:
            self.tracker.remove()


def add_noise_scale_callback(trainer: Trainer, callback: NoiseScaleCallback | None = None, **options) -> NoiseScaleCallback:
    """Install ``callback`` (default: ``NoiseScaleCallback(**options)``) on ``trainer`` ahead of its
    reporting callbacks (first in ``trainer.callback_handler.callbacks``), so the values it adds to a
    log event reach ``report_to``; returns it. Checks the model and arguments now (one-line
    :class:`BatchlabError`)."""
    if callback is None:
        callback = NoiseScaleCallback(**options)
    elif options:
        raise BatchlabError("add_noise_scale_callback: pass either a callback or its options, not both")
    callback._check(trainer.args, trainer.model)
    callbacks = trainer.callback_handler.callbacks
    if callback in callbacks:
        callbacks.remove(callback)
    callbacks.insert(0, callback)
    callback.ahead_of_reporters = True
    return callback


# ---------------------------------------------------------------------------------------------------
# Batch-size schedules


def plan_batch_sizes(schedule, total: int) -> list[int]:
    """The batch size of every optimizer step that follows ``schedule`` (a :class:`BatchSizeSchedule`,
    its dict form or its file) until ``total`` examples (or tokens, the schedule's unit) are consumed:
    step t has B_t = ``schedule.batch_size_at(C_t)`` with C_t the sum of the batch sizes before it;
    steps are taken while C_t < ``total``, each in full, so the plan consumes ``total`` or up to one
    batch less than ``total`` + B_last."""
    schedule = coerce_schedule(schedule)
    total = checked_int("total_examples", total, 1)
    sizes, consumed = [], 0
    while consumed < total:
        b = schedule.batch_size_at(consumed)
        sizes.append(b)
        consumed += b
    return sizes


class ScheduledBatchSampler(Sampler[list[int]]):
    """Micro-batches of dataset indices whose optimizer-step batch size follows a batch-size schedule.

    ``schedule`` (a :class:`BatchSizeSchedule`, its dict form or its file; in examples, or in tokens
    with ``tokens_per_example``, the fixed length of every example) and ``total_examples`` (in the schedule's unit) give the plan
    :func:`plan_batch_sizes`: B_t examples at optimizer step t. Each step is
    ``micro_batches_per_step`` (the Trainer's ``gradient_accumulation_steps``) micro-batches of
    B_t / k examples over all ``world_size`` ranks; this rank's micro-batch is its ``rank``-th slice
    of B_t / (k n) examples, so every rank yields the same number of micro-batches of the same size.
    A batch size that k n does not divide is a one-line :class:`BatchlabError` at construction.

    Indices come from a stream of permutations of ``range(num_examples)`` (a ``torch.Generator``
    seeded with ``seed`` and the pass number), one after another, so a step can span two passes over
    the data; the order is the same on every rank and on every iteration (resuming at a step gives
    the same batches). ``len()`` is the number of micro-batches this rank yields (steps x k).
    """

    def __init__(self, schedule, *, num_examples: int, total_examples: int,
                 micro_batches_per_step: int = 1, world_size: int = 1, rank: int = 0, seed: int = 0,
                 shuffle: bool = True, tokens_per_example: int | None = None):
        self.num_examples = checked_int("num_examples (the training set's length)", num_examples, 1)
        self.micro_batches_per_step = checked_int("gradient_accumulation_steps", micro_batches_per_step, 1)
        self.world_size = checked_int("world_size", world_size, 1)
        self.rank = checked_int("rank", rank, 0)
        if self.rank >= self.world_size:
            raise BatchlabError(f"rank must be < world_size ({self.world_size}), got {self.rank}")
        self.seed = checked_int("seed", seed, 0)
        self.shuffle = bool(shuffle)
        schedule = coerce_schedule(schedule)
        #: tokens of one example (1 for a schedule in examples)
        self.tokens_per_example = checked_tokens_per_example(schedule, tokens_per_example) or 1
        self.schedule = schedule
        unit_sizes = plan_batch_sizes(schedule, total_examples)
        per_pass = self.micro_batches_per_step * self.world_size
        sizes = []
        for b in unit_sizes:
            if b % self.tokens_per_example:
                raise BatchlabError(f"batch size {b} tokens is not a whole number of {self.tokens_per_example}-token "
                                    "examples; use batch sizes that are multiples of tokens_per_example")
            examples = b // self.tokens_per_example
            if examples % per_pass:
                raise BatchlabError(
                    f"batch size {examples} examples cannot be split into gradient_accumulation_steps="
                    f"{self.micro_batches_per_step} x world_size={self.world_size} equal micro-batches; every batch size "
                    f"of the schedule must be a multiple of {per_pass}")
            sizes.append(examples)
        #: examples of each optimizer step, all ranks (the plan)
        self.step_batch_sizes: tuple[int, ...] = tuple(sizes)
        starts, consumed = [], 0
        for b in sizes:
            starts.append(consumed)
            consumed += b
        #: examples consumed before each optimizer step
        self.examples_before_step: tuple[int, ...] = tuple(starts)
        #: examples of the whole plan (all steps, all ranks)
        self.planned_examples = consumed

    @property
    def steps(self) -> int:
        """Optimizer steps in the plan."""
        return len(self.step_batch_sizes)

    def __len__(self) -> int:
        return self.steps * self.micro_batches_per_step

    def _stream(self) -> Iterator[int]:
        epoch = 0
        while True:
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                yield from torch.randperm(self.num_examples, generator=generator).tolist()
            else:
                yield from range(self.num_examples)
            epoch += 1

    def __iter__(self) -> Iterator[list[int]]:
        stream = self._stream()
        k, n = self.micro_batches_per_step, self.world_size
        for b in self.step_batch_sizes:
            micro = b // k
            share = micro // n
            for _ in range(k):
                indices = [next(stream) for _ in range(micro)]
                yield indices[self.rank * share:(self.rank + 1) * share]


class PlanLR(torch.optim.lr_scheduler.LRScheduler):
    """Learning rate of each parameter group = its initial rate x ``factors[step]``, ``step`` the
    Trainer's ``state.global_step`` set by :meth:`follow` at the start of each optimizer step.

    The rate follows the Trainer's step count, not the number of ``step()`` calls: the Trainer does
    not call ``lr_scheduler.step()`` after an update the fp16 gradient scaler skipped, while the
    batch sizes keep to the plan, so a counter of calls would fall behind them. ``step()`` (called
    by the Trainer after each update that ran) keeps the rate of the current step; past the plan
    the last factor holds. ``state_dict`` holds the step it follows."""

    def __init__(self, optimizer, factors):
        self.factors = tuple(float(f) for f in factors)
        self.plan_step = 0
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        factor = self.factors[min(self.plan_step, len(self.factors) - 1)]
        return [base * factor for base in self.base_lrs]

    def follow(self, global_step: int) -> None:
        """Set every group's rate for optimizer step ``global_step`` (before its first micro-batch)."""
        self.plan_step = int(global_step)
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


class _FollowPlanLR(TrainerCallback):
    """Moves a :class:`PlanLR` to ``state.global_step`` at the start of each optimizer step."""

    def on_step_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        if isinstance(lr_scheduler, PlanLR):
            lr_scheduler.follow(state.global_step)


class ScheduledTrainer(Trainer):
    """A ``transformers.Trainer`` whose batch size follows a :class:`BatchSizeSchedule` in examples.

    Extra keyword arguments (everything else is the Trainer's): ``batch_size_schedule``;
    ``total_examples`` (the training length in the schedule's unit; the Trainer runs
    :attr:`ScheduledBatchSampler.steps` optimizer steps, and ``max_steps`` must be left at -1 or equal
    that); ``lr_rule`` (``"linear"``, ``"sqrt"``, ``"none"`` or a table ``{batch_size: lr}``;
    :func:`~batchlab.integrations.schedule.rescaled_learning_rate`) with ``base_batch_size`` (the batch
    size ``learning_rate`` is right for; default the schedule's first); ``lr_schedule`` (a multiplier
    f(examples consumed), e.g. :func:`~batchlab.integrations.schedule.examples_lr_schedule`; default
    the Trainer's own ``lr_scheduler_type`` and ``warmup_steps`` (a fraction in [0, 1); whole steps do
    not mean a fixed amount of data under a ramp) evaluated in examples, from 0 to the plan's
    examples); ``tokens_per_example`` (a schedule in tokens); ``seed`` (data order; default
    ``args.data_seed`` or ``args.seed``).

    The learning rate of optimizer step t is ``learning_rate x f(C_t) x rule(B_t) / learning_rate``,
    i.e. ``f(C_t) x rescaled_learning_rate(learning_rate, base_batch_size, B_t, lr_rule)``, with C_t
    the examples before step t and B_t its batch size (a ``LambdaLR`` over the plan). The batches come
    from :class:`ScheduledBatchSampler` (``per_device_train_batch_size`` is not used for training);
    each training log also carries ``schedule/batch_size`` (B of the last step) and
    ``schedule/examples`` (examples consumed so far). Bad input (a schedule that is not increasing, a
    batch size that ``gradient_accumulation_steps`` x processes cannot split, a user scheduler, whole
    warmup steps, an iterable dataset) raises a one-line :class:`BatchlabError` at construction.
    """

    def __init__(self, *args, batch_size_schedule: BatchSizeSchedule, total_examples: int,
                 lr_rule="linear", base_batch_size: int | None = None,
                 lr_schedule: Callable[[int], float] | None = None, tokens_per_example: int | None = None,
                 seed: int | None = None, **kwargs):
        dataset = kwargs.get("train_dataset", args[3] if len(args) > 3 else None)
        if dataset is None or isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__len__"):
            raise BatchlabError("ScheduledTrainer needs a train_dataset with a length (a map-style dataset) to draw "
                                "scheduled batches from")
        super().__init__(*args, **kwargs)
        # max_steps is set below on the Trainer's own copy: the caller's TrainingArguments stay as given
        # (and can build a second ScheduledTrainer)
        self.args = targs = copy.copy(self.args)
        batch_size_schedule = coerce_schedule(batch_size_schedule)
        if self.lr_scheduler is not None:
            raise BatchlabError("ScheduledTrainer counts the learning-rate schedule in examples: pass no scheduler in "
                                "optimizers=(optimizer, None); give lr_schedule=f(examples) instead")
        if seed is None:
            seed = targs.data_seed if targs.data_seed is not None else targs.seed
        self.batch_sampler = ScheduledBatchSampler(
            batch_size_schedule, num_examples=len(self.train_dataset), total_examples=total_examples,
            micro_batches_per_step=targs.gradient_accumulation_steps, world_size=targs.world_size,
            rank=targs.process_index, seed=seed, tokens_per_example=tokens_per_example)
        steps = self.batch_sampler.steps
        if targs.max_steps > 0 and targs.max_steps != steps:
            raise BatchlabError(f"ScheduledTrainer sets max_steps from the schedule ({steps} steps for {total_examples} "
                                f"{batch_size_schedule.unit}); leave max_steps at -1, got {targs.max_steps}")
        targs.max_steps = steps
        sizes = self.batch_sampler.step_batch_sizes
        unit = self.batch_sampler.tokens_per_example
        rule = checked_rule(lr_rule, sorted({b * unit for b in sizes}))
        if base_batch_size is None:
            base_batch_size = batch_size_schedule.points[0][1]
        base_batch_size = checked_int("base_batch_size", base_batch_size, 1)
        base_lr = float(targs.learning_rate)
        if not base_lr > 0:
            raise BatchlabError(f"ScheduledTrainer needs learning_rate > 0, got {targs.learning_rate}")
        if lr_schedule is None:
            lr_schedule = self._trainer_lr_shape()
        elif not callable(lr_schedule):
            raise BatchlabError(f"lr_schedule must be a function of the examples consumed, got {one_line(repr(lr_schedule))}")
        #: learning-rate multiplier (of ``learning_rate``) of each optimizer step of the plan
        self.lr_factors: tuple[float, ...] = tuple(
            float(lr_schedule(c * unit)) * rescaled_learning_rate(base_lr, base_batch_size, b * unit, rule) / base_lr
            for c, b in zip(self.batch_sampler.examples_before_step, sizes))
        bad = [f for f in self.lr_factors if not (math.isfinite(f) and f >= 0)]
        if bad:
            raise BatchlabError(f"the learning-rate schedule gave a multiplier {bad[0]!r}; it must be a finite number >= 0")
        self.add_callback(_FollowPlanLR())

    def _trainer_lr_shape(self) -> Callable[[int], float]:
        """The Trainer's ``lr_scheduler_type`` as a multiplier of the examples (tokens) consumed."""
        targs = self.args
        if targs.warmup_steps >= 1:
            raise BatchlabError(
                f"ScheduledTrainer counts warmup in examples: warmup_steps={targs.warmup_steps} whole steps are not a "
                "fixed amount of data under a batch-size ramp; give it as a fraction in [0, 1) or pass lr_schedule="
                "examples_lr_schedule(..., warmup_examples=...)")
        kwargs = targs.lr_scheduler_kwargs or {}
        in_steps = sorted(k for k in kwargs if "step" in k or k == "timescale")
        if in_steps or str(getattr(targs.lr_scheduler_type, "value", targs.lr_scheduler_type)) == "inverse_sqrt":
            what = f"lr_scheduler_kwargs {', '.join(map(printable, in_steps))}" if in_steps else "inverse_sqrt's timescale"
            raise BatchlabError(
                f"ScheduledTrainer counts the learning-rate schedule in examples, but {what} counts optimizer steps, "
                "which are no fixed amount of data under a batch-size ramp; pass lr_schedule=f(examples) instead "
                "(batchlab.integrations.schedule.examples_lr_schedule)")
        total = self.batch_sampler.planned_examples * self.batch_sampler.tokens_per_example
        probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        scheduler = transformers.get_scheduler(
            targs.lr_scheduler_type, optimizer=probe, num_warmup_steps=targs.get_warmup_steps(total),
            num_training_steps=total, scheduler_specific_kwargs=targs.lr_scheduler_kwargs)
        lambdas = getattr(scheduler, "lr_lambdas", None)
        if not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR) or not lambdas or lambdas[0] is None:
            raise BatchlabError(f"ScheduledTrainer cannot count lr_scheduler_type={printable(str(targs.lr_scheduler_type))!r} "
                                "in examples (it is not a LambdaLR); use linear, cosine, constant, constant_with_warmup, "
                                "... or pass lr_schedule")
        return lambdas[0]

    def get_train_dataloader(self) -> DataLoader:
        """The training data loader: :attr:`batch_sampler`'s micro-batches, with the Trainer's collator
        (unused columns removed as the Trainer does) and worker settings, prepared by ``accelerate``
        with its batch-sampler sharding turned into a pass-through (the sampler is already rank-aware)."""
        dataset = self.train_dataset
        collator = self.data_collator
        try:
            import datasets

            is_hf_dataset = isinstance(dataset, datasets.Dataset)
        except ImportError:
            is_hf_dataset = False
        if is_hf_dataset:
            dataset = self._remove_unused_columns(dataset, description="Training")
        else:
            collator = self._get_collator_with_removed_columns(collator, description="Training")
        params = {"batch_sampler": self.batch_sampler, "collate_fn": collator,
                  "num_workers": self.args.dataloader_num_workers, "pin_memory": self.args.dataloader_pin_memory,
                  "persistent_workers": self.args.dataloader_persistent_workers}
        if self.args.dataloader_num_workers > 0:
            params["prefetch_factor"] = self.args.dataloader_prefetch_factor
            params["multiprocessing_context"] = self.args.dataloader_multiprocessing_context
        loader = self.accelerator.prepare(DataLoader(dataset, **params))
        prepared = getattr(loader, "batch_sampler", None)
        if prepared is not None and getattr(prepared, "batch_sampler", None) is self.batch_sampler:
            prepared.num_processes = 1
            prepared.process_index = 0
        return loader

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """A :class:`PlanLR` giving optimizer step t (``state.global_step``) the multiplier
        :attr:`lr_factors`[t] (the last one past the plan)."""
        if self.lr_scheduler is None:
            self.lr_scheduler = PlanLR(self.optimizer if optimizer is None else optimizer, self.lr_factors)
            self._created_lr_scheduler = True
        return self.lr_scheduler

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        step = self.state.global_step
        if step > 0:
            sampler = self.batch_sampler
            last = min(step, sampler.steps) - 1
            logs["schedule/batch_size"] = sampler.step_batch_sizes[last]
            logs["schedule/examples"] = sampler.examples_before_step[last] + sampler.step_batch_sizes[last]
        super().log(logs, *args, **kwargs)


__all__ = [
    "PREFIX",
    "NoiseScaleCallback",
    "PlanLR",
    "ScheduledBatchSampler",
    "ScheduledTrainer",
    "add_noise_scale_callback",
    "plan_batch_sizes",
]
