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
  flags, half width, the parameters extended, the space refined and the refined round's study id), so
  its trials get their own keys and id block, like a grown budget round. The budget is not part of it:
  a larger ``BUDGET`` later extends the same round (its points are index-addressed).

The decision rests only on rounds that are final before refining starts, so a resumed sweep re-derives
the same refine rounds (the same definitions, hence keys) and skips their published trials. The
table then analyses all rounds of a study together (the refined round and its search rounds: one
batch size, several study definitions, pooled on purpose). A search round is never refined again.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from batchlab.errors import BatchlabError
from batchlab.sweep.plan import StudyPlan

#: Half the width of the box around the incumbent, in unit coordinates of each parameter (a quarter
#: of the searched range on either side).
HALF_WIDTH = 0.25

#: The flags that ask for a refined search (every kind of batchlab.analysis.tuning_flags).
REFINING_FLAGS = ("better_than_perfect_scaling", "shared_grid_point", "one_reaching_trial", "search_edge")


def refine_budget(value: Any) -> int:
    """``value`` as a refine budget: extra trials per flagged study, a positive integer (a string of
    digits from the command line is read as one). BatchlabError (one line) otherwise."""
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, str) and text.lstrip("+").isdigit():
        text = int(text)
    if isinstance(text, bool) or not isinstance(text, numbers.Integral) or text < 1:
        raise BatchlabError(f"--refine-search BUDGET must be a positive integer (more trials per flagged study), "
                            f"got {value!r:.40}")
    from batchlab.sweep.config import MAX_TRIALS_PER_STUDY

    if text > MAX_TRIALS_PER_STUDY:
        raise BatchlabError(f"--refine-search BUDGET must be at most {MAX_TRIALS_PER_STUDY} (one id block), got {text}")
    return int(text)


def refined_study(study: StudyPlan, incumbent: dict, flags: Sequence[Any], budget: int,
                  half_width: float = HALF_WIDTH) -> StudyPlan:
    """Search round 1 of ``study`` around ``incumbent`` (its best trial's hyperparameters, as stored):
    ``budget`` points in :meth:`~batchlab.search.SearchSpace.box` of the space ``study`` searched
    (with its step-counted ranges as the round ran them), extended past the edges that ``search_edge``
    flags name. The id block (``first_trial_id``) is the caller's to give."""
    from batchlab.search import study_points_seed

    searched = study.stretched_search_space
    seed = study_points_seed(study.seed, study.workload_name or study.workload, study.optimizer, study.batch_size, 1)
    box, points, decision = refine_box(searched, study.optimizer, incumbent, flags, budget, seed, half_width)
    decision["study"] = study.digest
    return replace(study, search_round=1, trials=int(budget), points=tuple(points), search_space=box.to_batch_science(),
                   steps=study.steps, base_steps=study.steps, refine=decision)


def refine_box(searched: dict, optimizer: str, incumbent: dict, flags: Sequence[Any], count: int, seed: int,
               half_width: float = HALF_WIDTH, start: int = 0):
    """``(box, points, decision)`` of a search round: the :class:`~batchlab.search.SearchSpace` box
    around ``incumbent`` in the space ``searched`` (batch_science form), extended past the edges that
    ``search_edge`` ``flags`` name unless ``optimizer`` refuses an extended point (then clipped), its
    points ``start`` to ``start + count`` for ``seed``, and the decision to record (``around``,
    ``flags``, ``half_width``, ``extended``, ``space``)."""
    from batchlab.optim.hyperparameters import resolve_hyperparameters
    from batchlab.search import SearchSpace

    space = SearchSpace.from_batch_science(searched)
    edges = sorted({p for f in flags if f.kind == "search_edge" for p in f.parameters})
    for extend in (edges, []):  # extended points the optimizer refuses: the clipped box instead
        box = space.box(incumbent, half_width, extend=extend)
        points = box.sample(start + count, seed=seed)[start:]
        try:
            for point in points:
                resolve_hyperparameters(optimizer, point)
        except BatchlabError:
            continue
        break
    else:  # pragma: no cover - the clipped box lies inside a space whose points were all checked
        raise BatchlabError(f"no valid refine points around {incumbent}")
    decision = {"around": dict(incumbent), "flags": sorted({f.kind for f in flags}), "half_width": float(half_width),
                "extended": list(extend), "space": dict(searched)}
    return box, points, decision


def refine_studies(con, reported: Sequence[StudyPlan], goal_of: Callable[[StudyPlan], float], budget: int,
                   flags_fn: Callable | None = None) -> tuple[list[StudyPlan], list[dict]]:
    """The search rounds to add, and the flags behind them (JSON-ready), for the ``reported`` rounds
    (one per workload and batch size; ``con``'s ``trials`` view shows exactly their trials).

    ``flags_fn(studies) -> list[TuningFlag]`` (default :func:`batchlab.analysis.tuning_flags.tuning_flags`)
    reads one curve's :class:`~batchlab.analysis.tuning_flags.StudyTuning` list. A batch size is refined
    when a flag of :data:`REFINING_FLAGS` names it and it has a best trial; search rounds are never
    refined again.
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
            if mine and study.batch_size in best:
                added.append(refined_study(study, best[study.batch_size], mine, budget))
    return added, fired
