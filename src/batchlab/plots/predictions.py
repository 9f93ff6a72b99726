"""Figures of the report's predictions section (docs/methods.md, "Predictions in the report").

* :func:`predictions_figure`: predicted critical batch sizes with their intervals on a log2 axis, one
  row per prediction, against the measured B_crit (a vertical line, its interval shaded) and the band
  from half to twice the measured value.
* :func:`b_simple_figure`: B_simple with its interval against the reference run's step, one series per
  reference run (bounds drawn as bounds, never joined into the line), against the measured B_crit (a
  horizontal line, its interval shaded).

Both take plain numbers (``None`` for a missing value or an unbounded interval side) and return a
:class:`matplotlib.figure.Figure` (no pyplot state, Agg canvas). Points without a value are not drawn:
the caller lists them in the caption.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from batchlab.plots.axes import distinct_colors, log2_x_axis, readable_log_ticks, tick_text

MEASURED_COLOR = "#333333"
BAND_COLOR = "#4a7"


@dataclass(frozen=True)
class Measured:
    """The measured B_crit drawn for reference: ``value`` (None or non-finite: not drawn) and its
    interval ``low``/``high`` (None: unbounded on that side)."""

    value: float | None
    low: float | None = None
    high: float | None = None

    @property
    def drawn(self) -> bool:
        return _positive(self.value)


@dataclass(frozen=True)
class Point:
    """One prediction: a row ``label``, its ``value`` and interval ``low``/``high`` (None: unbounded);
    ``has_interval`` False: the prediction has no interval (only the marker is drawn); ``bound`` True:
    the prediction is a bound (``value`` the bound, one side of the interval unbounded): drawn as a bar
    from the bound to the open side with a bar-shaped marker at the bound, no point marker."""

    label: str
    value: float | None
    low: float | None = None
    high: float | None = None
    has_interval: bool = True
    bound: bool = False


@dataclass(frozen=True)
class Series:
    """One reference run's B_simple across training: ``steps``, ``values``, ``lows``, ``highs``, and per
    step its reading ``kinds`` (:func:`batchlab.probes.scoring.classify`: ``point``, ``lower_bound``,
    ``upper_bound``, ``none``; ``None``: every step a point). A bound's ``value`` is the bound."""

    label: str
    steps: Sequence[int]
    values: Sequence[float | None]
    lows: Sequence[float | None]
    highs: Sequence[float | None]
    kinds: Sequence[str] | None = None

    def kind_at(self, i: int) -> str:
        return "point" if self.kinds is None else self.kinds[i]


def _positive(value) -> bool:
    return value is not None and math.isfinite(float(value)) and float(value) > 0


def _limits(values: list[float]) -> tuple[float, float]:
    """Log-axis limits a factor 2 beyond the positive finite ``values`` (1 to 2 when none)."""
    good = [float(v) for v in values if _positive(v)]
    if not good:
        return 1.0, 2.0
    return min(good) / 2.0, max(good) * 2.0


def predictions_figure(points: Sequence[Point], measured: Measured, title: str) -> Figure:
    """Predicted critical batch sizes (one row per point, top to bottom in order) on a log2 x axis.

    Each drawn point is a marker with a horizontal bar over its interval (the marker alone when it has
    none); an unbounded side runs to the axis edge and ends in an arrow; a bound has a bar-shaped marker
    at the bound instead of a point. When ``measured`` is drawn: a vertical line at its value, its
    interval shaded, and the band from value/2 to 2 x value shaded more lightly (the "within 2x" band).
    Points whose value is missing or not positive are left out (the caller names them in its caption).
    """
    drawn = [p for p in points if _positive(p.value)]
    fig = Figure(figsize=(7.5, 1.6 + 0.45 * max(len(drawn), 1)))
    ax = fig.add_subplot()
    candidates = [v for p in drawn for v in ((p.value, p.low, p.high) if p.has_interval else (p.value,))]
    if measured.drawn:
        m = float(measured.value)
        candidates += [m / 2, m * 2, measured.low, measured.high]
    lo, hi = _limits(candidates)
    if measured.drawn:
        ax.axvspan(m / 2, m * 2, color=BAND_COLOR, alpha=0.25, lw=0, label="within 2x of the measured B_crit")
        m_lo = measured.low if _positive(measured.low) else lo
        m_hi = measured.high if _positive(measured.high) else hi
        ax.axvspan(m_lo, m_hi, facecolor=MEASURED_COLOR, alpha=0.1, edgecolor=MEASURED_COLOR, ls=":", lw=1,
                   label="measured B_crit interval")
        ax.axvline(m, color=MEASURED_COLOR, lw=1.5, label=f"measured B_crit {m:.4g}")
    colors = distinct_colors(max(len(drawn), 1))
    for i, p in enumerate(drawn):
        y = len(drawn) - 1 - i
        v = float(p.value)
        if not p.has_interval:
            ax.plot([v], [y], marker="o", color=colors[i], ms=7, markeredgecolor="black")
            continue
        left = float(p.low) if _positive(p.low) else lo
        right = float(p.high) if p.high is not None and math.isfinite(float(p.high)) else hi
        ax.plot([left, right], [y, y], color=colors[i], lw=2, solid_capstyle="butt")
        if not _positive(p.low):
            ax.plot([lo], [y], marker="<", color=colors[i], ms=7)
        if p.high is None or not math.isfinite(float(p.high)):
            ax.plot([hi], [y], marker=">", color=colors[i], ms=7)
        if p.bound:
            ax.plot([v], [y], marker="|", color="black", ms=14, mew=2)
        else:
            ax.plot([v], [y], marker="o", color=colors[i], ms=7, markeredgecolor="black")
    log2_x_axis(ax)
    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=8))  # wide ranges: every other octave or sparser
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: tick_text(v)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(lo, hi)
    if measured.drawn:
        ax.text(m * 2, 0.98, "within 2x ", transform=ax.get_xaxis_transform(), ha="right", va="top", fontsize=8,
                color="#275")
    ax.set_ylim(-0.7, max(len(drawn), 1) - 0.3)
    ax.set_yticks(range(len(drawn)))
    ax.set_yticklabels([p.label for p in reversed(drawn)])
    readable_log_ticks(ax)
    ax.set_xlabel("critical batch size (examples, log2 axis)")
    ax.set_ylabel("predictor")
    ax.set_title(title, fontsize=10)
    if measured.drawn:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def b_simple_figure(series: Sequence[Series], measured: Measured, title: str) -> Figure:
    """B_simple with its interval against the reference run's step, one series per reference run.

    The x axis is linear, or symlog (linear up to 1) when a step 0 is drawn; the y axis is log10. Points
    (kind ``point``) are markers with their interval as bars, joined per series; a bound (``lower_bound``
    / ``upper_bound``: an interval open on one side) is never a point nor part of the line: a bar from
    the bound to the open axis edge, ending in an arrow, with a bar-shaped marker at the bound (gid
    ``b_simple_bound``). The measured B_crit is a horizontal line with its interval shaded. Points whose
    value is missing or not positive (and ``none`` readings) are left out; an interval side that is
    unbounded or not positive is not drawn.
    """
    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.add_subplot()
    colors = distinct_colors(max(len(series), 1))
    ys, any_zero, bounds = [], False, []
    for color, s in zip(colors, series):
        readings = [(s.kind_at(i), x, v, lo, hi) for i, (x, v, lo, hi) in enumerate(zip(s.steps, s.values, s.lows,
                                                                                        s.highs)) if _positive(v)]
        xs = [(x, float(v), lo, hi) for kind, x, v, lo, hi in readings if kind == "point"]
        bounds += [(color, kind, x, float(v)) for kind, x, v, _, _ in readings
                   if kind in ("lower_bound", "upper_bound")]
        any_zero |= any(x == 0 for _, x, *_ in readings)
        ys += [float(v) for kind, _, v, _, _ in readings if kind != "none"]
        if not xs:
            if any(b[0] == color for b in bounds):
                ax.plot([], [], color=color, marker="_", ms=10, mew=2, lw=0, label=s.label)
            continue
        steps = [x for x, *_ in xs]
        values = [v for _, v, _, _ in xs]
        below = [v - float(lo) if _positive(lo) and float(lo) <= v else 0.0 for _, v, lo, _ in xs]
        above = [float(hi) - v if _positive(hi) and float(hi) >= v else 0.0 for _, v, _, hi in xs]
        ax.errorbar(steps, values, yerr=[below, above], color=color, marker="o", ms=5, capsize=3, lw=1.5,
                    label=s.label)
        ys += [v - b for v, b in zip(values, below) if v - b > 0] + [v + a for v, a in zip(values, above)]
    if measured.drawn:
        m = float(measured.value)
        ys += [m] + [x for x in (measured.low, measured.high) if _positive(x)]
    lo, hi = _limits(ys)
    for color, kind, x, v in bounds:
        end = hi if kind == "lower_bound" else lo
        ax.plot([x, x], [v, end], color=color, lw=2, solid_capstyle="butt", gid="b_simple_bound")
        ax.plot([x], [end], marker="^" if kind == "lower_bound" else "v", color=color, ms=7, gid="b_simple_bound")
        ax.plot([x], [v], marker="_", color="black", ms=12, mew=2, gid="b_simple_bound")
    if measured.drawn:
        ax.axhspan(measured.low if _positive(measured.low) else lo, measured.high if _positive(measured.high) else hi,
                   color=MEASURED_COLOR, alpha=0.15, lw=0, label="measured B_crit interval")
        ax.axhline(m, color=MEASURED_COLOR, lw=1.5, ls="--", label=f"measured B_crit {m:.4g}")
    steps = [x for s in series for x in s.steps]
    last = max(steps, default=1)
    if any_zero:
        ax.set_xscale("symlog", linthresh=1.0)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: tick_text(v)))
        ax.set_xlim(-0.3, max(last, 1) * 1.5)
        ax.set_xlabel("reference run step (symlog axis: linear below 1)")
    else:
        ax.set_xlabel("reference run step")
    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    readable_log_ticks(ax)
    ax.set_ylabel("B_simple (examples, log axis)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, frameon=False, loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
