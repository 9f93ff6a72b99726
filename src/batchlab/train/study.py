"""One study: one workload at one batch size, trials at quasi-random points run one after another.

Conventions:

* The search space is ``search_space`` (parameter_configs, e.g. from ``--search-space FILE``) when
  given, else the workload's declared space for the optimizer (``Workload.search_spaces``), else the
  optimizer's default for the study's step budget (``batchlab.search.study_search_space``); it is
  recorded in the store with every trial (in the study definition, so another space is another study).
* Trial ids come from ``store.next_trial_id`` (1 for a new study). Trial id ``k`` takes point
  ``k - 1`` of the space's quasi-random sequence for ``seed`` and the trial seed ``seed + k - 1``,
  so running a study twice into the same store continues the sequence instead of repeating it, and
  the first trial of a fresh study equals ``batchlab train ... --seed SEED`` at that point. The data
  seed (which examples form a ``train_examples`` subset) is ``seed`` for every trial of the study,
  as in ``batchlab.sweep``.
* The study definition (``batchlab.store.studies.make_study_definition``, source ``"batchlab study"``)
  is the same for every trial: budget, training examples, search space, evaluation rule
  (``{"rule": "geometric", "resolution": r, "refine": "replay"}``), stop rule (with ``stop_at_goal``),
  ``seed``, the device type when it is not the CPU, and ``race`` (``{"keep": 2}``) when raced.
* Racing (``race=True``, :mod:`batchlab.train.race`): the trials still run one after another, each
  stopped (status ``RACED``) at the first evaluation after which it can no longer be among the
  study's two best; the steps to result, its bracket, the best trial and the one-sided steps
  interval are exactly those of the full protocol. Trials of the same study already in the store
  (a continued study) race too.
* ``workload`` is a :class:`batchlab.workloads.Workload` or anything
  :func:`batchlab.workloads.resolve_workload` accepts (a name, an entry point, a reference); the
  trials carry it as given.
* The best trial (Shallue et al.'s protocol, docs/methods.md, "Steps to result"): among trials that ran
  to their budget (COMPLETE) or stopped at the goal (STOPPED_AT_GOAL), the one with the fewest steps
  to the goal; ties go to the lower trial id. When no trial reached the goal, the study reports
  instead the COMPLETE trial with the best goal metric at its last evaluation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from batchlab.errors import BatchlabError
from batchlab.train.core import COMPLETE, STOPPED_AT_GOAL
from batchlab.train.trial import (
    TrialResult,
    TrialSpec,
    default_study_definition,
    geometric_evaluation,
    prepare_trial,
    run_prepared,
    stop_rule,
)
from batchlab.workloads.schedule import DEFAULT_RESOLUTION

__all__ = ["StudyResult", "best_trial", "best_final_trial", "check_points", "check_study", "run_study",
           "study_trial_specs"]


@dataclass
class StudyResult:
    """The trials of one study run (in order) and its best trials (see the module docstring)."""

    workload: str
    batch_size: int
    search_space: dict
    trials: list[TrialResult] = field(default_factory=list)

    @property
    def best(self) -> TrialResult | None:
        """The trial with the fewest steps to the goal, or ``None`` if no trial reached it."""
        return best_trial(self.trials)

    @property
    def best_final(self) -> TrialResult | None:
        """The trial with the best final goal metric (for studies where none reached the goal)."""
        return best_final_trial(self.trials)


def best_trial(trials: list[TrialResult]) -> TrialResult | None:
    """The COMPLETE or STOPPED_AT_GOAL trial with the fewest steps to the goal, ties to the lower trial
    id; else None."""
    reached = [t for t in trials if t.status in (COMPLETE, STOPPED_AT_GOAL) and t.steps_to_goal is not None]
    return min(reached, key=lambda t: (t.steps_to_goal, t.trial_id if t.trial_id is not None else 0), default=None)


def best_final_trial(trials: list[TrialResult]) -> TrialResult | None:
    """The COMPLETE trial whose goal metric at its last evaluation is best (lowest, or highest when
    the workload maximizes it); ties to the lower trial id; None if no COMPLETE trial measured it."""
    scored = [(t.final_metric(), t) for t in trials if t.status == COMPLETE and t.final_metric() is not None]
    if not scored:
        return None

    def key(item):
        value, trial = item
        return (-value if trial.maximize else value, trial.trial_id if trial.trial_id is not None else 0)

    return min(scored, key=key)[1]


def study_trial_specs(
    workload: Any,
    optimizer: str,
    batch_size: int,
    trials: int,
    first_trial_id: int,
    steps: int,
    train_examples: int | None = None,
    seed: int = 0,
    stop_at_goal: bool = True,
    eval_budget: float | None = None,
    train_eval_examples: int | None = None,
    resolution: float = DEFAULT_RESOLUTION,
    refine: str = "replay",
    device: str = "auto",
    race: bool = False,
    search_space: dict | None = None,
) -> list[TrialSpec]:
    """The specs of ``trials`` consecutive trials of a study, starting at ``first_trial_id``.

    ``eval_budget``, ``train_eval_examples``, ``resolution``, ``refine`` and ``device`` are as in
    :class:`TrialSpec`, the same for every trial, as is the study definition (see the module
    docstring; ``race`` adds its ``race`` entry); ``search_space`` as there."""
    from batchlab.train.race import race_definition
    from batchlab.search import study_search_space
    from batchlab.store.schema import store_workload_name
    from batchlab.train.device import device_type
    from batchlab.workloads import resolve_workload

    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise BatchlabError(f"number of trials must be an integer >= 1, got {trials!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise BatchlabError(f"seed must be an integer >= 0, got {seed!r}")
    if race and not stop_at_goal:
        raise BatchlabError("racing needs trials that stop at the goal: drop --no-stop-at-goal, or drop --race")
    w = resolve_workload(workload)
    space = study_search_space(optimizer, search_space, w, train_steps=steps)
    first_index = max(0, int(first_trial_id) - 1)
    points = space.sample(first_index + trials, seed=seed)[first_index:]
    configs = space.to_batch_science()
    kind = device_type(device)
    probe = TrialSpec(workload=workload, optimizer=optimizer, batch_size=batch_size, hyperparameters={}, steps=steps,
                      train_examples=train_examples, data_seed=seed, search_space=configs)
    evaluation = geometric_evaluation(resolution, refine, eval_budget)
    try:
        definition = default_study_definition(
            probe, store_workload=store_workload_name(w.name, optimizer), steps=steps, evaluation=evaluation,
            stop_rule=stop_rule(w) if stop_at_goal else None, source="batchlab study", device=kind,
            **({"race": race_definition()} if race else {}),
        )
    except BatchlabError:
        definition = None  # bad input: prepare_trial names it
    return [
        TrialSpec(
            workload=workload,
            optimizer=optimizer,
            batch_size=batch_size,
            hyperparameters=point,
            steps=steps,
            train_examples=train_examples,
            seed=seed + first_index + i,
            data_seed=seed,
            stop_at_goal=stop_at_goal,
            trial_id=first_trial_id + i,
            search_space=configs,
            eval_budget=eval_budget,
            train_eval_examples=train_eval_examples,
            resolution=resolution,
            refine=refine,
            study_definition=definition,
            device=device,
        )
        for i, point in enumerate(points)
    ]


def check_study(
    workload: Any,
    optimizer: str,
    batch_size: int,
    trials: int,
    steps: int | None = None,
    train_examples: int | None = None,
    seed: int = 0,
    stop_at_goal: bool = True,
    eval_budget: float | None = None,
    train_eval_examples: int | None = None,
    resolution: float = DEFAULT_RESOLUTION,
    refine: str = "replay",
    device: str = "auto",
    race: bool = False,
    search_space: dict | None = None,
) -> int:
    """Validate a study (workload, optimizer, batch size, data, budget, device, the hyperparameters of
    its ``trials`` first points) without writing anything; return its step budget (``steps``, or the
    workload's default). Raises BatchlabError."""
    from batchlab.workloads import resolve_workload

    budget = resolve_workload(workload).default_steps if steps is None else steps
    specs = study_trial_specs(workload, optimizer, batch_size, trials, 1, budget, train_examples, seed, stop_at_goal,
                              eval_budget, train_eval_examples, resolution, refine, device, race, search_space)
    check_points(specs)
    prepare_trial(specs[0])
    return budget


def check_points(specs: list[TrialSpec]) -> None:
    """BatchlabError (one line) when a point of these trials is not a valid set of hyperparameters for
    their optimizer (a search space whose range leaves the optimizer's allowed values)."""
    from batchlab.optim import resolve_hyperparameters

    for spec in specs:
        try:
            resolve_hyperparameters(spec.optimizer, spec.hyperparameters)
        except BatchlabError as exc:
            raise BatchlabError(f"search space of {spec.optimizer}, trial {spec.trial_id}: {exc}") from None


def run_study(
    workload: Any,
    optimizer: str,
    batch_size: int,
    trials: int,
    store: Any,
    steps: int | None = None,
    train_examples: int | None = None,
    seed: int = 0,
    stop_at_goal: bool = True,
    on_trial: Callable[[TrialResult], None] | None = None,
    on_measurement: Callable[[dict], None] | None = None,
    eval_budget: float | None = None,
    train_eval_examples: int | None = None,
    resolution: float = DEFAULT_RESOLUTION,
    refine: str = "replay",
    device: str = "auto",
    race: bool = False,
    search_space: dict | None = None,
) -> StudyResult:
    """Run ``trials`` trials of one study one after another, each recorded into ``store``.

    Everything is validated first (:func:`check_study`), so bad input writes nothing.
    ``steps=None`` uses the workload's default budget. ``on_trial`` is called after each trial.
    ``eval_budget``, ``train_eval_examples``, ``resolution``, ``refine`` and ``device`` are as in
    :class:`TrialSpec`; ``race`` races the trials and ``search_space`` replaces the default space
    (module docstring).
    """
    from batchlab.store.schema import store_workload_name
    from batchlab.workloads import resolve_workload

    if store is None:
        raise BatchlabError("a study needs a store to record its trials")
    budget = check_study(workload, optimizer, batch_size, trials, steps, train_examples, seed, stop_at_goal,
                         eval_budget, train_eval_examples, resolution, refine, device, race, search_space)
    name = store_workload_name(resolve_workload(workload).name, optimizer)
    first_id = store.next_trial_id(name, int(batch_size))
    specs = study_trial_specs(workload, optimizer, batch_size, trials, first_id, budget, train_examples, seed, stop_at_goal,
                              eval_budget, train_eval_examples, resolution, refine, device, race, search_space)
    check_points(specs)  # the points of a continued study, from its next trial id on
    contest = None
    if race:
        from batchlab.store.studies import study_id
        from batchlab.train.race import Race, published_keys

        w = resolve_workload(workload)
        contest = Race(reached=published_keys(store, study_id(specs[0].study_definition), w.metric, float(w.goal),
                                              bool(w.maximize)))
    result = StudyResult(
        workload=name,
        batch_size=int(batch_size),
        search_space=specs[0].search_space,
    )
    for spec in specs:
        trial = run_prepared(prepare_trial(spec), store=store, on_measurement=on_measurement, race=contest)
        result.trials.append(trial)
        if on_trial is not None:
            on_trial(trial)
    return result
