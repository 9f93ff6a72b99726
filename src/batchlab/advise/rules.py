"""The two rules a recommendation carries beside its batch size (docs/methods.md, "The recommendation"):
how to rescale the learning rate between measured batch sizes (:func:`learning_rate_rule`: the slope of
log tuned rate on log B, with its t interval, read as linear, square root or the measured optimum), and
a batch-size warmup in examples where the branched critical batch size grows during training
(:func:`warmup_schedule`, with its predicted saving under the measured curve). Steps count optimizer
updates; examples are updates x batch size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from batchlab.advise.unit_points import UnitPoints, plain, step_time, steps_interval

#: The learning-rate rules, by their slope of log learning rate on log batch size.
RULE_SLOPES = {"linear": 1.0, "square root": 0.5}
MEASURED_OPTIMUM = "measured optimum"


# ------------------------------------------------------------------------------- learning-rate rule


def _slope(batch_sizes: Sequence[int], rates: Sequence[float], level: float) -> dict:
    """Least-squares slope of ``log rate`` on ``log B`` with its t interval at ``level`` and the rule."""
    from scipy import stats

    n = len(batch_sizes)
    out: dict[str, Any] = {"slope": None, "low": None, "high": None, "n": n, "rule": MEASURED_OPTIMUM}
    if n < 2 or len(set(batch_sizes)) < 2:
        return dict(out, reason=f"{n} reached batch size(s) with a tuned rate: no slope")
    x = [math.log(b) for b in batch_sizes]
    y = [math.log(r) for r in rates]
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((a - mx) ** 2 for a in x)
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sxx
    out["slope"] = slope
    if n < 3:
        return dict(out, reason="2 reached batch sizes: no interval for the slope (at least 3 are needed)")
    sse = sum((b - my - slope * (a - mx)) ** 2 for a, b in zip(x, y))
    se = math.sqrt(sse / (n - 2) / sxx)
    half = float(stats.t.ppf((1 + level) / 2, n - 2)) * se
    low, high = slope - half, slope + half
    out.update(low=low, high=high)
    inside = {name: low - 1e-9 <= s <= high + 1e-9 for name, s in RULE_SLOPES.items()}
    if inside["linear"] and not inside["square root"]:
        return dict(out, rule="linear", reason="slope 1 is inside the interval and 0.5 is not")
    if inside["square root"] and not inside["linear"]:
        return dict(out, rule="square root", reason="slope 0.5 is inside the interval and 1 is not")
    why = ("both 1 and 0.5 are inside the interval: the measured rates do not tell the rules apart" if all(inside.values())
           else "neither 1 nor 0.5 is inside the interval")
    return dict(out, reason=why)


def learning_rate_rule(points: UnitPoints, level: float = 0.9) -> dict:
    """How the tuned learning rate moves with the batch size between measured batch sizes.

    Over the reached batch sizes whose best trial has a positive ``learning_rate``: the least-squares
    slope of ``log learning_rate`` on ``log B`` with its t interval at ``level`` (``n - 2`` degrees of
    freedom). Rule ``"linear"`` (lr proportional to B) when 1 is inside the interval and 0.5 is not,
    ``"square root"`` when 0.5 is and 1 is not, else ``"measured optimum"``: the table of tuned rates
    is the rule (also with fewer than 3 reached points, with the reason). With momentum (best trials
    with ``momentum``) the same for the effective rate ``lr / (1 - momentum)``
    (:func:`batchlab.analysis.steps_to_result.effective_learning_rate`). The rule holds between the
    smallest and largest batch size of the table (never extrapolated).

    Returns ``{"learning_rate": slope dict, "effective_learning_rate": slope dict or None, "table":
    [{batch_size, learning_rate, momentum, effective_learning_rate, trial_id}], "level"}``; a slope
    dict has ``slope``, ``low``, ``high``, ``n``, ``rule``, ``reason``.
    """
    from batchlab.analysis.steps_to_result import effective_learning_rate

    table = []
    for p in points.reached:
        lr = p.best_hyperparameters.get("learning_rate")
        if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not lr > 0 or not math.isfinite(lr):
            continue
        momentum = p.best_hyperparameters.get("momentum")
        momentum = float(momentum) if isinstance(momentum, (int, float)) and not isinstance(momentum, bool) else None
        table.append({"batch_size": p.batch_size, "learning_rate": float(lr), "momentum": momentum,
                      "effective_learning_rate": effective_learning_rate(float(lr), momentum),
                      "trial_id": p.best_trial_id})
    b = [t["batch_size"] for t in table]
    out = {"learning_rate": _slope(b, [t["learning_rate"] for t in table], level), "effective_learning_rate": None,
           "table": table, "level": level}
    effective = [t for t in table if t["momentum"] is not None and math.isfinite(t["effective_learning_rate"])
                 and t["effective_learning_rate"] > 0]
    if effective:
        out["effective_learning_rate"] = _slope([t["batch_size"] for t in effective],
                                                [t["effective_learning_rate"] for t in effective], level)
    return plain(out)


# ------------------------------------------------------------------------------------------- warmup


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if obj is None:
        return default
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


def warmup_schedule(points: UnitPoints, bracket: Any, batch_size: int, throughput: Any = None) -> tuple[dict | None, str]:
    """A batch-size warmup in examples before the recommended ``batch_size``, with its predicted saving,
    or ``(None, reason)``.

    Only where the branched estimate (``bracket.branched_by_step``: ``{step, examples, value, low,
    high}`` per checkpoint of the reference run) grows beyond its intervals: the first checkpoint's
    ``high`` is below the last one's ``low``. The schedule is ``bracket.warmup_schedule`` (``[[step,
    batch_size], ...]``: the running maximum of the branched estimate), its steps converted to examples
    with the reference run's batch size (``examples = step x B_ref``; the first phase from 0), each
    batch size capped at ``batch_size`` and snapped down to a measured, reached batch size (the
    smallest one where none is below); after the last checkpoint the recommended batch size.

    Predicted saving (a model, not a measurement): progress to the goal per example at batch size
    ``b`` is ``1 / E(b)``, ``E(b) = steps(b) x b`` the measured examples to the goal (the stationary
    curve: every phase of training trades batch size for steps as the whole run did). The schedule's
    phases are run in order, each for its examples or until the goal; the rest at ``batch_size``.
    Against training at ``batch_size`` throughout: examples saved, steps added, seconds added (with
    step times), each a point from the measured steps; ``saved_fraction_low``/``high``: the saved
    fraction with every ``E(b)`` at its interval's opposite ends (the range the steps intervals allow,
    not a confidence interval).
    """
    by_step = list(_get(bracket, "branched_by_step") or [])
    if bracket is None:
        return None, "no bracket from the predictors (no branched estimate)"
    if len(by_step) < 2:
        return None, "the branched estimate has fewer than two checkpoints: no growth to read"
    first, last = by_step[0], by_step[-1]
    if first.get("high") is None or last.get("low") is None or not float(first["high"]) < float(last["low"]):
        return None, (f"the branched estimate does not grow beyond its intervals (first checkpoint [{first.get('low')}, "
                      f"{first.get('high') if first.get('high') is not None else 'inf'}], last [{last.get('low')}, "
                      f"{last.get('high') if last.get('high') is not None else 'inf'}])")
    reference = _get(_get(bracket, "reference"), "batch_size")
    if reference is None:
        with_steps = [e for e in by_step if e.get("step") and e.get("examples")]
        reference = with_steps[0]["examples"] / with_steps[0]["step"] if with_steps else None
    if reference is None:
        return None, "the reference run's batch size is unknown: the schedule cannot be put in examples"
    schedule = [tuple(e) for e in (_get(bracket, "warmup_schedule") or [])]
    if not schedule:  # the running maximum of the branched estimate (batchlab.probes.branched.warmup_schedule)
        best = 0
        for e in by_step:
            if e.get("value") is not None and float(e["value"]) > best:
                best = float(e["value"])
                schedule.append((int(e["step"]), best))
    reached = [p.batch_size for p in points.reached]
    phases: list[list[int]] = []
    for step, b in schedule:
        capped = min(float(b), float(batch_size))
        snapped = max([r for r in reached if r <= capped], default=min(reached))
        start = 0 if not phases else int(round(float(step) * float(reference)))
        if phases and phases[-1][1] == snapped:
            continue
        phases.append([start, snapped])
    if phases[-1][1] < batch_size:
        end = int(round(float(last["step"]) * float(reference)))
        if end > phases[-1][0]:
            phases.append([end, int(batch_size)])
        else:
            phases[-1][1] = int(batch_size)
    if len(phases) < 2:
        return None, (f"the branched estimate is at or above the recommended B = {batch_size} from the first "
                      "checkpoint: no warmup below it")
    saving = _warmup_saving(points, phases, int(batch_size), throughput)
    return plain({"schedule": phases, "unit": "examples", "reference_batch_size": reference,
                  "predicted": saving}), ""


def _run_phases(phases: list[list[int]], examples_to_goal: dict[int, float], final: int) -> tuple[float, float, dict]:
    """``(examples, steps, steps per batch size)`` of running ``phases`` then ``final`` to the goal."""
    done, examples, steps, per = 0.0, 0.0, 0.0, {}
    for (start, b), nxt in zip(phases, phases[1:] + [None]):
        if b == final or done >= 1.0:
            break
        length = float(nxt[0] - start) if nxt is not None else math.inf
        used = min(length, (1.0 - done) * examples_to_goal[b])
        done += used / examples_to_goal[b]
        examples += used
        steps += used / b
        per[b] = per.get(b, 0.0) + used / b
    rest = max(1.0 - done, 0.0) * examples_to_goal[final]
    examples += rest
    steps += rest / final
    per[final] = per.get(final, 0.0) + rest / final
    return examples, steps, per


def _warmup_saving(points: UnitPoints, phases: list[list[int]], final: int, throughput: Any) -> dict:
    sizes = sorted({b for _, b in phases} | {final})
    spans = {b: steps_interval(points, b, points.level) for b in sizes}
    point = {b: spans[b]["value"] * b for b in sizes}
    examples, steps, per = _run_phases(phases, point, final)
    constant_e, constant_s = point[final], spans[final]["value"]
    out = {"label": "predicted", "model": "stationary curve: progress per example at B is 1 / (steps(B) x B)",
           "examples": examples, "examples_constant": constant_e, "examples_saved": constant_e - examples,
           "saved_fraction": (constant_e - examples) / constant_e, "steps": steps, "steps_constant": constant_s,
           "steps_added": steps - constant_s, "saved_fraction_low": None, "saved_fraction_high": None,
           "seconds": None, "seconds_constant": None, "seconds_added": None}
    ends = []
    for warm_end, final_end in (("high", "low"), ("low", "high")):
        e = {b: spans[b][final_end if b == final else warm_end] * b for b in sizes}
        if all(v > 0 for v in e.values()):
            ends.append((e[final] - _run_phases(phases, e, final)[0]) / e[final])
    if len(ends) == 2:
        out["saved_fraction_low"], out["saved_fraction_high"] = min(ends), max(ends)
    times = {b: step_time(throughput, b) for b in sizes}
    if all(t is not None for t in times.values()):
        seconds = sum(s * times[b]["value"] for b, s in per.items())
        out["seconds"], out["seconds_constant"] = seconds, constant_s * times[final]["value"]
        out["seconds_added"] = seconds - out["seconds_constant"]
    return out
