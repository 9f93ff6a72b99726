"""Confidence intervals for the S(B) fit and the named critical batch sizes: a bootstrap over trials.

Procedure (seeded, so the same inputs and seed give the same intervals):

1. For each batch size take the selected trials' first qualifying steps (``inf`` for a trial that
   never reached the goal; see :func:`batchlab.analysis.steps_to_result.trial_first_steps`).
2. For each of ``n_boot`` replicates, resample the trials *within each batch size* with replacement
   (as many as there are), recompute steps to result as the minimum over the resampled trials
   (``inf`` = not reached, censored), and refit ``S(B) = S_min + E_min / B``
   (:func:`batchlab.analysis.critical_batch_size.fit_steps`).
3. A replicate whose fit fails (fewer than two reached batch sizes) is counted in ``n_failed`` and
   left out. Intervals are percentile intervals of the successful replicates: the empirical
   ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles (inverted CDF, so an infinite replicate,
   e.g. ``B_crit`` with no visible plateau, stays infinite rather than turning into NaN).

The point estimates come from the full data (every trial once), exactly as ``steps_to_result``.
Replicates are often identical (the best trial is drawn again), so each distinct replicate curve is
fitted once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import duckdb
import numpy as np

from batchlab.analysis.critical_batch_size import (
    DEFINITIONS,
    DIMINISHING_RETURNS,
    MAXIMAL_DATA_PARALLELISM,
    PERFECT_SCALING,
    ScalingFit,
    critical_batch_sizes,
    fit_steps,
    regime,
)
from batchlab.analysis.curve import StepsCurve, curve_from_arrays
from batchlab.analysis.selection import Selection
from batchlab.analysis.steps_to_result import steps_to_result_many, trial_first_steps, trial_steps_by_batch_size
from batchlab.errors import BatchlabError

REGIMES = (PERFECT_SCALING, DIMINISHING_RETURNS, MAXIMAL_DATA_PARALLELISM)
FIT_PARAMETERS = ("s_min", "e_min")


@dataclass(frozen=True)
class CriticalBatchSizeEstimate:
    """The S(B) fit, named critical batch sizes with bootstrap intervals, and each batch size's regime.

    Attributes:
        curve: steps to result from all trials (``None`` steps = not reached).
        fit: the fit to ``curve``.
        estimates: point values of ``s_min``, ``e_min`` and every named critical batch size.
        intervals: ``{name: (low, high)}`` percentile intervals for the same names.
        level: the interval's nominal coverage (e.g. 0.9).
        n_boot: replicates drawn; n_failed: replicates whose fit failed (left out of the intervals).
        seed: the bootstrap seed; tolerance: the regime tolerance (science.md 5).
        regimes: one dict per batch size: ``batch_size``, ``steps``, ``steps_interval`` (percentile
            interval of the replicate steps; ``None`` bounds = not reached), ``regime`` under the point
            fit and ``regime_fractions`` (share of successful replicates putting it in each regime).
    """

    curve: StepsCurve
    fit: ScalingFit
    estimates: dict[str, float]
    intervals: dict[str, tuple[float, float]]
    level: float
    n_boot: int
    n_failed: int
    seed: int
    tolerance: float
    regimes: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready summary (infinite values become ``None``)."""
        named = {}
        for name, value in self.estimates.items():
            low, high = self.intervals[name]
            named[name] = {"value": _finite(value), "low": _finite(low), "high": _finite(high)}
            if name in DEFINITIONS:
                named[name]["definition"] = DEFINITIONS[name]
        return {
            "label": self.curve.label,
            "fit": self.fit.to_dict(),
            "critical_batch_sizes": {k: v for k, v in named.items() if k in DEFINITIONS},
            "fit_intervals": {k: v for k, v in named.items() if k in FIT_PARAMETERS},
            "bootstrap": {"n_boot": self.n_boot, "n_failed": self.n_failed, "level": self.level, "seed": self.seed},
            "tolerance": self.tolerance,
            "regimes": self.regimes,
        }


def bootstrap_critical_batch_size(
    trial_steps: Mapping[int, np.ndarray],
    n_boot: int = 1000,
    level: float = 0.9,
    seed: int = 0,
    tolerance: float = 0.1,
    label: str = "",
    metadata: dict | None = None,
) -> CriticalBatchSizeEstimate:
    """Fit S(B) to all trials and bootstrap intervals by resampling trials within each batch size.

    Args:
        trial_steps: ``{batch_size: array of each selected trial's first qualifying step}``, ``inf``
            for trials that never reached the goal; an empty array is a batch size without trials.
        n_boot: number of bootstrap replicates (>= 1).
        level: nominal coverage of the percentile intervals, in (0, 1).
        seed: seed of the resampling (``numpy.random.default_rng``), an integer >= 0.
        tolerance: regime tolerance passed to the named critical batch sizes and regimes.

    Raises:
        BatchlabError: bad ``n_boot``/``level``/``seed``, or fewer than two batch sizes reached the goal.
    """
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 1:
        raise BatchlabError(f"n_boot must be a positive integer, got {n_boot!r}")
    if not 0 < level < 1:
        raise BatchlabError(f"level must be in (0, 1), got {level}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise BatchlabError(f"seed must be an integer >= 0, got {seed!r}")
    batch_sizes = np.array(sorted(int(b) for b in trial_steps), dtype=float)
    per_batch = [np.asarray(trial_steps[int(b)], dtype=float) for b in batch_sizes]
    point_steps = np.array([s.min() if s.size else np.inf for s in per_batch])
    curve = curve_from_arrays(batch_sizes, point_steps, label=label, metadata=metadata)
    reached = np.isfinite(point_steps)
    point_fit = fit_steps(batch_sizes[reached], point_steps[reached], label=label)  # raises if < 2 reached
    names = [*FIT_PARAMETERS, *critical_batch_sizes(point_fit, tolerance)]
    estimates = _named_values(point_fit, tolerance)

    replicates = _resampled_steps(per_batch, n_boot, np.random.default_rng(seed))  # (n_boot, n_batch)
    unique, inverse = np.unique(replicates, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    unique_fits = [_fit(batch_sizes, row, label) for row in unique]
    fits = [unique_fits[i] for i in inverse]
    good = [f for f in fits if f is not None]
    n_failed = n_boot - len(good)

    alpha = (1.0 - level) / 2.0
    intervals: dict[str, tuple[float, float]] = {}
    for name in names:
        if good:
            values = np.array([_named_values(f, tolerance)[name] for f in good])
            low, high = np.quantile(values, [alpha, 1.0 - alpha], method="inverted_cdf")
            intervals[name] = (float(low), float(high))
        else:
            intervals[name] = (np.nan, np.nan)

    regimes = []
    for j, b in enumerate(batch_sizes):
        counts = {name: 0 for name in REGIMES}
        for f in good:
            counts[regime(f, float(b), tolerance)] += 1
        low, high = np.quantile(replicates[:, j], [alpha, 1.0 - alpha], method="inverted_cdf")
        regimes.append(
            {
                "batch_size": int(b),
                "steps": curve.steps[j],
                "steps_interval": [_int_or_none(low), _int_or_none(high)],
                "regime": regime(point_fit, float(b), tolerance),
                "regime_fractions": {k: (v / len(good) if good else None) for k, v in counts.items()},
            }
        )
    return CriticalBatchSizeEstimate(
        curve=curve,
        fit=point_fit,
        estimates=estimates,
        intervals=intervals,
        level=level,
        n_boot=int(n_boot),
        n_failed=n_failed,
        seed=seed,
        tolerance=tolerance,
        regimes=regimes,
    )


def critical_batch_size_with_intervals(
    con: duckdb.DuckDBPyConnection,
    selection: Selection,
    n_boot: int = 1000,
    level: float = 0.9,
    seed: int = 0,
    tolerance: float = 0.1,
) -> CriticalBatchSizeEstimate:
    """Steps to result for ``selection`` from the store views, then :func:`bootstrap_critical_batch_size`.

    Every batch size of the workload takes part (one without selected trials is never reached).
    """
    results = steps_to_result_many(con, [selection])[0]  # checks names, lists every batch size
    steps = trial_steps_by_batch_size(trial_first_steps(con, selection))
    trial_steps = {r.batch_size: steps.get(r.batch_size, np.empty(0)) for r in results}
    return bootstrap_critical_batch_size(
        trial_steps,
        n_boot=n_boot,
        level=level,
        seed=seed,
        tolerance=tolerance,
        label=selection.workload,
        metadata=selection.describe(),
    )


def _resampled_steps(per_batch: list[np.ndarray], n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``(n_boot, n_batch)`` steps to result of resampled trials (min over a with-replacement draw)."""
    out = np.full((n_boot, len(per_batch)), np.inf)
    for j, steps in enumerate(per_batch):
        if steps.size:
            out[:, j] = steps[rng.integers(0, steps.size, size=(n_boot, steps.size))].min(axis=1)
    return out


def _fit(batch_sizes: np.ndarray, steps: np.ndarray, label: str) -> ScalingFit | None:
    reached = np.isfinite(steps)
    if reached.sum() < 2:
        return None
    try:
        return fit_steps(batch_sizes[reached], steps[reached], label=label)
    except BatchlabError:
        return None


def _named_values(fit: ScalingFit, tolerance: float) -> dict[str, float]:
    return {"s_min": fit.s_min, "e_min": fit.e_min} | critical_batch_sizes(fit, tolerance)


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def _int_or_none(value: float) -> int | None:
    return int(value) if np.isfinite(value) else None
