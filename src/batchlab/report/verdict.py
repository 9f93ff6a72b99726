"""The report's verdict on the learning-rate scaling rules (docs/methods.md, "The report").

Over which batch sizes does the **linear** rule (optimal effective learning rate ∝ B) or the
**square-root** rule (∝ sqrt(B)) fit the tuned optimum, given how finely the search located it?

Inputs, per reached batch size ``B_i`` (increasing): the best trial's effective learning rate
``y_i = η/(1−γ)`` (η without momentum), whether that best trial lies at a search edge
(:func:`batchlab.analysis.metaparameters.search_edge_warnings`, learning rate or momentum), and the
search's *resolution* there, ``δ_i``: the distance in log effective learning rate from the best trial
to the nearest other trial of that batch size (any outcome; ``inf`` with a single trial). The optimum
is only known to within that distance.

Rule: the anchor ``B_a`` is the smallest reached batch size whose best trial is not at a search edge.
A rule with exponent ``k`` (1 linear, 1/2 square root) *fits at* ``B_i`` when
``|log y_i − log y_a − k log(B_i/B_a)| <= δ_a + δ_i`` (the rule line through the anchor passes within
the two points' resolutions). The rule *fits from B_a to B_b* when it fits at every reached batch
size from ``B_a`` to ``B_b`` and none of them is at a search edge; the range ends before the first
batch size where it does not fit (a *departure*) or whose best trial is at a search edge (the
verdict there is *undetermined*). A claim needs at least two batch sizes (``B_b > B_a``). When both
rules fit the same range the search cannot tell them apart, and the verdict says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

RULES = {"linear": 1.0, "square_root": 0.5}
RULE_WORDS = {"linear": "linear rule", "square_root": "square-root rule"}


@dataclass(frozen=True)
class RuleFit:
    """How far one rule fits: ``end`` (the last batch size of its range; ``None`` if it fits nowhere
    beyond the anchor), ``stop`` (the batch size where the range ends: ``None`` at the last reached
    batch size) and ``why`` (``departure``, ``search edge`` or ``end of data``), ``ratio`` at the stop (tuned /
    rule; departure only)."""

    rule: str
    end: float | None
    stop: float | None
    why: str
    ratio: float | None = None


@dataclass(frozen=True)
class Verdict:
    """The verdict of one optimizer: ``anchor`` (None: undetermined everywhere), per-rule fits, the
    local log-log slopes between consecutive reached batch sizes, and the sentence."""

    anchor: float | None
    fits: dict[str, RuleFit] = field(default_factory=dict)
    slopes: tuple[tuple[float, float, float | None], ...] = ()
    edge_batch_sizes: tuple[float, ...] = ()
    text: str = ""


def resolution(best_value: float, others: np.ndarray) -> float:
    """``δ``: the smallest |log(other / best)| over the other trials' finite positive values (inf if none)."""
    others = np.asarray(others, dtype=float)
    others = others[np.isfinite(others) & (others > 0)]
    if not (math.isfinite(best_value) and best_value > 0) or others.size == 0:
        return math.inf
    gaps = np.abs(np.log(others / best_value))
    gaps = gaps[gaps > 0]
    return float(gaps.min()) if gaps.size else math.inf


def scaling_verdict(batch_sizes, values, edges, resolutions) -> Verdict:
    """The verdict (module docstring) from aligned arrays over the reached batch sizes: ``values`` the
    optimal effective learning rates, ``edges`` booleans (search-edge limited), ``resolutions`` ``δ``."""
    b = np.asarray(batch_sizes, dtype=float)
    y = np.asarray(values, dtype=float)
    edge = np.asarray(edges, dtype=bool)
    delta = np.asarray(resolutions, dtype=float)
    slopes = []
    for i in range(len(b) - 1):
        ok = all(np.isfinite([y[i], y[i + 1]])) and y[i] > 0 and y[i + 1] > 0 and not edge[i] and not edge[i + 1]
        slopes.append((float(b[i]), float(b[i + 1]),
                       float(np.log(y[i + 1] / y[i]) / np.log(b[i + 1] / b[i])) if ok else None))
    edge_b = tuple(float(x) for x in b[edge])
    usable = [i for i in range(len(b)) if not edge[i] and np.isfinite(y[i]) and y[i] > 0]
    if not usable:
        text = ("undetermined: " + ("no reached batch size" if len(b) == 0 else
                "every reached batch size's best trial lies at a search edge (or has no learning rate)"))
        return Verdict(None, {}, tuple(slopes), edge_b, text)
    a = usable[0]
    fits = {}
    for rule, k in RULES.items():
        end, stop, why, ratio = None, None, "end of data", None
        for i in range(a + 1, len(b)):
            if edge[i] or not (np.isfinite(y[i]) and y[i] > 0):
                stop, why = float(b[i]), "search edge"
                break
            predicted = y[a] * (b[i] / b[a]) ** k
            if abs(math.log(y[i] / predicted)) > delta[a] + delta[i]:
                stop, why, ratio = float(b[i]), "departure", float(y[i] / predicted)
                break
            end = float(b[i])
        fits[rule] = RuleFit(rule, end, stop, why, ratio)
    return Verdict(float(b[a]), fits, tuple(slopes), edge_b, _sentence(float(b[a]), fits, edge_b, b[:a]))


def _fmt_b(value: float) -> str:
    return f"{value:g}"


def _sentence(anchor: float, fits: dict[str, RuleFit], edge_b: tuple[float, ...], before) -> str:
    parts = []
    if len(before):
        parts.append(f"undetermined below B={_fmt_b(anchor)} (best trial at a search edge)")
    lin, sq = fits["linear"], fits["square_root"]
    a = _fmt_b(anchor)
    if lin.end is not None and sq.end is not None:
        common = min(lin.end, sq.end)
        parts.append(f"both the linear and the square-root rule fit from B={a} to B={_fmt_b(common)}: "
                     "the search is too coarse to tell them apart there")
        if lin.end != sq.end:
            longer = lin if lin.end > sq.end else sq
            parts.append(f"only the {RULE_WORDS[longer.rule]} fits on to B={_fmt_b(longer.end)}")
    elif lin.end is not None or sq.end is not None:
        fit = lin if lin.end is not None else sq
        parts.append(f"the {RULE_WORDS[fit.rule]} fits from B={a} to B={_fmt_b(fit.end)}")
    elif lin.stop is None:
        parts.append(f"only B={a} is usable: no rule can be tested")
    elif lin.why == "search edge":
        parts.append(f"undetermined from B={_fmt_b(lin.stop)} (best trial at a search edge)")
    else:
        parts.append(f"neither rule fits from B={a}: at B={_fmt_b(lin.stop)} the tuned optimum is "
                     f"{lin.ratio:.2g}x the linear and {sq.ratio:.2g}x the square-root rule")
    if lin.end is None and sq.end is None:
        return "; ".join(dict.fromkeys(parts))
    for f in (lin, sq):
        if f.stop is None:
            continue
        if f.why == "departure":
            parts.append(f"the {RULE_WORDS[f.rule]} departs at B={_fmt_b(f.stop)} (tuned {f.ratio:.2g}x the rule)")
        else:
            parts.append(f"undetermined from B={_fmt_b(f.stop)} (best trial at a search edge)")
    return "; ".join(dict.fromkeys(parts))
