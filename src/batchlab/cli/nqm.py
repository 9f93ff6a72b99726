"""Command group ``batchlab nqm``: the exact noisy quadratic model.

``sweep`` (tuned steps to target per batch size, optionally with the S(B) fit), ``fit`` (the fit only),
``curve`` (the expected loss of one configuration) and ``figures`` (the notebook's figure set). Steps are
first-passage counts (updates needed); ``official_low`` is the notebook's ``steps - 1``.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from typing import Optional

import typer

from batchlab.analysis.regimes import check_tolerance
from batchlab.errors import BatchlabError

nqm_app = typer.Typer(help="The exact noisy quadratic model (Zhang et al. 2019).", no_args_is_help=True)

_PRESET = typer.Option("zhang2019-binned", "--preset", help="zhang2019 or zhang2019-binned")
_POWER = typer.Option(None, "--power-law", help="A,B: h_i = i^-A, c_i = i^-B (with --dim)")
_DIM = typer.Option(None, "--dim", help="dimension D for --power-law")
_SPECTRUM = typer.Option(None, "--spectrum", help="file of eigenvalues (one per line, or 'h c')")
_OPT = typer.Option("sgd", "--optimizer", help="sgd, momentum, nesterov, ema, momentum+ema, nesterov+ema")
_P = typer.Option(0.0, "--precondition", help="preconditioning power p in [0, 1] (update H^-p g)")
_TARGET = typer.Option(0.01, "--target", help="target expected loss C (0 < C < initial loss)")
_MAXSTEPS = typer.Option(None, "--max-steps", help="step budget (default 10^9-1 SGD, 10^7-1 otherwise)")
_JSON = typer.Option(False, "--json", help="one JSON object per line")
_TOL = typer.Option(0.1, "--tolerance", help="regime tolerance in (0, 1) (docs/methods.md, regimes)")
_B0 = typer.Option(None, "--b0", help="batch size perfect scaling is measured from (a reached one; default the smallest)")


def _problem(preset: str, power_law: Optional[str], dim: Optional[int], spectrum: Optional[str]):
    from batchlab.nqm import problem as nqm_problem

    chosen = [name for name, value in (("--power-law", power_law), ("--spectrum", spectrum)) if value is not None]
    if len(chosen) > 1:
        raise BatchlabError("give at most one of --power-law and --spectrum")
    if power_law is not None:
        try:
            a, b = (float(v) for v in power_law.split(","))
        except ValueError:
            raise BatchlabError(f"--power-law must be 'A,B' (two numbers), got {power_law!r}") from None
        if dim is None:
            raise BatchlabError("--power-law needs --dim D")
        return nqm_problem.power_law(a, b, dim)
    if dim is not None:
        raise BatchlabError("--dim only applies with --power-law")
    if spectrum is not None:
        return nqm_problem.spectrum_from_file(spectrum)
    return nqm_problem.preset(preset)


@contextmanager
def _fits_in_memory(problem):
    """Turn running out of memory on a too-large problem into a one-line user error."""
    try:
        yield
    except MemoryError:
        raise BatchlabError(
            f"problem {problem.name!r} ({problem.curvature.size} eigenvalues) needs more memory than this machine has; "
            "use a smaller --dim or a binned --spectrum"
        ) from None


def _batch_sizes(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise BatchlabError(f"--batch-sizes must be comma-separated numbers > 0, got {text!r}") from None
    if not values or any(not 0 < v < float("inf") for v in values):
        raise BatchlabError(f"batch sizes must be > 0 and finite, got {text!r}")
    return sorted(set(values))


def _rows_for_sweep(problem, algorithm, batch_sizes, target, grid, schedule, max_steps, notebook_fudge=False):
    from batchlab.nqm.schedules import optimal_pwc_sgd, parse_schedule
    from batchlab.nqm.steps import check_target
    from batchlab.nqm.tuning import check_grid, tune, tune_scheduled

    check_grid(grid)
    kind, pieces = parse_schedule(schedule)
    check_target(target, problem.initial_loss())
    if kind == "constant":
        tuned = tune(problem, algorithm, batch_sizes, target, grid=grid, max_steps=max_steps, notebook_fudge=notebook_fudge)
        rows = [p.to_dict() for p in tuned]
        for row in rows:
            row["schedule"] = "constant"
        return rows
    if kind == "pwc":
        if algorithm.name != "sgd":
            raise BatchlabError(f"schedule pwc:K is implemented for --optimizer sgd only, got {algorithm.name!r}")
        constant = tune(problem, algorithm, batch_sizes, target, grid="official", max_steps=max_steps)
        # --max-steps bounds the whole schedule: pieces * piece_length <= max_steps
        limit = {} if max_steps is None else {"max_piece_length": max_steps // pieces}
        rows = []
        for point in constant:
            upper = None if point.result.steps is None else -(-point.result.steps // pieces)
            if upper is not None and limit:
                upper = min(upper, limit["max_piece_length"])
            res = optimal_pwc_sgd(
                problem, algorithm.precondition, point.batch_size, target, pieces, upper_k=upper, **limit
            )
            rows.append(
                {
                    "batch_size": int(point.batch_size) if float(point.batch_size).is_integer() else point.batch_size,
                    "steps": res.steps,
                    "reached": res.reached,
                    "official_low": None if res.steps is None else res.steps - 1,
                    "learning_rate": res.learning_rates[0],
                    "learning_rates": list(res.learning_rates),
                    "piece_length": res.piece_length,
                    "momentum": None,
                    "ema_decay": None,
                    "final_loss": res.final_loss,
                    "schedule": schedule,
                    "constant_steps": point.result.steps,
                    "certified": "local-optimum",
                }
            )
        return rows
    return tune_scheduled(problem, algorithm, batch_sizes, target, kind, max_steps=max_steps)


def _print_table(title: str, rows: list[dict], columns: list[str], width: int = 132) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        cells = []
        for column in columns:
            value = row.get(column)
            cells.append("-" if value is None else (f"{value:.4g}" if isinstance(value, float) else str(value)))
        table.add_row(*cells)
    import shutil

    Console(width=max(shutil.get_terminal_size().columns, width)).print(table)


def _tuned_rows(preset, power_law, dim, spectrum, optimizer, precondition, batch_sizes, target, grid, schedule,
                max_steps, notebook_fudge=False):
    """The problem and the tuned rows (one per batch size) that ``nqm sweep`` and ``nqm fit`` share."""
    from batchlab.nqm.dynamics import Algorithm

    algorithm = Algorithm(optimizer, precondition)
    problem = _problem(preset, power_law, dim, spectrum)
    if notebook_fudge and (algorithm.name != "sgd" or schedule != "constant"):
        raise BatchlabError("--notebook-fudge applies to --optimizer sgd with --schedule constant only")
    with _fits_in_memory(problem):
        rows = _rows_for_sweep(
            problem, algorithm, _batch_sizes(batch_sizes), target, grid, schedule, max_steps, notebook_fudge
        )
    return problem, rows


def _fit_summary(rows: list[dict], label: str, grid: str = "auto", tolerance: float = 0.1, b0: Optional[int] = None) -> dict:
    """``summarize_curve`` of the tuned rows plus the batch grid it rests on (docs/methods.md)."""
    from batchlab.analysis.critical_batch_size import summarize_curve
    from batchlab.analysis.curve import StepsCurve

    curve = StepsCurve.from_points([(r["batch_size"], r["steps"]) for r in rows], label=label)
    summary = summarize_curve(curve, tolerance=tolerance, b0=b0)
    sizes = [int(b) for b in curve.batch_sizes]
    reached = [int(b) for b, s in zip(curve.batch_sizes, curve.steps) if s is not None]
    summary["batch_grid"] = {
        "batch_sizes": sizes,
        "n": len(sizes),
        "n_reached": len(reached),
        "smallest": sizes[0],
        "largest": sizes[-1],
        "b0": summary["b0"],
        "learning_rate_grid": grid,
    }
    return summary


@nqm_app.command("sweep")
def sweep(
    preset: str = _PRESET,
    power_law: Optional[str] = _POWER,
    dim: Optional[int] = _DIM,
    spectrum: Optional[str] = _SPECTRUM,
    optimizer: str = _OPT,
    precondition: float = _P,
    batch_sizes: str = typer.Option("4,16,64,256,1024,4096", "--batch-sizes", help="comma-separated batch sizes"),
    target: float = _TARGET,
    grid: str = typer.Option("auto", "--grid", help="official (the notebook's grids) or auto (refined)"),
    schedule: str = typer.Option("constant", "--schedule", help="constant, pwc:K, linear or cosine"),
    max_steps: Optional[int] = _MAXSTEPS,
    fit: bool = typer.Option(False, "--fit", help="add the critical batch size summary (S(B) fit)"),
    tolerance: float = _TOL,
    b0: Optional[int] = _B0,
    notebook_fudge: bool = typer.Option(
        False, "--notebook-fudge", help="SGD only: add the notebook's 1e-8 to 1 - beta (reproduces its numbers exactly)"
    ),
    as_json: bool = _JSON,
) -> None:
    """Tuned steps to target per batch size (one JSON object per batch size with --json)."""
    check_tolerance(tolerance, "--tolerance")
    problem, rows = _tuned_rows(
        preset, power_law, dim, spectrum, optimizer, precondition, batch_sizes, target, grid, schedule, max_steps,
        notebook_fudge,
    )
    common = {"problem": problem.name, "optimizer": optimizer, "precondition": precondition, "target": target}
    used = grid if schedule == "constant" else "official"  # schedules search the official LR grid
    summary = None
    if fit:
        summary = _fit_summary(rows, f"{optimizer} p={precondition:g} target={target:g}", used, tolerance, b0)
    if as_json:
        for row in rows:
            print(json.dumps({**common, "grid": used, **row}))
        if summary is not None:
            print(json.dumps({"fit": summary, **common}))
        return
    title = f"{problem.name}: {optimizer} p={precondition:g}, target {target:g}, grid {grid}, schedule {schedule}"
    _print_table(title, rows, ["batch_size", "steps", "reached", "learning_rate", "momentum", "ema_decay", "final_loss"])
    if summary is not None:
        _print_fit(summary)


def _print_fit(summary: dict) -> None:
    grid = summary["batch_grid"]
    named = summary["critical_batch_sizes"]
    tol = summary["tolerance"]
    print(
        f"batch grid: B = {grid['smallest']}..{grid['largest']}, {grid['n']} batch sizes ({grid['n_reached']} reached), "
        f"B0 = {grid['b0']:g}, learning-rate grid {grid['learning_rate_grid']}"
    )
    data_rows = []
    for name in ("perfect_scaling_end", "maximal_parallelism_start"):
        entry = named[name]
        data_rows.append({"name": name, "value": entry["value"], "interpolated": entry.get("interpolated"),
                          "points inside": entry.get("n_points"), "reason": entry.get("reason") or ""})
    measured = summary["s_min"]["measured"]
    data_rows.append({"name": "S_min measured (steps)", "value": measured["value"], "interpolated": None,
                      "points inside": None, "reason": "" if measured["plateau_seen"] else measured["note"]})
    _print_table(f"regimes read from the data (tolerance {tol:g}): {summary['label']}", data_rows,
                 ["name", "value", "interpolated", "points inside", "reason"])
    fit = summary["fit"]
    fit_rows = [{"name": k, "value": v["value"]} for k, v in named.items() if v["source"] == "fit"]
    fit_rows.append({"name": "S_min fit (steps)", "value": fit["s_min"]})
    fit_rows.append({"name": "E_min fit (examples)", "value": fit["e_min"]})
    fit_rows.append({"name": "rms log residual", "value": fit["rms_log_residual"]})
    _print_table(f"from the fit S(B) = S_min + E_min / B ({fit['n_points']} points): {summary['label']}", fit_rows,
                 ["name", "value"])
    for warning in summary["warnings"]:
        print(f"warning: {warning}")


@nqm_app.command("fit")
def fit_command(
    preset: str = _PRESET,
    power_law: Optional[str] = _POWER,
    dim: Optional[int] = _DIM,
    spectrum: Optional[str] = _SPECTRUM,
    optimizer: str = _OPT,
    precondition: float = _P,
    batch_sizes: str = typer.Option(
        ",".join(str(2**k) for k in range(2, 21, 2)), "--batch-sizes", help="comma-separated batch sizes"
    ),
    target: float = _TARGET,
    grid: str = typer.Option("auto", "--grid", help="official or auto"),
    schedule: str = typer.Option("constant", "--schedule", help="constant, pwc:K, linear or cosine"),
    max_steps: Optional[int] = _MAXSTEPS,
    tolerance: float = _TOL,
    b0: Optional[int] = _B0,
    as_json: bool = _JSON,
) -> None:
    """Fit S(B) = S_min (1 + B_crit / B), read the regimes from the data; print both with the batch grid used."""
    check_tolerance(tolerance, "--tolerance")
    _, rows = _tuned_rows(
        preset, power_law, dim, spectrum, optimizer, precondition, batch_sizes, target, grid, schedule, max_steps
    )
    used = grid if schedule == "constant" else "official"
    summary = _fit_summary(rows, f"{optimizer} p={precondition:g} target={target:g}", used, tolerance, b0)
    if as_json:
        print(json.dumps(summary))
    else:
        _print_fit(summary)


@nqm_app.command("curve")
def curve(
    preset: str = _PRESET,
    power_law: Optional[str] = _POWER,
    dim: Optional[int] = _DIM,
    spectrum: Optional[str] = _SPECTRUM,
    optimizer: str = _OPT,
    precondition: float = _P,
    learning_rate: float = typer.Option(..., "--learning-rate", help="learning rate > 0"),
    momentum: Optional[float] = typer.Option(None, "--momentum", help="momentum in [0, 1)"),
    ema_decay: Optional[float] = typer.Option(None, "--ema-decay", help="EMA decay in [0, 1)"),
    batch_size: float = typer.Option(..., "--batch-size", help="batch size > 0"),
    steps: int = typer.Option(..., "--steps", help="last step N (>= 1)"),
    every: str = typer.Option("1", "--every", help="'1' for every step, 'log' for ~200 log-spaced steps"),
    as_json: bool = _JSON,
) -> None:
    """The exact expected loss of one configuration after each step 0..N."""
    import numpy as np

    from batchlab.nqm.dynamics import Algorithm, dense_losses, losses_at_steps, moment_recurrence

    algorithm = Algorithm(optimizer, precondition)
    problem = _problem(preset, power_law, dim, spectrum)
    if not 0 < batch_size < float("inf"):
        raise BatchlabError(f"batch size must be > 0 and finite, got {batch_size:g}")
    if steps < 1:
        raise BatchlabError(f"--steps must be >= 1, got {steps}")
    if every not in ("1", "log"):
        raise BatchlabError(f"--every must be '1' or 'log', got {every!r}")
    if algorithm.uses_momentum and momentum is None:
        raise BatchlabError(f"optimizer {optimizer!r} needs --momentum")
    if algorithm.uses_ema and ema_decay is None:
        raise BatchlabError(f"optimizer {optimizer!r} needs --ema-decay")
    if momentum is not None and not algorithm.uses_momentum:
        raise BatchlabError(f"--momentum does not apply to optimizer {optimizer!r}; use momentum or nesterov (+ema)")
    if ema_decay is not None and not algorithm.uses_ema:
        raise BatchlabError(f"--ema-decay does not apply to optimizer {optimizer!r}; use ema, momentum+ema or nesterov+ema")
    if every == "1" and steps > 20_000_000:
        raise BatchlabError(f"--steps {steps} is too many for every step; use --every log")
    with _fits_in_memory(problem):
        rec = moment_recurrence(problem, algorithm, learning_rate, momentum, ema_decay)
        if every == "log":
            at = np.unique(np.concatenate([[0], np.round(np.geomspace(1, steps, 200)).astype(np.int64)]))
            losses = losses_at_steps(rec, batch_size, at)[0]
        else:
            at = np.arange(steps + 1)
            losses = dense_losses(rec, batch_size, steps)[0]
    if as_json:
        out = sys.stdout
        for t, loss in zip(at.tolist(), losses.tolist()):
            out.write(json.dumps({"step": t, "loss": loss}) + "\n")
        return
    shown = np.unique(np.round(np.geomspace(1, at.size, min(at.size, 25))).astype(int) - 1)
    rows = [{"step": int(at[i]), "loss": float(losses[i])} for i in shown]
    _print_table(f"{problem.name}: {optimizer} lr={learning_rate:g} B={batch_size:g}", rows, ["step", "loss"])


@nqm_app.command("figures")
def figures(
    out: str = typer.Option("figures/nqm", "--out", help="output directory for the PNG files"),
    workers: int = typer.Option(2, "--workers", help="processes used for the computations"),
    as_json: bool = _JSON,
) -> None:
    """Reproduce the notebook's figures (official grids) plus S(B) fits; print the critical batch sizes."""
    from batchlab.plots.nqm import compute_and_draw_nqm_figures, critical_batch_size_table

    if workers < 1:
        raise BatchlabError(f"--workers must be >= 1, got {workers}")
    start = time.perf_counter()
    data, paths, timings = compute_and_draw_nqm_figures(out, workers=workers)
    computed = timings["compute_s"]
    table = critical_batch_size_table(data)
    elapsed = time.perf_counter() - start
    if as_json:
        for summary in table:
            print(json.dumps(summary))
        print(json.dumps({"figures": {k: str(v) for k, v in paths.items()}, "compute_s": computed, "total_s": elapsed}))
        return
    rows = []
    for summary in table:
        named = summary["critical_batch_sizes"]
        rows.append(
            {
                "curve": summary["label"],
                "S_min": summary["fit"]["s_min"],
                "B_crit": named["mccandlish_b_crit"]["value"],
                "B_20%": named["overhead_20pct"]["value"],
                "S_min_measured": summary["s_min"]["measured"]["value"],
                "ps_end_data": named["perfect_scaling_end"]["value"],
                "mp_start_data": named["maximal_parallelism_start"]["value"],
                "ps_end_fit": named["fit_perfect_scaling_end"]["value"],
                "mp_start_fit": named["fit_maximal_parallelism_start"]["value"],
                "B_range": f"{summary['batch_size_range'][0]:g}-{summary['batch_size_range'][1]:.3g}",
                "B0": summary["b0"],
                "rms_log_resid": summary["fit"]["rms_log_residual"],
            }
        )
    _print_table(
        "NQM critical batch sizes (official grids; target 0.01 unless stated; B_crit = McCandlish E_min/S_min, "
        "B_20% = 20% overhead from B0; ps_end/mp_start: perfect scaling end / maximal parallelism start at 10% "
        "tolerance, read from the data (_data, '-' = beyond the measured range) or from the fit (_fit))",
        rows,
        list(rows[0]),
        width=200,
    )
    print(f"wrote {len(paths)} figures to {out} in {elapsed:.2f} s (computation {computed:.2f} s)")


def register(app: typer.Typer) -> None:
    """Add the ``nqm`` command group to the main app."""
    app.add_typer(nqm_app, name="nqm")
