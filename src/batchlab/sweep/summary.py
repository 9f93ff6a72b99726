"""The end of a sweep: steps to result per batch size and the S(B) fits, from the sweep's own trials only
(:func:`summarize`, :class:`SweepSummary`), and the goal they answer (:func:`analysis_goal`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from batchlab.errors import BatchlabError
from batchlab.sweep.config import SweepConfig
from batchlab.sweep.plan import StudyPlan

if TYPE_CHECKING:  # annotations only: the runner imports this module
    from batchlab.sweep.runner import SweepPlan

__all__ = ["SUMMARY_BOOT", "SweepSummary", "analysis_goal", "reported_rounds", "summarize"]


def reported_rounds(studies: list[StudyPlan]) -> list[StudyPlan]:
    """The round reported at each (workload, batch size): the last budget round run (the largest
    budget; round 0 unless the budget grew), search round 0, in the order first seen."""
    reported: dict[tuple[str, int], StudyPlan] = {}
    for s in studies:
        place = (s.store_workload, s.batch_size)
        if s.search_round == 0 and (place not in reported or s.budget_round > reported[place].budget_round):
            reported[place] = s
    return list(reported.values())


@dataclass
class SweepSummary:
    """The end of a sweep: per workload, steps to result per batch size and the fitted critical batch sizes."""

    store_path: str
    wall_time_s: float
    trials_run: int
    trials_skipped: int
    workers_lost: int
    grown: list[dict]
    results: dict[str, list]  # store workload -> list[BatchSizeResult]
    fits: dict[str, dict | None]  # store workload -> summarize_curve(...) or None
    fit_errors: dict[str, str]
    executor: str
    workers: int
    goals: dict[str, dict] = field(default_factory=dict)  # store workload -> {metric, goal, maximize}
    sweep_id: str = ""
    # store workload -> batch size -> [{"budget_round", "steps", "study_id", "trials", "reported"}] of the
    # rounds run; "reported": the round whose trials the table uses (the last one)
    studies: dict[str, dict[int, list[dict]]] = field(default_factory=dict)
    # store workload -> batch size -> {status: trials} of the reported round (all statuses, published trials)
    statuses: dict[str, dict[int, dict[str, int]]] = field(default_factory=dict)
    # trials of the sweep that other drivers ran and published while this one ran (sweep.claims)
    trials_by_others: int = 0
    # --refine-search: the tuning flags of the reported rounds ({"workload", **TuningFlag.to_dict()}; empty
    # without it) and the search rounds of the reported rounds ({"workload", "batch_size", "search_round",
    # "trials", "flags", "decided", "around", "study_id"}): "decided" "now" (this run decided it; "flags":
    # the kinds behind it) or "stored" (re-planned from its stored definition, also without --refine-search;
    # "flags" None: the flags are the deciding run's record, not part of the study definition)
    tuning_flags: list[dict] = field(default_factory=list)
    refined: list[dict] = field(default_factory=list)


def analysis_goal(config: SweepConfig, study: StudyPlan) -> float:
    """The goal of the steps-to-result table and the growth rule: ``config.goal``, else the workload's."""
    return float(config.goal) if config.goal is not None else study.goal


def summarize(store, plan: SweepPlan, wall_time_s: float, counters: dict, grown: list[dict], executor: str,
              workers: int, studies: list[StudyPlan] | None = None) -> SweepSummary:
    """Steps to result per batch size and the S(B) fits, from this sweep's own trials only.

    ``studies``: the study rounds the sweep ran (default: round 0 of every study). At each batch size
    the last round run (the largest budget; round 0 unless the budget grew) is reported: only its
    planned trials, and those of its refined search round (``--refine-search``, the same budget: a
    study and its search round are its trials, pooled on purpose; a stored search round is shown
    whether or not ``--refine-search`` is given this time), enter the table (analysis.steps_to_result
    over a view of the store restricted to their trial keys), so every row rests on one study
    definition and its search rounds, and trials of other sweeps,
    ``batchlab train`` runs or imports at the same workload and batch size never enter. Statuses
    analysed: COMPLETE, STOPPED_AT_GOAL and RACED (docs/methods.md, "Racing in the analysis").
    """
    from batchlab.analysis.steps_to_result import steps_to_result
    from batchlab.analysis.tables import DEFAULT_STATUSES as statuses  # COMPLETE, STOPPED_AT_GOAL, RACED

    studies = list(plan.studies) if studies is None else list(studies)
    # the last budget round run at each batch size, with the search rounds that refine it
    reported = {(s.store_workload, s.batch_size): s for s in reported_rounds(studies)}
    analysed = [s for s in studies if reported[(s.store_workload, s.batch_size)] is s
                or (s.search_round and s.refine.get("study") == reported[(s.store_workload, s.batch_size)].digest)]
    keys = [t.key for s in analysed for t in s.trial_plans()]
    per_study: dict[str, dict[int, list[dict]]] = {}
    for s in sorted(studies, key=lambda s: (s.batch_size, s.budget_round, s.search_round)):
        per_study.setdefault(s.store_workload, {}).setdefault(s.batch_size, []).append(
            {"budget_round": s.budget_round, "steps": s.steps, "study_id": s.digest, "trials": s.trials,
             "reported": reported[(s.store_workload, s.batch_size)] is s,
             # a refined search round: its trials are analysed with the reported round's ("analysed")
             **({"search_round": s.search_round, "analysed": s in analysed, "refine": s.refine}
                if s.search_round else {})})
    results, fits, errors, goals = {}, {}, {}, {}
    con = store.connect()
    try:
        # This sweep's trials only: ``trials`` becomes a view of the planned keys.
        restrict_to_sweep(con, keys, [s.digest for s in analysed])
        counts: dict[str, dict[int, dict[str, int]]] = {}
        for workload, batch_size, status, n in con.execute(
                "SELECT workload, batch_size, status, count(*) FROM trials GROUP BY ALL ORDER BY ALL").fetchall():
            counts.setdefault(workload, {}).setdefault(int(batch_size), {})[status] = int(n)
        seen = set()
        for study in plan.studies:
            if study.store_workload in seen:
                continue
            seen.add(study.store_workload)
            goal = analysis_goal(plan.config, study)
            goals[study.store_workload] = {"metric": study.metric, "goal": goal, "maximize": study.maximize}
            rows = steps_to_result(con, study.store_workload, study.metric, goal, maximize=study.maximize,
                                   statuses=statuses)
            wanted = set(plan.config.batch_sizes)
            rows = [r for r in rows if r.batch_size in wanted]
            results[study.store_workload] = rows
            try:
                fits[study.store_workload] = _fit_summary(con, study, goal, rows, statuses)
            except BatchlabError as exc:
                fits[study.store_workload] = None
                errors[study.store_workload] = str(exc)
    finally:
        con.close()
    return SweepSummary(
        store_path=plan.store_path, wall_time_s=wall_time_s, trials_run=counters["run"],
        trials_skipped=counters["skipped"], workers_lost=counters["lost"], grown=grown, results=results,
        fits=fits, fit_errors=errors, executor=executor, workers=workers, goals=goals, sweep_id=plan.sweep_id,
        studies=per_study, statuses=counts, trials_by_others=counters.get("others", 0),
    )


#: Trial-resampling replicates behind the regime shares of a sweep's summary (its intervals do not resample).
SUMMARY_BOOT = 200


def restrict_to_sweep(con, keys: list[str], study_ids: list[str]) -> None:
    """Make the ``trials`` view of ``con`` show only ``keys``, and ``studies`` only ``study_ids``."""
    import pyarrow as pa

    from batchlab.analysis.tables import view_columns

    con.register("_sweep_keys", pa.table({"trial_key": pa.array(keys, pa.string())}))
    con.execute("ALTER VIEW trials RENAME TO _store_trials")
    con.execute("CREATE VIEW trials AS SELECT t.* FROM _store_trials AS t SEMI JOIN _sweep_keys USING (trial_key)")
    columns = view_columns(con, "studies")
    con.execute("ALTER VIEW studies RENAME TO _store_studies")
    if "study_id" in columns:
        con.register("_sweep_studies", pa.table({"study_id": pa.array(study_ids, pa.string())}))
        con.execute("CREATE VIEW studies AS SELECT s.* FROM _store_studies AS s SEMI JOIN _sweep_studies USING (study_id)")
    else:  # a store without study ids: the studies of the sweep's trials
        con.execute("CREATE VIEW studies AS SELECT s.* FROM _store_studies AS s SEMI JOIN "
                    "(SELECT DISTINCT workload, batch_size FROM trials) USING (workload, batch_size)")


def _fit_summary(con, study: StudyPlan, goal: float, rows: list, statuses: tuple[str, ...]) -> dict:
    """The S(B) fit of the sweep's rows: the censored, bracket-weighted fit, data-read regimes and
    intervals with their targets (analysis.bootstrap.critical_batch_size_with_intervals). A batch
    size's trials are one study, or one study and its search round (which the analysis's one-study
    rule accepts), never a mix."""
    from batchlab.analysis.bootstrap import critical_batch_size_with_intervals
    from batchlab.analysis.selection import Selection

    censored = [r.batch_size for r in rows if r.steps is None and r.censored_at is not None]
    selection = Selection(workload=study.store_workload, metric=study.metric, goal=goal,
                          maximize=study.maximize, statuses=statuses)
    out = critical_batch_size_with_intervals(con, selection, n_boot=SUMMARY_BOOT, seed=0).to_dict()
    out.setdefault("censored_batch_sizes", censored)
    return out
