"""Vectorized trials: K trials of one study trained as one batched computation.

For a small model a CPU training step is dominated by per-operation overhead, not arithmetic, so
running K trials (same architecture and batch size, different metaparameters and seeds) as one
computation removes most of it: the K parameter sets are stacked (``torch.func.stack_module_state``)
and one ``torch.func.vmap`` of ``grad_and_value(functional_call(...))`` computes all K batch losses
and gradients per step. Each trial keeps its own learning rate and schedule, optimizer state, data
order (its own :class:`batchlab.train.sampling.BatchSampler`) and divergence monitor. A trial that
stops (diverged, a non-finite evaluation, or the goal reached with ``stop_at_goal``) is dropped from
the stacked state, so the others go on at a smaller K.

The contract is :func:`batchlab.train.run_trial`'s, step for step, because both are written on the
same core (:mod:`batchlab.train.core`): the same loop (``train_loop``), the same batches (the
workload's training split on the trial's device), the same divergence rule, the same evaluation
schedule and metrics (``batchlab.train.evaluation.measure`` on the same model class, one trial at a
time), the same bookkeeping (``TrialProgress``: statuses, ``STOPPED_AT_GOAL``, the brackets
``(steps_lower, steps_to_goal]``) and the same replay of the bracket where the goal is first met
(``replay_bracket``, here for all trials that first meet it at one evaluation together, from a copy
of the stacked state). The update rules are the optimizer registry's vectorized updates
(``batchlab.optim.get_optimizer(name).vectorized``: torch.optim's formulas written out, because
torch.optim cannot hold a per-trial learning rate on stacked parameters). Measurements agree with
sequential runs up to floating-point rounding (batched and unbatched matrix products round
differently), which the tests bound.

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
from typing import Any

import torch

from batchlab.errors import BatchlabError
from batchlab.optim.schedules import learning_rate_multiplier
from batchlab.train import TrialResult, TrialSpec, prepare_trial
from batchlab.train.core import batch_source, evaluate_trials, replay_bracket, train_loop
from batchlab.train.device import fork_rng
from batchlab.train.divergence import DivergenceMonitor
from batchlab.train.evaluation import measure
from batchlab.train.sampling import BatchSampler
from batchlab.train.trial import new_progress, trial_result


class NotVectorizable(BatchlabError):
    """The trials cannot run as one vectorized computation (the message says why); they can run one
    at a time (:func:`batchlab.train.run_trial`)."""


def vectorization_obstacle(specs: list[TrialSpec]) -> str | None:
    """Why ``specs`` cannot run as one vectorized computation, or ``None`` if they can.

    They must share workload, optimizer (one with a vectorized update in the registry), batch size,
    step budget, training set, evaluation schedule (explicit steps, resolution, evaluations,
    evaluation budget, refine mode), ``stop_at_goal``, ``goal``, device and ``label_smoothing``, and
    use no weight EMA.
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


def _schedule(hyper: dict[str, Any], total: int) -> tuple[float, int | None, float, int]:
    """``(learning_rate, decay_steps, end_factor, warmup_steps)`` of one trial's resolved hyperparameters."""
    decay = hyper["learning_rate_decay_steps"]
    if decay is None and hyper["end_learning_rate_factor"] is not None:
        decay = total
    return hyper["learning_rate"], decay, hyper["end_learning_rate_factor"] or 0.0, hyper["warmup_steps"]


def _check_model(grad_and_loss: Any, params: dict, buffers: dict, first_batch: tuple, device: torch.device) -> None:
    """Raise :class:`NotVectorizable` unless the stacked model trains correctly as one computation:
    its buffers are the same in every trial (evaluation uses one copy), and one step of every trial
    on ``first_batch``, run on copies of the buffers in a forked RNG state, neither fails under
    ``torch.func.vmap`` (randomness such as dropout does) nor changes a buffer (batch norm running
    statistics would never reach the evaluated model)."""
    for name, stacked in buffers.items():
        if not all(torch.equal(stacked[0], row) for row in stacked[1:]):
            raise NotVectorizable(f"cannot vectorize these trials: their models differ in the buffer {name!r}")
    copies = {k: v.clone() for k, v in buffers.items()}
    try:
        with fork_rng(device):
            grad_and_loss(params, copies, *first_batch)
    except RuntimeError as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise NotVectorizable(f"cannot vectorize these trials: their model does not run under torch.func.vmap ({reason})") from exc
    changed = [name for name in buffers if not torch.equal(copies[name], buffers[name])]
    if changed:
        raise NotVectorizable(f"cannot vectorize these trials: training changes their model's buffers "
                              f"({', '.join(changed)}; batch norm running statistics?)")


def run_trials_vectorized(specs: list[TrialSpec]) -> list[TrialResult]:
    """Run ``specs`` as one vectorized computation; one :class:`TrialResult` per spec, in order.

    Writes nothing (the sweep's driver stores the results). ``wall_time_s`` of each result is the
    whole batched run's time divided by K (the cost per trial).

    Raises:
        NotVectorizable: the specs cannot be vectorized (:func:`vectorization_obstacle`), or their
            model cannot (randomness in the forward pass, buffers that training changes or that
            differ between the trials: the module docstring); nothing has been trained.
        BatchlabError: a spec is invalid (as :func:`batchlab.train.run_trial` would raise).
    """
    from batchlab.optim import get_optimizer

    obstacle = vectorization_obstacle(specs)
    if obstacle is not None:
        raise NotVectorizable(f"cannot vectorize these trials: {obstacle}")
    prepared = [prepare_trial(spec) for spec in specs]  # validation, data, initial models: as run_trial
    first = prepared[0]
    workload, total, device = first.workload, first.steps, first.device
    batch_size = int(first.spec.batch_size)
    batch = batch_source(first.train, device)
    update_rule = get_optimizer(first.spec.optimizer).vectorized
    label_smoothing = float(first.parameters.get("label_smoothing") or 0.0)

    progress = [new_progress(p) for p in prepared]
    hyper = [dict(p.algorithm.hyperparameters) for p in prepared]  # resolved: every hyperparameter with its value
    schedules = [_schedule(h, total) for h in hyper]
    samplers = [BatchSampler(p.num_train, batch_size, int(p.spec.seed)) for p in prepared]
    monitors = [DivergenceMonitor() for _ in prepared]

    models = [p.model for p in prepared]
    try:
        params, buffers = torch.func.stack_module_state(models)
    except RuntimeError as exc:  # e.g. a model class defined inside make_model: one class per trial
        raise NotVectorizable(f"cannot vectorize these trials: {' '.join(str(exc).split())}") from exc
    params = {k: v.detach() for k, v in params.items()}
    base = copy.deepcopy(models[0]).to("meta")
    eval_model = copy.deepcopy(models[0])

    def batch_loss(p, b, x, y):
        outputs = torch.func.functional_call(base, (p, b), (x,))
        return workload.loss(outputs, y, label_smoothing=label_smoothing)

    grad_and_loss = torch.func.vmap(torch.func.grad_and_value(batch_loss))

    def stacked_batch(trials: list[int], step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batches of update ``step`` of ``trials``, stacked: ``(K, batch_size, ...)``."""
        flat = torch.stack([samplers[i].indices(step) for i in trials]).reshape(-1)
        x, y = batch(flat)
        return x.reshape(len(trials), batch_size, *x.shape[1:]), y.reshape(len(trials), batch_size, *y.shape[1:])

    _check_model(grad_and_loss, params, buffers, stacked_batch(list(range(len(specs))), 0), device)
    opt_state: dict[str, dict[str, torch.Tensor]] = {
        name: {k: torch.zeros_like(v) for k, v in params.items()} for name in update_rule.state_names
    }
    active = list(range(len(specs)))  # row r of the stacked tensors is trial active[r]
    refine_steps = first.refine_steps  # the same for every trial (same budget, schedule and resolution)
    snapshot: dict | None = None  # stacked state at the last evaluation while some trial's goal is unmet

    def advance(params, buffers, opt_state, trials: list[int], step: int) -> list[float]:
        """One update (``step`` is 0-based) of the stacked ``trials`` in place; their batch losses."""
        x, y = stacked_batch(trials, step)
        grads, losses = grad_and_loss(params, buffers, x, y)
        lr = torch.tensor(
            [schedules[i][0] * learning_rate_multiplier(step, *schedules[i][1:]) for i in trials],
            dtype=torch.float32, device=device,
        )

        def column(name: str) -> torch.Tensor:
            return torch.tensor([hyper[i][name] for i in trials], dtype=torch.float32, device=device)

        with torch.no_grad():
            update_rule.update(params, grads, opt_state, lr, column, step + 1, any(hyper[i]["weight_decay"] for i in trials))
        return losses.tolist()

    def measure_row(stacked: dict, row: int, splits) -> dict[str, float]:
        with torch.no_grad():
            for name, p in eval_model.named_parameters():
                p.copy_(stacked[name][row])
        return measure(workload, eval_model, splits)

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
        snapshot = {
            "step": step, "active": list(active),
            "params": {k: v.clone() for k, v in params.items()},
            "buffers": {k: v.clone() for k, v in buffers.items()},
            "opt_state": {s: {k: v.clone() for k, v in d.items()} for s, d in opt_state.items()},
        }

    def replay(reached: dict, upto: int) -> dict:
        """Train the snapshot's rows of the ``reached`` trials again towards ``upto``, measuring the goal
        split at the resolution steps strictly between (as :func:`batchlab.train.run_trial` does)."""
        begin = snapshot["step"]
        steps = [s for s in refine_steps if begin < s < upto]
        if not steps:
            return {}
        trials = list(reached)
        rows = {i: r for r, i in enumerate(trials)}
        p, b, o = select([snapshot["active"].index(i) for i in trials],
                         snapshot["params"], snapshot["buffers"], snapshot["opt_state"])

        def measure_copy(i: int, step: int) -> dict[str, float]:
            goal_split = prepared[i].goal_split
            return measure_row(p, rows[i], {goal_split: prepared[i].eval_splits[goal_split]})

        return replay_bracket(reached, steps, begin, lambda step: advance(p, b, o, trials, step), measure_copy)

    def update(step: int) -> bool:
        losses = advance(params, buffers, opt_state, active, step)
        for i, loss in zip(active, losses):
            progress[i].steps = step + 1
            if monitors[i].diverged(loss):
                progress[i].diverged()
        return prune()

    def evaluate(step: int) -> bool:
        rows = {i: r for r, i in enumerate(active)}
        evaluate_trials(step, [(i, progress[i]) for i in active],
                        lambda i: measure_row(params, rows[i], prepared[i].splits_at(step)),
                        replay if refine_steps else None)
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
