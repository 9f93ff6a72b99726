"""Command group ``batchlab nqm``: the exact noisy quadratic model.

``sweep`` (tuned steps to target per batch size, optionally with the S(B) fit), ``fit`` (the fit only),
``curve`` (the expected loss of one configuration), ``figures`` (the notebook's figure set) and
``algorithms`` (the registry of NQM algorithms). Steps are first-passage counts (updates needed);
``official_low`` is the notebook's ``steps - 1``.

The commands parse their options, call the library (:mod:`batchlab.nqm.sweep`, :mod:`batchlab.nqm.curve`,
:mod:`batchlab.plots.nqm`) and print through :mod:`batchlab.cli.output`. The module has no ``from __future__
import annotations``: typer reads every parameter's annotation, and string annotations would be compiled
at each start-up.
"""

import time
from typing import Annotated, Optional

import typer

from batchlab.cli.options import Tolerance, json_option
from batchlab.cli.output import check_output_path, emit_json, line, note, print_table
from batchlab.errors import BatchlabError
from batchlab.nqm.algorithms import nqm_algorithm_names
from batchlab.nqm.problem import PRESETS

nqm_app = typer.Typer(help="The exact noisy quadratic model (Zhang et al. 2019).", no_args_is_help=True)

Preset = Annotated[str, typer.Option("--preset", help=" or ".join(PRESETS))]
PowerLaw = Annotated[Optional[str], typer.Option("--power-law", help="A,B: h_i = i^-A, c_i = i^-B (with --dim)")]
Dim = Annotated[Optional[int], typer.Option("--dim", help="dimension D for --power-law")]
Spectrum = Annotated[Optional[str], typer.Option("--spectrum", help="file of eigenvalues (one per line, or 'h c')")]
Optimizer = Annotated[str, typer.Option(
    "--optimizer", help=f"NQM algorithm: {', '.join(nqm_algorithm_names())} (see batchlab nqm algorithms)")]
Precondition = Annotated[float, typer.Option("--precondition", help="preconditioning power p in [0, 1] (update H^-p g)")]
Target = Annotated[float, typer.Option("--target", help="target expected loss C (0 < C < initial loss)")]
MaxSteps = Annotated[Optional[int], typer.Option(
    "--max-steps", help="step budget (default 10^9-1 SGD, 10^7-1 otherwise: the algorithm's registry entry)")]
Grid = Annotated[str, typer.Option("--grid", help="official (the notebook's grids) or auto (refined)")]
Schedule = Annotated[str, typer.Option("--schedule", help="constant, pwc:K, linear or cosine")]
B0 = Annotated[Optional[int], typer.Option(
    "--b0", help="batch size perfect scaling is measured from (a reached one; default the smallest)")]

SWEEP_JSON = json_option(
    "one JSON object per batch size (then one {\"fit\": ...} object with --fit); non-finite numbers as null")
FIT_JSON = json_option("one JSON object: the S(B) fit, named critical batch sizes and the batch grid")
CURVE_JSON = json_option(
    "one JSON object per listed step, {\"step\": t, \"loss\": L}, then one {\"curve\": {...}} object. A diverged "
    "run's expected loss overflows float64: from the first such step on \"loss\" is null, and the curve object "
    "says \"diverged\": true and \"diverged_at_step\": that step (false and null otherwise)")
FIGURES_JSON = json_option("one JSON object per curve (the S(B) summary), then one object with the figure paths")
ALGORITHMS_JSON = json_option("one JSON object per NQM algorithm (its registry entry)")

DEFAULT_FIGURES_DIR = "figures/nqm"


def named_definitions():
    """The one registry of named critical batch sizes (imported on use: start-up stays light)."""
    from batchlab.analysis.definitions import named_definitions as definitions

    return definitions()


def check_tolerance(tolerance: float, name: str) -> float:
    """:func:`batchlab.analysis.regimes.check_tolerance`, imported only to report an invalid value."""
    if type(tolerance) is float and 0 < tolerance < 1:
        return tolerance
    from batchlab.analysis.regimes import check_tolerance as check

    return check(tolerance, name)


def _batch_sizes(text: str) -> list[float]:
    """``--batch-sizes``: distinct finite numbers > 0 (:func:`batchlab.cli.options.parse_csv`: no empty
    item, none repeated, never silently dropped), sorted."""
    from batchlab.cli.options import parse_csv

    values = parse_csv(text, "--batch-sizes", float)
    if any(not 0 < v < float("inf") for v in values):
        raise BatchlabError(f"batch sizes must be > 0 and finite, got {text!r}")
    return sorted(values)


def _cells(row: dict, columns: list[str]) -> list:
    """A table row: ``-`` for a missing value (not reached, beyond the measured range)."""
    return ["-" if row.get(column) is None else row.get(column) for column in columns]


def _table(title: str, rows: list[dict], columns: list[str]) -> None:
    print_table(title, columns, [_cells(row, columns) for row in rows])


def _tuned(optimizer, precondition, preset, power_law, dim, spectrum, batch_sizes, target, grid, schedule,
           max_steps, notebook_fudge=False):
    from batchlab.nqm.algorithms import Algorithm
    from batchlab.nqm.problem import select_problem
    from batchlab.nqm.sweep import sweep_rows

    algorithm = Algorithm(optimizer, precondition)
    problem = select_problem(preset, power_law, dim, spectrum)
    rows = sweep_rows(problem, algorithm, _batch_sizes(batch_sizes), target, grid, schedule, max_steps, notebook_fudge)
    return algorithm, problem, rows


@nqm_app.command("sweep")
def sweep(
    preset: Preset = "zhang2019-binned",
    power_law: PowerLaw = None,
    dim: Dim = None,
    spectrum: Spectrum = None,
    optimizer: Optimizer = "sgd",
    precondition: Precondition = 0.0,
    batch_sizes: Annotated[str, typer.Option("--batch-sizes", help="comma-separated batch sizes")] = "4,16,64,256,1024,4096",
    target: Target = 0.01,
    grid: Grid = "auto",
    schedule: Schedule = "constant",
    max_steps: MaxSteps = None,
    fit: Annotated[bool, typer.Option("--fit", help="add the critical batch size summary (S(B) fit)")] = False,
    tolerance: Tolerance = 0.1,
    b0: B0 = None,
    notebook_fudge: Annotated[bool, typer.Option(
        "--notebook-fudge", help="SGD only: add the notebook's 1e-8 to 1 - beta (reproduces its numbers exactly)")] = False,
    as_json: SWEEP_JSON = False,
) -> None:
    """Tuned steps to target per batch size (one JSON object per batch size with --json)."""
    from batchlab.nqm.sweep import fit_summary, learning_rate_grid_used, sweep_label

    check_tolerance(tolerance, "--tolerance")
    algorithm, problem, rows = _tuned(optimizer, precondition, preset, power_law, dim, spectrum, batch_sizes, target,
                                      grid, schedule, max_steps, notebook_fudge)
    common = {"problem": problem.name, "optimizer": optimizer, "precondition": precondition, "target": target}
    used = learning_rate_grid_used(grid, schedule)
    summary = fit_summary(rows, sweep_label(algorithm, target), used, tolerance, b0) if fit else None
    if as_json:
        for row in rows:
            emit_json({**common, "grid": used, **row})
        if summary is not None:
            emit_json({"fit": summary, **common})
        return
    title = f"{problem.name}: {optimizer} p={precondition:g}, target {target:g}, grid {grid}, schedule {schedule}"
    _table(title, rows, ["batch_size", "steps", "reached", "learning_rate", "momentum", "ema_decay", "final_loss"])
    if summary is not None:
        _print_fit(summary)


def _print_fit(summary: dict) -> None:
    grid = summary["batch_grid"]
    named = summary["critical_batch_sizes"]
    tol = summary["tolerance"]
    line(
        f"batch grid: B = {grid['smallest']}..{grid['largest']}, {grid['n']} batch sizes ({grid['n_reached']} reached), "
        f"B0 = {grid['b0']:g}, learning-rate grid {grid['learning_rate_grid']}"
    )
    data_rows = []
    for definition in named_definitions():
        if definition.source != "data":
            continue
        entry = named[definition.name]
        data_rows.append({"name": definition.name, "value": entry["value"], "interpolated": entry.get("interpolated"),
                          "points inside": entry.get("n_points"), "reason": entry.get("reason") or ""})
    measured = summary["s_min"]["measured"]
    data_rows.append({"name": "S_min measured (steps)", "value": measured["value"], "interpolated": None,
                      "points inside": None, "reason": "" if measured["plateau_seen"] else measured["note"]})
    _table(f"regimes read from the data (tolerance {tol:g}): {summary['label']}", data_rows,
           ["name", "value", "interpolated", "points inside", "reason"])
    fit = summary["fit"]
    fit_rows = [{"name": d.name, "value": named[d.name]["value"]} for d in named_definitions() if d.source == "fit"]
    fit_rows.append({"name": "S_min fit (steps)", "value": fit["s_min"]})
    fit_rows.append({"name": "E_min fit (examples)", "value": fit["e_min"]})
    fit_rows.append({"name": "rms log residual", "value": fit["rms_log_residual"]})
    _table(f"from the fit S(B) = S_min + E_min / B ({fit['n_points']} points): {summary['label']}", fit_rows,
           ["name", "value"])
    for warning in summary["warnings"]:
        line(f"warning: {warning}")


@nqm_app.command("fit")
def fit_command(
    preset: Preset = "zhang2019-binned",
    power_law: PowerLaw = None,
    dim: Dim = None,
    spectrum: Spectrum = None,
    optimizer: Optimizer = "sgd",
    precondition: Precondition = 0.0,
    batch_sizes: Annotated[str, typer.Option("--batch-sizes", help="comma-separated batch sizes")] = ",".join(
        str(2**k) for k in range(2, 21, 2)),
    target: Target = 0.01,
    grid: Grid = "auto",
    schedule: Schedule = "constant",
    max_steps: MaxSteps = None,
    tolerance: Tolerance = 0.1,
    b0: B0 = None,
    as_json: FIT_JSON = False,
) -> None:
    """Fit S(B) = S_min (1 + B_crit / B), read the regimes from the data; print both with the batch grid used."""
    from batchlab.nqm.sweep import fit_summary, learning_rate_grid_used, sweep_label

    check_tolerance(tolerance, "--tolerance")
    algorithm, _, rows = _tuned(optimizer, precondition, preset, power_law, dim, spectrum, batch_sizes, target, grid,
                                schedule, max_steps)
    summary = fit_summary(rows, sweep_label(algorithm, target), learning_rate_grid_used(grid, schedule), tolerance, b0)
    if as_json:
        emit_json(summary)
    else:
        _print_fit(summary)


@nqm_app.command("curve")
def curve(
    preset: Preset = "zhang2019-binned",
    power_law: PowerLaw = None,
    dim: Dim = None,
    spectrum: Spectrum = None,
    optimizer: Optimizer = "sgd",
    precondition: Precondition = 0.0,
    learning_rate: Annotated[float, typer.Option("--learning-rate", help="learning rate > 0")] = ...,
    momentum: Annotated[Optional[float], typer.Option("--momentum", help="momentum in [0, 1)")] = None,
    ema_decay: Annotated[Optional[float], typer.Option("--ema-decay", help="EMA decay in [0, 1)")] = None,
    batch_size: Annotated[float, typer.Option("--batch-size", help="batch size > 0")] = ...,
    steps: Annotated[int, typer.Option("--steps", help="last step N (>= 1)")] = ...,
    every: Annotated[str, typer.Option(
        "--every", help="'1' for every step, 'log' for ~200 log-spaced steps")] = "1",
    as_json: CURVE_JSON = False,
) -> None:
    """The exact expected loss of one configuration after each step 0..N.

    An unstable configuration diverges: its expected loss overflows float64. The curve then says so
    (JSON: "loss" null from that step on and a final {"curve": {"diverged": true, "diverged_at_step": k}};
    table: a closing "diverged" line).
    """
    import json
    import sys

    import numpy as np

    from batchlab.nqm.algorithms import Algorithm
    from batchlab.nqm.curve import loss_curve
    from batchlab.nqm.problem import select_problem

    algorithm = Algorithm(optimizer, precondition)
    problem = select_problem(preset, power_law, dim, spectrum)
    result = loss_curve(problem, algorithm, learning_rate, batch_size, steps, momentum, ema_decay, every)
    described = {"problem": problem.name, "optimizer": optimizer, "precondition": precondition,
                 "learning_rate": learning_rate, "momentum": momentum, "ema_decay": ema_decay,
                 "batch_size": batch_size, "steps": steps, "every": every, "diverged": result.diverged,
                 "diverged_at_step": result.diverged_at_step, "final_loss": result.final_loss()}
    if as_json:
        # up to 2*10^7 rows: one buffered write per row (emit_json flushes each line); the rows hold
        # None for non-finite losses, and allow_nan=False guarantees valid JSON
        out = sys.stdout
        for row in result.rows():
            out.write(json.dumps(row, allow_nan=False) + "\n")
        emit_json({"curve": described})
        return
    at, losses = result.steps, result.losses
    shown = np.unique(np.round(np.geomspace(1, at.size, min(at.size, 25))).astype(int) - 1)
    rows = [{"step": int(at[i]), "loss": float(losses[i])} for i in shown]
    _table(f"{problem.name}: {optimizer} lr={learning_rate:g} B={batch_size:g}", rows, ["step", "loss"])
    if result.diverged:
        line(f"diverged: the expected loss overflowed (is not finite) from step {result.diverged_at_step} on")


@nqm_app.command("figures")
def figures(
    out: Annotated[Optional[str], typer.Option(
        "--out", help=f"output directory for the PNG files (default {DEFAULT_FIGURES_DIR}, created if missing); "
                      "a directory you give must have an existing parent")] = None,
    workers: Annotated[int, typer.Option("--workers", help="processes used for the computations")] = 2,
    as_json: FIGURES_JSON = False,
) -> None:
    """Reproduce the notebook's figures (official grids) plus S(B) fits; print the critical batch sizes."""
    from pathlib import Path

    from batchlab.plots.nqm import compute_and_draw_nqm_figures, critical_batch_size_table

    if workers < 1:
        raise BatchlabError(f"--workers must be >= 1, got {workers}")
    if out is None:
        out = DEFAULT_FIGURES_DIR
        if not Path(out).exists():
            Path(out).mkdir(parents=True, exist_ok=True)
            note(f"created {out}")
    else:
        check_output_path(out, "figure directory")
    start = time.perf_counter()
    data, paths, timings = compute_and_draw_nqm_figures(out, workers=workers)
    computed = timings["compute_s"]
    table = critical_batch_size_table(data)
    elapsed = time.perf_counter() - start
    if as_json:
        for summary in table:
            emit_json(summary)
        emit_json({"figures": {k: str(v) for k, v in paths.items()}, "compute_s": computed, "total_s": elapsed})
        return
    _print_critical_batch_sizes(table)
    line(f"wrote {len(paths)} figures to {out} in {elapsed:.2f} s (computation {computed:.2f} s)")


def _print_critical_batch_sizes(table: list[dict]) -> None:
    """The figure set's critical batch sizes: one row per curve, one column per named definition (its
    label, in registry order), then one line per definition (``label = name: definition``)."""
    from batchlab.analysis.definitions import legend, named_values

    definitions = named_definitions()
    rows = []
    for summary in table:
        values = named_values(summary)
        row = {"curve": summary["label"], "S_min": summary["fit"]["s_min"]}
        row.update({d.label: values[d.name] for d in definitions})
        row.update({
            "S_min_measured": summary["s_min"]["measured"]["value"],
            "B_range": f"{summary['batch_size_range'][0]:g}-{summary['batch_size_range'][1]:.3g}",
            "B0": summary["b0"],
            "rms_log_resid": summary["fit"]["rms_log_residual"],
        })
        rows.append(row)
    _table(
        "NQM critical batch sizes (official grids; target 0.01 unless stated; tolerance 0.1; '-' = undefined or "
        "beyond the measured range)",
        rows,
        list(rows[0]),
    )
    for entry in legend():  # whole lines (a caption would wrap them to the table's width)
        line(entry)
    for entry in _OTHER_COLUMNS:
        line(entry)


#: The table's columns that are not named critical batch sizes, one line each (under the legend).
_OTHER_COLUMNS = (
    "S_min = the fit's S_min (steps) in S(B) = S_min + E_min / B",
    "S_min_measured = the fewest steps to the target measured at any batch size",
    "B_range = the smallest and largest batch sizes of the curve; B0 = the batch size perfect scaling is measured from",
    "rms_log_resid = root-mean-square of log S_measured - log S_fit over the batch sizes that reached the target",
)


@nqm_app.command("algorithms")
def algorithms(as_json: ALGORITHMS_JSON = False) -> None:
    """The NQM algorithms (one registry: batchlab.nqm.algorithms): name, base update, EMA, tuned
    hyperparameters, official grid size, default step budget, supported extras."""
    from batchlab.nqm.algorithms import get_nqm_algorithm

    described = [get_nqm_algorithm(name).describe() for name in nqm_algorithm_names()]
    if as_json:
        for entry in described:
            emit_json(entry)
        return
    rows = []
    for entry in described:
        grid = " x ".join(f"{axis} ({axis_grid['n']})" for axis, axis_grid in entry["grid"].items())
        extras = ", ".join(k for k in ("pwc", "notebook_fudge") if entry[k]) or "-"
        rows.append({"name": entry["name"], "base update": entry["base_update"], "ema": entry["ema"],
                     "official grid": grid, "default max steps": entry["default_max_steps"], "also": extras,
                     "summary": entry["summary"]})
    _table("NQM algorithms (--optimizer); every one takes --precondition p", rows, list(rows[0]))


def register(app: typer.Typer) -> None:
    """Add the ``nqm`` command group to the main app."""
    app.add_typer(nqm_app, name="nqm")
