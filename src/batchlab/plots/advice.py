"""The trade-off figure of ``batchlab advise``: steps and wall-clock time to the goal against batch size.

:func:`tradeoff_figure` draws an advice record (``<store>/advice/<advice_id>.json``; docs/methods.md,
"The report's Recommendation section") in two panels sharing the batch-size axis (log2, as the
steps-to-result figures of :mod:`batchlab.plots.shallue`): *steps to the goal* (optimizer updates)
and *time to the goal* (seconds of wall clock on the measuring device, from the measured step
times), both on log axes. Each measured batch size of the recommendation's trade-off table is a
point with its interval as an error bar; an interval unbounded above (its ``high`` infinite, or null
as advise writes a non-finite end) is a dotted stem with an open triangle; a batch size whose goal was not reached (censored) is drawn at its bound with an upward
arrow (the steps, or the time, exceed it), or as an ``x`` along the top edge when no bound is known,
never as if reached. The recommended batch size is starred and marked by a vertical line in both
panels; the interval of the critical batch size ``B_crit`` (``mccandlish_b_crit`` of the last round's
fit) is shaded, to the panel's edge where it is unbounded.

The record is read defensively: a missing or malformed field leaves its mark out, never raises,
except when there is nothing at all to draw (no trade-off table with a positive batch size), which
is one :class:`~batchlab.errors.BatchlabError` line.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from batchlab.errors import BatchlabError
from batchlab.plots.axes import log2_x_axis, readable_log_ticks, wrap_text

#: The two panels: (key of the table row, y label).
PANELS = (("steps", "steps to the goal (optimizer updates)"),
          ("seconds", "time to the goal (seconds on the device)"))
_COLOR = "tab:blue"
_MARK = "tab:red"
_SHADE = "tab:orange"
_UNBOUNDED_MARKER = "^"


def _number(value) -> float | None:
    """``value`` as a float when it is a real number (bools and strings are not), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return None if math.isnan(value) else value


def _positive(value) -> float | None:
    value = _number(value)
    return value if value is not None and value > 0 else None


def table_rows(record: dict) -> list[dict]:
    """The trade-off table of ``record`` (``recommendation.table``), the rows with a positive batch
    size, sorted by batch size; ``[]`` when there is none."""
    rec = record.get("recommendation") if isinstance(record, dict) else None
    table = rec.get("table") if isinstance(rec, dict) else None
    if not isinstance(table, list):
        return []
    rows = [row for row in table if isinstance(row, dict) and _positive(row.get("batch_size")) is not None]
    return sorted(rows, key=lambda row: float(row["batch_size"]))


def b_crit_interval(record: dict) -> dict | None:
    """``{"value", "low", "high"}`` of B_crit the figure shades: the recommendation's ``b_crit`` when
    it carries one, else the last round's fit that has one; None when no round has a fit."""
    rec = record.get("recommendation") if isinstance(record, dict) else None
    if isinstance(rec, dict) and isinstance(rec.get("b_crit"), dict):
        return rec["b_crit"]
    rounds = record.get("rounds") if isinstance(record, dict) else None
    for entry in reversed(rounds if isinstance(rounds, list) else []):
        bc = entry.get("b_crit") if isinstance(entry, dict) else None
        if isinstance(bc, dict) and any(_number(bc.get(k)) is not None for k in ("value", "low", "high")):
            return bc
    return None


def censored_bounds(row: dict) -> dict:
    """``{"steps", "examples", "seconds"}``: the bounds an unreached (censored) table row's quantities
    exceed, each None where unknown: a cell's ``value``, else its ``low``, else derived from the row's
    ``censored_at`` (the last evaluated step without the goal: steps; times the batch size for
    examples; times the step time ``seconds_per_step`` for seconds)."""
    b, at = _positive(row.get("batch_size")), _positive(row.get("censored_at"))
    spp = row.get("seconds_per_step")
    spp = _positive(spp.get("value")) if isinstance(spp, dict) else _positive(spp)
    derived = {"steps": at, "examples": None if at is None or b is None else at * b,
               "seconds": None if at is None or spp is None else at * spp}
    out = {}
    for key in ("steps", "examples", "seconds"):
        cell = row.get(key)
        cell = cell if isinstance(cell, dict) else {"value": cell}
        given = (_positive(cell.get(k)) for k in ("value", "low"))
        out[key] = next((v for v in given if v is not None and math.isfinite(v)), derived[key])
    return out


def _point(row: dict, key: str) -> tuple[str, float | None, float | None, float | None]:
    """``(kind, value, low, high)`` of one table cell: kind ``reached`` (value with interval ends,
    None where unknown), ``censored`` (value = the bound the quantity exceeds, :func:`censored_bounds`)
    or ``unknown``."""
    cell = row.get(key)
    cell = cell if isinstance(cell, dict) else {"value": cell}
    value, low, high = (_number(cell.get(k)) for k in ("value", "low", "high"))
    if "high" in cell and cell["high"] is None:  # advise writes an unbounded end (inf) as null
        high = math.inf
    reached = row.get("reached")
    if reached is False:
        bound = censored_bounds(row)[key]
        return ("censored", bound, None, None) if bound is not None else ("unknown", None, None, None)
    if value is None or not value > 0 or not math.isfinite(value):
        return "unknown", None, None, None
    return "reached", value, low, high


def tradeoff_figure(record: dict, title: str | None = None, caption: str | None = None) -> Figure:
    """Steps and time to the goal against batch size for one advice record (see the module docstring).

    Args:
        record: an advice record as :func:`batchlab.report.recommendation.read_advice_records` returns it.
        title: the figure's title (default: the record's unit).
        caption: a line saying which trials the points rest on, shown above the legend.

    Artists carry gids the tests read: ``data`` (the reached points), ``interval``, ``interval_unbounded``,
    ``censored``, ``not_reached``, ``recommended`` (star and vertical line), ``b_crit_interval``.
    """
    rows = table_rows(record)
    if not rows:
        raise BatchlabError("nothing to plot: the advice record has no trade-off table (no recommendation yet)")
    rec = record.get("recommendation") if isinstance(record.get("recommendation"), dict) else {}
    chosen = _positive(rec.get("batch_size"))
    if chosen is None:
        chosen = next((float(r["batch_size"]) for r in rows if r.get("recommended") is True), None)
    bc = b_crit_interval(record)
    fig = Figure(figsize=(10.4, 4.6))
    axes = fig.subplots(1, 2, sharex=True)
    drawn: set[str] = set()
    sizes = [float(r["batch_size"]) for r in rows]
    for ax, (key, ylabel) in zip(axes, PANELS):
        drawn |= _panel(ax, rows, key, chosen)
        ax.set_ylabel(ylabel)
        ax.set_xlabel("batch size")
    lo_b, hi_b = min(sizes), max(sizes)
    if chosen is not None:
        lo_b, hi_b = min(lo_b, chosen), max(hi_b, chosen)
    for ax in axes:
        log2_x_axis(ax)
        ax.set_xlim(lo_b / 2 ** 0.5, hi_b * 2 ** 0.5)
        if bc is not None and _shade_b_crit(ax, bc):
            drawn.add("b_crit")
        ax.grid(True, which="major", alpha=0.3)
        readable_log_ticks(ax)
    proxies = _legend_proxies(axes[0], drawn, bc)
    legend = fig.legend(handles=proxies, labels=[p.get_label() for p in proxies], fontsize=8, loc="upper center",
                        bbox_to_anchor=(0.5, 0.02), ncol=2, frameon=False, title=wrap_text(caption, 150),
                        title_fontsize=7)
    legend.set_gid("legend")
    head = title if title is not None else str(record.get("unit") or "advice")
    fig.suptitle(head, fontsize=10)
    fig.subplots_adjust(wspace=0.28)
    return fig


def _panel(ax, rows: list[dict], key: str, chosen: float | None) -> set[str]:
    """One panel: the rows' ``key`` cells against batch size; returns what was drawn."""
    drawn: set[str] = set()
    points = [(float(r["batch_size"]), *_point(r, key)) for r in rows]
    reached = [(b, v, lo, hi) for b, kind, v, lo, hi in points if kind == "reached"]
    censored = [(b, v) for b, kind, v, _, _ in points if kind == "censored"]
    unknown = [b for b, kind, *_ in points if kind == "unknown"]
    values = [v for _, v, _, _ in reached] + [v for _, v in censored]
    if reached:
        b, v = (np.asarray(c, dtype=float) for c in zip(*[(p[0], p[1]) for p in reached]))
        ax.plot(b, v, "o-", color=_COLOR, zorder=3)[0].set_gid("data")
        drawn.add("data")
        bars, open_above = [], []
        for bb, vv, lo, hi in reached:
            if hi is not None and not math.isfinite(hi):
                open_above.append((bb, vv))
            elif hi is not None or lo is not None:
                low = vv if lo is None or not math.isfinite(lo) else min(lo, vv)
                high = vv if hi is None else max(hi, vv)
                bars.append((bb, vv, vv - low, high - vv))
                values += [x for x in (low, high) if x > 0]
        if bars:
            bb, vv, below, above = (np.asarray(c, dtype=float) for c in zip(*bars))
            container = ax.errorbar(bb, vv, yerr=[below, above], fmt="none", ecolor=_COLOR, elinewidth=1.1,
                                    capsize=3, alpha=0.8, zorder=2)
            for artist in container.get_children():
                artist.set_gid("interval")
            drawn.add("interval")
        if open_above:
            bb, vv = (np.asarray(c, dtype=float) for c in zip(*open_above))
            top = vv * 2 ** 0.5
            ax.vlines(bb, vv, top, colors=[_COLOR], linestyles=":", lw=1.1, zorder=2).set_gid("interval_unbounded")
            ax.plot(bb, top, _UNBOUNDED_MARKER, color=_COLOR, mfc="none", ms=5, zorder=2)[0].set_gid(
                "interval_unbounded")
            values += list(top)
            drawn.add("interval_unbounded")
    if censored:
        b, c = (np.asarray(col, dtype=float) for col in zip(*censored))
        container = ax.errorbar(b, c, yerr=[np.zeros_like(c), c * (2 ** 0.6 - 1.0)], lolims=True, fmt="_",
                                color=_COLOR, ms=12, mew=2, elinewidth=1.5, capsize=0, zorder=4)
        for artist in container.get_children():
            artist.set_gid("censored")
        values += list(c * 2 ** 0.6)
        drawn.add("censored")
    if unknown:
        ax.plot(np.asarray(unknown, dtype=float), [0.97] * len(unknown), "x", color=_COLOR, ms=8, mew=2,
                transform=ax.get_xaxis_transform(), clip_on=False, zorder=4)[0].set_gid("not_reached")
        drawn.add("unknown")
    if chosen is not None:
        ax.axvline(chosen, color=_MARK, lw=1.2, ls="--", zorder=1).set_gid("recommended")
        at = [v for b, v, _, _ in reached if b == chosen]
        if at:
            ax.plot([chosen], at, "*", color=_MARK, ms=15, mec="k", mew=0.6, zorder=5)[0].set_gid("recommended")
        drawn.add("recommended")
    ax.set_yscale("log")
    if values:
        lo, hi = min(values), max(values)
        ax.set_ylim(lo / 1.6, hi * 1.6)
    else:  # nothing to place on this axis: say so, on a fixed range a log axis can draw
        ax.set_ylim(1.0, 10.0)
        ax.text(0.5, 0.5, "no value or bound in the record", transform=ax.transAxes, ha="center", va="center",
                fontsize=9, color="0.4").set_gid("no_values")
    return drawn


def _shade_b_crit(ax, bc: dict) -> bool:
    """Shade B_crit's interval ``[low, high]`` (an unbounded or missing end: the panel's edge) and draw
    its value as a thin line; False when the interval has neither end nor value."""
    value, low, high = (_positive(bc.get(k)) for k in ("value", "low", "high"))
    if low is None and high is None and value is None:
        return False
    left, right = ax.get_xlim()
    lo = left if low is None else max(low, left)
    hi = right if high is None or not math.isfinite(high) else min(high, right)
    if hi > lo and (low is not None or high is not None):
        ax.axvspan(lo, hi, color=_SHADE, alpha=0.15, lw=0, zorder=0).set_gid("b_crit_interval")
    if value is not None and math.isfinite(value) and left <= value <= right:
        ax.axvline(value, color=_SHADE, lw=1.0, alpha=0.9, zorder=0).set_gid("b_crit_interval")
    ax.set_xlim(left, right)
    return True


def _legend_proxies(ax, drawn: set[str], bc: dict | None) -> list:
    proxies = []
    if "data" in drawn:
        proxies.append(ax.plot([], [], "o-", color=_COLOR, label="measured batch size (best trial's steps or time)")[0])
    if "interval" in drawn:
        proxies.append(ax.errorbar([], [], yerr=[[], []], fmt="none", ecolor=_COLOR, capsize=3,
                                   label="interval (advice record's)"))
    if "interval_unbounded" in drawn:
        proxies.append(ax.plot([], [], marker=_UNBOUNDED_MARKER, ls=":", color=_COLOR, ms=6, mfc="none",
                               label="interval unbounded above")[0])
    if "censored" in drawn:
        proxies.append(ax.plot([], [], marker=r"$\uparrow$", ls="none", color=_COLOR, ms=10,
                               label="goal not reached: more than the bound (censored)")[0])
    if "unknown" in drawn:
        proxies.append(ax.plot([], [], "x", color=_COLOR, mew=2, ls="none", label="no value or bound known")[0])
    if "recommended" in drawn:
        proxies.append(ax.plot([], [], "*--", color=_MARK, ms=12, mec="k", mew=0.6, label="recommended batch size")[0])
    if "b_crit" in drawn and bc is not None:
        text = "B_crit (line) and its interval (last fit; shaded to the edge where unbounded)"
        proxies.append(Patch(facecolor=_SHADE, alpha=0.15, lw=0, label=text))
    return proxies
