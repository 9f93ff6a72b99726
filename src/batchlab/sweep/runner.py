"""The sweep driver: plan, skip what is finished, run the rest on an executor, publish, summarize.

Flow: :func:`prepare_sweep` validates everything that can be checked without training (names,
search spaces, batch sizes against the training set, metaparameters against the optimizer, an
analysis goal the stop rule could not answer) and gives every study (every budget round the growth
rule may add included) its block of trial ids in the store (:func:`batchlab.sweep.keys.allocate_ids`:
a study already in the store keeps its ids, a new study definition takes a free block, so sweeps
with other settings on one store are kept apart); it writes nothing. :func:`run_sweep` then opens
(or creates) the store, skips trials whose keys are published, submits the rest as tasks, and
publishes each finished task's trials, with their study definition, in one atomic store commit.
The summary (steps to result per batch size, S(B) fits) reads only this sweep's own trials: the
planned trials of the budget rounds it ran, never other trials in the store for that workload
and batch size. The driver is the only writer of its trials, so:

* a SIGKILL of the driver loses the tasks in flight (workers die with it) and nothing else; the
  next run skips every published trial and re-runs the others, with the same ids, seeds and points;
* a SIGKILL of a worker loses its task, which the driver runs again (the store's
  ``publish_trials`` also skips keys already published, so no trial is ever stored twice);
* Ctrl-C (KeyboardInterrupt) aborts the executor and raises :class:`SweepInterrupted`, which says
  how many of the sweep's trials are in the store; ``batchlab sweep`` prints it as one line and exits
  with status 130.

Several drivers may run the same sweep into one store at once (on one machine, or on machines that
share the store's file system): every trial is claimed before it runs (:mod:`batchlab.sweep.claims`),
a trial claimed by another live driver is not run but awaited until it is published (or taken over
when its driver dies), so the drivers share the work and each ends with the whole sweep's table.
Each driver's ``trials_run`` and ``trial`` events count only the trials it ran;
``trials_by_others`` the trials of its sweep that other drivers published while it ran.

Workloads reach the workers as the string :func:`batchlab.workloads.workload_key` gives (a registered
name or a reference that workers re-import); a workload registered only in this process cannot be
imported by pool or Dask workers, and :func:`run_sweep` refuses it (one line) unless an
``executor_factory`` that runs in this process (``InlineExecutor``) is given.

Which studies run vectorized, and how a forced vectorization that is not exact is recorded:
:mod:`batchlab.sweep.vectorize_plan`. K shrinks so that every worker gets a task (except for raced
studies). A raced study's trials run one chunk after another (one trial, or one
vectorized group of ``vectorize_trials``), each chunk submitted once the one before is published and
racing the study's published trials, so an interrupted sweep keeps every trial it finished.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from batchlab.errors import BatchlabError
from batchlab.sweep.budget import ran_out_of_steps
from batchlab.sweep.config import SweepConfig
from batchlab.sweep.plan import StudyPlan, TrialTask, make_tasks, plan_studies
from batchlab.sweep.summary import (SweepSummary, restrict_to_sweep, analysis_goal, reported_rounds,
                                    summarize)
from batchlab.sweep.vectorize_plan import mark_inexact_vectorization, should_vectorize
from batchlab.sweep.worker import TrialOutcome, measurement_triples, run_task


@dataclass
class StudyProgress:
    """Counts of one study (all its budget rounds): trials done, diverged, remaining."""

    study: StudyPlan
    total: int
    done: int = 0
    diverged: int = 0
    skipped: int = 0  # finished before this run (resume)
    vectorized: bool = False

    @property
    def remaining(self) -> int:
        return self.total - self.done


@dataclass
class SweepPlan:
    """A validated sweep, ready to run: its config, studies (round 0) and id blocks.

    ``first_ids``: ``{(store workload, batch size, budget round): id of point 0}`` for every round the
    growth rule may add (:func:`batchlab.sweep.keys.allocate_ids`); ``sweep_id``: the sweep's id
    (:func:`batchlab.sweep.keys.sweep_id`); ``device_type``: the type the sweep's device resolved to;
    ``warnings``: one-line warnings about the plan (forced vectorization that is not bit-identical
    here: :func:`mark_inexact_vectorization`), which the reporters print on stderr.
    """

    config: SweepConfig
    store_path: str
    studies: list[StudyPlan]
    num_parameters: dict[str, int] = field(default_factory=dict)
    first_ids: dict[tuple[str, int, int], int] = field(default_factory=dict)
    sweep_id: str = ""
    device_type: str = "cpu"
    warnings: list[str] = field(default_factory=list)

    def grown(self, study: StudyPlan) -> StudyPlan:
        """The next budget round of ``study``, in its id block."""
        bigger = study.grown(self.config.grow_factor)
        first = self.first_ids.get((bigger.store_workload, bigger.batch_size, bigger.budget_round))
        if first is None:  # pragma: no cover - prepare_sweep plans every round the rule may add
            raise BatchlabError(f"no id block planned for {bigger.name}")
        return replace(bigger, first_trial_id=first)


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`run_sweep`: ``saved`` of the sweep's ``total`` planned trials are in the
    store (``run`` of them published by this run); re-running the same sweep resumes."""

    def __init__(self, saved: int, run: int, total: int) -> None:
        super().__init__(f"interrupted: {saved} trials saved; re-run the same command to resume")
        self.saved, self.run, self.total = saved, run, total


class Reporter:
    """Receives the sweep's events (the CLI prints them as progress bars or JSON lines).

    ``start`` comes once, after the trials finished before this run are counted in every study's
    :class:`StudyProgress`; ``trial`` after each trial this run publishes (its study's counts
    already updated); ``trials_by_others`` when trials of the sweep that another driver ran were
    published (:mod:`batchlab.sweep.claims`; the study's counts already include them); ``budget_grown`` when a study gets a grown round (its trials finished before
    this run are counted right after); ``finish`` with the summary. ``close`` stops any live display
    (the command line calls it when the sweep is interrupted)."""

    def start(self, plan: SweepPlan, progress: list[StudyProgress], info: dict) -> None: ...
    def trial(self, progress: StudyProgress, outcome: TrialOutcome, totals: dict) -> None: ...
    def trials_by_others(self, progress: StudyProgress, keys: list[str], totals: dict) -> None: ...
    def study_added(self, progress: StudyProgress) -> None: ...
    def worker_lost(self, keys: list[str]) -> None: ...
    def budget_grown(self, old: StudyPlan, new: StudyPlan) -> None: ...
    def search_refined(self, new: StudyPlan) -> None: ...
    def finish(self, summary: "SweepSummary") -> None: ...
    def close(self) -> None: ...


def part_of(plan: SweepPlan, batch_sizes=None, optimizers=None) -> SweepPlan:
    """The part of ``plan`` whose studies are at the batch sizes ``batch_sizes`` and with the optimizers
    ``optimizers`` (None: all of the sweep's): the same sweep (its id, its studies' definitions, trial
    keys and ids are those of the whole plan), so running the parts in any order, then the whole,
    measures exactly what the whole would (a long sweep can run the studies that matter first). Budget
    growth applies to the part's studies as it would in the whole.

    Raises:
        BatchlabError: an empty list, or a batch size or optimizer that is not one of the sweep's.
    """
    studies = plan.studies
    for option, given, of in (("--only-batch-sizes", batch_sizes, lambda s: s.batch_size),
                              ("--only-optimizers", optimizers, lambda s: s.optimizer)):
        if given is None:
            continue
        wanted = sorted(set(given))
        swept = sorted({of(s) for s in plan.studies})
        unknown = [v for v in wanted if v not in swept]
        if not wanted or unknown:
            raise BatchlabError(f"{option} {','.join(map(str, unknown)) or '(empty)'}: not in this sweep; allowed: "
                                f"{', '.join(map(str, swept))}")
        studies = [s for s in studies if of(s) in wanted]
    return replace(plan, studies=studies)


def prepare_sweep(config: SweepConfig, store_path: str | None = None) -> SweepPlan:
    """Validate ``config`` fully (nothing is written) and return the plan.

    Raises:
        BatchlabError: no store path, a batch size larger than the training set, a search-space
            parameter the optimizer does not accept, or trial ids in the store under other keys.
    """
    from batchlab.optim import optimizer_defaults
    from batchlab.optim.hyperparameters import resolve_hyperparameters
    from batchlab.workloads import get_workload

    path = store_path or config.store
    if not path:
        raise BatchlabError("no store given; pass --store DIR or set store = \"DIR\" in the sweep config")
    parent = Path(path).absolute().parent  # as Store.open_or_create reads it (no ~ expansion)
    if not parent.is_dir():
        raise BatchlabError(f"store {str(path)!r}: the directory {str(parent)!r} does not exist (create it first)")
    from batchlab.train.device import device_type as resolved_type

    device_type = resolved_type(config.device)  # the type (cpu, cuda, mps) it resolves to here
    studies = plan_studies(config, device_type=device_type)
    num_parameters = {}
    for name in dict.fromkeys(s.workload for s in studies):
        workload = get_workload(name)
        available = int(workload.split_sizes["train"])
        num_train = min(config.train_examples or available, available)
        if config.train_examples is not None and config.train_examples > available:
            raise BatchlabError(
                f"train_examples {config.train_examples} exceeds the {available} training examples of {name}; "
                f"allowed: 1 to {available}"
            )
        too_big = [b for b in config.batch_sizes if b > num_train]
        if too_big:
            raise BatchlabError(
                f"batch sizes {too_big} exceed the training set of {name} ({num_train} examples); "
                f"allowed: 1 to {num_train}"
            )
        num_parameters[name] = workload.num_parameters()
    for study in studies:
        allowed = optimizer_defaults(study.optimizer)
        for point in study.points[:1]:
            unknown = sorted(set(point) - set(allowed))
            if unknown:
                raise BatchlabError(
                    f"search space of {study.optimizer} has parameters {unknown} the optimizer does not take; "
                    f"allowed: {', '.join(allowed)}"
                )
        for point in study.points:  # every value a trial will use, checked before anything runs
            try:
                resolve_hyperparameters(study.optimizer, point)
            except BatchlabError as exc:
                raise BatchlabError(f"search space of {study.optimizer}: {exc}") from None
    studies, warnings = mark_inexact_vectorization(config, studies)  # before the ids: it changes study ids
    every = _studies_with_growths(config, studies)
    first_ids = _allocate_ids(path, every)
    studies = [replace(s, first_trial_id=first_ids[(s.store_workload, s.batch_size, 0)]) for s in studies]
    return SweepPlan(config=config, store_path=str(path), studies=studies, num_parameters=num_parameters,
                     first_ids=first_ids, sweep_id=studies[0].sweep if studies else "", device_type=device_type,
                     warnings=warnings)


def check_workers_can_import(config: SweepConfig) -> None:
    """BatchlabError (one line) when a workload of ``config`` cannot be re-imported by pool or Dask
    workers: one registered only in this process (no reference, not an entry point)."""
    from batchlab.workloads import worker_resolvable

    for key in config.workloads:
        if not worker_resolvable(key):
            raise BatchlabError(
                f"workload {key!r} is registered in this process only, so sweep workers cannot import it; "
                "pass it as a reference (package.module:function or path/to/file.py:function) or run the "
                "sweep in this process (executor_factory=InlineExecutor)"
            )


def _studies_with_growths(config: SweepConfig, studies: list[StudyPlan]) -> list[StudyPlan]:
    """``studies`` plus every budget round the growth rule may add (what the sweep could ever store)."""
    if not config.grow_budget:
        return list(studies)
    every = []
    for study in studies:
        every.append(study)
        for _ in range(config.max_budget_growths):
            study = study.grown(config.grow_factor)
            every.append(study)
    # Round 0 first: a round-0 study takes its block before any grown round of another batch size.
    return sorted(every, key=lambda s: s.budget_round)


def _allocate_ids(path: str, studies: list[StudyPlan],
                  reserved: dict[tuple[str, int, int], int] | None = None) -> dict[tuple[str, int, int], int]:
    """The first trial id of every study (all rounds), from the trials in the store at ``path`` (if any).

    ``reserved``: id blocks already given out (:attr:`SweepPlan.first_ids`), which no study of
    ``studies`` may take unless its trials are there (the search rounds of :mod:`batchlab.sweep.refine`,
    planned after the sweep's other rounds)."""
    from batchlab.store import Store
    from batchlab.store.studies import id_block
    from batchlab.sweep.keys import allocate_ids

    held: dict[tuple[str, int], dict[int, str]] = {}
    root = Path(path)
    if root.exists() and not (root.is_dir() and not any(root.iterdir())):
        store = Store.open(root, create=False)  # BatchlabError if it is something else
        wanted_workloads = {s.store_workload for s in studies}
        trials = store.table("trials").select(["workload", "batch_size", "trial_id", "trial_key"]).to_pylist()
        for t in trials:
            if t["workload"] in wanted_workloads:
                held.setdefault((t["workload"], int(t["batch_size"])), {})[int(t["trial_id"])] = t["trial_key"]
        for header in store.pending_headers():  # trials being written by batchlab train
            place = (header.get("workload"), header.get("batch_size"))
            if place[0] in wanted_workloads and header.get("trial_id") is not None:
                held.setdefault(place, {}).setdefault(int(header["trial_id"]), header.get("trial_key", ""))
    for (workload, batch_size, _), first in (reserved or {}).items():
        place = held.setdefault((workload, batch_size), {})
        if not any(id_block(i) == id_block(first) for i in place):
            place[first] = ""  # the block is taken (no trial key: a planned trial never matches it)
    wanted = [((s.store_workload, s.batch_size), s.name, [(t.point_index, t.key) for t in s.trial_plans()])
              for s in studies]
    firsts = allocate_ids(wanted, held)
    return {(s.store_workload, s.batch_size, s.budget_round): f for s, f in zip(studies, firsts)}


def run_sweep(plan: SweepPlan, reporter: Reporter | None = None,
              executor_factory: Callable[..., Any] | None = None, flags_fn: Callable | None = None) -> SweepSummary:
    """Run the planned sweep to the end (see the module docstring) and return its summary.

    ``executor_factory`` (default :func:`batchlab.sweep.executors.make_executor`) is called as
    ``executor_factory(run_task, workers=, dask=, scheduler=, device=)`` and returns an
    :class:`~batchlab.sweep.executors.Executor`. With ``config.refine_search`` the refined search
    (:mod:`batchlab.sweep.refine`) runs once every other round has finished; ``flags_fn`` replaces its
    tuning flags (default :func:`batchlab.analysis.tuning_flags.tuning_flags`).

    Tasks run through a :class:`batchlab.sweep.claims.ClaimingExecutor`: a trial runs only once this
    driver has claimed it, so concurrent drivers on the store share the trials.

    Raises:
        SweepInterrupted: on Ctrl-C (KeyboardInterrupt), after aborting the executor and releasing
            this driver's claims; the trials published so far stay in the store.
        BatchlabError: a workload pool or Dask workers cannot import (see the module docstring).
    """
    from batchlab.sweep.executors import make_executor

    reporter = reporter or Reporter()
    config = plan.config
    started = time.perf_counter()
    workers = config.resolved_workers()
    if executor_factory is None:
        check_workers_can_import(config)
    factory = executor_factory or make_executor
    # The executor first: an unreachable scheduler fails before the store is created.
    executor = factory(run_task, workers=workers, dask=config.uses_dask, scheduler=config.scheduler,
                       device=config.device)
    claims = None
    try:
        from batchlab.store import Store
        from batchlab.sweep.claims import ClaimingExecutor, TrialClaims

        store, created = Store.open_or_create(plan.store_path)
        claims = TrialClaims(store)
        claims.collect_dead()  # claims left by drivers that died
        finished = store.finished_trial_keys()
        diverged_before = set() if created else _diverged_keys(store)
    except BaseException:
        executor.abort()
        if claims is not None:
            claims.close()
        raise
    executor = ClaimingExecutor(executor, claims, store.finished_trial_keys)

    progress: dict[tuple[str, int], StudyProgress] = {}
    round_state: dict[tuple[str, int, int, int], dict] = {}  # per study round: pending keys, outcomes
    open_rounds: set[tuple[str, int, int, int]] = set()  # rounds with trials still to publish
    refining = {"started": False, "flags": [], "rounds": [], "shown": []}
    counters = {"run": 0, "skipped": 0, "lost": 0, "others": 0}
    grown: list[dict] = []

    def study_id(study: StudyPlan) -> tuple[str, int]:
        return (study.store_workload, study.batch_size)

    def round_key(study: StudyPlan) -> tuple[str, int, int, int]:
        return (*study_id(study), study.budget_round, study.search_round)

    def count_finished(study: StudyPlan) -> None:
        """Count the trials of ``study`` finished (and diverged) before this run (once per round)."""
        entry = progress[study_id(study)]
        keys = [t.key for t in study.trial_plans()]
        done_before = sum(1 for key in keys if key in finished)
        entry.skipped += done_before
        entry.done += done_before
        entry.diverged += sum(1 for key in keys if key in diverged_before)
        counters["skipped"] += done_before

    def submit_round(study: StudyPlan) -> None:
        entry = progress[study_id(study)]
        trials = study.trial_plans()
        todo = [t for t in trials if t.key not in finished]
        state = round_state[round_key(study)] = {
            "study": study, "pending": {t.key for t in todo}, "keys": [t.key for t in trials]
        }
        open_rounds.add(round_key(study))
        entry.vectorized = should_vectorize(config, study)
        group = config.vectorize_trials
        if entry.vectorized and not study.race:  # K shrinks when there would be fewer tasks than workers
            group = max(1, min(group, math.ceil(planned_todo / workers)))
        if study.race:
            state["race_todo"], state["race_group"] = todo, group
            tasks = race_chunk(study)
        else:
            tasks = make_tasks(study, todo, entry.vectorized, group, (), choose=config.vectorize == "auto")
        if initial is not None:
            initial.extend(tasks)
        else:
            for task in tasks:
                executor.submit(task)
        if not state["pending"]:
            finish_round(study)

    def race_chunk(study: StudyPlan) -> list[TrialTask]:
        """The next task of a raced study's round: its next unfinished trial (its next group of
        ``vectorize_trials`` when vectorized), racing the study's trials already published (their keys
        read back from the store, as a resumed study does). One chunk at a time, each published before
        the next starts, so the same trials race the same keys as in one long task, and a sweep stopped
        mid-study keeps every trial it finished."""
        state = round_state[round_key(study)]
        todo = [t for t in state["race_todo"] if t.key not in finished]
        state["race_todo"] = todo
        if not todo:
            return []
        vectorized = progress[study_id(study)].vectorized
        chunk = state["race_chunk"] = todo[:max(1, state["race_group"])] if vectorized else todo[:1]
        prior: tuple = ()
        if len(todo) < len(state["keys"]):  # trials of this round are published: race them
            from batchlab.train.race import published_keys

            prior = tuple(published_keys(store, study.digest, study.metric, analysis_goal(config, study), study.maximize))
        return make_tasks(study, chunk, vectorized, state["race_group"] if vectorized else 0, prior,
                          choose=config.vectorize == "auto")

    def next_race_chunk(study: StudyPlan) -> None:
        """Once every trial of a raced study's chunk is published (here or by another driver, in one
        outcome or several): submit the next chunk."""
        if not study.race:
            return
        state = round_state[round_key(study)]
        if all(t.key in finished for t in state.get("race_chunk", ())):
            for task in race_chunk(study):
                executor.submit(task)

    def finish_round(study: StudyPlan) -> None:
        """All trials of this round are published: apply the budget-growth rule (then, once every round
        is done, the refined search)."""
        open_rounds.discard(round_key(study))
        grow(study)
        if not open_rounds and initial is None:
            refine()

    def refine() -> None:
        """Once, when every round has finished: the search rounds of :mod:`batchlab.sweep.refine`. The
        stored search rounds of the reported rounds first, re-planned from their stored definitions
        (sticky decisions; with ``config.refine_search`` continued to that budget, else only shown in
        the table); then, with ``config.refine_search``, new rounds for the flagged studies that have
        none, decided from the finished rounds only."""
        if refining["started"]:
            return
        refining["started"] = True
        from batchlab.sweep.refine import flag_kinds, refine_studies, stored_search_rounds

        reported = reported_rounds([state["study"] for state in round_state.values()])
        con = store.connect()
        try:
            stored = stored_search_rounds(con, reported, config.refine_search)
            added = []
            if config.refine_search:
                restrict_to_sweep(con, [t.key for s in reported for t in s.trial_plans()],
                                   [s.digest for s in reported])
                added, refining["flags"] = refine_studies(con, reported, lambda s: analysis_goal(config, s),
                                                          config.refine_search, flags_fn,
                                                          decided={s.refine["study"] for s in stored})
        finally:
            con.close()
        if not stored and not added:
            return
        firsts = _allocate_ids(plan.store_path, [*stored, *added], plan.first_ids)
        # kinds None: a stored round (decided by an earlier run; its flags are that run's record)
        for new, kinds in [*((s, None) for s in stored), *((s, flag_kinds(refining["flags"], s)) for s in added)]:
            new = replace(new, first_trial_id=firsts[(new.store_workload, new.batch_size, new.budget_round)])
            refining["rounds"].append({"workload": new.store_workload, "batch_size": new.batch_size,
                                       "search_round": new.search_round, "trials": new.trials,
                                       "flags": kinds, "decided": "stored" if kinds is None else "now",
                                       "around": new.refine["around"], "study_id": new.digest})
            if not config.refine_search:  # shown in the table with its stored trials, nothing run
                refining["shown"].append(new)
                continue
            progress[study_id(new)].total += new.trials
            count_finished(new)
            if kinds is not None:
                reporter.search_refined(_Announced(new, kinds))
            submit_round(new)

    def grow(study: StudyPlan) -> None:
        """The budget-growth rule (round 0 and grown rounds; never a search round)."""
        if not config.grow_budget or study.budget_round >= config.max_budget_growths or study.search_round:
            return
        state = round_state[round_key(study)]
        if ran_out_of_steps(_outcomes_by_key(store, study, state["keys"], analysis_goal(config, study)).values()):
            bigger = plan.grown(study)
            entry = progress[study_id(study)]
            entry.total += bigger.trials
            grown.append({"workload": study.store_workload, "batch_size": study.batch_size,
                          "from_steps": study.steps, "to_steps": bigger.steps, "round": bigger.budget_round})
            count_finished(bigger)
            reporter.budget_grown(study, bigger)
            submit_round(bigger)

    def published_by_others(study: StudyPlan, keys: list[str]) -> None:
        """Count trials of ``study`` that another driver ran and published during this run."""
        entry = progress[study_id(study)]
        state = round_state[round_key(study)]
        keys = [key for key in keys if key in state["pending"]]
        if not keys:
            return
        for key in keys:
            finished.add(key)
            state["pending"].discard(key)
        entry.done += len(keys)
        entry.diverged += len(_diverged_keys(store, keys))
        counters["others"] += len(keys)
        reporter.trials_by_others(entry, keys, {"run": counters["run"], "skipped": counters["skipped"],
                                                "others": counters["others"], "study": study})
        if not state["pending"]:
            finish_round(study)

    planned_todo = sum(1 for s in plan.studies for t in s.trial_plans() if t.key not in finished)
    for study in plan.studies:
        progress[study_id(study)] = StudyProgress(study=study, total=study.trials)
        count_finished(study)
    try:
        reporter.start(plan, list(progress.values()),
                       {"executor": executor.kind, "workers": executor.workers, "store": plan.store_path,
                        "finished_before": counters["skipped"], "created_store": created,
                        "device": config.device})
        initial: list[TrialTask] | None = []
        for study in plan.studies:
            submit_round(study)
        # Longest tasks first: shortens the sweep's makespan and spreads every optimizer over time.
        for task in sorted(initial, key=lambda t: -t.estimated_cost):
            executor.submit(task)
        initial = None
        if not open_rounds:  # everything was finished before this run
            refine()
        for outcome in executor.outcomes():
            task: TrialTask = outcome.task
            if outcome.elsewhere:  # another driver ran and published these trials
                published_by_others(task.study, [t.key for t in task.trials])
                next_race_chunk(task.study)
                continue
            if outcome.lost:
                counters["lost"] += 1
                reporter.worker_lost([t.key for t in task.trials])
                now = store.finished_trial_keys()  # its trials another driver published meanwhile are not re-run
                published_by_others(task.study, [t.key for t in task.trials if t.key in now])
                rerun = [t for t in task.trials if t.key not in finished]
                if rerun:
                    executor.submit(replace(task, trials=tuple(rerun)))  # keeps its group size and race
                else:
                    next_race_chunk(task.study)
                continue
            if outcome.error is not None:
                error = outcome.error
                if isinstance(error, BatchlabError):
                    raise BatchlabError(f"trial {task.trials[0].key}: {error}") from None
                raise error
            _publish(store, task, outcome.result)
            study = task.study
            entry = progress[study_id(study)]
            state = round_state[round_key(study)]
            for result in outcome.result:
                finished.add(result.key)
                state["pending"].discard(result.key)
                entry.done += 1
                entry.diverged += int(result.diverged)
                counters["run"] += 1
                # "study": the round this trial ran in (entry.study is round 0 of its batch size)
                reporter.trial(entry, result, {"run": counters["run"], "skipped": counters["skipped"], "study": study})
            next_race_chunk(study)
            if not state["pending"]:
                finish_round(study)
    except KeyboardInterrupt:
        executor.abort()  # published trials stay; the ones in flight are lost and re-run next time
        total = sum(p.total for p in progress.values())
        saved = sum(p.done for p in progress.values())
        raise SweepInterrupted(saved=saved, run=counters["run"], total=total) from None
    except BaseException:
        executor.abort()  # published trials stay; the ones in flight are lost and re-run next time
        raise
    else:
        executor.close()

    used = [state["study"] for state in round_state.values()] + refining["shown"]
    summary = summarize(store, plan, time.perf_counter() - started, counters, grown, executor.kind, executor.workers,
                        used)
    summary.tuning_flags, summary.refined = refining["flags"], refining["rounds"]
    reporter.finish(summary)
    return summary


class _Announced:
    """A search round as :meth:`Reporter.search_refined` reads it: the round, with the kinds of the flags
    behind it under ``refine["flags"]`` (recorded outside its hashed definition)."""

    def __init__(self, study: StudyPlan, flags: list[str]):
        self._study, self.refine = study, {**study.refine, "flags": list(flags)}

    def __getattr__(self, name: str):
        return getattr(self._study, name)


def _diverged_keys(store, keys: list[str] | None = None) -> set[str]:
    """Keys of the store's published trials (of ``keys`` only, if given) that diverged (status INFEASIBLE)."""
    from batchlab.train.core import INFEASIBLE

    if keys is not None and not keys:
        return set()
    con = store.connect()
    try:
        found = {key for (key,) in con.execute("SELECT trial_key FROM trials WHERE status = ?", [INFEASIBLE]).fetchall()}
    finally:
        con.close()
    return found if keys is None else found & set(keys)


def _publish(store, task: TrialTask, outcomes: list[TrialOutcome]) -> None:
    """Publish the task's trials in one atomic commit (keys already published are skipped by the store)."""
    from batchlab.store import TrialRecord, publish_trials

    study = task.study
    records = [
        TrialRecord(
            workload=study.store_workload, batch_size=study.batch_size, trial_id=o.trial_id, trial_key=o.key,
            parameters=o.parameters, status=o.status, steps=o.steps, seed=o.seed, source="batchlab",
            measurements=measurement_triples(o), search_space=study.stretched_search_space,
            train_steps=study.steps, early_stopping=study.stop_at_goal,
            tags={"metric": study.metric, "goal": study.goal, "maximize": study.maximize},
            study_definition=study.definition,
        )
        for o in outcomes
    ]
    publish_trials(store, records)


def _outcomes_by_key(store, study: StudyPlan, keys: list[str], goal: float) -> dict[str, tuple[str, int | None]]:
    """``{trial_key: (status, first step beating the goal or None)}`` for published ``keys``."""
    import pyarrow as pa

    con = store.connect()
    try:
        con.register("wanted", pa.table({"trial_key": keys}))
        op = ">" if study.maximize else "<"
        rows = con.execute(
            f"""
            SELECT t.trial_key, any_value(t.status),
                   min(m.step) FILTER (WHERE m.metric = ? AND m.value {op} ? AND isfinite(m.value))
            FROM trials t JOIN wanted USING (trial_key)
            LEFT JOIN measurements m
              ON m.workload = t.workload AND m.batch_size = t.batch_size AND m.trial_id = t.trial_id
            GROUP BY t.trial_key
            """,
            [study.metric, goal],
        ).fetchall()
    finally:
        con.close()
    return {key: (status, None if first is None else int(first)) for key, status, first in rows}
