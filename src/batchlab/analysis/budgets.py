"""The best measurement under a budget, per batch size (Shallue et al.'s ``get_best_measurement``).

A budget restricts the measurement rows considered (docs/methods.md, "Budgets"):

* a **step budget** ``S`` keeps rows with ``step <= S``;
* an **example budget** ``E`` keeps rows with ``batch_size * step <= E`` (an epoch budget is
  ``E = epochs * training-set size``).

The best measurement at a batch size is the best metric value (lowest, or highest with ``maximize``)
at any kept evaluation step of any selected trial (by default the ``COMPLETE`` and
``STOPPED_AT_GOAL`` ones, optionally only the first ``max_trials`` by trial id, and only trials of the
``studies`` given: study ids or sweep ids). Trials of one batch size from more than one study
definition are refused unless ``mix_studies`` (as in :mod:`batchlab.analysis.steps_to_result`).
Ties go to the earlier step, then the lower trial id. NaN and infinite values are ignored.

Bounded rows (a ``<metric>:bound`` flag at the same step, docs/methods.md, "Bounded measurements")
hold a bound, not a value: they are skipped (never a best measurement).

Raced studies (docs/methods.md, "Racing"): a ``RACED`` trial's curve ends at its ``steps``, so a
best measurement over rows past that step would miss what the full protocol measured. The
analysis refuses with one line naming the raced study when a selected RACED trial stopped before
the budget ends (no budget: any selected RACED trial); a budget within every selected RACED
trial's ``steps`` (``S <= steps``, or ``E // B <= steps``) reads complete curves and is exact.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import duckdb
import numpy as np

from batchlab.analysis.selection import (
    RELEASE_SOURCE,
    Selection,
    paper_max_trials,
    metric_names,
    mixed_studies_error,
    resolve_study_names,
    study_definitions,
    too_few_trials_error,
    unknown_workload_error,
    workload_names,
)
from batchlab.analysis.tables import DEFAULT_STATUSES, TRIAL_STATUSES, with_study_id
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
    statuses: Sequence[str] = DEFAULT_STATUSES,
    studies: Sequence[str] | None = None,
    mix_studies: bool = False,
) -> list[BestMeasurement]:
    """The best measurement under the budget(s) at every batch size of ``workload``, sorted by batch size."""
    _check(con, workload, metric, statuses, max_trials=max_trials, step_budget=step_budget, example_budget=example_budget)
    params = _params(con, workload, metric, maximize, max_trials, statuses, studies, mix_studies)
    params |= {"step_budget": step_budget, "example_budget": example_budget}
    _check_raced(con, params)
    rows = _execute(con, _BEST_SQL, params).fetchall()
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
    statuses: Sequence[str] = DEFAULT_STATUSES,
    studies: Sequence[str] | None = None,
    mix_studies: bool = False,
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
    params = _params(con, workload, metric, maximize, max_trials, statuses, studies, mix_studies)
    _check_raced(con, params | {"step_budget": budgets[-1] if kind == "step" else None,
                                "example_budget": budgets[-1] if kind == "example" else None})
    params |= {"budgets": list(budgets), "by_examples": kind == "example"}
    rows = _execute(con, _SWEEP_SQL, params).fetchall()
    batch_sizes = tuple(sorted({int(b) for _, b, _ in rows}))
    best = np.full((len(budgets), len(batch_sizes)), np.nan)
    for budget, batch_size, value in rows:
        if value is not None:
            best[budgets.index(int(budget)), batch_sizes.index(int(batch_size))] = float(value)
    return BudgetSweep(kind=kind, budgets=budgets, batch_sizes=batch_sizes, best=best)


def _params(con, workload, metric, maximize, max_trials, statuses, studies, mix_studies) -> dict:
    """Query parameters; resolves ``studies`` and refuses mixed study definitions at a batch size."""
    if isinstance(studies, str):
        studies = (studies,)
    study_ids = resolve_study_names(con, workload, None if studies is None else tuple(studies))
    params = {
        "workload": workload,
        "metric": metric,
        "sign": -1.0 if maximize else 1.0,
        "max_trials": None,
        "statuses": list(statuses),
        "study_ids": None if study_ids is None else list(study_ids),
    }
    params["max_trials"] = _max_trials(con, params, max_trials)
    if not mix_studies:
        mixed = _execute(con, _MIXED_SQL, params).fetchone()
        if mixed is not None:
            selection = Selection(workload=workload, metric=metric, goal=0.0, statuses=tuple(statuses))
            raise mixed_studies_error(selection, int(mixed[0]), sorted(mixed[1]), study_definitions(con, workload))
    return params


def _check_raced(con, params: dict) -> None:
    """Refuse (one line) when a selected RACED trial stopped before the budget ends (module docstring)."""
    row = _execute(con, _RACED_SQL, params).fetchone()
    if row is None:
        return
    study_id, batch_size, trial_id, steps, min_steps, min_examples = row
    if params.get("step_budget") is not None:
        budget = f"step budget {params['step_budget']}"
    elif params.get("example_budget") is not None:
        budget = f"example budget {params['example_budget']}"
    else:
        budget = "no budget (whole curves)"
    study = f"raced study {study_id}" if study_id is not None else "a raced study"
    raise BatchlabError(
        f"workload {params['workload']!r} batch size {batch_size}: {study} stopped trial {trial_id} at step {steps} "
        f"(RACED: it could no longer be among the best), so the best measurement under {budget} is unknown; "
        f"re-run the study without --race, or use a step budget <= {min_steps} or an example budget <= "
        f"{min_examples} (every raced curve is complete there)"
    )


def _max_trials(con, params: dict, max_trials) -> int | None:
    """The N of the first-N rule: an int as given; ``"all"``/None: every trial; ``"auto"``: the paper's
    N for imported release workloads (refusing a batch size with fewer trials), every trial otherwise."""
    if isinstance(max_trials, str):
        word = max_trials.strip().lower()
        if word == "all":
            return None
        row = _execute(con, _RELEASE_SQL, params | {"release": RELEASE_SOURCE}).fetchone()
        if row is None or not row[0]:
            return None
        n = paper_max_trials(params["workload"])
        if row[1] < n:
            raise too_few_trials_error(params["workload"], row[2], row[1], n, params["statuses"])
        return n
    return max_trials


def _execute(con, text: str, params: dict):
    """Run ``text`` (see :func:`_sql`) with the ``params`` it names."""
    text = _sql(con, text)
    return con.execute(text, {k: v for k, v in params.items() if f"${k}" in text})


def _sql(con, text: str) -> str:
    """``text`` with ``{trials}`` the trials view (a NULL ``study_id`` where the store has none)."""
    return text.replace("{trials}", with_study_id(con, "trials"))


def _check(con, workload, metric, statuses, **integers) -> None:
    for name, value in integers.items():
        if name == "max_trials" and isinstance(value, str):
            Selection(workload=workload, metric=metric, goal=0.0, max_trials=value)  # checks the word
            continue
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


# Trials of the workload with a selected status, from the selected studies.
_CANDIDATES = """
    SELECT batch_size, trial_id, parameters, study_id, status, steps FROM {trials}
    WHERE workload = $workload AND list_contains($statuses, status)
      AND (CAST($study_ids AS VARCHAR[]) IS NULL OR list_contains(CAST($study_ids AS VARCHAR[]), study_id))
"""

# Whether the selected trials come from the release, and the batch size with the fewest of them.
_RELEASE_SQL = """
SELECT bool_or(release), min(n), arg_min(batch_size, n) FROM (
    SELECT t.batch_size, count(*) AS n, bool_or(t.source = $release) AS release FROM {trials} AS t
    WHERE t.workload = $workload AND list_contains($statuses, t.status)
      AND (CAST($study_ids AS VARCHAR[]) IS NULL OR list_contains(CAST($study_ids AS VARCHAR[]), t.study_id))
    GROUP BY t.batch_size
)
"""

# The first batch size whose selected trials come from more than one study, with those studies.
_MIXED_SQL = (
    """
SELECT batch_size, list(DISTINCT study_id) FROM ("""
    + _CANDIDATES
    + """) WHERE study_id IS NOT NULL
GROUP BY batch_size HAVING count(DISTINCT study_id) > 1 ORDER BY batch_size LIMIT 1
"""
)

# Selected trials of the workload (study and status rules, then the first max_trials by trial id)
# and the finite measurement rows of the metric; ``sign`` turns "best" into "smallest sign * value".
_ROWS_CTE = (
    """
WITH chosen AS (
    SELECT batch_size, trial_id, parameters, study_id, status, steps FROM (
        SELECT batch_size, trial_id, parameters, study_id, status, steps,
               row_number() OVER (PARTITION BY batch_size ORDER BY trial_id) AS rank
        FROM ("""
    + _CANDIDATES
    + """)
    ) WHERE CAST($max_trials AS BIGINT) IS NULL OR rank <= CAST($max_trials AS BIGINT)
),
kept AS (
    SELECT m.batch_size, m.trial_id, m.step, m.value, c.parameters
    FROM measurements AS m JOIN chosen AS c USING (batch_size, trial_id)
    WHERE m.workload = $workload AND m.metric = $metric AND isfinite(m.value)
      AND NOT EXISTS (  -- a bounded row holds a bound, not a value
          SELECT 1 FROM measurements AS f
          WHERE f.workload = $workload AND f.metric = $metric || ':bound'
            AND f.batch_size = m.batch_size AND f.trial_id = m.trial_id AND f.step = m.step)
),
batch_sizes AS (
    SELECT batch_size FROM {trials} WHERE workload = $workload
      AND (CAST($study_ids AS VARCHAR[]) IS NULL OR list_contains(CAST($study_ids AS VARCHAR[]), study_id))
    UNION SELECT batch_size FROM studies WHERE workload = $workload AND CAST($study_ids AS VARCHAR[]) IS NULL
)
"""
)

# The first selected RACED trial whose curve ends before the budget does (none: every curve the
# budget reads is complete), with the smallest step and example budgets within every raced curve.
_RACED_SQL = (
    _ROWS_CTE
    + """,
raced AS (SELECT * FROM chosen WHERE status = 'RACED')
SELECT study_id, batch_size, trial_id, steps,
       (SELECT min(steps) FROM raced), (SELECT min(batch_size * steps) FROM raced)
FROM raced
WHERE NOT coalesce(CAST($step_budget AS BIGINT) <= steps, false)
  AND NOT coalesce(CAST($example_budget AS BIGINT) // batch_size <= steps, false)
ORDER BY batch_size, trial_id LIMIT 1
"""
)

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
