"""Command group ``plot``: the Shallue et al. figure types from a measurement store, one command each.

Every command reads ``--store DIR``, computes with :mod:`batchlab.analysis` and writes one figure to
``--out FILE`` (``.png``, ``.pdf`` or ``.svg``; written atomically), then prints the path. The trial
selection options are those of ``batchlab analyze`` (``--status``, ``--max-trials N|all|auto``,
``--study ID``, ``--mix-studies``, budgets; docs/methods.md), so a figure shows the same numbers.

* ``steps-to-result``: steps to result on log2 axes with resolution brackets, censored batch sizes at
  their bound, perfect scaling from B0, the fitted S(B) and the regimes read from the data.
* ``compare-workloads``: several ``--workload`` curves, normalised at a reference batch size.
* ``goals``: several ``--goal`` values on one workload.
* ``metaparameters``: optimal learning rate, 1 - momentum, effective learning rate, with heuristics;
  best trials at the edge of their searched range are marked (and listed on stderr).
* ``lr-momentum``: all trials in the (learning rate, 1 - momentum) plane, per batch size.
* ``best-measurement``: best metric against batch size, one line per step or example budget.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from batchlab.cli import options as opt
from batchlab.cli.analyze import trials_caption
from batchlab.cli.options import connect_store, make_selection, parse_max_trials, parse_studies
from batchlab.cli.output import line, note
from batchlab.errors import BatchlabError

plot_app = typer.Typer(
    help="Draw the Shallue et al. figure types from a store (PNG, PDF or SVG).",
    no_args_is_help=True,
    rich_markup_mode=None,
)

Goals = Annotated[list[float], typer.Option("--goal", help="A goal; repeat for each curve.")]


@plot_app.command("steps-to-result")
def steps_to_result_plot(
    store: opt.Store,
    out: opt.FigureOut,
    workload: opt.StoreWorkload,
    metric: opt.Metric,
    goal: opt.Goal,
    maximize: opt.Maximize = False,
    max_trials: opt.MaxTrials = "auto",
    studies: opt.Studies = None,
    mix_studies: opt.MixStudies = False,
    step_budget: opt.StepBudget = None,
    example_budget: opt.ExampleBudget = None,
    status: opt.Statuses = opt.DEFAULT_STATUSES,
    fit: opt.Fit = True,
    n_boot: Annotated[int, typer.Option(
        "--bootstrap", min=0,
        help="Draw the interval of the steps at each batch size (a one-sided upper bound on the median "
             "best-of-K steps; docs/methods.md, \"Intervals\"), with N resampling replicates (0: no intervals).",
    )] = 0,
    level: opt.Level = 0.9,
    seed: Annotated[int, typer.Option("--seed", help="Resampling seed (an integer >= 0).")] = 0,
    tolerance: opt.Tolerance = 0.1,
) -> None:
    """Steps to result against batch size (log2 axes): resolution brackets as error bars, unreached
    batch sizes at their censoring bound with an upward arrow, the perfect-scaling line from B0, the
    fitted S(B) (labelled as a fit) and the regimes read from the data, shaded (docs/methods.md)."""
    from batchlab.plots.axes import check_figure_path, save_figure
    from batchlab.plots.shallue import steps_to_result_figure

    check_figure_path(out)
    from batchlab.analysis.regimes import check_tolerance

    check_tolerance(tolerance, "--tolerance")
    selection = make_selection(
        workload, metric, goal, maximize, max_trials, step_budget, example_budget, status, studies, mix_studies
    )
    curves, (results,) = _curves([selection], labels=[workload], store=store, with_results=True)
    intervals = None
    if n_boot:
        from batchlab.analysis.bootstrap import critical_batch_size_with_intervals

        con = connect_store(store)
        try:
            estimate = critical_batch_size_with_intervals(
                con, selection, n_boot=n_boot, level=level, seed=seed, tolerance=tolerance
            )
        finally:
            con.close()
        intervals = [[_interval(row.get("steps_interval")) for row in estimate.regimes]]
    figure = steps_to_result_figure(
        curves, fits=_fits(curves) if fit else None, title=_title(selection), intervals=intervals,
        tolerance=tolerance, interval_label=f"one-sided {level:.0%} upper bound on the median best-of-K steps",
        caption=trials_caption(selection, results),
    )
    line(save_figure(figure, out))
    for warning in _curve_warnings(curves[0], tolerance):
        note(f"warning: {warning}")


@plot_app.command("compare-workloads")
def compare_workloads_plot(
    store: opt.Store,
    out: opt.FigureOut,
    workloads: Annotated[list[str], typer.Option("--workload", help="A workload; repeat for each curve.")],
    metrics: Annotated[list[str], typer.Option("--metric", help="One metric for all, or one per --workload.")],
    goals: Annotated[list[float], typer.Option("--goal", help="One goal for all, or one per --workload.")],
    maximize: opt.Maximize = False,
    max_trials: opt.MaxTrials = "auto",
    studies: opt.Studies = None,
    mix_studies: opt.MixStudies = False,
    step_budget: opt.StepBudget = None,
    example_budget: opt.ExampleBudget = None,
    status: opt.Statuses = opt.DEFAULT_STATUSES,
    reference_batch_size: Annotated[Optional[int], typer.Option(
        "--reference-batch-size", min=1,
        help="Normalise every curve by its steps here (default: each curve's smallest reached batch size).",
    )] = None,
    fit: opt.Fit = True,
) -> None:
    """Steps-to-result curves of several workloads, normalised to compare their shapes."""
    from batchlab.plots.axes import check_figure_path, save_figure
    from batchlab.plots.shallue import compare_workloads_figure

    check_figure_path(out)
    metrics = _one_or_each("--metric", metrics, len(workloads))
    goals = _one_or_each("--goal", goals, len(workloads))
    selections = [
        make_selection(w, m, g, maximize, max_trials, step_budget, example_budget, status, studies, mix_studies)
        for w, m, g in zip(workloads, metrics, goals)
    ]
    labels = [f"{w} ({m} {'>' if maximize else '<'} {g:g})" for w, m, g in zip(workloads, metrics, goals)]
    curves = _curves(selections, labels=labels, store=store)
    figure = compare_workloads_figure(
        curves, fits=_fits(curves) if fit else None, reference_batch_size=reference_batch_size,
        title="steps to result, normalised",
    )
    line(save_figure(figure, out))


@plot_app.command("goals")
def goals_plot(
    store: opt.Store,
    out: opt.FigureOut,
    workload: opt.StoreWorkload,
    metric: opt.Metric,
    goals: Goals,
    maximize: opt.Maximize = False,
    max_trials: opt.MaxTrials = "auto",
    studies: opt.Studies = None,
    mix_studies: opt.MixStudies = False,
    step_budget: opt.StepBudget = None,
    example_budget: opt.ExampleBudget = None,
    status: opt.Statuses = opt.DEFAULT_STATUSES,
    fit: opt.Fit = True,
) -> None:
    """Steps to result for several goals on one workload."""
    from batchlab.plots.axes import check_figure_path, save_figure
    from batchlab.plots.shallue import goals_figure

    check_figure_path(out)
    selections = [
        make_selection(
            workload, metric, g, maximize, max_trials, step_budget, example_budget, status, studies, mix_studies
        )
        for g in goals
    ]
    labels = [f"{metric} {'>' if maximize else '<'} {g:g}" for g in goals]
    curves = _curves(selections, labels=labels, store=store)
    line(save_figure(goals_figure(curves, fits=_fits(curves) if fit else None, title=workload), out))


@plot_app.command("metaparameters")
def metaparameters_plot(
    store: opt.Store,
    out: opt.FigureOut,
    workload: opt.StoreWorkload,
    metric: opt.Metric,
    goal: opt.Goal,
    maximize: opt.Maximize = False,
    max_trials: opt.MaxTrials = "auto",
    studies: opt.Studies = None,
    mix_studies: opt.MixStudies = False,
    step_budget: opt.StepBudget = None,
    example_budget: opt.ExampleBudget = None,
    status: opt.Statuses = opt.DEFAULT_STATUSES,
) -> None:
    """The best trial's learning rate, 1 - momentum and effective learning rate against batch size.

    Points whose best trial lies in the outer 10% of a searched range (in the parameter's own scale;
    docs/methods.md, "Search-edge warnings") are ringed in the figure and listed on stderr."""
    from batchlab.analysis.metaparameters import optimal_metaparameters, search_edge_warnings
    from batchlab.analysis.steps_to_result import steps_to_result_many
    from batchlab.plots.axes import check_figure_path, save_figure
    from batchlab.plots.tuning import metaparameters_figure

    check_figure_path(out)
    selection = make_selection(
        workload, metric, goal, maximize, max_trials, step_budget, example_budget, status, studies, mix_studies
    )
    con = connect_store(store)
    try:
        results = steps_to_result_many(con, [selection])[0]
        edges = search_edge_warnings(con, results)
    finally:
        con.close()
    figure = metaparameters_figure(optimal_metaparameters(results, search_edges=edges), title=_title(selection),
                                   caption=trials_caption(selection, results))
    line(save_figure(figure, out))
    for warning in edges:
        note(f"warning: {warning['message']}")


@plot_app.command("lr-momentum")
def lr_momentum_plot(
    store: opt.Store,
    out: opt.FigureOut,
    workload: opt.StoreWorkload,
    metric: opt.Metric,
    goal: opt.Goal,
    maximize: opt.Maximize = False,
    max_trials: opt.MaxTrials = "auto",
    studies: opt.Studies = None,
    mix_studies: opt.MixStudies = False,
    step_budget: opt.StepBudget = None,
    example_budget: opt.ExampleBudget = None,
    status: opt.Statuses = opt.DEFAULT_STATUSES,
    batch_sizes: Annotated[Optional[list[int]], typer.Option(
        "--batch-size", help="A batch size to show; repeat (default: all).")] = None,
) -> None:
    """Every trial in the (learning rate, 1 - momentum) plane: reached, not reached, diverged.

    Each panel draws its searched range (dashed box) where the store records it, and rings the best
    trial in red where it lies in the outer 10% of its learning-rate or momentum range
    (docs/methods.md, "Search-edge warnings"); those warnings are also listed on stderr."""
    from batchlab.analysis.metaparameters import search_edge_warnings, searched_ranges, trial_outcomes
    from batchlab.analysis.steps_to_result import steps_to_result_many
    from batchlab.plots.axes import check_figure_path, save_figure
    from batchlab.plots.tuning import lr_momentum_scatter_figure

    check_figure_path(out)
    selection = make_selection(
        workload, metric, goal, maximize, max_trials, step_budget, example_budget, status, studies, mix_studies
    )
    con = connect_store(store)
    try:
        outcomes = trial_outcomes(con, selection)
        results = steps_to_result_many(con, [selection])[0]
        edges = search_edge_warnings(con, results)
        ranges = searched_ranges(con, results)
    finally:
        con.close()
    figure = lr_momentum_scatter_figure(outcomes, batch_sizes=batch_sizes or None, title=_title(selection),
                                        search_edges=edges, search_ranges=ranges,
                                        caption=trials_caption(selection, results))
    line(save_figure(figure, out))
    shown = set(batch_sizes) if batch_sizes else None
    for warning in edges:
        if shown is None or warning["batch_size"] in shown:
            note(f"warning: {warning['message']}")


@plot_app.command("best-measurement")
def best_measurement_plot(
    store: opt.Store,
    out: opt.FigureOut,
    workload: opt.StoreWorkload,
    metric: opt.Metric,
    maximize: opt.Maximize = False,
    max_trials: opt.MaxTrials = "auto",
    studies: opt.Studies = None,
    mix_studies: opt.MixStudies = False,
    step_budgets: Annotated[Optional[list[int]], typer.Option(
        "--step-budget", min=1, help="A step budget; repeat for each line.")] = None,
    example_budgets: Annotated[Optional[list[int]], typer.Option(
        "--example-budget", min=1, help="An example budget; repeat for each line.")] = None,
    status: opt.Statuses = opt.DEFAULT_STATUSES,
) -> None:
    """Best measurement against batch size, one line per budget (give step or example budgets)."""
    from batchlab.analysis.budgets import best_measurement_by_budget
    from batchlab.plots.axes import check_figure_path, save_figure
    from batchlab.plots.tuning import best_measurement_figure

    check_figure_path(out)
    if bool(step_budgets) == bool(example_budgets):
        raise BatchlabError("give budgets of one kind: one or more --step-budget, or one or more --example-budget")
    kind, budgets = ("step", step_budgets) if step_budgets else ("example", example_budgets)
    max_trials, studies = parse_max_trials(max_trials), parse_studies(studies)
    con = connect_store(store)
    try:
        sweep = best_measurement_by_budget(
            con, workload, metric, budgets, kind=kind, maximize=maximize, max_trials=max_trials,
            statuses=tuple(status), studies=studies, mix_studies=mix_studies,
        )
    finally:
        con.close()
    line(save_figure(best_measurement_figure(sweep, metric, title=workload), out))


def _curves(selections, labels, store: Path, with_results: bool = False):
    """One StepsCurve per selection, answered in one query (and the per-batch-size results)."""
    from batchlab.analysis.steps_to_result import steps_curve, steps_to_result_many

    con = connect_store(store)
    try:
        per_selection = steps_to_result_many(con, selections)
    finally:
        con.close()
    curves = [
        steps_curve(results, label=label, metadata=selection.describe())
        for results, label, selection in zip(per_selection, labels, selections)
    ]
    return (curves, per_selection) if with_results else curves


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


def _curve_warnings(curve, tolerance: float) -> list[str]:
    """What the drawn fit and regimes rest on, in words (two-point fits, extrapolated B_crit, regimes
    the data do not show); empty when the curve cannot be fitted."""
    from batchlab.analysis.critical_batch_size import summarize_curve

    try:
        return [str(w) for w in summarize_curve(curve, tolerance).get("warnings", [])]
    except BatchlabError:
        return []


def _interval(bounds) -> tuple:
    """A ``steps_interval`` as ``(low, high)``; ``(None, None)`` when absent."""
    if not bounds:
        return (None, None)
    low, high = bounds
    return (low, high)


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
