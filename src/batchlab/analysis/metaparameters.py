"""Optimal metaparameters against batch size, the scaling heuristics, and every trial's outcome.

* The *optimal* metaparameters at a batch size are those of its best trial (the one attaining steps
  to result, ties to the lower trial id): ``learning_rate`` η, ``momentum`` γ and the effective
  learning rate η/(1−γ) (η itself when the optimizer has no momentum).
* The scaling heuristics (docs/methods.md, "Optimal metaparameters") are anchored at the smallest
  batch size ``B0`` with a value ``y0``: **linear** ``y0 * B / B0`` and **square root**
  ``y0 * sqrt(B / B0)``.
* :func:`trial_outcomes` labels every trial of a workload for the (η, 1−γ) scatter: ``reached`` or
  ``not_reached`` for the selected trials, ``raced`` for ``RACED`` ones that did not reach the goal
  in their recorded rows (stopped by racing: they could not beat the best; whether they would
  have reached the goal later is unknown), ``diverged`` for ``INFEASIBLE`` ones.
* :func:`search_edge_warnings` flags every best trial whose value of a searched parameter lies in the
  outer :data:`EDGE_FRACTION` (10%) of that parameter's searched range, measured in the parameter's own
  scale (docs/methods.md, "Search-edge warnings"): there the result may be limited by the search
  space rather than by the workload.

Search-edge rule, for a parameter with searched range ``[lo, hi]`` and the best trial's value ``v``:

* ``LOG`` scale: position ``p = log(v / lo) / log(hi / lo)``;
* ``REVERSE_LOG`` scale (momentum): ``p = log((1 - lo) / (1 - v)) / log((1 - lo) / (1 - hi))``,
  i.e. ``1 - v`` is the log-uniform quantity;
* ``LINEAR`` scale: ``p = (v - lo) / (hi - lo)``.

``v`` is at the ``low`` edge when ``p <= fraction`` and at the ``high`` edge when ``p >= 1 - fraction``.
``INTEGER`` parameters use the same positions over their integer range and are also at an edge when
``v`` equals ``lo`` or ``hi``. ``DISCRETE`` parameters with at least three distinct numeric feasible
points are at an edge when ``v`` is the smallest or the largest of them (with one or two points, or
non-numeric points, there is no interior to compare with, so no warning). A parameter whose range is
a single value (``lo == hi``) was not searched and is never flagged; a value outside the range counts
as the nearer edge (``outside: true``).
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pandas as pd

from batchlab.analysis.selection import Selection, check_selection, resolve_studies
from batchlab.analysis.steps_to_result import BatchSizeResult, effective_learning_rate, trial_first_steps
from batchlab.analysis.tables import view_columns
from batchlab.errors import BatchlabError

METAPARAMETERS = ("learning_rate", "momentum", "effective_learning_rate")
REACHED, NOT_REACHED, RACED, DIVERGED = "reached", "not_reached", "raced", "diverged"
EDGE_FRACTION = 0.1
"""The outer fraction of a searched range (in the parameter's own scale) that counts as its edge."""
LOW, HIGH = "low", "high"
# The searched parameters each plotted metaparameter depends on (effective lr = lr / (1 - momentum)).
_DEPENDS_ON = {
    "learning_rate": ("learning_rate",),
    "momentum": ("momentum",),
    "effective_learning_rate": ("learning_rate", "momentum"),
}


def linear_heuristic(batch_sizes, b0: float, y0: float) -> np.ndarray:
    """``y0 * B / B0``: the linear scaling rule anchored at ``(B0, y0)``."""
    return y0 * np.asarray(batch_sizes, dtype=float) / b0


def square_root_heuristic(batch_sizes, b0: float, y0: float) -> np.ndarray:
    """``y0 * sqrt(B / B0)``: the square-root scaling rule anchored at ``(B0, y0)``."""
    return y0 * np.sqrt(np.asarray(batch_sizes, dtype=float) / b0)


@dataclass(frozen=True)
class OptimalMetaparameters:
    """The best trial's metaparameters at each batch size where the goal was reached.

    Attributes:
        batch_sizes: reached batch sizes, increasing.
        values: ``{name: array}`` for each of :data:`METAPARAMETERS`; NaN where the best trial lacks it.
        search_edges: the :func:`search_edge_warnings` of these best trials (empty when not computed).
    """

    batch_sizes: np.ndarray
    values: dict[str, np.ndarray]
    search_edges: tuple[dict, ...] = field(default=())

    def heuristics(self, name: str) -> dict[str, np.ndarray]:
        """Linear and square-root heuristic lines for ``name`` at :attr:`batch_sizes`.

        Anchored at the smallest batch size where ``name`` has a value; empty dict if it has none.
        """
        y = self.values[name]
        finite = np.flatnonzero(np.isfinite(y))
        if finite.size == 0:
            return {}
        b0, y0 = float(self.batch_sizes[finite[0]]), float(y[finite[0]])
        return {
            "linear": linear_heuristic(self.batch_sizes, b0, y0),
            "square_root": square_root_heuristic(self.batch_sizes, b0, y0),
        }

    def has(self, name: str) -> bool:
        """Whether any best trial has a value for ``name``."""
        return bool(np.isfinite(self.values[name]).any())

    def edge_limited(self, name: str) -> np.ndarray:
        """Boolean array over :attr:`batch_sizes`: whether the best trial's ``name`` is search-edge limited.

        ``name`` is one of :data:`METAPARAMETERS`; the effective learning rate is edge limited when
        the learning rate or the momentum is.
        """
        if name not in _DEPENDS_ON:
            raise BatchlabError(f"unknown metaparameter {name!r}; allowed: {', '.join(METAPARAMETERS)}")
        limited = {int(w["batch_size"]) for w in self.search_edges if w["parameter"] in _DEPENDS_ON[name]}
        return np.array([int(b) in limited for b in self.batch_sizes], dtype=bool)

    def to_rows(self) -> list[dict]:
        """One JSON-ready dict per batch size; ``search_edge`` lists that batch size's search-edge
        warnings (``parameter``, ``edge``, ``value``, ``min_value``, ``max_value``, ``scale``)."""
        keys = ("parameter", "edge", "value", "min_value", "max_value", "scale")
        return [
            {"batch_size": int(b)}
            | {name: _none_if_nan(self.values[name][i]) for name in METAPARAMETERS}
            | {"search_edge": [{k: w[k] for k in keys} for w in self.search_edges if int(w["batch_size"]) == int(b)]}
            for i, b in enumerate(self.batch_sizes)
        ]


def optimal_metaparameters(
    results: Sequence[BatchSizeResult], search_edges: Sequence[dict] | None = None
) -> OptimalMetaparameters:
    """The best trials' metaparameters from :func:`~batchlab.analysis.steps_to_result.steps_to_result`.

    ``search_edges``: the :func:`search_edge_warnings` of ``results``, kept on the result for tables,
    JSON and plots (optional).
    """
    reached = sorted((r for r in results if r.reached), key=lambda r: r.batch_size)
    values = {
        "learning_rate": [r.learning_rate for r in reached],
        "momentum": [r.momentum for r in reached],
        "effective_learning_rate": [r.effective_learning_rate for r in reached],
    }
    return OptimalMetaparameters(
        batch_sizes=np.array([r.batch_size for r in reached], dtype=float),
        values={k: np.array([np.nan if x is None else x for x in v], dtype=float) for k, v in values.items()},
        search_edges=tuple(search_edges or ()),
    )


def trial_outcomes(con: duckdb.DuckDBPyConnection, selection: Selection) -> pd.DataFrame:
    """Every trial behind the (η, 1−γ) scatter, labelled ``reached``, ``not_reached``, ``raced`` or
    ``diverged``.

    The selected trials (the selection's status, study and max-trials rules) are ``reached`` or
    ``not_reached``, except ``RACED`` trials that did not reach the goal in their recorded rows:
    ``raced`` (stopped by racing, could not beat the best; never counted as not reached);
    ``INFEASIBLE`` trials (of the selected studies) are ``diverged``. When
    ``INFEASIBLE`` is not among the selected statuses and a first-N rule applies at a batch size
    (a numeric ``max_trials``, or ``"auto"`` where it resolves to the paper's N), only diverged trials
    with ids up to the last selected trial's id there are kept (those the search ran before stopping).

    Columns: ``batch_size``, ``trial_id``, ``status``, ``outcome``, ``best`` (the best trial of its
    batch size), ``first_step`` (NaN if not reached or unknown), ``learning_rate``, ``momentum``,
    ``effective_learning_rate`` (NaN where a parameter is absent). Sorted by batch size and trial id.
    """
    check_selection(con, selection)
    chosen = trial_first_steps(con, selection)
    if "INFEASIBLE" not in selection.statuses:
        has_study = "study_id" in view_columns(con, "trials")
        diverged = con.execute(
            f"SELECT batch_size, trial_id, parameters, status{', study_id' if has_study else ''} FROM trials "
            "WHERE workload = ? AND status = 'INFEASIBLE'",
            [selection.workload],
        ).df()
        studies = resolve_studies(con, selection)
        if has_study and studies is not None:  # only the diverged trials of the selected studies
            diverged = diverged[diverged["study_id"].isin(studies)]
        limited = _first_n_batch_sizes(con, selection)
        if limited:
            last = chosen.groupby("batch_size")["trial_id"].max()
            limit = diverged["batch_size"].map(last)
            keep = limit.notna() & (diverged["trial_id"] <= limit)
            if limited is not True:
                keep |= ~diverged["batch_size"].isin(limited)
            diverged = diverged[keep]
        diverged = diverged.assign(first_step=np.nan, value=np.nan)
        frame = pd.concat([chosen, diverged.reindex(columns=chosen.columns)], ignore_index=True)
    else:
        frame = chosen
    frame = frame.sort_values(["batch_size", "trial_id"], ignore_index=True)
    known = np.isfinite(frame["first_step"].to_numpy(dtype=float))
    frame["first_step"] = frame["first_step"].where(known)  # NaN: not reached, or unknown (raced)
    frame["outcome"] = np.select(
        [frame["status"] == "INFEASIBLE", known, frame["status"] == "RACED"], [DIVERGED, REACHED, RACED], NOT_REACHED
    )
    frame["best"] = False
    reached = frame[known].sort_values(["batch_size", "first_step", "trial_id"])
    frame.loc[reached.groupby("batch_size").head(1).index, "best"] = True
    parameters = [json.loads(p) if isinstance(p, str) and p else {} for p in frame["parameters"]]
    frame["learning_rate"] = [_as_float(p.get("learning_rate")) for p in parameters]
    frame["momentum"] = [_as_float(p.get("momentum")) for p in parameters]
    frame["effective_learning_rate"] = [
        _as_float(effective_learning_rate(_float_or_none(p.get("learning_rate")), _float_or_none(p.get("momentum"))))
        for p in parameters
    ]
    return frame[
        ["batch_size", "trial_id", "status", "outcome", "best", "first_step", "learning_rate", "momentum", "effective_learning_rate"]
    ]


def edge_position(parameter, value) -> float | None:
    """Where ``value`` lies in ``parameter``'s searched range, in its own scale: 0 at ``min_value``, 1 at
    ``max_value`` (outside [0, 1] when ``value`` is outside the range).

    ``parameter`` is a :class:`batchlab.search.Parameter` of type ``DOUBLE`` or ``INTEGER``. ``None``
    when the range is a single value (nothing was searched) or ``value`` is not a finite number.
    """
    value = _float_or_none(value)
    if value is None or not math.isfinite(value) or parameter.type == "DISCRETE":
        return None
    lo, hi = float(parameter.min_value), float(parameter.max_value)
    if hi <= lo:
        return None
    if parameter.scale == "LOG":
        if value <= 0:
            return -math.inf
        return math.log(value / lo) / math.log(hi / lo)
    if parameter.scale == "REVERSE_LOG":
        if value >= 1:
            return math.inf
        return math.log((1.0 - lo) / (1.0 - value)) / math.log((1.0 - lo) / (1.0 - hi))
    return (value - lo) / (hi - lo)


def parameter_edge(parameter, value, fraction: float = EDGE_FRACTION) -> dict | None:
    """The search-edge finding for one parameter value, or ``None`` when ``value`` is inside the range.

    Returns ``{"edge": "low" | "high", "position": p or None, "outside": bool, "min_value", "max_value",
    "scale"}`` following the rule in the module docstring. ``parameter`` is a
    :class:`batchlab.search.Parameter`.
    """
    _check_fraction(fraction)
    if parameter.type == "DISCRETE":
        return _discrete_edge(parameter, value)
    position = edge_position(parameter, value)
    if position is None:
        return None
    number = float(value)
    lo, hi = float(parameter.min_value), float(parameter.max_value)
    edge = None
    if position <= fraction or (parameter.type == "INTEGER" and number <= lo):
        edge = LOW
    elif position >= 1.0 - fraction or (parameter.type == "INTEGER" and number >= hi):
        edge = HIGH
    if edge is None:
        return None
    cast = int if parameter.type == "INTEGER" else float
    return {
        "edge": edge,
        "position": position if math.isfinite(position) else None,
        "outside": bool(number < lo or number > hi),
        "min_value": cast(parameter.min_value),
        "max_value": cast(parameter.max_value),
        "scale": parameter.scale,
    }


def search_space_edges(parameters: Mapping, space, fraction: float = EDGE_FRACTION) -> list[dict]:
    """Search-edge findings for one trial: ``parameters`` (its ``{name: value}``) against ``space``.

    ``space`` is a :class:`batchlab.search.SearchSpace` or its batch_science ``parameter_configs``
    form. One dict per flagged parameter (in the space's order): ``parameter``, ``value`` and the
    fields of :func:`parameter_edge`. Parameters the trial lacks are skipped.
    """
    from batchlab.search import SearchSpace

    if not isinstance(space, SearchSpace):
        space = SearchSpace.from_batch_science(space)
    found = []
    for parameter in space.parameters:
        if parameter.name not in parameters:
            continue
        value = parameters[parameter.name]
        finding = parameter_edge(parameter, value, fraction)
        if finding is not None:
            found.append({"parameter": parameter.name, "value": value} | finding)
    return found


def search_edge_warnings(
    con: duckdb.DuckDBPyConnection, results: Sequence[BatchSizeResult], fraction: float = EDGE_FRACTION
) -> list[dict]:
    """Search-edge warnings for the best trial of every reached batch size in ``results``.

    ``results`` come from :func:`~batchlab.analysis.steps_to_result.steps_to_result` (one workload or
    several). The searched ranges are read from the store's ``studies`` view (``search_space``, the
    batch_science ``parameter_configs``) of the best trial's own study: the ``study_id`` of the best
    trial in the ``trials`` view when the store records one, else the result's ``study_ids``, else
    every study at that workload and batch size. A study without a readable search space gives no
    warnings (another study's range is never used in its place).

    Returns one JSON-ready dict per (batch size, parameter) at an edge, sorted by workload, batch size
    and the space's parameter order: ``workload``, ``batch_size``, ``trial_id``, ``study_id`` (None when
    the store has no study ids), ``parameter``, ``value``, ``edge`` (``"low"`` or ``"high"``),
    ``position`` (0..1 in the parameter's scale; None for DISCRETE), ``outside``, ``min_value``,
    ``max_value``, ``scale`` (``LOG``, ``REVERSE_LOG``, ``LINEAR`` or ``DISCRETE``), ``fraction`` and a
    one-line ``message``. Rule: module docstring and docs/methods.md, "Search-edge warnings".
    """
    _check_fraction(fraction)
    reached = sorted((r for r in results if r.reached and r.parameters), key=lambda r: (r.workload, r.batch_size))
    if not reached:
        return []
    studies = _search_spaces(con, sorted({r.workload for r in reached}))
    trial_studies = _trial_study_ids(con, sorted({r.workload for r in reached}))
    warnings: list[dict] = []
    for r in reached:
        seen = set()
        for sid, space in _spaces_of(r, studies, trial_studies):
            for finding in search_space_edges(r.parameters, space, fraction):
                key = (finding["parameter"], finding["edge"], finding["min_value"], finding["max_value"])
                if key in seen:
                    continue
                seen.add(key)
                warning = {
                    "workload": r.workload,
                    "batch_size": int(r.batch_size),
                    "trial_id": r.trial_id,
                    "study_id": sid,
                    **finding,
                    "fraction": fraction,
                }
                warning["message"] = format_search_edge_warning(warning)
                warnings.append(warning)
    return warnings


def searched_ranges(con: duckdb.DuckDBPyConnection, results: Sequence[BatchSizeResult]) -> dict[int, dict]:
    """The searched ``[min_value, max_value]`` of each ``DOUBLE``/``INTEGER`` parameter per batch size.

    ``{batch_size: {parameter: (min_value, max_value, scale)}}`` for the results of one workload, over
    the studies of ``results`` (the
    best trial's study where the store records it, else the result's ``study_ids``, else every study
    at that batch size). A parameter whose range differs between those studies is left out (there is
    no one range to draw); batch sizes without a readable search space are left out. For plots.
    """
    if not results:
        return {}
    workloads = sorted({r.workload for r in results})
    studies = _search_spaces(con, workloads)
    trial_studies = _trial_study_ids(con, workloads)
    out: dict[int, dict] = {}
    for r in results:
        ranges: dict[str, set] = {}
        for _, space in _spaces_of(r, studies, trial_studies):
            for p in space.parameters:
                if p.type != "DISCRETE":
                    ranges.setdefault(p.name, set()).add((float(p.min_value), float(p.max_value), p.scale))
        found = {name: next(iter(v)) for name, v in ranges.items() if len(v) == 1}
        if found:
            out[int(r.batch_size)] = found
    return out


def best_trial_spaces(con: duckdb.DuckDBPyConnection, results: Sequence[BatchSizeResult]) -> dict[int, object]:
    """The search space each batch size's best trial was drawn from: ``{batch_size: SearchSpace}``.

    For the results of one workload, over the same studies :func:`search_edge_warnings` reads (the best
    trial's study where the store records it, else the result's ``study_ids``, else every study at
    that batch size). A batch size is left out when no readable space applies, or when the studies
    that apply have different spaces (there is no one space to check against). Unreached batch sizes
    are answered too (from their studies), so a caller can tell "no space" from "not reached".

    A search round's (``--refine-search``) own space is the box around the incumbent; what was searched
    at that batch size is the study it refines and the box together, so for a search round the space
    is the union of the two (:func:`_searched_with_base`): each parameter from the smaller of the two
    lower bounds to the larger of the two upper bounds (the union of the feasible points of a discrete
    one). The base study's space is the round's recorded ``refine.space``, else the base study's own
    ``search_space``.
    """
    if not results:
        return {}
    workloads = sorted({r.workload for r in results})
    studies = _search_spaces(con, workloads)
    trial_studies = _trial_study_ids(con, workloads)
    bases = _search_round_bases(con, workloads, studies)
    out: dict[int, object] = {}
    for r in results:
        spaces = [_searched_with_base(space, bases.get(sid)) for sid, space in _spaces_of(r, studies, trial_studies)]
        if spaces and all(space == spaces[0] for space in spaces[1:]):
            out[int(r.batch_size)] = spaces[0]
    return out


def format_search_edge_warning(warning: dict) -> str:
    """The one-line text of a :func:`search_edge_warnings` entry."""
    fraction = warning.get("fraction", EDGE_FRACTION)
    where = "outside" if warning.get("outside") else f"in the {warning['edge']} {fraction:.0%}"
    scale = warning["scale"].lower().replace("_", "-")
    if warning["scale"] == "DISCRETE":
        where = "outside" if warning.get("outside") else f"at the {warning['edge']} end"
        scale = "discrete"
    return (
        f"batch size {warning['batch_size']}: best trial {warning['trial_id']} has {warning['parameter']} = "
        f"{_short(warning['value'])}, {where} of its searched range [{_short(warning['min_value'])}, "
        f"{_short(warning['max_value'])}] ({scale} scale); the result may be limited by the search space"
    )


def _spaces_of(result: BatchSizeResult, studies: dict, trial_studies: dict) -> list[tuple[str | None, object]]:
    """The ``(study_id, SearchSpace)`` pairs that apply to ``result``: the best trial's own study when
    the store records it, else the result's ``study_ids``, else every study at that batch size."""
    here = studies.get((result.workload, int(result.batch_size)), [])
    key = (result.workload, int(result.batch_size), None if result.trial_id is None else int(result.trial_id))
    if key in trial_studies:
        wanted = {trial_studies[key]}
    elif result.study_ids:
        wanted = set(result.study_ids)
    else:
        return here
    return [(sid, space) for sid, space in here if sid in wanted]


def _discrete_edge(parameter, value) -> dict | None:
    points = sorted({float(p) for p in parameter.feasible_points if _is_number(p)})
    if len(points) < 3 or len(points) != len(parameter.feasible_points) or not _is_number(value):
        return None
    number = float(value)
    if number <= points[0]:
        edge = LOW
    elif number >= points[-1]:
        edge = HIGH
    else:
        return None
    return {
        "edge": edge,
        "position": None,
        "outside": bool(number < points[0] or number > points[-1]),
        "min_value": _original(parameter.feasible_points, points[0]),
        "max_value": _original(parameter.feasible_points, points[-1]),
        "scale": "DISCRETE",
    }


def _search_spaces(con, workloads: Sequence[str]) -> dict[tuple[str, int], list[tuple[str | None, object]]]:
    """``{(workload, batch_size): [(study_id or None, SearchSpace), ...]}`` from the studies view."""
    from batchlab.search import SearchSpace

    columns = view_columns(con, "studies")
    study_column = "study_id" if "study_id" in columns else "NULL"
    rows = con.execute(
        f"SELECT workload, batch_size, {study_column} AS study_id, search_space FROM studies "
        "WHERE list_contains(?, workload) ORDER BY workload, batch_size, study_id",
        [list(workloads)],
    ).fetchall()
    out: dict[tuple[str, int], list] = {}
    for workload, batch_size, sid, text in rows:
        try:
            configs = json.loads(text) if isinstance(text, str) and text else None
            if not configs:
                continue
            space = SearchSpace.from_batch_science(configs)
        except (ValueError, BatchlabError):
            continue  # an unreadable search space: nothing to compare against
        out.setdefault((workload, int(batch_size)), []).append((sid, space))
    return out


def _search_round_bases(con, workloads: Sequence[str], studies: dict) -> dict[str, object]:
    """``{study_id: SearchSpace}``: for each search round (``--refine-search``) in the studies view, the
    space of the study it refines (its ``refine.space``, else that study's ``search_space`` in
    ``studies``, :func:`_search_spaces`); a round with neither readable is left out."""
    from batchlab.analysis.selection import is_search_round, refined_study_id
    from batchlab.search import SearchSpace

    if not {"study_id", "definition"} <= set(view_columns(con, "studies")):
        return {}
    rows = con.execute("SELECT DISTINCT study_id, definition FROM studies WHERE list_contains(?, workload) "
                       "AND definition IS NOT NULL", [list(workloads)]).fetchall()
    own = {sid: space for pairs in studies.values() for sid, space in pairs if sid is not None}
    out: dict[str, object] = {}
    for sid, text in rows:
        try:
            definition = json.loads(text)
            if not isinstance(definition, dict) or not is_search_round(definition):
                continue
            refine = definition.get("refine") if isinstance(definition.get("refine"), dict) else {}
            base = (SearchSpace.from_batch_science(refine["space"]) if refine.get("space")
                    else own.get(refined_study_id(definition)))
        except (TypeError, ValueError, BatchlabError):
            continue
        if base is not None:
            out[str(sid)] = base
    return out


def _searched_with_base(space, base):
    """``space`` (a search round's box) joined with ``base`` (the space of the study it refines), per
    parameter of ``base``: bounds the smaller lower and the larger upper one, feasible points the union;
    ``space`` itself when ``base`` is None."""
    from batchlab.search import SearchSpace

    if base is None:
        return space
    box = space.to_batch_science()
    joined = {}
    for name, config in base.to_batch_science().items():
        config, other = dict(config), box.get(name) or {}
        if "min_value" in config and "min_value" in other:
            config["min_value"] = min(config["min_value"], other["min_value"])
            config["max_value"] = max(config["max_value"], other["max_value"])
        elif "feasible_points" in config and "feasible_points" in other:
            points = list(config["feasible_points"])
            config["feasible_points"] = points + [p for p in other["feasible_points"] if p not in points]
        joined[name] = config
    return SearchSpace.from_batch_science(joined)


def _trial_study_ids(con, workloads: Sequence[str]) -> dict[tuple[str, int, int], str]:
    if "study_id" not in view_columns(con, "trials"):
        return {}
    rows = con.execute(
        "SELECT workload, batch_size, trial_id, study_id FROM trials "
        "WHERE list_contains(?, workload) AND study_id IS NOT NULL",
        [list(workloads)],
    ).fetchall()
    return {(w, int(b), int(t)): sid for w, b, t, sid in rows}


def _first_n_batch_sizes(con, selection: Selection):
    """Where the first-N rule cut the selected trials: ``True`` (every batch size, a numeric
    ``max_trials``), the set of batch sizes where ``"auto"`` applied the paper's N, or an empty set."""
    if isinstance(selection.max_trials, int) and not isinstance(selection.max_trials, bool):
        return True
    if selection.max_trials != "auto":
        return set()
    from batchlab.analysis.steps_to_result import steps_to_result_many

    results = steps_to_result_many(con, [selection])[0]
    return {r.batch_size for r in results if r.max_trials is not None}


def _check_fraction(fraction: float) -> None:
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0 < fraction < 0.5:
        raise BatchlabError(f"search-edge fraction must be a number in (0, 0.5), got {fraction!r}")


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _original(points, number: float):
    """The feasible point (as written in the search space) equal to ``number``."""
    return next(p for p in points if float(p) == number)


def _short(value) -> str:
    return f"{value:.4g}" if _is_number(value) else repr(value)


def _float_or_none(value) -> float | None:
    try:
        return None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None


def _as_float(value) -> float:
    value = _float_or_none(value)
    return np.nan if value is None else value


def _none_if_nan(value: float) -> float | None:
    return None if not np.isfinite(value) else float(value)
