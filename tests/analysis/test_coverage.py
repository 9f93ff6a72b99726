"""Coverage of the intervals by simulation on synthetic studies with a known truth (docs/methods.md, "Intervals").

Each synthetic study has 12 batch sizes B = 1..2048 and K trials per batch size. A trial's first
passage is the true S(B) = 1000 (1 + 64 / B) times a random slowdown exp(E), E ~ Exponential(scale),
read off a ~4% geometric evaluation grid (so every value is a bracket (previous evaluation, reaching
evaluation]). Nominal 90% intervals must cover the truth in 80-97% of the replications.
"""

import numpy as np
import pytest

from batchlab.analysis.bootstrap import best_of_k_upper, bootstrap_critical_batch_size
from batchlab.analysis.critical_batch_size import LOWER, POINT, profile_intervals

BATCH_SIZES = 2.0 ** np.arange(0, 12)
EVAL_GRID = np.unique(np.round(np.geomspace(1, 1e12, 705)))  # ~4% apart
TRUE_B_CRIT = 64.0
REPLICATIONS = 240
LEVEL = 0.9


def true_steps():
    return 1000.0 * (1 + TRUE_B_CRIT / BATCH_SIZES)


def simulate(reps, k, scale, seed, budget=None):
    """Trial first-qualifying steps (reps, n_batch, k) on the evaluation grid, and the grid step before each."""
    rng = np.random.default_rng(seed)
    raw = true_steps()[None, :, None] * np.exp(rng.exponential(scale, size=(reps, BATCH_SIZES.size, k)))
    index = np.searchsorted(EVAL_GRID, raw)
    steps, lower = EVAL_GRID[index], EVAL_GRID[index - 1]
    if budget is not None:
        steps = np.where(steps > budget, np.inf, steps)
    return steps, lower


def curve_arrays(steps, lower, budget=None):
    """The fit's observation arrays (y, resolution, kind) of each replication's best trials."""
    best = np.argmin(steps, axis=2)
    upper = np.take_along_axis(steps, best[..., None], 2)[..., 0]
    low = np.take_along_axis(lower, best[..., None], 2)[..., 0]
    reached = np.isfinite(upper)
    y = np.where(reached, 0.5 * (np.log(np.where(reached, low, 1.0)) + np.log(np.where(reached, upper, 1.0))), 0.0)
    resolution = np.where(reached, np.log(np.where(reached, upper / low, 1.0)) ** 2 / 12, 0.0)
    kind = np.where(reached, POINT, LOWER)
    if budget is not None:
        y = np.where(reached, y, np.log(budget))
    return y, resolution, kind


@pytest.mark.parametrize("k, scale", [(20, 0.3), (5, 0.3), (3, 1.0)])
def test_b_crit_interval_covers_the_truth(k, scale):
    steps, lower = simulate(REPLICATIONS, k, scale, seed=k)
    y, resolution, kind = curve_arrays(steps, lower)
    out = profile_intervals(BATCH_SIZES, y, resolution, kind, level=LEVEL)
    covered = (out["b_crit_low"] <= TRUE_B_CRIT) & (TRUE_B_CRIT <= out["b_crit_high"])
    assert 0.80 <= covered.mean() <= 0.97, covered.mean()
    assert np.median(out["b_crit_high"] / out["b_crit_low"]) < 3  # informative, not just wide


def test_b_crit_interval_covers_the_truth_with_censored_batch_sizes():
    # A fixed budget of 6000 steps: the two smallest batch sizes (S = 65000 and 33000) are always censored.
    budget = 6000.0
    steps, lower = simulate(REPLICATIONS, 5, 0.3, seed=11, budget=budget)
    y, resolution, kind = curve_arrays(steps, lower, budget)
    assert (kind == LOWER).mean() >= 0.25
    out = profile_intervals(BATCH_SIZES, y, resolution, kind, level=LEVEL)
    covered = (out["b_crit_low"] <= TRUE_B_CRIT) & (TRUE_B_CRIT <= out["b_crit_high"])
    assert 0.80 <= covered.mean() <= 0.97, covered.mean()


@pytest.mark.parametrize("k, scale, miss", [(20, 0.3, 0.0), (5, 1.0, 0.3), (100, 0.5, 0.5), (2, 0.5, 0.0)])
def test_steps_interval_covers_the_median_of_the_best_of_k(k, scale, miss):
    # Exact first passages (every step evaluated) at B = 64; a fraction ``miss`` of trials never reach the
    # goal (inf). Target: the median of the best-of-K steps. With F the trials' distribution (mass 1 - miss
    # on S exp(E)), it solves 1 - (1 - F)^K = 1/2: S exp(-scale log(1 - q / (1 - miss))), q = 1 - 2^(-1/K).
    rng = np.random.default_rng(k)
    s = true_steps()[6]
    q = 1 - 0.5 ** (1 / k)
    truth = np.ceil(s * np.exp(-scale * np.log(1 - q / (1 - miss))))
    steps = np.ceil(s * np.exp(rng.exponential(scale, size=(REPLICATIONS, k))))
    steps = np.where(rng.random(steps.shape) < miss, np.inf, steps)
    uppers = [best_of_k_upper(row, LEVEL) for row in steps]
    coverage = {c for _, _, c in uppers}
    assert len(coverage) == 1 and 0.8 <= coverage.pop() <= 0.97  # the exact coverage the output reports
    covered = np.mean([u is None or truth <= u for u, _, _ in uppers])
    assert 0.80 <= covered <= 0.97, covered


def test_one_trial_gives_no_bound_and_the_output_says_so():
    assert best_of_k_upper(np.array([100.0]), LEVEL)[0] is None
    upper, k, coverage = best_of_k_upper(np.array([300.0, 100.0, 120.0]), LEVEL)
    # P(Binomial(3, 1 - 2^(-1/3)) <= 1): the second-best of three trials
    p = 1 - 0.5 ** (1 / 3)
    assert (upper, k) == (120.0, 2) and coverage == pytest.approx((1 - p) ** 3 + 3 * p * (1 - p) ** 2)
    assert best_of_k_upper(np.array([100.0, np.inf, np.inf]), LEVEL)[0] is None  # the second-best never reached


def test_the_estimate_reports_the_same_interval_and_its_target():
    steps, lower = simulate(1, 20, 0.3, seed=5)
    trial_steps = {int(b): steps[0, j] for j, b in enumerate(BATCH_SIZES)}
    best = np.argmin(steps[0], axis=1)
    steps_lower = {int(b): int(lower[0, j, best[j]]) for j, b in enumerate(BATCH_SIZES)}
    estimate = bootstrap_critical_batch_size(trial_steps, n_boot=50, seed=0, steps_lower=steps_lower)
    y, resolution, kind = curve_arrays(steps, lower)
    direct = profile_intervals(BATCH_SIZES, y, resolution, kind, level=LEVEL)
    low, high = estimate.intervals["mccandlish_b_crit"]
    assert low == pytest.approx(direct["b_crit_low"][0], rel=1e-6)
    assert high == pytest.approx(direct["b_crit_high"][0], rel=1e-6)
    summary = estimate.to_dict()
    assert "hyperbola" in summary["critical_batch_sizes"]["mccandlish_b_crit"]["interval"]["target"]
    row = summary["regimes"][3]
    assert row["steps_interval"][0] is None and row["steps_interval"][1] >= row["steps"]
    assert row["steps_interval_target"].startswith("median of the best-of-K")
    assert "one-sided" in row["steps_interval_note"]
