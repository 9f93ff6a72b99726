"""The figure types of Shallue et al. (2018), one function each; every one returns a matplotlib Figure.

* :func:`steps_to_result_figure`: steps to result against batch size on log2 axes, with the
  perfect-scaling line ``S(B0) * B0 / B`` from each curve's smallest reached batch size and, when
  given, the fitted ``S(B) = S_min + E_min / B``. Unreached (censored) batch sizes are marked with
  ``x`` along the top edge.
* :func:`compare_workloads_figure`: several curves normalised to compare workloads (each divided by
  its steps at a reference batch size).
* :func:`goals_figure`: several goals on one workload.
* :func:`metaparameters_figure`: the best trial's learning rate, 1 - momentum and effective learning
  rate against batch size, with the linear and square-root heuristics anchored at the smallest batch size.
* :func:`lr_momentum_scatter_figure`: every trial in the (learning rate, 1 - momentum) plane, marked
  goal reached / not reached / diverged, with contours of log10 of the effective learning rate.
* :func:`best_measurement_figure`: the best measurement against batch size, one line per budget.

Figures are built with :class:`matplotlib.figure.Figure` (no pyplot state, Agg canvas) and written by
:func:`save_figure` atomically. Curves are :class:`~batchlab.analysis.curve.StepsCurve`, so NQM and
measured curves plot the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator

from batchlab.analysis.critical_batch_size import ScalingFit
from batchlab.analysis.curve import StepsCurve
from batchlab.atomic import write_stream_atomic
from batchlab.errors import BatchlabError

FORMATS = ("png", "pdf", "svg")
OUTCOME_STYLE = {
    "reached": {"marker": "o", "color": "tab:blue", "label": "goal reached"},
    "not_reached": {"marker": "o", "color": "0.6", "label": "goal not reached", "facecolors": "none"},
    "diverged": {"marker": "x", "color": "tab:red", "label": "diverged"},
}


def save_figure(fig: Figure, path: str | Path, dpi: int = 120) -> Path:
    """Write ``fig`` to ``path`` atomically (temporary file in the same directory, then rename).

    The format comes from the suffix (png, pdf or svg). Raises :class:`BatchlabError` for another
    suffix, a missing directory, or a path that is a directory.
    """
    path = check_figure_path(path)
    fmt = path.suffix.lower().lstrip(".")
    return write_stream_atomic(
        path, lambda handle: fig.savefig(handle, format=fmt, dpi=dpi, bbox_inches="tight"), durable=False
    )


def check_figure_path(path: str | Path) -> Path:
    """``path`` as a Path if a figure can be written there: a known suffix, an existing directory, and
    not itself a directory."""
    path = Path(path)
    if path.suffix.lower().lstrip(".") not in FORMATS:
        raise BatchlabError(f"figure file {str(path)!r} must end in one of: {', '.join('.' + f for f in FORMATS)}")
    if not path.parent.is_dir():
        raise BatchlabError(f"directory {str(path.parent)!r} for figure {path.name!r} does not exist")
    if path.is_dir():
        raise BatchlabError(f"figure file {str(path)!r} is an existing directory; give a file name")
    return path


def steps_to_result_figure(
    curves: Sequence[StepsCurve],
    fits: Sequence[ScalingFit | None] | None = None,
    normalize: bool = False,
    reference_batch_size: int | None = None,
    perfect_scaling: bool = True,
    title: str | None = None,
    ylabel: str | None = None,
    intervals: Sequence[Sequence[tuple[float | None, float | None]] | None] | None = None,
) -> Figure:
    """Steps to result against batch size on log2 axes (see the module docstring).

    Args:
        curves: one or more curves; each gets its own colour.
        fits: optional fit per curve (``None`` entries are skipped), drawn dashed.
        normalize: divide each curve by its steps at ``reference_batch_size`` (default: the curve's
            smallest reached batch size), so curves of different workloads share one scale.
        reference_batch_size: the batch size to normalise at; every curve must have reached it.
        perfect_scaling: draw ``S(B0) * B0 / B`` from each curve's reference point, dotted.
        intervals: optional per curve, one ``(low, high)`` per batch size of the curve (e.g. the
            bootstrap ``steps_interval``); drawn as error bars on reached points where both are finite.
    """
    if not curves:
        raise BatchlabError("nothing to plot: give at least one steps-to-result curve")
    fits = list(fits) if fits is not None else [None] * len(curves)
    intervals = list(intervals) if intervals is not None else [None] * len(curves)
    fig = Figure(figsize=(6.4, 4.8))
    ax = fig.add_subplot()
    colors = _colors(len(curves))
    any_unreached = False
    lowest = np.inf
    for curve, fit, bounds, color in zip(curves, fits, intervals, colors):
        b, s = curve.reached_arrays()
        if b.size == 0:
            raise BatchlabError(f"curve {curve.label!r}: no batch size reached the goal; nothing to plot")
        b0, s0 = _reference_point(curve, b, s, reference_batch_size)
        scale = s0 if normalize else 1.0
        lowest = min(lowest, float(s.min()) / scale)
        ax.plot(b, s / scale, "o-", color=color, label=curve.label or None, zorder=3)
        if bounds is not None:
            _error_bars(ax, curve, bounds, scale, color)
        if perfect_scaling:
            grid = np.array([min(b.min(), b0), b.max()])
            ax.plot(grid, s0 * b0 / grid / scale, ":", color=color, alpha=0.8, lw=1.2)
        if fit is not None:
            grid = np.geomspace(b.min(), b.max(), 200)
            ax.plot(grid, fit.predicted_steps(grid) / scale, "--", color=color, alpha=0.7, lw=1.2)
        unreached = [bs for bs, st in zip(curve.batch_sizes, curve.steps) if st is None]
        if unreached:
            any_unreached = True
            ax.plot(
                unreached, [0.97] * len(unreached), "x", color=color, ms=8, mew=2,
                transform=ax.get_xaxis_transform(), clip_on=False, zorder=4,
            )
    _log2_x(ax)
    ax.set_yscale("log", base=2)
    # Keep the data readable: the perfect-scaling lines may run far below the lowest point.
    ax.set_ylim(bottom=max(ax.get_ylim()[0], lowest / 4.0))
    ax.set_xlabel("batch size")
    ax.set_ylabel(ylabel or ("steps to result / steps at reference batch size" if normalize else "steps to result"))
    handles, labels = ax.get_legend_handles_labels()
    proxies = []
    if perfect_scaling:
        proxies.append(ax.plot([], [], ":", color="0.3", label="perfect scaling")[0])
    if any(f is not None for f in fits):
        proxies.append(ax.plot([], [], "--", color="0.3", label=r"fit $S_{min} + E_{min}/B$")[0])
    if any_unreached:
        proxies.append(ax.plot([], [], "x", color="0.3", mew=2, label="goal not reached")[0])
    ax.legend(handles + proxies, labels + [p.get_label() for p in proxies], fontsize=8,
              loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
    ax.grid(True, which="major", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def compare_workloads_figure(
    curves: Sequence[StepsCurve],
    fits: Sequence[ScalingFit | None] | None = None,
    reference_batch_size: int | None = None,
    title: str | None = None,
) -> Figure:
    """Curves of several workloads, each normalised by its steps at the reference batch size."""
    return steps_to_result_figure(
        curves, fits=fits, normalize=True, reference_batch_size=reference_batch_size, title=title
    )


def goals_figure(curves: Sequence[StepsCurve], fits: Sequence[ScalingFit | None] | None = None, title: str | None = None) -> Figure:
    """Several goals on one workload: one curve per goal (label each curve with its goal)."""
    return steps_to_result_figure(curves, fits=fits, title=title)


def metaparameters_figure(optimal, title: str | None = None) -> Figure:
    """The best trial's metaparameters against batch size with the heuristic lines.

    ``optimal`` is an :class:`~batchlab.analysis.metaparameters.OptimalMetaparameters`. Panels: the
    learning rate and the effective learning rate (each with the linear ``y0 B/B0`` and square-root
    ``y0 sqrt(B/B0)`` heuristics anchored at the smallest batch size), and ``1 - momentum`` when the
    optimizer has momentum (no heuristic is defined for it).
    """
    if len(optimal.batch_sizes) == 0:
        raise BatchlabError("no batch size reached the goal: there are no optimal metaparameters to plot")
    if not optimal.has("learning_rate"):
        raise BatchlabError("the best trials have no 'learning_rate' parameter to plot")
    panels = ["learning_rate"]
    if optimal.has("momentum"):
        panels += ["one_minus_momentum", "effective_learning_rate"]
    fig = Figure(figsize=(4.2 * len(panels), 4.0))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    b = optimal.batch_sizes
    for ax, name in zip(axes, panels):
        if name == "one_minus_momentum":
            ax.plot(b, 1.0 - optimal.values["momentum"], "o-", color="tab:purple", label="best trial")
            ax.set_ylabel("1 - momentum")
        else:
            ax.plot(b, optimal.values[name], "o-", color="tab:blue", label="best trial")
            lines = optimal.heuristics(name)
            ax.plot(b, lines["linear"], "--", color="tab:orange", label=r"linear $y_0 B/B_0$")
            ax.plot(b, lines["square_root"], ":", color="tab:green", label=r"square root $y_0\sqrt{B/B_0}$")
            ax.set_ylabel(name.replace("_", " "))
        _log2_x(ax)
        shown = np.concatenate([line.get_ydata() for line in ax.lines])
        shown = shown[np.isfinite(shown) & (shown > 0)]
        if shown.size and shown.min() == shown.max():  # a flat line: give the log axis some room
            ax.set_ylim(shown.min() / 2.0, shown.max() * 2.0)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def lr_momentum_scatter_figure(outcomes, batch_sizes: Sequence[int] | None = None, title: str | None = None, ncols: int = 4) -> Figure:
    """Trials in the (learning rate, 1 - momentum) plane, one panel per batch size.

    ``outcomes`` is the frame of :func:`batchlab.analysis.metaparameters.trial_outcomes`. Markers:
    goal reached (filled), not reached (open), diverged (x); the best trial is starred. Grey contours
    are log10(learning rate / (1 - momentum)).
    """
    frame = outcomes[np.isfinite(outcomes["learning_rate"]) & np.isfinite(outcomes["momentum"])]
    frame = frame[frame["momentum"] < 1.0]
    if frame.empty:
        raise BatchlabError("no trial has both 'learning_rate' and 'momentum' parameters (momentum optimizers only)")
    available = sorted(int(b) for b in frame["batch_size"].unique())
    chosen = available if batch_sizes is None else [int(b) for b in batch_sizes]
    missing = [b for b in chosen if b not in available]
    if missing:
        raise BatchlabError(f"batch sizes {missing} have no trials with learning_rate and momentum; available: {available}")
    lr = frame["learning_rate"].to_numpy()
    om = 1.0 - frame["momentum"].to_numpy()
    xlim = _log_limits(lr)
    ylim = _log_limits(om)
    ncols = min(ncols, len(chosen))
    nrows = math.ceil(len(chosen) / ncols)
    fig = Figure(figsize=(3.4 * ncols, 3.2 * nrows))
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    gx, gy = np.meshgrid(np.geomspace(*xlim, 100), np.geomspace(*ylim, 100))
    levels = np.arange(np.floor(np.log10(xlim[0] / ylim[1])), np.ceil(np.log10(xlim[1] / ylim[0])) + 1)
    for ax, b in zip(axes, chosen):
        here = frame[frame["batch_size"] == b]
        contours = ax.contour(gx, gy, np.log10(gx / gy), levels=levels, colors="0.75", linewidths=0.7, linestyles="solid", zorder=1)
        ax.clabel(contours, fmt="%g", fontsize=6)
        for outcome, style in OUTCOME_STYLE.items():
            part = here[here["outcome"] == outcome]
            kwargs = {"marker": style["marker"], "label": style["label"], "s": 16, "zorder": 3}
            if style.get("facecolors") == "none":
                kwargs |= {"facecolors": "none", "edgecolors": style["color"]}
            else:
                kwargs |= {"color": style["color"]}
            ax.scatter(part["learning_rate"], 1.0 - part["momentum"], **kwargs)
        best = here[here["best"]]
        ax.scatter(best["learning_rate"], 1.0 - best["momentum"], marker="*", s=140, color="gold",
                   edgecolors="black", linewidths=0.6, zorder=4, label="best trial")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(*xlim)
        ax.set_ylim(*ylim)
        ax.set_title(f"batch size {b}", fontsize=9)
        ax.set_xlabel("learning rate", fontsize=8)
        ax.set_ylabel("1 - momentum", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[len(chosen):]:
        ax.set_visible(False)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    suffix = "contours: log10(learning rate / (1 - momentum))"
    fig.suptitle(f"{title}\n{suffix}" if title else suffix, fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    return fig


def best_measurement_figure(sweep, metric: str, title: str | None = None) -> Figure:
    """The best measurement under each budget: two views of one :class:`~batchlab.analysis.budgets.BudgetSweep`.

    Left: best measurement against batch size (log2 axis), one line per budget. Right: best
    measurement against the budget (log axis), one line per batch size. Cells with no measurement
    within the budget leave gaps.
    """
    if not np.isfinite(sweep.best).any():
        raise BatchlabError("no measurement lies within any of the budgets; nothing to plot")
    fig = Figure(figsize=(11.0, 4.6))
    by_batch, by_budget = fig.subplots(1, 2)
    b = np.asarray(sweep.batch_sizes, dtype=float)
    for budget, row, color in zip(sweep.budgets, sweep.best, _colors(len(sweep.budgets))):
        if not np.isfinite(row).any():
            continue  # no batch size has a measurement within this budget
        by_batch.plot(b, row, "o-", color=color, label=f"{sweep.kind} budget {budget:,}")
    _log2_x(by_batch)
    by_batch.set_xlabel("batch size")
    budgets = np.asarray(sweep.budgets, dtype=float)
    for j, color in zip(range(len(b)), _colors(len(b))):
        if not np.isfinite(sweep.best[:, j]).any():
            continue  # nothing within any budget at this batch size (e.g. every trial diverged)
        by_budget.plot(budgets, sweep.best[:, j], "o-", color=color, ms=3, label=f"batch size {int(b[j])}")
    by_budget.set_xscale("log")
    by_budget.set_xlabel(f"{sweep.kind} budget" + (" (examples)" if sweep.kind == "example" else " (steps)"))
    for ax in (by_batch, by_budget):
        ax.set_ylabel(f"best {metric}")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, ncol=2 if ax is by_budget and len(b) > 8 else 1)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def _error_bars(ax, curve: StepsCurve, bounds, scale: float, color) -> None:
    if len(bounds) != len(curve.batch_sizes):
        raise BatchlabError(f"curve {curve.label!r}: {len(bounds)} intervals for {len(curve.batch_sizes)} batch sizes")
    rows = [
        (b, s, lo, hi)
        for b, s, (lo, hi) in zip(curve.batch_sizes, curve.steps, bounds)
        if s is not None and lo is not None and hi is not None and np.isfinite([lo, hi]).all()
    ]
    if not rows:
        return
    b, s, lo, hi = (np.asarray(col, dtype=float) for col in zip(*rows))
    below, above = np.clip(s - lo, 0, None), np.clip(hi - s, 0, None)
    ax.errorbar(b, s / scale, yerr=[below / scale, above / scale], fmt="none", ecolor=color, elinewidth=1.2,
                capsize=3, zorder=2)


def _reference_point(curve: StepsCurve, b: np.ndarray, s: np.ndarray, reference: int | None) -> tuple[float, float]:
    if reference is None:
        return float(b[0]), float(s[0])
    hit = np.flatnonzero(b == float(reference))
    if hit.size == 0:
        raise BatchlabError(
            f"curve {curve.label!r} did not reach the goal at reference batch size {reference}; "
            f"reached at: {[int(x) for x in b]}"
        )
    return float(reference), float(s[hit[0]])


def _log2_x(ax) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=12))


def _log_limits(values: np.ndarray) -> tuple[float, float]:
    positive = values[values > 0]
    lo, hi = float(positive.min()), float(positive.max())
    return lo / 2.0, hi * 2.0


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10"] if n <= 10 else colormaps["viridis"]
    return [cmap(i if n <= 10 else i / max(n - 1, 1)) for i in range(n)]
