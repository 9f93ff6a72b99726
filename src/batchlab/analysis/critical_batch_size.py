"""Fit S(B) = S_min (1 + B_crit / B) to a steps-to-result curve and name its critical batch sizes.

The hyperbola of McCandlish et al. (2018), ``S(B) = S_min + E_min / B`` with ``B_crit = E_min / S_min``,
is fitted by least squares on ``log S`` (steps span orders of magnitude, so relative error is the
natural scale). Only batch sizes whose goal was reached enter the fit (unreached ones are censored).

Named critical batch sizes (science.md section 5); every one is reported under its name:

* ``mccandlish_b_crit``: ``E_min / S_min``; at this batch size training takes twice the minimum number
  of steps and twice the minimum number of examples.
* ``overhead_20pct``: Zhang et al. (2024): the batch size where steps exceed perfect linear scaling from
  the smallest measured batch size ``B0`` by 20%; from the fit, ``0.2 B_crit + 1.2 B0``.
* ``perfect_scaling_end``: where examples-to-result exceed ``E_min`` by the tolerance (default 10%),
  ``tol * B_crit``; below it the curve is in Shallue's perfect-scaling regime.
* ``maximal_parallelism_start``: where steps come within the tolerance of ``S_min``, ``B_crit / tol``;
  above it the curve is in Shallue's maximal-data-parallelism regime. Between the two: diminishing
  returns.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy.optimize import least_squares

from batchlab.analysis.curve import StepsCurve
from batchlab.errors import BatchlabError

PERFECT_SCALING = "perfect_scaling"
DIMINISHING_RETURNS = "diminishing_returns"
MAXIMAL_DATA_PARALLELISM = "maximal_data_parallelism"

DEFINITIONS = {
    "mccandlish_b_crit": "E_min / S_min of the fit S(B) = S_min + E_min / B (McCandlish et al. 2018)",
    "overhead_20pct": "batch size where steps exceed perfect scaling from the smallest batch size by 20% "
    "(Zhang et al. 2024), from the fit: 0.2 B_crit + 1.2 B0",
    "perfect_scaling_end": "tol * B_crit: examples to result within tol of E_min below it (Shallue regime 1)",
    "maximal_parallelism_start": "B_crit / tol: steps to result within tol of S_min above it (Shallue regime 3)",
}


@dataclass(frozen=True)
class ScalingFit:
    """A fitted ``S(B) = S_min + E_min / B``.

    Attributes:
        s_min: minimum steps (the large-batch asymptote), in updates.
        e_min: minimum examples (the small-batch asymptote of ``B * S``), in examples.
        b_crit: ``e_min / s_min`` (inf when no plateau is visible, 0 when no scaling is visible).
        smallest_batch_size: ``B0``, the smallest reached batch size used in the fit.
        largest_batch_size: the largest reached batch size used in the fit.
        n_points: number of reached batch sizes fitted.
        rms_log_residual: root-mean-square of ``log S_measured - log S_fit``.
        max_abs_log_residual: largest absolute log residual (large values: the curve is not a
            hyperbola, e.g. it rises again at huge batch sizes or is budget-truncated).
    """

    s_min: float
    e_min: float
    b_crit: float
    smallest_batch_size: float
    largest_batch_size: float
    n_points: int
    rms_log_residual: float
    max_abs_log_residual: float

    def predicted_steps(self, batch_size: np.ndarray | float) -> np.ndarray:
        """Fitted steps ``S_min + E_min / B`` at the given batch sizes."""
        return self.s_min + self.e_min / np.asarray(batch_size, dtype=float)

    def to_dict(self) -> dict:
        """JSON-serialisable fields (inf becomes None)."""
        return {k: _finite_or_none(v) for k, v in asdict(self).items()}


def fit_steps_curve(curve: StepsCurve) -> ScalingFit:
    """Fit ``S(B) = S_min + E_min / B`` to the reached points of ``curve`` (least squares on log S).

    Raises:
        BatchlabError: fewer than two batch sizes reached the goal.
    """
    b, s = curve.reached_arrays()
    return fit_steps(b, s, label=curve.label)


def fit_steps(batch_sizes: np.ndarray, steps: np.ndarray, label: str = "") -> ScalingFit:
    """Fit the hyperbola to arrays of reached ``batch_sizes`` and ``steps`` (both positive)."""
    b = np.asarray(batch_sizes, dtype=float)
    s = np.asarray(steps, dtype=float)
    name = f" {label!r}" if label else ""
    if b.size < 2:
        raise BatchlabError(f"curve{name}: need at least 2 batch sizes that reached the goal to fit S(B), got {b.size}")
    if np.any(b <= 0) or np.any(s <= 0):
        raise BatchlabError(f"curve{name}: batch sizes and steps must be positive to fit S(B)")
    # Start from the weighted linear fit of S against 1/B (weights 1/S give relative errors).
    design = np.stack([np.ones_like(b), 1.0 / b], axis=1) / s[:, None]
    start, *_ = np.linalg.lstsq(design, np.ones_like(s), rcond=None)
    start = np.clip(start, [1e-9 * s.min(), 1e-9 * (s * b).min()], None)
    # Fit in log-parameters so both stay positive; a parameter that wants to vanish runs off to a
    # very negative log, which we read as zero below.
    lo = np.log([1e-12 * s.min(), 1e-12 * (s * b).min()])
    hi = np.log([1e3 * s.max(), 1e3 * (s * b).max()])

    def residuals(log_params: np.ndarray) -> np.ndarray:
        s_min, e_min = np.exp(log_params)
        return np.log(s_min + e_min / b) - np.log(s)

    result = least_squares(residuals, np.clip(np.log(start), lo, hi), bounds=(lo, hi), method="trf", x_scale=1.0)
    s_min, e_min = np.exp(result.x)
    # A parameter pinned at its lower bound contributes nothing measurable: report it as zero.
    if result.x[0] <= lo[0] + 1e-6 or s_min < 1e-9 * s.min():
        s_min = 0.0
    if result.x[1] <= lo[1] + 1e-6 or e_min / b.max() < 1e-9 * s.min():
        e_min = 0.0
    res = result.fun
    b_crit = np.inf if s_min == 0.0 else e_min / s_min
    return ScalingFit(
        s_min=float(s_min),
        e_min=float(e_min),
        b_crit=float(b_crit),
        smallest_batch_size=float(b.min()),
        largest_batch_size=float(b.max()),
        n_points=int(b.size),
        rms_log_residual=float(np.sqrt(np.mean(res**2))),
        max_abs_log_residual=float(np.max(np.abs(res))),
    )


def overhead_batch_size(fit: ScalingFit, overhead: float = 0.2, b0: float | None = None) -> float:
    """Batch size where steps exceed perfect scaling from ``b0`` by ``overhead`` (0.2 = 20%).

    From the hyperbola, the overhead ratio is ``(B + B_crit) / (B0 + B_crit)``, so the answer is
    ``overhead * B_crit + (1 + overhead) * B0``. ``b0`` defaults to the smallest fitted batch size.
    """
    if overhead <= 0:
        raise BatchlabError(f"overhead must be > 0, got {overhead}")
    b0 = fit.smallest_batch_size if b0 is None else float(b0)
    return overhead * fit.b_crit + (1.0 + overhead) * b0


def critical_batch_sizes(fit: ScalingFit, tolerance: float = 0.1) -> dict[str, float]:
    """Every named critical batch size of ``fit`` (see the module docstring), keyed by name."""
    _check_tolerance(tolerance)
    return {
        "mccandlish_b_crit": fit.b_crit,
        "overhead_20pct": overhead_batch_size(fit, 0.2),
        "perfect_scaling_end": tolerance * fit.b_crit,
        "maximal_parallelism_start": fit.b_crit / tolerance if fit.b_crit > 0 else 0.0,
    }


def regime(fit: ScalingFit, batch_size: float, tolerance: float = 0.1) -> str:
    """Shallue's regime of ``batch_size`` under ``fit``: perfect scaling, diminishing returns or maximal parallelism."""
    _check_tolerance(tolerance)
    if batch_size <= tolerance * fit.b_crit:
        return PERFECT_SCALING
    if fit.b_crit == 0.0 or batch_size >= fit.b_crit / tolerance:
        return MAXIMAL_DATA_PARALLELISM
    return DIMINISHING_RETURNS


def summarize_curve(curve: StepsCurve, tolerance: float = 0.1) -> dict:
    """Fit ``curve`` and return a JSON-serialisable summary: the fit, named batch sizes, regimes."""
    fit = fit_steps_curve(curve)
    named = critical_batch_sizes(fit, tolerance)
    return {
        "label": curve.label,
        "fit": fit.to_dict(),
        "tolerance": tolerance,
        "critical_batch_sizes": {
            name: {"value": _finite_or_none(value), "definition": DEFINITIONS[name]} for name, value in named.items()
        },
        "regimes": [
            {"batch_size": b, "steps": s, "regime": regime(fit, b, tolerance)}
            for b, s in zip(curve.batch_sizes, curve.steps)
        ],
    }


def _check_tolerance(tolerance: float) -> None:
    if not 0 < tolerance < 1:
        raise BatchlabError(f"tolerance must be in (0, 1), got {tolerance}")


def _finite_or_none(value):
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value
