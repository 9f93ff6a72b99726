"""Steps to result per batch size, with the exact semantics of Shallue et al. (docs/methods.md,
"Steps to result").

For each batch size of a workload:

1. Take the trials whose status is in ``statuses`` (default ``COMPLETE``, ``STOPPED_AT_GOAL`` and
   ``RACED``; a raced trial whose rows do not meet the goal has an unknown first step, see
   :func:`trial_first_steps`)
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

Raced trials (status ``RACED``, docs/methods.md, "Racing"). A RACED trial was stopped at an
evaluation (a full one, or a dense goal check) at step ``steps`` once it could no longer be among its study's ``keep`` best trials; its
rows are the full protocol's up to ``steps``. If one of them qualifies, its first qualifying step is
known exactly; if none does, its first step is *unknown*: larger than ``steps``, and at least the
race's bound (the step of the ``keep``-th best trial's key for the stop goal, ties at it going to the
kept trials; :func:`race_bounds`), unless the step or example budget ends at or before ``steps``
(then every row within the budget is there and it is an ordinary "not reached"). The minimum over
trials is exact when the best known key precedes every unknown trial's smallest possible key
(racing guarantees this for its stop goal and looser goals); otherwise the result is not
determined and the analysis refuses with one line (:func:`check_raced`), never reporting a value
or "not reached".

Bounded rows (docs/methods.md, "Bounded measurements"). A row ``<metric>:bound`` at the same step
flags the row ``<metric>`` as a bound: ``+1`` the true value is ``>=`` the stored one, ``-1`` it is
``<=``. A bounded row counts only when the bound decides the goal: lower is better and an upper
bound below the goal qualifies, a lower bound at or above the goal misses; with ``maximize`` the
mirror. Any other bounded row is ignored (neither a hit, a miss nor a last evaluation).

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
from collections.abc import Sequence
from dataclasses import dataclass, field

import duckdb
import numpy as np

from batchlab.analysis.curve import StepsCurve
from batchlab.analysis.selection import (
    Selection,
    check_selection,
    is_search_round,
    mixed_studies_error,
    refined_study_id,
    resolve_studies,
    stop_rule_error,
    stop_rule_problem,
    study_definitions,
    too_few_trials_error,
    unknown_workload_error,
    workload_names,
)
from batchlab.analysis.raced import budget_limit, check_raced, race_bounds
from batchlab.analysis.tables import DEFAULT_STATUSES
from batchlab.analysis.trial_queries import BEST_SQL, PER_TRIAL_SQL, float_or_none, query_selections
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
            an evaluation of the metric. (On a raced study it is the full protocol's: no trial reaches
            the goal within a budget only if the budget ends before the race's bound, and a raced
            trial's next evaluation after its ``steps`` is past that bound.)
        study_ids: the studies the selected trials came from (sorted; empty when the store records none).
        max_trials: the N of the first-N rule used (``None``: every selected trial).
        n_raced: how many of the selected trials are ``RACED`` (stopped by racing; counted in
            ``n_trials``; ``n_reached`` counts only trials known to have reached the goal).
        value_bound: ``None`` when ``value`` is exact; ``-1`` (upper bound) or ``+1`` (lower bound)
            when the reaching evaluation was stored as a bound (docs/methods.md, "Bounded measurements").
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
    n_raced: int = 0
    value_bound: int | None = None

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
        return float_or_none(self.parameters.get("learning_rate"))

    @property
    def momentum(self) -> float | None:
        """The best trial's ``momentum`` (``None`` if the optimizer has none or not reached)."""
        return float_or_none(self.parameters.get("momentum"))

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
            "n_raced": self.n_raced,
            "value_bound": self.value_bound,
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
            without ``mix_studies``, stopped trials that cannot answer the goal, raced trials that
            leave the minimum undetermined (:func:`check_raced`), or (``max_trials="auto"``) a
            release batch size with fewer trials than the paper's N.
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
    their stop rule covers, the paper's trial count under ``max_trials="auto"``) and the racing rule
    (:func:`check_raced`) are checked either way.
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
    rows = query_selections(con, selections, BEST_SQL, study_ids=study_ids)
    results: list[list[BatchSizeResult]] = [[] for _ in selections]
    checks: list[list[tuple]] = [[] for _ in selections]
    raced: list[list[tuple]] = [[] for _ in selections]
    for (sel_id, batch_size, steps, trial_id, value, parameters, n_trials, n_reached, steps_lower, censored_at,
         ids, stopped_ids, n_available, n_used, value_bound, n_raced, unknown) in rows:
        reached = steps is not None
        ids = sorted(ids or [])
        checks[sel_id].append((int(batch_size), ids, sorted(stopped_ids or []), int(n_available), n_used))
        if n_raced and n_used is not None and int(n_used) < int(n_available):
            # the full protocol may have ended a raced trial INFEASIBLE (diverged later): outside the
            # default statuses, it would not take one of the first N places, so the cut is not determined
            raise BatchlabError(
                f"workload {selections[sel_id].workload!r} batch size {int(batch_size)}: the first {int(n_used)} "
                f"of {int(n_available)} trials include {int(n_raced)} RACED trial(s), whose later status (a "
                "divergence would leave them out) racing does not know; allowed: every trial of the study (no "
                "first-N cut), or re-run the study without --race")
        if unknown:
            raced[sel_id].append((int(batch_size), (int(steps), int(trial_id)) if reached else None,
                                  [(int(float(t)), int(float(x)), sid) for t, x, sid in unknown]))
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
                n_raced=int(n_raced or 0),
                value_bound=int(value_bound) if reached and value_bound is not None else None,
            )
        )
    if check:
        for selection, per_batch in zip(selections, results):
            if not any(r.reached for r in per_batch):
                check_selection(con, selection)
    for selection, per_batch in zip(selections, checks):
        check_study_rules(con, selection, per_batch)
    for selection, per_batch in zip(selections, raced):
        check_raced(con, selection, per_batch)
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
                if not _one_study_with_its_search_rounds(ids, definitions):
                    raise mixed_studies_error(selection, batch_size, ids, definitions)
    for batch_size, _, stopped, _, _ in per_batch:
        for study_id in stopped:
            if definitions is None:
                definitions = study_definitions(con, selection.workload)
            stop_rule = definitions.get(study_id, {}).get("stop_rule")
            problem = stop_rule_problem(selection, stop_rule)
            if problem is not None:
                raise stop_rule_error(selection, batch_size, study_id, problem, stop_rule)



def _one_study_with_its_search_rounds(ids, definitions: dict[str, dict]) -> bool:
    """Whether ``ids`` are one study and at most one search round of it (``--refine-search``:
    ``search_round = 1`` refining that study, the same study searched further; docs/methods.md,
    "Refined search"), which is one study, not a mix. Two search rounds of one study (a store written
    before refine decisions were sticky) are a mix."""
    base = [i for i in ids if not is_search_round(definitions.get(str(i), {}))]
    rounds = [definitions.get(str(i), {}) for i in ids if i not in base]
    return (len(base) == 1 and len(rounds) <= 1
            and all(d.get("search_round") == 1 and refined_study_id(d) == str(base[0]) for d in rounds))


def trial_first_steps(con: duckdb.DuckDBPyConnection, selection: Selection) -> "pandas.DataFrame":  # noqa: F821
    """Every selected trial with its first qualifying step, one row per trial.

    Columns: ``batch_size``, ``trial_id``, ``first_step`` (float: ``inf`` when the trial did not
    reach the goal within the budget, ``NaN`` when that is *unknown*: a ``RACED`` trial whose
    recorded rows do not meet the goal, see the module docstring), ``value`` (the metric there),
    ``value_bound`` (NaN when ``value`` is exact, else the bound flag ``-1``/``+1`` of that row),
    ``parameters`` (JSON text), ``status``, ``study_id``, ``prev_step`` (float: the evaluation step
    before ``first_step``, 0 when none; NaN when not reached or unknown), ``last_step`` (float: the
    trial's last evaluation of the metric within the budget; NaN when it has none) and
    ``raced_at`` (float: a RACED trial's ``steps``, after which its rows end; NaN for other
    trials) and ``unknown_from`` (float, where ``first_step`` is unknown: the smallest step it can
    be, ``max(raced_at + 1, race bound)`` with the study's race bound of :func:`race_bounds`; NaN
    elsewhere; an unknown whose ``unknown_from`` is past the budget is ``inf``, not reached). Sorted by batch size and trial id. This is the per-trial table behind
    :func:`steps_to_result` (used by the bootstrap and the metaparameter scatter); it applies the
    same study rules (:func:`check_study_rules`) and racing rule (:func:`check_raced`).
    """
    import pandas as pd

    workloads = workload_names(con)
    study_ids = [resolve_studies(con, selection) if selection.workload in workloads else None]
    frame = query_selections(con, [selection], PER_TRIAL_SQL, fetch="df", study_ids=study_ids)
    per_batch = []
    for batch_size, group in frame.groupby("batch_size", sort=True):
        ids = sorted({str(x) for x in group["study_id"] if isinstance(x, str)})
        stopped = sorted({str(x) for x, st in zip(group["study_id"], group["status"])
                          if isinstance(x, str) and st == "STOPPED_AT_GOAL"})
        n_used = group["n_used"].iloc[0]
        n_used = None if pd.isna(n_used) else int(n_used)
        per_batch.append((int(batch_size), ids, stopped, int(group["n_available"].iloc[0]), n_used))
    check_study_rules(con, selection, per_batch)
    for column in ("first_step", "value", "value_bound", "prev_step", "last_step", "raced_at"):
        frame[column] = frame[column].astype(float)
    unknown = frame["unknown"].fillna(False).astype(bool).to_numpy()
    raced = []
    for batch_size, group in frame.groupby("batch_size", sort=True):
        here = group[group["unknown"].fillna(False).astype(bool)]
        if here.empty:
            continue
        known = group[group["first_step"].notna()]
        best = None if known.empty else min(zip(known["first_step"].astype(int), known["trial_id"].astype(int)))
        raced.append((int(batch_size), best, [(int(float(t)), int(float(x)), sid if isinstance(sid, str) else None)
                                              for t, x, sid in zip(here["trial_id"], here["raced_at"], here["study_id"])]))
    bounds = check_raced(con, selection, raced)
    if unknown.any() and not bounds:
        bounds = race_bounds(con, selection.workload, set(frame.loc[unknown, "study_id"].dropna()))
    bound = np.array([bounds.get((sid, int(b)), np.nan) if isinstance(sid, str) else np.nan
                      for sid, b in zip(frame["study_id"], frame["batch_size"])], dtype=float)
    unknown_from = np.where(unknown, np.fmax(frame["raced_at"].to_numpy() + 1, bound), np.nan)
    limit = np.array([np.nan if (x := budget_limit(selection, b)) is None else x for b in frame["batch_size"]], dtype=float)
    past = unknown & (unknown_from > limit)  # cannot meet the goal within the budget: not reached
    unknown = unknown & ~past
    frame["unknown_from"] = np.where(unknown, unknown_from, np.nan)
    frame["first_step"] = np.where(unknown, np.nan, frame["first_step"].fillna(np.inf))
    frame = frame.drop(columns=["sel_id", "n_available", "n_used", "unknown"])
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
    """``{batch_size: first qualifying step of each selected trial}`` from :func:`trial_first_steps`,
    in trial-id order.

    Trials that never reached the goal are ``inf``; raced trials whose first step is unknown stay
    ``NaN`` (never ``inf``: they might have reached it). Batch sizes without any selected trial are
    not in ``frame`` and so not in the result; callers that need them add empty arrays.
    """
    out: dict[int, np.ndarray] = {}
    for batch_size, group in frame.groupby("batch_size", sort=True):
        out[int(batch_size)] = group.sort_values("trial_id")["first_step"].to_numpy(dtype=float)
    return out


def trial_unknown_from_by_batch_size(frame) -> dict[int, np.ndarray]:
    """``{batch_size: unknown_from of each selected trial}`` from :func:`trial_first_steps`, aligned
    with :func:`trial_steps_by_batch_size`: the smallest step an unknown first step can be (``NaN``
    for trials whose first step is known)."""
    out: dict[int, np.ndarray] = {}
    for batch_size, group in frame.groupby("batch_size", sort=True):
        out[int(batch_size)] = group.sort_values("trial_id")["unknown_from"].to_numpy(dtype=float)
    return out
