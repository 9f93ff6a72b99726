"""What a worker runs: one task (one trial, or K trials vectorized) -> plain, picklable results.

Workers never touch the store: they return each trial's status, step counts and measurements, and
the sweep's driver publishes them. So a worker killed mid-task leaves nothing behind, and its task
simply runs again.

Tasks carry the workload as its key (a registered name or a reference,
:func:`batchlab.workloads.workload_key`), never as an object, so a spawned pool worker or a Dask
worker re-imports a user's workload from its file or package; and the device name the sweep was
given (``auto`` in a pinned pool worker means that worker's GPU, :mod:`batchlab.train.device`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from batchlab.sweep.executors import set_worker_threads
from batchlab.sweep.plan import TrialTask


@dataclass
class TrialOutcome:
    """One finished trial as the worker saw it (``measurements``: one dict per evaluation, with ``step``)."""

    key: str
    trial_id: int
    seed: int
    parameters: dict[str, Any]
    status: str
    steps: int
    steps_to_goal: int | None
    steps_lower: int | None = None  # the evaluation before ``steps_to_goal`` (0 if none; None if not reached)
    measurements: list[dict[str, float]] = field(default_factory=list)
    wall_time_s: float = 0.0
    vectorized: bool = False
    device: str = "cpu"  # where it trained (``cpu``, ``cuda:0``, ...: ``TrialResult.device``)

    @property
    def diverged(self) -> bool:
        from batchlab.train.core import INFEASIBLE

        return self.status == INFEASIBLE


def trial_spec(task: TrialTask, index: int):
    """The :class:`batchlab.train.TrialSpec` of trial ``index`` of ``task``: the study's workload key,
    budget, evaluation schedule (``resolution``, ``evaluations``), device and study definition. The
    device is the study's: ``auto`` becomes the type the driver resolved it to (``study.device_type``,
    the one its definition records), so a remote Dask worker with a GPU under a CPU driver trains on
    the CPU, as the definition says."""
    from batchlab.train import TrialSpec
    from batchlab.workloads import workload_key

    study, trial = task.study, task.trials[index]
    # "auto" is resolved once, by the driver, to the device type its study definitions record; a worker
    # trains on that type (a pinned pool worker on its own GPU), never on whatever it happens to have.
    device = study.device_type if study.device == "auto" else study.device
    return TrialSpec(
        workload=workload_key(study.workload), optimizer=study.optimizer, batch_size=study.batch_size,
        hyperparameters=dict(trial.hyperparameters), steps=study.steps, train_examples=study.train_examples,
        seed=trial.seed, stop_at_goal=study.stop_at_goal, trial_id=trial.trial_id, trial_key=trial.key,
        search_space=study.stretched_search_space, data_seed=study.seed, resolution=study.resolution,
        evaluations=study.evaluations, study_definition=study.definition, goal=study.goal, device=device,
        data_order_seed=study.data_order_seed,
    )


def run_task(task: TrialTask) -> list[TrialOutcome]:
    """Run every trial of ``task``; one outcome per trial, in order.

    Vectorized when ``task.vectorized`` (in groups of ``task.group_size``, 0: all at once; with
    ``task.choose`` only when :func:`batchlab.sweep.vectorize_choice.vectorization_pays`), unless the
    trials turn out not to be vectorizable (:class:`batchlab.sweep.vectorized.NotVectorizable`: their
    model has dropout or batch norm, say); then they run one at a time, with the results
    :func:`batchlab.train.run_trial` gives, and their outcomes say ``vectorized=False``. A raced
    study's task (``task.study.race``) runs its trials against one :class:`batchlab.train.race.Race`
    started from ``task.race_prior``: each group, or each trial, races those before it."""
    set_worker_threads()
    from batchlab.train import prepare_trial, run_prepared

    specs = [trial_spec(task, i) for i in range(len(task.trials))]
    race = None
    if task.study.race:
        from batchlab.train.race import Race

        race = Race(reached=task.race_prior)
    results: list = []
    flags: list[bool] = []
    if task.vectorized:
        from batchlab.sweep.vectorize_choice import vectorization_pays
        from batchlab.sweep.vectorized import NotVectorizable, run_trials_vectorized

        size = task.group_size or len(specs)
        # vectorize = "auto": measured (a bit-identity self-check, and cost) once per kind of task
        # in this worker (vectorization_pays' cache) and applied to every group of the task
        if not task.choose or vectorization_pays(specs[:size]):
            try:
                for start in range(0, len(specs), size):
                    group = specs[start:start + size]
                    results.extend(run_trials_vectorized(group, race=race))
                    flags.extend([True] * len(group))
            except NotVectorizable:  # e.g. a user's model with dropout or batch norm: the rest one at a time
                pass
    for spec in specs[len(results):]:
        results.append(run_prepared(prepare_trial(spec), race=race))
        flags.append(False)
    return [
        TrialOutcome(
            key=trial.key, trial_id=trial.trial_id, seed=trial.seed, parameters=dict(result.parameters),
            status=result.status, steps=int(result.steps), steps_to_goal=result.steps_to_goal,
            steps_lower=result.steps_lower,
            measurements=[{k: float(v) if k != "step" else int(v) for k, v in row.items()}
                          for row in result.measurements],
            wall_time_s=float(result.wall_time_s), vectorized=vectorized, device=result.device,
        )
        for trial, result, vectorized in zip(task.trials, results, flags)
    ]


def measurement_triples(outcome: TrialOutcome) -> list[tuple[int, str, float]]:
    """The outcome's measurements as the store's ``(step, metric, value)`` triples."""
    triples = []
    for row in outcome.measurements:
        step = int(row["step"])
        for metric, value in row.items():
            if metric != "step":
                triples.append((step, metric, float(value)))
    return triples
