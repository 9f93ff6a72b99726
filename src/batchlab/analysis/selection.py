"""What one steps-to-result question selects: workload, metric, goal, trials and budget.

A :class:`Selection` is the full set of choices of Shallue et al.'s protocol (science.md 3.4):

* ``workload``: the store's ``dataset/model/optimizer`` name.
* ``metric`` and ``goal``: a row *reaches* the goal when ``value < goal`` (strictly), or
  ``value > goal`` with ``maximize=True``. Non-finite values (NaN, inf: diverged runs) never reach it.
* ``statuses``: the trial statuses analysed (Shallue: only ``COMPLETE``).
* ``max_trials``: keep only the first N trials of those statuses per batch size, in trial-id order.
* ``step_budget``: keep measurement rows with ``step <= step_budget``.
* ``example_budget``: keep rows with ``batch_size * step <= example_budget`` (an epoch budget).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import duckdb

from batchlab.analysis.tables import TRIAL_STATUSES
from batchlab.errors import BatchlabError, unknown_name_error


@dataclass(frozen=True)
class Selection:
    """One steps-to-result question (see the module docstring for every field's meaning)."""

    workload: str
    metric: str
    goal: float
    maximize: bool = False
    max_trials: int | None = None
    step_budget: int | None = None
    example_budget: int | None = None
    statuses: tuple[str, ...] = field(default=("COMPLETE",))

    def __post_init__(self) -> None:
        object.__setattr__(self, "statuses", tuple(self.statuses))
        if not isinstance(self.goal, (int, float)) or not math.isfinite(float(self.goal)):
            raise BatchlabError(f"goal must be a finite number, got {self.goal!r}")
        for name in ("max_trials", "step_budget", "example_budget"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise BatchlabError(f"{name} must be a positive integer or None, got {value!r}")
        if not self.statuses:
            raise BatchlabError(f"statuses must name at least one of {', '.join(TRIAL_STATUSES)}")
        for status in self.statuses:
            if status not in TRIAL_STATUSES:
                raise unknown_name_error("trial status", str(status), TRIAL_STATUSES)

    def describe(self) -> dict:
        """JSON-ready description of the selection."""
        return {
            "workload": self.workload,
            "metric": self.metric,
            "goal": float(self.goal),
            "maximize": self.maximize,
            "max_trials": self.max_trials,
            "step_budget": self.step_budget,
            "example_budget": self.example_budget,
            "statuses": list(self.statuses),
        }


def workload_names(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Every workload in the ``workloads`` view, sorted."""
    return [row[0] for row in con.execute("SELECT DISTINCT workload FROM workloads ORDER BY workload").fetchall()]


def unknown_workload_error(workload: str, known) -> BatchlabError:
    """The one-line error for a workload not in the store (saying so when the store has none)."""
    known = list(known)
    if not known:
        return BatchlabError(f"unknown workload {workload!r}: the store has no workloads yet (import or train some first)")
    return unknown_name_error("workload", workload, known)


def metric_names(con: duckdb.DuckDBPyConnection, workload: str) -> list[str]:
    """Every metric measured for ``workload``, sorted (a scan of that workload's measurements)."""
    rows = con.execute(
        "SELECT DISTINCT metric FROM measurements WHERE workload = ? ORDER BY metric", [workload]
    ).fetchall()
    return [row[0] for row in rows]


def check_selection(con: duckdb.DuckDBPyConnection, selection: Selection) -> None:
    """Raise a one-line :class:`BatchlabError` if the workload or metric is not in the store.

    The message lists the workloads (or the workload's metrics) that exist.
    """
    known = workload_names(con)
    if selection.workload not in known:
        raise unknown_workload_error(selection.workload, known)
    found = con.execute(
        "SELECT 1 FROM measurements WHERE workload = ? AND metric = ? LIMIT 1", [selection.workload, selection.metric]
    ).fetchone()
    if found is None:
        metrics = metric_names(con, selection.workload)
        if not metrics:
            raise BatchlabError(f"workload {selection.workload!r} has no measurements")
        raise BatchlabError(f"workload {selection.workload!r}: {unknown_name_error('metric', selection.metric, metrics)}")
