"""Steps to result per batch size, with the exact semantics of Shallue et al. (science.md 3.4).

For each batch size of a workload:

1. Take the trials whose status is in ``statuses`` (default ``COMPLETE`` only) and, with
   ``max_trials=N``, only the first N of them in trial-id order.
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

Everything runs as one DuckDB query over the ``measurements`` view, so all workloads (or several
goals) are answered together: a few narrowed scans (one per metric and direction and run of
adjacent workloads) whose constant filters DuckDB pushes into the Parquet reader, so row groups of
other workloads and metrics are skipped; the rows are reduced to each trial's first qualifying
step, and only then joined to the (small) table of selected trials.
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
from batchlab.analysis.selection import Selection, check_selection, unknown_workload_error, workload_names


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
        n_trials: trials selected at this batch size (after the status and max-trials rules).
        n_reached: how many of them reached the goal.
    """

    workload: str
    batch_size: int
    steps: int | None
    trial_id: int | None
    value: float | None
    parameters: dict = field(default_factory=dict)
    n_trials: int = 0
    n_reached: int = 0

    @property
    def reached(self) -> bool:
        """Whether any selected trial reached the goal."""
        return self.steps is not None

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
        }


def effective_learning_rate(learning_rate: float | None, momentum: float | None) -> float | None:
    """``learning_rate / (1 - momentum)`` (science.md 3.3); ``learning_rate`` when momentum is absent."""
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
    max_trials: int | None = None,
    step_budget: int | None = None,
    example_budget: int | None = None,
    statuses: Sequence[str] = ("COMPLETE",),
) -> list[BatchSizeResult]:
    """Steps to result per batch size of one workload, sorted by batch size (see the module docstring).

    Raises:
        BatchlabError: unknown workload or metric (the message lists what exists), or a bad goal,
            budget, ``max_trials`` or status.
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
    """
    if not selections:
        return []
    workloads = workload_names(con)
    if check:
        known = set(workloads)
        for selection in selections:
            if selection.workload not in known:
                raise unknown_workload_error(selection.workload, known)
    rows = _query(con, selections, _BEST_SQL, workloads=workloads)
    results: list[list[BatchSizeResult]] = [[] for _ in selections]
    for sel_id, batch_size, steps, trial_id, value, parameters, n_trials, n_reached in rows:
        reached = steps is not None
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
            )
        )
    if check:
        for selection, per_batch in zip(selections, results):
            if not any(r.reached for r in per_batch):
                check_selection(con, selection)
    return results


def trial_first_steps(con: duckdb.DuckDBPyConnection, selection: Selection) -> "pandas.DataFrame":  # noqa: F821
    """Every selected trial with its first qualifying step, one row per trial.

    Columns: ``batch_size``, ``trial_id``, ``first_step`` (float, NaN when the trial never reached the
    goal within the budget), ``value`` (the metric there), ``parameters`` (JSON text), ``status``.
    Sorted by batch size and trial id. This is the per-trial table behind :func:`steps_to_result`
    (used by the bootstrap and the metaparameter scatter).
    """
    frame = _query(con, [selection], _PER_TRIAL_SQL, fetch="df")
    frame = frame.drop(columns=["sel_id"])
    frame["first_step"] = frame["first_step"].astype(float)
    frame["value"] = frame["value"].astype(float)
    return frame.reset_index(drop=True)


def steps_curve(results: Sequence[BatchSizeResult], label: str | None = None, metadata: dict | None = None) -> StepsCurve:
    """The :class:`StepsCurve` of per-batch-size results (unreached batch sizes stay censored)."""
    if label is None:
        label = results[0].workload if results else ""
    return StepsCurve.from_points([(r.batch_size, r.steps) for r in results], label=label, metadata=metadata)


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


# The selected trials and their first qualifying steps. ``sel`` is a registered table of selections.
_PER_TRIAL_CTE = """
WITH sel AS (SELECT * FROM {selections}),
ranked AS (
    SELECT sel.sel_id, t.batch_size, t.trial_id, t.parameters, t.status, sel.max_trials,
           row_number() OVER (PARTITION BY sel.sel_id, t.batch_size ORDER BY t.trial_id) AS rank
    FROM sel JOIN trials AS t ON t.workload = sel.workload AND list_contains(sel.statuses, t.status)
),
chosen AS (
    SELECT sel_id, batch_size, trial_id, parameters, status FROM ranked
    WHERE max_trials IS NULL OR rank <= max_trials
),
hits AS (
    -- each trial's earliest qualifying evaluation step, and the metric there (one row per step).
    -- ``scans`` are narrowed scans of measurements (see _scans_sql), so the exact per-selection
    -- conditions below see only rows that can qualify; the reduction to one row per trial
    -- happens before anything is joined to trials.
    SELECT sel.sel_id, m.batch_size, m.trial_id, min(m.step) AS first_step, arg_min(m.value, m.step) AS value
    FROM ({scans}) AS m
    JOIN sel ON m.scan_id = sel.scan_id AND m.workload = sel.workload
    WHERE CASE WHEN sel.maximize THEN m.value > sel.goal ELSE m.value < sel.goal END
      AND (sel.step_budget IS NULL OR m.step <= sel.step_budget)
      AND (sel.example_budget IS NULL OR m.batch_size * m.step <= sel.example_budget)
    GROUP BY sel.sel_id, m.batch_size, m.trial_id
),
per_trial AS (
    SELECT c.sel_id, c.batch_size, c.trial_id, c.parameters, c.status, h.first_step, h.value
    FROM chosen AS c LEFT JOIN hits AS h USING (sel_id, batch_size, trial_id)
)
"""

_PER_TRIAL_SQL = (
    _PER_TRIAL_CTE
    + """
SELECT sel_id, batch_size, trial_id, first_step, value, parameters, status
FROM per_trial ORDER BY batch_size, trial_id
"""
)

_BEST_SQL = (
    _PER_TRIAL_CTE
    + """,
ordered AS (
    SELECT *,
           row_number() OVER (PARTITION BY sel_id, batch_size ORDER BY first_step ASC NULLS LAST, trial_id) AS position,
           count(*) OVER (PARTITION BY sel_id, batch_size) AS n_trials,
           count(first_step) OVER (PARTITION BY sel_id, batch_size) AS n_reached
    FROM per_trial
),
batch_sizes AS (
    SELECT DISTINCT sel.sel_id, x.batch_size
    FROM sel JOIN (SELECT workload, batch_size FROM studies UNION SELECT workload, batch_size FROM trials) AS x
         ON x.workload = sel.workload
)
SELECT b.sel_id, b.batch_size, o.first_step, o.trial_id, o.value, o.parameters,
       coalesce(o.n_trials, 0), coalesce(o.n_reached, 0)
FROM batch_sizes AS b LEFT JOIN (SELECT * FROM ordered WHERE position = 1) AS o USING (sel_id, batch_size)
ORDER BY b.sel_id, b.batch_size
"""
)


@dataclass(frozen=True)
class _Scan:
    """One narrowed scan of ``measurements``: the workloads ``first..last`` (a run of consecutive
    workloads in the store's order) for one metric and direction, bounded by the loosest goal
    (and step budget) of the selections it serves."""

    first: str
    last: str
    metric: str
    maximize: bool
    goal: float
    step_budget: int | None


def _plan_scans(selections: Sequence[Selection], workloads: Sequence[str]) -> tuple[list[_Scan], list[int]]:
    """The scans that cover ``selections`` and the scan of each selection.

    ``workloads`` are the store's workloads in DuckDB's order. Selections with the same metric and
    direction share a scan when their workloads are adjacent in that order, so asking for every
    workload takes one scan per metric, while asking for one takes one scan of that workload only.
    A workload not in ``workloads`` gets a scan of its own.
    """
    position = {w: i for i, w in enumerate(workloads)}
    groups: dict[tuple[str, bool], list[int]] = {}
    for i, s in enumerate(selections):
        groups.setdefault((s.metric, bool(s.maximize)), []).append(i)
    scans: list[_Scan] = []
    scan_of = [0] * len(selections)
    for (metric, maximize), members in sorted(groups.items()):
        names = sorted({selections[i].workload for i in members}, key=lambda w: (position.get(w, -1), w))
        runs: list[list[str]] = []
        for name in names:
            previous = runs[-1][-1] if runs else None
            adjacent = (previous in position and name in position
                        and position[name] == position[previous] + 1)
            if adjacent:
                runs[-1].append(name)
            else:
                runs.append([name])
        for run in runs:
            served = [i for i in members if selections[i].workload in run]
            budgets = [selections[i].step_budget for i in served]
            goals = [float(selections[i].goal) for i in served]
            for i in served:
                scan_of[i] = len(scans)
            scans.append(_Scan(
                first=run[0], last=run[-1], metric=metric, maximize=maximize,
                goal=min(goals) if maximize else max(goals),
                step_budget=max(budgets) if all(b is not None for b in budgets) else None,
            ))
    return scans, scan_of


def _scans_sql(scans: Sequence[_Scan], params: dict) -> str:
    """A ``UNION ALL`` of the scans, tagging each row with its scan id.

    Each scan's WHERE is a conjunction of constant comparisons (``workload BETWEEN first AND last
    AND metric = m AND value < g`` [``AND step <= S``]), which DuckDB pushes into the Parquet
    reader: with the store's files sorted by (workload, metric, batch_size, trial_id, step), the
    row groups' min/max statistics skip every row group of other workloads and metrics. The bounds
    only narrow (the exact per-selection conditions are applied after, and rows of a workload no
    selection asked for are dropped by the join on the selection's workload). NaN and infinite
    values never qualify: the value range excludes both infinities, and DuckDB orders NaN above
    +inf (so a plain ``value > goal`` would count NaN as a hit under maximize).
    """
    parts = []
    for k, scan in enumerate(scans):
        params[f"f{k}"], params[f"l{k}"] = scan.first, scan.last
        params[f"m{k}"], params[f"g{k}"] = scan.metric, scan.goal
        # finite and strictly beyond the goal, as one range on value: minimise (-inf, g), maximise
        # (g, inf). In DuckDB NaN compares above +inf, so neither range holds NaN or an infinity.
        params[f"i{k}"] = math.inf if scan.maximize else -math.inf
        value_range = (f"value > $g{k} AND value < $i{k}" if scan.maximize
                       else f"value > $i{k} AND value < $g{k}")
        where = f"workload BETWEEN $f{k} AND $l{k} AND metric = $m{k} AND {value_range}"
        if scan.step_budget is not None:
            params[f"s{k}"] = scan.step_budget
            where += f" AND step <= $s{k}"
        parts.append(
            f"SELECT {k} AS scan_id, workload, batch_size, trial_id, step, value FROM measurements "
            f"WHERE {where}"
        )
    return "\nUNION ALL\n".join(parts)


def _selections_table(selections: Sequence[Selection], scan_of: Sequence[int]) -> pa.Table:
    return pa.table(
        {
            "sel_id": pa.array(range(len(selections)), pa.int64()),
            "scan_id": pa.array(scan_of, pa.int64()),
            "workload": pa.array([s.workload for s in selections], pa.string()),
            "metric": pa.array([s.metric for s in selections], pa.string()),
            "goal": pa.array([float(s.goal) for s in selections], pa.float64()),
            "maximize": pa.array([bool(s.maximize) for s in selections], pa.bool_()),
            "max_trials": pa.array([s.max_trials for s in selections], pa.int64()),
            "step_budget": pa.array([s.step_budget for s in selections], pa.int64()),
            "example_budget": pa.array([s.example_budget for s in selections], pa.int64()),
            "statuses": pa.array([list(s.statuses) for s in selections], pa.list_(pa.string())),
        }
    )


def _query(con: duckdb.DuckDBPyConnection, selections: Sequence[Selection], sql: str, fetch: str = "all",
           workloads: Sequence[str] | None = None):
    """Run ``sql`` with the selections registered under a unique name, then unregister them.

    ``workloads``: the store's workloads in DuckDB's order (looked up when not given)."""
    if workloads is None:
        workloads = workload_names(con)
    scans, scan_of = _plan_scans(selections, workloads)
    params: dict = {}
    name = f"_batchlab_selections_{uuid.uuid4().hex}"
    text = sql.format(selections=name, scans=_scans_sql(scans, params))
    con.register(name, _selections_table(selections, scan_of))
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
