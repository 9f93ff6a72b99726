"""Figures of the tuned metaparameters and of the search behind them; every one returns a matplotlib Figure.

* :func:`metaparameters_figure`: the best trial's learning rate, 1 - momentum and effective learning
  rate against batch size, with the linear and square-root heuristics anchored at the smallest batch
  size; points whose best trial lies at the edge of its searched range are ringed in red.
* :func:`lr_momentum_scatter_figure`: every trial in the (learning rate, 1 - momentum) plane, marked
  goal reached / not reached / raced / diverged (:data:`OUTCOME_STYLE`), in a near-square grid of
  panels (at most 4 columns, :func:`scatter_columns`), with contours of log10 of the effective
  learning rate keyed by a colour bar; trials on one point are spread around it and counted.
* :func:`best_measurement_figure`: the best measurement against batch size, one line per budget, and
  against the budget, one line per batch size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from batchlab.errors import BatchlabError
from batchlab.plots.axes import distinct_colors, log2_x_axis, log_limits, plain_log_axes, readable_log_ticks, wrap_text

OUTCOME_STYLE = {
    "reached": {"marker": "o", "color": "tab:blue", "label": "goal reached"},
    "not_reached": {"marker": "o", "color": "0.6", "label": "goal not reached", "facecolors": "none"},
    "raced": {"marker": "s", "color": "tab:orange", "label": "raced: stopped, could not beat the best",
              "facecolors": "none"},
    "diverged": {"marker": "x", "color": "tab:red", "label": "diverged"},
}



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
        log2_x_axis(ax)
        shown = np.concatenate([line.get_ydata() for line in ax.lines])
        shown = shown[np.isfinite(shown) & (shown > 0)]
        if shown.size and shown.min() == shown.max():  # a flat line: give the log axis some room
            ax.set_ylim(shown.min() / 2.0, shown.max() * 2.0)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
        readable_log_ticks(ax)
    heading = "\n".join(t for t in (title, wrap_text(caption, 60 * len(panels))) if t)
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
    xlim = log_limits(np.concatenate([lr, box_x]))
    ylim = log_limits(np.concatenate([om, box_y]))
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
        plain_log_axes(ax)
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
    heading = "\n".join(t for t in (title, wrap_text(caption, 34 * ncols + 20)) if t)
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
    for budget, row, color in zip(sweep.budgets, sweep.best, distinct_colors(len(sweep.budgets))):
        if not np.isfinite(row).any():
            continue  # no batch size has a measurement within this budget
        by_batch.plot(b, row, "o-", color=color, label=f"{sweep.kind} budget {budget:,}")
    log2_x_axis(by_batch)
    by_batch.set_xlabel("batch size")
    budgets = np.asarray(sweep.budgets, dtype=float)
    for j, color in zip(range(len(b)), distinct_colors(len(b))):
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
