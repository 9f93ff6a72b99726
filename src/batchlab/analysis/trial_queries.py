"""The SQL behind steps to result: each selected trial's first qualifying step, and the best trial per
batch size, for several selections in one scan of a store's views (docs/methods.md, "Steps to result").

:data:`PER_TRIAL_SQL` gives one row per selected trial (its first qualifying step, the evaluation
before it, its last evaluated step, its value and bound flag, parameters, status, study);
:data:`BEST_SQL` one row per (selection, batch size) with the best trial (ties to the lower trial id)
and the bracket and censoring bound. :func:`query_selections` registers the selections as a table,
narrows the scans to their workloads and studies, and runs either. Used by
:mod:`batchlab.analysis.steps_to_result` and :mod:`batchlab.analysis.raced`.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence

import duckdb
import pyarrow as pa

from batchlab.analysis.selection import BOUND_SUFFIX, RELEASE_SOURCE, Selection, paper_max_trials
from batchlab.analysis.tables import with_study_id

# The selected trials, each one's first qualifying step, the evaluation before it and its last
# evaluation. ``{selections}`` is a registered table of selections; ``{trials}`` and ``{studies}``
# the views (with a NULL ``study_id`` where the store has none); ``{scans}`` the narrowed scans.
_PER_TRIAL_CTE = """
WITH sel AS (SELECT * FROM {selections}),
candidates AS (
    SELECT sel.sel_id, t.batch_size, t.trial_id, t.parameters, t.status, t.study_id, t.source,
           t.steps AS trial_steps
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
    SELECT sel_id, batch_size, trial_id, parameters, status, study_id, n_available, n_used, trial_steps FROM ranked
    WHERE n_used IS NULL OR rank <= n_used
),
raw AS ({scans}),
flagged AS (
    -- the bound flags (``<metric>:bound`` rows) the scans read beside their metric: usually none
    SELECT sel_id, batch_size, trial_id, step, any_value(value) AS bound
    FROM raw WHERE is_flag GROUP BY sel_id, batch_size, trial_id, step
),
scanned AS (
    -- the metric's rows with their bound flag; a bounded row is kept only when the bound decides
    -- the goal (see _scans_sql)
    SELECT r.sel_id, r.batch_size, r.trial_id, r.step, r.value, r.hit, f.bound
    FROM raw AS r LEFT JOIN flagged AS f
      ON f.sel_id = r.sel_id AND f.batch_size = r.batch_size AND f.trial_id = r.trial_id AND f.step = r.step
    WHERE NOT r.is_flag
      AND (f.bound IS NULL OR (r.hit AND f.bound = r.hit_flag)
           OR (NOT r.hit AND isfinite(r.value) AND f.bound = -r.hit_flag))
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
           -- 0: exact (arg_min skips NULL args, so the flag is coalesced first)
           arg_min(coalesce(m.bound, 0), m.step) FILTER (WHERE m.hit) AS value_bound,
           max(m.step) AS last_step,
           list(m.step) FILTER (WHERE m.hit IS NOT TRUE) AS misses
    FROM scanned AS m
    GROUP BY m.sel_id, m.batch_size, m.trial_id
),
per_trial AS (
    -- a reaching trial's bracket starts at the evaluation just before its first qualifying one
    -- (every evaluation before that one missed the goal), 0 when there was none. A RACED trial
    -- that did not qualify is ``unknown`` unless the budget ends at or before its ``steps`` (then
    -- every row within the budget was recorded).
    SELECT c.sel_id, c.batch_size, c.trial_id, c.parameters, c.status, c.study_id, c.n_available, c.n_used,
           e.first_step, e.value, nullif(e.value_bound, 0) AS value_bound, e.last_step,
           CASE WHEN e.first_step IS NOT NULL
                THEN coalesce(list_max(list_filter(e.misses, x -> x < e.first_step)), 0) END AS prev_step,
           CASE WHEN c.status = 'RACED' THEN c.trial_steps END AS raced_at,
           (c.status = 'RACED' AND e.first_step IS NULL
            AND NOT coalesce(s.step_budget <= c.trial_steps, false)
            AND NOT coalesce(s.example_budget // c.batch_size <= c.trial_steps, false)) AS unknown
    FROM chosen AS c
    JOIN sel AS s ON s.sel_id = c.sel_id
    LEFT JOIN evals AS e ON e.sel_id = c.sel_id AND e.batch_size = c.batch_size AND e.trial_id = c.trial_id
)
"""

PER_TRIAL_SQL = (
    _PER_TRIAL_CTE
    + """
SELECT sel_id, batch_size, trial_id, first_step, value, value_bound, parameters, status, study_id, prev_step,
       last_step, raced_at, unknown, n_available, n_used
FROM per_trial ORDER BY batch_size, trial_id
"""
)

BEST_SQL = (
    _PER_TRIAL_CTE
    + """,
ordered AS (
    SELECT sel_id, batch_size, trial_id, first_step, value, value_bound, parameters,
           row_number() OVER (PARTITION BY sel_id, batch_size ORDER BY first_step ASC NULLS LAST, trial_id) AS position
    FROM per_trial
),
summary AS (
    SELECT sel_id, batch_size, count(*) AS n_trials, count(first_step) AS n_reached,
           min(prev_step) AS steps_lower, min(last_step) AS censored_at,
           list(DISTINCT study_id) FILTER (WHERE study_id IS NOT NULL) AS study_ids,
           list(DISTINCT study_id) FILTER (WHERE study_id IS NOT NULL AND status = 'STOPPED_AT_GOAL') AS stopped_ids,
           any_value(n_available) AS n_available,
           count(*) FILTER (WHERE status = 'RACED') AS n_raced,
           list([trial_id::BIGINT::VARCHAR, raced_at::BIGINT::VARCHAR, study_id] ORDER BY trial_id) FILTER (WHERE unknown) AS unknown
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
       s.study_ids, s.stopped_ids, coalesce(s.n_available, 0), r.n_used, o.value_bound, s.n_raced, s.unknown
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

    Each scan's WHERE is a conjunction of constant comparisons (``workload = w AND metric IN (m,
    m:bound)`` [``AND step <= S``] [``AND batch_size * step <= E``]), which DuckDB pushes into the
    Parquet reader: with the store's files sorted by (workload, metric, batch_size, trial_id, step),
    the row groups' min/max statistics skip every row group of other workloads and metrics (a
    metric's bound flags sort right after it). Every evaluation row is kept, whatever its value,
    because the brackets need the evaluations that missed the goal. ``hit`` compares with
    constants too: finite and strictly beyond the goal, as one range on value: minimise (-inf, g),
    maximise (g, inf). In DuckDB NaN compares above +inf, so neither range holds NaN or an infinity
    (a plain ``value > goal`` would count NaN as a hit under maximize). Selections asking several
    goals of one workload scan it once each.

    Bounded rows: the companion rows ``<metric>:bound`` come with the scan, marked ``is_flag``;
    ``hit_flag`` is the flag that lets a bounded row qualify (``-1``, an upper bound, when lower is
    better; ``+1`` with ``maximize``), its negation the one that makes it a miss. The query joins
    the flags to their rows and keeps a bounded row only when its bound decides the goal, so an
    undecided bound is neither a hit, a miss nor a last step.
    """
    parts = []
    for k, selection in enumerate(selections):
        params[f"w{k}"], params[f"m{k}"], params[f"g{k}"] = selection.workload, selection.metric, float(selection.goal)
        params[f"b{k}"] = f"{selection.metric}{BOUND_SUFFIX}"
        params[f"i{k}"] = math.inf if selection.maximize else -math.inf
        hit = (f"value > $g{k} AND value < $i{k}" if selection.maximize else f"value > $i{k} AND value < $g{k}")
        where = f"workload = $w{k} AND metric IN ($m{k}, $b{k})"
        if selection.step_budget is not None:
            params[f"s{k}"] = int(selection.step_budget)
            where += f" AND step <= $s{k}"
        if selection.example_budget is not None:
            params[f"e{k}"] = int(selection.example_budget)
            where += f" AND batch_size * step <= $e{k}"
        parts.append(
            f"SELECT CAST({k} AS BIGINT) AS sel_id, batch_size, trial_id, step, value, ({hit}) AS hit, "
            f"metric = $b{k} AS is_flag, CAST({1.0 if selection.maximize else -1.0} AS DOUBLE) AS hit_flag "
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


def query_selections(con: duckdb.DuckDBPyConnection, selections: Sequence[Selection], sql: str, fetch: str = "all",
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


def float_or_none(value) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
