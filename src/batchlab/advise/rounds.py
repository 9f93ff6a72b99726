"""Which study ``batchlab advise`` runs next, and what a study may cost (docs/methods.md, "Advise: rounds").

Compute is counted in training examples (updates x batch size). A study's *examples bound* is
``trials x budget_steps(B) x B``: what it costs if every trial runs its whole step budget, which no
trial can exceed (advise's sweeps never grow budgets), so a round admitted under its bound can never
overspend.

After each round advise fits the unit (:func:`batchlab.analysis.bootstrap.bootstrap_critical_batch_size`)
and, while B_crit's interval is wider than the target, picks one more study (:func:`next_study`):

* fewer than two batch sizes reached the goal: the unmeasured candidate nearest (in log B) to the one
  that did (none did: advise stops, the goal is unreached);
* B_crit's interval is open above (below): the next unmeasured candidate above the largest (below the
  smallest) measured batch size;
* otherwise every *option* is scored: a new candidate batch size within a factor 4 of the interval's
  ends, or doubled trials at a measured batch size that reached the goal or lies between two that did
  (up to ``max_trials``; an unreached one's expected trials are at the fitted S(B)). While the interval
  stays open and no option is expected to bound it, the cheapest study of more trials runs. Its expected trials are
  added to the store's (a new batch size: K trials at the fitted S(B), spread by the trials' own
  scatter, at the exponential quantiles ``-log(1 - (i + 1/2) / K)`` of the tail scale; doubled trials:
  ``n`` more trials at the study's best steps spread the same way, none better than the best, which
  halves its best-of-K scatter and keeps the tail scale), the unit is refitted, and the
  option's score is the expected shrinkage of ``log(high / low)`` per example it is expected to cost
  (each expected trial stopped at the goal or at its budget; an expected trial beyond the budget does
  not reach the goal). The best positive score wins; none positive: no study is expected to narrow the interval, and advise stops.

Everything here is deterministic given the store's trials, so a resumed advice takes the same
decisions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

#: Options for a new batch size lie within this factor of B_crit's interval ends.
SEARCH_FACTOR = 4.0


@dataclass(frozen=True)
class NextStudy:
    """One study to run: ``trials`` trials at ``batch_size`` (a new batch size, or more trials at a
    measured one), why, its examples bound and its score (expected shrinkage of ``log(high/low)`` of
    B_crit's interval per million examples it is expected to cost; ``None`` when chosen by a rule, not a score)."""

    action: str
    batch_size: int
    trials: int
    reason: str
    examples_bound: int
    score: float | None = None

    def to_dict(self) -> dict:
        return {"action": self.action, "batch_size": self.batch_size, "trials": self.trials, "reason": self.reason,
                "examples_bound": self.examples_bound, "score": self.score}


def examples_bound(batch_size: int, trials: int, budget_steps: int) -> int:
    """``trials x budget_steps x batch_size``: a study's cost when every trial runs its whole budget."""
    return int(trials) * int(budget_steps) * int(batch_size)


def spanning_batch_sizes(low: int, high: int, candidates: Sequence[int], n: int = 4) -> list[int]:
    """Up to ``n`` candidates in ``[low, high]``, evenly spread in log B, both ends included."""
    inside = sorted(c for c in candidates if low <= c <= high)
    if len(inside) <= n:
        return inside
    picks = np.unique(np.round(np.linspace(0, len(inside) - 1, n)).astype(int))
    return [inside[i] for i in picks]


def interval_ratio(low: float | None, high: float | None) -> float:
    """``high / low`` of an interval, ``inf`` when it is open on either side."""
    if low is None or high is None or not (low > 0) or not math.isfinite(high):
        return math.inf
    return float(high) / float(low)


def exponential_quantiles(k: int) -> np.ndarray:
    """``-log(1 - (i + 1/2) / k)`` for ``i = 0..k-1``: K evenly spaced quantiles of Exponential(1)."""
    return -np.log1p(-(np.arange(k) + 0.5) / k)


def next_study(inputs: Mapping, measured: Mapping[int, int], candidates: Sequence[int], *, trials: int,
               max_trials: int, budget_steps: Callable[[int], int], level: float, tolerance: float = 0.1,
               resolution: float = 0.05) -> NextStudy | None:
    """The next study (module docstring), or ``None`` when no option is expected to narrow the interval.

    ``inputs``: :func:`batchlab.analysis.bootstrap.store_fit_inputs` of the unit; ``measured``:
    ``{batch_size: trials stored}``; ``candidates``: the batch sizes advise may measure (ascending, all
    fitting in memory); ``trials``: the trials of a new study; ``budget_steps(B)``: the step budget.
    """
    from batchlab.analysis.scatter import scatter_from_trials

    steps = {int(b): np.asarray(v, dtype=float) for b, v in inputs["trial_steps"].items()}
    reached = sorted(b for b, v in steps.items() if np.isfinite(v).any())  # a trial met the goal there
    unmeasured = [int(c) for c in candidates if int(c) not in measured]

    def new(b: int, reason: str, score: float | None = None) -> NextStudy:
        return NextStudy("new batch size", b, trials, reason, examples_bound(b, trials, budget_steps(b)), score)

    if not reached:
        return None
    if len(reached) == 1:
        (only,) = reached
        if not unmeasured:
            return None
        b = min(unmeasured, key=lambda c: (abs(math.log(c / only)), -c))
        return new(b, f"one batch size (B = {only}) reached the goal: its nearest unmeasured candidate")
    estimate = _fit(inputs, level, tolerance)
    if estimate is None:
        return None
    low, high = estimate.intervals["mccandlish_b_crit"]
    scatter = scatter_from_trials(steps, inputs.get("unknown_from"), inputs.get("budget"))
    growable = [b for b in reached if 2 * measured[b] <= max_trials]
    if low is None and high is None and scatter is None and growable:
        # no interval at all and no study with two reached trials: the trials' scatter comes first
        middle = math.exp(np.mean(np.log(reached)))
        b = min(growable, key=lambda c: (measured[c], abs(math.log(c / middle)), c))
        return NextStudy("more trials", b, 2 * measured[b],
                         f"no study has two trials that reached the goal, so the trials' scatter (and with it B_crit's "
                         f"interval) is unknown: doubled trials at B = {b} ({measured[b]} -> {2 * measured[b]})",
                         examples_bound(b, measured[b], budget_steps(b)))
    if high is None or not math.isfinite(high):
        above = [c for c in unmeasured if c > max(measured)]
        if above:
            return new(above[0], "B_crit's interval is open above: the next candidate above the measured range")
    if low is None or not (low > 0):
        below = [c for c in unmeasured if c < min(measured)]
        if below:
            return new(below[-1], "B_crit's interval is open below: the next candidate below the measured range")
    now = interval_ratio(low, high)
    theta = 0.0 if scatter is None else float(scatter.tail_scale)
    s_min, e_min = estimate.estimates["s_min"], estimate.estimates["e_min"]
    if not all(v is not None and math.isfinite(v) and v >= 0 for v in (s_min, e_min)):
        return None  # no finite curve to expect trials from
    lo_end = low if low and low > 0 else min(measured)
    hi_end = high if high is not None and math.isfinite(high) else max(measured)
    options: list[tuple[NextStudy, dict]] = []
    for b in unmeasured:
        if lo_end / SEARCH_FACTOR <= b <= hi_end * SEARCH_FACTOR:
            expected = np.ceil((s_min + e_min / b) * np.exp(theta * exponential_quantiles(trials)))
            expected[expected > budget_steps(b)] = np.inf  # beyond the budget: not reached
            options.append((new(b, "a new batch size"), {b: expected}))
    for b, n in sorted(measured.items()):
        inside = reached[0] < b < reached[-1]  # unreached between reached batch sizes: under-searched there
        if (b in reached or inside) and 2 * n <= max_trials and b in steps:
            # the n new trials, expected no better than the study's best (unreached: the fitted S(B)),
            # spread as the trials scatter
            start = float(np.nanmin(steps[b][np.isfinite(steps[b])])) if b in reached else s_min + e_min / b
            extra = np.ceil(start * np.exp(theta * exponential_quantiles(n)))
            extra[extra > budget_steps(b)] = np.inf
            options.append((NextStudy("more trials", b, 2 * n, f"doubled trials at B = {b} ({n} -> {2 * n})",
                                      examples_bound(b, n, budget_steps(b))), {b: np.concatenate([steps[b], extra])}))
    best: NextStudy | None = None
    cheapest: tuple[float, NextStudy] | None = None  # an open interval's fallback: the cheapest more trials
    for option, added in options:
        trial_steps = {**steps, **added}
        changed = dict(inputs, trial_steps=trial_steps)
        b = option.batch_size
        if option.action == "new batch size":
            reach = np.isfinite(added[b])
            changed["steps_lower"] = {**inputs["steps_lower"],
                                      b: int(math.floor(float(np.min(added[b])) / (1 + resolution))) if reach.any() else None}
            changed["censored_at"] = {**inputs["censored_at"], b: None if reach.any() else budget_steps(b)}
            changed["budget"] = {**(inputs.get("budget") or {}), b: float(budget_steps(b))}
        else:
            extra = added[b][len(steps[b]):]
            if b not in reached and np.isfinite(extra).any():  # an unreached study expected to reach now
                changed["steps_lower"] = {**inputs["steps_lower"],
                                          b: int(math.floor(float(np.min(extra)) / (1 + resolution)))}
                changed["censored_at"] = {**inputs["censored_at"], b: None}
            if not np.isfinite(extra).all():
                changed["budget"] = {**(inputs.get("budget") or {}), b: float(budget_steps(b))}
            if inputs.get("unknown_from") and b in inputs["unknown_from"]:
                u = np.asarray(inputs["unknown_from"][b], dtype=float)
                changed["unknown_from"] = {**inputs["unknown_from"], b: np.concatenate([u, np.full(len(added[b]) - len(u), np.nan)])}
        new_trials = added[b] if option.action == "new batch size" else added[b][len(steps[b]):]
        cost = b * float(np.sum(np.minimum(new_trials, budget_steps(b))))
        if option.action == "more trials" and (cheapest is None or cost < cheapest[0]):
            cheapest = (cost, option)
        after = _fit(changed, level, tolerance)
        if after is None:
            continue
        then = interval_ratio(*after.intervals["mccandlish_b_crit"])
        if math.isfinite(now):
            gain = math.log(now) - math.log(then)
            why = f"expected to narrow B_crit's interval from {now:.3g}x to {then:.3g}x"
        else:  # an open interval: an option expected to bound it wins, the cheapest first (score 1 / bound)
            gain = 1.0 if math.isfinite(then) else 0.0
            why = f"expected to bound B_crit's interval (now open) at {then:.3g}x"
        if not gain > 0:
            continue
        # per example it is expected to cost (each trial stops at the goal or its budget), not its bound
        score = gain / (cost / 1e6)
        if best is None or score > best.score:
            best = NextStudy(option.action, option.batch_size, option.trials, f"{option.reason}: {why}",
                             option.examples_bound, score)
    if best is None and not math.isfinite(now) and cheapest is not None:
        option = cheapest[1]
        return NextStudy(option.action, option.batch_size, option.trials,
                         f"{option.reason}: no study is expected to bound B_crit's interval (now open): the cheapest "
                         "study of more trials", option.examples_bound)
    return best


def _fit(inputs: Mapping, level: float, tolerance: float):
    """The unit's fit on ``inputs`` (one resampling replicate: the intervals are the profile
    likelihood's, which do not resample), or ``None`` when it cannot be fitted."""
    from batchlab.analysis.bootstrap import bootstrap_critical_batch_size
    from batchlab.errors import BatchlabError

    try:
        return bootstrap_critical_batch_size(n_boot=1, level=level, seed=0, tolerance=tolerance, **inputs)
    except BatchlabError:
        return None
