"""Vectorized trials: K trials of one study trained as one batched computation.

For a small model a CPU training step is dominated by per-operation overhead, not arithmetic, so
running K trials (same architecture and batch size, different metaparameters and seeds) as one
computation removes most of it: the K parameter sets are stacked (``torch.func.stack_module_state``)
and one ``torch.func.vmap`` of ``grad_and_value(functional_call(...))`` computes all K batch losses
and gradients per step. Each trial keeps its own learning rate and schedule, momentum / Adam state,
data order (its own ``batch_indices`` seed) and divergence monitor. A trial that stops (diverged, a
non-finite evaluation, or the goal reached with ``stop_at_goal``) is dropped from the stacked state,
so the others go on at a smaller K.

The contract is :func:`batchlab.train.run_trial`'s, step for step: the same batches, the same update
rules (torch.optim's ``SGD``/``Adam`` formulas, written out here because torch.optim cannot hold a
per-trial learning rate on stacked parameters), the same divergence rule, the same evaluation
schedule and metrics (``batchlab.train.evaluation.measure`` on the same model class, one trial at a
time: every split at full steps, the goal split at resolution steps, with the same replay of the
bracket where the goal is first met, here for all trials that first meet it at one evaluation
together, from a copy of the stacked state), the same statuses
(``STOPPED_AT_GOAL`` for a trial stopped at the goal before its budget) and the same brackets
``(steps_lower, steps_to_goal]``. Measurements agree with sequential runs up to floating-point rounding
(batched and unbatched matrix products round differently), which the tests bound.

Supported: optimizers ``sgd``, ``momentum``, ``nesterov``, ``adam``; any learning-rate schedule
(linear decay, warmup), ``weight_decay``; ``label_smoothing`` when all K trials share it; models
without buffers that change in training (no batch norm). Not supported (run sequentially):
``ema_decay``, other optimizers.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from batchlab.optim.schedules import learning_rate_multiplier
from batchlab.train import TrialResult, TrialSpec, prepare_trial
from batchlab.train.trial import trial_goal
from batchlab.train.divergence import DivergenceMonitor
from batchlab.train.evaluation import bracket, goal_reached, measure
from batchlab.train.sampling import _batch_indices_unchecked

VECTORIZED_OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam")


def vectorization_obstacle(specs: list[TrialSpec]) -> str | None:
    """Why ``specs`` cannot run as one vectorized computation, or ``None`` if they can.

    They must share workload, optimizer (one of :data:`VECTORIZED_OPTIMIZERS`), batch size, step
    budget, training set, evaluation schedule (explicit steps, resolution, evaluations, evaluation
    budget, refine mode), ``stop_at_goal``, ``goal`` and ``label_smoothing``, and use no weight EMA.
    """
    if not specs:
        return "no trials"
    first = specs[0]
    shared = ("workload", "optimizer", "batch_size", "steps", "train_examples", "data_seed", "stop_at_goal",
              "goal", "resolution", "evaluations", "eval_budget", "refine")
    for spec in specs[1:]:
        for name in shared:
            if getattr(spec, name) != getattr(first, name):
                return f"trials differ in {name}"
        if list(spec.evaluation_steps or []) != list(first.evaluation_steps or []):
            return "trials differ in evaluation_steps"
    if first.optimizer not in VECTORIZED_OPTIMIZERS:
        return f"optimizer {first.optimizer!r} is not vectorized (vectorized: {', '.join(VECTORIZED_OPTIMIZERS)})"
    smoothing = {float(s.hyperparameters.get("label_smoothing") or 0.0) for s in specs}
    if len(smoothing) > 1:
        return "trials differ in label_smoothing"
    if any(s.hyperparameters.get("ema_decay") is not None for s in specs):
        return "ema_decay is not vectorized"
    return None


@dataclass
class _TrialState:
    """Bookkeeping of one trial inside the vectorized loop."""

    spec: TrialSpec
    hyper: dict[str, Any]
    decay_steps: int | None
    monitor: DivergenceMonitor
    status: str = "COMPLETE"
    steps: int = 0
    steps_to_goal: int | None = None
    steps_lower: int | None = None
    stopped: bool = False


def run_trials_vectorized(specs: list[TrialSpec]) -> list[TrialResult]:
    """Run ``specs`` as one vectorized computation; one :class:`TrialResult` per spec, in order.

    Writes nothing (the sweep's driver stores the results). ``wall_time_s`` of each result is the
    whole batched run's time divided by K (the cost per trial).

    Raises:
        BatchlabError: a spec is invalid (as :func:`batchlab.train.run_trial` would raise), or the
            specs cannot be vectorized (:func:`vectorization_obstacle`).
    """
    from batchlab.errors import BatchlabError

    obstacle = vectorization_obstacle(specs)
    if obstacle is not None:
        raise BatchlabError(f"cannot vectorize these trials: {obstacle}")
    prepared = [prepare_trial(spec) for spec in specs]  # validation, data, initial models: as run_trial
    first = prepared[0]
    workload, total, schedule = first.workload, first.steps, first.schedule
    batch_size, num_train = int(first.spec.batch_size), first.num_train
    per_epoch = num_train // batch_size
    train_x, train_y = first.train_x, first.train_y
    optimizer = first.spec.optimizer
    label_smoothing = float(first.parameters.get("label_smoothing") or 0.0)
    metric, goal, maximize = workload.metric, trial_goal(first.spec, workload), bool(workload.maximize)

    states = []
    for p in prepared:
        hyper = dict(p.algorithm.hyperparameters)  # resolved: every hyperparameter with its value
        decay = hyper["learning_rate_decay_steps"]
        if decay is None and hyper["end_learning_rate_factor"] is not None:
            decay = total
        states.append(_TrialState(spec=p.spec, hyper=hyper, decay_steps=decay, monitor=DivergenceMonitor()))

    models = [p.model for p in prepared]
    params, buffers = torch.func.stack_module_state(models)
    params = {k: v.detach() for k, v in params.items()}
    base = copy.deepcopy(models[0]).to("meta")
    eval_model = copy.deepcopy(models[0])
    measurements: list[list[dict[str, float]]] = [[] for _ in specs]

    def batch_loss(p, b, x, y):
        logits = torch.func.functional_call(base, (p, b), (x,))
        return workload.loss(logits, y, label_smoothing=label_smoothing)

    grad_and_loss = torch.func.vmap(torch.func.grad_and_value(batch_loss))
    state_names = {"sgd": (), "momentum": ("buf",), "nesterov": ("buf",), "adam": ("exp_avg", "exp_avg_sq")}
    opt_state: dict[str, dict[str, torch.Tensor]] = {
        name: {k: torch.zeros_like(v) for k, v in params.items()} for name in state_names[optimizer]
    }
    active = list(range(len(specs)))  # row r of the stacked tensors is trial active[r]
    refine_steps = first.refine_steps  # the same for every trial (same budget, schedule and resolution)
    snapshot: dict | None = None  # stacked state at the last evaluation while some trial's goal is unmet

    def advance(params, buffers, opt_state, trials: list[int], step: int) -> list[float]:
        """One update (``step`` is 0-based) of the stacked ``trials`` in place; their batch losses."""
        rows = torch.stack([
            _batch_indices_unchecked(num_train, batch_size, int(states[i].spec.seed), step, per_epoch)
            for i in trials
        ])
        flat = rows.reshape(-1)
        x = train_x.index_select(0, flat).reshape(len(trials), batch_size, *train_x.shape[1:])
        y = train_y.index_select(0, flat).reshape(len(trials), batch_size, *train_y.shape[1:])
        grads, losses = grad_and_loss(params, buffers, x, y)
        lr = torch.tensor(
            [states[i].hyper["learning_rate"] * learning_rate_multiplier(
                step, states[i].decay_steps, states[i].hyper["end_learning_rate_factor"] or 0.0,
                states[i].hyper["warmup_steps"]) for i in trials],
            dtype=torch.float32,
        )

        def column(name: str) -> torch.Tensor:
            return torch.tensor([states[i].hyper[name] for i in trials], dtype=torch.float32)

        with torch.no_grad():
            _update(optimizer, params, grads, opt_state, lr, column, step + 1,
                    any(states[i].hyper["weight_decay"] for i in trials))
        return losses.tolist()

    def measure_row(stacked: dict, row: int, splits) -> dict[str, float]:
        with torch.no_grad():
            for name, p in eval_model.named_parameters():
                p.copy_(stacked[name][row])
        return measure(workload, eval_model, splits)

    def take_snapshot(step: int) -> None:
        nonlocal snapshot
        snapshot = {
            "step": step, "active": list(active),
            "params": {k: v.clone() for k, v in params.items()},
            "buffers": {k: v.clone() for k, v in buffers.items()},
            "opt_state": {s: {k: v.clone() for k, v in d.items()} for s, d in opt_state.items()},
        }

    def replay(trials: list[int], upto: int) -> dict[int, tuple[list[dict[str, float]], int | None]]:
        """Train the snapshot's rows of ``trials`` again towards ``upto``, measuring the goal split at the
        resolution steps strictly between (as :func:`batchlab.train.trial.run_prepared` does)."""
        found: dict[int, tuple[list[dict[str, float]], int | None]] = {i: ([], None) for i in trials}
        targets = [s for s in refine_steps if snapshot["step"] < s < upto]
        if not targets:
            return found
        index = torch.tensor([snapshot["active"].index(i) for i in trials], dtype=torch.long)
        p = {k: v.index_select(0, index) for k, v in snapshot["params"].items()}
        b = {k: v.index_select(0, index) for k, v in snapshot["buffers"].items()}
        o = {s: {k: v.index_select(0, index) for k, v in d.items()} for s, d in snapshot["opt_state"].items()}
        searching, step = set(trials), snapshot["step"]
        for target in targets:
            while step < target:
                advance(p, b, o, trials, step)
                step += 1
            for row, i in enumerate(trials):
                if i not in searching:
                    continue
                metrics = measure_row(p, row, {prepared[i].goal_split: prepared[i].eval_splits[prepared[i].goal_split]})
                found[i][0].append({"step": target, **metrics})
                if not all(math.isfinite(v) for v in metrics.values()):
                    searching.discard(i)
                elif metric in metrics and goal_reached(metrics[metric], goal, maximize):
                    found[i] = (found[i][0], target)
                    searching.discard(i)
            if not searching:
                break
        return found

    def evaluate(step: int) -> None:
        rows: dict[int, dict[str, float]] = {}
        newly = []
        for row, i in enumerate(active):
            if states[i].stopped:  # diverged at this very step: run_trial stops before evaluating
                continue
            metrics = measure_row(params, row, prepared[i].splits_at(step))
            rows[i] = {"step": step, **metrics}
            state = states[i]
            if not all(math.isfinite(v) for v in metrics.values()):
                measurements[i].append(rows[i])
                state.status, state.stopped = "INFEASIBLE", True
            elif state.steps_to_goal is None and metric in metrics and goal_reached(metrics[metric], goal, maximize):
                newly.append(i)
            else:
                measurements[i].append(rows[i])
        refined = replay(newly, step) if newly and snapshot is not None else {}
        for i in newly:
            state = states[i]
            found_rows, found = refined.get(i, ([], None))
            measurements[i].extend(found_rows)
            if found is not None:
                state.steps_to_goal = found
                state.steps_lower = bracket([snapshot["step"]] + [m["step"] for m in measurements[i]], found)
                if state.spec.stop_at_goal:  # stopped where a run measuring every resolution step would have
                    state.status, state.stopped, state.steps = "STOPPED_AT_GOAL", True, found
                    continue
            measurements[i].append(rows[i])
            if state.steps_to_goal is None:
                state.steps_to_goal = step
                state.steps_lower = bracket([m["step"] for m in measurements[i]], step)
            if state.spec.stop_at_goal:
                state.stopped = True
                if step < total:
                    state.status = "STOPPED_AT_GOAL"
        if refine_steps and any(states[i].steps_to_goal is None and not states[i].stopped for i in active):
            take_snapshot(step)

    start = time.perf_counter()
    next_eval_index = 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(first.spec.seed))
        if refine_steps:
            take_snapshot(0)
        if schedule and schedule[0] == 0:
            evaluate(0)
            next_eval_index = 1
        step = 0
        while active and step < total:
            if any(states[i].stopped for i in active):
                keep = [r for r, i in enumerate(active) if not states[i].stopped]
                index = torch.tensor(keep, dtype=torch.long)
                params = {k: v.index_select(0, index) for k, v in params.items()}
                buffers = {k: v.index_select(0, index) for k, v in buffers.items()}
                opt_state = {s: {k: v.index_select(0, index) for k, v in d.items()} for s, d in opt_state.items()}
                active = [active[r] for r in keep]
                if not active:
                    break
            losses = advance(params, buffers, opt_state, active, step)
            step += 1
            for i, loss in zip(active, losses):
                state = states[i]
                state.steps = step
                if state.monitor.diverged(loss):
                    state.status, state.stopped = "INFEASIBLE", True
            if next_eval_index < len(schedule) and step == schedule[next_eval_index]:
                next_eval_index += 1
                evaluate(step)
    elapsed = time.perf_counter() - start

    results = []
    for i, p in enumerate(prepared):
        state = states[i]
        results.append(
            TrialResult(
                workload=p.store_workload, batch_size=batch_size, trial_id=p.spec.trial_id,
                trial_key=p.spec.trial_key, parameters=dict(p.parameters), seed=int(p.spec.seed),
                status=state.status, steps=state.steps, steps_to_goal=state.steps_to_goal,
                measurements=measurements[i], wall_time_s=elapsed / len(specs),
                metric=metric, goal=goal, maximize=maximize, steps_lower=state.steps_lower,
                resolution=p.resolution, study_definition=p.study_definition,
            )
        )
    return results


def _update(optimizer: str, params: dict, grads: dict, opt_state: dict, lr: torch.Tensor, column, step: int,
            weight_decay: bool) -> None:
    """One in-place update of the stacked ``params`` (rows = trials) with torch.optim's formulas.

    ``lr`` is the per-trial learning rate of this update, ``step`` the 1-based update count (Adam's
    bias correction). Formulas: ``torch.optim.SGD`` (dampening 0; the momentum buffer starts at the
    first gradient, i.e. at zero before it) and ``torch.optim.Adam`` (non-fused).
    """
    k = lr.shape[0]

    def per_trial(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return values.reshape(k, *([1] * (like.dim() - 1)))

    wd = column("weight_decay") if weight_decay else None
    if optimizer in ("momentum", "nesterov", "adam"):
        mom = column("momentum" if optimizer != "adam" else "beta1")
    if optimizer == "adam":
        beta2, eps = column("beta2"), column("epsilon")
    for name, p in params.items():
        g = grads[name]
        if wd is not None:
            g = g + per_trial(wd, p) * p
        # addcmul fuses "multiply by a per-trial factor, then add" into one pass over the parameters:
        # the update is memory-bound for small models, so fewer passes is what makes it fast.
        if optimizer == "sgd":
            p.addcmul_(per_trial(lr, p), g, value=-1.0)
        elif optimizer in ("momentum", "nesterov"):
            buf = opt_state["buf"][name]
            torch.addcmul(g, buf, per_trial(mom, p), out=buf)
            direction = torch.addcmul(g, buf, per_trial(mom, p)) if optimizer == "nesterov" else buf
            p.addcmul_(per_trial(lr, p), direction, value=-1.0)
        else:
            m, v = opt_state["exp_avg"][name], opt_state["exp_avg_sq"][name]
            b1, b2 = per_trial(mom, p), per_trial(beta2, p)
            m.lerp_(g, 1.0 - b1)
            v.mul_(b2).add_((1.0 - b2) * g * g)
            bias1 = 1.0 - mom.double() ** step
            bias2_sqrt = torch.sqrt(1.0 - beta2.double() ** step)
            step_size = (lr.double() / bias1).float()
            denom = v.sqrt() / per_trial(bias2_sqrt.float(), p) + per_trial(eps, p)
            p.sub_(per_trial(step_size, p) * m / denom)
