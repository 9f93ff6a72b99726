"""The numbers and figures of a report, per unit (docs/methods.md, "The report").

:func:`analyse_unit` computes everything one unit's section shows (steps to result with the fit,
intervals and data-read regimes; the named critical batch sizes; the tuning flags and B_crit with and
without the flagged batch sizes; the optimal metaparameters and the
scaling-rule verdict; the learning-rate/momentum scatter; the best measurement under a few step
budgets), each figure rendered to PNG bytes in memory, each number also as a CSV row
(:class:`Row`). :func:`nqm_section` draws the NQM prediction beside the measured curves;
:mod:`batchlab.report.comparisons` compares the optimizers of one base workload and study group and
:mod:`batchlab.report.steps_tables` fits external steps tables. Nothing here writes a file.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field

import numpy as np

from batchlab.finite import finite_or_none
from batchlab.analysis.curve import bracket_text
from batchlab.errors import BatchlabError
from batchlab.report.units import Unit, restricted, unit_examples, unit_goal
from batchlab.report.verdict import resolution, scaling_verdict

TOLERANCE = 0.1
#: At most this many step budgets in the best-measurement figure.
MAX_BUDGETS = 4


@dataclass(frozen=True)
class Row:
    """One CSV row (long format): ``unit, section, batch_size, quantity, value, lower, upper, note``."""

    unit: str
    section: str
    batch_size: float | None
    quantity: str
    value: object
    lower: float | None = None
    upper: float | None = None
    note: str = ""


@dataclass
class FigureOut:
    """A rendered figure: ``id`` (the ``data-figure`` attribute), caption, alt text and PNG bytes."""

    id: str
    caption: str
    alt: str
    png: bytes


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list]
    note: str = ""


@dataclass
class UnitResult:
    """Everything one unit's section shows (see :func:`analyse_unit`)."""

    unit: Unit
    goal: dict | None = None
    status: str = "analysed"  # analysed | unreached | skipped
    reason: str = ""
    counts: dict = field(default_factory=dict)
    results: list = field(default_factory=list)
    curve: object = None
    fit: object = None
    estimate: dict | None = None
    figures: list[FigureOut] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    verdict: object = None
    b_crit: dict | None = None  # {"value", "low", "high", "extrapolated", "n_points", "ps_end", ...}
    selection: object = None
    goal_text: str = ""
    published: str = ""  # when the unit's trials were published (store commit times)
    nqm_b_crit: float | None = None
    sweep_trials: int = 0  # trials of the analysed studies, any status (units.unit_examples)
    sweep_examples: int = 0  # sum of steps x batch size over them: the sweep's compute
    tuning_flags: list = field(default_factory=list)  # batchlab.analysis.tuning_flags.TuningFlag
    flag_effect: object = None  # batchlab.analysis.tuning_flags.FlaggedFitEffect (None: no flag or no fit)

    @property
    def key(self) -> str:
        return self.unit.name


def render(fig) -> bytes:
    """``fig`` as PNG bytes (dpi 100), rendered in memory."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return buffer.getvalue()


def num(value, digits: int = 3) -> str:
    """A number for text: ``digits`` significant digits, ``inf`` as such, None as ``-``."""
    if value is None:
        return "-"
    value = float(value)
    if math.isnan(value):
        return "-"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value != 0 and abs(value) >= 10 ** digits:
        return f"{round(value):,}".replace(",", "")
    return f"{float(f'{value:.{digits}g}'):g}"


def slug(text: str) -> str:
    """``text`` as a figure id: runs of other characters than letters and digits become ``-``, lower case."""
    import re

    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def analyse_unit(con, unit: Unit, n_boot: int, level: float, seed: int) -> UnitResult:
    """Compute one unit's section on ``con`` (views restricted to the unit while it runs)."""
    out = UnitResult(unit)
    with restricted(con, unit):
        out.counts = _status_counts(con, unit.workload)
        out.sweep_trials, out.sweep_examples = unit_examples(con, unit)
        goal, why = unit_goal(unit, con)
        if goal is None:
            out.status, out.reason = "skipped", f"not analysed: {why}"
            return out
        out.goal = goal
        try:
            _analyse(con, out, n_boot, level, seed)
        except BatchlabError as exc:
            if out.status == "analysed" and out.curve is None:
                out.status, out.reason = "skipped", f"not analysed: {exc}"
            else:
                out.warnings.append(f"part of the analysis failed: {exc}")
    return out


def _status_counts(con, workload: str) -> dict[int, dict[str, int]]:
    counts: dict[int, dict[str, int]] = {}
    for b, status, n in con.execute("SELECT batch_size, status, count(*) FROM trials WHERE workload = ? "
                                    "GROUP BY ALL ORDER BY ALL", [workload]).fetchall():
        counts.setdefault(int(b), {})[str(status)] = int(n)
    return counts


def caption_of(out: UnitResult) -> str:
    """Which trials a unit's figures rest on, in one line."""
    sel = out.selection
    rule = "every selected trial per batch size" if not out.results or out.results[0].max_trials is None else \
        f"first {out.results[0].max_trials} trials per batch size by trial id"
    ids = out.unit.study_ids
    studies = "all trials (no study ids)" if ids is None else (
        f"{len(ids)} studies, one per batch size" if len(ids) > 3 else "studies " + ", ".join(ids))
    return f"trials: {rule}; statuses {', '.join(sel.statuses)}; {studies} ({out.unit.group})"


def _analyse(con, out: UnitResult, n_boot: int, level: float, seed: int) -> None:
    from batchlab.analysis.selection import Selection
    from batchlab.analysis.steps_to_result import steps_curve, steps_to_result_many

    unit, goal = out.unit, out.goal
    selection = Selection(unit.workload, goal["metric"], goal["goal"], maximize=goal["maximize"], max_trials="auto")
    try:
        results = steps_to_result_many(con, [selection])[0]
    except BatchlabError as exc:
        if "the paper's first" not in str(exc):
            raise
        selection = Selection(unit.workload, goal["metric"], goal["goal"], maximize=goal["maximize"], max_trials=None)
        results = steps_to_result_many(con, [selection])[0]
        out.notes.append(f"every trial is used (the paper's first-N rule does not apply: {exc})")
    out.selection, out.results = selection, results
    name = out.key
    comparison = ">" if goal["maximize"] else "<"
    out.goal_text = f"{goal['metric']} {comparison} {goal['goal']:g}"
    for r in results:
        out.rows.extend(_result_rows(name, r))
    if not any(r.reached for r in results):
        out.status = "unreached"
        out.reason = (f"no goal reached: {out.goal_text} was met at none of {len(results)} batch size(s) "
                      f"({goal['source']})")
        out.tables.append(_steps_table(out, None))
        return
    curve = steps_curve(results, label=unit.optimizer)
    out.curve = curve
    _tuning_flags(con, out, selection)
    _fit_and_figure(con, out, selection, n_boot, level, seed)
    for part, what in ((_metaparameters, "optimal metaparameters"), (_best_measurement, "best measurement")):
        try:
            part(con, out, selection)
        except BatchlabError as exc:  # one part failing leaves the others (and the page) standing
            out.warnings.append(f"no {what}: {exc}")


def _result_rows(name: str, r) -> list[Row]:
    rows = [Row(name, "steps_to_result", r.batch_size, "n_trials", r.n_trials),
            Row(name, "steps_to_result", r.batch_size, "n_reached", r.n_reached),
            Row(name, "steps_to_result", r.batch_size, "n_raced", r.n_raced)]
    if r.reached:
        rows.append(Row(name, "steps_to_result", r.batch_size, "steps", r.steps, r.steps_lower, r.steps,
                        "resolution bracket (lower, steps]"))
        rows.append(Row(name, "steps_to_result", r.batch_size, "best_trial", r.trial_id))
    else:
        rows.append(Row(name, "steps_to_result", r.batch_size, "censored_at", r.censored_at, r.censored_at, None,
                        "not reached: steps > censored_at" if r.censored_at is not None else "not reached, no bound"))
    return rows


def _fit_and_figure(con, out: UnitResult, selection, n_boot: int, level: float, seed: int) -> None:
    from batchlab.analysis.bootstrap import critical_batch_size_with_intervals
    from batchlab.analysis.definitions import REGISTRY
    from batchlab.plots.shallue import steps_to_result_figure

    name, curve = out.key, out.curve
    estimate = None
    try:
        estimate = critical_batch_size_with_intervals(con, selection, n_boot=n_boot, level=level, seed=seed,
                                                      tolerance=TOLERANCE)
    except BatchlabError as exc:
        out.warnings.append(f"no S(B) fit: {exc}")
    intervals = None
    if estimate is not None:
        out.fit = estimate.fit
        summary = estimate.to_dict()
        out.estimate = summary
        out.warnings.extend(summary["warnings"])
        by_b = {row["batch_size"]: row for row in summary["regimes"]}
        intervals = [[tuple(by_b[b]["steps_interval"]) if b in by_b else (None, None) for b in curve.batch_sizes]]
        named = summary["critical_batch_sizes"]
        rows = []
        for d in REGISTRY:
            entry = named[d.name]
            reason = entry.get("reason") or ""
            note = beyond_measured(entry, summary["fit"]) if d.source == "fit" else ""
            note = note or reason
            if d.source == "data" and entry.get("value") is None and entry.get("lower_bound") is not None:
                note = f"{reason} (> {num(entry['lower_bound'])})"
            rows.append([d.name, d.source, num(entry["value"]),
                         "" if d.source == "data" else f"[{num(entry['low'])}, {num(entry['high'])}]",
                         note, d.definition])
            out.rows.append(Row(name, "critical_batch_size", None, d.name, finite_or_none(entry["value"]),
                                finite_or_none(entry["low"]), finite_or_none(entry["high"]),
                                (f"{level:.0%} profile-likelihood interval; " if d.source == "fit" else "read from data; ")
                                + note))
        for pname, entry in summary["fit_intervals"].items():
            rows.append([pname, "fit", num(entry["value"]), f"[{num(entry['low'])}, {num(entry['high'])}]", "",
                         "fitted S_min (steps) / E_min (examples) of S(B) = S_min + E_min / B"])
            out.rows.append(Row(name, "fit", None, pname, finite_or_none(entry["value"]), finite_or_none(entry["low"]),
                                finite_or_none(entry["high"]), f"{level:.0%} profile-likelihood interval"))
        measured = summary["s_min"]["measured"] or {}
        if isinstance(measured, dict) and measured.get("value") is not None:
            rows.append(["s_min measured", "data", num(measured.get("value")), "", "" if measured.get("plateau_seen")
                         else "an upper bound on the plateau (no plateau seen)", "smallest measured steps to result"])
        out.tables.append(Table(f"Critical batch sizes ({level:.0%} intervals; B0 = {num(summary['b0'])}, "
                                f"fit of {summary['points_used']} batch sizes, measured range "
                                f"{num(summary['batch_size_range'][0])} to {num(summary['batch_size_range'][1])})",
                                ["name", "source", "value", "interval", "note", "definition"], rows))
        b_crit = named["mccandlish_b_crit"]
        ps = named["perfect_scaling_end"]
        out.b_crit = {"value": b_crit["value"] if b_crit["value"] is not None else (math.inf if estimate.fit.b_crit > 0 else 0.0),
                      "low": b_crit["low"], "high": b_crit["high"], "extrapolated": bool(summary["extrapolated"]),
                      "n_points": summary["points_used"], "ps_end": ps.get("value"),
                      # beyond the range: every measured B still scales; undetermined: an unreached B decides nothing
                      "ps_beyond": ps.get("lower_bound") if ps.get("kind") == "beyond_range" else None,
                      "ps_at_least": ps.get("lower_bound") if ps.get("kind") == "undetermined" else None, "level": level,
                      "poor_fit": any(str(w).startswith("poor fit") for w in summary["warnings"]),
                      "misfit": summary["fit"]["misfit"]}
    out.tables.append(_steps_table(out, estimate))
    _flag_tables(con, out, selection, estimate, n_boot, level, seed)
    flagged = sorted({f.batch_size for f in out.tuning_flags})
    figure = steps_to_result_figure(
        [curve], fits=[out.fit], title=f"{out.unit.workload}: {out.goal_text}", intervals=intervals,
        tolerance=TOLERANCE, interval_label=f"one-sided {level:.0%} upper bound on the median best-of-K steps",
        caption=caption_of(out), flagged=[flagged],
    )
    out.figures.append(FigureOut(
        _fig_id(out, "steps"),
        "Steps to result against batch size (log2 axes): resolution brackets as error bars, one-sided "
        f"{level:.0%} upper bounds on the median best-of-K steps beside them, perfect scaling from B0 (dotted), "
        "the fitted S(B) = S_min + E_min/B (dashed, a fit), unreached batch sizes at their censoring bound "
        "(arrow up), the regimes read from the data shaded"
        + (f", batch sizes with a tuning flag ringed in red (B = {', '.join(map(str, flagged))})." if flagged else "."),
        f"steps to result vs batch size, {out.unit.name}", render(figure)))


def _tuning_flags(con, out: UnitResult, selection) -> None:
    """The unit's tuning flags (docs/methods.md, "Tuning flags"); a failure is a warning."""
    from batchlab.analysis.tuning_flags import tuning_flags, tuning_from_store

    try:
        out.tuning_flags = tuning_flags(tuning_from_store(con, selection, results=out.results), TOLERANCE)
    except BatchlabError as exc:
        out.warnings.append(f"no tuning flags: {exc}")


def _flag_value(flag):
    """The number that decides a flag, for the CSV's value column (docs/methods.md, "The report")."""
    detail = flag.detail
    if flag.kind == "better_than_perfect_scaling":
        return detail["examples_ratio"]
    if flag.kind == "shared_grid_point":
        return detail["values"][flag.parameters[0]]
    if flag.kind == "one_reaching_trial":
        return detail["n_reached"]
    return detail["edges"][0]["value"]


def _flag_tables(con, out: UnitResult, selection, estimate, n_boot: int, level: float, seed: int) -> None:
    """The "Tuning flags" table and CSV rows, and B_crit with and without the flagged batch sizes."""
    from batchlab.analysis.tuning_flags import (
        POINT_KINDS,
        flagged_fit_effect,
        store_fit_fn,
    )

    name = out.key
    if not out.tuning_flags:
        out.notes.append("tuning flags: none (no batch size is better than perfect scaling, shares its best "
                         "point, rests on one trial or has its best trial at a search edge)")
        return
    rows = []
    for f in out.tuning_flags:
        rows.append([f.kind, f.batch_size, f.message])
        out.rows.append(Row(name, "tuning_flags", f.batch_size, f.kind, _flag_value(f), None, None, f.message))
    out.tables.append(Table("Tuning flags: batch sizes the search may not have tuned", ["kind", "batch size", "message"],
                            rows))
    if estimate is None:
        return
    try:
        fit_fn = store_fit_fn(con, selection, n_boot=n_boot, level=level, seed=seed, tolerance=TOLERANCE)
        effect = flagged_fit_effect(out.curve, out.tuning_flags, fit_fn, full=estimate)
        point_sizes = {f.batch_size for f in out.tuning_flags if f.kind in POINT_KINDS}
        points = None  # the point kinds only: shown when they leave out some, but not all, flagged sizes
        if point_sizes and point_sizes != {f.batch_size for f in out.tuning_flags}:
            points = flagged_fit_effect(out.curve, out.tuning_flags, fit_fn, full=estimate, leave_out=POINT_KINDS)
    except BatchlabError as exc:
        out.warnings.append(f"no fit without the flagged batch sizes: {exc}")
        return
    out.flag_effect = effect
    sides = [("b_crit_all_points", "every batch size", effect.all_points, None)]
    if points is not None:
        sides.append(("b_crit_without_point_flags", "batch sizes flagged " + " or ".join(POINT_KINDS) + " left out",
                      points.without_flagged, points))
    sides.append(("b_crit_without_flagged", "every flagged batch size left out", effect.without_flagged, effect))
    table = []
    for quantity, label, side, source in sides:
        left = "" if source is None else "left out: B = " + ", ".join(
            f"{b} ({', '.join(k)})" for b, k in source.kinds.items())
        note = "; ".join(x for x in (left, side["error"]) if x)
        interval = "" if side["b_crit"] is None else f"[{_side(side['low'], '0')}, {_side(side['high'], 'inf')}]"
        table.append([label, ", ".join(map(str, side["batch_sizes"])), num(side["b_crit"]), interval,
                      side["n_points"], note])
        out.rows.append(Row(name, "tuning_flags", None, quantity, finite_or_none(side["b_crit"]), finite_or_none(side["low"]),
                            finite_or_none(side["high"]), f"{level:.0%} interval of mccandlish_b_crit; " + (note or
                            "batch sizes " + ", ".join(map(str, side["batch_sizes"])))))
    out.tables.append(Table(f"B_crit (mccandlish_b_crit, {level:.0%} intervals) with and without the flagged batch "
                            "sizes", ["fit", "batch sizes", "B_crit", "interval", "reached fitted", "note"], table))
    if out.b_crit is not None:
        keys = ("b_crit", "b_crit_unbounded", "low", "high", "n_points", "error")
        out.b_crit["flagged_batch_sizes"] = list(effect.left_out)
        out.b_crit["without_flagged"] = {k: effect.to_dict()["without_flagged"][k] for k in keys}
        if points is not None:
            out.b_crit["point_flagged_batch_sizes"] = list(points.left_out)
            out.b_crit["without_point_flags"] = {k: points.to_dict()["without_flagged"][k] for k in keys}


def _fig_id(out: UnitResult, kind: str) -> str:
    return slug(f"{out.unit.name}-{kind}")


def _steps_table(out: UnitResult, estimate) -> Table:
    by_b = {row["batch_size"]: row for row in (out.estimate or {}).get("regimes", [])} if estimate is not None else {}
    rows = []
    for r in out.results:
        row = by_b.get(r.batch_size, {})
        upper = (row.get("steps_interval") or [None, None])[1]
        study = out.unit.batch_study.get(r.batch_size, ", ".join(r.study_ids))
        budget = (out.unit.definitions.get(study) or {}).get("train_steps")
        counts = out.counts.get(r.batch_size, {})
        rows.append([
            r.batch_size,
            bracket_text(r.steps if r.reached else None, r.steps_lower, r.censored_at),
            "" if upper is None else f"<= {upper}",
            f"{r.n_reached}/{r.n_trials}" + (f" ({r.n_raced} raced)" if r.n_raced else ""),
            ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
            row.get("regime") or "",
            _shares(row),
            "" if r.trial_id is None else r.trial_id,
            num(r.learning_rate, 3) if r.learning_rate is not None else "",
            num(r.momentum, 4) if r.momentum is not None else "",
            num(r.effective_learning_rate, 3) if r.effective_learning_rate is not None else "",
            "" if budget is None else budget,
            study,
        ])
        if upper is not None:
            out.rows.append(Row(out.key, "steps_to_result", r.batch_size, "steps_upper_bound", upper, None, upper,
                                "one-sided upper bound on the median best-of-K steps"))
        if row.get("regime"):
            out.rows.append(Row(out.key, "steps_to_result", r.batch_size, "regime", row["regime"]))
    return Table("Steps to result per batch size",
                 ["batch size", "steps (bracket]", "upper bound", "reached/trials", "statuses", "regime (data)",
                  "regime shares (resampled)", "best trial", "learning rate", "momentum", "effective lr", "budget (steps)", "study"], rows)


_SHORT_REGIMES = {"perfect_scaling": "ps", "diminishing_returns": "dr", "maximal_data_parallelism": "mp"}


def _shares(row: dict) -> str:
    """The regime shares of one batch size's resampled curves, e.g. ``ps 0.85, dr 0.15`` (``?`` the
    undetermined share, racing); empty when there are none."""
    fractions = row.get("regime_fractions") or {}
    parts = [f"{_SHORT_REGIMES.get(k, k)} {v:.2f}" for k, v in fractions.items() if v]
    if row.get("regime_fractions_undetermined"):
        parts.append(f"? {row['regime_fractions_undetermined']:.2f}")
    return ", ".join(parts)


def _metaparameters(con, out: UnitResult, selection) -> None:
    from batchlab.analysis.metaparameters import (
        optimal_metaparameters,
        search_edge_warnings,
        searched_ranges,
        trial_outcomes,
    )
    from batchlab.plots.tuning import lr_momentum_scatter_figure, metaparameters_figure

    name = out.key
    edges = search_edge_warnings(con, out.results)
    optimal = optimal_metaparameters(out.results, search_edges=edges)
    outcomes = trial_outcomes(con, selection)
    for w in edges:
        out.warnings.append(w["message"])
    if not optimal.has("learning_rate"):
        out.notes.append("the best trials have no learning_rate parameter: no metaparameter figures or verdict")
        return
    figure = metaparameters_figure(optimal, title=f"{out.unit.workload}: optimal metaparameters",
                                   caption=caption_of(out))
    out.figures.append(FigureOut(
        _fig_id(out, "metaparameters"),
        "The best trial's learning rate, 1 - momentum and effective learning rate against batch size, with the "
        "linear and square-root rules anchored at the smallest reached batch size; best trials at a search-space "
        "edge are ringed in red.", f"optimal metaparameters vs batch size, {out.unit.name}", render(figure)))
    y = optimal.values["effective_learning_rate"]
    edge = optimal.edge_limited("effective_learning_rate")
    deltas = []
    for b, value in zip(optimal.batch_sizes, y):
        here = outcomes[(outcomes["batch_size"] == int(b)) & ~outcomes["best"]]
        deltas.append(resolution(float(value), here["effective_learning_rate"].to_numpy(dtype=float)))
    verdict = scaling_verdict(optimal.batch_sizes, y, edge, deltas)
    out.verdict = verdict
    rows = []
    for i, b in enumerate(optimal.batch_sizes):
        for pname in ("learning_rate", "momentum", "effective_learning_rate"):
            v = optimal.values[pname][i]
            if np.isfinite(v):
                out.rows.append(Row(name, "metaparameters", float(b), pname, float(v), None, None,
                                    "best trial at a search edge" if optimal.edge_limited(pname)[i] else ""))
        rows.append([int(b), num(y[i]), "yes" if edge[i] else "",
                     "" if not math.isfinite(deltas[i]) else f"x{math.exp(deltas[i]):.3g}"])
        out.rows.append(Row(name, "verdict", float(b), "resolution_factor",
                            math.exp(deltas[i]) if math.isfinite(deltas[i]) else None))
    for b1, b2, slope in verdict.slopes:
        out.rows.append(Row(name, "verdict", b2, "local_slope", slope, None, None, f"log-log slope from B={b1:g}"))
    for rule, f in verdict.fits.items():
        out.rows.append(Row(name, "verdict", f.end, f"{rule}_rule_fits_to", f.end, verdict.anchor, f.end,
                            f"stops at B={f.stop:g}: {f.why}" if f.stop is not None else "to the largest reached B"))
    out.rows.append(Row(name, "verdict", None, "verdict", None, None, None, verdict.text))
    out.tables.append(Table("Optimal effective learning rate and the search's resolution",
                            ["batch size", "effective lr", "search edge", "resolution (factor)"], rows,
                            note="local log-log slopes: " + ", ".join(
                                f"{b1:g}->{b2:g}: {'-' if s is None else f'{s:.2f}'}" for b1, b2, s in verdict.slopes)))
    frame = outcomes[np.isfinite(outcomes["learning_rate"]) & np.isfinite(outcomes["momentum"])]
    if frame.empty:
        out.notes.append("no learning-rate/momentum scatter: the optimizer has no momentum parameter")
        return
    ranges = searched_ranges(con, out.results)
    figure = lr_momentum_scatter_figure(outcomes, title=f"{out.unit.workload}: trials", search_edges=edges,
                                        search_ranges=ranges, caption=caption_of(out))
    out.figures.append(FigureOut(
        _fig_id(out, "lr-momentum"),
        "Every trial in the (learning rate, 1 - momentum) plane per batch size: goal reached, not reached, raced "
        "(stopped by racing), diverged; the best trial starred; searched ranges dashed.",
        f"learning rate / momentum scatter, {out.unit.name}", render(figure)))
    for outcome, n in outcomes["outcome"].value_counts().sort_index().items():
        out.rows.append(Row(name, "lr_momentum", None, f"trials_{outcome}", int(n)))


def choose_budgets(out: UnitResult) -> list[int]:
    """A few step budgets read from the data: the smallest and the median steps to result, the largest
    steps to result, and the largest step budget of the analysed studies (at most :data:`MAX_BUDGETS`)."""
    steps = sorted(r.steps for r in out.results if r.reached)
    candidates = [steps[0], steps[len(steps) // 2], steps[-1]]
    budgets = [d.get("train_steps") for d in out.unit.definitions.values() if d.get("train_steps")]
    if budgets:
        candidates.append(max(budgets))
    chosen = sorted({int(c) for c in candidates if c and c > 0})
    return chosen[:MAX_BUDGETS]


def _best_measurement(con, out: UnitResult, selection) -> None:
    from batchlab.analysis.budgets import best_measurement_by_budget
    from batchlab.plots.tuning import best_measurement_figure

    budgets = choose_budgets(out)
    kwargs = dict(kind="step", maximize=selection.maximize, max_trials=selection.max_trials,
                  statuses=selection.statuses)
    refused = {}
    try:
        sweep = best_measurement_by_budget(con, out.unit.workload, selection.metric, budgets, **kwargs)
        accepted = budgets
    except BatchlabError:
        accepted = []
        for budget in budgets:
            try:
                best_measurement_by_budget(con, out.unit.workload, selection.metric, [budget], **kwargs)
                accepted.append(budget)
            except BatchlabError as exc:
                refused[budget] = str(exc)
        limit = con.execute("SELECT min(steps) FROM trials WHERE workload = ? AND status = 'RACED'",
                            [out.unit.workload]).fetchone()[0]
        if limit is not None and int(limit) >= 1 and int(limit) not in accepted:
            try:  # the largest step budget within every raced trial's recorded curve
                best_measurement_by_budget(con, out.unit.workload, selection.metric, [int(limit)], **kwargs)
                accepted = sorted(set(accepted) | {int(limit)})
                out.notes.append(f"best measurement: step budget {int(limit)} added, the largest within every raced "
                                 "trial's recorded curve")
            except BatchlabError:
                pass
        sweep = best_measurement_by_budget(con, out.unit.workload, selection.metric, accepted, **kwargs) if accepted else None
    for budget, message in refused.items():
        out.notes.append(f"best measurement under step budget {budget}: refused by the analysis: {message}")
    if sweep is None or not np.isfinite(sweep.best).any():
        out.notes.append("no best-measurement figure: no budget could be answered")
        return
    figure = best_measurement_figure(sweep, selection.metric, title=f"{out.unit.workload}: best {selection.metric}")
    out.figures.append(FigureOut(
        _fig_id(out, "best-measurement"),
        f"Best {selection.metric} at any evaluation within each step budget ({', '.join(str(b) for b in sweep.budgets)}; "
        "chosen from the data: the smallest, median and largest steps to result and the largest study budget"
        + ("; on raced studies only budgets within every raced trial's curve" if refused else "") + ").",
        f"best measurement vs batch size and budget, {out.unit.name}", render(figure)))
    rows = []
    for i, budget in enumerate(sweep.budgets):
        for j, b in enumerate(sweep.batch_sizes):
            value = sweep.best[i, j]
            out.rows.append(Row(out.key, "best_measurement", b, f"best {selection.metric} within {budget} steps",
                                finite_or_none(value)))
        rows.append([budget, *[num(v, 4) for v in sweep.best[i]]])
    out.tables.append(Table(f"Best {selection.metric} within each step budget",
                            ["step budget", *[f"B={b}" for b in sweep.batch_sizes]], rows))


# --- the NQM beside the measured curves (comparisons: batchlab.report.comparisons; steps tables:
# batchlab.report.steps_tables) --------------------------------------------------------------------


def nqm_section(results: list[UnitResult], comparisons: list) -> dict:
    """Draw the exact NQM prediction (``batchlab.report.nqm.predict``) beside each analysed curve,
    scaled to the measured steps at the curve's B0 (shape only), and add the NQM B_crit ratios to the
    comparisons (:class:`batchlab.report.comparisons.Comparison`). Returns ``{"predictions": {optimizer:
    dict | None}, "notes": [...]}``."""
    try:
        from batchlab.report import nqm
    except ImportError as exc:
        raise BatchlabError(f"--nqm needs batchlab.report.nqm, which cannot be imported here ({exc})") from None
    from batchlab.analysis.curve import StepsCurve
    from batchlab.plots.shallue import steps_to_result_figure

    analysed = [r for r in results if r.status == "analysed" and r.curve is not None]
    optimizers = sorted({r.unit.optimizer for r in analysed})
    sizes = sorted({int(b) for r in analysed for b in r.curve.batch_sizes})
    predictions = nqm.predict(optimizers, sizes) if optimizers else {}
    notes = []
    for r in analysed:
        p = predictions.get(r.unit.optimizer)
        if p is None:
            reason = nqm.unsupported_reason(r.unit.optimizer)
            r.notes.append(f"NQM: no prediction for {r.unit.optimizer}: {reason}")
            continue
        b_pred = {int(b): float(s) for b, s in zip(p.batch_sizes, p.steps)}
        b, s = r.curve.reached_arrays()
        b0 = float(r.fit.b0) if r.fit is not None else float(b[0])
        s0 = float(s[list(b).index(b0)]) if b0 in list(b) else float(s[0])
        if not math.isfinite(b_pred.get(int(b0), math.nan)):
            r.notes.append(f"NQM: the prediction for {r.unit.optimizer} does not reach its target at B0 = {b0:g}; "
                           "not drawn")
            continue
        scale = s0 / b_pred[int(b0)]
        points = [(bb, max(1, round(v * scale)) if math.isfinite(v) else None) for bb, v in sorted(b_pred.items())]
        nqm_curve = StepsCurve.from_points(points, label=f"NQM {p.algorithm} (scaled at B0={b0:g})")
        figure = steps_to_result_figure([r.curve, nqm_curve], fits=[r.fit, None], regimes=False, brackets=True,
                                        title=f"{r.unit.workload}: measured and NQM (shape only)")
        r.figures.append(FigureOut(
            _fig_id(r, "nqm"),
            f"Measured steps to result and the {'exact ' if p.exact else ''}NQM prediction for {p.algorithm} on {p.problem} "
            f"({p.target}), the NQM curve multiplied by one factor so that it equals the measured steps at "
            f"B0 = {b0:g} (shape only: its scale is not compared). NQM B_crit = {num(p.b_crit)}"
            f"{' (extrapolated)' if p.b_crit_extrapolated else ''}, fitted over the NQM's own batch sizes "
            f"{_size_range(p.b_crit_batch_sizes)}, not the measured ones."
            + (f" NQM steps at B = {', '.join(f'{int(x):g}' for x in edge)} are upper bounds (best learning rate "
               "at the edge of the NQM's grid)." if (edge := [b for b, e in zip(p.batch_sizes, p.grid_edge) if e])
               else ""),
            f"measured vs NQM steps to result, {r.unit.name}", render(figure)))
        for bb, v in points:
            r.rows.append(Row(r.key, "nqm", bb, "nqm_steps_scaled", v, None, None, f"scaled at B0={b0:g}"))
        r.rows.append(Row(r.key, "nqm", None, "nqm_b_crit", finite_or_none(p.b_crit), None, None,
                          p.problem + (" (extrapolated)" if p.b_crit_extrapolated else "")))
        r.nqm_b_crit = p.b_crit
    for comp in comparisons:
        for ratio in comp.ratios:
            pa = predictions.get(ratio["numerator"].unit.optimizer)
            pb = predictions.get(ratio["denominator"].unit.optimizer)
            if pa is not None and pb is not None and pa.b_crit and pb.b_crit:
                ratio["nqm"] = pa.b_crit / pb.b_crit
                ratio["nqm_extrapolated"] = bool(pa.b_crit_extrapolated or pb.b_crit_extrapolated)
    return {"predictions": {k: (None if v is None else v.to_dict()) for k, v in predictions.items()}, "notes": notes}


def beyond_measured(entry: dict, fit: dict) -> str:
    """For a fit-derived named batch size ``entry`` (``value``, ``low``, ``high``): ``"extrapolated:
    outside the measured range"`` when its value lies outside the fit's measured batch sizes
    ``[smallest_batch_size, largest_batch_size]``, ``"interval reaches beyond the measured range"``
    when only an end of its interval does (an unbounded end counts), else ``""``."""
    lo, hi = fit.get("smallest_batch_size"), fit.get("largest_batch_size")
    value = entry.get("value")
    if lo is None or hi is None or value is None or not math.isfinite(value):
        return ""
    if not lo <= value <= hi:
        return "extrapolated: outside the measured range"
    ends = [entry.get("low"), entry.get("high")]
    if all(e is None for e in ends):  # no interval (e.g. a fit on two points)
        return ""
    if any(e is None or not math.isfinite(e) or not lo <= e <= hi for e in ends):  # None: unbounded side
        return "interval reaches beyond the measured range"
    return ""


def _size_range(sizes) -> str:
    """``B = lo..hi`` of a sequence of batch sizes (``B = ?`` when empty)."""
    sizes = [int(b) for b in sizes]
    return f"B = {min(sizes)}..{max(sizes)}" if sizes else "B = ?"


def summary_line(r: UnitResult, with_group: bool = False) -> str:
    """The printed line of one unit (``report`` summary); ``with_group`` names its study group (when
    the workload has more than one unit)."""
    head = f"{r.unit.base} {r.unit.optimizer}"
    if with_group:
        head += f" [{r.unit.group}]"
    if r.status == "skipped":
        return f"{head}: {r.reason}"
    if r.status == "unreached":
        return f"{head}: no goal reached ({r.goal_text} at none of {len(r.results)} batch sizes)"
    if r.b_crit is None:
        n = sum(1 for x in r.results if x.reached)
        return f"{head}: no B_crit (goal reached at {n} batch size{'s' if n != 1 else ''}; a fit needs two)"
    bc = r.b_crit
    text = f"{head}: B_crit {num(bc['value'])} [{_side(bc['low'], '0')}, {_side(bc['high'], 'inf')}]"
    extra = [f"{bc['level']:.0%}", f"fit of {bc['n_points']} batch sizes"]
    tail = []
    if bc["ps_end"] is not None:
        tail.append(f"perfect scaling to B={num(bc['ps_end'])}")
    elif bc.get("ps_beyond") is not None:
        tail.append(f"perfect scaling beyond B={num(bc['ps_beyond'])}")
    elif bc.get("ps_at_least") is not None:
        tail.append(f"perfect scaling to at least B={num(bc['ps_at_least'])} (undetermined beyond)")
    if bc["extrapolated"]:
        tail.append("extrapolated")
    if bc.get("poor_fit"):
        # what the residuals show beyond the trials' scatter (a rise, a bend, scatter at named batch sizes)
        tail.append(f"poor fit: {bc.get('misfit') or 'the hyperbola is rejected beyond the scatter'}")
    if bc.get("flagged_batch_sizes"):
        text_flags = (f"tuning flags at B={', '.join(map(str, bc['flagged_batch_sizes']))}; B_crit without them "
                      + _b_crit_text(bc["without_flagged"]))
        if bc.get("point_flagged_batch_sizes"):
            text_flags += (f", without B={', '.join(map(str, bc['point_flagged_batch_sizes']))} only "
                           + _b_crit_text(bc["without_point_flags"]))
        tail.append(text_flags)
    return f"{text} ({', '.join(extra)}" + (f"; {'; '.join(tail)}" if tail else "") + ")"


def _b_crit_text(side: dict) -> str:
    """``V [LOW, HIGH]`` of a fit with flagged batch sizes left out (``none (...)`` when it could not be made)."""
    if side["b_crit"] is None and not side["b_crit_unbounded"]:
        return "none (too few batch sizes left)"
    value = "inf" if side["b_crit_unbounded"] else num(side["b_crit"])
    return f"{value} [{_side(side['low'], '0')}, {_side(side['high'], 'inf')}]"


def _side(value, unbounded: str) -> str:
    return unbounded if value is None else num(value)
