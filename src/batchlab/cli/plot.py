"""Command group ``plot``: the Shallue et al. figure types from a measurement store, one command each.

Every command reads ``--store DIR``, computes with :mod:`batchlab.analysis` and writes one figure to
``--out FILE`` (``.png``, ``.pdf`` or ``.svg``; written atomically), then prints the path. The trial
selection options are those of ``batchlab analyze`` (``--status``, ``--max-trials N|all|auto``,
``--study ID``, ``--mix-studies``, budgets; docs/methods.md), so a figure shows the same numbers:
one curve (steps to result, goals, compare-workloads) or one figure (the others) per unit, a workload
under one study group (docs/methods.md, "Units"), with the metric and goal defaulting to the unit's.

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

import re
from pathlib import Path
from typing import Annotated, Optional

import typer

from batchlab.cli import options as opt
from batchlab.cli.analyze import answer_units, answer_units_on, steps_to_unit_result, trials_caption
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
    optimizer: opt.StoreOptimizer = None,
    metric: opt.Metric = None,
    goal: opt.Goal = None,
    maximize: opt.Maximize = None,
    max_trials: opt.MaxTrials = "auto",
    studies: opt.Studies = None,
    mix_studies: opt.MixStudies = False,
    step_budget: opt.StepBudget = None,
    example_budget: opt.ExampleBudget = None,
    status: opt.Statuses = opt.DEFAULT_STATUSES,
    fit: opt.Fit = True,
    n_boot: Annotated[int, typer.Option(
        "--bootstrap", min=0, max=opt.MAX_BOOTSTRAP,
        help="Draw the interval of the steps at each batch size (a one-sided upper bound on the median "
             "best-of-K steps; docs/methods.md, \"Intervals\"), with N resampling replicates (0: no intervals).",
    )] = 0,
    level: opt.Level = 0.9,
    seed: opt.Seed = 0,
    tolerance: opt.Tolerance = 0.1,
) -> None:
    """Steps to result against batch size (log2 axes): resolution brackets as error bars, unreached
    batch sizes at their censoring bound with an upward arrow, the perfect-scaling line from B0, the
    fitted S(B) (labelled as a fit) and the regimes read from the data, shaded (docs/methods.md); one
    labelled curve per unit (workload and study group; docs/methods.md, "Units")."""
    from batchlab.analysis.regimes import check_tolerance
    from batchlab.plots.axes import check_figure_path, save_figure
    from batchlab.plots.shallue import steps_to_result_figure

    check_figure_path(out)
    check_tolerance(tolerance, "--tolerance")
    opt.check_level(level)
    opt.check_seed(seed)

    def answer(con, selection):
        results = steps_to_unit_result(con, selection)
        if not n_boot:
            return results, None
        from batchlab.analysis.bootstrap import critical_batch_size_with_intervals

        estimate = critical_batch_size_with_intervals(con, selection, n_boot=n_boot, level=level, seed=seed,
                                                      tolerance=tolerance)
        return results, [_interval(row.get("steps_interval")) for row in estimate.regimes]

    answers = answer_units(store, answer, workload, optimizer, metric, goal, maximize, max_trials, step_budget,
                           example_budget, status, studies, mix_studies)
    curves = _unit_curves(answers)
    figure = steps_to_result_figure(
        curves, fits=_fits(curves) if fit else None, title=_title(answers),
        intervals=[intervals for _, _, (_, intervals) in answers] if n_boot else None, tolerance=tolerance,
        interval_label=f"one-sided {level:.0%} upper bound on the median best-of-K steps",
        caption="; ".join(trials_caption(selection, results) for _, selection, (results, _) in answers),
    )
    line(save_figure(figure, out))
    for curve in curves:
        for warning in _curve_warnings(curve, tolerance):
            note(f"warning: {curve.label + ': ' if len(curves) > 1 else ''}{warning}")


@plot_app.command("compare-workloads")
def compare_workloads_plot(
    store: opt.Store,
    out: opt.FigureOut,
    workloads: Annotated[list[str], typer.Option("--workload", help="A workload; repeat for each curve. "
                                                 + opt.WORKLOAD_OPTION_HELP)],
    optimizer: opt.StoreOptimizer = None,
    metrics: Annotated[Optional[list[str]], typer.Option(
        "--metric", help="One metric for all, or one per --workload (default: each unit's goal).")] = None,
    goals: Annotated[Optional[list[float]], typer.Option(
        "--goal", help="One goal for all, or one per --workload (default: each unit's goal).")] = None,
    maximize: opt.Maximize = None,
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
    """Steps-to-result curves of several workloads (one per unit), normalised to compare their shapes."""
    from batchlab.plots.axes import check_figure_path, save_figure
    from batchlab.plots.shallue import compare_workloads_figure

    check_figure_path(out)
    metrics = _one_or_each("--metric", metrics or [None], len(workloads))
    goals = _one_or_each("--goal", goals or [None], len(workloads))
    answers = []
    con = opt.connect_store(store)  # opened and checked once for every workload
    try:
        for w, m, g in zip(workloads, metrics, goals):
            answers += answer_units_on(con, steps_to_unit_result, w, optimizer, m, g, maximize, max_trials,
                                       step_budget, example_budget, status, studies, mix_studies)
    finally:
        con.close()
    labels = [f"{_unit_label(unit, answers)} ({_goal_text(selection)})" for unit, selection, _ in answers]
    curves = _unit_curves(answers, labels)
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
    goals: Goals,
    optimizer: opt.StoreOptimizer = None,
    metric: opt.Metric = None,
    maximize: opt.Maximize = None,
    max_trials: opt.MaxTrials = "auto",
    studies: opt.Studies = None,
    mix_studies: opt.MixStudies = False,
    step_budget: opt.StepBudget = None,
    example_budget: opt.ExampleBudget = None,
    status: opt.Statuses = opt.DEFAULT_STATUSES,
    fit: opt.Fit = True,
) -> None:
    """Steps to result for several goals on one workload (one curve per goal and unit)."""
    from batchlab.plots.axes import check_figure_path, save_figure
    from batchlab.plots.shallue import goals_figure

    check_figure_path(out)
    answers = []
    con = opt.connect_store(store)  # opened and checked once for every goal
    try:
        for g in goals:
            answers += answer_units_on(con, steps_to_unit_result, workload, optimizer, metric, g, maximize,
                                       max_trials, step_budget, example_budget, status, studies, mix_studies)
    finally:
        con.close()
    several = len({unit.name for unit, _, _ in answers}) > 1
    labels = [(f"{unit.name}: " if several else "") + _goal_text(selection) for unit, selection, _ in answers]
    curves = _unit_curves(answers, labels)
    title = workload if several else answers[0][0].workload
    line(save_figure(goals_figure(curves, fits=_fits(curves) if fit else None, title=title), out))


@plot_app.command("metaparameters")
def metaparameters_plot(
    store: opt.Store,
    out: opt.FigureOut,
    workload: opt.StoreWorkload,
    optimizer: opt.StoreOptimizer = None,
    metric: opt.Metric = None,
    goal: opt.Goal = None,
    maximize: opt.Maximize = None,
    max_trials: opt.MaxTrials = "auto",
    studies: opt.Studies = None,
    mix_studies: opt.MixStudies = False,
    step_budget: opt.StepBudget = None,
    example_budget: opt.ExampleBudget = None,
    status: opt.Statuses = opt.DEFAULT_STATUSES,
) -> None:
    """The best trial's learning rate, 1 - momentum and effective learning rate against batch size;
    one figure per unit (``--out`` for one unit; ``STEM.UNIT.EXT`` beside it for several).

    Points whose best trial lies in the outer 10% of a searched range (in the parameter's own scale;
    docs/methods.md, "Search-edge warnings") are ringed in the figure and listed on stderr."""
    from batchlab.analysis.metaparameters import optimal_metaparameters, search_edge_warnings
    from batchlab.plots.axes import check_figure_path, save_figure
    from batchlab.plots.tuning import metaparameters_figure

    check_figure_path(out)

    def answer(con, selection):
        results = steps_to_unit_result(con, selection)
        edges = search_edge_warnings(con, results)
        optimal = optimal_metaparameters(results, search_edges=edges)
        return metaparameters_figure(optimal, title=_title([(None, selection, None)]),
                                     caption=trials_caption(selection, results)), edges

    answers = answer_units(store, answer, workload, optimizer, metric, goal, maximize, max_trials, step_budget,
                           example_budget, status, studies, mix_studies)
    for unit, _, (figure, edges) in answers:
        line(save_figure(figure, _unit_out(out, unit, answers)))
        for warning in edges:
            note(f"warning: {warning['message']}")


@plot_app.command("lr-momentum")
def lr_momentum_plot(
    store: opt.Store,
    out: opt.FigureOut,
    workload: opt.StoreWorkload,
    optimizer: opt.StoreOptimizer = None,
    metric: opt.Metric = None,
    goal: opt.Goal = None,
    maximize: opt.Maximize = None,
    max_trials: opt.MaxTrials = "auto",
    studies: opt.Studies = None,
    mix_studies: opt.MixStudies = False,
    step_budget: opt.StepBudget = None,
    example_budget: opt.ExampleBudget = None,
    status: opt.Statuses = opt.DEFAULT_STATUSES,
    batch_sizes: Annotated[Optional[list[int]], typer.Option(
        "--batch-size", help="A batch size to show; repeat (default: all).")] = None,
) -> None:
    """Every trial in the (learning rate, 1 - momentum) plane: reached, not reached, diverged; one
    figure per unit (``--out`` for one unit; ``STEM.UNIT.EXT`` beside it for several).

    Each panel draws its searched range (dashed box) where the store records it, and rings the best
    trial in red where it lies in the outer 10% of its learning-rate or momentum range
    (docs/methods.md, "Search-edge warnings"); those warnings are also listed on stderr."""
    from batchlab.analysis.metaparameters import search_edge_warnings, searched_ranges, trial_outcomes
    from batchlab.plots.axes import check_figure_path, save_figure
    from batchlab.plots.tuning import lr_momentum_scatter_figure

    check_figure_path(out)

    def answer(con, selection):
        outcomes = trial_outcomes(con, selection)
        results = steps_to_unit_result(con, selection)
        edges = search_edge_warnings(con, results)
        figure = lr_momentum_scatter_figure(outcomes, batch_sizes=batch_sizes or None,
                                            title=_title([(None, selection, None)]), search_edges=edges,
                                            search_ranges=searched_ranges(con, results),
                                            caption=trials_caption(selection, results))
        return figure, edges

    answers = answer_units(store, answer, workload, optimizer, metric, goal, maximize, max_trials, step_budget,
                           example_budget, status, studies, mix_studies)
    shown = set(batch_sizes) if batch_sizes else None
    for unit, _, (figure, edges) in answers:
        line(save_figure(figure, _unit_out(out, unit, answers)))
        for warning in edges:
            if shown is None or warning["batch_size"] in shown:
                note(f"warning: {warning['message']}")


@plot_app.command("best-measurement")
def best_measurement_plot(
    store: opt.Store,
    out: opt.FigureOut,
    workload: opt.StoreWorkload,
    optimizer: opt.StoreOptimizer = None,
    metric: opt.Metric = None,
    maximize: opt.Maximize = None,
    max_trials: opt.MaxTrials = "auto",
    studies: opt.Studies = None,
    mix_studies: opt.MixStudies = False,
    step_budgets: Annotated[Optional[list[int]], typer.Option(
        "--step-budget", min=1, max=opt.INT64_MAX, help="A step budget; repeat for each line.")] = None,
    example_budgets: Annotated[Optional[list[int]], typer.Option(
        "--example-budget", min=1, max=opt.INT64_MAX, help="An example budget; repeat for each line.")] = None,
    status: opt.Statuses = opt.DEFAULT_STATUSES,
) -> None:
    """Best measurement against batch size, one line per budget (give step or example budgets); one
    figure per unit (``--out`` for one unit; ``STEM.UNIT.EXT`` beside it for several)."""
    from batchlab.analysis.budgets import best_measurement_by_budget
    from batchlab.plots.axes import check_figure_path, save_figure
    from batchlab.plots.tuning import best_measurement_figure

    check_figure_path(out)
    if bool(step_budgets) == bool(example_budgets):
        raise BatchlabError("give budgets of one kind: one or more --step-budget, or one or more --example-budget")
    kind, budgets = ("step", step_budgets) if step_budgets else ("example", example_budgets)

    def answer(con, selection):
        sweep = best_measurement_by_budget(
            con, selection.workload, selection.metric, budgets, kind=kind, maximize=selection.maximize,
            max_trials=selection.max_trials, statuses=selection.statuses, studies=selection.studies,
            mix_studies=selection.mix_studies,
        )
        return best_measurement_figure(sweep, selection.metric, title=selection.workload)

    # no goal is used, only a metric and its direction: a placeholder goal where --metric is given
    answers = answer_units(store, answer, workload, optimizer, metric, None if metric is None else 0.0, maximize,
                           max_trials, None, None, status, studies, mix_studies)
    for unit, _, figure in answers:
        line(save_figure(figure, _unit_out(out, unit, answers)))


def _unit_curves(answers, labels=None):
    """One StepsCurve per answered unit (an answer is its results, or a tuple starting with them),
    labelled by ``labels`` or by the unit (:func:`_unit_label`)."""
    from batchlab.analysis.steps_to_result import steps_curve

    curves = []
    for k, (unit, selection, answer) in enumerate(answers):
        results = answer[0] if isinstance(answer, tuple) else answer
        label = labels[k] if labels is not None else _unit_label(unit, answers)
        curves.append(steps_curve(results, label=label, metadata=selection.describe()))
    return curves


def _unit_label(unit, answers) -> str:
    """A unit's name (``dataset/model/optimizer [group]``), or its workload when no other unit of that
    workload is drawn."""
    same = {u.name for u, _, _ in answers if u.workload == unit.workload}
    return unit.name if len(same) > 1 else unit.workload


def _unit_out(out: Path, unit, answers) -> Path:
    """The figure file of one unit: ``out`` when it is the only one, else ``STEM.<unit>.EXT`` beside it
    (``<unit>``: the optimizer and study group, or the whole unit name across workloads, as a file name)."""
    if len(answers) == 1:
        return out
    one_workload = len({u.workload for u, _, _ in answers}) == 1
    name = f"{unit.optimizer} {unit.group}" if one_workload else unit.name
    return out.with_name(f"{out.stem}.{re.sub(r'[^A-Za-z0-9_-]+', '_', name).strip('_')}{out.suffix}")


def _goal_text(selection) -> str:
    return f"{selection.metric} {'>' if selection.maximize else '<'} {selection.goal:g}"


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


def _title(answers) -> str:
    """``workload: metric < goal`` of the first answer (``dataset/model`` when the answers span
    several optimizers)."""
    selection = answers[0][1]
    workloads = {s.workload for _, s, _ in answers}
    workload = selection.workload if len(workloads) == 1 else selection.workload.rsplit("/", 1)[0]
    return f"{workload}: {_goal_text(selection)}"


def register(app: typer.Typer) -> None:
    """Add the ``plot`` group to the main app."""
    app.add_typer(plot_app, name="plot")
