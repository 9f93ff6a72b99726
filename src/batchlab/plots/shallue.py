"""The figure types of Shallue et al. (2018), one function each; every one returns a matplotlib Figure.

* :func:`steps_to_result_figure`: steps to result against batch size on log2 axes, with each reached
  point's resolution bracket ``(steps_lower, steps]`` as an error bar below it, the perfect-scaling
  line ``S(B0) * B0 / B`` from each curve's smallest reached batch size ``B0``, and, when given, the
  fitted ``S(B) = S_min + E_min / B`` (dashed, labelled as a fit). Unreached (censored) batch sizes are
  drawn at their censoring bound with an upward arrow (the steps exceed it), never as if reached; with
  no known bound, an ``x`` along the top edge; with several curves each curve's marks are shifted
  sideways a little, so none hides another. With one curve, the regimes read from the data
  (perfect scaling, maximal data parallelism; docs/methods.md, "Regimes read from the data") are shaded.
  Intervals of the steps: one-sided ones (an upper bound) as a bar from the point up to the bound, and
  a reached point whose interval is unbounded above as a dotted stem with an open triangle.
* :func:`compare_workloads_figure`: several curves normalised to compare workloads (each divided by
  its steps at a reference batch size).
* :func:`goals_figure`: several goals on one workload.
* :func:`metaparameters_figure`: the best trial's learning rate, 1 - momentum and effective learning
  rate against batch size, with the linear and square-root heuristics anchored at the smallest batch
  size; points whose best trial lies at the edge of its searched range are ringed in red.
* :func:`lr_momentum_scatter_figure`: every trial in the (learning rate, 1 - momentum) plane, marked
  goal reached / not reached / diverged, in a near-square grid of panels (at most 4 columns), with
  contours of log10 of the effective learning rate keyed by a colour bar; trials on one point are
  spread around it and counted.
* :func:`best_measurement_figure`: the best measurement against batch size, one line per budget.

Every log axis carries at least three labelled ticks whatever its range (:func:`readable_log_ticks`).
Figures are built with :class:`matplotlib.figure.Figure` (no pyplot state, Agg canvas) and written by
:func:`save_figure` atomically. Curves are :class:`~batchlab.analysis.curve.StepsCurve`, so NQM and
measured curves plot the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import LogLocator

from batchlab.analysis.critical_batch_size import ScalingFit
from batchlab.analysis.curve import StepsCurve
from batchlab.atomic import write_stream_atomic
from batchlab.errors import BatchlabError

FORMATS = ("png", "pdf", "svg")
OUTCOME_STYLE = {
    "reached": {"marker": "o", "color": "tab:blue", "label": "goal reached"},
    "not_reached": {"marker": "o", "color": "0.6", "label": "goal not reached", "facecolors": "none"},
    "raced": {"marker": "s", "color": "tab:orange", "label": "raced: stopped, could not beat the best",
              "facecolors": "none"},
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
    brackets: bool = True,
    regimes: bool | None = None,
    tolerance: float = 0.1,
    interval_label: str = "interval",
    caption: str | None = None,
) -> Figure:
    """Steps to result against batch size on log2 axes (see the module docstring).

    Args:
        curves: one or more curves; each gets its own colour.
        fits: optional fit per curve (``None`` entries are skipped), drawn dashed over the measured
            batch-size range and labelled as a fit.
        normalize: divide each curve by its steps at ``reference_batch_size`` (default: the curve's
            smallest reached batch size), so curves of different workloads share one scale.
        reference_batch_size: the batch size to normalise at (and ``B0`` of the perfect-scaling
            line); every curve must have reached it.
        perfect_scaling: draw ``S(B0) * B0 / B`` from each curve's reference point, dotted.
        intervals: optional per curve, one ``(low, high)`` per batch size of the curve (e.g. the
            ``steps_interval`` of :func:`batchlab.analysis.bootstrap.critical_batch_size_with_intervals`);
            drawn as thin capped error bars just right of reached points where ``high`` is finite;
            ``low = None`` is a one-sided interval (an upper bound), drawn from the point up.
        brackets: draw each reached point's resolution bracket ``(steps_lower, steps]`` (the
            evaluation before the reaching one, and the reaching one) as an error bar below it, from
            the curve's ``steps_lower``; curves without brackets (exact first passage) draw none.
        regimes: shade the regimes read from the data (perfect scaling up to ``perfect_scaling_end``,
            maximal data parallelism from ``maximal_parallelism_start``; a regime the data do not show
            is not shaded). Default: when there is exactly one curve.
        tolerance: the regimes' tolerance, in (0, 1).
        interval_label: the legend text of the intervals (say what they are for).
        caption: a line saying which trials the curves rest on, shown above the legend.
    """
    if not curves:
        raise BatchlabError("nothing to plot: give at least one steps-to-result curve")
    if not 0 < tolerance < 1:
        raise BatchlabError(f"tolerance must be in (0, 1), got {tolerance}")
    fits = list(fits) if fits is not None else [None] * len(curves)
    intervals = list(intervals) if intervals is not None else [None] * len(curves)
    shade = (len(curves) == 1) if regimes is None else bool(regimes)
    fig = Figure(figsize=(6.4, 4.8))
    ax = fig.add_subplot()
    colors = _colors(len(curves))
    drawn: set[str] = set()
    lowest = np.inf
    b0_values = []
    offsets = _curve_offsets(len(curves))
    for curve, fit, bounds, color, offset in zip(curves, fits, intervals, colors, offsets):
        b, s = curve.reached_arrays()
        if b.size == 0:
            raise BatchlabError(f"curve {curve.label!r}: no batch size reached the goal; nothing to plot")
        b0, s0 = _reference_point(curve, b, s, reference_batch_size)
        b0_values.append(b0)
        scale = s0 if normalize else 1.0
        lowest = min(lowest, float(s.min()) / scale)
        line = ax.plot(b, s / scale, "o-", color=color, label=curve.label or None, zorder=3)[0]
        line.set_gid("data")
        if brackets and _bracket_bars(ax, curve, scale, color):
            drawn.add("bracket")
            lower = [lo for lo in _aligned(curve, "steps_lower") if lo is not None and lo > 0]
            if lower:
                lowest = min(lowest, min(lower) / scale)
        if bounds is not None:
            drawn |= _error_bars(ax, curve, bounds, scale, color, shift="bracket" in drawn)
        if perfect_scaling:
            grid = np.array([min(b.min(), b0), max(curve.batch_sizes)])
            ideal = ax.plot(grid, s0 * b0 / grid / scale, ":", color=color, alpha=0.8, lw=1.2)[0]
            ideal.set_gid("perfect_scaling")
        if fit is not None:
            grid = np.geomspace(min(curve.batch_sizes), max(curve.batch_sizes), 200)
            fitted = ax.plot(grid, fit.predicted_steps(grid) / scale, "--", color=color, alpha=0.7, lw=1.2)[0]
            fitted.set_gid("fit")
        drawn |= _censored_marks(ax, curve, scale, color, offset=offset, small=len(curves) > 1)
        bounds_at = [c for b_, s_, c in zip(curve.batch_sizes, curve.steps, _aligned(curve, "censored_at"))
                     if s_ is None and c is not None and c > 0]
        if bounds_at:  # keep every censoring bound in view
            lowest = min(lowest, min(bounds_at) / scale)
        if shade:
            drawn |= _shade_regimes(ax, curve, tolerance, b)
    _log2_x(ax)
    ax.set_yscale("log", base=2)
    # Keep the data readable: the perfect-scaling lines may run far below the lowest point.
    ax.set_ylim(bottom=max(ax.get_ylim()[0], lowest / 4.0))
    ax.set_xlabel("batch size")
    ax.set_ylabel(ylabel or ("steps to result / steps at reference batch size" if normalize else "steps to result"))
    handles, labels = ax.get_legend_handles_labels()
    proxies = []
    if "bracket" in drawn:
        proxies.append(ax.errorbar([], [], yerr=[[], []], fmt="none", ecolor="0.3", elinewidth=1.2, capsize=3,
                                   label="resolution bracket (previous, reaching evaluation]"))
    if "interval" in drawn or "one_sided" in drawn:
        text = interval_label
        if "one_sided" in drawn and "interval" in drawn:
            text += " (a bar starting at its point is one-sided: an upper bound only)"
        elif "one_sided" in drawn:
            text += (" (no lower bound exists)" if "one-sided" in text.lower()
                     else " (one-sided: an upper bound only; no lower bound exists)")
        proxies.append(ax.errorbar([], [], yerr=[[], []], fmt="none", ecolor="0.3", elinewidth=1.1, capsize=3,
                                   alpha=0.8, label=text))
    if "interval_unbounded" in drawn:
        proxies.append(ax.plot([], [], marker=_UNBOUNDED_MARKER, ls=":", color="0.3", ms=6, mfc="none",
                               label="interval unbounded above (too few trials reached the goal)")[0])
    if perfect_scaling:
        where = f" from B0 = {b0_values[0]:g}" if len(set(b0_values)) == 1 else " from each curve's B0"
        proxies.append(ax.plot([], [], ":", color="0.3", label="perfect scaling" + where)[0])
    if any(f is not None for f in fits):
        proxies.append(ax.plot([], [], "--", color="0.3", label=r"fit $S_{min} + E_{min}/B$ (fitted, not measured)")[0])
    if "censored" in drawn:
        proxies.append(ax.plot([], [], marker=r"$\uparrow$", ls="none", color="0.3", ms=10,
                               label="not reached: steps > bound (censored)")[0])
    if "unbounded" in drawn:
        proxies.append(ax.plot([], [], "x", color="0.3", mew=2, label="not reached (no bound known)")[0])
    for name, (color, text) in _REGIME_STYLE.items():
        if name in drawn:
            proxies.append(Patch(facecolor=color, alpha=0.12, lw=0, label=text))
    legend = ax.legend(handles + proxies, labels + [p.get_label() for p in proxies], fontsize=8,
                       loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False,
                       title=_wrap(caption, 110), title_fontsize=7)
    legend.set_gid("legend")
    ax.grid(True, which="major", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    readable_log_ticks(ax)
    return fig


_UNBOUNDED_MARKER = "^"


def _curve_offsets(n: int) -> list[float]:
    """Per curve, a small horizontal offset (in octaves) of its not-reached marks, so that the marks of
    several curves at one batch size and bound sit side by side instead of on top of each other."""
    if n <= 1:
        return [0.0] * n
    step = min(0.25, 0.9 / (n - 1))
    return [(i - (n - 1) / 2.0) * step for i in range(n)]


_REGIME_STYLE = {
    "perfect_scaling": ("tab:green", "perfect scaling (read from data)"),
    "perfect_scaling_beyond": ("tab:green", "perfect scaling (read from data; its end lies beyond the measured range)"),
    "maximal_parallelism": ("tab:purple", "maximal data parallelism (read from data)"),
}


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


def metaparameters_figure(optimal, title: str | None = None, caption: str | None = None) -> Figure:
    """The best trial's metaparameters against batch size with the heuristic lines.

    ``optimal`` is an :class:`~batchlab.analysis.metaparameters.OptimalMetaparameters`. Panels: the
    learning rate and the effective learning rate (each with the linear ``y0 B/B0`` and square-root
    ``y0 sqrt(B/B0)`` heuristics anchored at the smallest batch size), and ``1 - momentum`` when the
    optimizer has momentum (no heuristic is defined for it). Points whose best trial lies at the edge
    of its searched range (``optimal.search_edges``, see
    :func:`~batchlab.analysis.metaparameters.search_edge_warnings`) are ringed in red and labelled
    with the edge ("low"/"high" of the searched parameter); the effective learning rate is ringed when
    either the learning rate or the momentum is at an edge.
    """
    if len(optimal.batch_sizes) == 0:
        raise BatchlabError("no batch size reached the goal: there are no optimal metaparameters to plot")
    if not optimal.has("learning_rate"):
        raise BatchlabError("the best trials have no 'learning_rate' parameter to plot")
    panels = ["learning_rate"]
    if optimal.has("momentum"):
        panels += ["one_minus_momentum", "effective_learning_rate"]
    fig = Figure(figsize=(4.2 * len(panels), 4.4))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    b = optimal.batch_sizes
    edges = list(optimal.search_edges)
    for ax, name in zip(axes, panels):
        if name == "one_minus_momentum":
            y = 1.0 - optimal.values["momentum"]
            ax.plot(b, y, "o-", color="tab:purple", label="best trial")
            ax.set_ylabel("1 - momentum")
            parameters = ("momentum",)
        else:
            y = optimal.values[name]
            ax.plot(b, y, "o-", color="tab:blue", label="best trial")
            lines = optimal.heuristics(name)
            ax.plot(b, lines["linear"], "--", color="tab:orange", label=r"linear $y_0 B/B_0$")
            ax.plot(b, lines["square_root"], ":", color="tab:green", label=r"square root $y_0\sqrt{B/B_0}$")
            ax.set_ylabel(name.replace("_", " "))
            parameters = ("learning_rate", "momentum") if name == "effective_learning_rate" else ("learning_rate",)
        _mark_search_edges(ax, b, y, [w for w in edges if w["parameter"] in parameters])
        _log2_x(ax)
        shown = np.concatenate([line.get_ydata() for line in ax.lines])
        shown = shown[np.isfinite(shown) & (shown > 0)]
        if shown.size and shown.min() == shown.max():  # a flat line: give the log axis some room
            ax.set_ylim(shown.min() / 2.0, shown.max() * 2.0)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
        readable_log_ticks(ax)
    heading = "\n".join(t for t in (title, _wrap(caption, 60 * len(panels))) if t)
    if heading:
        fig.suptitle(heading, fontsize=9)
    fig.tight_layout()
    return fig


def _mark_search_edges(ax, batch_sizes: np.ndarray, y: np.ndarray, warnings: list[dict]) -> None:
    """Ring the points whose best trial sits at a search-space edge, labelled "parameter: low/high"."""
    notes: dict[float, list[str]] = {}
    for w in warnings:
        text = f"{_SHORT_NAMES.get(w['parameter'], w['parameter'])}: {w['edge']}"
        notes.setdefault(float(w["batch_size"]), [])
        if text not in notes[float(w["batch_size"])]:
            notes[float(w["batch_size"])].append(text)
    index = [i for i, b in enumerate(batch_sizes) if float(b) in notes and np.isfinite(y[i])]
    if not index:
        return
    rings = ax.scatter(batch_sizes[index], y[index], s=130, facecolors="none", edgecolors="tab:red",
                       linewidths=1.6, zorder=4, label="best trial at search-space edge")
    rings.set_gid("search_edge")
    finite = np.log(y[np.isfinite(y) & (y > 0)])
    middle = (finite.min() + finite.max()) / 2.0 if finite.size else 0.0
    for i in index:
        # directly below a ring in the upper half of the panel, above one in the lower half
        upper = y[i] > 0 and np.log(y[i]) > middle
        ax.annotate("\n".join(notes[float(batch_sizes[i])]), (batch_sizes[i], y[i]),
                    xytext=(0, -10 if upper else 10), textcoords="offset points", ha="center",
                    va="top" if upper else "bottom", fontsize=6.5, color="tab:red", zorder=5)


_SHORT_NAMES = {"learning_rate": "lr", "effective_learning_rate": "effective lr"}


def lr_momentum_scatter_figure(
    outcomes,
    batch_sizes: Sequence[int] | None = None,
    title: str | None = None,
    ncols: int = 4,
    search_edges: Sequence[dict] | None = None,
    search_ranges: dict | None = None,
    caption: str | None = None,
) -> Figure:
    """Trials in the (learning rate, 1 - momentum) plane, one panel per batch size.

    ``outcomes`` is the frame of :func:`batchlab.analysis.metaparameters.trial_outcomes`. Markers:
    goal reached (filled), not reached (open), raced (open orange square: stopped by racing, could
    not beat the best; whether it would have reached the goal is unknown), diverged (x); the best
    trial is starred. Each class that occurs has its legend entry. Trials that fall on one point
    (within 1% of each axis's log range) are placed on a small circle around it and labelled
    "N trials", so no marker hides another. The contours are log10(learning rate / (1 - momentum)),
    coloured by value and keyed by one colour bar (``gid="contour_colorbar"``) at the right.
    Panels form a near-square grid of at most ``ncols`` columns (:func:`scatter_columns`: 2 for up to
    4 batch sizes, 3 for up to 9, then 4), about 4 x 3.7 inches each. Optional: ``search_ranges``
    (:func:`~batchlab.analysis.metaparameters.searched_ranges`) draws each panel's searched box
    (dashed), ``search_edges`` (:func:`~batchlab.analysis.metaparameters.search_edge_warnings`)
    rings the best trial in red where it lies at the edge of its learning-rate or momentum range,
    and ``caption`` (which trials the figure rests on) is added under the title.
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
    boxes = {}
    for b in chosen:
        ranges = (search_ranges or {}).get(b, {})
        if "learning_rate" in ranges and "momentum" in ranges:
            (lr_lo, lr_hi, _), (m_lo, m_hi, _) = ranges["learning_rate"], ranges["momentum"]
            if lr_lo > 0 and m_hi < 1:
                boxes[b] = (lr_lo, lr_hi, 1.0 - m_hi, 1.0 - m_lo)
    box_x = np.array([v for box in boxes.values() for v in box[:2]])
    box_y = np.array([v for box in boxes.values() for v in box[2:]])
    xlim = _log_limits(np.concatenate([lr, box_x]))
    ylim = _log_limits(np.concatenate([om, box_y]))
    at_edge = {int(w["batch_size"]) for w in (search_edges or ()) if w["parameter"] in ("learning_rate", "momentum")}
    ncols = scatter_columns(len(chosen), ncols)
    nrows = math.ceil(len(chosen) / ncols)
    fig = Figure(figsize=(4.0 * ncols + 1.2, 3.7 * nrows + 1.6))
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    gx, gy = np.meshgrid(np.geomspace(*xlim, 60), np.geomspace(*ylim, 60))
    levels = np.arange(np.floor(np.log10(xlim[0] / ylim[1])), np.ceil(np.log10(xlim[1] / ylim[0])) + 1)
    contour_norm = Normalize(vmin=levels.min(), vmax=max(levels.max(), levels.min() + 1))
    contours = None
    for ax, b in zip(axes, chosen):
        here = frame[frame["batch_size"] == b]
        contours = ax.contour(gx, gy, np.log10(gx / gy), levels=levels, cmap=_CONTOUR_CMAP, norm=contour_norm,
                              linewidths=0.9, linestyles="solid", alpha=0.55, zorder=1)
        spread = _spread_coincident(here["learning_rate"].to_numpy(dtype=float),
                                    1.0 - here["momentum"].to_numpy(dtype=float), xlim, ylim)
        x_all, y_all, groups = spread
        outcome_of = here["outcome"].to_numpy()
        for outcome, style in OUTCOME_STYLE.items():
            if outcome == "raced" and not (frame["outcome"] == outcome).any():
                continue  # the raced class appears (with its legend entry) only for raced studies
            mask = outcome_of == outcome
            kwargs = {"marker": style["marker"], "label": style["label"], "s": style.get("size", 30), "zorder": 3,
                      "gid": f"outcome_{outcome}", "linewidths": 1.3}
            if style.get("facecolors") == "none":
                kwargs |= {"facecolors": "none", "edgecolors": style["color"]}
            else:
                kwargs |= {"color": style["color"]}
            ax.scatter(x_all[mask], y_all[mask], **kwargs)
        for (gx0, gy0), count in groups:  # how many trials share one point: none hides another
            ax.annotate(f"{count} trials", (gx0, gy0), xytext=(0, 9), textcoords="offset points", ha="center",
                        va="bottom", fontsize=7, color="0.25", zorder=6, gid="coincident_count")
        best = here[here["best"]]
        ax.scatter(best["learning_rate"], 1.0 - best["momentum"], marker="*", s=160, color="gold",
                   edgecolors="black", linewidths=0.6, zorder=4, label="best trial")
        if b in boxes:
            x0, x1, y0, y1 = boxes[b]
            ax.plot([x0, x1, x1, x0, x0], [y0, y0, y1, y1, y0], "--", color="0.4", lw=0.8, zorder=2,
                    label="searched range", gid="searched_range")
        if b in at_edge and not best.empty:
            ax.scatter(best["learning_rate"], 1.0 - best["momentum"], s=320, facecolors="none", edgecolors="tab:red",
                       linewidths=1.5, zorder=5, label="best trial at search-space edge", gid="search_edge")
        _plain_log(ax)
        ax.set_xlim(*xlim)
        ax.set_ylim(*ylim)
        ax.set_title(f"batch size {b}", fontsize=11)
        ax.set_xlabel("learning rate", fontsize=10)
        ax.set_ylabel("1 - momentum", fontsize=10)
        ax.tick_params(labelsize=9)
        readable_log_ticks(ax)
    for ax in axes[len(chosen):]:
        ax.set_visible(False)
    entries = {}
    for ax in axes[: len(chosen)]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    legend_columns = min(len(entries), 3 if ncols <= 2 else 4)
    fig.legend(list(entries.values()), list(entries), loc="lower center", ncol=legend_columns, fontsize=9,
               frameon=False)
    heading = "\n".join(t for t in (title, _wrap(caption, 34 * ncols + 20)) if t)
    if heading:
        fig.suptitle(heading, fontsize=10)
    legend_rows = math.ceil(len(entries) / legend_columns)
    height = fig.get_figheight()
    bottom = min(0.3, (0.25 * legend_rows + 0.2) / height)
    top = 1.0 - min(0.3, (0.16 * (heading.count("\n") + 1) + 0.02) / height) if heading else 1.0
    # room for the legend below, the heading above and the colour bar on the right
    fig.tight_layout(rect=(0, bottom, 0.9 if ncols > 1 else 0.86, top))
    if contours is not None:
        right = 0.915 if ncols > 1 else 0.885
        bar_height = min(0.8 * (top - bottom), 4.0 / height)
        cax = fig.add_axes((right, (top + bottom - bar_height) / 2.0, 0.018, bar_height))
        bar = fig.colorbar(ScalarMappable(norm=contour_norm, cmap=_CONTOUR_CMAP), cax=cax, ticks=levels)
        bar.set_label("contours: log10(learning rate / (1 - momentum))\n= log10(effective learning rate)", fontsize=9)
        bar.ax.tick_params(labelsize=9)
        bar.ax.set_gid("contour_colorbar")
    return fig


_CONTOUR_CMAP = "viridis"


def scatter_columns(panels: int, most: int = 4) -> int:
    """Columns of the learning-rate/momentum grid: near-square (2 for up to 4 panels, 3 for up to 9),
    at most ``most``, so the figure stays readable at page width instead of a long strip."""
    return max(1, min(int(most), panels, math.ceil(math.sqrt(panels))))


def _spread_coincident(x: np.ndarray, y: np.ndarray, xlim, ylim) -> tuple[np.ndarray, np.ndarray, list]:
    """Trials that fall on one point of the (log) plane (within 1% of each axis's decades) are placed
    on a small circle around it, so that every marker stays visible; returns the positions and, for
    every point shared by several trials, ``((x, y), count)``."""
    x, y = x.copy(), y.copy()
    ok = (x > 0) & (y > 0)
    if not ok.any():
        return x, y, []
    span_x = math.log10(xlim[1] / xlim[0])
    span_y = math.log10(ylim[1] / ylim[0])
    keys = {}
    for i in np.flatnonzero(ok):
        key = (round(math.log10(x[i]) / (0.01 * span_x)), round(math.log10(y[i]) / (0.01 * span_y)))
        keys.setdefault(key, []).append(i)
    groups = []
    for members in keys.values():
        if len(members) < 2:
            continue
        x0, y0 = float(x[members[0]]), float(y[members[0]])
        groups.append(((x0, y0), len(members)))
        for k, i in enumerate(members):
            angle = 2 * math.pi * k / len(members) + math.pi / 4
            x[i] = x0 * 10 ** (0.022 * span_x * math.cos(angle))
            y[i] = y0 * 10 ** (0.03 * span_y * math.sin(angle))
    return x, y, groups


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
        # below the panel: a legend inside would cover the lines it names
        entries = len(ax.get_legend_handles_labels()[1])
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False,
                  ncol=max(1, min(4, entries)) if ax is by_budget else max(1, min(3, entries)))
        readable_log_ticks(ax)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def _error_bars(ax, curve: StepsCurve, bounds, scale: float, color, shift: bool = False) -> set[str]:
    """Intervals of the steps as capped error bars; ``shift`` moves them a little right of the points
    so they do not hide the resolution brackets. A ``(None, high)`` interval is one-sided (an upper
    bound) and is drawn from the point up to ``high``, capped there; a reached point whose interval
    has no finite upper side (one trial, or too few reached the goal) gets a dotted stem with an open
    triangle (``gid="interval_unbounded"``), so a missing interval is never silent. Returns what was
    drawn: ``"interval"`` (two-sided), ``"one_sided"``, ``"interval_unbounded"``."""
    if len(bounds) != len(curve.batch_sizes):
        raise BatchlabError(f"curve {curve.label!r}: {len(bounds)} intervals for {len(curve.batch_sizes)} batch sizes")
    drawn: set[str] = set()
    factor = 2 ** 0.12 if shift else 1.0
    rows, open_above = [], []
    for b, s, (lo, hi) in zip(curve.batch_sizes, curve.steps, bounds):
        if s is None:
            continue
        if hi is None or not np.isfinite(hi):
            open_above.append((b, s))
            continue
        if lo is not None and not np.isfinite(lo):
            continue
        rows.append((b, s, s if lo is None else lo, hi))
        drawn.add("one_sided" if lo is None else "interval")
    if rows:
        b, s, lo, hi = (np.asarray(col, dtype=float) for col in zip(*rows))
        below, above = np.clip(s - lo, 0, None), np.clip(hi - s, 0, None)
        container = ax.errorbar(b * factor, s / scale, yerr=[below / scale, above / scale], fmt="none",
                                ecolor=color, elinewidth=1.1, alpha=0.8, capsize=3, zorder=2)
        container.set_label("_interval")
    if open_above:
        b, s = (np.asarray(col, dtype=float) for col in zip(*open_above))
        top = s * 2 ** 0.5
        stems = ax.vlines(b * factor, s / scale, top / scale, colors=[color], linestyles=":", lw=1.1, zorder=2)
        stems.set_gid("interval_unbounded")
        heads = ax.plot(b * factor, top / scale, _UNBOUNDED_MARKER, color=color, mfc="none", ms=5, zorder=2)[0]
        heads.set_gid("interval_unbounded")
        drawn.add("interval_unbounded")
    return drawn


def _aligned(curve: StepsCurve, name: str) -> list:
    """The curve's optional per-batch-size field ``name`` (``steps_lower``, ``censored_at``) as a list
    aligned with ``batch_sizes`` (StepsCurve checks the length); all ``None`` when the curve does not carry it."""
    values = getattr(curve, name)
    return [None] * len(curve.batch_sizes) if values is None else list(values)


def _bracket_bars(ax, curve: StepsCurve, scale: float, color) -> bool:
    """Resolution brackets ``(steps_lower, steps]`` of the reached points as error bars below them."""
    rows = [
        (b, s, lo) for b, s, lo in zip(curve.batch_sizes, curve.steps, _aligned(curve, "steps_lower"))
        if s is not None and lo is not None
    ]
    if not rows:
        return False
    b, s, lo = (np.asarray(col, dtype=float) for col in zip(*rows))
    below = np.clip(s - lo, 0, None)
    container = ax.errorbar(b, s / scale, yerr=[below / scale, np.zeros_like(s)], fmt="none", ecolor=color,
                            elinewidth=1.2, capsize=3, zorder=2)
    container.set_label("_bracket")
    return True


def _censored_marks(ax, curve: StepsCurve, scale: float, color, offset: float = 0.0, small: bool = False) -> set[str]:
    """Unreached batch sizes: at their censoring bound with an upward arrow (steps exceed it), or, when
    no bound is known, an ``x`` along the top edge. Never drawn as if reached. ``offset`` shifts the
    marks sideways by that many octaves (several curves: side by side, none hiding another); ``small``
    draws them narrower."""
    drawn = set()
    shift = 2.0 ** offset
    bounded = [
        (b, c) for b, s, c in zip(curve.batch_sizes, curve.steps, _aligned(curve, "censored_at"))
        if s is None and c is not None
    ]
    if bounded:
        b, c = (np.asarray(col, dtype=float) for col in zip(*bounded))
        arrow = c * (2 ** 0.6 - 1.0)  # a fixed length on the log2 axis
        container = ax.errorbar(b * shift, c / scale, yerr=[np.zeros_like(c), arrow / scale], lolims=True, fmt="_",
                                color=color, ms=8 if small else 12, mew=2, elinewidth=1.5, capsize=0, zorder=4)
        container.set_label("_censored")
        drawn.add("censored")
    unbounded = [
        b for b, s, c in zip(curve.batch_sizes, curve.steps, _aligned(curve, "censored_at"))
        if s is None and c is None
    ]
    if unbounded:
        marks = ax.plot(
            np.asarray(unbounded, dtype=float) * shift, [0.97] * len(unbounded), "x", color=color, ms=8, mew=2,
            transform=ax.get_xaxis_transform(), clip_on=False, zorder=4,
        )[0]
        marks.set_gid("not_reached")
        drawn.add("unbounded")
    return drawn


def data_regimes(curve: StepsCurve, tolerance: float = 0.1) -> dict:
    """The regime boundaries read from the measured points of ``curve`` (docs/methods.md, "Regimes
    read from the data"), by :func:`batchlab.analysis.critical_batch_size.read_regimes`.

    Returns ``{"b0", "perfect_scaling_end", "maximal_parallelism_start", "perfect_scaling_beyond"}``:
    measured batch sizes or ``None`` where the data do not show the regime (fewer than two measured
    batch sizes inside it); ``perfect_scaling_beyond`` is the largest measured batch size when every
    measured batch size from ``B0`` on is still in perfect scaling (its end lies beyond the range).
    """
    from batchlab.analysis.regimes import read_regimes

    b0 = _default_b0(curve)  # the same B0 as analyze critical-batch-size
    reached = {float(x) for x in curve.reached_arrays()[0]}
    try:
        read = read_regimes(curve, tolerance, b0=b0 if b0 in reached else None)
    except BatchlabError:
        return {"b0": None, "perfect_scaling_end": None, "maximal_parallelism_start": None,
                "perfect_scaling_beyond": None}
    ps = read["perfect_scaling_end"] if isinstance(read["perfect_scaling_end"], dict) else {}
    beyond = ps.get("lower_bound") if ps.get("value") is None and (ps.get("n_points") or 0) >= 2 else None
    return {
        "b0": _boundary(read.get("b0")),
        "perfect_scaling_end": _boundary(read["perfect_scaling_end"]),
        "maximal_parallelism_start": _boundary(read.get("maximal_parallelism_start")),
        "perfect_scaling_beyond": _boundary(beyond),
    }


def _boundary(value) -> float | None:
    if isinstance(value, dict):
        value = value.get("value")
    if value is None or isinstance(value, bool):
        return None
    value = float(value)
    return value if np.isfinite(value) and value > 0 else None


def _shade_regimes(ax, curve: StepsCurve, tolerance: float, reached_b: np.ndarray) -> set[str]:
    bounds = data_regimes(curve, tolerance)
    drawn = set()
    low = bounds.get("b0") or float(reached_b.min())
    high = float(reached_b.max())
    end = bounds.get("perfect_scaling_end")
    beyond = bounds.get("perfect_scaling_beyond")
    if end is not None and end > low:
        ax.axvspan(low, end, color=_REGIME_STYLE["perfect_scaling"][0], alpha=0.12, lw=0, zorder=0).set_gid(
            "perfect_scaling_regime")
        drawn.add("perfect_scaling")
    elif beyond is not None and beyond > low:
        ax.axvspan(low, beyond, color=_REGIME_STYLE["perfect_scaling_beyond"][0], alpha=0.12, lw=0, zorder=0).set_gid(
            "perfect_scaling_regime")
        drawn.add("perfect_scaling_beyond")
    start = bounds.get("maximal_parallelism_start")
    if start is not None and start < high:
        ax.axvspan(start, high, color=_REGIME_STYLE["maximal_parallelism"][0], alpha=0.12, lw=0, zorder=0).set_gid(
            "maximal_parallelism_regime")
        drawn.add("maximal_parallelism")
    return drawn


def _default_b0(curve: StepsCurve) -> float | None:
    """The B0 ``analyze critical-batch-size`` uses: the fit's (its smallest reached point; a batch size
    whose bracket starts at 0 is only an upper bound and not a point). None when there is no fit."""
    from batchlab.analysis.critical_batch_size import fit_steps_curve

    try:
        return float(fit_steps_curve(curve).b0)
    except (BatchlabError, ValueError, FloatingPointError):
        return None


def _reference_point(curve: StepsCurve, b: np.ndarray, s: np.ndarray, reference: int | None) -> tuple[float, float]:
    if reference is None:
        b0 = _default_b0(curve)
        hit = np.flatnonzero(b == b0) if b0 is not None else np.empty(0, dtype=int)
        if hit.size:
            return float(b[hit[0]]), float(s[hit[0]])
        return float(b[0]), float(s[0])
    hit = np.flatnonzero(b == float(reference))
    if hit.size == 0:
        raise BatchlabError(
            f"curve {curve.label!r} did not reach the goal at reference batch size {reference}; "
            f"reached at: {[int(x) for x in b]}"
        )
    return float(reference), float(s[hit[0]])


def _wrap(text: str | None, width: int) -> str | None:
    """``text`` wrapped to lines of at most ``width`` characters (None stays None)."""
    if not text:
        return None
    import textwrap

    return "\n".join(textwrap.wrap(text, width=max(width, 40)))


def _log2_x(ax) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=12))


MIN_LOG_LABELS = 3


def _plain_log(ax) -> None:
    """Both axes log10, labelled with plain numbers (0.01, 0.1, 1), no minor ticks: many panels draw
    several times faster than with the default mathtext labels and minor ticks."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    for axis, scale in ((ax.xaxis, ax.set_xscale), (ax.yaxis, ax.set_yscale)):
        scale("log")
        axis.set_major_locator(LogLocator(numticks=7))
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: _tick_text(v)))
        axis.set_minor_formatter(NullFormatter())
    ax.minorticks_off()


def readable_log_ticks(ax, min_labels: int = MIN_LOG_LABELS) -> None:
    """Give every log-scaled axis of ``ax`` at least ``min_labels`` labelled ticks inside its view limits.

    Where the axis's own locator labels fewer (a narrow range: under about two decades on a log10 axis,
    under about two octaves on a log2 axis), the labelled ticks become 1, 3 (then 1, 2, 5, then 1, 2, 3, 5, then 1, 2,
    ..., 9) times the powers of ten, or 1, 1.5 (then 1, 1.25, 1.5, 1.75) times the powers of two on a log2
    axis, or, for a range narrower still, evenly spaced round numbers; they are written as plain
    numbers and the minor tick labels are switched off, so no two labels overlap. Axes whose own
    ticks already suffice are left as they are. Call it once the limits are final.
    """
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    for axis, limits in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
        if axis.get_scale() != "log":
            continue
        lo, hi = sorted(float(v) for v in limits)
        if not (lo > 0 and np.isfinite(hi) and hi > lo):
            continue
        if len(_inside(axis.get_major_locator().tick_values(lo, hi), lo, hi)) >= min_labels:
            continue
        base = float(getattr(axis.get_transform(), "base", 10.0))
        ticks = _narrow_log_ticks(lo, hi, base, min_labels)
        axis.set_major_locator(FixedLocator(ticks))
        integers = base == 2 and all(float(t).is_integer() and t < 1e6 for t in ticks)
        axis.set_major_formatter(FuncFormatter(lambda v, _pos, whole=integers: f"{v:.0f}" if whole else _tick_text(v)))
        axis.set_minor_formatter(NullFormatter())


def _inside(ticks, lo: float, hi: float) -> list[float]:
    return [float(t) for t in ticks if lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9)]


def _narrow_log_ticks(lo: float, hi: float, base: float, min_labels: int) -> list[float]:
    """At least ``min_labels`` round values in ``[lo, hi]`` (see :func:`readable_log_ticks`)."""
    from matplotlib.ticker import MaxNLocator

    if base == 2:
        options, step = ((1.0,), (1.0, 1.5), (1.0, 1.25, 1.5, 1.75)), 2.0
    else:
        # 1, 2, 3, 5 before 1...9: in a range under a decade, 1...9 crowds its upper end (700, 800, 900, 1000)
        options, step = ((1.0,), (1.0, 3.0), (1.0, 2.0, 5.0), (1.0, 2.0, 3.0, 5.0),
                         tuple(float(m) for m in range(1, 10))), 10.0
    k0, k1 = math.floor(math.log(lo, step)) - 1, math.ceil(math.log(hi, step)) + 1
    for subs in options:
        ticks = _inside(sorted({m * step**k for k in range(k0, k1 + 1) for m in subs}), lo, hi)
        if len(ticks) >= min_labels:
            return ticks
    nice = MaxNLocator(nbins=min_labels + 1, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi)
    linear = [t for t in _inside(nice, lo, hi) if t > 0]
    return linear if len(linear) >= min_labels else list(np.geomspace(lo, hi, min_labels))


def _tick_text(value: float) -> str:
    """A tick value as a short plain number: 0.02, 350, 5000, 2e4, 1.5e-5."""
    if value == 0 or not np.isfinite(value):
        return f"{value:g}"
    if 1e-3 <= abs(value) < 1e4:
        return f"{value:.4g}"
    exponent = math.floor(math.log10(abs(value)) + 1e-9)
    return f"{value / 10**exponent:.3g}e{exponent}"


def _log_limits(values: np.ndarray) -> tuple[float, float]:
    positive = values[values > 0]
    lo, hi = float(positive.min()), float(positive.max())
    return lo / 2.0, hi * 2.0


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10"] if n <= 10 else colormaps["viridis"]
    return [cmap(i if n <= 10 else i / max(n - 1, 1)) for i in range(n)]
