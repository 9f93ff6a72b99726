"""Command group ``analyze``: steps to result and critical batch size from a measurement store.

``batchlab analyze steps-to-result --store DIR --workload DATASET/MODEL/OPTIMIZER --metric M --goal G
[--maximize] [--max-trials N] [--step-budget S] [--example-budget E] [--status COMPLETE ...] --json``
prints one JSON object per batch size; ``batchlab analyze critical-batch-size`` with the same
selection prints the S(B) fit and each named critical batch size with its bootstrap interval.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

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
MAX_TRIALS = typer.Option(None, "--max-trials", min=1, help="Use only the first N trials (trial-id order) per batch size.")
STEP_BUDGET = typer.Option(None, "--step-budget", min=1, help="Keep measurements with step <= N.")
EXAMPLE_BUDGET = typer.Option(None, "--example-budget", min=1, help="Keep measurements with batch_size * step <= N.")
STATUS = typer.Option(["COMPLETE"], "--status", help="Trial statuses to analyse (repeat to add); default COMPLETE.")
JSON = typer.Option(False, "--json", help="Print JSON objects, one per line.")


def connect_store(store: Path):
    """A DuckDB connection with the four store views (BatchlabError if ``store`` is not a store)."""
    from batchlab.store import Store

    return Store.open(store, create=False).connect()


def make_selection(workload, metric, goal, maximize, max_trials, step_budget, example_budget, statuses):
    """The :class:`~batchlab.analysis.selection.Selection` the options describe."""
    from batchlab.analysis.selection import Selection

    return Selection(
        workload=workload,
        metric=metric,
        goal=goal,
        maximize=maximize,
        max_trials=max_trials,
        step_budget=step_budget,
        example_budget=example_budget,
        statuses=tuple(statuses),
    )


@analyze_app.command("steps-to-result")
def steps_to_result_command(
    store: Path = STORE,
    workload: str = WORKLOAD,
    metric: str = METRIC,
    goal: float = GOAL,
    maximize: bool = MAXIMIZE,
    max_trials: int | None = MAX_TRIALS,
    step_budget: int | None = STEP_BUDGET,
    example_budget: int | None = EXAMPLE_BUDGET,
    status: list[str] = STATUS,
    as_json: bool = JSON,
) -> None:
    """Steps to result per batch size: the best trial's earliest evaluation step that beats the goal."""
    from batchlab.analysis.steps_to_result import steps_to_result_many

    selection = make_selection(workload, metric, goal, maximize, max_trials, step_budget, example_budget, status)
    con = connect_store(store)
    try:
        results = steps_to_result_many(con, [selection])[0]
    finally:
        con.close()
    if as_json:
        for result in results:
            print(json.dumps(result.to_dict()))
        return
    from rich.console import Console
    from rich.table import Table

    comparison = ">" if maximize else "<"
    table = Table(title=f"{workload}: steps to {metric} {comparison} {goal:g}")
    for column in ("batch size", "steps", "examples", "trial", "value", "learning rate", "momentum", "effective lr", "reached/trials"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            str(r.batch_size),
            "not reached" if r.steps is None else str(r.steps),
            "" if r.steps is None else str(r.steps * r.batch_size),
            "" if r.trial_id is None else str(r.trial_id),
            _fmt(r.value),
            _fmt(r.learning_rate),
            _fmt(r.momentum),
            _fmt(r.effective_learning_rate),
            f"{r.n_reached}/{r.n_trials}",
        )
    Console(width=160, markup=False, highlight=False).print(table)


@analyze_app.command("critical-batch-size")
def critical_batch_size_command(
    store: Path = STORE,
    workload: str = WORKLOAD,
    metric: str = METRIC,
    goal: float = GOAL,
    maximize: bool = MAXIMIZE,
    max_trials: int | None = MAX_TRIALS,
    step_budget: int | None = STEP_BUDGET,
    example_budget: int | None = EXAMPLE_BUDGET,
    status: list[str] = STATUS,
    n_boot: int = typer.Option(1000, "--bootstrap", min=1, help="Bootstrap replicates (trials resampled per batch size)."),
    level: float = typer.Option(0.9, "--level", help="Interval coverage, in (0, 1)."),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed."),
    tolerance: float = typer.Option(0.1, "--tolerance", help="Regime tolerance (science.md 5), in (0, 1)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Fit S(B) = S_min + E_min/B; named critical batch sizes with bootstrap intervals; regimes."""
    from batchlab.analysis.bootstrap import critical_batch_size_with_intervals

    selection = make_selection(workload, metric, goal, maximize, max_trials, step_budget, example_budget, status)
    con = connect_store(store)
    try:
        estimate = critical_batch_size_with_intervals(con, selection, n_boot=n_boot, level=level, seed=seed, tolerance=tolerance)
    finally:
        con.close()
    summary = {"selection": selection.describe()} | estimate.to_dict()
    if as_json:
        print(json.dumps(summary))
        return
    _print_critical_batch_size(summary)


def _print_critical_batch_size(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160, markup=False, highlight=False)
    fit, boot = summary["fit"], summary["bootstrap"]
    pct = f"{100 * boot['level']:g}%"
    console.print(
        f"{summary['label']}: S(B) = S_min + E_min / B with S_min = {_fmt(fit['s_min'])}, E_min = {_fmt(fit['e_min'])} "
        f"({fit['n_points']} reached batch sizes, rms log residual {_fmt(fit['rms_log_residual'])}); "
        f"bootstrap: {boot['n_boot']} replicates, {boot['n_failed']} failed fits, seed {boot['seed']}"
    )
    table = Table(title=f"critical batch sizes ({pct} percentile intervals)")
    for column in ("name", "value", "low", "high", "definition"):
        table.add_column(column, justify="left" if column in ("name", "definition") else "right")
    for name, row in {**summary["fit_intervals"], **summary["critical_batch_sizes"]}.items():
        table.add_row(name, _fmt(row["value"]), _fmt(row["low"]), _fmt(row["high"]), row.get("definition", "fit parameter"))
    console.print(table)
    regimes = Table(title=f"regimes (tolerance {summary['tolerance']:g})")
    for column in ("batch size", "steps", "steps interval", "regime", "share of replicates"):
        regimes.add_column(column, justify="right")
    for row in summary["regimes"]:
        low, high = row["steps_interval"]
        share = row["regime_fractions"].get(row["regime"])
        regimes.add_row(
            str(row["batch_size"]),
            "not reached" if row["steps"] is None else str(row["steps"]),
            f"[{'-' if low is None else low}, {'not reached' if high is None else high}]",
            row["regime"],
            "" if share is None else f"{share:.2f}",
        )
    console.print(regimes)


def _fmt(value) -> str:
    if value is None:
        return ""
    return f"{value:.4g}"


def register(app: typer.Typer) -> None:
    """Add the ``analyze`` group to the main app."""
    app.add_typer(analyze_app, name="analyze")
