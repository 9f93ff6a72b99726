"""The recommendation: which measured batch size to train at, its tuned metaparameters, and what each
measured batch size costs (docs/methods.md, "The recommendation").

:func:`recommend` reads a unit's measured points (:func:`~batchlab.advise.unit_points.unit_points`,
re-exported here) and the measured step times, and answers for an objective:

* ``"time"``: the measured, reached batch size with the least expected wall-clock time to the goal,
  ``steps x seconds_per_step(B)``;
* ``"examples"``: the largest measured, reached batch size whose examples to the goal (``steps x B``)
  are within :data:`EXAMPLES_TOLERANCE` (1.2, the 20% overhead of ``overhead_20pct``) of the least
  measured examples.

Only measured batch sizes whose trials met the goal are recommended (nothing is extrapolated). Every
number carries an interval at ``level`` and the trials it rests on:

* **steps** at a measured B: ``[steps_lower x exp(-c), steps x exp(c)]``, ``c = sd x ln(1 / (1 -
  level))`` with ``sd = theta / K`` the best-of-K sd of the trials' scatter model
  (:mod:`batchlab.analysis.scatter`): under it a rerun of the study's best of K minus the measured one
  is Laplace with scale ``theta / K`` in log steps, whose central ``level`` range is ``+- c``; the
  bracket ``(steps_lower, steps]`` is the evaluation resolution. Without a scatter: the bracket alone.
  **examples** = steps x B, **seconds** = steps x the step time (its ``[low, high]`` spread).
* the **indistinguishable** batch sizes: those whose interval of the objective's quantity overlaps the
  recommended one's.
* the **trade-off table**: every measured B with steps, examples, seconds and what doubling the batch
  buys, ``steps(B) / steps(2B)`` (2: perfect scaling, 1: nothing), where 2B was measured.
* the **learning-rate rule** and the **batch-size warmup** (:mod:`batchlab.advise.rules`:
  :func:`~batchlab.advise.rules.learning_rate_rule`, :func:`~batchlab.advise.rules.warmup_schedule`),
  and the **check's predicted interval** for one fresh trial
  (:func:`predicted_check`), each defined where it is computed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from batchlab.advise.rules import learning_rate_rule, warmup_schedule
from batchlab.advise.unit_points import (MeasuredPoint, UnitPoints, find_unit, plain, step_time,
                                        steps_interval, unit_points, value_interval)
from batchlab.errors import BatchlabError

__all__ = ["EXAMPLES_TOLERANCE", "OBJECTIVES", "MeasuredPoint", "Recommendation", "UnitPoints", "check_interval",
           "find_unit", "learning_rate_rule", "predicted_check", "recommend", "steps_interval", "unit_points",
           "warmup_schedule"]

#: What a recommendation can minimise.
OBJECTIVES = ("time", "examples")
#: The examples objective's tolerance: within 1.2x of the least measured examples (overhead_20pct's 20%).
EXAMPLES_TOLERANCE = 1.2


def _check(objective: Any, level: Any) -> None:
    if objective not in OBJECTIVES:
        raise BatchlabError(f"objective {objective!r} is not one of: {', '.join(repr(o) for o in OBJECTIVES)}")
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise BatchlabError(f"level must be in (0, 1), got {level!r}")


def _times(span: dict | None, factor: dict | float | None) -> dict | None:
    if span is None or factor is None:
        return None
    if not isinstance(factor, dict):
        factor = {"value": factor, "low": factor, "high": factor}
    return value_interval(span["value"] * factor["value"], span["low"] * factor["low"], span["high"] * factor["high"])


def _overlap(a: dict | None, b: dict | None) -> bool:
    return a is not None and b is not None and a["low"] <= b["high"] and b["low"] <= a["high"]


# --------------------------------------------------------------------------------------- the check


def _check_bounds(steps: float, steps_lower: float, theta: float, k: int, level: float) -> tuple[float, float]:
    """The central ``level`` range of one fresh trial's steps given the study's best of ``k`` (see
    :func:`predicted_check`)."""
    alpha = 1.0 - level
    d_high = theta * math.log(2 * k / ((k + 1) * alpha))
    if 1.0 / (k + 1) >= alpha / 2:
        d_low = theta / k * math.log((k + 1) * alpha / 2)
    else:
        d_low = theta * math.log(k / ((k + 1) * (1 - alpha / 2)))
    spacing = steps / steps_lower if steps_lower > 0 else 1.0
    return steps_lower * math.exp(d_low), steps * spacing * math.exp(d_high)


def predicted_check(points: UnitPoints, batch_size: int, level: float = 0.9) -> dict:
    """The predicted steps of ONE fresh trial at ``batch_size`` (the check run).

    Model (:mod:`batchlab.analysis.scatter`): each trial's log steps is ``log S + E``, ``E ~
    Exponential(theta)``; the study's best of K is ``log S + E_1``, ``E_1 ~ Exponential(theta / K)``.
    A fresh trial minus the measured best, ``D = E - E_1``, has ``P(D > d) = K / (K + 1) exp(-d /
    theta)`` for ``d >= 0`` and ``P(D < d) = 1 / (K + 1) exp(K d / theta)`` for ``d <= 0``; its
    equal-tailed ``level`` range is ``d_high = theta ln(2K / ((K + 1) alpha))`` and ``d_low = (theta /
    K) ln((K + 1) alpha / 2)`` (``alpha = 1 - level``; when ``1 / (K + 1) < alpha / 2`` the lower
    quantile is above 0: ``theta ln(K / ((K + 1)(1 - alpha / 2)))``). The measured best lies in the
    bracket ``(steps_lower, steps]``, and the check reads its own steps at an evaluation step, up to
    one evaluation spacing (``steps / steps_lower``) after its first passage, so the range is
    ``[steps_lower exp(d_low), steps x spacing x exp(d_high)]``. ``theta`` is the pooled estimate
    (its own uncertainty is not propagated).

    Returns ``{"low", "high", "method", "reason", "tail_scale", "n_trials", "steps", "steps_lower",
    "level"}``; ``low``/``high`` ``None`` (with ``reason``) when ``batch_size`` did not reach the goal
    or there is no scatter.
    """
    p = points.point(batch_size)
    out = {"low": None, "high": None, "method": "one trial under the trials' scatter model", "reason": "",
           "tail_scale": points.tail_scale, "n_trials": None if p is None else p.n_trials,
           "steps": None if p is None else p.steps, "steps_lower": None if p is None else p.steps_lower,
           "level": level}
    if p is None or not p.reached or p.steps is None:
        return plain(dict(out, reason=f"B = {batch_size} did not reach the goal"))
    theta = points.tail_scale
    if theta is None or not math.isfinite(float(theta)) or p.n_trials < 1:
        return plain(dict(out, reason="no trials' scatter (no study with two reached trials), so nothing says how "
                                      "far one trial falls from the best of K"))
    low, high = _check_bounds(float(p.steps), float(p.steps_lower or 0), float(theta), int(p.n_trials), level)
    return plain(dict(out, low=low, high=high))


def check_interval(what: Any, batch_size: int | None = None, *, level: float | None = None
                   ) -> tuple[float | None, float | None]:
    """``(low, high)`` predicted steps of one fresh trial at the recommended point
    (:func:`predicted_check`): of a :class:`Recommendation` (at ``level``, default its own), or of
    ``UnitPoints`` at ``batch_size``. ``(None, None)`` when there is none (its ``check["reason"]``
    says why)."""
    if isinstance(what, Recommendation):
        check = what.check or {}
        level = what.level if level is None else level
        if level == check.get("level") or check.get("low") is None:
            return check.get("low"), check.get("high")
        return _check_bounds(float(check["steps"]), float(check["steps_lower"] or 0), float(check["tail_scale"]),
                             int(check["n_trials"]), level)
    if batch_size is None:
        raise BatchlabError("check_interval needs a Recommendation, or UnitPoints and a batch size")
    check = predicted_check(what, batch_size, 0.9 if level is None else level)
    return check["low"], check["high"]


# ---------------------------------------------------------------------------------- the answer


@dataclass
class Recommendation:
    """The answer for one unit and objective (module docstring; docs/methods.md, "The recommendation").

    Attributes:
        unit, goal, objective, level: what was answered, at which interval level.
        batch_size: the recommended measured batch size (``None``: no measured batch size reached the goal).
        trial_id, hyperparameters: the best trial at ``batch_size`` and its tuned hyperparameters.
        steps, examples, seconds: ``{"value", "low", "high"}`` to the goal at ``batch_size`` (``seconds``
            ``None`` without a step time there); ``steps`` also has ``method``.
        indistinguishable: the reached batch sizes whose interval of the objective's quantity overlaps
            the recommended one's (it included).
        table: the trade-off table, one row per measured batch size (:func:`recommend`).
        learning_rate_rule: :func:`learning_rate_rule`.
        warmup, warmup_reason: :func:`warmup_schedule` (``None`` and why).
        check: :func:`predicted_check` at ``batch_size``.
        bounded_by: one line per edge the answer lies at, and the stop when the rounds ended before the target.
        stop: the rounds' stop ``{"reason", "text"}`` as given.
        rests_on: ``{"trials_at_batch_size", "reached_at_batch_size", "trials", "examples_spent",
            "batch_sizes_measured", "batch_sizes_reached"}``.
        b_crit: the unit's ``mccandlish_b_crit`` ``{"value", "low", "high"}``.
        notes: how the intervals were formed, in words.
    """

    unit: str
    goal: dict
    objective: str
    level: float
    batch_size: int | None
    trial_id: int | None = None
    hyperparameters: dict = field(default_factory=dict)
    steps: dict | None = None
    examples: dict | None = None
    seconds: dict | None = None
    indistinguishable: list = field(default_factory=list)
    table: list = field(default_factory=list)
    learning_rate_rule: dict = field(default_factory=dict)
    warmup: dict | None = None
    warmup_reason: str = ""
    check: dict = field(default_factory=dict)
    bounded_by: list = field(default_factory=list)
    stop: dict | None = None
    rests_on: dict = field(default_factory=dict)
    b_crit: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready fields, with ``lines`` (the printed answer)."""
        return plain({f.name: getattr(self, f.name) for f in fields(self)} | {"lines": self.lines()})

    @classmethod
    def from_dict(cls, data: dict) -> "Recommendation":
        """The inverse of :meth:`to_dict` (``lines`` is recomputed)."""
        return cls(**{f.name: data.get(f.name) for f in fields(cls) if f.name in data})

    def lines(self) -> list[str]:
        """The printed answer: the recommendation, what it rests on, the rules, the check, its bounds."""
        pct = f"{self.level:.0%}"
        goal = _goal_text(self.goal)
        if self.batch_size is None:
            return [f"no recommendation: no measured batch size reached the goal {goal}"] + [
                f"bounded: {b}" for b in self.bounded_by]
        params = ", ".join(f"{k} {_num(v)}" for k, v in sorted(self.hyperparameters.items())
                           if isinstance(v, (int, float)) and not isinstance(v, bool))
        parts = [f"{_span_text(self.steps)} steps", f"{_span_text(self.examples)} examples"]
        if self.seconds is not None:
            parts.append(f"{_span_text(self.seconds, seconds=True)} s")
        others = sorted(self.indistinguishable)
        same = (f"B = {_range_text(others)} not distinguishable at {pct}" if len(others) > 1
                else "no other measured batch size within its interval")
        out = [f"use B = {self.batch_size}" + (f" at {params}" if params else "") + f": {', '.join(parts)} to the goal "
               f"{goal} (objective {self.objective}; {same})"]
        r = self.rests_on
        out.append(f"rests on {r.get('trials_at_batch_size')} trials at B = {self.batch_size} "
                   f"({r.get('reached_at_batch_size')} reached the goal; best trial {self.trial_id}), "
                   f"{r.get('trials')} trials in all over B = {_list_text(r.get('batch_sizes_measured') or [])}, "
                   f"{r.get('examples_spent', 0):,} examples spent; intervals at {pct}, steps by {self.steps['method']}")
        out += _rule_lines(self.learning_rate_rule)
        if self.warmup is None:
            out.append(f"batch-size warmup: none ({self.warmup_reason})")
        else:
            w, s = self.warmup, self.warmup["predicted"]
            phases = ", ".join(f"B = {b} from {e:,}" for e, b in w["schedule"])
            saved = (f"{s['saved_fraction']:.1%}" + (f" [{s['saved_fraction_low']:.1%}, {s['saved_fraction_high']:.1%}]"
                                                     if s["saved_fraction_low"] is not None else ""))
            added = f", {s['seconds_added']:+.3g} s" if s.get("seconds_added") is not None else ""
            out.append(f"batch-size warmup (examples): {phases}; predicted ({s['model']}): saves {saved} of the "
                       f"examples, {s['steps_added']:+,.0f} steps{added} against B = {self.batch_size} throughout")
        c = self.check
        if c.get("low") is not None:
            out.append(f"check: one fresh trial at B = {self.batch_size} should reach the goal in "
                       f"[{c['low']:,.0f}, {c['high']:,.0f}] steps ({pct}, {c['method']})")
        else:
            out.append(f"check: no predicted interval ({c.get('reason')})")
        out += [f"bounded: {b}" for b in self.bounded_by]
        return out

    def table_lines(self) -> list[str]:
        """The trade-off table as text rows (``*``: recommended, ``~``: not distinguishable)."""
        out = ["  B      reached  steps [interval]          examples [interval]            seconds [interval]     "
               "doubling"]
        for row in self.table:
            mark = "*" if row["recommended"] else ("~" if row["indistinguishable"] else " ")
            if not row["reached"]:
                out.append(f"{mark} {row['batch_size']:<6} {row['n_reached']}/{row['n_trials']}      not reached"
                           + (f" (> {row['censored_at']:,} steps)" if row.get("censored_at") is not None else ""))
                continue
            d = row["doubling"]
            out.append(f"{mark} {row['batch_size']:<6} {row['n_reached']}/{row['n_trials']}      "
                       f"{_span_text(row['steps']):<25} {_span_text(row['examples']):<30} "
                       f"{_span_text(row['seconds'], seconds=True) if row['seconds'] else '-':<22} "
                       f"{_span_text(d, seconds=True) if d else '-'}")
        return out


def _goal_text(goal: dict) -> str:
    if not goal:
        return "(unknown)"
    return f"{goal.get('metric')} {'>' if goal.get('maximize') else '<'} {_num(goal.get('goal'))}"


def _num(v: Any) -> str:
    return "-" if v is None else (f"{v:,}" if isinstance(v, int) else f"{float(v):.4g}")


def _span_text(span: dict | None, seconds: bool = False) -> str:
    if span is None:
        return "-"
    fmt = (lambda v: "inf" if v is None else f"{v:.3g}") if seconds else (
        lambda v: "inf" if v is None else f"{v:,.0f}")
    return f"{fmt(span['value'])} [{fmt(span['low'])}, {fmt(span['high'])}]"


def _list_text(values: Sequence[int]) -> str:
    return ", ".join(str(v) for v in values)


def _range_text(values: Sequence[int]) -> str:
    return f"{values[0]}..{values[-1]}" if len(values) > 2 else _list_text(values)


def _rule_lines(rule: dict) -> list[str]:
    out = []
    for key, name in (("learning_rate", "learning_rate"), ("effective_learning_rate", "effective rate lr/(1-momentum)")):
        s = rule.get(key)
        if not s:
            continue
        slope = "no slope" if s["slope"] is None else (
            f"slope {s['slope']:.3g}" + (f" [{s['low']:.3g}, {s['high']:.3g}]" if s["low"] is not None else ""))
        out.append(f"{name} rule: {s['rule']} ({slope} of log rate on log B over {s['n']} reached batch sizes; "
                   f"{s['reason']})")
    table = rule.get("table") or []
    if table:
        out.append("tuned learning_rate: " + ", ".join(f"B = {t['batch_size']}: {t['learning_rate']:.4g}" for t in table))
    return out


def recommend(points: UnitPoints, throughput: Any, objective: str, *, level: float = 0.9, bracket: Any = None,
              largest_fitting: int | None = None, stop: dict | None = None) -> Recommendation:
    """The recommendation for ``objective`` (module docstring) from ``points`` and ``throughput``
    (``.seconds_per_step(B) -> float | None``; ``None``: no step times, then only ``"examples"``).

    ``bracket``: the first bracket (its ``branched_by_step``, ``warmup_schedule`` and ``reference``, for
    the warmup; ``None``: no warmup). ``largest_fitting``: the largest batch size that fits in memory
    (says why larger ones were not measured). ``stop``: the rounds' stop ``{"reason", "text"}``; any
    reason but ``"target"`` is copied into ``bounded_by``.

    Raises:
        BatchlabError: an objective not in :data:`OBJECTIVES`, a level outside (0, 1), or objective
            ``"time"`` without a step time at any reached batch size.
    """
    _check(objective, level)
    reached = points.reached
    measured = points.batch_sizes
    stopped = [f"stopped before the target: {stop.get('text')}"] if stop and stop.get("reason") != "target" else []
    rests = {"trials": points.trials, "examples_spent": points.examples_spent, "batch_sizes_measured": measured,
             "batch_sizes_reached": [p.batch_size for p in reached]}
    if not reached:
        edges = [f"no measured batch size (B = {_list_text(measured)}) reached the goal within its step budget"]
        return Recommendation(unit=points.unit, goal=dict(points.goal), objective=objective, level=level,
                              batch_size=None, bounded_by=edges + stopped, stop=stop, rests_on=plain(rests),
                              b_crit=dict(points.b_crit),
                              check={"low": None, "high": None, "reason": "no recommendation", "level": level})
    rows = []
    for p in points.points:
        steps = steps_interval(points, p.batch_size, level)
        tps = step_time(throughput, p.batch_size)
        rows.append({"batch_size": p.batch_size, "reached": bool(steps is not None), "n_trials": p.n_trials,
                     "n_reached": p.n_reached, "censored_at": p.censored_at, "steps": steps,
                     "examples": _times(steps, p.batch_size), "seconds_per_step": tps, "seconds": _times(steps, tps),
                     "doubling": None, "recommended": False, "indistinguishable": False})
    by_b = {r["batch_size"]: r for r in rows}
    for r in rows:
        twice = by_b.get(2 * r["batch_size"])
        if r["steps"] is not None and twice is not None and twice["steps"] is not None:
            a, b = r["steps"], twice["steps"]
            r["doubling"] = value_interval(a["value"] / b["value"], a["low"] / b["high"],
                                  a["high"] / b["low"] if b["low"] > 0 else None)
    candidates = [by_b[p.batch_size] for p in reached]
    notes = []
    if objective == "time":
        timed = [r for r in candidates if r["seconds"] is not None]
        if not timed:
            raise BatchlabError("objective 'time' needs a measured step time at a reached batch size (B = "
                                f"{_list_text([r['batch_size'] for r in candidates])}); allowed: 'examples' without step times")
        if len(timed) < len(candidates):
            notes.append("no step time at B = " + _list_text([r["batch_size"] for r in candidates if r["seconds"] is None])
                         + ": not considered for the time objective")
        best = min(timed, key=lambda r: (r["seconds"]["value"], -r["batch_size"]))
        quantity, pool = "seconds", timed
    else:
        least = min(r["examples"]["value"] for r in candidates)
        best = max((r for r in candidates if r["examples"]["value"] <= EXAMPLES_TOLERANCE * least),
                   key=lambda r: r["batch_size"])
        quantity, pool = "examples", candidates
    same = [r["batch_size"] for r in pool if _overlap(r[quantity], best[quantity])]
    for r in rows:
        r["recommended"] = r is best
        r["indistinguishable"] = r["batch_size"] in same
    b = best["batch_size"]
    p = points.point(b)
    edges = _edges(points, objective, b, candidates, largest_fitting, stop, throughput)
    if best["steps"]["method"] == "bracket":
        notes.append("no trials' scatter (no study with two reached trials): steps intervals are the evaluation "
                     "brackets only")
    notes.append("steps interval: a rerun of the study's best of K (Laplace with scale theta/K in log steps) "
                 "around the evaluation bracket; examples = steps x B; seconds = steps x step time [fastest, slowest]")
    warmup, warmup_reason = warmup_schedule(points, bracket, b, throughput)
    rests |= {"trials_at_batch_size": p.n_trials, "reached_at_batch_size": p.n_reached}
    return Recommendation(
        unit=points.unit, goal=dict(points.goal), objective=objective, level=level, batch_size=b,
        trial_id=p.best_trial_id, hyperparameters=plain(dict(p.best_hyperparameters)), steps=best["steps"],
        examples=best["examples"], seconds=best["seconds"], indistinguishable=sorted(same), table=plain(rows),
        learning_rate_rule=learning_rate_rule(points, level), warmup=warmup, warmup_reason=warmup_reason,
        check=predicted_check(points, b, level), bounded_by=edges + stopped, stop=stop, rests_on=plain(rests),
        b_crit=dict(points.b_crit), notes=notes)


def _edges(points: UnitPoints, objective: str, b: int, candidates: list[dict], largest_fitting: int | None,
           stop: dict | None, throughput: Any) -> list[str]:
    """One line per edge the answer lies at (docs/methods.md, "The recommendation")."""
    reached = [r["batch_size"] for r in candidates]
    measured = points.batch_sizes
    what = "the least time" if objective == "time" else f"the largest B within {EXAMPLES_TOLERANCE}x of the least examples"
    edges = []
    if len(reached) == 1:
        edges.append(f"only B = {b} reached the goal: nothing to compare it with")
    if b == max(reached):
        above = [m for m in measured if m > b]
        if above:
            edges.append(f"{what} is at the largest batch size that reached the goal (B = {b}); B = {_list_text(above)} "
                         "did not reach it within its step budget")
        else:
            fits = getattr(throughput, "fits", None)
            no_room = (largest_fitting is not None and 2 * b > largest_fitting) or (
                callable(fits) and fits(2 * b) is False)
            if no_room:
                why = "larger batches do not fit in memory" + (
                    f" (the largest that fits: {largest_fitting})" if largest_fitting is not None else "")
            elif stop and stop.get("reason") == "budget":
                why = "the budget ran out before larger ones were measured"
            else:
                why = "no larger candidate batch size was measured"
            edges.append(f"{what} is at the largest measured batch size (B = {b}): {why}; a larger one might be better")
    if b == min(reached) and len(reached) > 1:
        edges.append(f"{what} is at the smallest measured batch size that reached the goal (B = {b}): smaller ones "
                     "were not measured" if b == min(measured) else
                     f"{what} is at the smallest batch size that reached the goal (B = {b})")
    if objective == "examples" and len(reached) > 1:
        least = min(candidates, key=lambda r: r["examples"]["value"])["batch_size"]
        if least == min(measured) and least != b:
            edges.append(f"the least measured examples are at the smallest measured batch size (B = {least}): smaller "
                         "ones might need fewer, and the 1.2x threshold rests on it")
    return edges
