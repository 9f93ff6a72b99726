"""The S(B) fit, the named critical batch sizes and Shallue's regimes read from the data.

The objective, its vectorised minimisation and the profile intervals are the engine of
:mod:`batchlab.analysis.hyperbola_fit` (its names are re-exported here); this module makes one
curve's :class:`ScalingFit`, its warnings and its summary.

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
from batchlab.analysis.hyperbola_fit import (  # noqa: F401  (the engine; these names are re-exported)
    ABSENT,
    FLOOR,
    GRID_DECADES,
    LOWER,
    MIN_TRIAL_SCATTER,
    MISFIT_P,
    MISFIT_Z,
    POINT,
    RESIDUAL_GATE,
    RESIDUALS,
    RISE_Z,
    SIGMA_FLOOR,
    SOURCES,
    TRIALS,
    UPPER,
    describe_misfit,
    fit_many,
    fit_with_scatter,
    observation_arrays,
    profile_intervals,
)




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
