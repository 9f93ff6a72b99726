"""The plan of a sweep: its studies, their trials and the tasks that run them.

Everything here is plain, picklable data (no torch), so tasks travel to process-pool and Dask
workers unchanged. A *task* is one or more trials of one study that a worker runs together: one
trial (sequential) or up to ``vectorize_trials`` trials as one batched computation (vectorized).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from batchlab.sweep.config import SweepConfig
from batchlab.sweep.keys import store_workload_name, study_digest, trial_id, trial_key, trial_seed


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

    ``budget_round`` is 0 for the configured budget and ``r`` for the ``r``-th growth.
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

    @property
    def store_workload(self) -> str:
        """``dataset/model/optimizer``, the store's workload name."""
        return store_workload_name(self.workload, self.optimizer)

    @property
    def name(self) -> str:
        """A short label: ``dataset/model/optimizer b=64`` (plus the round when grown)."""
        grown = f" (budget x{self.budget_round} grown)" if self.budget_round else ""
        return f"{self.store_workload} b={self.batch_size}{grown}"

    @property
    def digest(self) -> str:
        """Digest of the study definition that enters every trial key."""
        return study_digest(steps=self.steps, train_examples=self.train_examples,
                            stop_at_goal=self.stop_at_goal, search_space=self.search_space,
                            evaluations=self.evaluations)

    def trial_plans(self) -> list[TrialPlan]:
        """The study's trials in point order (``len == trials``)."""
        digest = self.digest
        return [
            TrialPlan(
                key=trial_key(self.workload, self.optimizer, self.batch_size, i, self.seed, digest),
                trial_id=trial_id(i, self.budget_round),
                point_index=i,
                seed=trial_seed(self.seed, i),
                hyperparameters=dict(point),
            )
            for i, point in enumerate(self.points)
        ]

    def grown(self, factor: float) -> "StudyPlan":
        """The same study with its step budget multiplied by ``factor`` (next budget round)."""
        return replace(self, steps=int(round(self.steps * factor)), budget_round=self.budget_round + 1)


@dataclass(frozen=True)
class TrialTask:
    """Trials of one study that one worker runs, together when ``vectorized``."""

    study: StudyPlan
    trials: tuple[TrialPlan, ...]
    vectorized: bool

    @property
    def key(self) -> str:
        """A unique name for the task (its first trial key and size)."""
        return f"{self.trials[0].key}|n={len(self.trials)}"

    @property
    def estimated_cost(self) -> float:
        """A rough relative cost (steps x examples per step x trials, with a floor for per-step overhead),
        used to start the longest tasks first."""
        return float(self.study.steps) * max(self.study.batch_size, 32) * len(self.trials)


def plan_studies(config: SweepConfig) -> list[StudyPlan]:
    """Every study of ``config`` (workloads x optimizers x batch sizes), with sampled search-space points.

    The points of a study are ``space.sample(trials, seed=config.seed)``; they do not depend on the
    batch size, so every study of one (workload, optimizer) searches the same points.
    """
    from batchlab.search import SearchSpace, default_search_space
    from batchlab.workloads import get_workload

    studies = []
    for workload_name in config.workloads:
        workload = get_workload(workload_name)
        for optimizer in config.optimizers:
            for batch_size in config.batch_sizes:
                steps = config.study_steps(workload.default_steps, batch_size)
                if optimizer in config.search_spaces:
                    space = SearchSpace.from_batch_science(config.search_spaces[optimizer])
                else:
                    space = default_search_space(optimizer, train_steps=steps)
                studies.append(
                    StudyPlan(
                        workload=workload.name, optimizer=optimizer, batch_size=batch_size, steps=steps,
                        trials=config.trials, seed=config.seed, train_examples=config.train_examples,
                        stop_at_goal=config.stop_at_goal, search_space=space.to_batch_science(),
                        metric=workload.metric, goal=float(workload.goal), maximize=bool(workload.maximize),
                        evaluations=config.evaluations,
                        points=tuple(space.sample(config.trials, seed=config.seed)),
                    )
                )
    return studies


def make_tasks(study: StudyPlan, trials: list[TrialPlan], vectorized: bool, group_size: int) -> list[TrialTask]:
    """Split ``trials`` of ``study`` into tasks: one per trial, or groups of ``group_size`` when vectorized.

    Vectorized groups follow point order (trials ``[0, K)``, ``[K, 2K)``, ... of the study, minus the
    finished ones), so a resumed sweep groups its remaining trials as an uninterrupted one would.
    """
    if not vectorized:
        return [TrialTask(study, (t,), False) for t in trials]
    groups: dict[int, list[TrialPlan]] = {}
    for t in trials:
        groups.setdefault(t.point_index // group_size, []).append(t)
    # A group of one still runs through the vectorized code path, so a trial's numbers do not depend
    # on how many of its study's trials were left to run (resume).
    return [TrialTask(study, tuple(g), True) for _, g in sorted(groups.items())]
