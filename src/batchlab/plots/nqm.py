"""NQM figures: the official notebook's set plus every steps curve with its fitted S(B) and B_crit.

:func:`write_nqm_figures` draws the data of :func:`batchlab.nqm.figures.figure_data` into PNG files and
returns ``{figure name: path}`` plus the critical-batch-size summaries. Files are written atomically.

Every panel of the fits grid (``critical_batch_size_fits``) has its own axis labels and a legend with
its own numbers (B_crit of the fit, the data-read regime boundaries, or that the data do not show one),
placed in a band above the data; every log axis has at least three labelled ticks
(:func:`batchlab.plots.axes.readable_log_ticks`); the training-curves title names the problem the
curves were computed on (:func:`training_curves_title`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from batchlab.analysis.critical_batch_size import fit_steps_curve, summarize_curve
from batchlab.analysis.curve import StepsCurve
from batchlab.analysis.regimes import read_regimes
from batchlab.atomic import write_path_atomic
from batchlab.errors import BatchlabError

FIGURES = (
    "training_curves",
    "sgd_steps_vs_batch_size_targets",
    "sgd_optimal_learning_rate",
    "pwc50_schedules",
    "sgd_vs_momentum",
    "effective_learning_rate",
    "sgd_vs_ema",
    "fixed_vs_pwc10",
    "critical_batch_size_fits",
)


PRECONDITION_NOTE = "p: preconditioning power\n(update H^-p g; p=0: none)"


def figure_directory(out_dir: str | Path) -> Path:
    """``out_dir`` as a Path, created if missing; its parent directory must exist.

    Raises :class:`BatchlabError` (one line) when it cannot be a directory: a file is in the way, its
    parent directory does not exist (a mistyped path is an error, never a silently created tree), or it
    cannot be created.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise BatchlabError(f"figure directory {str(out)!r} is a file, not a directory")
    if not out.parent.is_dir():
        raise BatchlabError(f"figure directory {str(out)!r}: the directory {str(out.parent)!r} does not exist "
                            "(create it first)")
    try:
        out.mkdir(exist_ok=True)
    except OSError as exc:
        raise BatchlabError(f"cannot use {str(out)!r} as the figure directory: {exc.strerror or exc}") from None
    return out


def _save(fig, path: Path) -> Path:
    figure_directory(path.parent)
    return write_path_atomic(path, lambda tmp: fig.savefig(tmp, dpi=90, format="png"), durable=False)


def _curve(entry: dict, label: str) -> StepsCurve:
    return StepsCurve.from_points([(p["batch_size"], p["steps"]) for p in entry["points"]], label=label)


def _xy(entry: dict, key: str = "steps"):
    pts = [(p["batch_size"], p[key]) for p in entry["points"] if p[key] is not None]
    return np.array([b for b, _ in pts], float), np.array([v for _, v in pts], float)


def training_curves_title(entry: dict) -> str:
    """The training-curves figure's title, from the problem the curves were computed on (its name and
    dimension D, as :func:`batchlab.nqm.figures.figure_data` records them) and the batch size."""
    where = entry.get("problem")
    dimension = entry.get("dimension")
    if where and dimension and f"D={dimension}" not in str(where).replace(" ", ""):
        where = f"{where}, D={dimension}"
    elif not where and dimension:
        where = f"D={dimension}"
    return f"SGD training curves, B={entry['batch_size']}" + (f" ({where})" if where else "")


def steps_curves(data: dict) -> list[StepsCurve]:
    """Every tuned steps-vs-batch-size curve of the figure set (first-passage steps), labelled."""
    curves = []
    for p in (0.0, 0.25, 0.5, 0.75):
        curves.append(_curve(data[f"sgd_p{p}"], f"sgd p={p:g}"))
        curves.append(_curve(data[f"momentum_p{p}"], f"momentum p={p:g}"))
    curves.append(_curve(data["ema_p0.0"], "ema p=0"))
    for target in (0.1, 0.03, 0.01, 0.003, 0.001):
        curves.append(_curve(data[f"sgd_target_{target}"], f"sgd p=0 target={target:g}"))
    return curves


def critical_batch_size_table(data: dict) -> list[dict]:
    """``summarize_curve`` of every curve (label, fit, named critical batch sizes, data-read regimes, the
    batch sizes and B0 each rests on; docs/methods.md)."""
    return [summarize_curve(c) for c in steps_curves(data)]


def write_nqm_figures(data: dict, out_dir: str | Path, only=None) -> dict[str, Path]:
    """Draw the figures of the set (all, or the names in ``only``) into ``out_dir``; returns ``{name: path}``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    paths: dict[str, Path] = {}
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    from matplotlib.ticker import FuncFormatter, LogLocator

    from batchlab.plots.axes import readable_log_ticks

    def short(value, _pos):
        exponent = np.log10(value) if value > 0 else 0.0
        if value >= 1e4 and abs(exponent - round(exponent)) < 1e-9:
            return f"1e{int(round(exponent))}"
        return f"{value:g}"

    plain = FuncFormatter(short)

    def logscale(ax, x=True):
        # No minor ticks and plain-text labels: tick creation and mathtext parsing dominate drawing
        # time otherwise (the figure set must draw in well under a second per figure).
        if x:
            ax.set_xscale("log")
        ax.set_yscale("log")
        ax.minorticks_off()
        for axis in (ax.xaxis, ax.yaxis) if x else (ax.yaxis,):
            axis.set_major_locator(LogLocator(numticks=7))
            axis.set_major_formatter(plain)

    def new(title, xlabel="batch size", ylabel="steps to target"):
        fig, ax = plt.subplots(figsize=(5.5, 4.0))
        fig.subplots_adjust(left=0.16, right=0.97, bottom=0.12, top=0.91)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        return fig, ax

    def finish(fig, ax, name, log=True, legend_title=None):
        if log:
            logscale(ax)
        ax.legend(fontsize=7, title=legend_title, title_fontsize=7)
        readable_log_ticks(ax)
        paths[name] = _save(fig, out / f"nqm_{name}.png")
        plt.close(fig)

    bound = data["lower_bound"]
    wanted = set(FIGURES if only is None else only)

    if "training_curves" in wanted:
        tc = data["training_curves"]
        fig, ax = new(training_curves_title(tc), "step", "expected loss")
        steps = np.maximum(np.asarray(tc["steps"], float), 0.8)
        for curve in tc["curves"]:
            ax.plot(steps, curve["loss"], label=f"lr={curve['learning_rate']:g}")
        finish(fig, ax, "training_curves")

    if "sgd_steps_vs_batch_size_targets" in wanted:
        fig, ax = new("SGD (p=0): steps vs batch size for five targets")
        for i, target in enumerate((0.1, 0.03, 0.01, 0.003, 0.001)):
            b, s = _xy(data[f"sgd_target_{target}"])
            ax.plot(b, s, "o-", ms=3, color=colors[i], label=f"target {target:g}")
        finish(fig, ax, "sgd_steps_vs_batch_size_targets")

    if "sgd_optimal_learning_rate" in wanted:
        fig, ax = new("SGD: optimal learning rate vs batch size (target 0.01)", ylabel="learning rate")
        for i, p in enumerate((0.0, 0.25, 0.5, 0.75)):
            entry = data["sgd_target_0.01"] if p == 0.0 else data[f"sgd_lr_p{p}"]
            b, lr = _xy(entry, "learning_rate")
            ax.plot(b, lr, "o-", ms=3, color=colors[i], label=f"p={p:g}")
        ax.axhline(2.0, color="gray", ls=":", label="stability limit 2")
        finish(fig, ax, "sgd_optimal_learning_rate", legend_title=PRECONDITION_NOTE)

    if "pwc50_schedules" in wanted:
        pwc = data["pwc50"]
        fig, ax = new("Optimal 50-piece LR schedule (SGD, p=0)", "fraction of training", "learning rate")
        for i, point in enumerate(pwc["points"]):
            lrs = point["learning_rates"]
            x = (np.arange(len(lrs)) + 0.5) / len(lrs)
            ax.plot(x, lrs, "-", color=plt.cm.viridis(i / max(len(pwc["points"]) - 1, 1)), label=f"B={point['batch_size']}")
        logscale(ax, x=False)
        ax.legend(fontsize=6, ncol=2)
        readable_log_ticks(ax)
        paths["pwc50_schedules"] = _save(fig, out / "nqm_pwc50_schedules.png")
        plt.close(fig)

    if "sgd_vs_momentum" in wanted:
        fig, ax = new("SGD vs heavy-ball momentum (target 0.01)")
        for i, p in enumerate((0.0, 0.25, 0.5, 0.75)):
            b, s = _xy(data[f"sgd_p{p}"])
            ax.plot(b, s, "o-", ms=3, color=colors[i], label=f"SGD p={p:g}")
            b, s = _xy(data[f"momentum_p{p}"])
            ax.plot(b, s, "s--", ms=3, color=colors[i], label=f"momentum p={p:g}")
        ax.plot(bound["batch_sizes"], bound["steps"], "k:", label="D / (2 C B)")
        finish(fig, ax, "sgd_vs_momentum", legend_title=PRECONDITION_NOTE)

    if "effective_learning_rate" in wanted:
        fig, ax = new("Effective learning rate lr / (1 - momentum)", ylabel="effective learning rate")
        for i, p in enumerate((0.0, 0.25, 0.5, 0.75)):
            b, lr = _xy(data[f"sgd_p{p}"], "learning_rate")
            ax.plot(b, lr, "o-", ms=3, color=colors[i], label=f"SGD lr p={p:g}")
            b, lr = _xy(data[f"momentum_p{p}"], "effective_learning_rate")
            ax.plot(b, lr, "s--", ms=3, color=colors[i], label=f"momentum p={p:g}")
        finish(fig, ax, "effective_learning_rate", legend_title=PRECONDITION_NOTE)

    if "sgd_vs_ema" in wanted:
        fig, ax = new("SGD vs SGD + EMA of iterates (p=0, target 0.01)")
        b, s = _xy(data["sgd_p0.0"])
        ax.plot(b, s, "o-", ms=3, label="SGD")
        b, s = _xy(data["ema_p0.0"])
        ax.plot(b, s, "s--", ms=3, label="SGD + EMA")
        ax.plot(bound["batch_sizes"], bound["steps"], "k:", label="D / (2 C B)")
        finish(fig, ax, "sgd_vs_ema")

    if "fixed_vs_pwc10" in wanted:
        pwc10 = data["pwc10"]
        fig, ax = new("Fixed LR vs optimised 10-piece schedule (SGD, p=0)")
        pts = [p for p in pwc10["points"] if p["steps"] is not None and p["constant_steps"] is not None]
        ax.plot([p["batch_size"] for p in pts], [p["constant_steps"] for p in pts], "o-", ms=3, label="fixed LR")
        ax.plot([p["batch_size"] for p in pts], [p["steps"] for p in pts], "s--", ms=3, label="10-piece schedule")
        ax.plot(bound["batch_sizes"], bound["steps"], "k:", label="D / (2 C B)")
        finish(fig, ax, "fixed_vs_pwc10")

    if "critical_batch_size_fits" in wanted:
        curves = [c for c in steps_curves(data) if "target" not in c.label]
        cols = 3
        rows = -(-len(curves) // cols)
        # Shared batch-size axis; every panel has its own axis labels and a legend with its own numbers.
        fig, axes = plt.subplots(rows, cols, figsize=(4.3 * cols, 3.4 * rows), squeeze=False, sharex=True)
        for ax, curve in zip(axes.ravel(), curves):
            b, s = curve.reached_arrays()
            ax.plot(b, s, "o", ms=3, label="exact NQM")
            title = curve.label
            # The data fill the lower two thirds; the band above them holds the legend, and the
            # vertical lines stop below it.
            low, high = (float(s.min()) / 1.6, float(s.max()) * 1.3) if b.size else (1.0, 10.0)
            top = high * (high / low) ** 0.55

            def vline(value, low=low, high=high, **style):
                ax.plot([value, value], [low, high], **style)
            try:
                fit = fit_steps_curve(curve)
                data_regimes = read_regimes(curve, b0=fit.b0)  # the same B0 as summarize_curve
                grid = np.geomspace(b.min(), b.max(), 100)
                ax.plot(grid, fit.predicted_steps(grid), "-", label="fit S_min (1 + B_crit/B)")
                if np.isfinite(fit.b_crit) and fit.b_crit > 0:
                    vline(fit.b_crit, color="red", ls="--", lw=1, label=f"B_crit {fit.b_crit:.3g} (fit)")
                    title = f"{curve.label}: B_crit={fit.b_crit:.3g}" + (" (extrapolated)" if fit.extrapolated else "")
                for key, style, text in (("perfect_scaling_end", ":", "perfect scaling to"),
                                         ("maximal_parallelism_start", "-.", "max. parallelism from")):
                    value = data_regimes[key]["value"]
                    if value is not None:
                        vline(value, color="gray", ls=style, lw=1, label=f"{text} {value:.3g} (data)")
                    else:
                        ax.plot([], [], ls=style, color="gray", lw=1, label=f"{text}: not in the data")
            except ValueError:
                pass
            logscale(ax)
            ax.set_ylim(low, top)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("batch size", fontsize=8)
            ax.set_ylabel("steps to target", fontsize=8)
            ax.tick_params(labelsize=8, labelbottom=True)
            ax.legend(fontsize=7, loc="upper right", framealpha=0.85, handlelength=1.8, borderaxespad=0.3)
            readable_log_ticks(ax)
        for ax in axes.ravel()[len(curves) :]:
            ax.axis("off")
        problem = f"{bound.get('problem', 'zhang2019-binned')}, D={bound['dimension']}"
        fig.suptitle(f"Steps to target {bound['target']:g} of the NQM curves with their fitted S(B) "
                     f"({problem}); p: preconditioning power", fontsize=10)
        fig.subplots_adjust(left=0.06, right=0.985, bottom=0.06, top=0.93, wspace=0.28, hspace=0.42)
        paths["critical_batch_size_fits"] = _save(fig, out / "nqm_critical_batch_size_fits.png")
        plt.close(fig)

    return paths


def _draw_group(args):
    data, out_dir, names = args
    return {k: str(v) for k, v in write_nqm_figures(data, out_dir, only=names).items()}


def _warm_matplotlib(_=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401

    return True


def compute_and_draw_nqm_figures(out_dir: str | Path, workers: int = 2) -> tuple[dict, dict[str, Path], dict]:
    """Compute the figure data and draw every figure, both spread over ``workers`` processes.

    With ``workers >= 2`` the computations run in a pool of forked workers while this process imports
    matplotlib (otherwise idle time); drawing then runs here and in one freshly forked child, which
    inherits the imported matplotlib instead of importing it again.

    Returns ``(data, {name: path}, timings)``: ``compute_s``/``draw_s`` are the wall seconds of the two
    phases, ``compute_cpu_s``/``draw_cpu_s`` their CPU seconds (this process plus its reaped workers).
    """
    import time
    from concurrent.futures import ProcessPoolExecutor

    from batchlab.nqm.figures import collect_figure_data, figure_data, fork_context, submit_figure_jobs

    def cpu() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def timings() -> dict:
        end, end_cpu = time.perf_counter(), cpu()
        return {"compute_s": computed - start, "draw_s": end - computed,
                "compute_cpu_s": computed_cpu - start_cpu, "draw_cpu_s": end_cpu - computed_cpu}

    figure_directory(out_dir)  # fail before the computation, not after it
    start, start_cpu = time.perf_counter(), cpu()
    if workers <= 1:
        data = figure_data(workers=1)
        computed, computed_cpu = time.perf_counter(), cpu()
        paths = write_nqm_figures(data, out_dir)
        return data, paths, timings()
    context = fork_context()
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = submit_figure_jobs(pool)
        _warm_matplotlib()
        data = collect_figure_data(futures)
    computed, computed_cpu = time.perf_counter(), cpu()
    # The fits figure (many panels) is as heavy as the rest together: it is drawn here, the rest in a child.
    mine = ["critical_batch_size_fits"]
    rest = [n for n in FIGURES if n not in mine]
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        other = pool.submit(_draw_group, (data, str(out_dir), rest))
        paths = write_nqm_figures(data, out_dir, only=mine)
        paths.update({k: Path(v) for k, v in other.result().items()})
    paths = {name: paths[name] for name in FIGURES}
    return data, paths, timings()
