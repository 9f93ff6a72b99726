"""Shared figure plumbing of batchlab's plots: atomic saving, log axes with readable ticks, colours.

* :func:`save_figure` writes a figure atomically; :func:`check_figure_path` checks a path first.
* :func:`readable_log_ticks` gives every log axis at least three labelled ticks whatever its range;
  :func:`log2_x_axis` and :func:`plain_log_axes` set the axes the figures use; :func:`tick_text` writes
  a tick value as a short plain number.
* :func:`distinct_colors` picks n distinguishable colours; :func:`wrap_text` wraps a caption.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator

from batchlab.atomic import write_stream_atomic
from batchlab.errors import BatchlabError

FORMATS = ("png", "pdf", "svg")


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



def wrap_text(text: str | None, width: int) -> str | None:
    """``text`` wrapped to lines of at most ``width`` characters (None stays None)."""
    if not text:
        return None
    import textwrap

    return "\n".join(textwrap.wrap(text, width=max(width, 40)))


def log2_x_axis(ax) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=12))


MIN_LOG_LABELS = 3


def plain_log_axes(ax) -> None:
    """Both axes log10, labelled with plain numbers (0.01, 0.1, 1), no minor ticks: many panels draw
    several times faster than with the default mathtext labels and minor ticks."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    for axis, scale in ((ax.xaxis, ax.set_xscale), (ax.yaxis, ax.set_yscale)):
        scale("log")
        axis.set_major_locator(LogLocator(numticks=7))
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: tick_text(v)))
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
        axis.set_major_formatter(FuncFormatter(lambda v, _pos, whole=integers: f"{v:.0f}" if whole else tick_text(v)))
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


def tick_text(value: float) -> str:
    """A tick value as a short plain number: 0.02, 350, 5000, 2e4, 1.5e-5."""
    if value == 0 or not np.isfinite(value):
        return f"{value:g}"
    if 1e-3 <= abs(value) < 1e4:
        return f"{value:.4g}"
    exponent = math.floor(math.log10(abs(value)) + 1e-9)
    return f"{value / 10**exponent:.3g}e{exponent}"


def log_limits(values: np.ndarray) -> tuple[float, float]:
    positive = values[values > 0]
    lo, hi = float(positive.min()), float(positive.max())
    return lo / 2.0, hi * 2.0


def distinct_colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10"] if n <= 10 else colormaps["viridis"]
    return [cmap(i if n <= 10 else i / max(n - 1, 1)) for i in range(n)]
