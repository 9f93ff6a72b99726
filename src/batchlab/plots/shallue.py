"""The steps-to-result figures of Shallue et al. (2018), one function each; every one returns a matplotlib Figure.

* :func:`steps_to_result_figure`: steps to result against batch size on log2 axes, with each reached
  point's resolution bracket ``(steps_lower, steps]`` as an error bar below it, the perfect-scaling
  line ``S(B0) * B0 / B`` from each curve's smallest reached batch size ``B0``, and, when given, the
  fitted ``S(B) = S_min + E_min / B`` (dashed, labelled as a fit). Unreached (censored) batch sizes are
  drawn at their censoring bound with an upward arrow (the steps exceed it), never as if reached; with
  no known bound, an ``x`` along the top edge; with several curves each curve's marks are shifted
  sideways a little, so none hides another. With one curve, the regimes read from the data
  (perfect scaling, maximal data parallelism; docs/methods.md, "Regimes read from the data") are shaded
  (:func:`data_regimes`). Intervals of the steps: one-sided ones (an upper bound) as a bar from the
  point up to the bound, and a reached point whose interval is unbounded above as a dotted stem with
  an open triangle. Batch sizes with a tuning flag (docs/methods.md, "Tuning flags"; ``flagged``)
  are ringed in red at their point (or at their censoring bound), legend "tuning flag".
* :func:`compare_workloads_figure`: several curves normalised to compare workloads (each divided by
  its steps at a reference batch size).
* :func:`goals_figure`: several goals on one workload.

The figures of the tuned metaparameters (:func:`metaparameters_figure`, :func:`lr_momentum_scatter_figure`,
:func:`best_measurement_figure`) live in :mod:`batchlab.plots.tuning`, the shared axes, ticks, colours
and :func:`save_figure` in :mod:`batchlab.plots.axes`; both are imported here too, so existing imports
from this module keep working. Curves are :class:`~batchlab.analysis.curve.StepsCurve`, so NQM and
measured curves plot the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from batchlab.analysis.critical_batch_size import ScalingFit
from batchlab.analysis.curve import StepsCurve
from batchlab.errors import BatchlabError
from batchlab.plots.axes import (
    FORMATS,
    MIN_LOG_LABELS,
    check_figure_path,
    distinct_colors,
    log2_x_axis,
    readable_log_ticks,
    save_figure,
    wrap_text,
)
from batchlab.plots.tuning import (
    OUTCOME_STYLE,
    best_measurement_figure,
    lr_momentum_scatter_figure,
    metaparameters_figure,
    scatter_columns,
)

# this module's figures, and those of batchlab.plots.tuning and the saving helpers, which callers have
# always imported from here
__all__ = [
    "FORMATS", "MIN_LOG_LABELS", "OUTCOME_STYLE", "best_measurement_figure", "check_figure_path",
    "compare_workloads_figure", "data_regimes", "goals_figure", "lr_momentum_scatter_figure",
    "metaparameters_figure", "readable_log_ticks", "save_figure", "scatter_columns", "steps_to_result_figure",
]


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
    flagged: Sequence[Sequence[int] | None] | None = None,
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
        flagged: optional per curve, the batch sizes with a tuning flag
            (:func:`batchlab.analysis.tuning_flags.tuning_flags`): each is ringed in red
            (``gid="tuning_flag"``) at its point, or at its censoring bound when not reached;
            batch sizes not on the curve, or unreached without a bound, are not drawn.
    """
    if not curves:
        raise BatchlabError("nothing to plot: give at least one steps-to-result curve")
    if not 0 < tolerance < 1:
        raise BatchlabError(f"tolerance must be in (0, 1), got {tolerance}")
    fits = list(fits) if fits is not None else [None] * len(curves)
    intervals = list(intervals) if intervals is not None else [None] * len(curves)
    flagged = list(flagged) if flagged is not None else [None] * len(curves)
    if len(flagged) != len(curves):
        raise BatchlabError(f"flagged: {len(flagged)} entries for {len(curves)} curves; give one (or None) per curve")
    shade = (len(curves) == 1) if regimes is None else bool(regimes)
    fig = Figure(figsize=(6.4, 4.8))
    ax = fig.add_subplot()
    colors = distinct_colors(len(curves))
    drawn: set[str] = set()
    lowest = np.inf
    b0_values = []
    offsets = _curve_offsets(len(curves))
    for curve, fit, bounds, color, offset, marks in zip(curves, fits, intervals, colors, offsets, flagged):
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
        if marks:
            drawn |= _flag_rings(ax, curve, marks, scale, offset)
        bounds_at = [c for b_, s_, c in zip(curve.batch_sizes, curve.steps, _aligned(curve, "censored_at"))
                     if s_ is None and c is not None and c > 0]
        if bounds_at:  # keep every censoring bound in view
            lowest = min(lowest, min(bounds_at) / scale)
        if shade:
            drawn |= _shade_regimes(ax, curve, tolerance, b)
    log2_x_axis(ax)
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
    if "tuning_flag" in drawn:
        proxies.append(ax.plot([], [], "o", ms=13, mfc="none", mec=_FLAG_COLOR, mew=1.6, ls="none",
                               label="tuning flag")[0])
    for name, (color, text) in _REGIME_STYLE.items():
        if name in drawn:
            proxies.append(Patch(facecolor=color, alpha=0.12, lw=0, label=text))
    legend = ax.legend(handles + proxies, labels + [p.get_label() for p in proxies], fontsize=8,
                       loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False,
                       title=wrap_text(caption, 110), title_fontsize=7)
    legend.set_gid("legend")
    ax.grid(True, which="major", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    readable_log_ticks(ax)
    return fig


_UNBOUNDED_MARKER = "^"
_FLAG_COLOR = "tab:red"


def _flag_rings(ax, curve: StepsCurve, batch_sizes, scale: float, offset: float = 0.0) -> set[str]:
    """Red rings (``gid="tuning_flag"``) around the flagged batch sizes: at the reached point, or at the
    censoring bound (shifted like the censored mark by ``offset`` octaves) when not reached."""
    wanted = {int(b) for b in batch_sizes}
    points = []
    for b, s, c in zip(curve.batch_sizes, curve.steps, _aligned(curve, "censored_at")):
        if int(b) not in wanted:
            continue
        if s is not None:
            points.append((float(b), float(s)))
        elif c is not None:
            points.append((float(b) * 2.0 ** offset, float(c)))
    if not points:
        return set()
    x, y = (np.asarray(col, dtype=float) for col in zip(*points))
    rings = ax.plot(x, y / scale, "o", ms=13, mfc="none", mec=_FLAG_COLOR, mew=1.6, ls="none", zorder=5)[0]
    rings.set_gid("tuning_flag")
    return {"tuning_flag"}


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
    # shaded as "ends beyond the measured range" only when that is what the data say (not when undetermined)
    beyond = ps.get("lower_bound") if ps.get("value") is None and ps.get("kind") == "beyond_range" else None
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
