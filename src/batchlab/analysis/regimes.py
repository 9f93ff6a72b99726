"""Shallue et al.'s regimes read from the measured points of a steps-to-result curve, not from a fit.

Definitions, resolution and reasons for a null value: docs/methods.md, "Regimes read from the data".
The fit-derived regime bounds live with the fit (:mod:`batchlab.analysis.critical_batch_size`).
"""

from __future__ import annotations

import numpy as np

from batchlab.analysis.curve import StepsCurve
from batchlab.errors import BatchlabError

PERFECT_SCALING = "perfect_scaling"
DIMINISHING_RETURNS = "diminishing_returns"
MAXIMAL_DATA_PARALLELISM = "maximal_data_parallelism"


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


def read_regimes(curve: StepsCurve, tolerance: float = 0.1, b0: float | None = None) -> dict:
    """Shallue's regimes read from the measured points (docs/methods.md, "Regimes read from the data").

    * ``perfect_scaling_end``: the largest measured B with ``S(B) B <= (1 + tol) S(B0) B0``.
    * ``maximal_parallelism_start``: the smallest measured B from which every larger measured S is
      ``<= (1 + tol) min S`` (an unreached larger batch size whose ``censored_at`` already exceeds
      that bound breaks the plateau).

    Measured = reached. Each regime needs at least two measured batch sizes inside it; otherwise its
    value is ``None`` with a ``reason`` (and a ``lower_bound`` or ``upper_bound`` where the data give
    one). Unreached batch sizes get no regime label. ``b0`` (default: the smallest reached batch size)
    must be a reached batch size of the curve.
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
    censored = [(int(b), c) for b, s, c in zip(curve.batch_sizes, curve.steps, curve.censoring()) if s is None and c is not None]
    limit_ps = (1 + tolerance) * s0 * b0
    scaling = [(b, s) for b, s in pts if b >= b0]
    within = [b for b, s in scaling if s * b <= limit_ps]
    ps_end = max(within)
    n_ps = sum(1 for b, _ in scaling if b <= ps_end)
    beyond = [b for b, _ in scaling if b > ps_end] + [b for b, c in censored if b > ps_end and c * b > limit_ps]
    ps = {"value": None, "reason": None, "n_points": n_ps, "interpolated": None}
    if n_ps < 2:
        nxt = min([b for b, _ in scaling if b > b0], default=None)
        ps["reason"] = (f"below the measured range: only B0 = {b0} lies within {tolerance:g} of perfect scaling"
                        + (f" (it ends before B = {nxt})" if nxt else ""))
        ps["upper_bound"] = nxt
    elif not beyond:
        ps["reason"] = (f"beyond the measured range: every measured batch size up to {ps_end} is within {tolerance:g} "
                        "of perfect scaling")
        ps["lower_bound"] = ps_end
    else:
        ps["value"] = ps_end
        nxt = [(b, s) for b, s in scaling if b > ps_end]
        if nxt:
            ratio = lambda b, s: s * b / (s0 * b0)  # noqa: E731
            ps["interpolated"] = _interpolate(ps_end, ratio(ps_end, steps[ps_end]), nxt[0][0], ratio(*nxt[0]), 1 + tolerance)
    s_low = min(s for _, s in pts)
    limit_mp = (1 + tolerance) * s_low
    bad = [b for b, s in pts if s > limit_mp] + [b for b, c in censored if c >= limit_mp]
    start_candidates = [b for b in reached if all(x < b for x in bad)]
    mp = {"value": None, "reason": None, "n_points": 0, "interpolated": None}
    unknown_after = []
    if not start_candidates:
        top = max(bad)
        if top in reached:
            mp["reason"] = (f"not seen in the measured range: the largest measured batch size ({top}) needs "
                            f"{steps[top]:.4g} steps, more than (1 + {tolerance:g}) x the minimum measured steps "
                            f"({s_low:.4g}); steps rise again at large batch sizes")
        else:
            above = [(b, c) for b, c in censored if b > max(reached) and c >= limit_mp]
            mp["reason"] = (
                "not seen in the measured range: unreached batch size(s) above every reached one need more than "
                + ", ".join(f"{c:.4g} steps (B = {b})" for b, c in above)
                + f", more than (1 + {tolerance:g}) x the minimum measured steps ({s_low:.4g}); steps rise again "
                "at large batch sizes")
    else:
        mp_start = min(start_candidates)
        n_mp = sum(1 for b in reached if b >= mp_start)
        mp["n_points"] = n_mp
        unknown_after = [b for b, c in censored if b > mp_start and c < limit_mp]
        prev = [b for b in reached if b < mp_start]
        if n_mp < 2:
            mp["reason"] = (f"beyond the measured range: only the largest measured batch size ({mp_start}) is within "
                            f"{tolerance:g} of the minimum measured steps")
            if prev:
                mp["lower_bound"] = max(prev)
        else:
            mp["value"] = mp_start
            if prev:
                p = max(prev)
                mp["interpolated"] = _interpolate(p, steps[p] / s_low, mp_start, steps[mp_start] / s_low, 1 + tolerance)
            else:
                mp["note"] = "at or below the smallest measured batch size"
    if unknown_after:
        mp["note"] = (f"unreached batch sizes {unknown_after} above the start have censoring bounds below the plateau "
                      "band: whether they belong to it is unknown")
    plateau_seen = mp["value"] is not None
    s_low_b = min((b for b, s in pts if s == s_low))
    labels = []
    ps_top = ps["value"] if ps["value"] is not None else ps.get("lower_bound")  # perfect scaling holds up to here
    ps_over = ps["value"] if ps["value"] is not None else (b0 if ps.get("upper_bound") is not None else None)
    mp_from = mp["value"]
    before_plateau = mp_from if mp_from is not None else mp.get("lower_bound")
    for b, s in zip(curve.batch_sizes, curve.steps):
        if s is None or b < b0:
            label = None  # unreached, or below B0
        elif ps_top is not None and b <= ps_top:
            label = PERFECT_SCALING
        elif mp_from is not None and b >= mp_from:
            label = MAXIMAL_DATA_PARALLELISM
        elif ps_over is not None and b > ps_over and (
            (before_plateau is not None and (b < before_plateau if mp_from is not None else b <= before_plateau))
            or (b < s_low_b and s > limit_mp)
        ):
            # past perfect scaling and known to be outside the plateau band: before the plateau's start,
            # or below the batch size of the minimum measured steps with more than (1 + tol) x those steps
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
