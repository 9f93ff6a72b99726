"""The best measurement under a budget, per batch size (Shallue et al.'s ``get_best_measurement``).

A budget restricts the measurement rows considered (science.md 3.4):

* a **step budget** ``S`` keeps rows with ``step <= S``;
* an **example budget** ``E`` keeps rows with ``batch_size * step <= E`` (an epoch budget is
  ``E = epochs * training-set size``).

The best measurement at a batch size is the best metric value (lowest, or highest with ``maximize``)
at any kept evaluation step of any selected trial (by default the ``COMPLETE`` ones, optionally only
the first ``max_trials`` by trial id). Ties go to the earlier step, then the lower trial id. NaN and
infinite values are ignored.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import duckdb
import numpy as np

from batchlab.analysis.selection import metric_names, unknown_workload_error, workload_names
from batchlab.analysis.tables import TRIAL_STATUSES
from batchlab.errors import BatchlabError, unknown_name_error

BUDGET_KINDS = ("step", "example")


@dataclass(frozen=True)
class BestMeasurement:
    """The best measurement at one batch size; ``value`` is ``None`` when no row is within budget."""

    batch_size: int
    value: float | None
    step: int | None
    trial_id: int | None
    parameters: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready fields."""
        return {
            "batch_size": self.batch_size,
            "value": self.value,
            "step": self.step,
            "trial_id": self.trial_id,
            "parameters": self.parameters,
        }


@dataclass(frozen=True)
class BudgetSweep:
    """Best measurement per batch size for several budgets of one kind.

    Attributes:
        kind: ``"step"`` or ``"example"``.
        budgets: the budgets, increasing.
        batch_sizes: the workload's batch sizes, increasing.
        best: array ``(len(budgets), len(batch_sizes))`` of best values, NaN where no row is in budget.
    """

    kind: str
    budgets: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    best: np.ndarray


def best_measurement(
    con: duckdb.DuckDBPyConnection,
    workload: str,
    metric: str,
    maximize: bool = False,
    step_budget: int | None = None,
    example_budget: int | None = None,
    max_trials: int | None = None,
    statuses: Sequence[str] = ("COMPLETE",),
) -> list[BestMeasurement]:
    """The best measurement under the budget(s) at every batch size of ``workload``, sorted by batch size."""
    _check(con, workload, metric, statuses, max_trials=max_trials, step_budget=step_budget, example_budget=example_budget)
    params = _params(workload, metric, maximize, max_trials, statuses)
    params |= {"step_budget": step_budget, "example_budget": example_budget}
    rows = con.execute(_BEST_SQL, params).fetchall()
    return [
        BestMeasurement(
            batch_size=int(b),
            value=None if v is None else float(v),
            step=None if s is None else int(s),
            trial_id=None if t is None else int(t),
            parameters=json.loads(p) if p else {},
        )
        for b, v, s, t, p in rows
    ]


def best_measurement_by_budget(
    con: duckdb.DuckDBPyConnection,
    workload: str,
    metric: str,
    budgets: Sequence[int],
    kind: str = "step",
    maximize: bool = False,
    max_trials: int | None = None,
    statuses: Sequence[str] = ("COMPLETE",),
) -> BudgetSweep:
    """The best measurement per batch size under each of ``budgets`` (all of one ``kind``), in one query."""
    if kind not in BUDGET_KINDS:
        raise unknown_name_error("budget kind", kind, BUDGET_KINDS)
    if not budgets:
        raise BatchlabError("give at least one budget")
    for budget in budgets:
        _check_positive_int(f"{kind} budget", budget)
    _check(con, workload, metric, statuses, max_trials=max_trials)
    budgets = tuple(sorted(set(int(b) for b in budgets)))
    params = _params(workload, metric, maximize, max_trials, statuses) | {"budgets": list(budgets), "by_examples": kind == "example"}
    rows = con.execute(_SWEEP_SQL, params).fetchall()
    batch_sizes = tuple(sorted({int(b) for _, b, _ in rows}))
    best = np.full((len(budgets), len(batch_sizes)), np.nan)
    for budget, batch_size, value in rows:
        if value is not None:
            best[budgets.index(int(budget)), batch_sizes.index(int(batch_size))] = float(value)
    return BudgetSweep(kind=kind, budgets=budgets, batch_sizes=batch_sizes, best=best)


def _params(workload, metric, maximize, max_trials, statuses) -> dict:
    return {
        "workload": workload,
        "metric": metric,
        "sign": -1.0 if maximize else 1.0,
        "max_trials": max_trials,
        "statuses": list(statuses),
    }


def _check(con, workload, metric, statuses, **integers) -> None:
    for name, value in integers.items():
        if value is not None:
            _check_positive_int(name, value)
    for status in statuses:
        if status not in TRIAL_STATUSES:
            raise unknown_name_error("trial status", str(status), TRIAL_STATUSES)
    known = workload_names(con)
    if workload not in known:
        raise unknown_workload_error(workload, known)
    metrics = metric_names(con, workload)
    if metric not in metrics:
        raise BatchlabError(f"workload {workload!r}: {unknown_name_error('metric', metric, metrics)}")


def _check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise BatchlabError(f"{name} must be a positive integer, got {value!r}")


# Selected trials of the workload (status rule, then the first max_trials by trial id) and the
# finite measurement rows of the metric; ``sign`` turns "best" into "smallest sign * value".
_ROWS_CTE = """
WITH chosen AS (
    SELECT batch_size, trial_id, parameters FROM (
        SELECT batch_size, trial_id, parameters,
               row_number() OVER (PARTITION BY batch_size ORDER BY trial_id) AS rank
        FROM trials WHERE workload = $workload AND list_contains($statuses, status)
    ) WHERE CAST($max_trials AS BIGINT) IS NULL OR rank <= CAST($max_trials AS BIGINT)
),
kept AS (
    SELECT m.batch_size, m.trial_id, m.step, m.value, c.parameters
    FROM measurements AS m JOIN chosen AS c USING (batch_size, trial_id)
    WHERE m.workload = $workload AND m.metric = $metric AND isfinite(m.value)
),
batch_sizes AS (
    SELECT batch_size FROM studies WHERE workload = $workload
    UNION SELECT batch_size FROM trials WHERE workload = $workload
)
"""

_BEST_SQL = (
    _ROWS_CTE
    + """,
in_budget AS (
    SELECT * FROM kept
    WHERE (CAST($step_budget AS BIGINT) IS NULL OR step <= CAST($step_budget AS BIGINT))
      AND (CAST($example_budget AS BIGINT) IS NULL OR batch_size * step <= CAST($example_budget AS BIGINT))
),
ranked AS (
    SELECT *, row_number() OVER (PARTITION BY batch_size ORDER BY $sign * value, step, trial_id) AS position
    FROM in_budget
)
SELECT b.batch_size, r.value, r.step, r.trial_id, r.parameters
FROM batch_sizes AS b LEFT JOIN (SELECT * FROM ranked WHERE position = 1) AS r USING (batch_size)
ORDER BY b.batch_size
"""
)

_SWEEP_SQL = (
    _ROWS_CTE
    + """,
per_step AS (  -- best signed value at each evaluation step of each batch size (small)
    SELECT batch_size, step, min($sign * value) AS best FROM kept GROUP BY batch_size, step
),
budgets AS (SELECT unnest(CAST($budgets AS BIGINT[])) AS budget)
SELECT g.budget, b.batch_size, $sign * min(p.best) AS best
FROM budgets AS g CROSS JOIN batch_sizes AS b
LEFT JOIN per_step AS p
       ON p.batch_size = b.batch_size
      AND CASE WHEN $by_examples THEN p.batch_size * p.step <= g.budget ELSE p.step <= g.budget END
GROUP BY g.budget, b.batch_size
ORDER BY g.budget, b.batch_size
"""
)
