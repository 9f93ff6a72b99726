"""Raced trials in the analysis: the race bounds of raced studies, and the check that raced trials
leave a steps to result determined (docs/methods.md, "Racing in the analysis").

A ``RACED`` trial stopped without meeting the race's stop goal, so its first step meeting a goal is
unknown; it is at least its study's race bound (:func:`race_bounds`). :func:`check_raced` refuses,
with one line, a selection whose minimum over trials such a trial could change;
:func:`budget_limit` is the last step a selection's budget admits.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb

from batchlab.analysis.selection import Selection, study_definitions
from batchlab.analysis.trial_queries import PER_TRIAL_SQL, query_selections
from batchlab.errors import BatchlabError


def race_bounds(con: duckdb.DuckDBPyConnection, workload: str, study_ids) -> dict[tuple[str, int], int]:
    """``{(study_id, batch_size): b}`` for the raced studies among ``study_ids``: ``b`` is the step of the
    ``keep``-th smallest key ``(first step meeting the stop goal, trial id)`` over the study's
    ``COMPLETE`` and ``STOPPED_AT_GOAL`` trials at that batch size (the race's final bound).

    Racing stopped a trial after an evaluation only when the next step at which it could first meet
    the goal, paired with its id, was past the race's bound then (never smaller than this final one;
    :mod:`batchlab.train.race`). So a RACED trial's first step meeting *any* goal of a metric read at
    those evaluations is ``>= b``, and ties at ``b`` go to the kept trials. Studies without a ``race``
    entry or a stop rule in their definition, or with fewer than ``keep`` trials meeting the stop
    goal, have no bound (left out).
    """
    definitions = study_definitions(con, workload)
    selections, keeps = [], []
    for sid in sorted({str(x) for x in study_ids if x is not None}):
        definition = definitions.get(sid, {})
        race, stop = definition.get("race"), definition.get("stop_rule")
        if not isinstance(race, dict) or not isinstance(stop, dict) or stop.get("metric") is None:
            continue
        try:
            keep = int(race.get("keep", 2))
            selections.append(Selection(workload=workload, metric=str(stop["metric"]), goal=float(stop["goal"]),
                                        maximize=bool(stop.get("maximize")), statuses=("COMPLETE", "STOPPED_AT_GOAL"),
                                        studies=(sid,)))
        except (TypeError, ValueError, BatchlabError):
            continue  # an unreadable race or stop rule: no bound
        keeps.append(keep)
    if not selections:
        return {}
    rows = query_selections(con, selections, PER_TRIAL_SQL, study_ids=[s.studies for s in selections])
    keys: dict[tuple[int, int], list] = {}
    for sel_id, batch_size, trial_id, first_step, *_ in rows:
        if first_step is not None:
            keys.setdefault((int(sel_id), int(batch_size)), []).append((int(first_step), int(trial_id)))
    out = {}
    for (sel_id, batch_size), found in keys.items():
        keep = keeps[sel_id]
        if keep >= 1 and len(found) >= keep:
            out[(selections[sel_id].studies[0], batch_size)] = sorted(found)[keep - 1][0]
    return out


def check_raced(con: duckdb.DuckDBPyConnection, selection: Selection, per_batch: Sequence[tuple],
                bounds: dict | None = None) -> dict:
    """Raise a one-line :class:`BatchlabError` where raced trials leave the steps to result undetermined.

    ``per_batch``: ``(batch_size, best, unknown)`` for the batch sizes with selected ``RACED`` trials
    whose first qualifying step is unknown; ``best`` is the smallest known key ``(first step, trial
    id)`` (``None``: no trial is known to reach the goal) and ``unknown`` lists ``(trial_id, steps,
    study_id)`` of those trials. An unknown trial's first step is ``> steps`` and ``>=`` its study's
    race bound (:func:`race_bounds`, ties at the bound going to the kept trials). The minimum is
    exact when ``best`` precedes every unknown trial's smallest possible key: always so for the
    race's stop goal and looser goals. Otherwise (a stricter goal, another metric, a first-N rule
    or status choice that left the kept trials out, ...) an unknown trial might have met the goal
    first, and the analysis refuses instead of reporting a value or "not reached".

    Under a step or example budget that ends before an unknown trial's race bound, the trial cannot
    meet the goal within the budget: it is an ordinary "not reached" there.

    Returns the race bounds it read (``bounds`` when given), for :func:`batchlab.analysis.steps_to_result.trial_first_steps`.
    """
    for batch_size, best, unknown in per_batch:
        early = []
        limit = budget_limit(selection, batch_size)
        for trial_id, steps, sid in unknown:
            if best is not None and best[0] <= steps:
                continue
            if bounds is None:
                bounds = race_bounds(con, selection.workload, {x for _, _, u in per_batch for _, _, x in u})
            bound = bounds.get((sid, batch_size))
            if bound is not None and limit is not None and bound > limit:
                continue  # its first step is past the budget
            if best is not None and bound is not None and best < (bound, trial_id):
                continue
            early.append((steps, trial_id, sid))
        if not early:
            continue
        steps, trial_id, sid = sorted(early)[0]
        definition = study_definitions(con, selection.workload).get(sid, {}) if sid is not None else {}
        race = definition.get("race") if isinstance(definition.get("race"), dict) else {}
        stop = definition.get("stop_rule")
        rule = ""
        if isinstance(stop, dict) and stop.get("metric") is not None and stop.get("goal") is not None:
            rule = f", stop goal {stop['metric']} {'>' if stop.get('maximize') else '<'} {float(stop['goal']):g}"
        study = f"raced study {sid} (keep {race.get('keep', '?')}{rule})" if sid is not None else "a raced study"
        known = (f"before the best known trial reached it ({best[0]} steps)" if best is not None
                 else "and no selected trial is known to reach it")
        sign = ">" if selection.maximize else "<"
        raise BatchlabError(
            f"workload {selection.workload!r} batch size {batch_size}: steps to {selection.metric} {sign} "
            f"{float(selection.goal):g} is not determined: {len(early)} RACED trial(s) of {study}, e.g. trial "
            f"{trial_id}, stopped at step {steps} without meeting it {known}, and racing keeps only the best "
            "trials exact for the stop goal; allowed: the stop goal or a looser one (same metric and direction), "
            "every trial of the study (no first-N cut or status filter), or re-run the study without --race"
        )
    return {} if bounds is None else bounds


def budget_limit(selection: Selection, batch_size: int) -> int | None:
    """The last step the selection's step or example budget admits at ``batch_size`` (``None``: no budget)."""
    limits = [x for x in (selection.step_budget,
                          None if selection.example_budget is None else selection.example_budget // int(batch_size))
              if x is not None]
    return min(limits) if limits else None
