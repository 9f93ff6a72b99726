"""Intervals for steps to result and the critical batch size, with their target quantities stated.

(The module keeps its historical name; the plain bootstrap of a minimum is gone: a resampled minimum
never falls below the sample's, so its intervals start at the point estimate and under-cover.)
Methods, targets and measured coverage are in docs/methods.md ("Intervals").

* **Steps at a batch size** (``steps_interval``). Target: the *median of the best-of-K-trials steps*
  at that batch size, K = the number of selected trials there (what a rerun of the same study, same
  K, would give half the time or better). Method: an order statistic of the K trials' first
  qualifying steps. The median lies below the k-th smallest trial value with probability
  ``P(Binomial(K, p) <= k - 1)``, ``p = 1 - 0.5**(1/K)`` exactly (distribution-free); ``k`` is chosen
  so this exact coverage is closest to the level (``k = 2`` gives 85-91% for every K >= 2: 0.914,
  0.890, 0.878, 0.862, 0.848 for K = 2, 3, 4, 8, 100).
  The interval is **one-sided**: ``[None, upper]``. No distribution-free lower bound exists (the
  best trial lies below the median only half the time, and nothing in K samples says how far below
  the minimum the median could be), so the lower side is ``None`` with a note.
* **B_crit, S_min, E_min and the fit-derived named batch sizes**. Target: the parameters of the
  hyperbola that the measured minima scatter about (when every batch size's best-of-K distribution
  has the same shape, the hyperbola through the best-of-K medians). Method: profile likelihood of
  the one censored, bracket-weighted fit that gives the point estimate
  (:func:`batchlab.analysis.critical_batch_size.profile_intervals`), each batch size weighted by
  its scatter: the trials' own (:func:`batchlab.analysis.scatter.scatter_from_trials`, from the
  gap between each study's best two trials), or the residuals' where they exceed it; the B_crit
  values whose profiled objective is within an F quantile (on the trials' or the residuals'
  degrees of freedom) of the minimum. Two-sided;
  ``None`` on a side that is unbounded (e.g. ``B_crit`` with no plateau). S_min and E_min are their
  ranges over that B_crit set; the other named batch sizes are monotone in B_crit.
* **Data-read regime bounds** are measured batch sizes: no interval; ``regime_fractions`` give the
  share of trial-resampled curves (``n_boot`` replicates, seeded) putting each batch size in each
  regime, and ``bound_shares`` (:func:`batchlab.analysis.regimes.bound_shares`) the share giving each
  value of each bound: descriptive stability measures (a resampled best of K repeats the sample's best
  about 2/3 of the time, so they are overconfident).

:func:`fit_with_intervals` is the one fit of a curve with its intervals; the store's trials
(:func:`bootstrap_critical_batch_size`) and steps tables (:mod:`batchlab.analysis.steps_table`) both
use it, each passing the trials' scatter it has.

Raced trials (docs/methods.md, "Racing"): a trial's first step may be *unknown* (``NaN``), known
only to be at least its ``unknown_from`` step. An order statistic is used only where it is
determined (a known value no larger than every unknown's ``unknown_from``, :func:`kth_smallest`); otherwise the
bound is ``None`` with a note. A resampled curve whose minimum at some batch size is not
determined is left out of the regime shares, and a warning says how many were.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import duckdb
import numpy as np

from batchlab.finite import finite_or_none
from batchlab.analysis.critical_batch_size import (
    DIMINISHING_RETURNS,
    MAXIMAL_DATA_PARALLELISM,
    PERFECT_SCALING,
    ScalingFit,
    fit_steps_curve,
    observation_arrays,
    profile_intervals,
    read_regimes,
    regime,
    scatter_arrays,
)
from batchlab.analysis.curve import StepsCurve, curve_from_arrays
from batchlab.analysis.definitions import REGISTRY
from batchlab.analysis.regimes import bound_shares
from batchlab.analysis.scatter import ScatterEstimate, kth_smallest, scatter_from_trials  # noqa: F401 (kth_smallest re-exported)
from batchlab.analysis.selection import Selection
from batchlab.analysis.steps_to_result import (
    steps_to_result_many,
    trial_first_steps,
    trial_unknown_from_by_batch_size,
    trial_steps_by_batch_size,
)
from batchlab.errors import BatchlabError

REGIMES = (PERFECT_SCALING, DIMINISHING_RETURNS, MAXIMAL_DATA_PARALLELISM)
FIT_PARAMETERS = ("s_min", "e_min")

STEPS_TARGET = "median of the best-of-K-trials steps at this batch size (K = n_trials)"
STEPS_METHOD = "order statistic of the K trials' first qualifying steps (exact binomial coverage, distribution-free)"
RACED_NOTE = "unknown: the {k} best trial was stopped by racing"
STEPS_NOTE = ("one-sided: no distribution-free lower bound exists for the median of a minimum of K trials "
              "(the best trial lies below it only half the time)")
FIT_TARGET = "parameter of the hyperbola S(B) = S_min + E_min / B that the measured minima scatter about"
FIT_METHOD = ("profile likelihood of the one censored, bracket-weighted fit of the point estimate; each batch size's "
              "scatter the trials' own (gap of each study's best two trials; F quantile on its degrees of freedom), "
              "or the residuals' where they exceed it beyond noise (F quantile on n_points - 2), at least a floor")


def check_level(level: float) -> float:
    """``level``, or a one-line BatchlabError unless it is in (0, 1)."""
    if not 0 < level < 1:
        raise BatchlabError(f"level must be in (0, 1), got {level}")
    return level


def check_resampling(n_boot: int, level: float, seed: int) -> None:
    """A one-line BatchlabError unless ``n_boot`` is an integer >= 1, ``level`` in (0, 1) and ``seed``
    an integer >= 0 (in that order)."""
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 1:
        raise BatchlabError(f"n_boot must be a positive integer, got {n_boot!r}")
    check_level(level)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise BatchlabError(f"seed must be an integer >= 0, got {seed!r}")


@dataclass(frozen=True)
class CurveFit:
    """One curve's fit with its intervals (:func:`fit_with_intervals`).

    Attributes:
        fit: the S(B) fit (:func:`~batchlab.analysis.critical_batch_size.fit_steps_curve`).
        data_regimes: :func:`~batchlab.analysis.regimes.read_regimes` of the curve from the fit's B0.
        estimates: point values of ``s_min``, ``e_min`` and every named critical batch size of the
            registry (``inf`` possible, ``None`` for an unread data bound).
        intervals: ``{name: (low, high)}`` for the same names (``None`` = no bound on that side; both
            ``None`` for the data-read bounds and where the fit gives no interval).
        notes: ``{name: {target, method, two_sided, note, scatter, ...}}`` for every interval.
        warnings: the fit's warnings, then a reason for each unread data-read bound.
        scatter: the trials' scatter the fit used (``None``: none given).
    """

    fit: ScalingFit
    data_regimes: dict
    estimates: dict[str, float | None]
    intervals: dict[str, tuple[float | None, float | None]]
    notes: dict[str, dict]
    warnings: tuple[str, ...] = ()
    scatter: ScatterEstimate | None = None


def fit_with_intervals(curve: StepsCurve, level: float = 0.9, tolerance: float = 0.1, b0: float | None = None,
                       scatter: ScatterEstimate | None = None) -> CurveFit:
    """The S(B) fit of ``curve``, its data-read regimes, every named critical batch size and the
    profile-likelihood intervals at ``level`` (module docstring; docs/methods.md, "Intervals").

    Args:
        curve: steps to result per batch size, with brackets and censoring bounds.
        level: nominal coverage of the intervals, in (0, 1).
        tolerance: regime tolerance, in (0, 1).
        b0: batch size perfect scaling is measured from (default: the fit's smallest reached point).
        scatter: the trials' own scatter (:func:`~batchlab.analysis.scatter.scatter_from_trials` or
            :func:`~batchlab.analysis.scatter.scatter_from_best_two`), or ``None`` (the fit's
            floor, or the residuals' scatter).

    Raises:
        BatchlabError: bad ``level`` or ``tolerance``, fewer than two reached batch sizes, or a ``b0``
            that is not a reached batch size.
    """
    check_level(level)
    point_fit = fit_steps_curve(curve, b0=b0, scatter=scatter)  # raises if < 2 reached
    data = read_regimes(curve, tolerance, b0=point_fit.b0)  # the same B0 as the fit and overhead_20pct
    estimates: dict[str, float | None] = {"s_min": point_fit.s_min, "e_min": point_fit.e_min}
    for d in REGISTRY:
        estimates[d.name] = d.value(point_fit, tolerance, point_fit.b0, data)

    b, y, v, kind = observation_arrays(curve)
    trial_sd, trial_dof = scatter_arrays(scatter, b)
    prof = profile_intervals(b, y[None], v[None], kind[None], level=level, sigma_floor=point_fit.sigma_floor,
                             trial_sd=trial_sd, trial_dof=trial_dof)
    pick = lambda key: float(prof[key][0])  # noqa: E731
    b_low, b_high = pick("b_crit_low"), pick("b_crit_high")
    fit_note = {"target": FIT_TARGET, "method": FIT_METHOD, "two_sided": True, "note": None,
                "scatter": point_fit.scatter, "scatter_source": point_fit.scatter_source,
                "scatter_dof": point_fit.scatter_dof,
                "trials_scatter": None if scatter is None else scatter.to_dict()}
    intervals: dict[str, tuple[float | None, float | None]] = {}
    notes: dict[str, dict] = {}
    no_interval = np.isnan(b_low)
    for name, (low, high) in {
        "s_min": (pick("s_min_low"), pick("s_min_high")),
        "e_min": (pick("e_min_low"), pick("e_min_high")),
    }.items():
        intervals[name] = (None, None) if no_interval else (low, high)
        notes[name] = dict(fit_note, note="range of the profiled value over the B_crit interval")
    for d in REGISTRY:
        if d.source == "data":
            intervals[d.name] = (None, None)
            notes[d.name] = {"target": None, "method": None, "two_sided": False,
                             "note": "a measured batch size read from the data: no interval (see regime_fractions "
                                     "and bound_shares)"}
            continue
        if no_interval:
            intervals[d.name] = (None, None)
            notes[d.name] = dict(fit_note, note="no interval: the fit has no residual degrees of freedom (two points) "
                                                "and no trials' scatter (no study with two reached trials)")
            continue
        # a fit-derived value does not decrease with B_crit: its interval is B_crit's, mapped
        intervals[d.name] = (d.from_b_crit(b_low, tolerance, point_fit.b0),
                             d.from_b_crit(b_high, tolerance, point_fit.b0))
        notes[d.name] = dict(fit_note, note=None if np.isfinite(b_high) else "unbounded above: no plateau is required by the data")
    warnings = list(point_fit.warnings)
    for key in (d.name for d in REGISTRY if d.source == "data"):
        if data[key]["value"] is None:
            warnings.append(f"{key}: {data[key]['reason']}")
    return CurveFit(fit=point_fit, data_regimes=data, estimates=estimates, intervals=intervals, notes=notes,
                    warnings=tuple(warnings), scatter=scatter)


def best_of_k_upper(values: np.ndarray, level: float,
                    unknown_from: np.ndarray | None = None) -> tuple[float | None, int | None, float | None]:
    """Order-statistic upper bound for the median of the best-of-K distribution.

    Returns ``(upper, k, coverage)``: the k-th smallest of the K ``values`` (``inf`` = not reached,
    ``NaN`` = unknown, see :func:`kth_smallest`) and its exact coverage; ``(None, None, best
    coverage)`` when no k reaches within 0.1 of ``level`` (e.g. one trial) and ``upper = None``
    when the k-th trial never reached the goal or the k-th smallest is not determined (a raced
    trial might lie below it).
    """
    from scipy.stats import binom

    values = np.asarray(values, dtype=float)
    k_trials = values.size
    if k_trials == 0:
        return None, None, None
    p = 1.0 - 0.5 ** (1.0 / k_trials)
    coverage = binom.cdf(np.arange(k_trials), k_trials, p)  # coverage[k-1] for the k-th smallest
    k = int(np.argmin(np.abs(coverage - level))) + 1
    if abs(coverage[k - 1] - level) > 0.1:
        return None, None, float(coverage[k - 1])
    upper = kth_smallest(values, k, unknown_from)
    return (upper if upper is not None and np.isfinite(upper) else None), k, float(coverage[k - 1])


@dataclass(frozen=True)
class CriticalBatchSizeEstimate:
    """The S(B) fit, named critical batch sizes with intervals, and each batch size's regime.

    Attributes:
        curve: steps to result from all trials (``None`` steps = not reached).
        fit: the fit to ``curve``.
        estimates: point values of ``s_min``, ``e_min`` and every named critical batch size.
        intervals: ``{name: (low, high)}`` (``None`` = no bound on that side).
        level: the intervals' nominal coverage (e.g. 0.9).
        n_boot: trial-resampling replicates for the regime shares; n_failed: replicates with fewer
            than two reached batch sizes (no regimes); n_undetermined: replicates left out because
            raced trials leave a resampled minimum undetermined.
        seed: the resampling seed; tolerance: the regime tolerance.
        regimes: one dict per batch size (see :meth:`to_dict`).
        interval_notes: ``{name: {target, method, two_sided, note, ...}}`` for every interval.
        data_regimes: :func:`batchlab.analysis.regimes.read_regimes` of ``curve`` (from the fit's B0).
        warnings: the fit's warnings plus unread data regimes and too many failed replicates.
        bound_shares: :func:`batchlab.analysis.regimes.bound_shares` of the ``n_boot`` trial-resampled
            curves' regimes (a replicate that fails, or that racing leaves undetermined, counts as not
            read); descriptive, not a confidence statement.
    """

    curve: StepsCurve
    fit: ScalingFit
    estimates: dict[str, float | None]
    intervals: dict[str, tuple[float | None, float | None]]
    level: float
    n_boot: int
    n_failed: int
    seed: int
    tolerance: float
    regimes: list[dict] = field(default_factory=list)
    interval_notes: dict[str, dict] = field(default_factory=dict)
    data_regimes: dict = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    n_undetermined: int = 0
    bound_shares: dict | None = None

    def to_dict(self) -> dict:
        """JSON-ready summary (infinite values become ``None``)."""
        named = {}
        for d in REGISTRY:
            low, high = self.intervals[d.name]
            named[d.name] = {"value": finite_or_none(self.estimates[d.name]), "low": finite_or_none(low), "high": finite_or_none(high),
                             "definition": d.definition, "source": d.source, "interval": self.interval_notes[d.name]}
            if d.source == "data":
                named[d.name].update({k: v for k, v in self.data_regimes[d.name].items() if k != "value"})
        params = {}
        for name in FIT_PARAMETERS:
            low, high = self.intervals[name]
            params[name] = {"value": finite_or_none(self.estimates[name]), "low": finite_or_none(low), "high": finite_or_none(high),
                            "interval": self.interval_notes[name]}
        return {
            "label": self.curve.label,
            "fit": self.fit.to_dict(),
            "b0": self.fit.b0,
            "batch_size_range": [self.fit.smallest_batch_size, self.fit.largest_batch_size],
            "points_used": self.fit.n_points,
            "measured_batch_sizes": self.data_regimes["measured_batch_sizes"],
            "extrapolated": self.fit.extrapolated,
            "warnings": list(self.warnings),
            "s_min": {"fit": self.fit.s_min, "measured": self.data_regimes["s_min_measured"]},
            "critical_batch_sizes": named,
            "fit_intervals": params,
            "level": self.level,
            "bootstrap": {"n_boot": self.n_boot, "n_failed": self.n_failed, "n_undetermined": self.n_undetermined,
                          "level": self.level, "seed": self.seed},
            "tolerance": self.tolerance,
            "regimes": self.regimes,
            "data_regimes": self.data_regimes,
            "bound_shares": self.bound_shares,
        }


def bootstrap_critical_batch_size(
    trial_steps: Mapping[int, np.ndarray],
    n_boot: int = 1000,
    level: float = 0.9,
    seed: int = 0,
    tolerance: float = 0.1,
    label: str = "",
    metadata: dict | None = None,
    steps_lower: Mapping[int, int | None] | None = None,
    censored_at: Mapping[int, int | None] | None = None,
    b0: float | None = None,
    unknown_from: Mapping[int, np.ndarray] | None = None,
    budget: Mapping[int, float | None] | None = None,
) -> CriticalBatchSizeEstimate:
    """Fit S(B) to all trials, with intervals (see the module docstring) and regime shares.

    Args:
        trial_steps: ``{batch_size: array of each selected trial's first qualifying step}``, ``inf``
            for trials that never reached the goal, ``NaN`` for raced trials whose first step is
            unknown; an empty array is a batch size without trials.
        n_boot: trial-resampling replicates for the regime shares (>= 1).
        level: nominal coverage of the intervals, in (0, 1).
        seed: seed of the resampling (``numpy.random.default_rng``), an integer >= 0.
        tolerance: regime tolerance, in (0, 1).
        steps_lower: ``{batch_size: steps_lower}`` of the best trial's bracket (``None``: exact).
        censored_at: ``{batch_size: censored_at}`` where no trial reached the goal.
        b0: batch size perfect scaling is measured from (default: the smallest reached one).
        unknown_from: ``{batch_size: array aligned with trial_steps}``: the smallest step each unknown
            (``NaN``) trial's first step can be (``NaN`` elsewhere; :func:`~batchlab.analysis.
            steps_to_result.trial_first_steps`); without it an unknown leaves every order statistic
            it could precede undetermined.
        budget: ``{batch_size: the step the unreached trials there ran to}`` (the smallest last
            evaluated step among them; ``None``/missing: unknown). The trials' scatter treats a second-best
            trial that did not reach the goal as censored there
            (:func:`~batchlab.analysis.scatter.scatter_from_trials`); without it such studies are left out.

    Raises:
        BatchlabError: bad ``n_boot``/``level``/``seed``, a batch size whose steps to result is not
            determined (raced trials), or fewer than two batch sizes reached the goal.
    """
    check_resampling(n_boot, level, seed)
    batch_sizes = np.array(sorted(int(b) for b in trial_steps), dtype=float)
    per_batch = [np.asarray(trial_steps[int(b)], dtype=float) for b in batch_sizes]
    bounds = [np.full(s.size, np.nan) if unknown_from is None or int(b) not in unknown_from
              else np.asarray(unknown_from[int(b)], dtype=float) for b, s in zip(batch_sizes, per_batch)]
    point = [kth_smallest(s, 1, lb) if s.size else np.inf for s, lb in zip(per_batch, bounds)]
    undetermined = [int(b) for b, x in zip(batch_sizes, point) if x is None]
    if undetermined:
        raise BatchlabError(f"steps to result not determined at batch size(s) {undetermined}: raced trials stopped "
                            "before any trial known to reach the goal (racing keeps only the best trials exact for "
                            "its stop goal); analyse the stop goal or a looser one, or re-run without --race")
    point_steps = np.array(point, dtype=float)
    lower = None
    if steps_lower is not None and any(steps_lower.get(int(b)) is not None for b in batch_sizes):
        lower = [steps_lower.get(int(b)) if np.isfinite(s) else None for b, s in zip(batch_sizes, point_steps)]
    censored = None
    if censored_at is not None and any(censored_at.get(int(b)) is not None for b in batch_sizes):
        censored = [None if np.isfinite(s) else censored_at.get(int(b)) for b, s in zip(batch_sizes, point_steps)]
    curve = curve_from_arrays(batch_sizes, point_steps, label=label, metadata=metadata, steps_lower=lower,
                              censored_at=censored)
    keys = [int(b_) for b_ in batch_sizes]
    scatter = scatter_from_trials(dict(zip(keys, per_batch)), dict(zip(keys, bounds)), budget)  # None: no study has 2
    one = fit_with_intervals(curve, level=level, tolerance=tolerance, b0=b0, scatter=scatter)  # raises if < 2 reached
    point_fit, data = one.fit, one.data_regimes
    # regime shares from trial-resampled curves (descriptive)
    rng = np.random.default_rng(seed)
    replicates = _resampled_steps(per_batch, n_boot, rng, bounds)
    determined = ~np.isnan(replicates).any(axis=1)
    n_undetermined = int(n_boot - determined.sum())
    replicates = replicates[determined]
    unique, inverse = np.unique(replicates, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    read = []  # read_regimes of each distinct replicate (None: fewer than two reached, or B0 not reached)
    rep_b0 = data["b0"]
    for row in unique:
        rep = curve_from_arrays(batch_sizes, row, censored_at=censored)
        if sum(rep.reached) < 2:
            read.append(None)
            continue
        try:
            # the same B0 as the point estimate; a replicate that does not reach it fails when B0 was
            # given, else it reads from its own smallest reached batch size
            reached_here = {int(b_) for b_, s_ in zip(batch_sizes, row) if np.isfinite(s_)}
            use_b0 = rep_b0 if (b0 is not None or rep_b0 in reached_here) else None
            read.append(read_regimes(rep, tolerance, b0=use_b0))
        except BatchlabError:
            read.append(None)
    per_rep_read = [read[i] for i in inverse]  # one per determined replicate, duplicates expanded
    # undetermined replicates (racing) are not read either: the shares are of all n_boot replicates
    shares = bound_shares(per_rep_read + [None] * n_undetermined)
    per_rep = [None if r is None else [p["regime"] for p in r["points"]] for r in per_rep_read]
    good = [lab for lab in per_rep if lab is not None]
    n_failed = len(per_rep) - len(good)
    shared = len(good) + n_undetermined  # the shares' denominator
    rows = []
    brackets = curve.brackets()
    censoring = curve.censoring()
    for j, batch in enumerate(batch_sizes):
        upper, k, coverage = best_of_k_upper(per_batch[j], level, bounds[j])
        counts = {name: 0 for name in REGIMES}
        for lab in good:
            if lab[j] is not None:
                counts[lab[j]] += 1
        note = STEPS_NOTE
        if k is None and per_batch[j].size:
            note = f"no bound: with {per_batch[j].size} trial(s) no order statistic comes within 0.1 of the level"
        elif k is not None and upper is None and kth_smallest(per_batch[j], k, bounds[j]) is None:
            note = RACED_NOTE.format(k=_ordinal(k))
        elif k is not None and upper is None:
            note = f"unbounded: the {_ordinal(k)} best trial never reached the goal"
        rows.append(
            {
                "batch_size": int(batch),
                "steps": curve.steps[j],
                "steps_lower": None if brackets[j] is None else brackets[j][0],
                "censored_at": censoring[j],
                "n_trials": int(per_batch[j].size),
                "n_unknown": int(np.isnan(per_batch[j]).sum()),
                "steps_interval": [None, None if upper is None else int(upper)],
                "steps_interval_target": STEPS_TARGET,
                "steps_interval_method": STEPS_METHOD,
                "steps_interval_order": k,
                "steps_interval_coverage": coverage,
                "steps_interval_note": note,
                "regime": data["points"][j]["regime"],
                "fit_regime": None if curve.steps[j] is None else regime(point_fit, float(batch), tolerance),
                # undetermined replicates (racing) stay in the denominator: each share is then a lower
                # bound, and the undetermined share could belong to any regime
                "regime_fractions": {k_: (v_ / shared if shared else None) for k_, v_ in counts.items()},
                "regime_fractions_undetermined": (n_undetermined / shared) if shared else None,
            }
        )
    warnings = list(one.warnings)
    if n_undetermined:
        warnings.append(f"{n_undetermined} of {n_boot} resampled curves are undetermined (racing: at some batch size "
                        "the resampled trials held only raced trials stopped before any known to reach the goal); "
                        "each regime share is a lower bound and regime_fractions_undetermined is the share that could "
                        "belong to any regime")
    if n_failed > 0.1 * len(per_rep):
        warnings.append(f"{n_failed} of {len(per_rep)} resampled curves had fewer than two reached batch sizes "
                        f"or did not reach B0 = {data['b0']}")
    return CriticalBatchSizeEstimate(
        curve=curve,
        fit=point_fit,
        estimates=one.estimates,
        intervals=one.intervals,
        level=level,
        n_boot=int(n_boot),
        n_failed=int(n_failed),
        seed=seed,
        tolerance=tolerance,
        regimes=rows,
        interval_notes=one.notes,
        data_regimes=data,
        warnings=tuple(warnings),
        n_undetermined=n_undetermined,
        bound_shares=shares,
    )


def critical_batch_size_with_intervals(
    con: duckdb.DuckDBPyConnection,
    selection: Selection,
    n_boot: int = 1000,
    level: float = 0.9,
    seed: int = 0,
    tolerance: float = 0.1,
    b0: float | None = None,
) -> CriticalBatchSizeEstimate:
    """Steps to result for ``selection`` from the store views, then :func:`bootstrap_critical_batch_size`.

    Every batch size of the workload takes part (one without selected trials is never reached).
    Brackets (``steps_lower``) and censoring bounds (``censored_at``) come from the per-batch-size
    results when the store provides them; raced trials enter with their unknown first steps and
    ``unknown_from`` bounds (:func:`~batchlab.analysis.steps_to_result.trial_first_steps`); each batch
    size's ``budget`` is the smallest ``last_step`` of its unreached trials (NaN when none has one).
    """
    return bootstrap_critical_batch_size(n_boot=n_boot, level=level, seed=seed, tolerance=tolerance, b0=b0,
                                         **store_fit_inputs(con, selection))


def store_fit_inputs(con: duckdb.DuckDBPyConnection, selection: Selection) -> dict:
    """The store's inputs of :func:`bootstrap_critical_batch_size` for ``selection`` (as keyword
    arguments: ``trial_steps``, ``label``, ``metadata``, ``steps_lower``, ``censored_at``,
    ``unknown_from``, ``budget``), read as :func:`critical_batch_size_with_intervals` documents; a
    caller may change them (``batchlab advise`` adds a candidate study's expected trials) and fit."""
    results = steps_to_result_many(con, [selection])[0]  # checks names, lists every batch size
    frame = trial_first_steps(con, selection)
    steps = trial_steps_by_batch_size(frame)
    unknown_from = trial_unknown_from_by_batch_size(frame)
    trial_steps = {r.batch_size: steps.get(r.batch_size, np.empty(0)) for r in results}
    unreached = frame[np.isinf(frame["first_step"].to_numpy(dtype=float))]
    budget = {int(b): float(g["last_step"].min()) for b, g in unreached.groupby("batch_size")}
    return {"trial_steps": trial_steps, "label": selection.workload, "metadata": selection.describe(),
            "steps_lower": {r.batch_size: r.steps_lower for r in results},
            "censored_at": {r.batch_size: r.censored_at for r in results},
            "unknown_from": {b: unknown_from[b] for b in trial_steps if b in unknown_from}, "budget": budget}


def _resampled_steps(per_batch: list[np.ndarray], n_boot: int, rng: np.random.Generator,
                     bounds: list[np.ndarray] | None = None) -> np.ndarray:
    """``(n_boot, n_batch)`` steps to result of resampled trials (min over a with-replacement draw).

    A draw's minimum is ``NaN`` (undetermined) when it holds an unknown trial (``NaN``) whose
    ``bounds`` entry (its ``unknown_from``; ``NaN``: none) is below the draw's smallest known value;
    the random draws are the same with or without unknowns."""
    out = np.full((n_boot, len(per_batch)), np.inf)
    for j, steps in enumerate(per_batch):
        if steps.size:
            draw = rng.integers(0, steps.size, size=(n_boot, steps.size))
            unknown = np.isnan(steps)
            known_min = np.where(unknown, np.inf, steps)[draw].min(axis=1)
            if not unknown.any():
                out[:, j] = known_min
                continue
            lb = np.full(steps.size, np.nan) if bounds is None else np.asarray(bounds[j], dtype=float)
            lb = np.where(unknown, np.where(np.isnan(lb), -np.inf, lb), np.inf)
            out[:, j] = np.where(known_min <= lb[draw].min(axis=1), known_min, np.nan)
    return out


def _ordinal(k: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st, ..."""
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"
