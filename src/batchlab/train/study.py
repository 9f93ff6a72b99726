"""One study: one workload at one batch size, trials at quasi-random points run one after another.

Conventions:

* The search space is ``search_space`` (parameter_configs, e.g. from ``--search-space FILE``) when
  given, else the workload's declared space for the optimizer (``Workload.search_spaces``), else the
  optimizer's default for the study's step budget (``batchlab.search.study_search_space``); it is
  recorded in the store with every trial (in the study definition, so another space is another study).
* Trial ids come from ``store.next_trial_id`` (1 for a new study). Trial id ``k`` takes point
  ``k - 1`` of the study's own quasi-random sequence (the space's scrambled Halton sequence for
  ``batchlab.search.study_points_seed(seed, workload name, optimizer, batch size)``, as a sweep's
  study at that batch size) and the trial seed ``seed + k - 1``,
  so running a study twice into the same store continues the sequence instead of repeating it, and
  the first trial of a fresh study equals ``batchlab train ... --seed SEED`` at that point. The data
  seed (which examples form a ``train_examples`` subset) is ``seed`` for every trial of the study,
  as in ``batchlab.sweep``.
* The study definition (``batchlab.store.studies.make_study_definition``, source ``"batchlab study"``)
  is the same for every trial: budget, training examples, search space, evaluation rule
  (``{"rule": "geometric", "resolution": r, "refine": "replay"}``), stop rule (with ``stop_at_goal``),
  ``seed``, the device type when it is not the CPU, ``race`` (``{"keep": 2}``) when raced, and
  ``points`` (``batchlab.search.POINTS_RULE``: a store's study from before each study had its own
  points is another study).
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
  instead the COMPLETE trial with the best goal metric at its last evaluation
  (:func:`best_final_summary`): only trials that ran their whole budget (COMPLETE) are comparable
  there (a STOPPED_AT_GOAL or RACED trial's last evaluation is at its stop), and only when no trial
  reached the goal and none was raced, so a raced study reports the same as the full protocol (racing
  stops nothing until two trials have reached the goal).
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

__all__ = ["StudyResult", "best_trial", "best_final_summary", "best_final_trial", "check_points", "check_study", "run_study",
           "study_trial_specs"]


@dataclass
class StudyResult:
    """The trials of one study run (in order) and its best trials (see the module docstring).

    With ``refine_search`` (:func:`run_study`), ``trials`` holds the search round's trials after the
    others (their ids in ``refined``), ``flags`` the tuning flags read from this run's other trials."""

    workload: str
    batch_size: int
    search_space: dict
    trials: list[TrialResult] = field(default_factory=list)
    flags: list = field(default_factory=list)
    refined: list[int] = field(default_factory=list)

    @property
    def best(self) -> TrialResult | None:
        """The trial with the fewest steps to the goal, or ``None`` if no trial reached it."""
        return best_trial(self.trials)


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


def best_final_summary(trials: list[TrialResult]) -> dict:
    """``{"best_final_trial", "best_final_metric", "best_final_over"}`` of a study's ``trials``: the
    :func:`best_final_trial` and its final goal metric, over the ``best_final_over`` trials that ran
    their whole budget (COMPLETE). All three are ``None`` when a trial reached the goal (the study's
    answer is its best trial) or was RACED (racing stops trials early, so the COMPLETE ones are not
    the full protocol's), so a raced study and its full run report the same."""
    from batchlab.train.core import RACED

    none = {"best_final_trial": None, "best_final_metric": None, "best_final_over": None}
    if best_trial(trials) is not None or any(t.status == RACED for t in trials):
        return none
    best = best_final_trial(trials)
    if best is None:
        return none
    return {"best_final_trial": best.trial_id, "best_final_metric": best.final_metric(),
            "best_final_over": sum(t.status == COMPLETE for t in trials)}


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
    from batchlab.search import POINTS_RULE, study_points_seed, study_search_space
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
    own = study_points_seed(seed, w.name, optimizer, batch_size)  # the study's own sequence
    points = space.sample(first_index + trials, seed=own)[first_index:]
    configs = space.to_batch_science()
    kind = device_type(device)
    probe = TrialSpec(workload=workload, optimizer=optimizer, batch_size=batch_size, hyperparameters={}, steps=steps,
                      train_examples=train_examples, data_seed=seed, search_space=configs)
    evaluation = geometric_evaluation(resolution, refine, eval_budget)
    try:
        definition = default_study_definition(
            probe, store_workload=store_workload_name(w.name, optimizer), steps=steps, evaluation=evaluation,
            stop_rule=stop_rule(w) if stop_at_goal else None, source="batchlab study", device=kind,
            points=POINTS_RULE, **({"race": race_definition()} if race else {}),
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
    refine_search: int | None = None,
    flags_fn: Callable | None = None,
) -> StudyResult:
    """Run ``trials`` trials of one study one after another, each recorded into ``store``.

    Everything is validated first (:func:`check_study`), so bad input writes nothing.
    ``steps=None`` uses the workload's default budget. ``on_trial`` is called after each trial.
    ``eval_budget``, ``train_eval_examples``, ``resolution``, ``refine`` and ``device`` are as in
    :class:`TrialSpec`; ``race`` races the trials and ``search_space`` replaces the default space
    (module docstring). ``refine_search``: when a tuning flag fires for this run's trials
    (``flags_fn``, default :func:`batchlab.analysis.tuning_flags.tuning_flags` over this one batch
    size), up to that many more trials around the best one, as search round 1 of the study
    (:func:`refine_study_trials`; docs/methods.md, "Refined search").
    """
    from batchlab.store.schema import store_workload_name
    from batchlab.workloads import resolve_workload

    if store is None:
        raise BatchlabError("a study needs a store to record its trials")
    if refine_search is not None:
        from batchlab.sweep.refine import refine_budget

        refine_search = refine_budget(refine_search)  # before anything runs
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
    if refine_search is not None:
        refine_study_trials(result, specs, store, refine_search, race, on_trial, on_measurement, flags_fn)
    return result


def refine_study_trials(result: StudyResult, specs: list[TrialSpec], store: Any, budget: int, race: bool = False,
                        on_trial: Callable[[TrialResult], None] | None = None,
                        on_measurement: Callable[[dict], None] | None = None,
                        flags_fn: Callable | None = None) -> None:
    """Search round 1 of a study just run (``result``, from ``specs``): when a tuning flag fires for its
    trials and one reached the goal, ``budget`` more trials in the box around the best one
    (:func:`batchlab.sweep.refine.refine_box`, as a sweep's search round), recorded under the study
    definition of the round with the box as its search space plus ``search_round`` and ``refine`` (the
    decision, with the refined study's id). A continued search round (the same command again, the same
    incumbent) goes on with the round's next points. Trial ids continue the store's; seeds are
    ``batchlab.sweep.keys.trial_seed(seed, 100000 + index)``. Appends to ``result``."""
    from dataclasses import replace

    from batchlab.analysis.tuning_flags import StudyTuning, tuning_flags
    from batchlab.search import SearchSpace, study_points_seed
    from batchlab.store.studies import study_id
    from batchlab.sweep.config import MAX_TRIALS_PER_STUDY
    from batchlab.sweep.keys import trial_seed
    from batchlab.sweep.refine import refine_box, refine_budget

    budget = refine_budget(budget)
    best = result.best
    first = specs[0]
    tuning = StudyTuning(batch_size=result.batch_size, steps=None if best is None else best.steps_to_goal,
                         n_reached=sum(t.steps_to_goal is not None for t in result.trials),
                         n_trials=len(result.trials), best_point=None if best is None else dict(best.parameters),
                         space=SearchSpace.from_batch_science(first.search_space))
    result.flags = list((flags_fn or tuning_flags)([tuning]))
    if best is None or not result.flags:
        return
    base = first.study_definition
    name = result.workload.rsplit("/", 1)[0]
    seed = study_points_seed(first.data_seed, name, first.optimizer, result.batch_size, 1)
    box, points, decision = refine_box(first.search_space, first.optimizer, best.parameters, result.flags, budget, seed)
    decision["study"] = study_id(base)
    definition = {**base, "search_space": box.to_batch_science(), "search_round": 1, "refine": decision}
    digest = study_id(definition)
    con = store.connect()
    try:
        (start,) = con.execute("SELECT count(*) FROM trials WHERE study_id = ?", [digest]).fetchone()
    finally:
        con.close()
    if start:  # a continued search round: its next points
        points = box.sample(int(start) + budget, seed=seed)[int(start):]
    first_id = store.next_trial_id(result.workload, result.batch_size)
    contest = None
    if race:
        from batchlab.train.race import Race, published_keys

        contest = Race(reached=published_keys(store, digest, best.metric, float(best.goal), bool(best.maximize)))
    refined = [replace(first, hyperparameters=point, trial_id=first_id + i, search_space=box.to_batch_science(),
                       seed=trial_seed(first.data_seed, MAX_TRIALS_PER_STUDY + int(start) + i),
                       study_definition=definition) for i, point in enumerate(points)]
    check_points(refined)
    for spec in refined:
        trial = run_prepared(prepare_trial(spec), store=store, on_measurement=on_measurement, race=contest)
        result.trials.append(trial)
        result.refined.append(trial.trial_id)
        if on_trial is not None:
            on_trial(trial)
