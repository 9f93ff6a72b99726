"""The censored hyperbola objective and its vectorised minimisation and profile intervals.

The engine behind :func:`batchlab.analysis.critical_batch_size.fit_steps_curve` (definitions, weights
and tests in docs/methods.md, "The S(B) fit" and "Intervals"): the kinds of observation of a curve
(:func:`observation_arrays`), the objective profiled over ``log S_min`` in closed form
(:func:`_best_offset`), its minimisation over ``log B_crit`` for many curves at once (:func:`fit_many`),
the trials'-scatter weighting with the rise and misfit rules (:func:`fit_with_scatter`,
:func:`describe_misfit`) and the profile-likelihood intervals (:func:`profile_intervals`). Arrays are
``(R, n)``: R curves on the same n batch sizes; values are natural logs of steps.
"""

from __future__ import annotations

import numpy as np

from batchlab.analysis.curve import StepsCurve

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
