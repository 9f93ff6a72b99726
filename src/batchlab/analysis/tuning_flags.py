"""Tuning flags: batch sizes whose steps to result the search may not have tuned (docs/methods.md,
"Tuning flags").

Shallue et al. tune every batch size with its own search; a steps-to-result curve is only as good as
the tuning at each of its points. :func:`tuning_flags` reads four symptoms of a point the search did
not resolve from each batch size's :class:`StudyTuning` (its best trial's steps, how many trials
reached the goal, the best trial's hyperparameters and the searched space):

* ``better_than_perfect_scaling``: for neighbouring reached batch sizes ``B1 < B2`` (consecutive
  among the reached ones), ``S(B2) * B2 < S(B1) * B1 / (1 + tolerance)``: the larger batch needs
  fewer *examples*, which perfect scaling (examples constant) does not allow beyond the tolerance;
  the smaller batch size ``B1`` is flagged as probably under-tuned.
* ``shared_grid_point``: the best trial's value of a searched continuous parameter is exactly the
  same number at two or more batch sizes (the same search point won everywhere, so the search could
  not resolve the optimum); each such batch size is flagged, naming the parameter and the value.
  Parameters checked: the ``DOUBLE`` parameters of the study's space with ``min_value < max_value``;
  without a known space, ``learning_rate`` alone.
* ``one_reaching_trial``: a reached batch size where exactly one of several trials reached the goal
  (``n_reached == 1 < n_trials``), or any batch size with a single trial (``n_trials == 1``, reached
  or censored): its steps, or its censoring bound, rest on one trial whose scatter is unknown.
* ``search_edge``: the best trial lies at an edge of its searched range, by
  :func:`batchlab.analysis.metaparameters.search_space_edges` (docs/methods.md, "Search-edge
  warnings"): a wider range might have found a faster trial.

:func:`flagged_fit_effect` fits the curve with every point and with the flagged batch sizes left out
(every kind leaves its batch size out, or only the kinds asked for, e.g. :data:`POINT_KINDS`), so a
report shows how much ``B_crit`` rests on them.
:func:`tuning_from_store` builds the studies from a store selection.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING

import duckdb
import numpy as np

from batchlab.finite import finite_or_none
from batchlab.analysis.bootstrap import bootstrap_critical_batch_size
from batchlab.analysis.critical_batch_size import fit_steps_curve
from batchlab.analysis.curve import StepsCurve
from batchlab.analysis.metaparameters import (
    EDGE_FRACTION,
    REACHED,
    best_trial_spaces,
    search_space_edges,
    trial_outcomes,
)
from batchlab.analysis.selection import Selection
from batchlab.analysis.steps_to_result import (
    steps_to_result_many,
    trial_first_steps,
    trial_steps_by_batch_size,
    trial_unknown_from_by_batch_size,
)
from batchlab.errors import BatchlabError

if TYPE_CHECKING:
    from batchlab.search import SearchSpace

KINDS = ("better_than_perfect_scaling", "shared_grid_point", "one_reaching_trial", "search_edge")
#: The kinds about one point's own measurement (under-tuned, one trial), as opposed to the search's
#: resolution across batch sizes (a shared point, a search edge), which often flags a whole range.
POINT_KINDS = ("better_than_perfect_scaling", "one_reaching_trial")
#: The parameter checked for shared grid points when a study's search space is unknown.
DEFAULT_SHARED_PARAMETER = "learning_rate"


@dataclass(frozen=True)
class StudyTuning:
    """How one batch size was tuned.

    Attributes:
        batch_size: examples per update.
        steps: the best trial's steps to result (updates), ``None`` when no trial reached the goal.
        n_reached: trials that reached the goal.
        n_trials: trials the search ran there (:func:`tuning_from_store`: the selected trials plus the
            diverged ones of the same studies).
        best_point: the best trial's hyperparameters (``None`` when not reached).
        space: the :class:`batchlab.search.SearchSpace` the best trial was drawn from (``None``: unknown).
    """

    batch_size: int
    steps: int | None
    n_reached: int
    n_trials: int
    best_point: dict | None = None
    space: SearchSpace | None = None


@dataclass(frozen=True)
class TuningFlag:
    """One flag: its ``kind`` (one of :data:`KINDS`), the flagged ``batch_size``, a one-line
    ``message`` naming the batch sizes and numbers that decide, the ``parameters`` involved
    (``shared_grid_point``, ``search_edge``) and the deciding numbers in ``detail`` (JSON-ready)."""

    kind: str
    batch_size: int
    message: str
    parameters: tuple[str, ...] = ()
    detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready fields."""
        return {"kind": self.kind, "batch_size": int(self.batch_size), "message": self.message,
                "parameters": list(self.parameters), "detail": dict(self.detail)}


def tuning_flags(studies: Sequence[StudyTuning], tolerance: float = 0.1) -> list[TuningFlag]:
    """Every tuning flag of one curve's studies (rules: module docstring), sorted by batch size and
    then in the order of :data:`KINDS`.

    ``tolerance`` is the perfect-scaling tolerance, in (0, 1) (the regimes' 0.1 by default).

    Raises:
        BatchlabError: a tolerance outside (0, 1), or two studies at one batch size.
    """
    if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real) or not 0 < tolerance < 1:
        raise BatchlabError(f"tuning-flag tolerance must be a number in (0, 1), got {tolerance!r}")
    ordered = sorted(studies, key=lambda s: int(s.batch_size))
    sizes = [int(s.batch_size) for s in ordered]
    repeated = sorted({b for b in sizes if sizes.count(b) > 1})
    if repeated:
        raise BatchlabError(f"tuning flags: more than one study at batch size(s) {repeated}; allowed: one per batch size")
    flags = (_better_than_perfect_scaling(ordered, float(tolerance)) + _shared_grid_points(ordered)
             + _one_reaching_trial(ordered) + _search_edges(ordered))
    return sorted(flags, key=lambda f: (f.batch_size, KINDS.index(f.kind)))


def _better_than_perfect_scaling(studies: Sequence[StudyTuning], tolerance: float) -> list[TuningFlag]:
    reached = [s for s in studies if s.steps is not None and s.steps > 0]
    flags = []
    for small, large in pairwise(reached):
        e1, e2 = int(small.steps) * int(small.batch_size), int(large.steps) * int(large.batch_size)
        if e2 < e1 / (1.0 + tolerance):
            b1, b2 = int(small.batch_size), int(large.batch_size)
            flags.append(TuningFlag(
                "better_than_perfect_scaling", b1,
                f"batch size {b1}: S({b2}) x {b2} = {e2} examples < S({b1}) x {b1} = {e1} / (1 + {tolerance:g}) "
                f"(ratio {e2 / e1:.3f}): the larger batch size needs fewer examples, better than perfect scaling; "
                f"B={b1} is probably under-tuned",
                detail={"neighbour": b2, "steps": int(small.steps), "neighbour_steps": int(large.steps),
                        "examples": e1, "neighbour_examples": e2, "examples_ratio": e2 / e1, "tolerance": tolerance}))
    return flags


def _checked_parameters(study: StudyTuning) -> list[str]:
    """The parameters of ``study``'s best point whose values are compared across batch sizes."""
    point = study.best_point or {}
    if study.space is None:
        names = [DEFAULT_SHARED_PARAMETER]
    else:
        names = [p.name for p in study.space.parameters
                 if p.type == "DOUBLE" and float(p.min_value) < float(p.max_value)]
    return [n for n in names if _is_number(point.get(n))]


def _shared_grid_points(studies: Sequence[StudyTuning]) -> list[TuningFlag]:
    where: dict[tuple[str, float], list[int]] = {}
    for s in studies:
        if s.steps is None:
            continue
        for name in _checked_parameters(s):
            where.setdefault((name, float(s.best_point[name])), []).append(int(s.batch_size))
    shared = {key: sizes for key, sizes in where.items() if len(sizes) >= 2}
    flags = []
    for s in studies:
        b = int(s.batch_size)
        mine = [(name, float(s.best_point[name]), shared[(name, float(s.best_point[name]))])
                for name in (_checked_parameters(s) if s.steps is not None else [])
                if (name, float(s.best_point[name])) in shared]
        if not mine:
            continue
        parts = [f"{name} = {value:.4g} (also at B = {', '.join(str(x) for x in sizes if x != b)})"
                 for name, value, sizes in mine]
        flags.append(TuningFlag(
            "shared_grid_point", b,
            f"batch size {b}: the best trial's {'; '.join(parts)}: the same searched point won at several batch "
            "sizes, so the search did not resolve the optimum there",
            parameters=tuple(name for name, _, _ in mine),
            detail={"values": {name: value for name, value, _ in mine},
                    "batch_sizes": {name: list(sizes) for name, _, sizes in mine}}))
    return flags


def _one_reaching_trial(studies: Sequence[StudyTuning]) -> list[TuningFlag]:
    flags = []
    for s in studies:
        b, n, k = int(s.batch_size), int(s.n_trials), int(s.n_reached)
        if n == 1:
            what = f"steps to result {s.steps}" if s.steps is not None else "its censoring (not reached)"
            message = f"batch size {b}: {what} rests on its only trial; its scatter is unknown"
        elif s.steps is not None and k == 1:
            message = (f"batch size {b}: steps to result {s.steps} rests on 1 of {n} trials reaching the goal; "
                       "its scatter is unknown")
        else:
            continue
        flags.append(TuningFlag("one_reaching_trial", b, message,
                                detail={"n_reached": k, "n_trials": n, "steps": s.steps}))
    return flags


def _search_edges(studies: Sequence[StudyTuning]) -> list[TuningFlag]:
    flags = []
    for s in studies:
        if s.steps is None or not s.best_point or s.space is None:
            continue
        found = search_space_edges(s.best_point, s.space)
        if not found:
            continue
        b = int(s.batch_size)
        parts = [f"{f['parameter']} = {_short(f['value'])} "
                 + ("outside" if f["outside"] else (f"at the {f['edge']} end" if f["scale"] == "DISCRETE"
                                                    else f"in the {f['edge']} {EDGE_FRACTION:.0%}"))
                 + f" of [{_short(f['min_value'])}, {_short(f['max_value'])}] ({f['scale'].lower().replace('_', '-')})"
                 for f in found]
        flags.append(TuningFlag(
            "search_edge", b,
            f"batch size {b}: the best trial's {'; '.join(parts)}: the optimum may lie outside the searched range",
            parameters=tuple(f["parameter"] for f in found),
            detail={"edges": [dict(f) for f in found], "fraction": EDGE_FRACTION}))
    return flags


def tuning_from_store(con: duckdb.DuckDBPyConnection, selection: Selection, results=None) -> list[StudyTuning]:
    """One :class:`StudyTuning` per batch size of ``selection`` (sorted by batch size).

    ``steps`` and ``best_point`` come from :func:`~batchlab.analysis.steps_to_result.steps_to_result`
    (``results``, when the caller already has them for ``selection``); ``n_trials`` and ``n_reached``
    from :func:`~batchlab.analysis.metaparameters.trial_outcomes` (the selected trials plus the diverged
    trials of the same studies; raced trials that stopped without meeting the goal count as not
    reached); ``space`` from :func:`~batchlab.analysis.metaparameters.best_trial_spaces`.
    """
    if results is None:
        results = steps_to_result_many(con, [selection])[0]
    outcomes = trial_outcomes(con, selection)
    n_trials = outcomes.groupby("batch_size").size()
    n_reached = outcomes[outcomes["outcome"] == REACHED].groupby("batch_size").size()
    spaces = best_trial_spaces(con, results)
    return [
        StudyTuning(
            batch_size=int(r.batch_size),
            steps=r.steps,
            n_reached=int(n_reached.get(r.batch_size, 0)),
            n_trials=int(n_trials.get(r.batch_size, 0)),
            best_point=dict(r.parameters) if r.reached else None,
            space=spaces.get(int(r.batch_size)),
        )
        for r in sorted(results, key=lambda r: r.batch_size)
    ]


# --- the fit with and without the flagged points --------------------------------------------------


@dataclass(frozen=True)
class FlaggedFitEffect:
    """B_crit with every point and with the flagged batch sizes left out.

    ``all_points`` and ``without_flagged``: ``{"b_crit", "low", "high", "n_points", "batch_sizes",
    "error"}``: the McCandlish ``B_crit`` (``inf`` when no plateau is visible), its interval ends
    (``None`` when the fit gives none, or on an unbounded side), the reached batch sizes fitted, the
    batch sizes of the curve used, and the one-line reason when that fit could not be made (then
    ``b_crit`` is ``None``). ``left_out``: the batch sizes of the curve flagged by a kind in
    ``leave_out``, left out of the second fit, each with those kinds in ``kinds``.
    """

    all_points: dict
    without_flagged: dict
    left_out: tuple[int, ...]
    kinds: dict
    leave_out: tuple[str, ...] = KINDS

    def to_dict(self) -> dict:
        """JSON-ready fields (infinite values become ``None``, with ``b_crit_unbounded`` true)."""
        def side(d):
            value = d["b_crit"]
            return {**d, "b_crit": finite_or_none(value), "low": finite_or_none(d["low"]), "high": finite_or_none(d["high"]),
                    "b_crit_unbounded": value is not None and math.isinf(value)}

        return {"all_points": side(self.all_points), "without_flagged": side(self.without_flagged),
                "left_out": list(self.left_out), "kinds": {str(b): list(k) for b, k in self.kinds.items()},
                "leave_out": list(self.leave_out)}

    def text(self) -> str:
        """One line: ``B_crit V [LOW, HIGH] with all N batch sizes; V' [..] without B = ... (flagged)``."""
        if not self.left_out:
            return f"no batch size flagged: B_crit {_fit_text(self.all_points)} with every point"
        return (f"B_crit {_fit_text(self.all_points)} with all {len(self.all_points['batch_sizes'])} batch sizes; "
                f"{_fit_text(self.without_flagged)} without the flagged B = {', '.join(map(str, self.left_out))}")


def flagged_fit_effect(
    curve: StepsCurve,
    flags: Sequence[TuningFlag],
    fit_fn: Callable[[StepsCurve], object] | None = None,
    full=None,
    leave_out: Sequence[str] = KINDS,
) -> FlaggedFitEffect:
    """Fit ``curve`` with every point and with the batch sizes of ``flags`` left out (by default every
    kind of flag leaves its batch size out: each says the point may not be tuned).

    Args:
        curve: the steps-to-result curve (reached and censored batch sizes).
        flags: from :func:`tuning_flags`; flags at batch sizes not on the curve are ignored.
        fit_fn: the fit of a curve, returning a :class:`~batchlab.analysis.critical_batch_size.ScalingFit`
            (point estimate only) or a :class:`~batchlab.analysis.bootstrap.CriticalBatchSizeEstimate`
            (with the ``mccandlish_b_crit`` interval); default
            :func:`~batchlab.analysis.critical_batch_size.fit_steps_curve`. See :func:`store_fit_fn`
            for the store's trials.
        full: the fit of the whole curve when the caller already has it (``fit_fn`` is then called
            only for the reduced curve).
        leave_out: the kinds whose batch sizes are left out (e.g. :data:`POINT_KINDS`); flags of
            other kinds are ignored.

    A fit that cannot be made (fewer than two reached batch sizes left) is reported with its reason,
    not raised.
    """
    if fit_fn is None:
        fit_fn = fit_steps_curve
    leave_out = tuple(leave_out)
    unknown = [k for k in leave_out if k not in KINDS]
    if unknown or not leave_out:
        raise BatchlabError(f"flag kinds to leave out must be some of {', '.join(KINDS)}; got {list(leave_out)}")
    on_curve = {int(b) for b in curve.batch_sizes}
    kinds: dict[int, list[str]] = {}
    for f in flags:
        if f.kind not in leave_out:
            continue
        if int(f.batch_size) in on_curve and f.kind not in kinds.setdefault(int(f.batch_size), []):
            kinds[int(f.batch_size)].append(f.kind)
    kinds = {b: tuple(kinds[b]) for b in sorted(kinds)}
    left_out = tuple(kinds)
    all_points = _fit_summary(curve, fit_fn, full)
    if not left_out:
        return FlaggedFitEffect(all_points, dict(all_points), (), {}, leave_out)
    keep = [i for i, b in enumerate(curve.batch_sizes) if int(b) not in kinds]
    reduced = None
    if keep:
        pick = (lambda values: None if values is None else tuple(values[i] for i in keep))
        reduced = StepsCurve(batch_sizes=pick(curve.batch_sizes), steps=pick(curve.steps), label=curve.label,
                             metadata=dict(curve.metadata), steps_lower=pick(curve.steps_lower),
                             censored_at=pick(curve.censored_at))
    without = _fit_summary(reduced, fit_fn, None) if reduced is not None else _failed((), "no batch size left")
    return FlaggedFitEffect(all_points, without, left_out, kinds, leave_out)


def store_fit_fn(con: duckdb.DuckDBPyConnection, selection: Selection, *, n_boot: int = 1000, level: float = 0.9,
                 seed: int = 0, tolerance: float = 0.1) -> Callable[[StepsCurve], object]:
    """A ``fit_fn`` for :func:`flagged_fit_effect` on a store: the trials of ``selection`` (read once)
    at the curve's batch sizes, fitted by :func:`~batchlab.analysis.bootstrap.bootstrap_critical_batch_size`
    with the inputs :func:`~batchlab.analysis.bootstrap.critical_batch_size_with_intervals` gives it
    (so on the whole curve it returns the same estimate)."""
    results = {r.batch_size: r for r in steps_to_result_many(con, [selection])[0]}
    frame = trial_first_steps(con, selection)
    steps = trial_steps_by_batch_size(frame)
    unknown_from = trial_unknown_from_by_batch_size(frame)

    def fit(curve: StepsCurve):
        sizes = [int(b) for b in curve.batch_sizes if int(b) in results]
        return bootstrap_critical_batch_size(
            {b: steps.get(b, np.empty(0)) for b in sizes}, n_boot=n_boot, level=level, seed=seed,
            tolerance=tolerance, label=selection.workload, metadata=selection.describe(),
            steps_lower={b: results[b].steps_lower for b in sizes},
            censored_at={b: results[b].censored_at for b in sizes},
            unknown_from={b: unknown_from[b] for b in sizes if b in unknown_from})

    return fit


def _fit_summary(curve: StepsCurve, fit_fn, result) -> dict:
    sizes = tuple(int(b) for b in curve.batch_sizes)
    if result is None:
        try:
            result = fit_fn(curve)
        except BatchlabError as exc:
            return _failed(sizes, str(exc))
    if hasattr(result, "estimates") and hasattr(result, "intervals"):  # a CriticalBatchSizeEstimate
        low, high = result.intervals["mccandlish_b_crit"]
        value, fit = result.estimates["mccandlish_b_crit"], result.fit
    else:  # a ScalingFit
        value, low, high, fit = result.b_crit, None, None, result
    return {"b_crit": None if value is None else float(value), "low": None if low is None else float(low),
            "high": None if high is None else float(high), "n_points": int(fit.n_points), "batch_sizes": list(sizes),
            "error": None}


def _failed(sizes, reason: str) -> dict:
    return {"b_crit": None, "low": None, "high": None, "n_points": 0, "batch_sizes": list(sizes), "error": reason}


def _fit_text(side: dict) -> str:
    if side["b_crit"] is None:
        return f"none ({side['error']})"
    value = side["b_crit"]
    low = "0" if side["low"] is None else _short(side["low"])
    high = "inf" if side["high"] is None or math.isinf(side["high"]) else _short(side["high"])
    interval = f" [{low}, {high}]" if side["low"] is not None or side["high"] is not None else " (no interval)"
    return ("inf" if math.isinf(value) else _short(value)) + interval


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _short(value) -> str:
    return f"{value:.4g}" if _is_number(value) else repr(value)
