"""Refined search (``--refine-search BUDGET``): more trials around a study's incumbent where a tuning flag fires.

After every round of a sweep's studies has finished (round 0 and any budget rounds), the sweep reads
each curve's studies as the table does (the reported budget round at each batch size, its trials only),
computes the tuning flags (:func:`batchlab.analysis.tuning_flags.tuning_flags`: better-than-perfect
scaling, a shared grid point, one reaching trial, a search edge) and, for every batch size with a flag
and a best trial (the *incumbent*), plans one further *search round* of that study:

* ``BUDGET`` more trials (a positive integer: :func:`refine_budget`), at the first ``BUDGET`` points of
  a scrambled Halton sequence of their own (:func:`batchlab.search.study_points_seed` with
  ``search_round = 1``) in a box around the incumbent: within :data:`HALF_WIDTH` unit coordinates of it
  in every parameter's own scale (:meth:`batchlab.search.SearchSpace.box`), clipped to the searched
  range, except that a parameter a ``search_edge`` flag names extends past the range's edge;
* the same budget, evaluation and stop rule as the round it refines; its trials get seeds of their own;
* a study definition of its own, recording ``search_round`` and the decision ``refine`` (incumbent,
  half width, the parameters extended, the space refined and the refined round's study id), so its
  trials get their own keys and id block, like a grown budget round. Neither the budget nor the flags
  are part of it: a larger ``BUDGET`` later extends the same round (its points are index-addressed),
  and the flags behind the decision are recorded outside it (the summary's ``refined``, the
  ``search_refined`` event), so the same round is the same study whichever flags fire.

Decisions are sticky: a study with a stored search round (:func:`stored_search_rounds`) is never
decided again. That round is re-planned from its stored definition (its box is its ``search_space``,
its points the same sequence), so a part of the sweep then the whole, more trials or a grown round
never duplicate it; rounds are decided only for studies that have none. The decision rests only on
rounds that are final before refining starts, so a resumed sweep re-derives the same refine rounds
(the same definitions, hence keys) and skips their published trials. The table then analyses a study
with its search round together (one batch size, two study definitions, pooled on purpose); a study
has at most one search round (``search_round = 1``), which is never refined again.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Any

from batchlab.errors import BatchlabError
from batchlab.sweep.config import refine_budget  # noqa: F401  (re-exported: validated with the config)
from batchlab.sweep.plan import StudyPlan

#: Half the width of the box around the incumbent, in unit coordinates of each parameter (a quarter
#: of the searched range on either side).
HALF_WIDTH = 0.25

#: The flags that ask for a refined search (every kind of batchlab.analysis.tuning_flags).
REFINING_FLAGS = ("better_than_perfect_scaling", "shared_grid_point", "one_reaching_trial", "search_edge")


def refined_study(study: StudyPlan, incumbent: dict, flags: Sequence[Any], budget: int,
                  half_width: float = HALF_WIDTH) -> StudyPlan:
    """Search round 1 of ``study`` around ``incumbent`` (its best trial's hyperparameters, as stored):
    ``budget`` points in :meth:`~batchlab.search.SearchSpace.box` of the space ``study`` searched
    (with its step-counted ranges as the round ran them), extended past the edges that ``search_edge``
    flags name. The id block (``first_trial_id``) is the caller's to give."""
    searched = study.stretched_search_space
    box, points, decision = refine_box(searched, study.optimizer, incumbent, flags, budget, _round_seed(study),
                                       half_width)
    decision["study"] = study.digest
    return _search_round(study, box.to_batch_science(), points, decision)


def replanned_study(study: StudyPlan, definition: dict, budget: int) -> StudyPlan:
    """Search round 1 of ``study`` re-planned from its stored study ``definition`` (a sticky decision):
    its box is the definition's ``search_space``, its ``refine`` decision the stored one, its points the
    first ``budget`` of the same sequence (:func:`refined_study`'s), so the plan has the stored study id."""
    from batchlab.search import SearchSpace

    box = SearchSpace.from_batch_science(definition["search_space"])
    points = box.sample(int(budget), seed=_round_seed(study))
    return _search_round(study, dict(definition["search_space"]), points, dict(definition["refine"]))


def _round_seed(study: StudyPlan) -> int:
    """The seed of the points of ``study``'s search round 1 (:func:`batchlab.search.study_points_seed`)."""
    from batchlab.search import study_points_seed

    return study_points_seed(study.seed, study.workload_name or study.workload, study.optimizer, study.batch_size, 1)


def _search_round(study: StudyPlan, box: dict, points: Sequence[dict], decision: dict) -> StudyPlan:
    return replace(study, search_round=1, trials=len(points), points=tuple(points), search_space=box,
                   steps=study.steps, base_steps=study.steps, refine=decision)


def stored_search_rounds(con, reported: Sequence[StudyPlan], budget: int | None) -> list[StudyPlan]:
    """The stored search rounds of the ``reported`` rounds, re-planned (:func:`replanned_study`): for each
    reported study (not itself a search round), the stored study definition with ``search_round = 1``
    and ``refine.study`` its study id (the smallest such id when a store written before decisions were
    sticky holds several; the analysis takes the same one, :func:`batchlab.analysis.units.find_units`),
    planned with ``budget`` points, or, with ``budget`` None, with as many points as it has stored
    trials. A definition whose re-plan does not give its own study id is left out.

    ``con``: a connection to the whole store (its ``studies`` and ``trials`` views unrestricted)."""
    import json

    from batchlab.analysis.selection import refined_study_id
    from batchlab.analysis.tables import view_columns

    bases = {s.digest: s for s in reported if not s.search_round}
    if not bases or not {"study_id", "definition"} <= set(view_columns(con, "studies")):
        return []
    rows = con.execute(
        "SELECT s.study_id, any_value(s.definition), (SELECT count(*) FROM trials t WHERE t.study_id = s.study_id) "
        "FROM studies s WHERE s.definition IS NOT NULL GROUP BY s.study_id ORDER BY s.study_id").fetchall()
    found: dict[str, StudyPlan] = {}
    for sid, text, n_trials in rows:
        try:
            definition = json.loads(text)
        except (TypeError, ValueError):
            continue
        if not isinstance(definition, dict) or definition.get("search_round") != 1:
            continue
        base = bases.get(refined_study_id(definition) or "")
        if base is None or base.digest in found or not n_trials:
            continue
        try:
            plan = replanned_study(base, definition, budget if budget is not None else int(n_trials))
        except (BatchlabError, KeyError, TypeError, ValueError):
            continue
        if plan.digest == sid:
            found[base.digest] = plan
    return list(found.values())


def refine_box(searched: dict, optimizer: str, incumbent: dict, flags: Sequence[Any], count: int, seed: int,
               half_width: float = HALF_WIDTH, start: int = 0):
    """``(box, points, decision)`` of a search round: the :class:`~batchlab.search.SearchSpace` box
    around ``incumbent`` in the space ``searched`` (batch_science form), extended past the edges that
    ``search_edge`` ``flags`` name unless ``optimizer`` refuses a bound of the extended box
    (:func:`_bounds_accepted`; then clipped: the box's bounds decide, never its points or ``count``),
    its points ``start`` to ``start + count`` for ``seed``, and the decision to record in the study
    definition (``around``, ``half_width``, ``extended``, ``space``; not the flags, which are recorded
    outside it)."""
    from batchlab.search import SearchSpace

    space = SearchSpace.from_batch_science(searched)
    extend = sorted({p for f in flags if f.kind == "search_edge" for p in f.parameters})
    box = space.box(incumbent, half_width, extend=extend)
    if extend and not _bounds_accepted(box, optimizer, incumbent, extend):
        extend, box = [], space.box(incumbent, half_width)  # the optimizer refuses an extended bound: clipped
    points = box.sample(start + count, seed=seed)[start:]
    decision = {"around": dict(incumbent), "half_width": float(half_width), "extended": list(extend),
                "space": dict(searched)}
    return box, points, decision


def _bounds_accepted(box, optimizer: str, incumbent: dict, names: Sequence[str]) -> bool:
    """Whether ``optimizer`` accepts ``incumbent`` with each parameter of ``names`` moved to either bound
    of its range in ``box`` (the box's bounds decide an extension, whatever its points and budget)."""
    from batchlab.optim.hyperparameters import resolve_hyperparameters

    bounds = {p.name: p.to_batch_science() for p in box.parameters}
    for name in names:
        for bound in ("min_value", "max_value"):
            if bound not in bounds.get(name, {}):
                continue
            try:
                resolve_hyperparameters(optimizer, {**incumbent, name: bounds[name][bound]})
            except BatchlabError:
                return False
    return True


def refine_studies(con, reported: Sequence[StudyPlan], goal_of: Callable[[StudyPlan], float], budget: int,
                   flags_fn: Callable | None = None, decided: Collection[str] = ()) -> tuple[list[StudyPlan], list[dict]]:
    """The search rounds to add, and the flags behind them (JSON-ready), for the ``reported`` rounds
    (one per workload and batch size; ``con``'s ``trials`` view shows exactly their trials).

    ``flags_fn(studies) -> list[TuningFlag]`` (default :func:`batchlab.analysis.tuning_flags.tuning_flags`)
    reads one curve's :class:`~batchlab.analysis.tuning_flags.StudyTuning` list. A batch size is refined
    when a flag of :data:`REFINING_FLAGS` names it and it has a best trial, unless its study id is in
    ``decided`` (it has a search round already: sticky, :func:`stored_search_rounds`); search rounds
    are never refined again. The flags behind a round are those of ``fired`` at its workload and
    batch size (:func:`flag_kinds`).
    """
    from batchlab.analysis.selection import Selection
    from batchlab.analysis.steps_to_result import steps_to_result_many
    from batchlab.analysis.tables import DEFAULT_STATUSES
    from batchlab.analysis.tuning_flags import tuning_flags, tuning_from_store

    flags_fn = flags_fn or tuning_flags
    by_curve: dict[str, list[StudyPlan]] = {}
    for study in reported:
        if not study.search_round:
            by_curve.setdefault(study.store_workload, []).append(study)
    added, fired = [], []
    for workload, studies in by_curve.items():
        first = studies[0]
        selection = Selection(workload=workload, metric=first.metric, goal=goal_of(first), maximize=first.maximize,
                              statuses=DEFAULT_STATUSES)
        results = steps_to_result_many(con, [selection])[0]
        flags = [f for f in flags_fn(tuning_from_store(con, selection, results)) if f.kind in REFINING_FLAGS]
        fired.extend({"workload": workload, **f.to_dict()} for f in flags)
        best = {r.batch_size: r.parameters for r in results if r.reached and r.parameters}
        for study in sorted(studies, key=lambda s: s.batch_size):
            mine = [f for f in flags if f.batch_size == study.batch_size]
            if mine and study.batch_size in best and study.digest not in decided:
                added.append(refined_study(study, best[study.batch_size], mine, budget))
    return added, fired


def flag_kinds(fired: Sequence[dict], study: StudyPlan) -> list[str]:
    """The kinds of the ``fired`` flags (:func:`refine_studies`) at ``study``'s workload and batch size, sorted."""
    return sorted({f["kind"] for f in fired
                   if f.get("workload") == study.store_workload and f.get("batch_size") == study.batch_size})
