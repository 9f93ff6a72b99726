"""The S(B) fit, the named critical batch sizes and Shallue's regimes read from the data.

Definitions, estimators and their resolution are in docs/methods.md ("Critical batch size",
"Regimes read from the data", "The S(B) fit").

The fit
-------
``S(B) = S_min + E_min / B`` (McCandlish et al. 2018), ``B_crit = E_min / S_min``, fitted in log space
(steps span orders of magnitude) by one weighted least-squares objective with censoring, whose
point estimate and intervals (:func:`profile_intervals`) share the same weights:

* each batch size ``j`` has a scatter ``tau_j``: the larger of a base, the trials' own best-of-K sd
  (:mod:`batchlab.analysis.scatter`, when trials are given; at least :data:`MIN_TRIAL_SCATTER`) or
  ``sigma_floor`` (default 5%, without trials), and the residual scatter (the common level the
  residuals ask for, ``sum r**2 / (v + max(base, s**2)) = n_points - 2``), which with trials is used
  only where the residuals exceed the trials' scatter beyond noise (the misspecification test below
  at ``p <`` :data:`RESIDUAL_GATE`).
* a reached batch size enters with its bracket ``(steps_lower, steps]``: the value fitted is the
  bracket's log-midpoint, its weight ``1 / (tau_j**2 + v_j)`` with ``v_j = w**2 / 12``, ``w =
  log(steps / steps_lower)`` the bracket's log-width (a uniform error over the bracket); exact first
  passages (the NQM) have the bracket ``(steps - 1, steps]``. A bracket starting at 0 is an upper
  bound only (``S <= steps``).
* an unreached batch size with a known ``censored_at`` enters as censored (``S > censored_at``): a
  one-sided quadratic with weight ``1 / tau_j**2`` where the fit passes below ``censored_at`` (it pulls
  exactly as an observed point at the bound would) and 0 above. Unreached batch sizes without
  ``censored_at`` are left out.
* batch sizes above the measured minimum whose steps exceed it beyond :data:`RISE_Z` sd (the
  largest ones, contiguously) are a rise and left out (``use = "rising"``): ``B_crit`` describes the
  hyperbola before the rise.
* the minimisation profiles ``log S_min`` out in closed form and searches ``B_crit`` on a log grid
  reaching four decades beyond the measured batch sizes, plus ``B_crit = 0`` (flat) and ``inf`` (pure
  perfect scaling), then refines by golden section. It is vectorised over many curves at once
  (:func:`fit_many`), which the interval code uses.
* misspecification: ``chi2`` of the fitted residuals against the trials' scatter (not the residual
  one), an F test against ``F(n_points - 2, trial dof)`` (chi-square against the floor without
  trials); "poor fit" only at ``p < 0.01``, with what the residuals show (:func:`describe_misfit`).

Named critical batch sizes: :data:`batchlab.analysis.definitions.REGISTRY` (re-exported here as
:data:`REGISTRY`): each entry has a name, a one-line definition, a table label and how it is computed;
every summary, table and interval iterates the registry.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from batchlab.analysis.curve import StepsCurve
from batchlab.analysis.definitions import REGISTRY  # the registry (also importable from here)
from batchlab.analysis.regimes import (  # re-exported: the regimes read from the data
    DIMINISHING_RETURNS,
    MAXIMAL_DATA_PARALLELISM,
    PERFECT_SCALING,
    check_tolerance,
    read_regimes,
)
from batchlab.analysis.scatter import ScatterEstimate
from batchlab.errors import BatchlabError


SIGMA_FLOOR = 0.05  # log-space scatter of a measured minimum assumed when no trials' scatter is given
MIN_TRIAL_SCATTER = 0.01  # the least best-of-K sd a trials' estimate is taken as (ties on the evaluation grid)
RISE_Z = 2.0  # a batch size above the measured minimum is a rise when its steps exceed it by this many sd
MISFIT_P = 0.01  # "poor fit" below this p-value of the misspecification test
MISFIT_Z = 2.0  # a standardised residual beyond this is named in the misfit description
RESIDUAL_GATE = 0.05  # with trials, the residual scatter is used only where the residuals reject them at this level
FLOOR, TRIALS, RESIDUALS = 0, 1, 2  # where a fit's scatter comes from
SOURCES = ("floor", "trials", "residuals")
GRID_DECADES = 4.0  # B_crit is searched this many decades beyond the measured batch sizes
GRID_POINTS = 161
GOLDEN_ITERATIONS = 48

POINT, LOWER, UPPER, ABSENT = 0, 1, 2, -1  # kinds of observation: value, S > value, S <= value, none


# --------------------------------------------------------------------------------------------------
# The fit


@dataclass(frozen=True)
class ScalingFit:
    """A fitted ``S(B) = S_min + E_min / B``.

    Attributes:
        s_min: minimum steps (the large-batch asymptote), in updates.
        e_min: minimum examples (the small-batch asymptote of ``B * S``), in examples.
        b_crit: ``e_min / s_min`` (inf when no plateau is visible, 0 when no scaling is visible).
        smallest_batch_size: the smallest reached batch size used in the fit.
        largest_batch_size: the largest reached batch size used in the fit.
        n_points: number of reached batch sizes fitted.
        rms_log_residual: root-mean-square of ``log S_measured - log S_fit`` over reached points
            (``S_measured`` = the bracket's log-midpoint).
        max_abs_log_residual: largest absolute log residual (large values: the curve is not a
            hyperbola, e.g. it rises again at huge batch sizes or is budget-truncated).
        b0: the batch size perfect scaling is measured from (default: ``smallest_batch_size``).
        n_censored: unreached batch sizes that entered as censored (``S > censored_at``).
        chi2, dof, p_value: the misspecification test: ``sum(residual**2 / (tau_trials**2 + v))``
            over the fitted points plus the censoring terms, against the trials' scatter (the
            ``sigma_floor`` without trials), ``n_points - 2`` degrees of freedom, and its tail
            probability (F test ``F(dof, scatter_dof)`` with trials, chi-square without; ``None`` when
            ``dof <= 0``).
        sigma_floor: the scatter assumed without trials (then the least a point's scatter can be; with
            the trials' scatter the least is :data:`MIN_TRIAL_SCATTER`).
        scatter: the scatter used in the weights (log space): the residual level when
            ``scatter_source == "residuals"``, else the trials' ``tau`` or ``sigma_floor``.
        scatter_source: ``"trials"``, ``"residuals"`` or ``"floor"`` (see the module docstring).
        scatter_dof: degrees of freedom of that scatter (``None`` for the floor).
        misfit: what the residuals show when the test rejects the hyperbola at ``p < 0.01``
            (a rise, a sharper or gentler bend, scatter beyond the trials'), else ``None``.
        rising_batch_sizes: batch sizes left out as a rise after the minimum.
        extrapolated: ``b_crit`` lies outside ``[smallest_batch_size, largest_batch_size]``.
        warnings: what the fit rests on, in words (two points, extrapolation, poor fit, ...).
        residuals: one dict per batch size of the curve (see :func:`fit_steps_curve`).
    """

    s_min: float
    e_min: float
    b_crit: float
    smallest_batch_size: float
    largest_batch_size: float
    n_points: int
    rms_log_residual: float
    max_abs_log_residual: float
    b0: float = 0.0
    n_censored: int = 0
    chi2: float = 0.0
    dof: int = 0
    p_value: float | None = None
    sigma_floor: float = SIGMA_FLOOR
    extrapolated: bool = False
    warnings: tuple[str, ...] = ()
    residuals: tuple[dict, ...] = field(default=(), compare=True)
    scatter: float = SIGMA_FLOOR
    scatter_source: str = "floor"
    scatter_dof: float | None = None
    misfit: str | None = None
    rising_batch_sizes: tuple[int, ...] = ()

    def predicted_steps(self, batch_size: np.ndarray | float) -> np.ndarray:
        """Fitted steps ``S_min + E_min / B`` at the given batch sizes."""
        return self.s_min + self.e_min / np.asarray(batch_size, dtype=float)

    def to_dict(self) -> dict:
        """JSON-serialisable fields (inf becomes None)."""
        out = {k: _finite_or_none(v) for k, v in asdict(self).items()}
        out["warnings"] = list(self.warnings)
        out["residuals"] = [dict(r) for r in self.residuals]
        out["rising_batch_sizes"] = list(self.rising_batch_sizes)
        return out


def observation_arrays(curve: StepsCurve):
    """``(b, y, resolution, kind)`` over every batch size of ``curve``.

    ``y`` is the log-value (a bracket's log-midpoint, or the censoring bound), ``resolution`` a
    point's log-space variance from its bracket (``log(steps / steps_lower)**2 / 12``), ``kind``
    ``POINT``, ``LOWER`` (``S > censored_at``), ``UPPER`` (bracket from 0: ``S <= steps``) or ``ABSENT``.
    """
    n = len(curve.batch_sizes)
    b = np.asarray(curve.batch_sizes, dtype=float)
    y = np.zeros(n)
    v = np.zeros(n)
    kind = np.full(n, ABSENT)
    for i, (bracket, censored) in enumerate(zip(curve.brackets(), curve.censoring())):
        if bracket is not None:
            low, high = bracket
            if high <= 0:
                continue
            if low <= 0:
                y[i], kind[i] = np.log(high), UPPER
            else:
                y[i], v[i], kind[i] = 0.5 * (np.log(low) + np.log(high)), np.log(high / low) ** 2 / 12, POINT
        elif censored is not None and censored > 0:
            y[i], kind[i] = np.log(censored), LOWER
    return b, y, v, kind


def _penalty(c: np.ndarray, a: np.ndarray, w: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """``sum(w r^2)`` over the last axis, r = c - a for points and the one-sided parts for censored ones."""
    r = c[..., None] - a
    r = np.where(kind == POINT, r, np.where(kind == LOWER, np.minimum(r, 0.0), np.where(kind == UPPER, np.maximum(r, 0.0), 0.0)))
    return np.sum(w * r * r, axis=-1)


def _best_offset(a: np.ndarray, w: np.ndarray, kind: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Minimise the penalty over the offset ``c`` exactly (last axis: observations).

    The penalty is convex and piecewise quadratic with kinks at the censored values; on each piece
    the active set is fixed, so the minimiser is the clipped closed-form root of one of the pieces.
    """
    censored = (kind == LOWER) | (kind == UPPER)
    m = int(censored.sum(axis=-1).max()) if censored.size else 0
    if m == 0:  # no censoring anywhere: the weighted mean
        wp = np.where(kind == POINT, w, 0.0)
        den = wp.sum(axis=-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            c = np.sum(wp * a, axis=-1) / den
        return c, np.where(den > 0, _penalty(c, a, w, kind), np.inf)
    thresholds = np.sort(np.where(censored, a, np.inf), axis=-1)[..., :m]
    inf = np.full(thresholds.shape[:-1] + (1,), np.inf)
    lo = np.concatenate([-inf, thresholds], axis=-1)  # (..., n+1)
    hi = np.concatenate([thresholds, inf], axis=-1)
    a_ = a[..., None, :]
    w_ = w[..., None, :]
    k_ = kind[..., None, :]
    active = (k_ == POINT) | ((k_ == LOWER) & (a_ >= hi[..., None])) | ((k_ == UPPER) & (a_ <= lo[..., None]))
    den = np.sum(np.where(active, w_, 0.0), axis=-1)
    num = np.sum(np.where(active, w_ * np.where(active, a_, 0.0), 0.0), axis=-1)
    valid = den > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        cand = np.clip(np.where(valid, num / np.where(valid, den, 1.0), np.nan), lo, hi)
    empty = ~np.isfinite(cand)
    objective = _penalty(np.where(empty, 0.0, cand), a[..., None, :], w[..., None, :], kind[..., None, :])
    objective = np.where(empty, np.inf, objective)
    best = np.argmin(objective, axis=-1)
    c = np.take_along_axis(cand, best[..., None], axis=-1)[..., 0]
    return c, np.take_along_axis(objective, best[..., None], axis=-1)[..., 0]


def _profile(u: np.ndarray, b: np.ndarray, y: np.ndarray, w: np.ndarray, kind: np.ndarray):
    """Offset and objective at ``log B_crit = u`` (shape (R, G)) for curves ``y`` (R, n)."""
    g = np.log1p(np.exp(u[..., None] - np.log(b)))  # (R, G, n)
    return _best_offset(y[:, None, :] - g, w[:, None, :], kind[:, None, :])


def fit_many(batch_sizes, y: np.ndarray, w: np.ndarray, kind: np.ndarray):
    """Fit many curves on the same batch sizes at once.

    Args:
        batch_sizes: (n,) batch sizes.
        y, w, kind: (R, n) log-values, weights and kinds (``POINT``, ``LOWER``, ``UPPER``, ``ABSENT``).

    Returns:
        ``(s_min, e_min, b_crit, objective)`` arrays of shape (R,). Rows with fewer than two
        ``POINT`` observations give NaN.
    """
    b = np.asarray(batch_sizes, dtype=float)
    y = np.atleast_2d(np.asarray(y, dtype=float))
    w = np.atleast_2d(np.asarray(w, dtype=float))
    kind = np.atleast_2d(np.asarray(kind))
    rows = y.shape[0]
    enough = np.sum(kind == POINT, axis=1) >= 2
    lo_u = np.log(b.min()) - GRID_DECADES * np.log(10)
    hi_u = np.log(b.max()) + GRID_DECADES * np.log(10)
    grid = np.linspace(lo_u, hi_u, GRID_POINTS)
    _, objective = _profile(np.broadcast_to(grid, (rows, grid.size)), b, y, w, kind)
    k = np.argmin(objective, axis=1)
    left = grid[np.maximum(k - 1, 0)]
    right = grid[np.minimum(k + 1, grid.size - 1)]
    ratio = (np.sqrt(5.0) - 1) / 2
    x1 = right - ratio * (right - left)
    x2 = left + ratio * (right - left)
    f1 = _profile(x1[:, None], b, y, w, kind)[1][:, 0]
    f2 = _profile(x2[:, None], b, y, w, kind)[1][:, 0]
    for _ in range(GOLDEN_ITERATIONS):
        go_left = f1 < f2  # the minimum lies in [left, x2]
        right, left = np.where(go_left, x2, right), np.where(go_left, left, x1)
        x1, x2 = (np.where(go_left, right - ratio * (right - left), x2),
                  np.where(go_left, x1, left + ratio * (right - left)))
        f_new = _profile(np.where(go_left, x1, x2)[:, None], b, y, w, kind)[1][:, 0]
        f1, f2 = np.where(go_left, f_new, f2), np.where(go_left, f1, f_new)
    u = 0.5 * (left + right)
    c, best = _profile(u[:, None], b, y, w, kind)
    c, best = c[:, 0], best[:, 0]
    # The two limits: B_crit = 0 (log S = c) and B_crit = inf (log S = c - log B).
    c0, obj0 = _best_offset(y, w, kind)
    cinf, objinf = _best_offset(y + np.log(b), w, kind)
    s_min = np.exp(c)
    b_crit = np.exp(u)
    e_min = s_min * b_crit
    tol = 1e-12 * np.maximum(1.0, best)
    flat = obj0 <= best + tol
    steep = (objinf <= best + tol) & ~flat
    s_min = np.where(flat, np.exp(c0), np.where(steep, 0.0, s_min))
    e_min = np.where(flat, 0.0, np.where(steep, np.exp(cinf), e_min))
    b_crit = np.where(flat, 0.0, np.where(steep, np.inf, b_crit))
    best = np.where(flat, obj0, np.where(steep, objinf, best))
    nan = np.full(rows, np.nan)
    return (np.where(enough, s_min, nan), np.where(enough, e_min, nan), np.where(enough, b_crit, nan),
            np.where(enough, best, nan))


def _rising_mask(b: np.ndarray, y: np.ndarray, var: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """(R, n) batch sizes that form a rise after the measured minimum (batch sizes increase along n).

    The rise is the largest run of reached batch sizes above the minimum's, each with steps above
    the minimum by more than ``RISE_Z * sqrt(var_j + var_min)``, plus any unreached batch sizes
    among or after them (none without at least one such reached batch size); it is kept (not
    marked) when fewer than three fitted points would remain."""
    n = y.shape[1]
    point = kind == POINT
    j_min = np.argmin(np.where(point, y, np.inf), axis=1)
    y_min = np.take_along_axis(y, j_min[:, None], axis=1)
    var_min = np.take_along_axis(var, j_min[:, None], axis=1)
    index = np.arange(n)[None, :]
    above = index > j_min[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        high = point & above & ((y - y_min) > RISE_Z * np.sqrt(var + var_min))
    settled = point & ~high  # a fitted point not significantly above the minimum (the minimum included)
    last_settled = n - 1 - np.argmax(settled[:, ::-1], axis=1)
    rising = (index > last_settled[:, None]) & (kind != ABSENT)
    keep = np.sum(point & ~rising, axis=1) >= 3
    # a rise needs a measured point above the minimum after the last settled one (not only censored ones)
    measured_rise = np.any(point & (index > last_settled[:, None]), axis=1)
    return rising & (measured_rise & keep)[:, None]


def _residual_variance(r2: np.ndarray, v: np.ndarray, base: np.ndarray, point: np.ndarray, dof: np.ndarray):
    """(R,) scatter ``s**2`` the residuals ask for: ``sum r**2 / (v + max(base, s**2)) = dof`` over
    the points (0 where the residuals are within ``v + base`` already, or ``dof <= 0``)."""

    def excess(s2):
        total = v + np.maximum(base, s2[:, None])
        return np.sum(np.where(point, r2 / np.where(point, total, 1.0), 0.0), axis=1) - dof

    rows = r2.shape[0]
    lo, hi = np.zeros(rows), np.full(rows, 100.0)
    needed = (dof > 0) & (excess(lo) > 0)
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        big = excess(mid) > 0
        lo, hi = np.where(big, mid, lo), np.where(big, hi, mid)
    return np.where(needed, hi, 0.0)


def _misfit_p(chi2: np.ndarray, dof: np.ndarray, trial_dof: np.ndarray) -> np.ndarray:
    """Tail probability of the misspecification statistic: ``F(dof, trial_dof)`` of ``chi2 / dof``
    where the scatter has ``trial_dof`` degrees of freedom, ``chi2(dof)`` where it is known (inf)."""
    from scipy.stats import chi2 as chi2_dist
    from scipy.stats import f as f_dist

    dof_safe = np.maximum(dof, 1)
    finite = np.isfinite(trial_dof)
    with np.errstate(invalid="ignore", divide="ignore"):
        p_f = f_dist.sf(chi2 / dof_safe, dof_safe, np.where(finite, trial_dof, 1.0))
    return np.where(finite, p_f, chi2_dist.sf(chi2, dof_safe))


def fit_with_scatter(batch_sizes, y: np.ndarray, resolution: np.ndarray, kind: np.ndarray, trial_sd=None,
                     trial_dof=None, sigma_floor: float = SIGMA_FLOOR, exclude_rising: bool = True) -> dict:
    """The one fit of many curves: scatter, weights, the rise, the estimate and the misfit test.

    Args:
        batch_sizes: (n,) increasing batch sizes.
        y, resolution, kind: (R, n) log-values, bracket variances ``v`` and kinds
            (:func:`observation_arrays`).
        trial_sd: (R, n) or (n,) the trials' best-of-K sd at each batch size (log space; NaN where
            unknown) or ``None`` (no trials: ``sigma_floor`` is the scatter's base).
        trial_dof: (R,) or scalar degrees of freedom of the trials' scatter (with ``trial_sd``).
        exclude_rising: leave a rise after the minimum out (:func:`_rising_mask`).

    Returns:
        dict of arrays: ``s_min``, ``e_min``, ``b_crit``, ``objective`` (R,), ``weight``, ``kind``
        (R, n; rising batch sizes become ``ABSENT``), ``rising`` (R, n), ``scatter2`` (R, n: each
        batch size's ``tau_j**2``), ``residual_scatter2`` (R,), ``source`` (R,: ``FLOOR``,
        ``TRIALS``, ``RESIDUALS``), ``scatter_dof`` (R,: the residual dof, the trials' dof, or inf
        for the floor), ``test_chi2``, ``test_dof``, ``test_p`` (R,; p NaN where ``test_dof <= 0``),
        ``test_sd`` (R, n: the sd the test standardises by), ``log_residual`` (R, n: measured minus
        fitted log steps), ``has_trials`` (R,). Censored and one-sided terms weigh ``1 / tau_j**2``
        (as a point at its bound would) where the fit is on their wrong side, 0 elsewhere.
    """
    b = np.asarray(batch_sizes, dtype=float)
    y = np.atleast_2d(np.asarray(y, dtype=float))
    v = np.atleast_2d(np.asarray(resolution, dtype=float))
    kind = np.atleast_2d(np.asarray(kind))
    rows, n = y.shape
    if trial_sd is None:
        has_trials = np.zeros(rows, dtype=bool)
        base = np.full((rows, n), sigma_floor**2)
        t_dof = np.full(rows, np.inf)
    else:
        sd = np.broadcast_to(np.asarray(trial_sd, dtype=float), (rows, n))
        has_trials = np.isfinite(sd).any(axis=1)
        base = np.where(np.isfinite(sd), np.maximum(sd, MIN_TRIAL_SCATTER), sigma_floor) ** 2
        t_dof = np.broadcast_to(np.asarray(np.inf if trial_dof is None else trial_dof, dtype=float), (rows,)).copy()
        t_dof = np.where(has_trials, t_dof, np.inf)
    rising = _rising_mask(b, y, v + base, kind) if exclude_rising else np.zeros((rows, n), dtype=bool)
    kind = np.where(rising, ABSENT, kind)
    point = kind == POINT
    one_sided = (kind == LOWER) | (kind == UPPER)

    def weights(scale2):
        return np.where(point, 1.0 / (v + scale2), np.where(one_sided, 1.0 / scale2, 0.0))

    def log_residuals(s_min, e_min):
        with np.errstate(invalid="ignore", divide="ignore"):
            return y - np.log(s_min[:, None] + e_min[:, None] / b)

    s_min, e_min, _, _ = fit_many(b, y, weights(base), kind)
    r = log_residuals(s_min, e_min)
    r2 = np.where(point & np.isfinite(r), r * r, 0.0)
    dof = np.sum(point, axis=1) - 2
    s2 = _residual_variance(r2, v, base, point, dof)
    prelim_p = _misfit_p(np.sum(np.where(point, r2 / (v + base), 0.0), axis=1), dof, t_dof)
    s2 = np.where(has_trials & ~(prelim_p < RESIDUAL_GATE), 0.0, s2)
    scale2 = np.maximum(base, s2[:, None])
    w = weights(scale2)
    s_min, e_min, b_crit, objective = fit_many(b, y, w, kind)
    r = log_residuals(s_min, e_min)
    source = np.where(s2 > 0, RESIDUALS, np.where(has_trials, TRIALS, FLOOR))
    scatter_dof = np.where(source == RESIDUALS, np.maximum(dof, 1), np.where(source == TRIALS, t_dof, np.inf))
    # the misspecification test: the residuals against the trials' scatter (the floor without trials)
    one_sided_r = np.where(kind == LOWER, np.minimum(-r, 0.0), np.where(kind == UPPER, np.maximum(-r, 0.0), 0.0))
    with np.errstate(invalid="ignore"):
        test_chi2 = np.sum(np.where(point, r * r / (v + base), 0.0) + np.where(one_sided, one_sided_r**2 / base, 0.0),
                           axis=1)
    p = _misfit_p(test_chi2, dof, t_dof)
    return {"s_min": s_min, "e_min": e_min, "b_crit": b_crit, "objective": objective, "weight": w, "kind": kind,
            "rising": rising, "scatter2": scale2, "residual_scatter2": s2, "source": source,
            "scatter_dof": scatter_dof, "test_chi2": test_chi2, "test_dof": dof,
            "test_p": np.where(dof > 0, p, np.nan), "test_sd": np.sqrt(v + base), "log_residual": r,
            "has_trials": has_trials}


def describe_misfit(batch_sizes, z: np.ndarray, with_trials: bool, censored_z: dict | None = None,
                    sigma_floor: float = SIGMA_FLOOR) -> str:
    """What a rejected hyperbola's standardised residuals show, in words.

    Args:
        batch_sizes, z: the fitted points' batch sizes (increasing) and residuals over their sd.
        with_trials: the sd is the trials' scatter (else the floor ``sigma_floor``).
        censored_z: ``{batch_size: how far the fit passes below its censoring bound, in sd}``.

    In order: a rise (the largest batch sizes above the fit beyond :data:`MISFIT_Z`, holding the
    largest residual); censored batch sizes the fit passes below beyond it; a bend sharper (or
    gentler) than the hyperbola's (one run of at least three same-sign residuals in the middle, the
    other sign at both ends); otherwise the points beyond it (outliers)."""
    b = [int(x) for x in batch_sizes]
    z = np.asarray(z, dtype=float)
    names = lambda idx: ", ".join(str(b[i]) for i in idx)  # noqa: E731
    whose = "the trials' own" if with_trials else f"the {sigma_floor:.0%} floor's"
    worst = int(np.argmax(np.abs(z))) if z.size else -1
    run = [i for i in range(z.size) if all(z[j] > MISFIT_Z for j in range(i, z.size))]
    if run and worst in run:
        return f"steps rise again at large batch sizes (B = {names(run)}): above the hyperbola beyond {whose} scatter"
    below = sorted((bb for bb, zz in (censored_z or {}).items() if zz > MISFIT_Z))
    if below and (not z.size or max(censored_z[bb] for bb in below) >= abs(z[worst])):
        return (f"unreached batch sizes B = {', '.join(str(int(x)) for x in below)} need more steps than the hyperbola "
                f"through the others allows, beyond {whose} scatter")
    signs = np.sign(z)
    runs = 1 + int(np.sum(signs[1:] != signs[:-1])) if z.size else 0
    middle = [i for i in range(z.size) if signs[i] != signs[0]]
    if z.size >= 5 and runs == 3 and len(middle) >= 3:
        peak = max(middle, key=lambda i: abs(z[i]))
        shape, side = ("sharper", "below") if signs[peak] < 0 else ("gentler", "above")
        return (f"a {shape} bend than the hyperbola near B = {b[peak]} (steps {side} the fit at B = {names(middle)}, "
                "the other way at both ends)")
    outliers = sorted((i for i in range(z.size) if abs(z[i]) > MISFIT_Z), key=lambda i: -abs(z[i])) or [worst]
    return f"scatter beyond {whose} at B = {names(sorted(outliers))}"


def _first_bracket_note(curve: StepsCurve, batch_sizes: np.ndarray) -> str:
    """Why batch sizes that reached the goal at their first evaluation are not fitted points: their
    bracket ``(0, S]`` bounds the steps from above only ("" when there are none)."""
    if batch_sizes.size == 0:
        return ""
    steps = dict(zip(curve.batch_sizes, curve.steps))
    shown = ", ".join(f"B={int(bs)} (0, {steps[int(bs)]}]" for bs in batch_sizes)
    return (f" with a resolved bracket; {batch_sizes.size} more reached it at their first evaluation, which bounds "
            f"the steps from above only ({shown}): evaluate earlier or choose a stricter goal")


def scatter_arrays(scatter: ScatterEstimate | None, batch_sizes) -> tuple[np.ndarray | None, float | None]:
    """``(trial_sd, trial_dof)`` for :func:`fit_with_scatter` from a :class:`ScatterEstimate` (or ``None``)."""
    if scatter is None:
        return None, None
    return scatter.sd_at(batch_sizes), float(scatter.dof)


def fit_steps_curve(curve: StepsCurve, b0: float | None = None, sigma_floor: float = SIGMA_FLOOR,
                    scatter: ScatterEstimate | None = None) -> ScalingFit:
    """Fit ``S(B) = S_min + E_min / B`` to ``curve`` (one censored likelihood; see the module docstring).

    ``scatter``: the trials' own scatter (:func:`batchlab.analysis.scatter.scatter_from_trials`), or
    ``None`` (then ``sigma_floor`` is the scatter's base). ``residuals`` holds one dict per batch size:
    ``batch_size``, ``steps``, ``steps_lower``, ``censored_at``, ``use`` (``"point"``, ``"censored"``,
    ``"upper_bound"``, ``"rising"`` (left out as a rise after the minimum) or ``"unused"``),
    ``fitted`` steps, ``sigma`` (the log-space sd the fit gave it, scatter and bracket) and, for points
    and rising ones, ``log_residual`` (measured log-midpoint minus fitted log), for points ``weight``;
    for censored ones ``consistent`` (the fit lies above ``censored_at``).

    Raises:
        BatchlabError: fewer than two batch sizes reached the goal.
    """
    if not sigma_floor > 0:
        raise BatchlabError(f"sigma_floor must be > 0, got {sigma_floor}")
    b, y, v, kind = observation_arrays(curve)
    name = f" {curve.label!r}" if curve.label else ""
    n_reached = int(np.sum(kind == POINT))
    if n_reached < 2:
        raise BatchlabError(f"curve{name}: need at least 2 batch sizes that reached the goal to fit S(B), got {n_reached}"
                            f"{_first_bracket_note(curve, b[kind == UPPER])}")
    trial_sd, trial_dof = scatter_arrays(scatter, b)
    out = {k: x[0] for k, x in fit_with_scatter(b, y[None], v[None], kind[None], trial_sd, trial_dof,
                                                 sigma_floor).items()}
    s_min, e_min, b_crit = float(out["s_min"]), float(out["e_min"]), float(out["b_crit"])
    used = out["kind"]
    fitted_points = used == POINT
    n_points = int(fitted_points.sum())
    reached_b = b[fitted_points]
    smallest, largest = float(reached_b.min()), float(reached_b.max())
    b0 = smallest if b0 is None else float(b0)
    if not b0 > 0:
        raise BatchlabError(f"b0 must be a batch size > 0, got {b0}")
    predicted = s_min + e_min / b
    log_pred = np.log(predicted)
    sigma = np.sqrt(out["scatter2"] + np.where(kind == POINT, v, 0.0))
    residuals = []
    point_res = []
    inconsistent = []
    brackets, censoring = curve.brackets(), curve.censoring()
    for i, (batch, steps) in enumerate(zip(curve.batch_sizes, curve.steps)):
        bracket, censored = brackets[i], censoring[i]
        row = {"batch_size": int(batch), "steps": steps, "steps_lower": None if bracket is None else bracket[0],
               "censored_at": censored, "fitted": float(predicted[i]), "sigma": float(sigma[i])}
        if out["rising"][i]:
            row.update(use="rising", log_residual=float(y[i] - log_pred[i]) if kind[i] == POINT else None)
        elif kind[i] == POINT:
            r = float(y[i] - log_pred[i])
            point_res.append(r)
            row.update(use="point", log_residual=r, weight=float(out["weight"][i]))
        elif kind[i] == LOWER:
            ok = bool(predicted[i] > censored * (1 - 1e-3))
            row.update(use="censored", consistent=ok)
            if not ok:
                inconsistent.append(f"B={int(batch)} by {1 - predicted[i] / censored:.0%} "
                                    f"({np.log(censored / predicted[i]) / sigma[i]:.2g} sd)")
        elif kind[i] == UPPER:
            row.update(use="upper_bound", consistent=bool(predicted[i] <= steps * (1 + 1e-3)))
        else:
            row.update(use="unused")
        residuals.append(row)
    point_res = np.asarray(point_res)
    dof = n_points - 2
    chi2 = float(out["test_chi2"])
    p_value = None if dof <= 0 else float(out["test_p"])
    with_trials = bool(out["has_trials"])
    source = SOURCES[int(out["source"])]
    if source == "residuals":
        scatter_value = float(np.sqrt(out["residual_scatter2"]))
    elif source == "trials":
        scatter_value = max(float(scatter.tau), MIN_TRIAL_SCATTER)
    else:
        scatter_value = float(sigma_floor)
    scatter_dof = None if source == "floor" else float(out["scatter_dof"])
    extrapolated = not (smallest <= b_crit <= largest)
    rising = [int(x) for x in b[out["rising"]]]
    warnings = []
    if rising:
        j_min = int(np.argmin(np.where(kind == POINT, y, np.inf)))
        warnings.append(
            f"steps rise again above B = {int(b[j_min])} (the measured minimum): batch sizes {rising} lie above it "
            f"beyond {RISE_Z:g} sd and are left out of the fit, so B_crit describes the hyperbola before the rise")
    if n_points == 2 and float(np.max(np.abs(point_res))) < 1e-3:
        warnings.append("the fit rests on two reached batch sizes and passes through them exactly: its residuals test nothing")
    elif n_points == 2:
        warnings.append(
            "the fit rests on two reached batch sizes (and censoring or one-sided bounds that pull it off them, rms "
            f"log residual {float(np.sqrt(np.mean(point_res**2))):.3g}): it has no residual degrees of freedom"
        )
    if b_crit == np.inf:
        warnings.append("no plateau in the measured batch sizes: B_crit is infinite (pure perfect scaling fits best)")
    elif b_crit == 0.0:
        warnings.append("no perfect scaling in the measured batch sizes: B_crit is 0 (a flat curve fits best)")
    elif extrapolated:
        warnings.append(f"B_crit = {b_crit:.4g} lies outside the measured batch sizes [{smallest:g}, {largest:g}]: extrapolated")
    misfit = None
    if p_value is not None and p_value < MISFIT_P:
        z = (out["log_residual"] / out["test_sd"])[fitted_points]
        censored_z = {int(b[i]): float(out["log_residual"][i] / out["test_sd"][i]) for i in np.flatnonzero(used == LOWER)}
        misfit = describe_misfit(reached_b, z, with_trials, censored_z, sigma_floor)
        against = (f"the trials' own scatter (F test on {dof} and {scatter.dof:.3g} degrees of freedom)" if with_trials
                   else f"a {sigma_floor:.0%} floor (no trials' scatter given)")
        warnings.append(f"poor fit: chi2 = {chi2:.3g} on {dof} degrees of freedom against {against}, p = {p_value:.2g}: "
                        f"{misfit}")
    if inconsistent:
        warnings.append(f"the fit passes below the censoring bound (S > censored_at) at {', '.join(inconsistent)}: a "
                        "censored batch size pulls as a point at its bound would, under the same scatter")
    return ScalingFit(
        s_min=s_min,
        e_min=e_min,
        b_crit=b_crit,
        smallest_batch_size=smallest,
        largest_batch_size=largest,
        n_points=n_points,
        rms_log_residual=float(np.sqrt(np.mean(point_res**2))),
        max_abs_log_residual=float(np.max(np.abs(point_res))),
        b0=b0,
        n_censored=int(np.sum(used == LOWER)),
        chi2=chi2,
        dof=dof,
        p_value=p_value,
        sigma_floor=sigma_floor,
        extrapolated=bool(extrapolated),
        warnings=tuple(warnings),
        residuals=tuple(residuals),
        scatter=scatter_value,
        scatter_source=source,
        scatter_dof=scatter_dof,
        misfit=misfit,
        rising_batch_sizes=tuple(rising),
    )


def fit_steps(
    batch_sizes: np.ndarray,
    steps: np.ndarray,
    label: str = "",
    steps_lower: np.ndarray | None = None,
    b0: float | None = None,
) -> ScalingFit:
    """Fit the hyperbola to arrays of reached ``batch_sizes`` and ``steps`` (both positive).

    ``steps_lower`` (optional, aligned) gives each point's bracket; without it the steps are exact.
    """
    b = np.asarray(batch_sizes, dtype=float)
    s = np.asarray(steps, dtype=float)
    name = f" {label!r}" if label else ""
    if b.size < 2:
        raise BatchlabError(f"curve{name}: need at least 2 batch sizes that reached the goal to fit S(B), got {b.size}")
    if np.any(b <= 0) or np.any(s <= 0):
        raise BatchlabError(f"curve{name}: batch sizes and steps must be positive to fit S(B)")
    from batchlab.analysis.curve import curve_from_arrays

    return fit_steps_curve(curve_from_arrays(b, s, label=label, steps_lower=steps_lower), b0=b0)


# --------------------------------------------------------------------------------------------------
# Named critical batch sizes: the registry is batchlab.analysis.definitions (REGISTRY, re-exported)


def overhead_batch_size(fit: ScalingFit, overhead: float = 0.2, b0: float | None = None) -> float:
    """Batch size where steps exceed perfect scaling from ``b0`` by ``overhead`` (0.2 = 20%).

    From the hyperbola, the overhead ratio is ``(B + B_crit) / (B0 + B_crit)``, so the answer is
    ``overhead * B_crit + (1 + overhead) * B0``. ``b0`` defaults to the fit's ``b0``.
    """
    if overhead <= 0:
        raise BatchlabError(f"overhead must be > 0, got {overhead}")
    b0 = (fit.b0 or fit.smallest_batch_size) if b0 is None else float(b0)
    return overhead * fit.b_crit + (1.0 + overhead) * b0


def regime(fit: ScalingFit, batch_size: float, tolerance: float = 0.1) -> str:
    """The fit-derived regime of ``batch_size``: below ``tol B_crit`` perfect scaling, above ``B_crit / tol``
    maximal parallelism (a model quantity; :func:`read_regimes` reads the regimes from the data)."""
    check_tolerance(tolerance)
    if batch_size <= tolerance * fit.b_crit:
        return PERFECT_SCALING
    if fit.b_crit == 0.0 or batch_size >= fit.b_crit / tolerance:
        return MAXIMAL_DATA_PARALLELISM
    return DIMINISHING_RETURNS


def summarize_curve(curve: StepsCurve, tolerance: float = 0.1, b0: float | None = None,
                    scatter: ScatterEstimate | None = None) -> dict:
    """Fit ``curve`` (with the trials' ``scatter`` when given, see :func:`fit_steps_curve`) and read its
    regimes; a JSON-ready summary.

    Keys: ``label``; ``fit`` (:meth:`ScalingFit.to_dict`); ``tolerance``; ``b0``; ``batch_size_range``
    (smallest and largest reached batch size); ``points_used`` (reached batch sizes fitted);
    ``censored_batch_sizes``; ``extrapolated``; ``warnings``; ``s_min`` (``fit`` and ``measured``);
    ``critical_batch_sizes`` (``{name: {value, definition, source, ...}}`` in registry order; the
    data-read ones add ``reason``, ``n_points``, ``interpolated`` and any bound); ``regimes`` (one
    row per batch size: ``batch_size``, ``steps``, ``steps_lower``, ``censored_at``, ``regime`` read
    from the data (``None`` if unreached or undetermined), ``fit_regime``); ``data_regimes``
    (:func:`read_regimes`).
    """
    check_tolerance(tolerance)
    fit = fit_steps_curve(curve, b0=b0, scatter=scatter)
    # one B0 for every printed quantity: the fit's (the given b0, else its smallest reached point; a
    # batch size whose bracket starts at 0 is only an upper bound and is not a point)
    regimes = read_regimes(curve, tolerance, b0=fit.b0)
    named = {}
    for d in REGISTRY:
        entry = {"value": _finite_or_none(d.value(fit, tolerance, fit.b0, regimes)), "definition": d.definition,
                 "source": d.source}
        if d.source == "data":
            detail = regimes[d.name]
            entry.update({k: v for k, v in detail.items() if k != "value"})
        named[d.name] = entry
    brackets = curve.brackets()
    censoring = curve.censoring()
    rows = []
    for i, (b, s) in enumerate(zip(curve.batch_sizes, curve.steps)):
        rows.append(
            {
                "batch_size": int(b),
                "steps": s,
                "steps_lower": None if brackets[i] is None else brackets[i][0],
                "censored_at": censoring[i],
                "regime": regimes["points"][i]["regime"],
                "fit_regime": None if s is None else regime(fit, b, tolerance),
            }
        )
    warnings = list(fit.warnings)
    for key in (d.name for d in REGISTRY if d.source == "data"):
        if regimes[key]["value"] is None:
            warnings.append(f"{key}: {regimes[key]['reason']}")
    return {
        "label": curve.label,
        "fit": fit.to_dict(),
        "tolerance": tolerance,
        "b0": fit.b0,
        "batch_size_range": [fit.smallest_batch_size, fit.largest_batch_size],
        "points_used": fit.n_points,
        "measured_batch_sizes": regimes["measured_batch_sizes"],
        "censored_batch_sizes": [r["batch_size"] for r in fit.residuals if r["use"] == "censored"],
        "exact_first_passage": curve.exact,
        "extrapolated": fit.extrapolated,
        "warnings": warnings,
        "s_min": {"fit": fit.s_min, "measured": regimes["s_min_measured"]},
        "critical_batch_sizes": named,
        "regimes": rows,
        "data_regimes": regimes,
    }


def _finite_or_none(value):
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


# --------------------------------------------------------------------------------------------------
# Profile-likelihood interval for B_crit


def profile_intervals(batch_sizes, y: np.ndarray, resolution: np.ndarray, kind: np.ndarray, level: float = 0.9,
                      sigma_floor: float = SIGMA_FLOOR, trial_sd=None, trial_dof=None, exclude_rising: bool = True):
    """Profile-likelihood intervals for ``B_crit`` (and ``S_min``, ``E_min`` over it) of many curves.

    The objective and weights are :func:`fit_with_scatter`'s (the same fit as the point estimate;
    ``trial_sd``/``trial_dof`` and ``exclude_rising`` as there). The interval is the
    set of ``B_crit`` whose profiled objective exceeds the minimum by at most

    * ``(objective / dof) * F(level; 1, dof)``, ``dof = n_points - 2``, when the scatter comes from the
      residuals (estimated from ``dof`` residuals);
    * ``F(level; 1, trial dof)`` when it comes from the trials (the weights are ``1 / sigma_j**2``
      with ``sigma_j`` estimated from the studies' spacings, with their degrees of freedom);
    * ``chi2(level; 1)`` when it is the floor (taken as known).

    Bounds are refined by bisection; ``0`` and ``inf`` are possible bounds (the limits ``B_crit = 0``
    and ``inf`` are checked).

    Returns:
        dict of (R,) arrays: ``b_crit_low``, ``b_crit_high``, ``s_min_low``, ``s_min_high``,
        ``e_min_low``, ``e_min_high`` (NaN where no interval: fewer than two points, or no residual
        degrees of freedom and no trials' scatter), ``b_crit``, ``s_min``, ``e_min`` (the estimate),
        ``scatter`` (the residual scatter, 0 where the trials' or the floor sufficed),
        ``scatter_source`` (``FLOOR``, ``TRIALS``, ``RESIDUALS``) and ``n_rising``.
    """
    from scipy.stats import chi2 as chi2_dist
    from scipy.stats import f as f_dist

    b = np.asarray(batch_sizes, dtype=float)
    fit = fit_with_scatter(b, y, resolution, kind, trial_sd, trial_dof, sigma_floor, exclude_rising)
    y = np.atleast_2d(np.asarray(y, dtype=float))
    rows = y.shape[0]
    w, kind = fit["weight"], fit["kind"]
    s_min, e_min, b_crit, best = fit["s_min"], fit["e_min"], fit["b_crit"], fit["objective"]
    dof = np.sum(kind == POINT, axis=1) - 2
    source = fit["source"]
    ok = np.isfinite(best) & ((dof > 0) | (source == TRIALS))
    dof_safe = np.maximum(dof, 1)
    t_dof = np.where(np.isfinite(fit["scatter_dof"]), fit["scatter_dof"], 1.0)
    quantile = np.where(source == RESIDUALS, (best / dof_safe) * f_dist.ppf(level, 1, dof_safe),
                        np.where(source == TRIALS, f_dist.ppf(level, 1, t_dof), chi2_dist.ppf(level, 1)))
    threshold = np.where(ok, best + quantile, np.nan)
    lo_u = np.log(b.min()) - GRID_DECADES * np.log(10)
    hi_u = np.log(b.max()) + GRID_DECADES * np.log(10)
    grid = np.linspace(lo_u, hi_u, GRID_POINTS)
    c_grid, obj = _profile(np.broadcast_to(grid, (rows, grid.size)), b, y, w, kind)
    inside = obj <= threshold[:, None] * (1 + 1e-12)
    # the fitted value is inside by construction
    u_hat = np.log(np.where((b_crit > 0) & np.isfinite(b_crit), b_crit, 1.0))
    c0, obj0 = _best_offset(y, w, kind)
    cinf, objinf = _best_offset(y + np.log(b), w, kind)
    zero_in = obj0 <= threshold * (1 + 1e-12)
    inf_in = objinf <= threshold * (1 + 1e-12)
    any_in = inside.any(axis=1)
    first = np.argmax(inside, axis=1)
    last = grid.size - 1 - np.argmax(inside[:, ::-1], axis=1)

    def crossing(a_u, b_u):
        """Bisection for the threshold crossing between an inside point a_u and an outside point b_u."""
        for _ in range(40):
            mid = 0.5 * (a_u + b_u)
            f_mid = _profile(mid[:, None], b, y, w, kind)[1][:, 0]
            in_mid = f_mid <= threshold
            a_u, b_u = np.where(in_mid, mid, a_u), np.where(in_mid, b_u, mid)
        return a_u

    interior = np.isfinite(b_crit) & (b_crit > 0)
    anchor_low = np.where(any_in & interior, np.minimum(grid[first], u_hat), np.where(any_in, grid[first], u_hat))
    anchor_high = np.where(any_in & interior, np.maximum(grid[last], u_hat), np.where(any_in, grid[last], u_hat))
    below = grid[np.maximum(np.searchsorted(grid, anchor_low) - 1, 0)]
    above = grid[np.minimum(np.searchsorted(grid, anchor_high, side="right"), grid.size - 1)]
    low_u = crossing(anchor_low, np.minimum(below, anchor_low))
    high_u = crossing(anchor_high, np.maximum(above, anchor_high))
    b_low = np.where(zero_in, 0.0, np.exp(low_u))
    b_high = np.where(inf_in, np.inf, np.exp(high_u))
    flat_fit = b_crit == 0.0
    steep_fit = np.isinf(b_crit)
    b_low = np.where(flat_fit, 0.0, b_low)
    b_high = np.where(steep_fit, np.inf, b_high)
    b_low = np.where(steep_fit & ~any_in, np.exp(hi_u), b_low)
    b_high = np.where(flat_fit & ~any_in, np.exp(lo_u), b_high)
    # S_min and E_min over the accepted B_crit set (grid points plus the refined ends and the limits)
    s_grid = np.where(inside, np.exp(c_grid), np.nan)
    e_grid = np.where(inside, np.exp(c_grid + grid), np.nan)
    c_lo = _profile(low_u[:, None], b, y, w, kind)[0][:, 0]
    c_hi = _profile(high_u[:, None], b, y, w, kind)[0][:, 0]
    s_all = np.concatenate([s_grid, np.exp(c_lo)[:, None], np.exp(c_hi)[:, None], s_min[:, None],
                            np.where(zero_in, np.exp(c0), np.nan)[:, None], np.where(inf_in, 0.0, np.nan)[:, None]], axis=1)
    e_all = np.concatenate([e_grid, np.exp(c_lo + low_u)[:, None], np.exp(c_hi + high_u)[:, None], e_min[:, None],
                            np.where(zero_in, 0.0, np.nan)[:, None], np.where(inf_in, np.exp(cinf), np.nan)[:, None]], axis=1)
    with np.errstate(invalid="ignore"):
        out = {
            "b_crit_low": b_low,
            "b_crit_high": b_high,
            "s_min_low": np.nanmin(s_all, axis=1),
            "s_min_high": np.nanmax(s_all, axis=1),
            "e_min_low": np.nanmin(e_all, axis=1),
            "e_min_high": np.nanmax(e_all, axis=1),
            "b_crit": b_crit,
            "s_min": s_min,
            "e_min": e_min,
            "scatter": np.sqrt(fit["residual_scatter2"]),
            "scatter_source": source,
            "n_rising": fit["rising"].sum(axis=1),
        }
    for key in ("b_crit_low", "b_crit_high", "s_min_low", "s_min_high", "e_min_low", "e_min_high"):
        out[key] = np.where(ok, out[key], np.nan)
    return out
