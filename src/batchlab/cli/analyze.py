"""Command group ``analyze``: steps to result and critical batch size from a measurement store.

``batchlab analyze steps-to-result --store DIR --workload DATASET/MODEL[/OPTIMIZER] [--optimizer O]
[--metric M --goal G] [--maximize|--minimize] [--max-trials N|all|auto] [--step-budget S]
[--example-budget E] [--status STATUS ...] [--study ID ...] [--mix-studies] --json`` answers every
unit (one workload under one study group, docs/methods.md, "Units"; the metric, goal and direction
default to the unit's recorded stop rule, else the registered workload's goal) and prints one JSON
object per batch size and unit, with the resolution bracket of each steps to result and the unit's
label (``unit``, ``study_group``); ``batchlab analyze critical-batch-size`` with the same selection
prints, per unit (``--json``: one object per unit), the S(B) fit, each named critical batch size with its interval, what the numbers rest on
(measured batch-size range, points used, B0, warnings) and the regimes; with ``--steps-table FILE``
it fits a plain table of steps instead (docs/methods.md), each value with its interval.
``batchlab analyze scaling --steps-table FILE --group-by COLUMN --x COLUMN [--at X,...] [--json]`` fits
each group's curve, then B_crit and S_min against the group's size as power laws
(:mod:`batchlab.analysis.scaling`; docs/methods.md, "Scaling across groups").

The selection options are those of :mod:`batchlab.cli.options` (shared with ``batchlab plot``);
everything printed goes through :mod:`batchlab.cli.output`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from batchlab.cli import options as opt
from batchlab.cli.options import connect_store
from batchlab.cli.output import cell, emit_json, fmt, json_ready, line, note, print_table
from batchlab.errors import BatchlabError

CriticalJson = opt.json_option("Print JSON (one object per unit; one per group with --steps-table).")


analyze_app = typer.Typer(
    help="Analyse a store: steps to result per batch size, critical batch size.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


def trials_description(selection, results) -> dict:
    """What the selected trials were: the N used, the studies, and whether they were mixed (JSON-ready)."""
    used = {r.max_trials for r in results}
    n_used = next(iter(used)) if len(used) == 1 else None
    study_ids = sorted({sid for r in results for sid in r.study_ids})
    return {
        "max_trials_used": n_used,
        "max_trials_rule": selection.max_trials,
        "statuses": list(selection.statuses),
        "study_ids": study_ids,
        "mixed_studies": any(r.mixed_studies for r in results),
        "mixed_batch_sizes": [r.batch_size for r in results if r.mixed_studies],
    }


def trials_caption(selection, results) -> str:
    """One line saying which trials the numbers come from (the table caption)."""
    info = trials_description(selection, results)
    n_used = info["max_trials_used"]
    if n_used is None:
        rule = "every selected trial per batch size"
    else:
        rule = f"first {n_used} trials per batch size by trial id"
        if selection.max_trials == "auto":
            rule += " (the paper's rule for imported release workloads; --max-trials all for every trial)"
    parts = [rule, "statuses " + ", ".join(selection.statuses)]
    ids = info["study_ids"]
    if info["mixed_studies"]:
        mixed = sorted({sid for r in results if r.mixed_studies for sid in r.study_ids})
        sizes = ", ".join(str(b) for b in info["mixed_batch_sizes"])
        parts.append(f"MIXED studies at batch size {sizes}: {', '.join(mixed)} (--mix-studies)")
    elif len(ids) > 3:
        parts.append(f"{len(ids)} studies, one per batch size")
    elif ids:
        parts.append(f"{'study' if len(ids) == 1 else 'studies'} {', '.join(ids)}")
    return "trials: " + "; ".join(parts)


def value_text(result) -> str:
    """The best trial's value; a bound (docs/methods.md, "Bounded measurements") prints as ``<= v``
    (upper bound) or ``>= v`` (lower bound), never as if exact."""
    bound = {-1: "<= ", 1: ">= "}.get(result.value_bound, "")
    return bound + fmt(result.value) if result.value is not None else fmt(result.value)


def bracket_text(result) -> str:
    """The resolution bracket of one result: ``(lower, steps]``, ``> censored_at`` or ``''``."""
    return _bracket(result.steps, result.steps_lower, result.censored_at)


def _bracket(steps, steps_lower, censored_at) -> str:
    from batchlab.analysis.curve import bracket_text as text

    return text(steps, 0 if steps_lower is None else steps_lower, censored_at, unreached="")


@analyze_app.command("steps-to-result")
def steps_to_result_command(
    store: opt.Store,
    workload: opt.StoreWorkload,
    optimizer: opt.StoreOptimizer = None,
    metric: opt.Metric = None,
    goal: opt.Goal = None,
    maximize: opt.Maximize = None,
    max_trials: opt.MaxTrials = "auto",
    step_budget: opt.StepBudget = None,
    example_budget: opt.ExampleBudget = None,
    status: opt.Statuses = opt.DEFAULT_STATUSES,
    study: opt.Studies = None,
    mix_studies: opt.MixStudies = False,
    as_json: opt.Json = False,
) -> None:
    """Steps to result per batch size: the best trial's earliest evaluation step that beats the goal,
    with its resolution bracket (steps_lower, steps], or censored_at where no trial reached it; one
    table per unit (workload and study group; docs/methods.md, "Units")."""
    from batchlab.analysis.metaparameters import search_edge_warnings
    from batchlab.analysis.units import unit_label

    def answer(con, selection):
        results = steps_to_unit_result(con, selection)
        return results, search_edge_warnings(con, results)

    answers = answer_units(store, answer, workload, optimizer, metric, goal, maximize, max_trials, step_budget,
                           example_budget, status, study, mix_studies, as_json)
    several = len(answers) > 1
    for unit, selection, (results, edges) in answers:
        if as_json:
            for result in results:
                question = {"metric": selection.metric, "goal": float(selection.goal), "maximize": selection.maximize}
                emit_json(result.to_dict() | unit_label(unit) | question
                          | {"search_edge": _edges_at(edges, result.batch_size)})
            continue
        comparison = ">" if selection.maximize else "<"
        columns = [(c, "right") for c in ("batch size", "steps", "bracket", "examples", "trial", "value",
                                          "learning rate", "momentum", "effective lr", "reached/trials")]
        rows = [
            [str(r.batch_size), "not reached" if r.steps is None else str(r.steps), bracket_text(r),
             "" if r.steps is None else str(r.steps * r.batch_size), "" if r.trial_id is None else str(r.trial_id),
             value_text(r), fmt(r.learning_rate), fmt(r.momentum), fmt(r.effective_learning_rate),
             f"{r.n_reached}/{r.n_trials}" + (f" ({r.n_raced} raced)" if r.n_raced else "")]
            for r in results
        ]
        title = unit.name if several else selection.workload
        print_table(f"{title}: steps to {selection.metric} {comparison} {selection.goal:g}", columns, rows,
                    caption=trials_caption(selection, results))
        for edge in edges:
            line(f"warning: {edge['message']}")


def steps_to_unit_result(con, selection) -> list:
    """The per-batch-size results of one selection (:func:`batchlab.analysis.steps_to_result.steps_to_result_many`)."""
    from batchlab.analysis.steps_to_result import steps_to_result_many

    return steps_to_result_many(con, [selection])[0]


def answer_units(store: Path, answer, workload: str, optimizer, metric, goal, maximize, max_trials, step_budget,
                 example_budget, statuses, studies, mix_studies: bool, as_json: bool = False) -> list[tuple]:
    """``answer(con, selection)`` for every unit the selection options name (docs/methods.md, "Units"),
    as ``[(unit, selection, answer), ...]``: one result per unit, never pooled.

    A unit whose answer raises a BatchlabError is left out and said so (``warning: UNIT: ...`` on
    stderr; with ``as_json`` also one ``{"unit", "study_group", "error"}`` line); when every unit
    fails, the first error is raised (with one unit: exactly that unit's error).
    """
    con = connect_store(store)
    try:
        return answer_units_on(con, answer, workload, optimizer, metric, goal, maximize, max_trials, step_budget,
                               example_budget, statuses, studies, mix_studies, as_json)
    finally:
        con.close()


def answer_units_on(con, answer, workload: str, optimizer, metric, goal, maximize, max_trials, step_budget,
                    example_budget, statuses, studies, mix_studies: bool, as_json: bool = False) -> list[tuple]:
    """:func:`answer_units` on an open connection ``con`` of the store (a command that asks several
    questions of one store, ``plot goals`` or ``plot compare-workloads``, opens and checks it once)."""
    from batchlab.analysis.units import unit_label

    units = opt.store_units(con, workload, optimizer, studies, mix_studies)
    selections = opt.unit_selections(con, units, metric, goal, maximize, max_trials, step_budget,
                                     example_budget, statuses, mix_studies)
    answers, failed = [], []
    for unit, selection in zip(units, selections):
        try:
            answers.append((unit, selection, answer(con, selection)))
        except BatchlabError as error:
            failed.append((unit, error))
    if not answers:
        raise failed[0][1]
    for unit, error in failed:
        note(f"warning: {unit.name}: {error}")
        if as_json:
            emit_json(unit_label(unit) | {"error": str(error)})
    return answers


def _edges_at(edges: list[dict], batch_size: int) -> list[dict]:
    """The search-edge warnings of one batch size (docs/methods.md, "Search-edge warnings")."""
    return [e for e in edges if e["batch_size"] == batch_size]


@analyze_app.command("critical-batch-size")
def critical_batch_size_command(
    store: opt.StoreOrTable = None,
    workload: opt.StoreWorkloadOrTable = None,
    optimizer: opt.StoreOptimizer = None,
    metric: opt.Metric = None,
    goal: opt.Goal = None,
    maximize: opt.Maximize = None,
    max_trials: opt.MaxTrials = "auto",
    step_budget: opt.StepBudget = None,
    example_budget: opt.ExampleBudget = None,
    status: opt.Statuses = opt.DEFAULT_STATUSES,
    study: opt.Studies = None,
    mix_studies: opt.MixStudies = False,
    n_boot: Annotated[int, typer.Option(
        "--bootstrap", min=1, max=opt.MAX_BOOTSTRAP,
        help="Replicates of trials resampled per batch size (the regime shares, regime_fractions; at most "
             "100,000).")] = 1000,
    level: opt.Level = 0.9,
    seed: opt.Seed = 0,
    tolerance: opt.Tolerance = 0.1,
    steps_table: Annotated[Optional[Path], typer.Option(
        "--steps-table", metavar="FILE",
        help="Fit a plain table (CSV or Parquet: columns batch_size and steps, optional reached, budget, "
             "steps_lower, n_trials, second_steps) instead of a store; intervals at --level.")] = None,
    group_by: Annotated[Optional[str], typer.Option(
        "--group-by", metavar="COLUMN", help="With --steps-table: fit one curve per value of this column.")] = None,
    b0: opt.B0 = None,
    as_json: CriticalJson = False,
) -> None:
    """Fit S(B) = S_min + E_min/B (censored, bracket-weighted); named critical batch sizes with intervals;
    regimes read from the data; what each number rests on (docs/methods.md); one fit per unit
    (workload and study group; docs/methods.md, "Units")."""
    from batchlab.analysis.regimes import check_tolerance

    check_tolerance(tolerance, "--tolerance")
    if steps_table is not None:
        given = [name for name, value in (("--store", store), ("--workload", workload), ("--optimizer", optimizer),
                                          ("--metric", metric), ("--goal", goal), ("--study", study)) if value]
        if given:
            raise BatchlabError(f"--steps-table fits the table alone; leave out {', '.join(given)}")
        _critical_batch_size_table(steps_table, group_by, tolerance, as_json, b0, opt.check_level(level))
        return
    if group_by is not None:
        raise BatchlabError("--group-by needs --steps-table FILE")
    missing = [name for name, value in (("--store", store), ("--workload", workload)) if value is None]
    if missing:
        raise BatchlabError(f"missing {', '.join(missing)} (or give --steps-table FILE)")
    from batchlab.analysis.bootstrap import critical_batch_size_with_intervals
    from batchlab.analysis.metaparameters import search_edge_warnings
    from batchlab.analysis.tuning_flags import flagged_fit_effect, store_fit_fn, tuning_flags, tuning_from_store
    from batchlab.analysis.units import unit_label

    def answer(con, selection):
        results = steps_to_unit_result(con, selection)  # checks the selection and its studies first
        estimate = critical_batch_size_with_intervals(con, selection, n_boot=n_boot, level=level, seed=seed,
                                                      tolerance=tolerance, b0=b0)
        edges = search_edge_warnings(con, results)
        summary = {"selection": selection.describe() | trials_description(selection, results)} | estimate.to_dict()
        # tuning flags (docs/methods.md, "Tuning flags") and B_crit with and without the flagged points
        flags = tuning_flags(tuning_from_store(con, selection, results), tolerance)
        summary["tuning_flags"] = [f.to_dict() for f in flags]
        effect = None
        if flags:
            fit_fn = store_fit_fn(con, selection, n_boot=n_boot, level=level, seed=seed, tolerance=tolerance)
            effect = flagged_fit_effect(estimate.curve, flags, fit_fn, full=estimate)
        summary["flagged_fit_effect"] = None if effect is None else effect.to_dict() | {"text": effect.text()}
        summary["brackets"] = [
            {"batch_size": r.batch_size, "steps": r.steps, "steps_lower": r.steps_lower, "censored_at": r.censored_at,
             "n_trials": r.n_trials, "n_reached": r.n_reached, "n_raced": r.n_raced, "study_ids": r.study_ids,
             "search_edge": _edges_at(edges, r.batch_size)}
            for r in results
        ]
        return summary, trials_caption(selection, results)

    answers = answer_units(store, answer, workload, optimizer, metric, goal, maximize, max_trials, step_budget,
                           example_budget, status, study, mix_studies, as_json)
    for unit, _, (summary, caption) in answers:
        if as_json:
            emit_json(unit_label(unit) | summary)
            continue
        line(f"unit {unit.name}: {unit.rule}")
        _print_critical_batch_size(json_ready(summary, keep_infinite=True), caption)


def _critical_batch_size_table(path: Path, group_by: str | None, tolerance: float, as_json: bool,
                               b0: float | None = None, level: float = 0.9) -> None:
    """``--steps-table``: fit each group of a plain steps table (batchlab.analysis.steps_table, which
    checks the file), each value with its profile-likelihood interval at ``level``."""
    from batchlab.analysis.steps_table import fit_steps_table

    groups = fit_steps_table(path, group_by=group_by, tolerance=tolerance, b0=b0, level=level)
    if as_json:
        for g in groups:
            emit_json(dict(g))
        return
    rows = [json_ready(dict(g), keep_infinite=True) for g in groups]  # inf prints as inf, not as blank
    from batchlab.analysis.definitions import definition_names

    columns = ("group", "s_min", "e_min", *definition_names(headline_only=True), "residual")
    # what each fit rests on (docs/methods.md, "What a critical batch size rests on")
    table_rows = []
    for row in rows:
        span = row.get("batch_size_range")
        span_text = (f"{cell(span[0])}..{cell(span[1])}" if isinstance(span, (list, tuple)) and len(span) == 2
                     else "")
        intervals = row.get("intervals") or {}
        table_rows.append([*(with_interval(row.get(c), intervals.get(c)) for c in columns), cell(row.get("b0")),
                           span_text, cell(row.get("points_used")),
                           "" if row.get("error") else cell(row.get("extrapolated"))])
    print_table(f"{path}: S(B) = S_min + E_min / B per {'group' if group_by is None else group_by} "
                f"(tolerance {tolerance:g}; [low, high]: {100 * level:g}% intervals)",
                [*columns, "b0", "measured B", "points", "extrapolated"], table_rows)
    interval = next((r["interval"] for r in rows if r.get("interval")), None)
    if interval:
        line(f"intervals: for the {interval['target']}; {interval['method']}; '-': unbounded on that side")
    for row in rows:
        where = "" if row.get("group") is None else f" ({row.get('group')})"
        if row.get("error"):
            line(f"error{where}: {row['error']}")
        note_text = (row.get("interval") or {}).get("note")
        if note_text:
            line(f"interval{where}: {note_text}")
        # the fit's warnings, then the tuning flags and B_crit without the flagged batch sizes, as for a store
        for warning in _warnings(row, {}):
            line(f"warning{where}: {warning}")
        points = row.get("point_flagged_fit_effect")
        if isinstance(points, dict) and points.get("text"):
            line(f"warning{where}: tuning flags ({' and '.join(points['leave_out'])} only): {points['text']}")


def with_interval(value, interval) -> str:
    """A table cell ``value [low, high]`` (``-`` for an unbounded side); the value alone without an interval."""
    text = cell(value)
    if not isinstance(interval, dict) or (interval.get("low") is None and interval.get("high") is None):
        return text
    low, high = (fmt(interval.get(k)) if interval.get(k) is not None else "-" for k in ("low", "high"))
    return f"{text} [{low}, {high}]"


@analyze_app.command("scaling")
def scaling_command(
    steps_table: Annotated[Path, typer.Option(
        "--steps-table", metavar="FILE",
        help="A steps table (as for critical-batch-size --steps-table) holding one S(B) curve per group.")],
    group_by: Annotated[str, typer.Option(
        "--group-by", metavar="COLUMN", help="The column naming the groups (one S(B) curve each; at least two).")],
    x: Annotated[str, typer.Option(
        "--x", metavar="COLUMN",
        help="The size column (model or data size: a number > 0, the same on every row of a group; may be the "
             "--group-by column).")],
    at: Annotated[Optional[str], typer.Option(
        "--at", metavar="X[,X...]",
        help="Sizes at which to give each power law's value with its interval (labelled extrapolated outside "
             "the measured sizes).")] = None,
    level: opt.Level = 0.9,
    n_boot: Annotated[int, typer.Option(
        "--bootstrap", min=1, max=opt.MAX_BOOTSTRAP,
        help="Replicates of the parametric bootstrap that checks the exponent's interval (at most 100,000).")] = 2000,
    seed: opt.Seed = 0,
    as_json: opt.json_option("Print one JSON object: the groups' fits and the power laws.") = False,
) -> None:
    """B_crit and S_min against model or data size as power laws q = c * x^b across the groups of a steps
    table, each group's S(B) fitted as critical-batch-size --steps-table fits it, the exponent's interval
    carrying each curve's own interval (docs/methods.md, "Scaling across groups")."""
    from batchlab.analysis.scaling import fit_scaling_table

    sizes = opt.parse_csv(at, "--at", float)
    result = fit_scaling_table(steps_table, group_by, x, level=opt.check_level(level), n_boot=n_boot,
                               seed=opt.check_seed(seed), at=sizes)
    if as_json:
        emit_json(result)
        return
    _print_scaling(json_ready(result, keep_infinite=True))


def _print_scaling(result: dict) -> None:
    """The text form of :func:`batchlab.analysis.scaling.fit_scaling_table`'s result."""
    from batchlab.analysis.scaling import QUANTITIES

    level = result["level"]
    sizes = [] if result["x"] == result["group_by"] else [result["x"]]  # the size column, once
    rows = []
    for g in result["groups"]:
        rows.append([cell(g["group"]), *(fmt(g["x"]) for _ in sizes),
                     *(with_interval(g[k]["value"], g[k]) if not g.get("error") else "" for k in QUANTITIES),
                     cell(g.get("points_used")),
                     "..".join(cell(b) for b in g.get("batch_size_range") or []), g.get("error") or ""])
    print_table(f"{result['steps_table']}: S(B) fitted per {result['group_by']} ([low, high]: {100 * level:g}% "
                "intervals; '-': unbounded on that side)",
                [result["group_by"], *sizes, *QUANTITIES.values(), "points", "measured B", "error"], rows)
    for key, name in QUANTITIES.items():
        fit = result["fits"][key]
        if fit.get("error"):
            line(f"{name}: no power law: {fit['error']}")
            continue
        b, c, boot = fit["exponent"], fit["prefactor"], fit["bootstrap"]
        span = fit["x_range"]
        dof = fit["dof"]
        quantile = f"t quantile, {dof} dof" if dof > 0 else "normal quantile, no residual dof"
        scale = fit.get("residual_scale")
        line(f"{name} = c * {result['x']}^b: b = {fmt(b['value'])} [{fmt(b['low'])}, {fmt(b['high'])}], c = "
             f"{fmt(c['value'])} [{fmt(c['low'])}, {fmt(c['high'])}] ({100 * level:g}%; weighted least squares in "
             f"log space over {fit['n_groups']} groups, {quantile}"
             + (f", residual variance {fmt(scale)} x the groups' own" if scale is not None else "")
             + f"; measured {result['x']} {fmt(span[0])}..{fmt(span[1])}); parametric bootstrap check of b: "
             f"[{fmt(boot['exponent_low'])}, {fmt(boot['exponent_high'])}]")
        if fit["predictions"]:
            print_table(f"{name} from the power law ({100 * level:g}% intervals for its value)",
                        [result["x"], name, "low", "high", "extrapolated"],
                        [[fmt(p["x"]), fmt(p["value"]), fmt(p["low"]), fmt(p["high"]), fmt(p["extrapolated"])]
                         for p in fit["predictions"]])
        for warning in fit["warnings"]:
            line(f"warning: {warning}")
    line(f"power laws: for the {result['target']}; {result['method']}")


def _print_critical_batch_size(summary: dict, caption: str = "") -> None:
    fit = summary.get("fit") or {}
    boot = summary.get("bootstrap") or {}
    residual = fit.get("rms_log_residual")
    line(
        f"{summary.get('label', '')}: S(B) = S_min + E_min / B with S_min = {fmt(fit.get('s_min'))}, "
        f"E_min = {fmt(fit.get('e_min'))} ({fit.get('n_points')} reached batch sizes, "
        f"{fit.get('n_censored', 0)} censored; rms log residual {fmt(residual)})"
    )
    rests = _rests_on(summary, fit)
    if rests:
        line("rests on: " + "; ".join(rests))
    if caption:
        line(caption)
    if boot:
        extra = ", ".join(f"{k} {cell(v)}" for k, v in boot.items() if k not in ("level",))
        line(f"intervals: {extra}" if extra else "intervals:")
    level = boot.get("level")
    title = "critical batch sizes" + (f" ({100 * level:g}% intervals)" if isinstance(level, (int, float)) else "")
    named = {**(summary.get("fit_intervals") or {}), **(summary.get("critical_batch_sizes") or {})}
    rows = []
    for name, row in named.items():
        if not isinstance(row, dict):
            row = {"value": row}
        low, high = _interval(row)
        notes = [n for n in (row.get("reason"), (row.get("interval") or {}).get("note")
                             if isinstance(row.get("interval"), dict) else None) if n]
        definition = row.get("definition", "fit parameter")
        rows.append([name, fmt(row.get("value")), fmt(low), fmt(high), str(row.get("source") or ""),
                     definition + "".join(f" ({n})" for n in notes)])
    print_table(title, ["name", ("value", "right"), ("low", "right"), ("high", "right"), ("source", "left"),
                        ("definition", "left")], rows)
    methods: dict[tuple, list[str]] = {}
    for name, row in named.items():
        interval = row.get("interval") if isinstance(row, dict) else None
        if isinstance(interval, dict) and (interval.get("target") or interval.get("method")):
            methods.setdefault((interval.get("target"), interval.get("method")), []).append(name)
    for (target, method), names in methods.items():
        line(f"interval of {', '.join(names)}: for {target or '?'}; {method or ''}".rstrip("; "))
    s_min = summary.get("s_min")
    if isinstance(s_min, dict):
        measured = s_min.get("measured")
        measured_value = measured.get("value") if isinstance(measured, dict) else measured
        if isinstance(measured, dict) and measured.get("plateau_seen") is False:
            # no plateau of two measured batch sizes: the smallest measured S is only an upper bound on it
            where = f" at B = {measured['batch_size']}" if measured.get("batch_size") is not None else ""
            line(f"S_min: fit {fmt(s_min.get('fit'))}, smallest measured steps {fmt(measured_value)}{where} "
                 "(no plateau seen: an upper bound on the plateau)")
        else:
            line(f"S_min: fit {fmt(s_min.get('fit'))}, measured plateau {fmt(measured_value)}")
    regimes = summary.get("regimes") or []
    if regimes:
        table_rows = []
        for row in regimes:
            steps = row.get("steps")
            interval = row.get("steps_interval")
            interval_text = ""
            if isinstance(interval, (list, tuple)) and len(interval) == 2:
                low, high = interval
                unknown = str(row.get("steps_interval_note") or "").startswith("unknown")
                upper = ("unknown" if unknown else "not reached") if high is None else high
                interval_text = f"[{'-' if low is None else low}, {upper}]"
            table_rows.append([
                str(row.get("batch_size")), "not reached" if steps is None else str(steps),
                _bracket(steps, row.get("steps_lower"), row.get("censored_at")), str(row.get("regime") or ""),
                str(row.get("fit_regime") or ""), interval_text,
            ])
        print_table(f"regimes (tolerance {cell(summary.get('tolerance'))})",
                    [(c, "right") for c in ("batch size", "steps", "bracket", "regime (data)", "regime (fit)",
                                            "steps interval")], table_rows)
        first = regimes[0]
        if first.get("steps_interval_target") or first.get("steps_interval_method"):
            # the note differs per batch size (e.g. "unbounded" where the k-th best trial never reached
            # the goal): print the most common one for all, the others with their batch sizes
            notes: dict[str, list] = {}
            for row in regimes:
                if row.get("steps_interval_note"):
                    notes.setdefault(row["steps_interval_note"], []).append(row.get("batch_size"))
            common = max(notes, key=lambda n: len(notes[n])) if notes else ""
            parts = [f"for the {first.get('steps_interval_target')}" if first.get("steps_interval_target") else "",
                     first.get("steps_interval_method") or "", common]
            line("steps interval: " + "; ".join(p for p in parts if p))
            for note, batch_sizes in notes.items():
                if note != common:
                    line(f"steps interval at B = {', '.join(str(b) for b in batch_sizes)}: {note}")
    for warning in _warnings(summary, fit):
        line(f"warning: {warning}")


def _rests_on(summary: dict, fit: dict) -> list[str]:
    """The 'rests on' facts: measured batch-size range, points used, B0, censored points, extrapolation."""
    out = []
    span = summary.get("batch_size_range")
    if span is None and fit.get("smallest_batch_size") is not None:
        span = [fit.get("smallest_batch_size"), fit.get("largest_batch_size")]
    if isinstance(span, (list, tuple)) and len(span) == 2:
        out.append(f"measured batch sizes {cell(span[0])}..{cell(span[1])}")
    points = summary.get("points_used", fit.get("n_points"))
    if points is not None:
        out.append(f"{points} points used")
    censored = summary.get("censored_batch_sizes")
    if censored:
        out.append(f"censored at B = {', '.join(str(b) for b in censored)}")
    b0 = summary.get("b0", fit.get("b0"))
    if b0:
        out.append(f"B0 = {cell(b0)}")
    if summary.get("extrapolated", fit.get("extrapolated")):
        out.append("B_crit extrapolated outside the measured range")
    return out


def _warnings(summary: dict, fit: dict) -> list[str]:
    seen: list[str] = []
    for source in (summary.get("warnings"), fit.get("warnings"), (summary.get("bootstrap") or {}).get("warnings")):
        for warning in source or []:
            if warning not in seen:
                seen.append(str(warning))
    for bracket in summary.get("brackets") or []:
        seen.extend(edge["message"] for edge in bracket.get("search_edge") or [])
    # search-edge flags repeat the search-edge warnings above; the other kinds are new here
    seen.extend(f"tuning flag: {flag['message']}" for flag in summary.get("tuning_flags") or []
                if flag.get("kind") != "search_edge")
    effect = summary.get("flagged_fit_effect")
    if isinstance(effect, dict) and effect.get("text"):
        seen.append(f"tuning flags: {effect['text']}")
    return seen


def _interval(row: dict):
    if "low" in row or "high" in row:
        return row.get("low"), row.get("high")
    interval = row.get("interval")
    if isinstance(interval, dict):
        return interval.get("low"), interval.get("high")
    if isinstance(interval, (list, tuple)) and len(interval) == 2:
        return interval[0], interval[1]
    return None, None


def register(app: typer.Typer) -> None:
    """Add the ``analyze`` group to the main app."""
    app.add_typer(analyze_app, name="analyze")
