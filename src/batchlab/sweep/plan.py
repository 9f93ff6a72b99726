"""The plan of a sweep: its studies, their trials and the tasks that run them.

Everything here is plain, picklable data (no torch), so tasks travel to process-pool and Dask
workers unchanged. A *task* is one or more trials of one study that a worker runs together: one
trial (sequential) or up to ``vectorize_trials`` trials as one batched computation (vectorized).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from batchlab.search.space import POINTS_RULE
from batchlab.store.schema import store_workload_name
from batchlab.sweep.config import MAX_TRIALS_PER_STUDY, SweepConfig, steps_from_rule
from batchlab.sweep.keys import FIRST_TRIAL_ID, sweep_id, trial_key, trial_seed

#: Hyperparameters counted in steps that a grown budget stretches by the same factor as the budget.
STRETCHED_PARAMETERS = ("learning_rate_decay_steps", "warmup_steps")

#: What the study definition of vectorized trials not bit-identical to sequential ones on the machine
#: that planned them adds (only then, so every other study id stays as it was).
INEXACT_VECTORIZED = {"vectorized": {"bit_identical_to_sequential": False}}


@dataclass(frozen=True)
class TrialPlan:
    """One trial to run: its stable key, id, seed and metaparameters (the search-space point)."""

    key: str
    trial_id: int
    point_index: int
    seed: int
    hyperparameters: dict[str, Any]


@dataclass(frozen=True)
class StudyPlan:
    """One study: a workload and optimizer at one batch size with one step budget.

    ``budget_round`` is 0 for the budget of the sweep's rule and ``r`` for the ``r``-th growth;
    ``base_steps`` is the round-0 budget, so a grown study's schedule is stretched by
    ``steps / base_steps`` (:attr:`stretch`). ``first_trial_id`` is the id of point 0 in the study's
    block of trial ids in the store (:func:`batchlab.sweep.keys.allocate_ids`). ``sweep`` is the sweep
    id, ``budget_rule`` the sweep's step-budget rule and ``evaluation`` its evaluation schedule (all
    three enter the study definition).

    ``workload`` is the key that resolves the workload in any process (a registered name or a
    reference, :func:`batchlab.workloads.workload_key`; workers re-import it), ``workload_name`` the
    workload's own ``dataset/model`` name (the store's name and the trial keys use it; empty: the same
    as ``workload``). ``device`` is where its trials train (``SweepConfig.device``); ``device_type``
    the type it resolved to in the driver (``cpu``, ``cuda``, ``mps``), which the study definition
    records when it is not ``cpu``. ``race``: its trials are raced (:mod:`batchlab.train.race`; the
    definition gets ``race``); ``data_order_seed``: the seed of the batch order its trials share
    (``None``: each trial its own; the definition gets ``batch_order``). ``inexact_vectorized``: its
    trials run vectorized although the self-check found the vectorized path not bit-identical to
    sequential trials on the driver's machine (``vectorize = "always"``,
    :func:`batchlab.sweep.runner.prepare_sweep`; the definition gets :data:`INEXACT_VECTORIZED`, so
    they are never one study with sequential trials). ``search_round`` is 0, or ``r`` for the ``r``-th
    refined search of the study (:mod:`batchlab.sweep.refine`: ``points`` drawn in a box around the
    incumbent, ``search_space`` that box); the definition then gets ``search_round`` and ``refine`` (the
    decision: incumbent, flags, the space refined, the earlier round's study id).
    """

    workload: str
    optimizer: str
    batch_size: int
    steps: int
    trials: int
    seed: int
    train_examples: int | None
    stop_at_goal: bool
    search_space: dict[str, Any]
    metric: str
    goal: float
    maximize: bool
    evaluations: int | None = None
    budget_round: int = 0
    points: tuple[dict[str, Any], ...] = field(default=(), compare=False, repr=False)
    base_steps: int | None = None
    first_trial_id: int = FIRST_TRIAL_ID
    sweep: str = ""
    budget_rule: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    resolution: float = 0.05
    evaluation: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    workload_name: str = ""
    device: str = "auto"
    device_type: str = "cpu"
    race: bool = False
    data_order_seed: int | None = None
    inexact_vectorized: bool = False
    search_round: int = 0
    refine: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def store_workload(self) -> str:
        """``dataset/model/optimizer``, the store's workload name."""
        return store_workload_name(self.workload_name or self.workload, self.optimizer)

    @property
    def name(self) -> str:
        """A short label: ``dataset/model/optimizer b=64`` (plus the round when grown)."""
        grown = f" (budget round {self.budget_round})" if self.budget_round else ""
        refined = f" (search round {self.search_round})" if self.search_round else ""
        return f"{self.store_workload} b={self.batch_size}{grown}{refined}"

    @property
    def stretch(self) -> float:
        """How much longer this round's budget is than round 0's (1.0 in round 0)."""
        return self.steps / self.base_steps if self.base_steps else 1.0

    @property
    def stretched_search_space(self) -> dict[str, Any]:
        """The search space with the step-counted ranges (:data:`STRETCHED_PARAMETERS`) stretched."""
        return stretch_search_space(self.search_space, self.stretch)

    @cached_property
    def definition(self) -> dict[str, Any]:
        """The study definition (:func:`batchlab.store.studies.make_study_definition`) of this study."""
        from batchlab.store.studies import make_study_definition

        evaluation = dict(self.evaluation) or {"rule": "geometric", "resolution": self.resolution}
        stop_rule = ({"metric": self.metric, "goal": float(self.goal), "maximize": bool(self.maximize)}
                     if self.stop_at_goal else None)
        # the device only when it is not the CPU, so CPU study ids (and every existing store) stay as they are
        device = {} if self.device_type == "cpu" else {"device": self.device_type}
        # racing and a shared batch order only when used, so every other study id stays as it was
        from batchlab.train.race import race_definition
        from batchlab.train.trial import batch_order

        extra = {**({"race": race_definition()} if self.race else {}), **batch_order(self.data_order_seed),
                 **(INEXACT_VECTORIZED if self.inexact_vectorized else {}),
                 # a refined search round (batchlab.sweep.refine) only: every other study id stays as it was
                 **({"search_round": self.search_round, "refine": self.refine} if self.search_round else {})}
        return make_study_definition(
            workload=self.store_workload, batch_size=self.batch_size, train_steps=self.steps,
            train_examples=self.train_examples, search_space=self.stretched_search_space, evaluation=evaluation,
            stop_rule=stop_rule, seed=self.seed, source="batchlab", sweep=self.sweep,
            budget_round=self.budget_round, budget_rule=self.budget_rule, schedule_stretch=self.stretch, **device,
            **extra,
        )

    @cached_property
    def digest(self) -> str:
        """The study id of :attr:`definition`; it enters every trial key."""
        from batchlab.store.studies import study_id

        return study_id(self.definition)

    def trial_plans(self) -> list[TrialPlan]:
        """The study's trials in point order (``len == trials``)."""
        digest = self.digest
        if len(self.points) > MAX_TRIALS_PER_STUDY:  # pragma: no cover - SweepConfig.trials is bounded
            raise ValueError(f"a study has at most {MAX_TRIALS_PER_STUDY} points")
        return [
            TrialPlan(
                key=trial_key(self.workload_name or self.workload, self.optimizer, self.batch_size, i, self.seed,
                              digest),
                trial_id=self.first_trial_id + i,
                point_index=i,
                # a search round's trials get seeds of their own (budget rounds re-use their points' seeds)
                seed=trial_seed(self.seed, i + self.search_round * MAX_TRIALS_PER_STUDY),
                hyperparameters=stretch_point(point, self.stretch),
            )
            for i, point in enumerate(self.points)
        ]

    def grown(self, factor: float) -> "StudyPlan":
        """The same study with its step budget multiplied by ``factor`` (next budget round; the id block
        ids are given by the caller)."""
        return replace(self, steps=int(round(self.steps * factor)), budget_round=self.budget_round + 1,
                       base_steps=self.base_steps or self.steps)


def stretch_point(point: dict[str, Any], factor: float) -> dict[str, Any]:
    """``point`` with its step-counted hyperparameters (decay and warmup steps) multiplied by ``factor``."""
    out = dict(point)
    if factor == 1.0:
        return out
    for name in STRETCHED_PARAMETERS:
        value = out.get(name)
        if value is not None:
            out[name] = max(1 if name == "learning_rate_decay_steps" else 0, int(round(value * factor)))
    return out


def stretch_search_space(space: dict[str, Any], factor: float) -> dict[str, Any]:
    """``space`` (batch_science form) with the ranges of the step-counted parameters multiplied by ``factor``."""
    if factor == 1.0:
        return dict(space)
    out = {}
    for name, config in space.items():
        config = dict(config)
        if name in STRETCHED_PARAMETERS:
            for bound in ("min_value", "max_value"):
                if bound in config:
                    config[bound] = int(round(config[bound] * factor))
            if "feasible_points" in config:
                config["feasible_points"] = [int(round(v * factor)) for v in config["feasible_points"]]
        out[name] = config
    return out


@dataclass(frozen=True)
class TrialTask:
    """Trials of one study that one worker runs, together when ``vectorized``.

    A raced study's (``study.race``) task holds its trials that race each other
    (:mod:`batchlab.train.race`): vectorized in groups of ``group_size`` (0: all at once), one group
    after another, or one trial after another; ``race_prior`` holds the rank keys ``(first step
    meeting the goal, trial id)`` of the study's trials published before, which the race starts
    from. The sweep's driver sends a raced study as one chunk (a trial, or a group) at a time, each
    racing the chunks published before (:func:`batchlab.sweep.runner.run_sweep`). ``choose`` (``vectorize = "auto"``): the worker
    runs a vectorized task vectorized only when it measures that it pays
    (:func:`batchlab.sweep.vectorize_choice.vectorization_pays`), else one trial at a time.
    """

    study: StudyPlan
    trials: tuple[TrialPlan, ...]
    vectorized: bool
    group_size: int = 0
    race_prior: tuple[tuple[int, int], ...] = ()
    choose: bool = False

    @property
    def key(self) -> str:
        """A unique name for the task (its first trial key and size)."""
        return f"{self.trials[0].key}|n={len(self.trials)}"

    @property
    def estimated_cost(self) -> float:
        """A rough relative cost (steps x examples per step x trials, with a floor for per-step overhead),
        used to start the longest tasks first."""
        return float(self.study.steps) * max(self.study.batch_size, 32) * len(self.trials)


def sweep_settings(config: SweepConfig) -> dict[str, Any]:
    """The settings that define a sweep's measurements, which its :func:`~batchlab.sweep.keys.sweep_id`
    digests: the budget rule's settings, training examples, seed, goal, stop at goal, evaluation schedule,
    search spaces and schedule. Not included: workloads, optimizers and batch sizes (each study's
    definition names its own), the number of trials (a larger sweep re-uses the first points), growth
    settings (grown rounds have definitions of their own) and how the sweep runs. The goal is included:
    trials stop at it (``stop_at_goal``) and resolve its bracket to the resolution, and so is the rule
    that draws each study's points (``points``: :data:`batchlab.search.POINTS_RULE`)."""
    return {
        "steps": config.steps, "budget_epochs": config.budget_epochs, "min_steps": config.min_steps,
        "max_steps": config.max_steps, "budgets": {str(b): s for b, s in sorted(config.budgets.items())},
        "train_examples": config.train_examples, "seed": config.seed, "stop_at_goal": config.stop_at_goal,
        "evaluations": config.evaluations, "resolution": config.resolution, "schedule": config.schedule,
        "search_spaces": config.search_spaces, "goal": config.goal,
        # each study its own points (batchlab.search.POINTS_RULE): a store made when every study of a
        # sweep searched the same points keeps those sweeps (and their study ids) apart
        "points": POINTS_RULE,
        # only when used: every sweep id from before racing and shared batch orders stays as it was
        **({"race": True} if config.race else {}),
        **({"batch_order": config.batch_order} if config.batch_order != "trial" else {}),
    }


def _evaluation(workload, config: SweepConfig) -> dict[str, Any]:
    """The study definition's ``evaluation``: the workload's schedule at ``config.resolution`` (goal
    metric) with ``config.evaluations`` regular evaluations of every metric (absent: the workload's)."""
    described = workload.evaluation_schedule(num_regular=config.evaluations, resolution=config.resolution).describe()
    return {"rule": "geometric", **described}


def plan_studies(config: SweepConfig, device_type: str = "cpu") -> list[StudyPlan]:
    """Every study of ``config`` (workloads x optimizers x batch sizes), with sampled search-space points.

    The space of a study is the first of the config's ``search_spaces`` (``--search-space`` included),
    the workload's declared ``search_spaces`` and the optimizer's default
    (:func:`batchlab.search.study_search_space`). The points of a study are ``space.sample(trials,
    seed=study_points_seed(config.seed, workload name, optimizer, batch size))``: each study its own
    scrambled Halton sequence (:func:`batchlab.search.study_points_seed`), the same whichever part of
    the sweep runs and on every resume; its budget rounds re-use them.
    ``device_type``: the type ``config.device`` resolves to here (recorded in the study definitions
    when it is not ``cpu``).
    """
    from batchlab.search import study_points_seed, study_search_space
    from batchlab.workloads import get_workload, workload_key

    sweep = sweep_id(sweep_settings(config))
    studies = []
    for given in config.workloads:
        workload = get_workload(given)
        key = workload_key(workload)  # what workers re-import: the name, or the reference
        rule = config.budget_rule(workload)
        evaluation = _evaluation(workload, config)
        for optimizer in config.optimizers:
            for batch_size in config.batch_sizes:
                steps = steps_from_rule(rule, batch_size)
                space = study_search_space(optimizer, config.search_spaces.get(optimizer), workload,
                                           train_steps=steps, schedule=config.schedule)
                studies.append(
                    StudyPlan(
                        workload=key, workload_name=workload.name, optimizer=optimizer, batch_size=batch_size, steps=steps,
                        trials=config.trials, seed=config.seed, train_examples=config.train_examples,
                        stop_at_goal=config.stop_at_goal, search_space=space.to_batch_science(),
                        metric=workload.metric, goal=float(workload.goal if config.goal is None else config.goal),
                        maximize=bool(workload.maximize),
                        evaluations=config.evaluations,
                        points=tuple(space.sample(config.trials, seed=study_points_seed(
                            config.seed, workload.name, optimizer, batch_size))),
                        base_steps=steps, sweep=sweep, budget_rule=rule, resolution=config.resolution,
                        evaluation=evaluation, device=config.device, device_type=device_type,
                        race=config.race, data_order_seed=config.seed if config.batch_order == "shared" else None,
                    )
                )
    return studies


def make_tasks(study: StudyPlan, trials: list[TrialPlan], vectorized: bool, group_size: int,
               race_prior: tuple[tuple[int, int], ...] = (), choose: bool = False) -> list[TrialTask]:
    """Split ``trials`` of ``study`` into tasks: one per trial, or groups of ``group_size`` when vectorized.

    Vectorized groups follow point order (trials ``[0, K)``, ``[K, 2K)``, ... of the study, minus the
    finished ones), so a resumed sweep groups its remaining trials as an uninterrupted one would.
    For a raced study all ``trials`` are one task (:class:`TrialTask`) with ``race_prior`` (the sweep
    passes one chunk at a time). ``choose``: vectorized tasks
    let the worker decide by measured cost whether to run vectorized (``vectorize = "auto"``).
    """
    choose = bool(choose and vectorized)
    if study.race:
        return [TrialTask(study, tuple(trials), vectorized, group_size if vectorized else 0, tuple(race_prior),
                          choose)] if trials else []
    if not vectorized:
        return [TrialTask(study, (t,), False) for t in trials]
    groups: dict[int, list[TrialPlan]] = {}
    for t in trials:
        groups.setdefault(t.point_index // group_size, []).append(t)
    # A group of one still runs through the vectorized code path, so a trial's numbers do not depend
    # on how many of its study's trials were left to run (resume).
    return [TrialTask(study, tuple(g), True, choose=choose) for _, g in sorted(groups.items())]
