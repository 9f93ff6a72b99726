"""One trial: train one workload with one metaparameter point, measuring on a schedule.

Contract (see docs/internals.md):

* ``steps`` counts optimizer updates; a measurement at step ``t`` is taken after ``t`` updates.
* Batches come from :class:`batchlab.train.sampling.BatchSampler` with the trial's ``seed`` (indices on
  the CPU), turned into examples by the workload's training split (``data.train.batch(indices)``)
  and moved to the trial's device (:mod:`batchlab.train.device`; in-memory tensors are moved once).
* The loop, the evaluation bookkeeping and the replay are :mod:`batchlab.train.core`'s, shared with
  the vectorized trials of :mod:`batchlab.sweep.vectorized`.
* The model is initialised by ``workload.build_model(seed)``; any other randomness inside the loop
  (dropout, sampled curvature) draws from torch's global generator (and the device's), seeded with
  ``seed`` inside a forked RNG state, so the same spec gives identical measurements on one device and
  the caller's RNG is untouched.
* Evaluations (docs/methods.md, "Evaluation schedule and resolution"): every metric at the workload's
  full steps (dense early, regular later), and the goal metric at the resolution steps (consecutive
  steps within a factor ``1 + resolution``, every step while ``1 / resolution`` is larger), in one of
  two ways (``refine``):

  - ``"replay"`` (default): the trial keeps a copy of its state (model, optimizer, schedule, RNG) at
    each full evaluation until the goal is first met; when a full evaluation first meets it, the
    copy from the previous full evaluation is trained again (the same batches: the trial is
    deterministic) and the goal split measured at the resolution steps in between, up to the first
    one that meets the goal. Only the bracket of the workload's goal is refined; the extra cost is
    at most one full-schedule interval of training plus a few evaluations of the goal split, and
    only in trials that reach the goal.
  - ``"dense"``: the goal split is measured at every resolution step as the trial runs (every goal
    on the goal metric is then resolved, at the cost of those evaluations in every trial).

  ``evaluation_steps`` replaces both with explicit steps where every metric is measured.
* A goal-only measurement (a resolution step in a replayed bracket, or a dense one before the goal is
  met) is a goal check (:func:`batchlab.train.evaluation.measure_goal`): for a metric that allows it
  (classification error) the pass over the goal split stops as soon as the outcome is decided, and
  the row then holds the deciding bound, flagged by ``<metric>:bound`` (``+1`` lower, ``-1`` upper
  bound), without the split's other metrics. The bound decides the goal as the value would.
* Steps to the goal: ``steps_to_goal`` is the first evaluation step whose goal metric beats the goal,
  ``steps_lower`` the evaluation before it (0 if none), where it did not: the goal was first met in
  ``(steps_lower, steps_to_goal]``, whose width is at most ``resolution * steps_lower`` or one step.
  The true first passage (the metric read at every step) lies in it when the metric stays past the
  goal once it passed it; a noisy metric that dips past the goal between evaluations and back is
  read at a later passage (with replay, one inside the full-schedule bracket where it first shows).
* Status: ``COMPLETE`` when the trial ran its whole step budget; ``STOPPED_AT_GOAL`` when
  ``stop_at_goal`` stopped it at an evaluation that beat the goal before its budget (its ``steps`` =
  updates up to that evaluation, ``steps_to_goal``: with replay the live run's updates past it are
  discarded; its study definition records the stop rule ``{metric, goal, maximize}``; a goal met at
  the very last step is ``COMPLETE``); ``INFEASIBLE`` when
  the training loss diverged (:mod:`batchlab.train.divergence`) or an evaluation produced a
  non-finite value; the measurements taken until then are recorded; ``RACED`` when the study's race
  (``run_prepared(..., race=)``, :mod:`batchlab.train.race`) stopped it at an evaluation after which
  it could no longer be among the study's best (``steps`` = updates run). ``INCOMPLETE`` is never produced
  here: an interrupted trial publishes nothing (the store's writer is never finished), so a resumed
  sweep runs it again.
* Study definition: ``TrialSpec.study_definition``, or one built with
  ``batchlab.store.studies.make_study_definition`` from the spec (store workload name, batch size,
  budget, train examples, search space, evaluation rule, stop rule, data seed, source
  ``"batchlab train"``), passed to ``store.trial_writer``.
  On a device other than the CPU the definition carries ``device`` (its type), so GPU studies are
  kept apart from CPU ones.
* The store's workload is ``f"{workload.name}/{optimizer}"`` (dataset/model/optimizer, like the
  release: :func:`batchlab.store.schema.store_workload_name`); the trial id defaults to
  ``store.next_trial_id(...)``.
"""

from __future__ import annotations

import collections
import copy
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from batchlab.errors import BatchlabError, checked_int, unknown_name_error
from batchlab.train.core import (TrialProgress, batch_source, device_split, evaluate_trials, replay_bracket, replay_steps,
                                 train_loop)
from batchlab.train.device import fork_rng, get_rng_state, resolve_device, set_rng_state
from batchlab.train.divergence import DivergenceMonitor
from batchlab.train.evaluation import (
    EvaluationPlan,
    budgeted_plan,
    check_eval_budget,
    evaluation_schedule,
    measure,
    measure_goal,
    subset_splits,
    with_bound_flags,
)
from batchlab.train.sampling import BatchSampler, updates_per_epoch
from batchlab.workloads.schedule import DEFAULT_RESOLUTION, check_resolution, schedule_resolution

if TYPE_CHECKING:
    from batchlab.workloads import Workload

__all__ = [
    "TrialSpec", "TrialResult", "PreparedTrial", "default_study_definition", "prepare_trial", "run_prepared", "run_trial",
    "stop_rule", "trial_result", "new_progress",
]

@dataclass
class TrialSpec:
    """Everything that defines one trial.

    Attributes:
        workload: a :class:`batchlab.workloads.Workload`, or what :func:`batchlab.workloads.resolve_workload`
            accepts: a registered name ``dataset/model`` (e.g. ``"mnist/fc_128_128_128"``), an entry
            point name, ``package.module:function`` or ``path/to/file.py:function``.
        optimizer: optimizer name (``batchlab.optim.optimizer_names()``).
        batch_size: examples per update, ``1..num_train``.
        hyperparameters: ``{name: value}`` with the release's names (``learning_rate``, ...);
            all go to the optimizer (which checks them); ``label_smoothing`` is applied by the
            trainer through ``workload.loss``.
        steps: step budget (updates); ``None`` means the workload's ``default_steps``.
        train_examples: train on the first-chosen ``N`` training examples (``None``: all).
        seed: model initialisation, batch order and in-loop randomness.
        goal: the goal this trial stops at (``stop_at_goal``) and whose bracket it refines, on the
            workload's metric and direction; ``None``: the workload's goal.
        stop_at_goal: stop at the first evaluation that beats the goal (status
            ``STOPPED_AT_GOAL`` when that is before the budget). On by default, as for sweeps;
            ``False`` runs the whole budget (every metric's whole curve).
        trial_id, trial_key: store identity; ``None`` picks ``store.next_trial_id`` and a fresh key.
        search_space: the study's search space (batch_science ``parameter_configs``), if known.
        evaluation_steps: steps at which to evaluate every metric, replacing the workload's schedule
            (resolution steps included: the goal is then read at these steps only).
        resolution: relative spacing of the goal-metric evaluations, in (0, 1): consecutive
            evaluation steps within a factor ``1 + resolution``, every step while ``1/resolution`` is
            larger (:func:`batchlab.workloads.schedule.resolution_steps`); ignored with
            ``evaluation_steps``.
        evaluations: ``num_regular`` of the full-metric schedule (about this many regular
            evaluations of every metric; ``None``: the workload's); cannot be combined with
            ``evaluation_steps``.
        refine: how the goal metric's resolution steps are measured: ``"replay"`` (default; only the
            bracket where the goal is first met, by replaying from the previous full evaluation) or
            ``"dense"`` (all of them as the trial runs); see the module docstring.
        study_definition: the study this trial belongs to (``batchlab.store.studies.make_study_definition``);
            ``None`` builds one from this spec (source ``"batchlab train"``).
        data_seed: seed of ``workload.load_data`` (which examples form the training subset when
            ``train_examples`` is set); shared by all trials of a study.
        train_eval_examples: measure ``train/*`` metrics on a fixed subset of at most this many
            training examples (``None``: the workload's own cap). A few hundred examples give the
            training loss to about 5%, at a fraction of the cost.
        eval_budget: keep evaluation within this fraction of training, counted in examples
            (evaluations x examples per evaluation <= ``eval_budget * batch_size * steps``), by
            shrinking the train-metric subset, then thinning the schedule (same dense-early /
            regular-later shape, last step kept), then the validation subset, each down to a floor
            (:func:`batchlab.train.evaluation.budgeted_plan` states the order, the floors and the
            cost in resolution). ``None`` (default): the workload's full schedule and subsets, the
            finest steps-to-result resolution. Cannot be combined with ``evaluation_steps``.
        device: ``auto`` (a GPU when one is present), ``cpu``, ``cuda``, ``cuda:N`` or ``mps``
            (:mod:`batchlab.train.device`): where the model trains and is evaluated.
        data_order_seed: seed of the batch order (:class:`batchlab.train.sampling.BatchSampler`);
            ``None`` (default): the trial's own ``seed``. The trials of a study given one
            ``data_order_seed`` all see the same batches, step by step (a *shared batch order*,
            which :mod:`batchlab.sweep.vectorized` turns into one input for all K trials); their
            study definition records it (``batch_order``).

    ``train/*`` metrics are measured by ``workload.evaluate`` on a fixed subset of the training set
    (the workload's cap, ``train_eval_examples`` or the budget's), ``val/*`` metrics on the
    validation set (whole unless the budget shrank it to a fixed subset), and ``test/*`` metrics only
    when the workload's goal metric is on the test split (then at every evaluation, on the workload's
    cap of the test set).
    """

    workload: str | Workload
    optimizer: str
    batch_size: int
    hyperparameters: dict[str, Any]
    steps: int | None = None
    train_examples: int | None = None
    seed: int = 0
    stop_at_goal: bool = True  # = batchlab.sweep.config.DEFAULT_STOP_AT_GOAL (a test keeps them equal)
    trial_id: int | None = None
    trial_key: str | None = None
    search_space: dict | None = None
    evaluation_steps: Sequence[int] | None = None
    data_seed: int = 0
    train_eval_examples: int | None = None
    eval_budget: float | None = None
    resolution: float = DEFAULT_RESOLUTION
    evaluations: int | None = None
    refine: str = "replay"
    study_definition: dict | None = None
    goal: float | None = None
    device: str = "auto"
    data_order_seed: int | None = None


@dataclass
class TrialResult:
    """What one trial did. ``steps`` = updates run; ``steps_to_goal`` = first evaluation step that
    beat the goal (``None`` if none did) and ``steps_lower`` the evaluation step before it (0 if none;
    ``None`` if not reached): the goal was first met in ``(steps_lower, steps_to_goal]``;
    ``resolution`` = the largest relative gap between consecutive evaluation steps more than one step
    apart (:func:`batchlab.workloads.schedule.schedule_resolution`); ``measurements`` = one dict per
    evaluation (``step`` plus ``<split>/<metric>`` values: every metric at full steps, the goal split's
    at resolution steps); ``wall_time_s`` = seconds the run took (store setup, updates,
    evaluations, recording; loading data and building the model excluded), of which
    ``evaluation_time_s`` went to evaluating and recording (store writes and the final publish);
    ``evaluation_cpu_s`` is the same part in this process's CPU seconds (``time.process_time``);
    ``device`` = where it trained (``"cpu"``, ``"cuda:0"``, ...)."""

    workload: str
    batch_size: int
    trial_id: int | None
    trial_key: str | None
    parameters: dict[str, Any]
    seed: int
    status: str
    steps: int
    steps_to_goal: int | None
    measurements: list[dict[str, float]] = field(default_factory=list)
    wall_time_s: float = 0.0
    evaluation_time_s: float = 0.0
    evaluation_cpu_s: float = 0.0
    metric: str = ""
    goal: float = math.nan
    maximize: bool = False
    steps_lower: int | None = None
    resolution: float | None = None
    study_definition: dict | None = None
    device: str = "cpu"

    def final_metric(self) -> float | None:
        """The goal metric at the last evaluation that measured it in full (``None`` if none did;
        a bounded goal check, flagged ``<metric>:bound``, is not a value)."""
        from batchlab.store.schema import BOUND_SUFFIX

        for row in reversed(self.measurements):
            if self.metric in row and self.metric + BOUND_SUFFIX not in row:
                return row[self.metric]
        return None


@dataclass
class PreparedTrial:
    """A validated trial with its data, model and training algorithm built, ready to run.

    ``train`` is the training split (a :class:`batchlab.workloads.data.DataSplit`, tensors already on
    ``device``), ``eval_splits`` the evaluation splits cut to their fixed subsets."""

    spec: TrialSpec
    workload: Any
    store_workload: str
    steps: int
    schedule: list[int]
    parameters: dict[str, Any]
    train: Any
    num_train: int
    eval_splits: dict[str, Any]
    model: torch.nn.Module
    algorithm: Any
    evaluation_examples: dict[str, int] = field(default_factory=dict)
    full_steps: frozenset = frozenset()
    goal_split: str = "val"
    resolution: float | None = None
    study_definition: dict | None = None
    refine_steps: list[int] = field(default_factory=list)
    device: torch.device = torch.device("cpu")

    def splits_at(self, step: int) -> dict[str, Any]:
        """What the evaluation at ``step`` measures: every split at a full step, else the goal split."""
        if step in self.full_steps or self.goal_split not in self.eval_splits:
            return self.eval_splits
        return {self.goal_split: self.eval_splits[self.goal_split]}


_as_int = checked_int  # batchlab.errors.checked_int


def _checked_hyperparameters(hyperparameters: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(hyperparameters, dict):
        raise BatchlabError(f"hyperparameters must be a mapping of name to number, got {type(hyperparameters).__name__}")
    checked = {}
    for name, value in hyperparameters.items():
        if value is None:  # "off" (e.g. ema_decay); the optimizer checks where that is allowed
            checked[str(name)] = None
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise BatchlabError(f"hyperparameter {name} must be a number, got {value!r}") from None
        if not math.isfinite(value):
            raise BatchlabError(f"hyperparameter {name} must be finite, got {value!r}")
        checked[str(name)] = value
    if "learning_rate" in checked and not checked["learning_rate"] > 0:
        raise BatchlabError(f"learning rate must be > 0, got {checked['learning_rate']}")
    return checked


_DATA_CACHE: collections.OrderedDict = collections.OrderedDict()
_DATA_CACHE_SIZE = 2  # a study's trials share one entry; two keep a sweep alternating two studies warm


def _load_data(workload: Any, train_examples: int | None, data_seed: int, device: torch.device) -> Any:
    """``workload.load_data(...)`` with its train and val splits on ``device`` (in-memory tensors
    moved once: :func:`batchlab.train.core.device_split`), kept for the next trials of the same study
    (data are never modified). The two most recent are kept.

    Keyed by the identity of the workload's data loader (``data`` or ``load_arrays``; held by the
    entry, so its id stays its own), ``train_examples``, ``data_seed`` and the device: two workloads
    with the same name but different data (a re-registered name, a modified copy) never share an
    entry, and the K trials of a vectorized run share one copy of the data on the device.
    """
    from batchlab.workloads.data import WorkloadData

    loader = workload._loader()
    cache_key = (id(loader), train_examples, data_seed, str(device))
    hit = _DATA_CACHE.get(cache_key)
    if hit is not None and hit[0] is loader:
        _DATA_CACHE.move_to_end(cache_key)
        return hit[1]
    data = workload.load_data(train_examples=train_examples, seed=data_seed)
    if device.type != "cpu":
        data = WorkloadData(device_split(data.train, device), device_split(data.val, device), data.test, data.num_classes)
    _DATA_CACHE[cache_key] = (loader, data)
    while len(_DATA_CACHE) > _DATA_CACHE_SIZE:
        _DATA_CACHE.popitem(last=False)
    return data


def prepare_trial(spec: TrialSpec) -> PreparedTrial:
    """Validate ``spec`` and build everything a trial needs; writes nothing anywhere.

    Raises:
        BatchlabError: unknown workload or optimizer (closest name suggested), a bad workload
            reference, an unknown or unavailable device, batch size outside
            ``1..num_train``, learning rate <= 0, bad steps/seed/examples, an evaluation budget that
            is not a number > 0 or comes with explicit evaluation steps, a missing data package
            (the data module's message), a goal metric on a test split the data lack or that the
            workload's task does not return, or hyperparameters the optimizer rejects.
    """
    from batchlab.optim import build_training_algorithm, get_optimizer
    from batchlab.store.schema import store_workload_name
    from batchlab.workloads import resolve_workload

    workload = resolve_workload(spec.workload)
    device = resolve_device(spec.device)
    get_optimizer(spec.optimizer)  # unknown name: one line naming the closest known (loads only this entry point)
    batch_size = _as_int("batch size", spec.batch_size, 1)
    steps = _as_int("steps", workload.default_steps if spec.steps is None else spec.steps, 1)
    seed = _as_int("seed", spec.seed, 0)
    data_seed = _as_int("data seed", spec.data_seed, 0)
    if spec.data_order_seed is not None:
        _as_int("data order seed", spec.data_order_seed, 0)
    train_examples = None if spec.train_examples is None else _as_int("train examples", spec.train_examples, 1)
    parameters = _checked_hyperparameters(spec.hyperparameters)
    resolution = check_resolution(spec.resolution)
    trial_goal(spec, workload)  # a bad goal fails before anything runs
    evaluations = None if spec.evaluations is None else _as_int("evaluations", spec.evaluations, 1)
    if evaluations is not None and spec.evaluation_steps is not None:
        raise BatchlabError("give either a number of evaluations or explicit evaluation steps (--eval-every), not both")
    if spec.refine not in REFINE_MODES:
        raise unknown_name_error("refine mode", str(spec.refine), REFINE_MODES)
    refine_steps: list[int] = []
    if spec.evaluation_steps is None:
        chosen = workload.evaluation_schedule(num_regular=evaluations, resolution=resolution)
        schedule, goal_steps = chosen.full_steps(steps), chosen.goal_steps(steps)
        if spec.refine == "replay":
            refine_steps, goal_steps = goal_steps, []
    else:
        schedule, goal_steps = evaluation_schedule((), steps, spec.evaluation_steps), []
    if 0 not in schedule:
        # The initial model is a resolution step too, replayed (a goal check of the kept initial state)
        # only when the goal is first met in the first bracket: a goal met before any update is steps
        # to result 0, not (0, first evaluation]. Nothing else about the schedule changes.
        refine_steps = [0, *refine_steps]
    if spec.study_definition is not None and not isinstance(spec.study_definition, dict):
        raise BatchlabError(f"study_definition must be a dict (batchlab.store.studies.make_study_definition), got {type(spec.study_definition).__name__}")

    train_eval_examples = None if spec.train_eval_examples is None else _as_int("train eval examples", spec.train_eval_examples, 1)
    if spec.eval_budget is not None:
        check_eval_budget(spec.eval_budget)
    if spec.eval_budget is not None and spec.evaluation_steps is not None:
        raise BatchlabError("give either an evaluation budget or explicit evaluation steps (--eval-every), not both")

    data = _load_data(workload, train_examples, data_seed, device)
    num_train = int(data.num_train)
    updates_per_epoch(num_train, batch_size)  # batch size within 1..num_train
    train = data.train
    splits = {"train": train, "val": data.val}
    if workload.goal_split not in splits:  # a goal on the test split: measured at the full and goal steps too
        if data.test is None:
            raise BatchlabError(f"workload {workload.name}: its goal metric {workload.metric} is on the test split, "
                                "but its data have no test split")
        splits[workload.goal_split] = device_split(data.test, device)
    caps = workload.eval_examples or {}
    examples = {}
    for split, part in splits.items():
        cap = caps.get(split)
        if split == "train" and train_eval_examples is not None:
            cap = train_eval_examples if cap is None else min(cap, train_eval_examples)
        examples[split] = len(part) if cap is None else min(len(part), int(cap))
    plan = EvaluationPlan(schedule, examples, goal_steps, workload.goal_split)
    if spec.eval_budget is not None:
        plan = budgeted_plan(plan, spec.eval_budget, batch_size, steps)
    store_workload = store_workload_name(workload.name, spec.optimizer)
    if spec.evaluation_steps is None:
        eval_budget = None if spec.eval_budget is None else float(spec.eval_budget)
        evaluation = geometric_evaluation(resolution, spec.refine, eval_budget)
    else:
        evaluation = {"rule": "steps", "steps": list(plan.steps)}
    definition = spec.study_definition
    if definition is None:
        definition = default_study_definition(
            spec, store_workload=store_workload, steps=steps, evaluation=evaluation,
            stop_rule=stop_rule(workload, spec.goal) if spec.stop_at_goal else None, source="batchlab train",
            device=device.type, **batch_order(spec.data_order_seed),
        )

    label_smoothing = float(parameters.get("label_smoothing") or 0.0)

    def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return workload.loss(logits, y, label_smoothing=label_smoothing)

    model = workload.build_model(seed=seed)
    if device.type != "cpu":
        model = model.to(device)
    # One example through the model, the loss and the metrics checks label_smoothing against the task
    # and the number of classes, and that the task measures the goal metric, now, before anything is
    # written (eval mode and a forked RNG: no state of the trial changes).
    with torch.no_grad(), fork_rng(device):
        model.eval()
        x, y = batch_source(train, device)(torch.arange(1))
        outputs = model(x)
        loss_fn(outputs, y)
        measured = workload.task.batch_sums(outputs, y)
        model.train()
    goal_metric = workload.metric.split("/", 1)[1]
    if goal_metric not in measured:
        raise BatchlabError(f"workload {workload.name}: its goal metric {workload.metric} is not among the metrics its task "
                            f"{workload.task.name!r} returns ({', '.join(measured)})")
    algorithm = build_training_algorithm(
        spec.optimizer, model, loss_fn, hyperparameters=parameters, total_steps=steps
    )
    return PreparedTrial(
        spec=spec,
        workload=workload,
        store_workload=store_workload,
        steps=steps,
        schedule=plan.all_steps(),
        parameters=parameters,
        train=train,
        num_train=num_train,
        eval_splits=subset_splits(splits, plan.examples),
        model=model,
        algorithm=algorithm,
        evaluation_examples=dict(plan.examples),
        full_steps=frozenset(plan.steps),
        goal_split=plan.goal_split,
        resolution=schedule_resolution(sorted(set(plan.all_steps()) | set(refine_steps))),
        study_definition=definition,
        refine_steps=refine_steps,
        device=device,
    )


REFINE_MODES = ("replay", "dense")


def geometric_evaluation(resolution: float, refine: str, eval_budget: float | None = None) -> dict:
    """The ``evaluation`` of a study definition on the workload's default schedule:
    ``{"rule": "geometric", "resolution", "refine"}``, plus ``eval_budget`` when one is set."""
    evaluation = {"rule": "geometric", "resolution": resolution, "refine": refine}
    if eval_budget is not None:
        evaluation["eval_budget"] = eval_budget
    return evaluation


def stop_rule(workload, goal: float | None = None) -> dict:
    """The stop rule of a study whose trials stop at ``goal`` (``None``: ``workload``'s goal) on the
    workload's metric: ``{metric, goal, maximize}``."""
    value = workload.goal if goal is None else goal
    return {"metric": workload.metric, "goal": float(value), "maximize": bool(workload.maximize)}


def trial_goal(spec: "TrialSpec", workload) -> float:
    """The goal ``spec`` stops at and refines: ``spec.goal``, else the workload's (a finite number)."""
    if spec.goal is None:
        return float(workload.goal)
    if isinstance(spec.goal, bool) or not isinstance(spec.goal, (int, float)) or not math.isfinite(float(spec.goal)):
        raise BatchlabError(f"goal must be a finite number, got {spec.goal!r}")
    return float(spec.goal)


def batch_order(data_order_seed: int | None) -> dict:
    """The study definition's extra keys for a batch order: ``{"batch_order": {"shared": True,
    "seed": s}}`` for a shared order, ``{}`` for each trial's own (so existing study ids stay)."""
    if data_order_seed is None:
        return {}
    return {"batch_order": {"shared": True, "seed": int(data_order_seed)}}


def default_study_definition(spec: TrialSpec, *, store_workload: str, steps: int, evaluation: dict,
                             stop_rule: dict | None, source: str, device: str | None = None, **extra: Any) -> dict:
    """The study definition of ``spec`` (``batchlab.store.studies.make_study_definition``); ``device``
    is the device type the trials run on (recorded only when not ``"cpu"``)."""
    from batchlab.store.studies import make_study_definition

    return make_study_definition(
        workload=store_workload, batch_size=int(spec.batch_size), train_steps=int(steps),
        train_examples=spec.train_examples, search_space=spec.search_space, evaluation=evaluation,
        stop_rule=stop_rule, seed=int(spec.data_seed), source=source, device=device, **extra,
    )


def run_prepared(
    prepared: PreparedTrial,
    store: Any = None,
    on_measurement: Callable[[dict[str, float]], None] | None = None,
    race: Any = None,
) -> TrialResult:
    """Run a prepared trial (once: the model trains in place), recording into ``store`` if given.

    ``race``: the :class:`batchlab.train.race.Race` of the trial's study (``None``: no racing); the
    trial stops, status ``RACED``, at the first evaluation after which it can no longer be among the
    study's best, and joins the race's best when it meets the goal."""
    spec, workload, algorithm, model = prepared.spec, prepared.workload, prepared.algorithm, prepared.model
    batch_size, seed, total, device = int(spec.batch_size), int(spec.seed), prepared.steps, prepared.device
    start = time.perf_counter()

    trial_id, trial_key, writer = spec.trial_id, spec.trial_key, None
    if store is not None:
        if trial_id is None:
            trial_id = store.next_trial_id(prepared.store_workload, batch_size)
        if trial_key is None:
            trial_key = f"{prepared.store_workload}/{batch_size}/{trial_id}/{uuid.uuid4().hex}"
        definition = {} if prepared.study_definition is None else {"study_definition": prepared.study_definition}
        writer = store.trial_writer(
            workload=prepared.store_workload,
            batch_size=batch_size,
            trial_id=int(trial_id),
            trial_key=trial_key,
            parameters=prepared.parameters,
            seed=seed,
            source="batchlab",
            search_space=spec.search_space,
            train_steps=total,
            early_stopping=bool(spec.stop_at_goal),
            tags={"metric": workload.metric, "goal": trial_goal(spec, workload), "maximize": bool(workload.maximize)},
            **definition,
        )

    def on_record(row: dict[str, float]) -> None:
        if writer is not None:
            writer.record(row["step"], {k: v for k, v in row.items() if k != "step"})
        if on_measurement is not None:
            on_measurement(dict(row))

    progress = new_progress(prepared, on_record)
    racer = None if race is None else new_racer(race, prepared, {0: trial_id if trial_id is not None else 0})
    evaluation_time = evaluation_cpu = 0.0
    sampler = BatchSampler(prepared.num_train, batch_size, order_seed(spec))
    batch = batch_source(prepared.train, device)
    replay = bool(prepared.refine_steps)
    snapshot: tuple | None = None  # (step, copy of (model, algorithm), RNG state) while the goal is unmet

    def take_snapshot(step: int) -> None:
        nonlocal snapshot
        # a copy only where a replay from ``step`` could measure a resolution step
        if replay_steps(prepared.refine_steps, step, total + 1):
            snapshot = (step, _copy_training_state(model, algorithm), get_rng_state(device))
        else:
            snapshot = (step, None, None)

    def replay_goal(reached: dict, upto: int) -> dict:
        """The snapshot's copy trained again towards ``upto`` (the same batches and RNG stream as the
        trial itself, so it follows the trial's own trajectory); the live RNG state is restored."""
        begin = snapshot[0]
        steps = replay_steps(prepared.refine_steps, begin, upto)
        if not steps:
            return {}
        _, (twin, twin_algorithm), rng_state = snapshot
        splits = {prepared.goal_split: prepared.eval_splits[prepared.goal_split]}

        def advance(step: int) -> None:
            twin_algorithm.step(*batch(sampler.indices(step)))

        def measure_twin(key: Any, step: int) -> dict[str, float]:
            # a goal check only: stopped once its outcome is decided, the value then a flagged bound
            with twin_algorithm.evaluation_weights():
                return with_bound_flags(*measure_goal(workload, twin, splits, reached[key].goal))

        live_state = get_rng_state(device)
        set_rng_state(rng_state, device)
        try:
            return replay_bracket(reached, steps, begin, advance, measure_twin)
        finally:
            set_rng_state(live_state, device)

    def evaluate(step: int) -> bool:
        """Measure at ``step``, record it; return True if the trial must stop here."""
        nonlocal evaluation_time, evaluation_cpu
        started, started_cpu = time.perf_counter(), time.process_time()

        def measure_live(key: Any) -> dict[str, float]:
            splits = prepared.splits_at(step)
            with algorithm.evaluation_weights():
                if step not in prepared.full_steps and progress.searching:  # a dense goal-only step
                    return with_bound_flags(*measure_goal(workload, model, splits, progress.goal))
                return measure(workload, model, splits)

        try:
            evaluate_trials(step, ((0, progress),), measure_live, replay_goal if replay else None, racer)
            if replay and progress.searching:
                take_snapshot(step)
            return progress.stopped
        finally:
            evaluation_time += time.perf_counter() - started
            evaluation_cpu += time.process_time() - started_cpu

    # The hot loop: one sampled batch, one update, one divergence check per step; nothing else.
    indices, step_fn, diverged = sampler.indices, algorithm.step, DivergenceMonitor().diverged

    def update(step: int) -> bool:
        if diverged(step_fn(*batch(indices(step)))):
            progress.diverged()
            return True
        return False

    with fork_rng(device):
        torch.manual_seed(seed)
        if replay:
            take_snapshot(0)
        progress.finish(train_loop(total, prepared.schedule, update, evaluate))

    if writer is not None:
        started, started_cpu = time.perf_counter(), time.process_time()
        writer.finish(status=progress.status, steps=progress.steps)
        evaluation_time += time.perf_counter() - started
        evaluation_cpu += time.process_time() - started_cpu
    return trial_result(prepared, progress, trial_id=trial_id, trial_key=trial_key,
                        wall_time_s=time.perf_counter() - start, evaluation_time_s=evaluation_time,
                        evaluation_cpu_s=evaluation_cpu)


def order_seed(spec: TrialSpec) -> int:
    """The seed of the trial's batch order: ``data_order_seed`` when shared, else its own ``seed``."""
    return int(spec.seed if spec.data_order_seed is None else spec.data_order_seed)


def new_racer(race: Any, prepared: PreparedTrial, trial_ids: dict) -> Any:
    """The :class:`batchlab.train.race.Racer` of a run of ``prepared``-like trials (``trial_ids``:
    run key -> store trial id): every step its protocol can report a first goal step at."""
    from batchlab.train.race import Racer

    return Racer(race, trial_ids, list(prepared.schedule) + list(prepared.refine_steps))


def new_progress(prepared: PreparedTrial, on_record: Callable[[dict[str, float]], None] | None = None) -> TrialProgress:
    """The :class:`batchlab.train.core.TrialProgress` of a prepared trial (its goal, stop rule, budget)."""
    workload, spec = prepared.workload, prepared.spec
    return TrialProgress(metric=workload.metric, goal=trial_goal(spec, workload), maximize=bool(workload.maximize),
                         stop_at_goal=bool(spec.stop_at_goal), total_steps=prepared.steps, on_record=on_record)


def trial_result(prepared: PreparedTrial, progress: TrialProgress, *, trial_id: Any, trial_key: str | None,
                 wall_time_s: float, evaluation_time_s: float = 0.0, evaluation_cpu_s: float = 0.0) -> TrialResult:
    """The :class:`TrialResult` of a prepared trial whose run ended with ``progress``."""
    return TrialResult(
        workload=prepared.store_workload,
        batch_size=int(prepared.spec.batch_size),
        trial_id=None if trial_id is None else int(trial_id),
        trial_key=trial_key,
        parameters=dict(prepared.parameters),
        seed=int(prepared.spec.seed),
        status=progress.status,
        steps=progress.steps,
        steps_to_goal=progress.steps_to_goal,
        measurements=progress.measurements,
        wall_time_s=wall_time_s,
        evaluation_time_s=evaluation_time_s,
        evaluation_cpu_s=evaluation_cpu_s,
        metric=progress.metric,
        goal=progress.goal,
        maximize=progress.maximize,
        steps_lower=progress.steps_lower,
        resolution=prepared.resolution,
        study_definition=prepared.study_definition,
        device=str(prepared.device),
    )


def _copy_training_state(model: torch.nn.Module, algorithm: Any) -> tuple[torch.nn.Module, Any]:
    """An independent copy of ``(model, algorithm)`` that trains exactly as the original would.

    A deep copy, with two repairs: ``torch.optim.Optimizer`` copies only its defaults, state and
    parameter groups, so plain settings other optimizers keep as attributes (pytorch_optimizer's LARS
    and Lamb: ``maximize``, ``foreach``, ...) are carried over; and the algorithm's views of the live
    parameters (``_live_weights``, for the weight EMA) are re-made on the copied model, since deep
    copies of views do not alias the copied parameters. ``tests/train/test_trial.py`` checks, for
    every optimizer and with an EMA, that a replayed copy measures what the trial itself measures.
    """
    model_copy, algorithm_copy = copy.deepcopy((model, algorithm))
    original, twin = getattr(algorithm, "optimizer", None), getattr(algorithm_copy, "optimizer", None)
    if original is not None and twin is not None:
        for name, value in vars(original).items():
            if name not in vars(twin) and (value is None or isinstance(value, (bool, int, float, str))):
                setattr(twin, name, value)
    if hasattr(algorithm_copy, "_live_weights"):
        algorithm_copy._live_weights = [p.detach() for p in algorithm_copy.model.parameters()]
    return model_copy, algorithm_copy


def run_trial(
    spec: TrialSpec,
    store: Any = None,
    on_measurement: Callable[[dict[str, float]], None] | None = None,
) -> TrialResult:
    """Run one trial (see the module docstring); ``on_measurement(dict)`` is called per evaluation.

    Everything is validated and built before the store is touched, so bad input writes nothing.
    """
    return run_prepared(prepare_trial(spec), store=store, on_measurement=on_measurement)
