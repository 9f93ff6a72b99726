"""Command group ``analyze``: steps to result and critical batch size from a measurement store.

``batchlab analyze steps-to-result --store DIR --workload DATASET/MODEL/OPTIMIZER --metric M --goal G
[--maximize] [--max-trials N|all|auto] [--step-budget S] [--example-budget E] [--status STATUS ...]
[--study ID ...] [--mix-studies] --json`` prints one JSON object per batch size, with the resolution
bracket of each steps to result; ``batchlab analyze critical-batch-size`` with the same selection
prints the S(B) fit, each named critical batch size with its interval, what the numbers rest on
(measured batch-size range, points used, B0, warnings) and the regimes; with ``--steps-table FILE``
it fits a plain table of steps instead (docs/methods.md).

Shared with ``batchlab plot`` (the same selection options everywhere): the option objects below
(``STUDY``, ``MIX_STUDIES``, ``MAX_TRIALS_RULE``, ``STATUS`` ...) and :func:`make_selection`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer

from batchlab.errors import BatchlabError

analyze_app = typer.Typer(
    help="Analyse a store: steps to result per batch size, critical batch size.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

STORE = typer.Option(..., "--store", help="Store directory.")
WORKLOAD = typer.Option(..., "--workload", help="Workload as DATASET/MODEL/OPTIMIZER (the release's directory).")
METRIC = typer.Option(..., "--metric", help="Metric name, e.g. val/classification_error.")
GOAL = typer.Option(..., "--goal", help="Goal the metric must strictly beat.")
MAXIMIZE = typer.Option(False, "--maximize", help="Higher is better: reach means metric > goal.")
MAX_TRIALS_RULE = typer.Option(
    "auto", "--max-trials", metavar="N|all|auto",
    help="Use only the first N trials (trial-id order) per batch size; 'all': every trial; 'auto' (default): "
         "the paper's first 100 COMPLETE trials (50 for lm1b/lstm, common_crawl/transformer_base and "
         "lm1b/transformer_shallow/sgd) for imported release workloads, refusing a batch size with fewer, "
         "and every trial otherwise (docs/methods.md, \"Trial counts\").",
)
STEP_BUDGET = typer.Option(None, "--step-budget", min=1, help="Keep measurements with step <= N.")
EXAMPLE_BUDGET = typer.Option(None, "--example-budget", min=1, help="Keep measurements with batch_size * step <= N.")
STATUS = typer.Option(
    ["COMPLETE", "STOPPED_AT_GOAL"], "--status",
    help="Trial statuses to analyse (repeat to add); default COMPLETE and STOPPED_AT_GOAL (trials stopped at "
         "their study's stop goal answer only that goal or looser ones).",
)
STUDY = typer.Option(
    None, "--study", metavar="ID",
    help="Use only trials of this study id or sweep id (repeat or comma-separate for several); default: all studies, "
         "refusing a batch size whose trials come from more than one study definition.",
)
MIX_STUDIES = typer.Option(
    False, "--mix-studies",
    help="Pool trials of different study definitions at one batch size (reported as mixed_studies).",
)
JSON = typer.Option(False, "--json", help="Print JSON objects, one per line.")


def connect_store(store: Path):
    """A DuckDB connection with the four store views (BatchlabError if ``store`` is not a store)."""
    from batchlab.store import Store

    return Store.open(store, create=False).connect()


def parse_max_trials(value) -> int | str | None:
    """``--max-trials`` as :class:`~batchlab.analysis.selection.Selection` takes it: a positive int,
    ``"all"``, ``"auto"`` or ``None`` (every trial). BatchlabError (one line) for anything else."""
    if value is None or isinstance(value, int) and not isinstance(value, bool):
        if value is not None and value < 1:
            raise BatchlabError(f"--max-trials must be a positive integer, 'all' or 'auto', got {value!r}")
        return value
    text = str(value).strip().lower()
    if text in ("all", "auto"):
        return text
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise BatchlabError(f"--max-trials must be a positive integer, 'all' or 'auto', got {str(value)!r}")
    return number


def parse_studies(values) -> tuple[str, ...] | None:
    """``--study`` values (repeated and/or comma-separated) as a tuple of ids; ``None`` when none given."""
    if not values:
        return None
    if isinstance(values, str):
        values = [values]
    ids = tuple(dict.fromkeys(part.strip() for value in values for part in str(value).split(",") if part.strip()))
    if not ids:
        raise BatchlabError("--study needs a study id or sweep id")
    return ids


def make_selection(workload, metric, goal, maximize, max_trials, step_budget, example_budget, statuses,
                   studies=None, mix_studies=False):
    """The :class:`~batchlab.analysis.selection.Selection` the options describe.

    ``max_trials``: an int, ``None``, or the text of ``--max-trials`` (``N``, ``all``, ``auto``);
    ``studies``: the ``--study`` values (repeated or comma-separated), ``None`` for all;
    ``mix_studies``: ``--mix-studies``.
    """
    from batchlab.analysis.selection import Selection

    return Selection(
        workload=workload,
        metric=metric,
        goal=goal,
        maximize=maximize,
        max_trials=parse_max_trials(max_trials),
        step_budget=step_budget,
        example_budget=example_budget,
        statuses=tuple(statuses),
        studies=parse_studies(studies),
        mix_studies=mix_studies,
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


def bracket_text(result) -> str:
    """The resolution bracket of one result: ``(lower, steps]``, ``> censored_at`` or ``''``."""
    return _bracket(result.steps, result.steps_lower, result.censored_at)


def _bracket(steps, steps_lower, censored_at) -> str:
    if steps is not None:
        return f"({0 if steps_lower is None else steps_lower}, {steps}]"
    if censored_at is not None:
        return f"> {censored_at}"
    return ""


@analyze_app.command("steps-to-result")
def steps_to_result_command(
    store: Path = STORE,
    workload: str = WORKLOAD,
    metric: str = METRIC,
    goal: float = GOAL,
    maximize: bool = MAXIMIZE,
    max_trials: str = MAX_TRIALS_RULE,
    step_budget: int | None = STEP_BUDGET,
    example_budget: int | None = EXAMPLE_BUDGET,
    status: list[str] = STATUS,
    study: list[str] | None = STUDY,
    mix_studies: bool = MIX_STUDIES,
    as_json: bool = JSON,
) -> None:
    """Steps to result per batch size: the best trial's earliest evaluation step that beats the goal,
    with its resolution bracket (steps_lower, steps], or censored_at where no trial reached it."""
    from batchlab.analysis.metaparameters import search_edge_warnings
    from batchlab.analysis.steps_to_result import steps_to_result_many

    selection = make_selection(workload, metric, goal, maximize, max_trials, step_budget, example_budget, status,
                               study, mix_studies)
    con = connect_store(store)
    try:
        results = steps_to_result_many(con, [selection])[0]
        edges = search_edge_warnings(con, results)
    finally:
        con.close()
    if as_json:
        for result in results:
            print(json.dumps(result.to_dict() | {"search_edge": _edges_at(edges, result.batch_size)}))
        return
    from rich.console import Console
    from rich.table import Table

    comparison = ">" if maximize else "<"
    table = Table(title=f"{workload}: steps to {metric} {comparison} {goal:g}", caption=trials_caption(selection, results))
    columns = ("batch size", "steps", "bracket", "examples", "trial", "value", "learning rate", "momentum",
               "effective lr", "reached/trials")
    for column in columns:
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            str(r.batch_size),
            "not reached" if r.steps is None else str(r.steps),
            bracket_text(r),
            "" if r.steps is None else str(r.steps * r.batch_size),
            "" if r.trial_id is None else str(r.trial_id),
            _fmt(r.value),
            _fmt(r.learning_rate),
            _fmt(r.momentum),
            _fmt(r.effective_learning_rate),
            f"{r.n_reached}/{r.n_trials}",
        )
    console = Console(width=160, markup=False, highlight=False)
    console.print(table)
    for edge in edges:
        console.print(f"warning: {edge['message']}")


def _edges_at(edges: list[dict], batch_size: int) -> list[dict]:
    """The search-edge warnings of one batch size (docs/methods.md, "Search-edge warnings")."""
    return [e for e in edges if e["batch_size"] == batch_size]


@analyze_app.command("critical-batch-size")
def critical_batch_size_command(
    store: Path | None = typer.Option(None, "--store", help="Store directory (or give --steps-table)."),
    workload: str | None = typer.Option(None, "--workload", help="Workload as DATASET/MODEL/OPTIMIZER."),
    metric: str | None = typer.Option(None, "--metric", help="Metric name, e.g. val/classification_error."),
    goal: float | None = typer.Option(None, "--goal", help="Goal the metric must strictly beat."),
    maximize: bool = MAXIMIZE,
    max_trials: str = MAX_TRIALS_RULE,
    step_budget: int | None = STEP_BUDGET,
    example_budget: int | None = EXAMPLE_BUDGET,
    status: list[str] = STATUS,
    study: list[str] | None = STUDY,
    mix_studies: bool = MIX_STUDIES,
    n_boot: int = typer.Option(
        1000, "--bootstrap", min=1,
        help="Replicates of trials resampled per batch size (the regime shares, regime_fractions).",
    ),
    level: float = typer.Option(0.9, "--level", help="Interval coverage, in (0, 1)."),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed."),
    tolerance: float = typer.Option(
        0.1, "--tolerance", help="Tolerance of the regimes read from the data (docs/methods.md, \"Regimes\"), in (0, 1)."
    ),
    steps_table: Path | None = typer.Option(
        None, "--steps-table", metavar="FILE",
        help="Fit a plain table (CSV or Parquet: columns batch_size and steps, optional reached and budget) "
             "instead of a store.",
    ),
    group_by: str | None = typer.Option(None, "--group-by", metavar="COLUMN",
                                        help="With --steps-table: fit one curve per value of this column."),
    b0: float | None = typer.Option(
        None, "--b0", help="Batch size perfect scaling is measured from (a reached one; default: the smallest "
                           "reached). Give the same B0 to optimizers you compare."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (one object; one per group with --steps-table)."),
) -> None:
    """Fit S(B) = S_min + E_min/B (censored, bracket-weighted); named critical batch sizes with intervals;
    regimes read from the data; what each number rests on (docs/methods.md)."""
    from batchlab.analysis.regimes import check_tolerance

    check_tolerance(tolerance, "--tolerance")
    if steps_table is not None:
        given = [name for name, value in (("--store", store), ("--workload", workload), ("--metric", metric),
                                          ("--goal", goal), ("--study", study)) if value]
        if given:
            raise BatchlabError(f"--steps-table fits the table alone; leave out {', '.join(given)}")
        _critical_batch_size_table(steps_table, group_by, tolerance, as_json, b0)
        return
    if group_by is not None:
        raise BatchlabError("--group-by needs --steps-table FILE")
    missing = [name for name, value in (("--store", store), ("--workload", workload), ("--metric", metric),
                                        ("--goal", goal)) if value is None]
    if missing:
        raise BatchlabError(f"missing {', '.join(missing)} (or give --steps-table FILE)")
    from batchlab.analysis.bootstrap import critical_batch_size_with_intervals
    from batchlab.analysis.metaparameters import search_edge_warnings
    from batchlab.analysis.steps_to_result import steps_to_result_many

    selection = make_selection(workload, metric, goal, maximize, max_trials, step_budget, example_budget, status,
                               study, mix_studies)
    con = connect_store(store)
    try:
        results = steps_to_result_many(con, [selection])[0]  # checks the selection and its studies first
        estimate = critical_batch_size_with_intervals(con, selection, n_boot=n_boot, level=level, seed=seed,
                                                      tolerance=tolerance, b0=b0)
        edges = search_edge_warnings(con, results)
    finally:
        con.close()
    summary = {"selection": selection.describe() | trials_description(selection, results)} | estimate.to_dict()
    summary["brackets"] = [
        {"batch_size": r.batch_size, "steps": r.steps, "steps_lower": r.steps_lower, "censored_at": r.censored_at,
         "n_trials": r.n_trials, "n_reached": r.n_reached, "study_ids": r.study_ids,
         "search_edge": _edges_at(edges, r.batch_size)}
        for r in results
    ]
    if as_json:
        print(json.dumps(_jsonable(summary)))
        return
    _print_critical_batch_size(_jsonable(summary, keep_infinite=True), trials_caption(selection, results))


def _critical_batch_size_table(path: Path, group_by: str | None, tolerance: float, as_json: bool,
                               b0: float | None = None) -> None:
    """``--steps-table``: fit each group of a plain steps table (batchlab.analysis.steps_table)."""
    if not Path(path).is_file():
        raise BatchlabError(f"steps table {str(path)!r} does not exist or is not a file")
    from batchlab.analysis.steps_table import fit_steps_table

    groups = fit_steps_table(path, group_by=group_by, tolerance=tolerance, b0=b0)
    if as_json:
        for g in groups:
            print(json.dumps(_jsonable(dict(g))))
        return
    rows = [_jsonable(dict(g), keep_infinite=True) for g in groups]  # inf prints as inf, not as blank
    from rich.console import Console
    from rich.table import Table

    columns = ("group", "s_min", "e_min", "mccandlish_b_crit", "overhead_20pct", "perfect_scaling_end",
               "maximal_parallelism_start", "residual")
    table = Table(title=f"{path}: S(B) = S_min + E_min / B per {'group' if group_by is None else group_by} "
                        f"(tolerance {tolerance:g})")
    for column in columns:
        table.add_column(column, justify="left" if column == "group" else "right")
    # what each fit rests on (docs/methods.md, "What a critical batch size rests on")
    for column in ("b0", "measured B", "points", "extrapolated"):
        table.add_column(column, justify="right")
    for row in rows:
        span = row.get("batch_size_range")
        span_text = (f"{_cell(span[0])}..{_cell(span[1])}" if isinstance(span, (list, tuple)) and len(span) == 2
                     else "")
        table.add_row(*(_cell(_plain_value(row.get(c))) for c in columns),
                      _cell(row.get("b0")), span_text, _cell(row.get("points_used")),
                      "" if row.get("error") else _cell(row.get("extrapolated")))
    console = Console(width=200, markup=False, highlight=False)
    console.print(table)
    for row in rows:
        where = "" if row.get("group") is None else f" ({row.get('group')})"
        if row.get("error"):
            console.print(f"error{where}: {row['error']}")
        for warning in row.get("warnings") or []:
            console.print(f"warning{where}: {warning}")


def _print_critical_batch_size(summary: dict, caption: str = "") -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160, markup=False, highlight=False)
    fit = summary.get("fit") or {}
    boot = summary.get("bootstrap") or {}
    residual = fit.get("rms_log_residual")
    console.print(
        f"{summary.get('label', '')}: S(B) = S_min + E_min / B with S_min = {_fmt(fit.get('s_min'))}, "
        f"E_min = {_fmt(fit.get('e_min'))} ({fit.get('n_points')} reached batch sizes, "
        f"{fit.get('n_censored', 0)} censored; rms log residual {_fmt(residual)})"
    )
    rests = _rests_on(summary, fit)
    if rests:
        console.print("rests on: " + "; ".join(rests))
    if caption:
        console.print(caption)
    if boot:
        extra = ", ".join(f"{k} {_cell(v)}" for k, v in boot.items() if k not in ("level",))
        console.print(f"intervals: {extra}" if extra else "intervals:")
    level = boot.get("level")
    title = "critical batch sizes" + (f" ({100 * level:g}% intervals)" if isinstance(level, (int, float)) else "")
    table = Table(title=title)
    for column in ("name", "value", "low", "high", "source", "definition"):
        table.add_column(column, justify="left" if column in ("name", "source", "definition") else "right")
    named = {**(summary.get("fit_intervals") or {}), **(summary.get("critical_batch_sizes") or {})}
    for name, row in named.items():
        if not isinstance(row, dict):
            row = {"value": row}
        low, high = _interval(row)
        notes = [n for n in (row.get("reason"), (row.get("interval") or {}).get("note")
                             if isinstance(row.get("interval"), dict) else None) if n]
        definition = row.get("definition", "fit parameter")
        table.add_row(name, _fmt(row.get("value")), _fmt(low), _fmt(high), str(row.get("source") or ""),
                      definition + "".join(f" ({n})" for n in notes))
    console.print(table)
    methods: dict[tuple, list[str]] = {}
    for name, row in named.items():
        interval = row.get("interval") if isinstance(row, dict) else None
        if isinstance(interval, dict) and (interval.get("target") or interval.get("method")):
            methods.setdefault((interval.get("target"), interval.get("method")), []).append(name)
    for (target, method), names in methods.items():
        console.print(f"interval of {', '.join(names)}: for {target or '?'}; {method or ''}".rstrip("; "))
    s_min = summary.get("s_min")
    if isinstance(s_min, dict):
        measured = s_min.get("measured")
        measured_value = measured.get("value") if isinstance(measured, dict) else measured
        if isinstance(measured, dict) and measured.get("plateau_seen") is False:
            # no plateau of two measured batch sizes: the smallest measured S is only an upper bound on it
            where = f" at B = {measured['batch_size']}" if measured.get("batch_size") is not None else ""
            console.print(f"S_min: fit {_fmt(s_min.get('fit'))}, smallest measured steps {_fmt(measured_value)}{where} "
                          "(no plateau seen: an upper bound on the plateau)")
        else:
            console.print(f"S_min: fit {_fmt(s_min.get('fit'))}, measured plateau {_fmt(measured_value)}")
    rows = summary.get("regimes") or []
    if rows:
        regimes = Table(title=f"regimes (tolerance {_cell(summary.get('tolerance'))})")
        for column in ("batch size", "steps", "bracket", "regime (data)", "regime (fit)", "steps interval"):
            regimes.add_column(column, justify="right")
        for row in rows:
            steps = row.get("steps")
            interval = row.get("steps_interval")
            interval_text = ""
            if isinstance(interval, (list, tuple)) and len(interval) == 2:
                low, high = interval
                interval_text = f"[{'-' if low is None else low}, {'not reached' if high is None else high}]"
            regimes.add_row(
                str(row.get("batch_size")),
                "not reached" if steps is None else str(steps),
                _bracket(steps, row.get("steps_lower"), row.get("censored_at")),
                str(row.get("regime") or ""),
                str(row.get("fit_regime") or ""),
                interval_text,
            )
        console.print(regimes)
        first = rows[0]
        if first.get("steps_interval_target") or first.get("steps_interval_method"):
            # the note differs per batch size (e.g. "unbounded" where the k-th best trial never reached
            # the goal): print the most common one for all, the others with their batch sizes
            notes: dict[str, list] = {}
            for row in rows:
                if row.get("steps_interval_note"):
                    notes.setdefault(row["steps_interval_note"], []).append(row.get("batch_size"))
            common = max(notes, key=lambda n: len(notes[n])) if notes else ""
            parts = [f"for the {first.get('steps_interval_target')}" if first.get("steps_interval_target") else "",
                     first.get("steps_interval_method") or "", common]
            console.print("steps interval: " + "; ".join(p for p in parts if p))
            for note, batch_sizes in notes.items():
                if note != common:
                    console.print(f"steps interval at B = {', '.join(str(b) for b in batch_sizes)}: {note}")
    for warning in _warnings(summary, fit):
        console.print(f"warning: {warning}")


def _rests_on(summary: dict, fit: dict) -> list[str]:
    """The 'rests on' facts: measured batch-size range, points used, B0, censored points, extrapolation."""
    out = []
    span = summary.get("batch_size_range")
    if span is None and fit.get("smallest_batch_size") is not None:
        span = [fit.get("smallest_batch_size"), fit.get("largest_batch_size")]
    if isinstance(span, (list, tuple)) and len(span) == 2:
        out.append(f"measured batch sizes {_cell(span[0])}..{_cell(span[1])}")
    points = summary.get("points_used", fit.get("n_points"))
    if points is not None:
        out.append(f"{points} points used")
    censored = summary.get("censored_batch_sizes")
    if censored:
        out.append(f"censored at B = {', '.join(str(b) for b in censored)}")
    b0 = summary.get("b0", fit.get("b0"))
    if b0:
        out.append(f"B0 = {_cell(b0)}")
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


def _jsonable(value, keep_infinite: bool = False):
    """``value`` with non-finite floats as ``None`` and numpy scalars and tuples as plain JSON types.

    ``keep_infinite`` keeps +-inf (for text tables, where B_crit = inf must not read as unknown)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v, keep_infinite) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, keep_infinite) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (TypeError, ValueError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return value if keep_infinite and math.isinf(value) else None
    return value


def _plain_value(value):
    """A cell value from a field that may be a ``{"value": ...}`` dict."""
    if isinstance(value, dict) and "value" in value:
        return value["value"]
    return value


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return _fmt(value)
    return str(value)


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    return f"{value:.4g}"


def register(app: typer.Typer) -> None:
    """Add the ``analyze`` group to the main app."""
    app.add_typer(analyze_app, name="analyze")
