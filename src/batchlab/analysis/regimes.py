"""Shallue et al.'s regimes read from the measured points of a steps-to-result curve, not from a fit.

Definitions, resolution and reasons for a null value: docs/methods.md, "Regimes read from the data".
The fit-derived regime bounds live with the fit (:mod:`batchlab.analysis.critical_batch_size`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from batchlab.analysis.curve import StepsCurve
from batchlab.errors import BatchlabError

PERFECT_SCALING = "perfect_scaling"
DIMINISHING_RETURNS = "diminishing_returns"
MAXIMAL_DATA_PARALLELISM = "maximal_data_parallelism"

#: ``kind`` of a regime bound: read from the data, or why it is null.
READ, BELOW_RANGE, BEYOND_RANGE, UNDETERMINED, NOT_SEEN = "read", "below_range", "beyond_range", "undetermined", "not_seen"
#: :func:`bound_shares` counts a replicate that could not be read (``None`` in its input) under this kind.
NOT_READ = "not_read"
BOUNDS = ("perfect_scaling_end", "maximal_parallelism_start")


def check_tolerance(tolerance: float, name: str = "tolerance") -> float:
    """``tolerance``, or a one-line BatchlabError (naming it ``name``) unless it is a number in (0, 1)."""
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float, np.floating)) or not 0 < tolerance < 1:
        raise BatchlabError(f"{name} must be in (0, 1), got {tolerance:g}" if isinstance(tolerance, (int, float))
                            else f"{name} must be a number in (0, 1), got {tolerance!r}")
    return tolerance


def _interpolate(b1, r1, b2, r2, level):
    """log-log interpolation: the B between b1 and b2 where the ratio crosses ``level``."""
    if r1 == r2:
        return None
    t = (np.log(level) - np.log(r1)) / (np.log(r2) - np.log(r1))
    if not 0 <= t <= 1:
        return None
    return float(np.exp(np.log(b1) + t * (np.log(b2) - np.log(b1))))


def _listed(batch_sizes: Sequence[int]) -> str:
    """``"B = 8"``, ``"B = 8 and 16"``, ``"B = 8, 16 and 32"``."""
    text = [str(b) for b in batch_sizes]
    return "B = " + (text[0] if len(text) == 1 else ", ".join(text[:-1]) + " and " + text[-1])


def _bound(**fields) -> dict:
    """One regime bound with every key present (``None`` where it does not apply)."""
    out = {"value": None, "kind": None, "reason": None, "n_points": 0, "interpolated": None,
           "lower_bound": None, "upper_bound": None, "note": None}
    out.update(fields)
    return out


def _perfect_scaling(curve: StepsCurve, steps: dict[int, int], b0: int, tolerance: float) -> tuple[dict, int | None]:
    """The perfect-scaling bound (docs/methods.md, "Regimes read from the data") and the first batch size
    known to fail the tolerance (``None`` when none is), from which every batch size is past perfect scaling.

    Walks the batch sizes B > B0 in increasing order. A reached B fails when S(B) B > (1 + tol) S(B0) B0;
    an unreached B fails when its censoring bound c already gives c B >= (1 + tol) S(B0) B0 (S > c), and is
    undecided otherwise (or without a bound). Perfect scaling is contiguous: it ends at the last reached B
    before the first failure, and is undetermined beyond the last reached B before the first undecided one.
    """
    level = 1 + tolerance
    s0 = steps[b0]
    limit = level * s0 * b0
    ratio = lambda b, s: s * b / (s0 * b0)
    passed = [b0]  # reached batch sizes from B0 up, all within the tolerance, before any failure or undecided one
    undecided: list[tuple[int, int | None]] = []  # unreached batch sizes whose bound decides nothing
    failure = None  # (batch size, steps or None, censoring bound or None): the first failure
    for b, s, c in zip(curve.batch_sizes, curve.steps, curve.censoring()):
        b = int(b)
        if b <= b0:
            continue
        if (s * b > limit) if s is not None else (c is not None and c * b >= limit):
            failure = (b, s, None if s is not None else c)
            break
        if s is None:
            undecided.append((b, c))
        elif not undecided:
            passed.append(b)
        # else: within the tolerance after an undecided batch size: not determined
    tol = f"(tolerance {tolerance:g})"

    def fails(fail) -> str:
        b, s, c = fail
        if s is not None:
            return f"B = {b} needs {ratio(b, s):.3g}x the examples of B0 = {b0} {tol}"
        return (f"B = {b} did not reach the goal in {c} steps, so it needs more than {ratio(b, c):.3g}x the examples "
                f"of B0 = {b0} {tol}")

    end, n_points = passed[-1], len(passed)
    ps = _bound(n_points=n_points)
    if undecided:
        b, c = undecided[0]
        why = ("has no censoring bound" if c is None else
               f"did not reach the goal in {c} steps, which puts its examples ratio only above {ratio(b, c):.3g}x, "
               f"not above 1 + {tolerance:g}")
        ps.update(kind=UNDETERMINED, lower_bound=end,
                  reason=f"undetermined beyond B = {end}: the unreached B = {b} {why}"
                  + (f"; perfect scaling ends before B = {failure[0]}: {fails(failure)}" if failure else ""))
        if failure:
            ps["upper_bound"] = failure[0]
    elif failure is None:
        if n_points < 2:
            ps.update(kind=UNDETERMINED, lower_bound=end,
                      reason=f"undetermined: no batch size above B0 = {b0} is measured")
        else:
            worst = max(passed, key=lambda x: ratio(x, steps[x]))
            ps.update(kind=BEYOND_RANGE, lower_bound=end,
                      reason=f"beyond the measured range: every measured batch size from B0 = {b0} to {end} is within "
                      f"{tolerance:g} of perfect scaling (the largest examples ratio is {ratio(worst, steps[worst]):.3g}x, "
                      f"at B = {worst})")
    elif n_points < 2:
        ps.update(kind=BELOW_RANGE, upper_bound=failure[0],
                  reason=f"below the measured range: perfect scaling ends at B0 = {b0}, the only measured batch size "
                  f"inside it: {fails(failure)}")
    else:
        ps.update(value=end, kind=READ, reason=f"perfect scaling ends at B = {end}: {fails(failure)}")
        if failure[1] is not None:
            ps["interpolated"] = _interpolate(end, ratio(end, steps[end]), failure[0], ratio(failure[0], failure[1]), level)
    if failure is not None:
        back = [b for b, s in steps.items() if b > failure[0] and s * b <= limit]
        if back:
            ps["note"] = (f"{_listed(back)} {'returns' if len(back) == 1 else 'return'} within the tolerance after the "
                          f"first failure at B = {failure[0]}: under-tuned smaller batch sizes?")
    return ps, None if failure is None else failure[0]


def _maximal_parallelism(curve: StepsCurve, steps: dict[int, int], tolerance: float) -> dict:
    """The maximal-data-parallelism bound (docs/methods.md, "Regimes read from the data"): the smallest
    reached B from which every larger reached S is <= (1 + tol) min S, an unreached larger batch size whose
    censoring bound is already >= (1 + tol) min S breaking the plateau."""
    reached = list(steps)
    s_low = min(steps.values())
    s_low_b = min(b for b, s in steps.items() if s == s_low)
    limit = (1 + tolerance) * s_low
    band = f"within {tolerance:g} of the minimum measured steps ({s_low} at B = {s_low_b})"
    unreached = [(int(b), c) for b, s, c in zip(curve.batch_sizes, curve.steps, curve.censoring()) if s is None]
    bad = [b for b, s in steps.items() if s > limit] + [b for b, c in unreached if c is not None and c >= limit]
    start_candidates = [b for b in reached if all(x < b for x in bad)]
    mp = _bound()
    if not start_candidates:
        top = max(bad)
        mp["kind"] = NOT_SEEN
        if top in reached:
            mp["reason"] = (f"not seen in the measured range: the largest measured batch size ({top}) needs "
                            f"{steps[top]:.4g} steps, more than (1 + {tolerance:g}) x the minimum measured steps "
                            f"({s_low:.4g}, at B = {s_low_b}); steps rise again at large batch sizes")
        else:
            above = [(b, c) for b, c in unreached if b > max(reached) and c is not None and c >= limit]
            mp["reason"] = (
                "not seen in the measured range: unreached batch size(s) above every reached one need more than "
                + ", ".join(f"{c:.4g} steps (B = {b})" for b, c in above)
                + f", more than (1 + {tolerance:g}) x the minimum measured steps ({s_low:.4g}, at B = {s_low_b}); "
                "steps rise again at large batch sizes")
        return mp
    start = min(start_candidates)
    n_mp = sum(1 for b in reached if b >= start)
    mp["n_points"] = n_mp
    prev = [b for b in reached if b < start]
    outside = max(bad) if bad else None  # the last batch size outside the band, below the start
    if outside is None:
        why = ""
    elif outside in steps:
        why = f"; B = {outside} needs {steps[outside] / s_low:.3g}x the minimum"
    else:
        bound = dict(unreached)[outside]
        why = f"; B = {outside} did not reach the goal in {bound} steps, {bound / s_low:.3g}x the minimum"
    if n_mp < 2:
        mp.update(kind=BEYOND_RANGE, lower_bound=max(prev) if prev else None,
                  reason=f"beyond the measured range: only the largest measured batch size ({start}) is {band}" + why)
    else:
        mp.update(value=start, kind=READ,
                  reason=f"maximal data parallelism starts at B = {start}: every measured S from there on is {band}"
                  + why)
        if prev:
            p = max(prev)
            mp["interpolated"] = _interpolate(p, steps[p] / s_low, start, steps[start] / s_low, 1 + tolerance)
        else:
            mp["note"] = "at or below the smallest measured batch size"
    unknown_after = [b for b, c in unreached if b > start and (c is None or c < limit)]
    if unknown_after:
        mp["note"] = (f"unreached batch sizes {unknown_after} above the start have no censoring bound or one below "
                      "the plateau band: whether they belong to it is unknown")
    return mp


def read_regimes(curve: StepsCurve, tolerance: float = 0.1, b0: float | None = None) -> dict:
    """Shallue's regimes read from the measured points (docs/methods.md, "Regimes read from the data").

    * ``perfect_scaling_end``: contiguous from B0: the last measured (reached) B before the first B > B0
      whose examples ratio ``S(B) B / (S(B0) B0)`` exceeds ``1 + tol`` (an unreached B whose
      ``censored_at`` already puts it above counts as that failure; one whose bound decides nothing leaves
      the end undetermined beyond the last reached B before it). Later batch sizes are never perfect
      scaling, even when their ratio returns within the tolerance (``note`` names them).
    * ``maximal_parallelism_start``: the smallest measured B from which every larger measured S is
      ``<= (1 + tol) min S`` (an unreached larger batch size whose ``censored_at`` already exceeds
      that bound breaks the plateau).

    Each bound is a dict with ``value``, ``kind`` (``read``, or why it is null: ``below_range``,
    ``beyond_range``, ``undetermined``, ``not_seen``), ``reason`` (naming the batch sizes that decide),
    ``n_points``, ``interpolated``, ``lower_bound``, ``upper_bound`` and ``note``. Each regime needs at
    least two measured batch sizes inside it; otherwise ``value`` is ``None``. Steps count optimizer
    updates. Measured = reached. Per batch size, ``points`` gives ``regime`` (unreached batch sizes, those
    below B0 and those the data do not decide get ``None``; the batch size with the fewest steps is never
    diminishing returns), ``examples_ratio`` and ``steps_ratio``. ``b0`` (default: the smallest reached
    batch size) must be a reached batch size of the curve.
    """
    check_tolerance(tolerance)
    pts = [(int(b), int(s)) for b, s in zip(curve.batch_sizes, curve.steps) if s is not None]
    reached = [b for b, _ in pts]
    if not pts:
        raise BatchlabError(f"curve {curve.label!r}: no batch size reached the goal, so no regime can be read")
    if b0 is None:
        b0 = reached[0]
    elif not (float(b0).is_integer() and int(b0) in reached):
        raise BatchlabError(f"b0 must be a batch size that reached the goal, one of {reached}, got {b0:g}")
    b0 = int(b0)
    steps = dict(pts)
    zero = [b for b, s in pts if s == 0]
    if zero:
        raise BatchlabError(f"curve {curve.label!r}: the goal was already met at step 0 (before any update) at batch "
                            f"size(s) {zero}: no regime can be read; choose a stricter goal")
    s0 = steps[b0]
    ps, first_failure = _perfect_scaling(curve, steps, b0, tolerance)
    mp = _maximal_parallelism(curve, steps, tolerance)
    s_low = min(steps.values())
    s_low_b = min(b for b, s in pts if s == s_low)
    limit_mp = (1 + tolerance) * s_low
    # perfect scaling holds from B0 up to here (at least two measured batch sizes)
    ps_top = ps["value"] if ps["value"] is not None else (ps["lower_bound"] if ps["n_points"] >= 2 else None)
    mp_from = mp["value"]
    before_plateau = mp["lower_bound"] if mp_from is None else None  # measured outside the band, up to here
    labels = []
    for b, s in zip(curve.batch_sizes, curve.steps):
        if s is None or b < b0:
            label = None  # unreached, or below B0
        elif ps_top is not None and b <= ps_top:
            label = PERFECT_SCALING
        elif mp_from is not None and b >= mp_from:
            label = MAXIMAL_DATA_PARALLELISM
        elif first_failure is not None and b >= first_failure and s != s_low and (
            (mp_from is not None and b < mp_from)
            or (before_plateau is not None and b <= before_plateau)
            or (b < s_low_b and s > limit_mp)
        ):
            # past perfect scaling and known to be outside the plateau: before the plateau's start, or below
            # the batch size of the minimum measured steps with more than (1 + tol) x those steps; the
            # minimum itself never is
            label = DIMINISHING_RETURNS
        else:
            label = None  # not determined by the data
        labels.append(
            {
                "batch_size": int(b),
                "steps": s,
                "regime": label,
                "examples_ratio": None if s is None else float(s * b / (s0 * b0)),
                "steps_ratio": None if s is None else float(s / s_low),
            }
        )
    plateau_seen = mp_from is not None
    return {
        "tolerance": tolerance,
        "b0": b0,
        "steps_at_b0": s0,
        "measured_batch_sizes": reached,
        "perfect_scaling_end": ps,
        "maximal_parallelism_start": mp,
        "s_min_measured": {
            "value": s_low,
            "batch_size": s_low_b,
            "plateau_seen": plateau_seen,
            "note": None if plateau_seen else "no plateau of two measured batch sizes: an upper bound on the plateau",
        },
        "points": labels,
    }


def bound_shares(replicate_regimes: Sequence[dict | None]) -> dict:
    """The share of resampled curves giving each value of each data-read regime bound.

    ``replicate_regimes``: :func:`read_regimes` of each trial-resampled curve (``None`` for a replicate
    that could not be read: fewer than two reached batch sizes, B0 not reached). Returns, for
    ``perfect_scaling_end`` and ``maximal_parallelism_start``: ``n_replicates``; ``shares``, a list of
    ``{"value", "share"}`` (measured batch sizes in increasing order, then ``None`` = not read, whatever the
    reason), shares of ``n_replicates`` summing to 1; and ``null_shares``, the null share split by ``kind``
    (``below_range``, ``beyond_range``, ``undetermined``, ``not_seen``, ``not_read``). A descriptive
    stability measure (docs/methods.md, "Regimes read from the data"), not a confidence statement.
    """
    replicates = list(replicate_regimes)
    if not replicates:
        raise BatchlabError("bound_shares needs at least one resampled curve's regimes, got none")
    n = len(replicates)
    out = {}
    for name in BOUNDS:
        bounds = [None if r is None else r[name] for r in replicates]
        values = Counter(None if bound is None else bound["value"] for bound in bounds)
        kinds = Counter(NOT_READ if bound is None else bound["kind"]
                        for bound in bounds if bound is None or bound["value"] is None)
        order = sorted(v for v in values if v is not None) + ([None] if None in values else [])
        out[name] = {
            "n_replicates": n,
            "shares": [{"value": v, "share": values[v] / n} for v in order],
            "null_shares": {k: kinds[k] / n for k in sorted(kinds)},
        }
    return out
