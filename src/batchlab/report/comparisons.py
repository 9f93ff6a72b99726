"""The optimizers of one base workload and study group compared by their critical batch sizes
(docs/methods.md, "The report", **Optimizers compared**): the B_crit ratio, its range from the two
intervals and whether the difference is held, suggestive or not shown by them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from batchlab.report.content import FigureOut, UnitResult, num, render, slug


HELD, SUGGESTIVE, NOT_SHOWN = "held", "suggestive", "not shown"


def difference_verdict(a: dict, b: dict) -> str:
    """Whether two critical batch sizes differ, read from their intervals (docs/methods.md, "The report",
    **Optimizers compared**): ``held`` when the two intervals are disjoint, ``suggestive`` when they
    overlap but neither point estimate lies inside the other's interval, ``not shown`` otherwise (or when
    either has no point estimate). ``a`` and ``b``: ``{"value", "low", "high"}`` (``None`` ends are
    unbounded)."""
    def ends(d):
        low, high = d.get("low"), d.get("high")
        return (0.0 if low is None else float(low)), (math.inf if high is None else float(high))

    if a.get("value") is None or b.get("value") is None:
        return NOT_SHOWN
    (a_low, a_high), (b_low, b_high) = ends(a), ends(b)
    if a_high < b_low or b_high < a_low:
        return HELD
    if not (b_low <= a["value"] <= b_high) and not (a_low <= b["value"] <= a_high):
        return SUGGESTIVE
    return NOT_SHOWN


@dataclass
class Comparison:
    """The optimizers of one base workload and study group."""

    base: str
    group: str
    units: list[UnitResult]
    baseline: UnitResult | None = None
    ratios: list[dict] = field(default_factory=list)
    figure: FigureOut | None = None
    nqm_ratios: dict = field(default_factory=dict)

    def summary_line(self, with_group: bool = False) -> str | None:
        """``base: a/b B_crit ratio R[, ...]`` (``base [group]`` with ``with_group``); None without ratios."""
        parts = []
        for r in self.ratios:
            text = f"{r['name']} B_crit ratio {num(r['ratio'], 2)} (difference {r['difference']} by the intervals)"
            if r.get("nqm") is not None:
                # the NQM's B_crit is in its own problem's units: only its ordering is a prediction
                def order(x):
                    return None if x is None or not math.isfinite(x) else ">" if x > 1 else "<" if x < 1 else "="

                a, b = r["name"].split("/", 1)
                measured, predicted = order(r["ratio"]), order(r["nqm"])
                verdict = "no measured ratio" if measured is None else (
                    "agrees" if measured == predicted else "disagrees")
                if measured is not None and r["difference"] != HELD:  # the order itself is not established
                    verdict = f"{verdict} in the point estimates only" if r["difference"] == SUGGESTIVE else (
                        "not tested: the intervals do not separate them")
                text += f" (NQM order {a} {predicted or '?'} {b}: {verdict})"
            if r["extrapolated"]:
                text += " (extrapolated)"
            parts.append(text)
        head = f"{self.base} [{self.group}]" if with_group else self.base
        return f"{head}: " + ", ".join(parts) if parts else None


def compare_units(results: list[UnitResult]) -> list[Comparison]:
    """One comparison per (base workload, group) with two or more analysed units."""
    from batchlab.plots.shallue import compare_workloads_figure

    groups: dict[tuple[str, str], list[UnitResult]] = {}
    for r in results:
        if r.status == "analysed" and r.curve is not None:
            groups.setdefault((r.unit.base, r.unit.group), []).append(r)
    out = []
    for (base, group), members in sorted(groups.items()):
        if len(members) < 2:
            continue
        members = sorted(members, key=lambda r: r.unit.optimizer)
        names = [m.unit.optimizer for m in members]
        baseline = members[names.index("sgd")] if "sgd" in names else members[0]
        comp = Comparison(base, group, members, baseline)
        for m in members:
            if m is baseline:
                continue
            a, b = m.b_crit, baseline.b_crit
            if a is None or b is None:
                continue
            ratio = a["value"] / b["value"] if b["value"] not in (0, None) and math.isfinite(b["value"]) else None
            low = a["low"] / b["high"] if a["low"] is not None and b["high"] not in (None, 0) else None
            high = a["high"] / b["low"] if a["high"] is not None and b["low"] not in (None, 0) else None
            comp.ratios.append({"name": f"{m.unit.optimizer}/{baseline.unit.optimizer}", "ratio": ratio, "low": low,
                                "high": high, "difference": difference_verdict(a, b),
                                "extrapolated": a["extrapolated"] or b["extrapolated"],
                                "numerator": m, "denominator": baseline})
        figure = compare_workloads_figure([m.curve for m in members], fits=[m.fit for m in members],
                                          title=f"{base} [{group}]: steps to result, normalised at each curve's B0")
        comp.figure = FigureOut(
            slug(f"{base}-{group}-compare"),
            "Steps to result of each optimizer divided by its own steps at its B0 (its smallest reached batch "
            "size), with the fits: the shapes compare, not the absolute steps.",
            f"optimizers of {base} compared, normalised", render(figure))
        out.append(comp)
    return out
