"""Vectorized trials: K trials of one study trained as one batched computation.

For a small model a CPU training step is dominated by per-operation overhead, not arithmetic, so
running K trials (same architecture and batch size, different metaparameters and seeds) as one
computation removes most of it: the K parameter sets are stacked (``torch.func.stack_module_state``)
and one step computes all K batch losses and gradients. Each trial keeps its own learning rate and
schedule, optimizer state, data order (its own :class:`batchlab.train.sampling.BatchSampler`) and
divergence monitor. A trial that stops (diverged, a non-finite evaluation, the goal reached with
``stop_at_goal``, or stopped by racing) is dropped from the stacked state, so the others go on at a
smaller K.

How one step is computed (:class:`StackedTrials`):

* **Batches.** With each trial's own batch order (the default) the K batches are stacked
  ``(K, B, ...)``. With a **shared batch order** (every spec has the same ``data_order_seed``,
  :func:`shared_order_seed`) all K trials draw the same batches, so ONE batch ``(B, ...)`` is
  gathered per step and fed to all of them.
* **The fused path** (a multilayer perceptron: an ``nn.Sequential`` of an optional ``Flatten`` then
  ``Linear``/``ReLU`` layers ending in a ``Linear``, with exactly those layers' parameters, no buffers
  and no hooks, the built-in ``fc_*`` workloads, :func:`~batchlab.sweep.fused_mlp.mlp_layers`): with a
  shared order the first layer of the K models is one matrix product ``(B, d) x (d, K*h)`` (its weight
  gradient one ``(K*h, B) x (B, d)``); the other layers (and the first with own orders) are batched
  products whose backward uses ``torch.nn.Linear``'s own products (``_BatchedLinear``); one loss per
  trial on its own outputs; the gradients one ``torch.autograd.grad`` of the losses' sum (trial k's loss
  depends only on trial k's parameters, so each trial gets exactly its own gradient). Every trial thus
  runs the same operations it runs alone; whether they also round the same is up to the kernels torch
  and its BLAS pick, which depend on the products' sizes, the CPU's instruction set and the thread
  count: on many CPUs a trial's gradients, updates and measurements equal its sequential run's **to
  the bit** for products large enough (the built-in ``fc_*`` workloads at their usual batch sizes),
  while for small layers (``N x in x out`` below about 400 on torch 2.13), on other CPUs or with
  several threads the batched products round differently. So bit-identity is not assumed but
  measured on each machine (the exactness self-check,
  :func:`~batchlab.sweep.vectorize_choice.vectorized_identical`).
* **Other models**: one ``torch.func.vmap`` of ``grad_and_value(functional_call(...))`` over the
  stacked parameters and the stacked batches (a shared batch unbatched, ``in_dims=None``); batched
  and unbatched products round differently, so these agree with sequential runs up to rounding.
* **Evaluation**: at a *full* evaluation step (every split measured, the same examples for every
  trial) the K models are evaluated together (:func:`measure_stacked`: inference mode, each
  evaluation batch through the K models at once, the fused forward for an MLP, else ``vmap`` of
  ``functional_call``), each trial's metric sums taken by the workload's task
  (``workload.task.batch_sums``) exactly as ``batchlab.train.evaluation.measure`` streams them.
  Goal-only steps and the replay's goal measurements measure one trial at a time, as goal checks
  (``batchlab.train.evaluation.measure_goal``, as :func:`batchlab.train.run_trial` does).

The contract is :func:`batchlab.train.run_trial`'s, step for step, because both are written on the
same core (:mod:`batchlab.train.core`): the same loop (``train_loop``), the same batches (the
workload's training split on the trial's device; a shared order gives every sequential trial the
same batches too), the same divergence rule, the same evaluation schedule and metrics, the same
bookkeeping (``TrialProgress``: statuses, ``STOPPED_AT_GOAL``, the brackets
``(steps_lower, steps_to_goal]``), racing, and the same replay of the bracket where the goal is first
met (``replay_bracket``, here for all trials that first meet it at one evaluation together, from a
copy of the stacked state). The update rules are the optimizer registry's vectorized updates
(``batchlab.optim.get_optimizer(name).vectorized``: torch.optim's operations written out, because
torch.optim cannot hold a per-trial learning rate on stacked parameters; given the learning rates
and hyperparameters in float64, as here, they round as torch.optim does). The fused path is exact
to the bit on the CPU where the exactness self-check says so (above); otherwise, and always for
``vmap``, vectorized trials agree with sequential runs up to floating-point rounding, which the
tests bound.

Whether vectorizing pays is measured, not assumed
(:func:`~batchlab.sweep.vectorize_choice.vectorization_pays`): a few steps and one evaluation batch of
both paths are timed on copies, and the cheaper per trial wins, only where the self-check found the
vectorized results equal to the sequential ones, to the bit, on this machine, so that the choice never
changes a result (``vectorize = "always"`` forces the vectorized path, exact or not; the sweep then
records a difference in the study definition: :func:`batchlab.sweep.vectorize_plan.mark_inexact_vectorization`).

Supported: optimizers whose registry entry has a ``vectorized`` update
(:func:`batchlab.optim.vectorized_optimizer_names`: sgd, momentum, nesterov, adam); any
learning-rate schedule (linear decay, warmup), ``weight_decay``; ``label_smoothing`` when all K
trials share it; models without buffers that change in training (no batch norm running statistics),
whose buffers are the same in every trial, and without randomness in the forward pass (no dropout).
Not supported: ``ema_decay``, other optimizers, and other models. :func:`run_trials_vectorized`
checks all of it, the model by one trial step of all K trials on copies before training, and raises
:class:`NotVectorizable`; a sweep's worker then runs those trials one at a time
(:func:`batchlab.sweep.worker.run_task`). On a GPU the stacked state, the batches and the
evaluations are on the trials' device (all K share one).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from batchlab.errors import BatchlabError
from batchlab.optim.schedules import learning_rate_multiplier
from batchlab.sweep.fused_mlp import mlp_forward, mlp_layers
from batchlab.train import TrialResult, TrialSpec, prepare_trial
from batchlab.train.core import batch_source, evaluate_trials, replay_bracket, replay_steps, train_loop
from batchlab.train.device import fork_rng
from batchlab.train.divergence import DivergenceMonitor
from batchlab.train.evaluation import measure, measure_goal, with_bound_flags
from batchlab.train.sampling import BatchSampler
from batchlab.train.trial import new_progress, new_racer, order_seed, trial_result

__all__ = [
    "NotVectorizable", "StackedTrials", "eval_batch_size", "measure_stacked", "run_trials_vectorized",
    "shared_order_seed", "vectorization_obstacle",
]


class NotVectorizable(BatchlabError):
    """The trials cannot run as one vectorized computation (the message says why); they can run one
    at a time (:func:`batchlab.train.run_trial`)."""


def vectorization_obstacle(specs: list[TrialSpec]) -> str | None:
    """Why ``specs`` cannot run as one vectorized computation, or ``None`` if they can.

    They must share workload, optimizer (one with a vectorized update in the registry), batch size,
    step budget, training set, evaluation schedule (explicit steps, resolution, evaluations,
    evaluation budget, refine mode), ``stop_at_goal``, ``goal``, device and ``label_smoothing``, and
    use no weight EMA. Their batch orders may differ (a shared one is faster: the module docstring).
    """
    from batchlab.optim import get_optimizer, vectorized_optimizer_names

    if not specs:
        return "no trials"
    first = specs[0]
    shared = ("workload", "optimizer", "batch_size", "steps", "train_examples", "data_seed", "stop_at_goal",
              "goal", "resolution", "evaluations", "eval_budget", "refine", "device")
    for spec in specs[1:]:
        for name in shared:
            if getattr(spec, name) != getattr(first, name):
                return f"trials differ in {name}"
        if list(spec.evaluation_steps or []) != list(first.evaluation_steps or []):
            return "trials differ in evaluation_steps"
    if get_optimizer(first.optimizer).vectorized is None:
        return f"optimizer {first.optimizer!r} is not vectorized (vectorized: {', '.join(vectorized_optimizer_names())})"
    smoothing = {float(s.hyperparameters.get("label_smoothing") or 0.0) for s in specs}
    if len(smoothing) > 1:
        return "trials differ in label_smoothing"
    if any(s.hyperparameters.get("ema_decay") is not None for s in specs):
        return "ema_decay is not vectorized"
    return None


def shared_order_seed(specs: list[TrialSpec]) -> int | None:
    """The batch-order seed all ``specs`` share (every ``data_order_seed`` the same int), else ``None``
    (each trial draws its own batches). With a shared order the K trials are fed one batch per step."""
    seeds = {spec.data_order_seed for spec in specs}
    if len(seeds) != 1 or None in seeds:
        return None
    return int(seeds.pop())


def _schedule(hyper: dict[str, Any], total: int) -> tuple[float, int | None, float, int]:
    """``(learning_rate, decay_steps, end_factor, warmup_steps)`` of one trial's resolved hyperparameters."""
    decay = hyper["learning_rate_decay_steps"]
    if decay is None and hyper["end_learning_rate_factor"] is not None:
        decay = total
    return hyper["learning_rate"], decay, hyper["end_learning_rate_factor"] or 0.0, hyper["warmup_steps"]


# --- the stacked computation ------------------------------------------------------------------------------


class StackedTrials:
    """K prepared trials (:func:`batchlab.train.prepare_trial`) as one stacked computation: their
    stacked parameters, buffers and optimizer state, the batch of a step, one update, the forward pass
    of all K on one input. What :func:`run_trials_vectorized` runs and
    :func:`~batchlab.sweep.vectorize_choice.vectorization_costs` times.

    ``shared``: the trials share one batch order (:func:`shared_order_seed`); ``fused``: the model is
    an MLP computed by the fused path (:func:`~batchlab.sweep.fused_mlp.mlp_layers`), else ``vmap``;
    ``exact``: each trial runs its sequential operations (the fused path on the CPU), which round alike
    when torch picks the same kernels (measured by
    :func:`~batchlab.sweep.vectorize_choice.vectorization_costs`, not promised). Raises
    :class:`NotVectorizable` when the models cannot be stacked or the model cannot run vectorized
    (``check``: one training step and one evaluation forward pass of all K on copies, the module
    docstring).
    """

    def __init__(self, prepared: list, check: bool = True) -> None:
        from batchlab.optim import get_optimizer

        first = prepared[0]
        self.prepared = prepared
        self.workload, self.device, total = first.workload, first.device, first.steps
        self.batch_size = batch_size = int(first.spec.batch_size)
        self.batch = batch_source(first.train, self.device)
        self.update_rule = get_optimizer(first.spec.optimizer).vectorized
        label_smoothing = float(first.parameters.get("label_smoothing") or 0.0)
        self.hyper = [dict(p.algorithm.hyperparameters) for p in prepared]  # resolved: every hyperparameter with its value
        self.schedules = [_schedule(h, total) for h in self.hyper]
        self.samplers = [BatchSampler(p.num_train, batch_size, order_seed(p.spec)) for p in prepared]
        self.shared = shared_order_seed([p.spec for p in prepared]) is not None

        models = [p.model for p in prepared]
        try:
            params, buffers = torch.func.stack_module_state(models)
        except Exception as exc:  # e.g. a model class defined inside make_model: one class per trial
            raise NotVectorizable(f"cannot vectorize these trials: {' '.join(str(exc).split())}") from exc
        self.params = {k: v.detach() for k, v in params.items()}
        self.buffers = buffers
        self.opt_state: dict[str, dict[str, torch.Tensor]] = {
            name: {k: torch.zeros_like(v) for k, v in self.params.items()} for name in self.update_rule.state_names
        }
        self.eval_model = copy.deepcopy(models[0])  # one trial at a time: goal-only steps, replays
        mlp = mlp_layers(models[0]) if not buffers else None
        self.fused = mlp is not None
        workload, shared = self.workload, self.shared

        def loss(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return workload.loss(outputs, y, label_smoothing=label_smoothing)

        if self.fused:
            def grad_and_loss(p, b, x, y):
                # one loss per trial on its own (N, out) outputs, as the trial alone computes it
                leaves = {name: value.detach().requires_grad_() for name, value in p.items()}
                with torch.enable_grad():
                    outputs = mlp_forward(mlp, leaves, x, shared)
                    targets = [y] * len(outputs) if shared else y
                    losses = torch.stack([loss(out, target) for out, target in zip(outputs, targets)])
                    grads = torch.autograd.grad(losses.sum(), list(leaves.values()))
                return dict(zip(leaves, grads)), losses.detach()

            self.grad_and_loss = grad_and_loss
            self.forward = lambda p, b, x: mlp_forward(mlp, p, x)
        else:
            base = copy.deepcopy(models[0]).to("meta")
            eval_base = copy.deepcopy(models[0]).to("meta").eval()

            def batch_loss(p, b, x, y):
                return loss(torch.func.functional_call(base, (p, b), (x,)), y)

            in_dims = (0, 0, None, None) if shared else (0, 0, 0, 0)
            self.grad_and_loss = torch.func.vmap(torch.func.grad_and_value(batch_loss), in_dims=in_dims)
            self.forward = torch.func.vmap(
                lambda p, b, x: torch.func.functional_call(eval_base, (p, b), (x,)), in_dims=(0, 0, None))
        if check:
            first_batch = self.batch_of(list(range(len(prepared))), 0)
            _check_model(self.grad_and_loss, self.params, self.buffers, first_batch, self.device)
            x = first_batch[0] if self.shared else first_batch[0][0]
            try:  # the evaluation's forward pass too (measure_stacked: one input for all K)
                with fork_rng(self.device), torch.inference_mode():
                    self.forward(self.params, {k: v.clone() for k, v in self.buffers.items()}, x)
            except Exception as exc:
                reason = " ".join(str(exc).split()) or type(exc).__name__
                raise NotVectorizable(f"cannot vectorize these trials: their model does not evaluate under "
                                      f"torch.func.vmap ({reason})") from exc

    @property
    def exact(self) -> bool:
        """Whether each trial runs exactly its sequential operations: the fused MLP path on the CPU. Its
        results then equal its run alone to the bit where torch picks the same CPU kernels for the
        batched products as for ``torch.nn.Linear``'s, which depends on their sizes (not for small
        layers): ``batchlab.sweep.vectorize_choice.VectorizationCost.exact`` measures it, this property
        does not promise it."""
        return self.fused and self.device.type == "cpu"

    def batch_of(self, trials: list[int], step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of update ``step`` of ``trials``: one ``(B, ...)`` batch with a shared order, else
        their batches stacked ``(K, B, ...)``."""
        if self.shared:
            return self.batch(self.samplers[trials[0]].indices(step))
        flat = torch.stack([self.samplers[i].indices(step) for i in trials]).reshape(-1)
        x, y = self.batch(flat)
        k, b = len(trials), self.batch_size
        return x.reshape(k, b, *x.shape[1:]), y.reshape(k, b, *y.shape[1:])

    def advance(self, params: dict, buffers: dict, opt_state: dict, trials: list[int], step: int,
                gradients: list | None = None) -> list[float]:
        """One update (``step`` is 0-based) of the stacked ``trials`` (rows of ``params``...) in place;
        their batch losses. ``gradients``: a list the step's stacked gradients are appended to."""
        x, y = self.batch_of(trials, step)
        grads, losses = self.grad_and_loss(params, buffers, x, y)
        if gradients is not None:
            gradients.append(grads)
        hyper, schedules, device = self.hyper, self.schedules, self.device
        # float64 (where the device has it): the update rounds each value where torch.optim rounds its
        # Python float (batchlab.optim.vectorized), so a trial's update is its torch optimizer's, to the bit
        dtype = torch.float32 if device.type == "mps" else torch.float64
        lr = torch.tensor(
            [schedules[i][0] * learning_rate_multiplier(step, *schedules[i][1:]) for i in trials],
            dtype=dtype, device=device,
        )

        def column(name: str) -> torch.Tensor:
            return torch.tensor([hyper[i][name] for i in trials], dtype=dtype, device=device)

        with torch.no_grad():
            self.update_rule.update(params, grads, opt_state, lr, column, step + 1,
                                    any(hyper[i]["weight_decay"] for i in trials))
        return losses.tolist()

    def evaluates_together(self) -> bool:
        """Whether full evaluations can go through :func:`measure_stacked`: the workload evaluates with
        its task's batch sums (``Workload.evaluate`` itself, not a subclass's own)."""
        from batchlab.workloads.base import Workload

        return getattr(type(self.workload), "evaluate", None) is Workload.evaluate

    def measure_rows(self, params: dict, buffers: dict, splits: dict) -> list[dict[str, float]]:
        """:func:`measure_stacked` of the stacked ``params`` on ``splits``: one metrics dict per row,
        in the evaluation batches a single trial's model (``eval_model``) is measured in."""
        return measure_stacked(self.workload, lambda x: self.forward(params, buffers, x), splits, self.device,
                               model=self.eval_model)

    def measure_row(self, params: dict, row: int, splits: dict, goal: float | None = None) -> dict[str, float]:
        """The model in row ``row`` of ``params`` alone (copied into ``eval_model``) measured on ``splits``:
        ``measure``, or with ``goal`` a goal check (``measure_goal``: stopped once the goal's outcome is
        decided, a bound then flagged in the row, as a sequential trial's goal-only steps and replays)."""
        with torch.no_grad():
            for name, p in self.eval_model.named_parameters():
                p.copy_(params[name][row])
        if goal is not None:
            return with_bound_flags(*measure_goal(self.workload, self.eval_model, splits, goal))
        return measure(self.workload, self.eval_model, splits)


def measure_stacked(workload: Any, forward: Callable[[torch.Tensor], torch.Tensor], splits: dict[str, Any],
                    device: torch.device | str = "cpu", model: nn.Module | None = None) -> list[dict[str, float]]:
    """Evaluate K models together: ``forward(x)`` gives their outputs ``(K, N, ...)`` on one input batch
    ``x`` (``(N, ...)``); returns K dicts ``{"<split>/<metric>": value}``, each what
    :func:`batchlab.train.evaluation.measure` gives for that model, from the same batches with the
    same per-batch sums and float64 accumulation: equal to the bit when ``forward`` gives each model's
    outputs to the bit (the fused MLP path where torch picks the same kernels:
    ``batchlab.sweep.vectorize_choice.VectorizationCost.exact``), else up to floating-point rounding of the outputs.

    Per split (a :class:`batchlab.workloads.data.DataSplit` or an ``(x, y)`` pair), as
    ``Workload.evaluate`` streams it (:func:`batchlab.workloads.metrics.evaluate_split`): the
    workload's fixed subset (``eval_examples``, :func:`batchlab.workloads.metrics.prepared_split`),
    consecutive batches of ``eval_batch_size`` (when the workload sets none, the default rule's batch
    for ``model``, one of the K models' architecture: the batches a sequential evaluation uses) moved
    to ``device``, each model's ``workload.task.batch_sums`` of its outputs summed
    (:func:`batchlab.workloads.metrics.accumulate_sums`: floating sums in float64, integers as
    integers), then ``total / count`` (:func:`batchlab.workloads.metrics.split_means`). Runs under
    ``torch.inference_mode``; ``forward`` must not depend on training mode (the stacked models have
    no dropout or batch norm).

    Raises:
        BatchlabError: an unknown or empty split (as ``measure``), or no ``eval_batch_size`` and no ``model``.
    """
    from batchlab.workloads.data import as_split
    from batchlab.workloads.metrics import accumulate_sums, check_split, prepared_split, split_means

    caps = workload.eval_examples or {}
    rows: list[dict[str, float]] | None = None
    with torch.inference_mode():
        for split, data in splits.items():
            part = prepared_split(as_split(data, check_split(split)), split, caps.get(split))  # as evaluate_split
            size = eval_batch_size(workload, model, part, device)
            totals: list[dict[str, Any]] = []
            counts: list[dict[str, Any]] = []
            for xb, yb in part.batches(size):
                xb, yb = xb.to(device), yb.to(device)
                outputs = forward(xb)
                if not totals:
                    totals, counts = [{} for _ in range(len(outputs))], [{} for _ in range(len(outputs))]
                for r in range(len(outputs)):
                    accumulate_sums(totals[r], counts[r], workload.task.batch_sums(outputs[r], yb))
            if rows is None:
                rows = [{} for _ in totals]
            for r, row in enumerate(rows):
                row.update(split_means(totals[r], counts[r], split))
    return rows or []


def eval_batch_size(workload: Any, model: nn.Module | None, part: Any, device: torch.device | str) -> int:
    """The evaluation batch of ``part`` (a DataSplit): the workload's ``eval_batch_size``, else the
    default rule's batch for ``model`` (:func:`batchlab.workloads.metrics.default_eval_batch_size`)."""
    if workload.eval_batch_size is not None:
        return int(workload.eval_batch_size)
    if model is None:
        raise BatchlabError("measure_stacked needs the model (one of the K) for the default evaluation batch")
    from batchlab.workloads.metrics import default_eval_batch_size

    return default_eval_batch_size(model, part.batch(torch.arange(1))[0].to(device))


def _check_model(grad_and_loss: Any, params: dict, buffers: dict, first_batch: tuple, device: torch.device) -> None:
    """Raise :class:`NotVectorizable` unless the stacked model trains correctly as one computation:
    its buffers are the same in every trial (evaluation uses one copy), and one step of every trial
    on ``first_batch``, run on copies of the buffers in a forked RNG state, neither fails under
    ``torch.func.vmap`` (randomness such as dropout does) nor changes a buffer (batch norm running
    statistics would never reach the evaluated model). Any exception of that step (a user's model
    raising under ``vmap``, say) becomes :class:`NotVectorizable`."""
    for name, stacked in buffers.items():
        if not all(torch.equal(stacked[0], row) for row in stacked[1:]):
            raise NotVectorizable(f"cannot vectorize these trials: their models differ in the buffer {name!r}")
    copies = {k: v.clone() for k, v in buffers.items()}
    try:
        with fork_rng(device):
            grad_and_loss(params, copies, *first_batch)
    except Exception as exc:  # whatever a user's model raises here: the trials run one at a time
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise NotVectorizable(f"cannot vectorize these trials: their model does not run under torch.func.vmap ({reason})") from exc
    changed = [name for name in buffers if not torch.equal(copies[name], buffers[name])]
    if changed:
        raise NotVectorizable(f"cannot vectorize these trials: training changes their model's buffers "
                              f"({', '.join(changed)}; batch norm running statistics?)")


def run_trials_vectorized(specs: list[TrialSpec], race: Any = None) -> list[TrialResult]:
    """Run ``specs`` as one vectorized computation; one :class:`TrialResult` per spec, in order.

    Writes nothing (the sweep's driver stores the results). ``wall_time_s`` of each result is the
    whole batched run's time divided by K (the cost per trial). ``race``: the
    :class:`batchlab.train.race.Race` of the specs' study (``None``: no racing): each evaluation
    stops, status ``RACED``, the trials that can no longer be among the study's best.

    Raises:
        NotVectorizable: the specs cannot be vectorized (:func:`vectorization_obstacle`), or their
            model cannot (randomness in the forward pass, buffers that training changes or that
            differ between the trials: the module docstring); nothing has been trained.
        BatchlabError: a spec is invalid (as :func:`batchlab.train.run_trial` would raise).
    """
    obstacle = vectorization_obstacle(specs)
    if obstacle is not None:
        raise NotVectorizable(f"cannot vectorize these trials: {obstacle}")
    prepared = [prepare_trial(spec) for spec in specs]  # validation, data, initial models: as run_trial
    first = prepared[0]
    total, device = first.steps, first.device
    stack = StackedTrials(prepared)
    params, buffers, opt_state = stack.params, stack.buffers, stack.opt_state

    progress = [new_progress(p) for p in prepared]
    # racing (batchlab.train.race): each evaluation stops the trials that can no longer be among the best
    racer = None if race is None else new_racer(race, first, {i: int(p.spec.trial_id or 0) for i, p in enumerate(prepared)})
    monitors = [DivergenceMonitor() for _ in prepared]
    together = stack.evaluates_together()  # full evaluations of all K at once (measure_stacked)

    active = list(range(len(specs)))  # row r of the stacked tensors is trial active[r]
    refine_steps = first.refine_steps  # the same for every trial (same budget, schedule and resolution)
    snapshot: dict | None = None  # stacked state at the last evaluation while some trial's goal is unmet

    def select(rows: list[int], p: dict, b: dict, o: dict) -> tuple[dict, dict, dict]:
        index = torch.tensor(rows, dtype=torch.long, device=device)
        return ({k: v.index_select(0, index) for k, v in p.items()},
                {k: v.index_select(0, index) for k, v in b.items()},
                {s: {k: v.index_select(0, index) for k, v in d.items()} for s, d in o.items()})

    def prune() -> bool:
        """Drop the stopped trials from the stacked state; True when none is left."""
        nonlocal params, buffers, opt_state, active
        if any(progress[i].stopped for i in active):
            keep = [r for r, i in enumerate(active) if not progress[i].stopped]
            params, buffers, opt_state = select(keep, params, buffers, opt_state)
            active = [active[r] for r in keep]
        return not active

    def take_snapshot(step: int) -> None:
        nonlocal snapshot
        if not replay_steps(refine_steps, step, first.steps + 1):  # no replay from here measures anything
            snapshot = {"step": step}
            return
        snapshot = {
            "step": step, "active": list(active),
            "params": {k: v.clone() for k, v in params.items()},
            "buffers": {k: v.clone() for k, v in buffers.items()},
            "opt_state": {s: {k: v.clone() for k, v in d.items()} for s, d in opt_state.items()},
        }

    def replay(reached: dict, upto: int) -> dict:
        """Train the snapshot's rows of the ``reached`` trials again towards ``upto``, measuring the goal
        split at the resolution steps strictly between, and at step 0 from the initial model
        (:func:`batchlab.train.core.replay_steps`, as :func:`batchlab.train.run_trial` does)."""
        begin = snapshot["step"]
        steps = replay_steps(refine_steps, begin, upto)
        if not steps:
            return {}
        trials = list(reached)
        rows = {i: r for r, i in enumerate(trials)}
        p, b, o = select([snapshot["active"].index(i) for i in trials],
                         snapshot["params"], snapshot["buffers"], snapshot["opt_state"])

        def measure_copy(i: int, step: int) -> dict[str, float]:  # a goal check, as run_trial's replay
            goal_split = prepared[i].goal_split
            return stack.measure_row(p, rows[i], {goal_split: prepared[i].eval_splits[goal_split]}, reached[i].goal)

        return replay_bracket(reached, steps, begin, lambda step: stack.advance(p, b, o, trials, step), measure_copy)

    def update(step: int) -> bool:
        losses = stack.advance(params, buffers, opt_state, active, step)
        for i, loss in zip(active, losses):
            progress[i].steps = step + 1
            if monitors[i].diverged(loss):
                progress[i].diverged()
        return prune()

    def evaluate(step: int) -> bool:
        rows = {i: r for r, i in enumerate(active)}
        measured: dict[int, dict[str, float]] = {}
        if together and step in first.full_steps and len(active) > 1:
            # a full step: every trial measures the same splits (same examples): all K at once
            measured = dict(zip(active, stack.measure_rows(params, buffers, first.splits_at(step))))

        def measure_one(i: int) -> dict[str, float]:
            if i in measured:
                return measured[i]
            # a dense goal-only step of a trial still searching is a goal check, as in run_trial
            goal = progress[i].goal if step not in first.full_steps and progress[i].searching else None
            return stack.measure_row(params, rows[i], prepared[i].splits_at(step), goal)

        evaluate_trials(step, [(i, progress[i]) for i in active], measure_one,
                        replay if refine_steps else None, racer)
        if refine_steps and any(progress[i].searching for i in active):
            take_snapshot(step)
        return prune()

    start = time.perf_counter()
    with fork_rng(device):
        torch.manual_seed(int(first.spec.seed))
        if refine_steps:
            take_snapshot(0)
        train_loop(total, first.schedule, update, evaluate)
    elapsed = time.perf_counter() - start
    return [trial_result(p, progress[i], trial_id=p.spec.trial_id, trial_key=p.spec.trial_key,
                         wall_time_s=elapsed / len(specs))
            for i, p in enumerate(prepared)]
