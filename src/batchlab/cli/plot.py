"""Command group ``plot``: the Shallue et al. figure types from a measurement store, one command each.

Every command reads ``--store DIR``, computes with :mod:`batchlab.analysis` and writes one figure to
``--out FILE`` (``.png``, ``.pdf`` or ``.svg``; written atomically), then prints the path.

* ``steps-to-result``: steps to result on log2 axes with perfect scaling and the fitted S(B).
* ``compare-workloads``: several ``--workload`` curves, normalised at a reference batch size.
* ``goals``: several ``--goal`` values on one workload.
* ``metaparameters``: optimal learning rate, 1 - momentum, effective learning rate, with heuristics.
* ``lr-momentum``: all trials in the (learning rate, 1 - momentum) plane, per batch size.
* ``best-measurement``: best metric against batch size, one line per step or example budget.
"""

from __future__ import annotations

from pathlib import Path

import typer

from batchlab.cli.analyze import (
    EXAMPLE_BUDGET,
    GOAL,
    MAX_TRIALS,
    MAXIMIZE,
    METRIC,
    STATUS,
    STEP_BUDGET,
    STORE,
    WORKLOAD,
    connect_store,
    make_selection,
)
from batchlab.errors import BatchlabError

plot_app = typer.Typer(
    help="Draw the Shallue et al. figure types from a store (PNG, PDF or SVG).",
    no_args_is_help=True,
    rich_markup_mode=None,
)

OUT = typer.Option(..., "--out", help="Figure file to write (.png, .pdf or .svg).")
FIT = typer.Option(True, "--fit/--no-fit", help="Draw the fitted S(B) = S_min + E_min / B.")


@plot_app.command("steps-to-result")
def steps_to_result_plot(
    store: Path = STORE,
    workload: str = WORKLOAD,
    metric: str = METRIC,
    goal: float = GOAL,
    maximize: bool = MAXIMIZE,
    max_trials: int | None = MAX_TRIALS,
    step_budget: int | None = STEP_BUDGET,
    example_budget: int | None = EXAMPLE_BUDGET,
    status: list[str] = STATUS,
    fit: bool = FIT,
    n_boot: int = typer.Option(0, "--bootstrap", min=0,
                               help="Draw bootstrap intervals of the steps from N replicates (0: none)."),
    level: float = typer.Option(0.9, "--level", help="Interval coverage, in (0, 1)."),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed."),
    out: Path = OUT,
) -> None:
    """Steps to result against batch size (log2 axes), perfect-scaling line and fitted S(B)."""
    from batchlab.plots.shallue import check_figure_path, save_figure, steps_to_result_figure

    check_figure_path(out)
    selection = make_selection(workload, metric, goal, maximize, max_trials, step_budget, example_budget, status)
    curves = _curves([selection], labels=[workload], store=store)
    intervals = None
    if n_boot:
        from batchlab.analysis.bootstrap import critical_batch_size_with_intervals

        con = connect_store(store)
        try:
            estimate = critical_batch_size_with_intervals(con, selection, n_boot=n_boot, level=level, seed=seed)
        finally:
            con.close()
        intervals = [[tuple(row["steps_interval"]) for row in estimate.regimes]]
    figure = steps_to_result_figure(
        curves, fits=_fits(curves) if fit else None, title=_title(selection), intervals=intervals
    )
    print(save_figure(figure, out))


@plot_app.command("compare-workloads")
def compare_workloads_plot(
    store: Path = STORE,
    workloads: list[str] = typer.Option(..., "--workload", help="A workload; repeat for each curve."),
    metrics: list[str] = typer.Option(..., "--metric", help="One metric for all, or one per --workload."),
    goals: list[float] = typer.Option(..., "--goal", help="One goal for all, or one per --workload."),
    maximize: bool = MAXIMIZE,
    max_trials: int | None = MAX_TRIALS,
    step_budget: int | None = STEP_BUDGET,
    example_budget: int | None = EXAMPLE_BUDGET,
    status: list[str] = STATUS,
    reference_batch_size: int | None = typer.Option(
        None, "--reference-batch-size", min=1,
        help="Normalise every curve by its steps here (default: each curve's smallest reached batch size).",
    ),
    fit: bool = FIT,
    out: Path = OUT,
) -> None:
    """Steps-to-result curves of several workloads, normalised to compare their shapes."""
    from batchlab.plots.shallue import check_figure_path, compare_workloads_figure, save_figure

    check_figure_path(out)
    metrics = _one_or_each("--metric", metrics, len(workloads))
    goals = _one_or_each("--goal", goals, len(workloads))
    selections = [
        make_selection(w, m, g, maximize, max_trials, step_budget, example_budget, status)
        for w, m, g in zip(workloads, metrics, goals)
    ]
    labels = [f"{w} ({m} {'>' if maximize else '<'} {g:g})" for w, m, g in zip(workloads, metrics, goals)]
    curves = _curves(selections, labels=labels, store=store)
    figure = compare_workloads_figure(
        curves, fits=_fits(curves) if fit else None, reference_batch_size=reference_batch_size,
        title="steps to result, normalised",
    )
    print(save_figure(figure, out))


@plot_app.command("goals")
def goals_plot(
    store: Path = STORE,
    workload: str = WORKLOAD,
    metric: str = METRIC,
    goals: list[float] = typer.Option(..., "--goal", help="A goal; repeat for each curve."),
    maximize: bool = MAXIMIZE,
    max_trials: int | None = MAX_TRIALS,
    step_budget: int | None = STEP_BUDGET,
    example_budget: int | None = EXAMPLE_BUDGET,
    status: list[str] = STATUS,
    fit: bool = FIT,
    out: Path = OUT,
) -> None:
    """Steps to result for several goals on one workload."""
    from batchlab.plots.shallue import check_figure_path, goals_figure, save_figure

    check_figure_path(out)
    selections = [
        make_selection(workload, metric, g, maximize, max_trials, step_budget, example_budget, status) for g in goals
    ]
    labels = [f"{metric} {'>' if maximize else '<'} {g:g}" for g in goals]
    curves = _curves(selections, labels=labels, store=store)
    print(save_figure(goals_figure(curves, fits=_fits(curves) if fit else None, title=workload), out))


@plot_app.command("metaparameters")
def metaparameters_plot(
    store: Path = STORE,
    workload: str = WORKLOAD,
    metric: str = METRIC,
    goal: float = GOAL,
    maximize: bool = MAXIMIZE,
    max_trials: int | None = MAX_TRIALS,
    step_budget: int | None = STEP_BUDGET,
    example_budget: int | None = EXAMPLE_BUDGET,
    status: list[str] = STATUS,
    out: Path = OUT,
) -> None:
    """The best trial's learning rate, 1 - momentum and effective learning rate against batch size."""
    from batchlab.analysis.metaparameters import optimal_metaparameters
    from batchlab.analysis.steps_to_result import steps_to_result_many
    from batchlab.plots.shallue import check_figure_path, metaparameters_figure, save_figure

    check_figure_path(out)
    selection = make_selection(workload, metric, goal, maximize, max_trials, step_budget, example_budget, status)
    con = connect_store(store)
    try:
        results = steps_to_result_many(con, [selection])[0]
    finally:
        con.close()
    print(save_figure(metaparameters_figure(optimal_metaparameters(results), title=_title(selection)), out))


@plot_app.command("lr-momentum")
def lr_momentum_plot(
    store: Path = STORE,
    workload: str = WORKLOAD,
    metric: str = METRIC,
    goal: float = GOAL,
    maximize: bool = MAXIMIZE,
    max_trials: int | None = MAX_TRIALS,
    step_budget: int | None = STEP_BUDGET,
    example_budget: int | None = EXAMPLE_BUDGET,
    status: list[str] = STATUS,
    batch_sizes: list[int] = typer.Option(None, "--batch-size", help="A batch size to show; repeat (default: all)."),
    out: Path = OUT,
) -> None:
    """Every trial in the (learning rate, 1 - momentum) plane: reached, not reached, diverged."""
    from batchlab.analysis.metaparameters import trial_outcomes
    from batchlab.plots.shallue import check_figure_path, lr_momentum_scatter_figure, save_figure

    check_figure_path(out)
    selection = make_selection(workload, metric, goal, maximize, max_trials, step_budget, example_budget, status)
    con = connect_store(store)
    try:
        outcomes = trial_outcomes(con, selection)
    finally:
        con.close()
    figure = lr_momentum_scatter_figure(outcomes, batch_sizes=batch_sizes or None, title=_title(selection))
    print(save_figure(figure, out))


@plot_app.command("best-measurement")
def best_measurement_plot(
    store: Path = STORE,
    workload: str = WORKLOAD,
    metric: str = METRIC,
    maximize: bool = MAXIMIZE,
    max_trials: int | None = MAX_TRIALS,
    step_budgets: list[int] = typer.Option(None, "--step-budget", min=1, help="A step budget; repeat for each line."),
    example_budgets: list[int] = typer.Option(None, "--example-budget", min=1, help="An example budget; repeat for each line."),
    status: list[str] = STATUS,
    out: Path = OUT,
) -> None:
    """Best measurement against batch size, one line per budget (give step or example budgets)."""
    from batchlab.analysis.budgets import best_measurement_by_budget
    from batchlab.plots.shallue import best_measurement_figure, check_figure_path, save_figure

    check_figure_path(out)
    if bool(step_budgets) == bool(example_budgets):
        raise BatchlabError("give budgets of one kind: one or more --step-budget, or one or more --example-budget")
    kind, budgets = ("step", step_budgets) if step_budgets else ("example", example_budgets)
    con = connect_store(store)
    try:
        sweep = best_measurement_by_budget(
            con, workload, metric, budgets, kind=kind, maximize=maximize, max_trials=max_trials, statuses=tuple(status)
        )
    finally:
        con.close()
    print(save_figure(best_measurement_figure(sweep, metric, title=workload), out))


def _curves(selections, labels, store: Path):
    """One StepsCurve per selection, answered in one query."""
    from batchlab.analysis.steps_to_result import steps_curve, steps_to_result_many

    con = connect_store(store)
    try:
        per_selection = steps_to_result_many(con, selections)
    finally:
        con.close()
    return [
        steps_curve(results, label=label, metadata=selection.describe())
        for results, label, selection in zip(per_selection, labels, selections)
    ]


def _fits(curves):
    """The S(B) fit of each curve, or None where fewer than two batch sizes reached the goal."""
    from batchlab.analysis.critical_batch_size import fit_steps_curve

    fits = []
    for curve in curves:
        try:
            fits.append(fit_steps_curve(curve))
        except BatchlabError:
            fits.append(None)
    return fits


def _one_or_each(flag: str, values: list, count: int) -> list:
    if len(values) == 1:
        return values * count
    if len(values) != count:
        raise BatchlabError(f"give {flag} once, or once per --workload ({count}); got {len(values)}")
    return values


def _title(selection) -> str:
    comparison = ">" if selection.maximize else "<"
    return f"{selection.workload}: {selection.metric} {comparison} {selection.goal:g}"


def register(app: typer.Typer) -> None:
    """Add the ``plot`` group to the main app."""
    app.add_typer(plot_app, name="plot")
