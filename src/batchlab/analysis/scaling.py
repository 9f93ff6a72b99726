"""Scaling across groups: B_crit and S_min against model or data size as power laws.

A steps table (:mod:`batchlab.analysis.steps_table`) holds one S(B) curve per group (``group_by``) and
a size column ``x`` (model parameters, training tokens, ...: a number > 0, the same on every row of a
group). Each group's curve is fitted as ``analyze critical-batch-size --steps-table`` fits it
(:func:`~batchlab.analysis.steps_table.fit_steps_frame`: the censored, bracket-weighted fit and its
profile-likelihood intervals), then each quantity ``q`` of :data:`QUANTITIES` (B_crit and S_min) is
fitted across the groups as a power law ``q = c * x**b``, i.e. ``log q = log c + b log x``, as Zhang et
al. 2024 and Bergsma et al. 2025 fit B_crit against model and data size:

* **Weights from each curve's own uncertainty.** A group whose interval ``[low, high]`` (level L) is
  bounded on both sides enters as the normal in log space that matches that interval: centre
  ``(log low + log high) / 2`` and standard error ``se = (log high - log low) / (2 z)``, ``z`` the
  normal ``(1 + L) / 2`` quantile (90%: 1.645), weight ``1 / se**2``: weighted least squares in log
  space. (The centre, not ``log q_hat``: a profile interval is asymmetric where the curve barely
  resolves B_crit, and centring there on the point estimate under-covered, 0.76 against 0.83 at
  nominal 0.90 with 8 groups whose largest B_crit lie beyond their batch sizes.)
* **The exponent's interval.** ``b +- t * sqrt(scale * V_bb)``, ``V = (X' W X)^-1``, ``t`` the
  ``(1 + L) / 2`` quantile of Student's t with ``n_groups - 2`` degrees of freedom and
  ``scale = chi2 / dof`` (``chi2 = sum(w r**2)``): the groups' intervals fix the *relative* weights and
  their scatter about the power law fixes the scale, which makes the coverage exact when the groups'
  errors are normal in log space with standard errors proportional to ``se`` (the factor 1 included).
  It widens the interval when the groups scatter beyond their own intervals (warned when
  ``chi2`` exceeds its 95% point) and narrows it when they scatter less. (``max(1, scale)`` with the t
  quantile over-covers: 1.00 against nominal 0.90 in docs/methods.md's first coverage setting.) With two groups (no
  residual degrees of freedom) the normal quantile and the weights alone are used, with a warning.
* **A check.** A parametric bootstrap over the groups' intervals: each replicate draws every group's
  ``log q`` from the two-piece normal with median ``log q_hat`` whose 5% and 95% points (at L = 0.9)
  are its interval's ends (the interval's asymmetry kept) and refits with the same weights; the percentile interval of the
  exponent is reported beside the weighted fit's (``bootstrap``: what the groups' own intervals alone
  imply), and a warning says when it is more than 25% wider.
* **Bounds.** A group whose interval is unbounded on one side (e.g. B_crit with no plateau: only
  ``B_crit > low``), or that has no interval or no fit, does not enter the fit; it is listed in
  ``bounds`` (with whether the fitted power law's interval at its ``x`` agrees with the bound) or
  ``excluded`` (with the reason), and said in ``warnings``.
* **Extrapolation is labelled.** Values of the power law at the groups' sizes and at any requested
  sizes (``at``) come with their interval (the power law's value there, the line's confidence interval
  under the same scale and quantile) and ``extrapolated: true`` outside the measured x range of the
  groups the fit used; the prefactor ``c`` is the value at ``x = 1``.

Target: the exponent and prefactor of the power law through the groups' targets (each group's target:
the parameter of the hyperbola its measured minima scatter about, docs/methods.md, "Intervals").
Definitions: docs/methods.md, "Scaling across groups".
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from batchlab.analysis.bootstrap import check_level, check_resampling
from batchlab.analysis.steps_table import (
    fit_steps_frame,
    read_steps_table,
    row_numbers,
    table_groups,
)
from batchlab.errors import BatchlabError

#: The quantities fitted across groups: the steps-table key and its short name.
QUANTITIES = {"mccandlish_b_crit": "B_crit", "s_min": "S_min"}
#: A bootstrap interval this much wider than the weighted fit's is warned about.
BOOTSTRAP_WIDER = 1.25
TARGET = ("exponent b and prefactor c of the power law q = c * x^b through the groups' q (each the parameter of "
          "the hyperbola that group's measured minima scatter about)")
METHOD = ("weighted least squares of log q on log x, each group entering at its interval's log centre with "
          "weight 1/se^2, se = (log high - log low) / (2 z); the covariance scaled by the residual variance "
          "chi2/dof and Student's t quantile with n_groups - 2 dof")


def fit_scaling_table(path: str | Path, group_by: str, x: str, level: float = 0.9, n_boot: int = 2000,
                      seed: int = 0, at: list[float] | None = None) -> dict:
    """Fit each group's S(B) curve of the steps table at ``path``, then B_crit and S_min against ``x``.

    Args:
        path: a steps table (CSV or Parquet, :func:`~batchlab.analysis.steps_table.read_steps_table`).
        group_by: the column whose values name the groups (one S(B) curve each; at least two).
        x: the size column (numbers > 0, constant within each group; may be ``group_by`` itself).
        level: the intervals' nominal coverage, in (0, 1) (the groups' and the power laws').
        n_boot: parametric bootstrap replicates of the check (>= 1); seed: its seed (>= 0).
        at: sizes (> 0) at which to give each power law's value, labelled ``extrapolated`` outside
            the measured range.

    Returns:
        JSON-ready dict: ``steps_table``, ``group_by``, ``x``, ``level``, ``target``, ``method``;
        ``groups`` (per group: ``group``, ``x``, ``error``, ``points_used``, ``batch_size_range``,
        ``extrapolated`` (its B_crit outside its batch sizes), ``warnings`` and per quantity
        ``{"value", "low", "high"}``); ``fits`` (per quantity,
        :func:`power_law_fit`'s dict, or ``{"error": ...}`` when fewer than two groups have a
        bounded interval).

    Raises:
        BatchlabError: a bad table or column, a non-numeric, empty, non-positive or non-finite size,
            a size that differs within a group, fewer than two groups, every group at one size, bad
            ``level``, ``n_boot``, ``seed`` or ``at``.
    """
    check_options(level, n_boot, seed, at)
    frame = read_steps_table(path)
    sizes = group_sizes(frame, group_by, x, path)
    if len(set(sizes.values())) == 1:
        raise BatchlabError(f"the groups ({', '.join(f'{group_by}={k}' for k in sizes)}) all have {x} "
                            f"{next(iter(sizes.values())):.6g}: a power law needs at least two distinct sizes")
    groups = fit_steps_frame(frame, group_by, level=level, label=Path(path).stem)
    rows = []
    for g in groups:
        row = {"group": g["group"], "x": sizes[g["group"]], "error": g["error"], "points_used": g.get("points_used"),
               "batch_size_range": g.get("batch_size_range"), "extrapolated": g.get("extrapolated"),
               "warnings": g.get("warnings") or []}
        for key in QUANTITIES:
            interval = (g.get("intervals") or {}).get(key) or {}
            row[key] = {"value": g.get(key), "low": interval.get("low"), "high": interval.get("high")}
        rows.append(row)
    fits = {}
    for key, name in QUANTITIES.items():
        try:
            fits[key] = power_law_fit(rows, key, name, level=level, n_boot=n_boot, seed=seed, at=at)
        except BatchlabError as exc:  # the options are checked: too few groups with a bounded interval
            fits[key] = {"quantity": name, "error": str(exc)}
    b_crit = fits["mccandlish_b_crit"]
    beyond = [r["group"] for r in rows if r["extrapolated"] and r["group"] in (b_crit.get("groups_used") or [])]
    if beyond:
        b_crit["warnings"].append(f"B_crit: the B_crit of group(s) {', '.join(map(str, beyond))} lies outside their "
                                  "measured batch sizes (extrapolated by their own fits); the power law leans on them")
    return {"steps_table": str(path), "group_by": group_by, "x": x, "level": level, "target": TARGET,
            "method": METHOD, "groups": rows, "fits": fits}


def group_sizes(frame, group_by: str, x: str, path: str | Path = "") -> dict:
    """``{group value: size}`` of a steps table, checked (see :func:`fit_scaling_table`'s Raises)."""
    import pandas as pd

    columns = frame.attrs.get("columns", list(frame.columns))
    where = f"steps table {str(path)!r}: " if path else ""
    for flag, column in (("--group-by", group_by), ("--x", x)):
        if column not in columns:
            raise BatchlabError(f"{where}unknown {flag} column {column!r}; allowed: {columns}")
    raw = frame[x]
    values = pd.to_numeric(raw, errors="coerce").astype(float).to_numpy()
    text = raw.astype(str).str.strip()
    bad = np.isnan(values) & raw.notna().to_numpy() & (text != "").to_numpy()
    if bad.any():
        raise BatchlabError(f"{where}size column {x!r} must be numeric (a model or data size), got "
                            f"{text[bad].tolist()[:5]} in row(s) {row_numbers(bad)}")
    bad = ~np.isfinite(values)
    if bad.any():
        raise BatchlabError(f"{where}size column {x!r} has empty or infinite values in row(s) {row_numbers(bad)}; every "
                            "row needs a finite size")
    bad = values <= 0
    if bad.any():
        raise BatchlabError(f"{where}size column {x!r} must be > 0 (power laws are fitted in log x), got "
                            f"{values[bad].tolist()[:5]} in row(s) {row_numbers(bad)}")
    sizes, varying = {}, []
    for key, rows in table_groups(frame, group_by):
        mine = np.unique(values[frame.index.get_indexer(rows.index)])
        if mine.size > 1:
            varying.append(f"{group_by}={key} ({', '.join(f'{v:g}' for v in mine[:4])})")
        sizes[key] = float(mine[0])
    if varying:
        raise BatchlabError(f"{where}size column {x!r} is not constant within group(s) {'; '.join(varying[:3])}: each "
                            f"group is one size; group by a column that separates them")
    if len(sizes) < 2:
        found = ", ".join(f"{group_by}={k}" for k in sizes)
        raise BatchlabError(f"{where}need at least 2 groups to fit a power law across groups, got {len(sizes)} ({found}); "
                            f"give rows of two or more {group_by!r} values")
    return sizes


def check_options(level: float, n_boot: int, seed: int, at) -> None:
    """BatchlabError (one line) unless ``level`` is in (0, 1), ``n_boot`` an integer >= 1, ``seed`` an
    integer >= 0 and ``at`` ``None`` or finite sizes > 0."""
    check_level(level)  # the level first, as before, then the resampling settings
    check_resampling(n_boot, level, seed)
    if at is None:
        return
    bad = [v for v in at if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0)]
    if bad or not len(at):
        raise BatchlabError(f"sizes to predict at must be finite numbers > 0, got {bad or list(at)}")


def power_law_fit(groups: list[dict], key: str, name: str = "", level: float = 0.9, n_boot: int = 2000, seed: int = 0,
                  at: list[float] | None = None) -> dict:
    """Fit ``q = c * x**b`` across ``groups`` (each ``{"group", "x", "error", key: {"value", "low", "high"}}``).

    The method is the module docstring's. Returns a JSON-ready dict: ``quantity``; ``exponent`` and
    ``prefactor`` (``{"value", "low", "high"}``); ``n_groups`` (groups that entered the fit),
    ``groups_used``, ``bounds`` (``group``, ``x``, ``kind`` ``"lower"``/``"upper"``, ``bound``,
    ``fitted`` ``{"value", "low", "high"}`` and ``consistent``), ``excluded`` (``group``, ``reason``),
    ``x_range`` (of the groups used), ``chi2``, ``dof``, ``p_value`` (``None`` without residual
    degrees of freedom), ``residual_scale`` (``chi2 / dof``), ``quantile``, ``bootstrap``
    (``n_boot``, ``seed``, ``exponent_low``, ``exponent_high``), ``fitted`` (per group used: ``group``,
    ``x``, ``value``, ``low``, ``high``), ``predictions`` (per ``at`` size: ``x``, ``value``, ``low``,
    ``high``, ``extrapolated``), ``warnings``, ``error`` (``None``).

    Raises:
        BatchlabError: fewer than two groups with an interval bounded on both sides, or all of them at one
            size; bad ``level``,
            ``n_boot``, ``seed`` or ``at``.
    """
    from scipy.stats import chi2 as chi2_dist
    from scipy.stats import norm
    from scipy.stats import t as t_dist

    check_options(level, n_boot, seed, at)
    name = name or key

    def finite(v) -> bool:
        return v is not None and math.isfinite(v) and v > 0

    used, bounds, excluded = [], [], []
    for g in groups:
        entry = g.get(key) or {}
        value, low, high = entry.get("value"), entry.get("low"), entry.get("high")
        if g.get("error"):
            excluded.append({"group": g["group"], "reason": f"no fit: {g['error']}"})
        elif finite(low) and finite(high) and finite(value):
            used.append((g["group"], float(g["x"]), float(value), float(low), float(high)))
        elif finite(low) and high is None:  # e.g. B_crit with no plateau (its estimate infinite)
            bounds.append({"group": g["group"], "x": float(g["x"]), "kind": "lower", "bound": float(low)})
        elif finite(high) and not finite(low):  # e.g. B_crit with no perfect scaling (its estimate 0)
            bounds.append({"group": g["group"], "x": float(g["x"]), "kind": "upper", "bound": float(high)})
        else:
            excluded.append({"group": g["group"], "reason": f"{name} has no interval (unbounded on both sides or "
                                                            "no residual degrees of freedom)"})
    if len(used) < 2:
        stated = [f"{b['group']}: {name} {'>' if b['kind'] == 'lower' else '<'} {b['bound']:.4g}" for b in bounds]
        stated += [f"{e['group']}: {e['reason']}" for e in excluded]
        raise BatchlabError(f"need at least 2 groups with a {name} interval bounded on both sides to fit a power law, "
                            f"got {len(used)}" + (f" ({'; '.join(stated)})" if stated else ""))
    keys = [u[0] for u in used]
    x = np.array([u[1] for u in used])
    if np.unique(x).size < 2:
        raise BatchlabError(f"{name}: the groups used ({', '.join(str(k) for k in keys)}) all have size {x[0]:.6g}: a "
                            "power law needs at least two distinct sizes")
    estimate = np.log([u[2] for u in used])
    log_low, log_high = np.log([u[3] for u in used]), np.log([u[4] for u in used])
    z = norm.ppf(0.5 + level / 2)
    y = 0.5 * (log_low + log_high)  # each group as the log-normal that matches its interval
    se = (log_high - log_low) / (2 * z)
    if np.any(se <= 0):
        zero = [k for k, s in zip(keys, se) if s <= 0]
        raise BatchlabError(f"{name}: groups {zero} have an interval of zero width; cannot weigh them")
    weights = 1.0 / se**2
    design = np.column_stack([np.ones_like(x), np.log(x)])
    precision = design.T @ (weights[:, None] * design)
    covariance = np.linalg.inv(precision)
    solve = covariance @ (design.T * weights)  # (2, n): coefficients = solve @ y
    coef = solve @ y
    residual = y - design @ coef
    chi2 = float(np.sum(weights * residual**2))
    dof = len(used) - 2
    warnings = []
    if dof > 0:
        residual_scale = scale = chi2 / dof
        quantile = float(t_dist.ppf(0.5 + level / 2, dof))
        p_value = float(chi2_dist.sf(chi2, dof))
        if p_value < 0.05:
            warnings.append(f"{name}: the groups scatter about the power law beyond their own intervals (residual "
                            f"variance {residual_scale:.3g} times theirs, p = {p_value:.2g}); the intervals are widened "
                            "by it: a trial noise the curves' intervals miss, or a law that is not a power law")
    else:
        residual_scale, scale, quantile, p_value = None, 1.0, float(z), None
        warnings.append(f"{name}: two groups: the power law passes through both, and its intervals rest on their "
                        "intervals alone (normal quantile; no check of the scatter between groups)")
    cov = scale * covariance
    half = quantile * np.sqrt(np.diag(cov))
    # the check: a parametric bootstrap over the groups' (asymmetric) intervals
    rng = np.random.default_rng(seed)
    draws = rng.standard_normal((int(n_boot), len(used)))
    spread = np.where(draws < 0, (estimate - log_low) / z, (log_high - estimate) / z)
    boot = (estimate + draws * spread) @ solve[1]
    boot_low, boot_high = (float(v) for v in np.quantile(boot, [0.5 - level / 2, 0.5 + level / 2]))
    if boot_high - boot_low > BOOTSTRAP_WIDER * 2 * half[1]:
        warnings.append(f"{name}: the parametric bootstrap over the groups' own intervals gives the exponent "
                        f"[{boot_low:.3g}, {boot_high:.3g}], more than {BOOTSTRAP_WIDER - 1:.0%} wider than the weighted "
                        "fit's (the groups scatter about the power law less than their intervals say, or their "
                        "intervals are asymmetric): the wider one is the safer reading")
    x_low, x_high = float(x.min()), float(x.max())

    def value_at(sizes) -> list[dict]:
        rows = []
        for size in sizes:
            point = np.array([1.0, math.log(size)])
            centre = float(point @ coef)
            width = quantile * math.sqrt(float(point @ cov @ point))
            rows.append({"x": float(size), "value": math.exp(centre), "low": math.exp(centre - width),
                         "high": math.exp(centre + width),
                         "extrapolated": not (x_low * (1 - 1e-12) <= size <= x_high * (1 + 1e-12))})
        return rows

    fitted = [dict(group=k, **{f: v for f, v in r.items() if f != "extrapolated"}) for k, r in zip(keys, value_at(x))]
    for bound, at_bound in zip(bounds, value_at([b["x"] for b in bounds])):
        bound["fitted"] = {f: at_bound[f] for f in ("value", "low", "high")}
        bound["extrapolated"] = at_bound["extrapolated"]
        bound["consistent"] = bool(at_bound["high"] >= bound["bound"] if bound["kind"] == "lower"
                                   else at_bound["low"] <= bound["bound"])
        sign = ">" if bound["kind"] == "lower" else "<"
        warnings.append(f"{name}: group {bound['group']} enters as a bound only ({name} {sign} {bound['bound']:.4g}, "
                        f"its interval unbounded on one side); the power law gives {at_bound['value']:.4g} "
                        f"[{at_bound['low']:.4g}, {at_bound['high']:.4g}] there: "
                        + ("consistent" if bound["consistent"] else "INCONSISTENT with the bound"))
    for entry in excluded:
        warnings.append(f"{name}: group {entry['group']} left out: {entry['reason']}")
    prefactor = value_at([1.0])[0]
    if prefactor["extrapolated"]:
        warnings.append(f"{name}: the prefactor c is the power law's value at x = 1, outside the measured "
                        f"x range [{x_low:.4g}, {x_high:.4g}]: extrapolated")
    return {
        "quantity": name,
        "error": None,
        "exponent": {"value": float(coef[1]), "low": float(coef[1] - half[1]), "high": float(coef[1] + half[1])},
        "prefactor": {f: prefactor[f] for f in ("value", "low", "high")} | {"extrapolated": prefactor["extrapolated"]},
        "n_groups": len(used),
        "groups_used": keys,
        "bounds": bounds,
        "excluded": excluded,
        "x_range": [x_low, x_high],
        "chi2": chi2,
        "dof": dof,
        "p_value": p_value,
        "residual_scale": residual_scale,
        "quantile": quantile,
        "level": level,
        "bootstrap": {"n_boot": int(n_boot), "seed": int(seed), "exponent_low": boot_low, "exponent_high": boot_high},
        "fitted": fitted,
        "predictions": value_at(at or []),
        "warnings": warnings,
    }
