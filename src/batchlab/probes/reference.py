"""A reference run and fixed probe batches: where and on what the probes measure.

Contract (docs/methods.md, "Probes"):

* :func:`reference_checkpoints` trains **one** run with batchlab's own trial machinery
  (:func:`batchlab.train.trial.prepare_trial` builds the data, model and training algorithm exactly as
  ``batchlab train`` does; the updates are the trial's: batches from
  :class:`batchlab.train.sampling.BatchSampler` with the trial's seed, ``algorithm.step`` per update,
  in-loop randomness from torch's generator seeded with ``seed`` inside a forked RNG state) and yields
  a :class:`Checkpoint` after ``t`` updates for each ``t`` in ``steps_at``. The parameters at step
  ``t`` are bitwise those of ``batchlab train WORKLOAD --optimizer O --batch-size B --learning-rate LR
  --seed S`` after ``t`` updates on the CPU (``data_seed`` defaults to ``seed``, as for ``batchlab
  train``); evaluations never change a trial's trajectory, so none are run. Its step budget (the
  length of a decaying schedule) is ``steps``, by default the workload's ``default_steps``, extended to
  the last requested step when that lies beyond it.
* A checkpoint holds a copy of the model (the run's live weights, not an EMA of them), so a consumer
  may keep, modify or train it; the reference run goes on unaffected. Between checkpoints the run
  keeps its own RNG state, so what the consumer draws from torch's generator changes neither.
* :func:`probe_batches` gives fixed probe batches: ``examples`` training examples (of the same
  training data the reference run uses: the ``train_examples`` subset drawn with ``data_seed``),
  drawn without replacement by their own seeded generator, independent of the run's batch order,
  the same at every checkpoint, cut into consecutive batches of ``batch_size`` (the last holds the
  remainder), with the workload's loss (mean over examples, the run's label smoothing).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from batchlab.errors import BatchlabError, increasing_ints

__all__ = ["ADAM_LIKE", "Checkpoint", "ProbeBatches", "ReferenceCheckpoints", "ReferenceRun", "check_steps_at", "probe_batches",
           "reference_checkpoints"]

#: Optimizers whose update is the gradient in a diagonal metric ``1 / (sqrt(v_hat) + epsilon)``
#: (``v_hat`` Adam's bias-corrected second-moment EMA): their checkpoints carry it as ``preconditioner``.
ADAM_LIKE = ("adam", "adamw")

#: The stream of the probe examples' generator: ``SeedSequence([seed, PROBE_STREAM])`` ("probe" in ASCII).
PROBE_STREAM = 0x70726F6265


@dataclass(frozen=True)
class ReferenceRun:
    """What defines a reference run: the trial ``batchlab train`` runs with these settings.

    ``hyperparameters``: as given (checked by the optimizer), ``learning_rate`` included; ``steps``:
    its step budget; ``device``: where it trains."""

    workload: str
    optimizer: str
    batch_size: int
    hyperparameters: dict[str, Any]
    seed: int
    data_seed: int
    train_examples: int | None
    steps: int
    device: str

    def to_dict(self) -> dict[str, Any]:
        return {"workload": self.workload, "optimizer": self.optimizer, "batch_size": self.batch_size,
                "hyperparameters": dict(self.hyperparameters), "seed": self.seed, "data_seed": self.data_seed,
                "train_examples": self.train_examples, "steps": self.steps, "device": self.device}


@dataclass
class Checkpoint:
    """The reference run after ``step`` updates.

    ``model``: a copy of the model (live weights, train mode); ``loss_fn(outputs, targets)``: the
    run's batch mean loss (label smoothing included); ``learning_rate``: the next update's (schedule
    applied); ``batch_loss``: the loss of the last update's batch, before that update (``None`` at step
    0); ``preconditioner``: for :data:`ADAM_LIKE` optimizers after at least one update, ``{parameter
    name: 1 / (sqrt(v_hat) + epsilon)}`` (shapes of the parameters), else ``None``;
    ``optimizer_state``: a copy of ``optimizer.state_dict()``; ``run``: the :class:`ReferenceRun`."""

    step: int
    model: torch.nn.Module
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    learning_rate: float
    batch_loss: float | None
    preconditioner: dict[str, torch.Tensor] | None
    optimizer_state: dict = field(repr=False)
    run: ReferenceRun


@dataclass(frozen=True)
class ProbeBatches:
    """Fixed probe batches (module docstring). Iterating gives the ``(inputs, targets)`` pairs.

    ``indices``: the drawn training-example indices (into the run's training data, in batch order);
    ``loss_fn(outputs, targets)``: the workload's batch mean loss."""

    batches: list
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    examples: int
    batch_size: int
    indices: torch.Tensor = field(repr=False)
    seed: int = 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class ReferenceCheckpoints:
    """The iterator :func:`reference_checkpoints` returns: its :class:`Checkpoint` objects in step order,
    with ``run`` (the :class:`ReferenceRun`), ``steps_at`` (the checked steps) and ``num_train`` (the
    run's training examples) known before any training."""

    def __init__(self, checkpoints: Iterator[Checkpoint], run: ReferenceRun, steps_at: list[int], num_train: int) -> None:
        self._checkpoints, self.run, self.steps_at, self.num_train = checkpoints, run, list(steps_at), int(num_train)

    def __iter__(self) -> "ReferenceCheckpoints":
        return self

    def __next__(self) -> Checkpoint:
        return next(self._checkpoints)


def check_steps_at(steps_at: Any) -> list[int]:
    """``steps_at`` as a list of ints: non-empty, each >= 0, strictly increasing; else a one-line
    BatchlabError naming the rule."""
    return increasing_ints("steps_at", steps_at, 0, item="step")


def _loss_function(workload: Any, label_smoothing: float) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return workload.loss(outputs, targets, label_smoothing=label_smoothing)

    return loss_fn


def reference_checkpoints(workload: Any, optimizer: str, batch_size: int, hyperparameters: dict[str, Any],
                          steps_at: Sequence[int], seed: int = 0, train_examples: int | None = None, *,
                          steps: int | None = None, data_seed: int | None = None,
                          device: str = "auto") -> Iterator[Checkpoint]:
    """Train the reference run and yield a :class:`Checkpoint` after each step of ``steps_at``
    (module docstring).

    Everything is validated, and the data and model built, before this returns (the iterator only
    trains): ``workload`` is what :func:`batchlab.workloads.resolve_workload` accepts; ``optimizer``,
    ``batch_size``, ``hyperparameters`` (``learning_rate`` required by most optimizers), ``seed``,
    ``train_examples`` and ``device`` are a trial's (:class:`batchlab.train.TrialSpec`).

    Raises:
        BatchlabError: bad ``steps_at`` (not increasing integers >= 0), anything
            :func:`batchlab.train.trial.prepare_trial` refuses (unknown workload or optimizer, batch size
            outside ``1..num_train``, bad hyperparameters); during iteration, a run that diverges
            (loss non-finite or far above its start, :class:`batchlab.train.divergence.DivergenceMonitor`)
            before the next requested step.
    """
    from batchlab.train.trial import TrialSpec, order_seed, prepare_trial
    from batchlab.workloads import resolve_workload

    wanted = check_steps_at(steps_at)
    resolved = resolve_workload(workload)
    budget = max(resolved.default_steps, wanted[-1]) if steps is None else steps
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < max(wanted[-1], 1)):
        raise BatchlabError(f"steps (the reference run's budget) must be an integer >= the last requested step "
                            f"{wanted[-1]} (and >= 1), got {steps!r}")
    spec = TrialSpec(workload=resolved, optimizer=optimizer, batch_size=batch_size,
                     hyperparameters=dict(hyperparameters or {}), steps=max(int(budget), 1),
                     train_examples=train_examples, seed=seed, data_seed=seed if data_seed is None else data_seed,
                     stop_at_goal=False, evaluation_steps=[max(int(budget), 1)], device=device)
    prepared = prepare_trial(spec)
    run = ReferenceRun(workload=resolved.name, optimizer=str(optimizer), batch_size=int(batch_size),
                       hyperparameters=dict(prepared.parameters), seed=int(seed), data_seed=int(spec.data_seed),
                       train_examples=train_examples, steps=prepared.steps, device=str(prepared.device))
    return ReferenceCheckpoints(_train(prepared, wanted, run, order_seed(spec)), run, wanted, prepared.num_train)


def _train(prepared: Any, wanted: list[int], run: ReferenceRun, batch_seed: int) -> Iterator[Checkpoint]:
    """The reference run's loop: the trial's updates (:func:`batchlab.train.trial.run_prepared`'s hot
    loop, without evaluations), a checkpoint at each wanted step."""
    from batchlab.train.core import batch_source
    from batchlab.train.device import fork_rng, get_rng_state, set_rng_state
    from batchlab.train.divergence import DivergenceMonitor
    from batchlab.train.sampling import BatchSampler

    device, model, algorithm = prepared.device, prepared.model, prepared.algorithm
    sampler = BatchSampler(prepared.num_train, run.batch_size, batch_seed)
    batch = batch_source(prepared.train, device)
    monitor = DivergenceMonitor()
    label_smoothing = float(prepared.parameters.get("label_smoothing") or 0.0)
    loss_fn = _loss_function(prepared.workload, label_smoothing)
    with fork_rng(device):
        torch.manual_seed(run.seed)  # as run_prepared seeds the trial's in-loop randomness
        rng_state = get_rng_state(device)
    step, last_loss = 0, None
    for target in wanted:
        with fork_rng(device):
            set_rng_state(rng_state, device)
            while step < target:
                last_loss = algorithm.step(*batch(sampler.indices(step)))
                step += 1
                if monitor.diverged(last_loss):
                    raise BatchlabError(
                        f"the reference run diverged at step {step} (batch loss {last_loss:.4g}) before step {target}; "
                        f"lower the learning rate (now {run.hyperparameters.get('learning_rate')})")
            rng_state = get_rng_state(device)
        yield Checkpoint(step=step, model=copy.deepcopy(model), loss_fn=loss_fn, learning_rate=algorithm.learning_rate,
                         batch_loss=last_loss, preconditioner=_adam_preconditioner(model, algorithm),
                         optimizer_state=copy.deepcopy(algorithm.optimizer.state_dict()), run=run)


def _adam_preconditioner(model: torch.nn.Module, algorithm: Any) -> dict[str, torch.Tensor] | None:
    """Adam's diagonal metric (:func:`batchlab.probes.noise_scale.adam_preconditioner`) for an
    :data:`ADAM_LIKE` optimizer after at least one update, else ``None``."""
    if algorithm.name not in ADAM_LIKE or algorithm.steps_taken == 0:
        return None
    from batchlab.probes.noise_scale import adam_preconditioner

    return {name: p.clone() for name, p in adam_preconditioner(algorithm.optimizer, model).items()}


def probe_batches(workload: Any, examples: int, batch_size: int, seed: int = 0, *, train_examples: int | None = None,
                  data_seed: int = 0, label_smoothing: float = 0.0, device: str | torch.device = "cpu") -> ProbeBatches:
    """Fixed probe batches of training data and the workload's loss (module docstring).

    ``examples``: how many, ``1..num_train`` (of the ``train_examples`` subset when given, drawn with
    ``data_seed`` as the reference run's is); ``batch_size``: examples per batch (>= 1); ``seed``: which
    examples (their own generator, ``SeedSequence([seed, PROBE_STREAM])``); ``device``: where the
    batches live (the reference run's device).

    Raises:
        BatchlabError: unknown workload, ``examples`` outside ``1..num_train``, ``batch_size`` < 1.
    """
    from batchlab.train.core import batch_source, device_split
    from batchlab.train.device import resolve_device
    from batchlab.workloads import resolve_workload

    resolved = resolve_workload(workload)
    for name, value in (("examples", examples), ("batch size", batch_size), ("seed", seed)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < (0 if name == "seed" else 1):
            raise BatchlabError(f"probe {name} must be an integer >= {0 if name == 'seed' else 1}, got {value!r}")
    if not math.isfinite(float(label_smoothing)):
        raise BatchlabError(f"label_smoothing must be a finite number, got {label_smoothing!r}")
    where = resolve_device(device) if isinstance(device, str) else device
    train = resolved.load_data(train_examples=train_examples, seed=data_seed).train
    num_train = len(train)
    if examples > num_train:
        raise BatchlabError(f"probe examples must be in 1..{num_train} (the training examples of {resolved.name}"
                            f"{'' if train_examples is None else f' subset of {train_examples}'}), got {examples}")
    state = np.random.SeedSequence([int(seed), PROBE_STREAM]).generate_state(1, dtype=np.uint64)[0]
    generator = torch.Generator().manual_seed(int(state))
    indices = torch.randperm(num_train, generator=generator)[: int(examples)]
    source = batch_source(device_split(train, where), where)
    batches = [source(indices[i : i + int(batch_size)]) for i in range(0, int(examples), int(batch_size))]
    return ProbeBatches(batches=batches, loss_fn=_loss_function(resolved, float(label_smoothing)),
                        examples=int(examples), batch_size=int(batch_size), indices=indices, seed=int(seed))
