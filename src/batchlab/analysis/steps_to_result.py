"""Steps to result per batch size, with the exact semantics of Shallue et al. (docs/methods.md,
"Steps to result").

For each batch size of a workload:

1. Take the trials whose status is in ``statuses`` (default ``COMPLETE`` and ``STOPPED_AT_GOAL``)
   from the selected studies (default: all; more than one study definition at one batch size is
   refused unless ``mix_studies``) and, with ``max_trials=N``, only the first N of them in trial-id
   order (``"auto"``: the paper's N for imported release workloads, refusing a batch size with
   fewer trials; see :mod:`batchlab.analysis.selection`).
2. Use evaluation steps only (no interpolation); with a step budget keep rows with ``step <= S``,
   with an example budget rows with ``batch_size * step <= E``.
3. A row qualifies when its metric *strictly* beats the goal (``value < goal``, or ``value > goal``
   with ``maximize``); NaN or infinite values never qualify.
4. Each trial's first qualifying step; the steps to result is the minimum over trials, and the best
   trial is the one that attains it, **ties going to the lower trial id**.
5. A batch size where no trial qualifies is reported with ``steps=None`` (not reached; censored in
   fits). Every batch size of the workload appears (from ``studies`` and ``trials``), including one
   with no selected trial at all.

Steps count optimizer updates: a measurement at step ``t`` was taken after ``t`` updates.

Resolution. Evaluations are discrete, so a measured steps to result is a bracket: the goal was
first met after more than ``steps_lower`` and at most ``steps`` updates, where ``steps_lower`` is
the smallest, over the selected trials that reached the goal, of the evaluation step just before
each one's first qualifying evaluation (0 when there was none before). Where no trial reached the
goal, ``censored_at`` is the smallest last evaluated step (within the budget) over the selected
trials: the steps to result is larger than that.

Everything runs as one DuckDB query over the ``measurements`` view, so all workloads (or several
goals) are answered together: one narrowed scan per selection whose constant filters DuckDB pushes
into the Parquet reader, so row groups of other workloads and metrics are skipped; the rows are
reduced to each trial's first qualifying step, its last
evaluation step and the list of its evaluation steps that missed the goal (the bracket's lower end
is the largest of those before the first qualifying step), and only then joined to the (small)
table of selected trials.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa

from batchlab.analysis.curve import StepsCurve
from batchlab.analysis.selection import (
    RELEASE_SOURCE,
    Selection,
    check_selection,
    mixed_studies_error,
    paper_max_trials,
    resolve_studies,
    stop_rule_error,
    stop_rule_problem,
    study_definitions,
    too_few_trials_error,
    unknown_workload_error,
    workload_names,
)
from batchlab.analysis.tables import DEFAULT_STATUSES, with_study_id
from batchlab.errors import BatchlabError


@dataclass(frozen=True)
class BatchSizeResult:
    """Steps to result at one batch size.

    Attributes:
        workload: the store's ``dataset/model/optimizer``.
        batch_size: examples per update.
        steps: the steps to result (updates), ``None`` when no selected trial reached the goal.
        trial_id: the best trial (the lowest id among those attaining ``steps``); ``None`` if not reached.
        value: the best trial's metric at ``steps``; ``None`` if not reached.
        parameters: the best trial's metaparameters (``{}`` if not reached).
        n_trials: trials selected at this batch size (after the study, status and max-trials rules).
        n_reached: how many of them reached the goal.
        steps_lower: the lower end of the resolution bracket ``(steps_lower, steps]``: the smallest,
            over the selected trials that reached the goal, of the evaluation step just before each
            one's first qualifying evaluation (0 when none came before); ``None`` if not reached.
        censored_at: not reached: the smallest last evaluated step (within the budget) among the
            selected trials, so the steps to result is larger; ``None`` if reached or no trial has
            an evaluation of the metric.
        study_ids: the studies the selected trials came from (sorted; empty when the store records none).
        max_trials: the N of the first-N rule used (``None``: every selected trial).
    """

    workload: str
    batch_size: int
    steps: int | None
    trial_id: int | None
    value: float | None
    parameters: dict = field(default_factory=dict)
    n_trials: int = 0
    n_reached: int = 0
    steps_lower: int | None = None
    censored_at: int | None = None
    study_ids: list[str] = field(default_factory=list)
    max_trials: int | None = None

    @property
    def reached(self) -> bool:
        """Whether any selected trial reached the goal."""
        return self.steps is not None

    @property
    def mixed_studies(self) -> bool:
        """Whether the selected trials come from more than one study definition."""
        return len(self.study_ids) > 1

    @property
    def learning_rate(self) -> float | None:
        """The best trial's ``learning_rate`` (``None`` if absent or not reached)."""
        return _float_or_none(self.parameters.get("learning_rate"))

    @property
    def momentum(self) -> float | None:
        """The best trial's ``momentum`` (``None`` if the optimizer has none or not reached)."""
        return _float_or_none(self.parameters.get("momentum"))

    @property
    def effective_learning_rate(self) -> float | None:
        """``learning_rate / (1 - momentum)``; the plain learning rate when there is no momentum."""
        return effective_learning_rate(self.learning_rate, self.momentum)

    def to_dict(self) -> dict:
        """JSON-ready fields (the ``analyze steps-to-result --json`` line)."""
        return {
            "workload": self.workload,
            "batch_size": self.batch_size,
            "steps": self.steps,
            "steps_lower": self.steps_lower,
            "censored_at": self.censored_at,
            "reached": self.reached,
            "trial_id": self.trial_id,
            "value": self.value,
            "parameters": self.parameters,
            "learning_rate": self.learning_rate,
            "momentum": self.momentum,
            "effective_learning_rate": self.effective_learning_rate,
            "examples": None if self.steps is None else self.steps * self.batch_size,
            "n_trials": self.n_trials,
            "n_reached": self.n_reached,
            "max_trials": self.max_trials,
            "study_ids": list(self.study_ids),
            "mixed_studies": self.mixed_studies,
        }


def effective_learning_rate(learning_rate: float | None, momentum: float | None) -> float | None:
    """``learning_rate / (1 - momentum)`` (docs/methods.md, "Steps to result"); ``learning_rate`` when
    momentum is absent."""
    if learning_rate is None:
        return None
    if momentum is None:
        return learning_rate
    if momentum >= 1.0:
        return math.inf
    return learning_rate / (1.0 - momentum)


def steps_to_result(
    con: duckdb.DuckDBPyConnection,
    workload: str,
    metric: str,
    goal: float,
    maximize: bool = False,
    max_trials: int | str | None = None,
    step_budget: int | None = None,
    example_budget: int | None = None,
    statuses: Sequence[str] = DEFAULT_STATUSES,
    studies: Sequence[str] | None = None,
    mix_studies: bool = False,
) -> list[BatchSizeResult]:
    """Steps to result per batch size of one workload, sorted by batch size (see the module docstring).

    Raises:
        BatchlabError: unknown workload, metric or study (the message lists what exists), a bad
            goal, budget, ``max_trials`` or status, trials of one batch size from several studies
            without ``mix_studies``, stopped trials that cannot answer the goal, or (``max_trials=
            "auto"``) a release batch size with fewer trials than the paper's N.
    """
    selection = Selection(
        workload=workload,
        metric=metric,
        goal=goal,
        maximize=maximize,
        max_trials=max_trials,
        step_budget=step_budget,
        example_budget=example_budget,
        statuses=tuple(statuses),
        studies=None if studies is None else tuple(studies),
        mix_studies=mix_studies,
    )
    return steps_to_result_many(con, [selection])[0]


def steps_to_result_many(
    con: duckdb.DuckDBPyConnection, selections: Sequence[Selection], check: bool = True
) -> list[list[BatchSizeResult]]:
    """Answer many selections (all workloads, or several goals) in one query.

    Returns one list of per-batch-size results per selection, in the order given.

    With ``check`` (the default), an unknown workload or metric raises :class:`BatchlabError` listing
    what exists; the metric is looked up only for selections where nothing reached the goal, so the
    check costs nothing on the common path. ``check=False`` returns all-unreached results instead.
    The study rules (one study per batch size unless ``mix_studies``, stopped trials only for goals
    their stop rule covers, the paper's trial count under ``max_trials="auto"``) are checked either way.
    """
    if not selections:
        return []
    workloads = workload_names(con)
    if check:
        known = set(workloads)
        for selection in selections:
            if selection.workload not in known:
                raise unknown_workload_error(selection.workload, known)
    study_ids = [resolve_studies(con, s) if s.workload in workloads else None for s in selections]
    rows = _query(con, selections, _BEST_SQL, study_ids=study_ids)
    results: list[list[BatchSizeResult]] = [[] for _ in selections]
    checks: list[list[tuple]] = [[] for _ in selections]
    for (sel_id, batch_size, steps, trial_id, value, parameters, n_trials, n_reached, steps_lower, censored_at,
         ids, stopped_ids, n_available, n_used) in rows:
        reached = steps is not None
        ids = sorted(ids or [])
        checks[sel_id].append((int(batch_size), ids, sorted(stopped_ids or []), int(n_available), n_used))
        results[sel_id].append(
            BatchSizeResult(
                workload=selections[sel_id].workload,
                batch_size=int(batch_size),
                steps=int(steps) if reached else None,
                trial_id=int(trial_id) if reached else None,
                value=float(value) if reached else None,
                parameters=json.loads(parameters) if reached and parameters else {},
                n_trials=int(n_trials),
                n_reached=int(n_reached),
                steps_lower=(int(steps_lower) if steps_lower is not None else 0) if reached else None,
                censored_at=None if reached or censored_at is None else int(censored_at),
                study_ids=ids,
                max_trials=None if n_used is None else int(n_used),
            )
        )
    if check:
        for selection, per_batch in zip(selections, results):
            if not any(r.reached for r in per_batch):
                check_selection(con, selection)
    for selection, per_batch in zip(selections, checks):
        check_study_rules(con, selection, per_batch)
    return results


def check_study_rules(con: duckdb.DuckDBPyConnection, selection: Selection, per_batch: Sequence[tuple]) -> None:
    """Raise a one-line :class:`BatchlabError` where the selected trials break a study rule.

    ``per_batch``: ``(batch_size, study_ids, stopped_study_ids, n_available, n_used)`` per batch
    size, where ``n_available`` counts the trials of the selected statuses and studies and
    ``n_used`` is the N of the first-N rule (``None``: all). In order: the paper's trial count
    (``max_trials="auto"`` only), one study per batch size (unless ``mix_studies``), and the stop
    rule of the studies of the selected ``STOPPED_AT_GOAL`` trials (:func:`~batchlab.analysis.
    selection.stop_rule_problem`).
    """
    if selection.max_trials == "auto":
        for batch_size, _, _, n_available, n_used in per_batch:
            if n_used is not None and n_available < n_used:
                raise too_few_trials_error(selection.workload, batch_size, n_available, n_used, selection.statuses)
    definitions: dict[str, dict] | None = None
    if not selection.mix_studies:
        for batch_size, ids, _, _, _ in per_batch:
            if len(ids) > 1:
                definitions = study_definitions(con, selection.workload)
                raise mixed_studies_error(selection, batch_size, ids, definitions)
    for batch_size, _, stopped, _, _ in per_batch:
        for study_id in stopped:
            if definitions is None:
                definitions = study_definitions(con, selection.workload)
            stop_rule = definitions.get(study_id, {}).get("stop_rule")
            problem = stop_rule_problem(selection, stop_rule)
            if problem is not None:
                raise stop_rule_error(selection, batch_size, study_id, problem, stop_rule)


def trial_first_steps(con: duckdb.DuckDBPyConnection, selection: Selection) -> "pandas.DataFrame":  # noqa: F821
    """Every selected trial with its first qualifying step, one row per trial.

    Columns: ``batch_size``, ``trial_id``, ``first_step`` (float, NaN when the trial never reached the
    goal within the budget), ``value`` (the metric there), ``parameters`` (JSON text), ``status``,
    ``study_id``, ``prev_step`` (float: the evaluation step before ``first_step``, 0 when none; NaN
    when not reached) and ``last_step`` (float: the trial's last evaluation of the metric within the
    budget; NaN when it has none). Sorted by batch size and trial id. This is the per-trial table
    behind :func:`steps_to_result` (used by the bootstrap and the metaparameter scatter); it applies
    the same study rules (:func:`check_study_rules`).
    """
    import pandas as pd

    workloads = workload_names(con)
    study_ids = [resolve_studies(con, selection) if selection.workload in workloads else None]
    frame = _query(con, [selection], _PER_TRIAL_SQL, fetch="df", study_ids=study_ids)
    per_batch = []
    for batch_size, group in frame.groupby("batch_size", sort=True):
        ids = sorted({str(x) for x in group["study_id"] if isinstance(x, str)})
        stopped = sorted({str(x) for x, st in zip(group["study_id"], group["status"])
                          if isinstance(x, str) and st == "STOPPED_AT_GOAL"})
        n_used = group["n_used"].iloc[0]
        n_used = None if pd.isna(n_used) else int(n_used)
        per_batch.append((int(batch_size), ids, stopped, int(group["n_available"].iloc[0]), n_used))
    check_study_rules(con, selection, per_batch)
    frame = frame.drop(columns=["sel_id", "n_available", "n_used"])
    for column in ("first_step", "value", "prev_step", "last_step"):
        frame[column] = frame[column].astype(float)
    return frame.reset_index(drop=True)


def steps_curve(results: Sequence[BatchSizeResult], label: str | None = None, metadata: dict | None = None) -> StepsCurve:
    """The :class:`StepsCurve` of per-batch-size results (unreached batch sizes stay censored).

    The curve carries the brackets: ``steps_lower`` (``None`` where not reached) and ``censored_at``
    (``None`` where reached or unknown), aligned with the batch sizes.
    """
    if label is None:
        label = results[0].workload if results else ""
    ordered = sorted(results, key=lambda r: r.batch_size)
    zero = [int(r.batch_size) for r in ordered if r.reached and r.steps == 0]
    if zero:  # log axes, S(B0) B0 and the fit all need S > 0
        raise BatchlabError(f"steps curve {label!r}: the goal was already met at step 0 (before any update) at batch "
                            f"size(s) {zero}: steps to result 0 cannot be fitted, scaled or plotted; choose a stricter goal")
    batch_sizes = tuple(int(r.batch_size) for r in ordered)
    steps = tuple(r.steps for r in ordered)
    steps_lower = tuple(
        r.steps_lower if r.reached and r.steps_lower is not None and r.steps_lower < r.steps else None
        for r in ordered
    )
    censored_at = tuple(None if r.reached else r.censored_at for r in ordered)
    return StepsCurve(batch_sizes=batch_sizes, steps=steps, label=label, metadata=dict(metadata or {}),
                      steps_lower=steps_lower, censored_at=censored_at)


def trial_steps_by_batch_size(frame) -> dict[int, np.ndarray]:
    """``{batch_size: first qualifying step of each selected trial}`` from :func:`trial_first_steps`.

    Trials that never reached the goal are ``inf``. Batch sizes without any selected trial are not
    in ``frame`` and so not in the result; callers that need them add empty arrays.
    """
    out: dict[int, np.ndarray] = {}
    for batch_size, group in frame.groupby("batch_size", sort=True):
        steps = group.sort_values("trial_id")["first_step"].to_numpy(dtype=float)
        out[int(batch_size)] = np.where(np.isnan(steps), np.inf, steps)
    return out


# The selected trials, each one's first qualifying step, the evaluation before it and its last
# evaluation. ``{selections}`` is a registered table of selections; ``{trials}`` and ``{studies}``
# the views (with a NULL ``study_id`` where the store has none); ``{scans}`` the narrowed scans.
_PER_TRIAL_CTE = """
WITH sel AS (SELECT * FROM {selections}),
candidates AS (
    SELECT sel.sel_id, t.batch_size, t.trial_id, t.parameters, t.status, t.study_id, t.source
    FROM sel JOIN {trials} AS t ON t.workload = sel.workload
    WHERE list_contains(sel.statuses, t.status)
      AND (sel.study_ids IS NULL OR list_contains(sel.study_ids, t.study_id))
),
trial_rule AS (
    -- the N of the first-N rule per selection (NULL: every trial); "auto" is the paper's N when
    -- the selected trials were imported from the release.
    SELECT sel.sel_id,
           CASE WHEN NOT sel.auto_trials THEN any_value(sel.max_trials)
                WHEN coalesce(bool_or(c.source = '{release}'), false) THEN any_value(sel.paper_n) END AS n_used
    FROM sel LEFT JOIN candidates AS c ON c.sel_id = sel.sel_id
    GROUP BY sel.sel_id, sel.auto_trials
),
ranked AS (
    SELECT c.*, r.n_used,
           row_number() OVER (PARTITION BY c.sel_id, c.batch_size ORDER BY c.trial_id) AS rank,
           count(*) OVER (PARTITION BY c.sel_id, c.batch_size) AS n_available
    FROM candidates AS c JOIN trial_rule AS r ON r.sel_id = c.sel_id
),
chosen AS (
    SELECT sel_id, batch_size, trial_id, parameters, status, study_id, n_available, n_used FROM ranked
    WHERE n_used IS NULL OR rank <= n_used
),
evals AS (
    -- per trial (all trials of the selection's workload): the earliest qualifying evaluation step
    -- and the metric there, the last evaluation step within the budget, and the steps of the
    -- evaluations that did not qualify (for the bracket below). ``scans`` are one narrowed scan
    -- of measurements per selection that already marks the qualifying rows (see _scans_sql); the
    -- reduction to one row per trial happens before anything is joined to trials.
    SELECT m.sel_id, m.batch_size, m.trial_id,
           min(m.step) FILTER (WHERE m.hit) AS first_step,
           arg_min(m.value, m.step) FILTER (WHERE m.hit) AS value,
           max(m.step) AS last_step,
           list(m.step) FILTER (WHERE m.hit IS NOT TRUE) AS misses
    FROM ({scans}) AS m
    GROUP BY m.sel_id, m.batch_size, m.trial_id
),
per_trial AS (
    -- a reaching trial's bracket starts at the evaluation just before its first qualifying one
    -- (every evaluation before that one missed the goal), 0 when there was none.
    SELECT c.sel_id, c.batch_size, c.trial_id, c.parameters, c.status, c.study_id, c.n_available, c.n_used,
           e.first_step, e.value, e.last_step,
           CASE WHEN e.first_step IS NOT NULL
                THEN coalesce(list_max(list_filter(e.misses, x -> x < e.first_step)), 0) END AS prev_step
    FROM chosen AS c
    LEFT JOIN evals AS e ON e.sel_id = c.sel_id AND e.batch_size = c.batch_size AND e.trial_id = c.trial_id
)
"""

_PER_TRIAL_SQL = (
    _PER_TRIAL_CTE
    + """
SELECT sel_id, batch_size, trial_id, first_step, value, parameters, status, study_id, prev_step, last_step,
       n_available, n_used
FROM per_trial ORDER BY batch_size, trial_id
"""
)

_BEST_SQL = (
    _PER_TRIAL_CTE
    + """,
ordered AS (
    SELECT sel_id, batch_size, trial_id, first_step, value, parameters,
           row_number() OVER (PARTITION BY sel_id, batch_size ORDER BY first_step ASC NULLS LAST, trial_id) AS position
    FROM per_trial
),
summary AS (
    SELECT sel_id, batch_size, count(*) AS n_trials, count(first_step) AS n_reached,
           min(prev_step) AS steps_lower, min(last_step) AS censored_at,
           list(DISTINCT study_id) FILTER (WHERE study_id IS NOT NULL) AS study_ids,
           list(DISTINCT study_id) FILTER (WHERE study_id IS NOT NULL AND status = 'STOPPED_AT_GOAL') AS stopped_ids,
           any_value(n_available) AS n_available
    FROM per_trial GROUP BY sel_id, batch_size
),
batch_sizes AS (
    SELECT DISTINCT sel.sel_id, x.batch_size
    FROM sel JOIN (SELECT workload, batch_size, study_id FROM {studies}
                   UNION ALL SELECT workload, batch_size, study_id FROM {trials}) AS x
         ON x.workload = sel.workload AND (sel.study_ids IS NULL OR list_contains(sel.study_ids, x.study_id))
)
SELECT b.sel_id, b.batch_size, o.first_step, o.trial_id, o.value, o.parameters,
       coalesce(s.n_trials, 0), coalesce(s.n_reached, 0), s.steps_lower, s.censored_at,
       s.study_ids, s.stopped_ids, coalesce(s.n_available, 0), r.n_used
FROM batch_sizes AS b
JOIN trial_rule AS r ON r.sel_id = b.sel_id
LEFT JOIN summary AS s ON s.sel_id = b.sel_id AND s.batch_size = b.batch_size
LEFT JOIN (SELECT * FROM ordered WHERE position = 1) AS o ON o.sel_id = b.sel_id AND o.batch_size = b.batch_size
ORDER BY b.sel_id, b.batch_size
"""
)


def _scans_sql(selections: Sequence[Selection], params: dict) -> str:
    """A ``UNION ALL`` of one narrowed scan of ``measurements`` per selection, tagging each row with
    the selection's id and whether it qualifies (``hit``).

    Each scan's WHERE is a conjunction of constant comparisons (``workload = w AND metric = m``
    [``AND step <= S``] [``AND batch_size * step <= E``]), which DuckDB pushes into the Parquet
    reader: with the store's files sorted by (workload, metric, batch_size, trial_id, step), the
    row groups' min/max statistics skip every row group of other workloads and metrics. Every
    evaluation row is kept, whatever its value, because the brackets need the evaluations that
    missed the goal. ``hit`` compares with constants too: finite and strictly beyond the goal, as
    one range on value: minimise (-inf, g), maximise (g, inf). In DuckDB NaN compares above +inf,
    so neither range holds NaN or an infinity (a plain ``value > goal`` would count NaN as a hit
    under maximize). Selections asking several goals of one workload scan it once each.
    """
    parts = []
    for k, selection in enumerate(selections):
        params[f"w{k}"], params[f"m{k}"], params[f"g{k}"] = selection.workload, selection.metric, float(selection.goal)
        params[f"i{k}"] = math.inf if selection.maximize else -math.inf
        hit = (f"value > $g{k} AND value < $i{k}" if selection.maximize else f"value > $i{k} AND value < $g{k}")
        where = f"workload = $w{k} AND metric = $m{k}"
        if selection.step_budget is not None:
            params[f"s{k}"] = int(selection.step_budget)
            where += f" AND step <= $s{k}"
        if selection.example_budget is not None:
            params[f"e{k}"] = int(selection.example_budget)
            where += f" AND batch_size * step <= $e{k}"
        parts.append(
            f"SELECT CAST({k} AS BIGINT) AS sel_id, batch_size, trial_id, step, value, ({hit}) AS hit "
            f"FROM measurements WHERE {where}"
        )
    return "\nUNION ALL\n".join(parts)


def _selections_table(selections: Sequence[Selection], study_ids: Sequence[tuple[str, ...] | None]) -> pa.Table:
    return pa.table(
        {
            "sel_id": pa.array(range(len(selections)), pa.int64()),
            "workload": pa.array([s.workload for s in selections], pa.string()),
            "metric": pa.array([s.metric for s in selections], pa.string()),
            "goal": pa.array([float(s.goal) for s in selections], pa.float64()),
            "maximize": pa.array([bool(s.maximize) for s in selections], pa.bool_()),
            "max_trials": pa.array([s.fixed_max_trials for s in selections], pa.int64()),
            "auto_trials": pa.array([s.max_trials == "auto" for s in selections], pa.bool_()),
            "paper_n": pa.array([paper_max_trials(s.workload) for s in selections], pa.int64()),
            "step_budget": pa.array([s.step_budget for s in selections], pa.int64()),
            "example_budget": pa.array([s.example_budget for s in selections], pa.int64()),
            "statuses": pa.array([list(s.statuses) for s in selections], pa.list_(pa.string())),
            "study_ids": pa.array([None if ids is None else list(ids) for ids in study_ids], pa.list_(pa.string())),
        }
    )


def _query(con: duckdb.DuckDBPyConnection, selections: Sequence[Selection], sql: str, fetch: str = "all",
           study_ids: Sequence[tuple[str, ...] | None] | None = None):
    """Run ``sql`` with the selections registered under a unique name, then unregister them.

    ``study_ids``: the resolved study ids of each selection (``None``: all studies)."""
    if study_ids is None:
        study_ids = [None] * len(selections)
    params: dict = {}
    name = f"_batchlab_selections_{uuid.uuid4().hex}"
    text = sql.format(selections=name, scans=_scans_sql(selections, params),
                      trials=with_study_id(con, "trials"), studies=with_study_id(con, "studies"),
                      release=RELEASE_SOURCE)
    con.register(name, _selections_table(selections, study_ids))
    try:
        result = con.execute(text, params)
        return result.df() if fetch == "df" else result.fetchall()
    finally:
        con.unregister(name)


def _float_or_none(value) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
