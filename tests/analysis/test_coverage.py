"""Coverage of the intervals by simulation on synthetic studies with a known truth (docs/methods.md, "Intervals").

Each synthetic curve has 12 batch sizes B = 1..2048 and K trials per batch size (a study). A trial's
first passage is the true S(B) = 1000 (1 + 64 / B) times a random slowdown exp(E), E ~
Exponential(scale) (the trial noise: 0.1 is "10%"), read off a ~4% geometric evaluation grid (so every
value is a bracket (previous evaluation, reaching evaluation]). The fit gets each curve's best trials,
and the trials' own scatter from the gap between each study's best two (batchlab.analysis.scatter).
Nominal 90% intervals must cover the true B_crit = 64 in 80-97% of the replications in every scenario
of :data:`SCENARIOS` (benchmarks/interval_coverage.py prints them all, beside the old fit).
"""

import numpy as np
import pytest

from batchlab.analysis.bootstrap import best_of_k_upper, bootstrap_critical_batch_size
from batchlab.analysis.critical_batch_size import ABSENT, LOWER, POINT, profile_intervals
from batchlab.analysis.scatter import pooled_tail_scale, variance_dof

BATCH_SIZES = 2.0 ** np.arange(0, 12)
EVAL_GRID = np.geomspace(1, 1e12, 705)  # ~4% apart
GRID_STEP = np.log(EVAL_GRID[1] / EVAL_GRID[0])
TRUE_B_CRIT = 64.0
REPLICATIONS = 240  # the steps intervals' simulations
SCENARIO_REPLICATIONS = 1000  # B_crit's: the binomial sd of a 0.9 coverage is then 0.01
LEVEL = 0.9
RISE_FROM = 512.0  # rising curves: S(B) = hyperbola * (B / RISE_FROM) ** RISE_POWER above it
RISE_POWER = 0.5

# name: trials per study (k), trial noise (scale), a weak 2-trial study with a budget of 1.3x its
# true S at one end ("small": B = 16, "large": B = 2048), a fixed budget everywhere, a rise.
SCENARIOS = {
    **{f"K={k}, {scale:.0%} noise": dict(k=k, scale=scale) for k in (2, 4, 8) for scale in (0.1, 0.2, 0.3)},
    "K=8, 20% noise, weak censored study at B=16": dict(k=8, scale=0.2, weak="small"),
    "K=4, 30% noise, weak censored study at B=16": dict(k=4, scale=0.3, weak="small"),
    "K=8, 20% noise, weak censored study at B=2048": dict(k=8, scale=0.2, weak="large"),
    "K=4, 30% noise, weak censored study at B=2048": dict(k=4, scale=0.3, weak="large"),
    "K=4, 20% noise, budget 6000 (B=1, 2 censored)": dict(k=4, scale=0.2, budget=6000.0),
    "K=4, 20% noise, rising above B=512": dict(k=4, scale=0.2, rise=True),
    "K=8, 10% noise, rising above B=512": dict(k=8, scale=0.1, rise=True),
    "K=2, 30% noise, rising above B=512": dict(k=2, scale=0.3, rise=True),
}
TESTED = list(SCENARIOS)  # every scenario is asserted


def true_steps(rise=False):
    s = 1000.0 * (1 + TRUE_B_CRIT / BATCH_SIZES)
    return s * np.maximum(1.0, BATCH_SIZES / RISE_FROM) ** RISE_POWER if rise else s


def simulate_scenario(reps, k, scale, seed, weak=None, budget=None, rise=False, tail="exponential"):
    """One scenario's trials: ``(steps, lower, n_trials, censored_at)``.

    ``tail``: the slowdown's distribution, ``"exponential"`` (the scatter model's) or ``"gaussian"``
    (log-normal trials, E ~ Normal(0, scale): outside the model, for the benchmark's sensitivity lines).

    ``steps``/``lower``: (reps, n_batch, k) reaching evaluation step and the one before (``inf`` where a
    trial is unreached or absent: a weak study has 2 trials); ``n_trials``: (n_batch,) trials per
    study; ``censored_at``: (n_batch,) the budget the trials ran to (NaN where unbounded)."""
    rng = np.random.default_rng(seed)
    truth = true_steps(rise)
    n_trials = np.full(BATCH_SIZES.size, k)
    censored_at = np.full(BATCH_SIZES.size, np.nan if budget is None else budget)
    if weak is not None:
        j = int(np.flatnonzero(BATCH_SIZES == (16 if weak == "small" else BATCH_SIZES[-1]))[0])
        n_trials[j] = 2
        censored_at[j] = np.round(1.3 * truth[j])
    shape = (reps, BATCH_SIZES.size, k)
    slowdown = rng.exponential(scale, size=shape) if tail == "exponential" else rng.normal(0, scale, size=shape)
    raw = truth[None, :, None] * np.exp(slowdown)
    # each study's evaluation grid has its own phase (as a study's evaluation steps fall anywhere
    # relative to its true S): a fixed grid would give every replication the same rounding
    phase = np.exp(rng.uniform(0, GRID_STEP, size=(reps, BATCH_SIZES.size, 1)))
    index = np.searchsorted(EVAL_GRID, raw / phase)
    steps, lower = EVAL_GRID[index] * phase, EVAL_GRID[index - 1] * phase
    absent = np.arange(k)[None, None, :] >= n_trials[None, :, None]
    unreached = absent | (steps > np.where(np.isnan(censored_at), np.inf, censored_at)[None, :, None])
    return np.where(unreached, np.inf, steps), lower, n_trials, censored_at


def fit_inputs(steps, lower, n_trials, censored_at, censored_seconds: bool = True):
    """The fit's arrays for each replication: ``(y, resolution, kind, trial_sd, trial_dof)``;
    ``censored_seconds=False`` drops the studies whose second trial is unreached from the tail scale
    (the estimator before the censored-exponential MLE, kept as the benchmark's baseline)."""
    order = np.sort(steps, axis=2)
    best = np.argmin(steps, axis=2)
    upper = order[..., 0]
    low = np.take_along_axis(lower, best[..., None], 2)[..., 0]
    reached = np.isfinite(upper)
    y = np.where(reached, 0.5 * (np.log(np.where(reached, low, 1.0)) + np.log(np.where(reached, upper, 1.0))),
                 np.log(np.where(np.isnan(censored_at), 1.0, censored_at))[None, :])
    resolution = np.where(reached, np.log(np.where(reached, upper / low, 1.0)) ** 2 / 12, 0.0)
    kind = np.where(reached, POINT, np.where(np.isnan(censored_at)[None, :], ABSENT, LOWER))
    theta, n_studies = pooled_tail_scale(upper, order[..., 1], n_trials, censored_at if censored_seconds else None)
    trial_sd = np.where(np.isfinite(theta)[:, None], theta[:, None] / n_trials[None, :], np.nan)
    return y, resolution, kind, trial_sd, variance_dof(n_studies)


def scenario_intervals(name, reps=SCENARIO_REPLICATIONS, seed=None):
    """Profile intervals of every replication of scenario ``name`` (the new fit) and the inputs."""
    sc = SCENARIOS[name]
    seed = list(SCENARIOS).index(name) if seed is None else seed
    sim = simulate_scenario(reps, seed=seed, **sc)
    y, resolution, kind, trial_sd, trial_dof = fit_inputs(*sim)
    out = profile_intervals(BATCH_SIZES, y, resolution, kind, level=LEVEL, trial_sd=trial_sd, trial_dof=trial_dof)
    return out, (y, resolution, kind)


def coverage(out, truth=TRUE_B_CRIT):
    """Share of replications whose B_crit interval holds ``truth`` (no interval counts as a miss)."""
    return float(np.mean((out["b_crit_low"] <= truth) & (truth <= out["b_crit_high"])))


@pytest.mark.parametrize("name", TESTED)
def test_b_crit_interval_covers_the_truth(name):
    out, (_, _, kind) = scenario_intervals(name)
    assert 0.80 <= coverage(out) <= 0.97, (name, coverage(out))
    assert np.median(out["b_crit_high"] / out["b_crit_low"]) < 10  # informative, not just wide
    if "censored" in name:
        assert (kind == LOWER).any(axis=1).mean() > 0.05  # the censored case does occur
    if "rising" in name:
        assert np.mean(out["n_rising"] > 0) > 0.5  # the rise is found and left out


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
    coverage_ = {c for _, _, c in uppers}
    assert len(coverage_) == 1 and 0.8 <= coverage_.pop() <= 0.97  # the exact coverage the output reports
    covered = np.mean([u is None or truth <= u for u, _, _ in uppers])
    assert 0.80 <= covered <= 0.97, covered


def test_one_trial_gives_no_bound_and_the_output_says_so():
    assert best_of_k_upper(np.array([100.0]), LEVEL)[0] is None
    upper, k, coverage_ = best_of_k_upper(np.array([300.0, 100.0, 120.0]), LEVEL)
    # P(Binomial(3, 1 - 2^(-1/3)) <= 1): the second-best of three trials
    p = 1 - 0.5 ** (1 / 3)
    assert (upper, k) == (120.0, 2) and coverage_ == pytest.approx((1 - p) ** 3 + 3 * p * (1 - p) ** 2)
    assert best_of_k_upper(np.array([100.0, np.inf, np.inf]), LEVEL)[0] is None  # the second-best never reached


def test_the_estimate_reports_the_same_interval_and_its_target():
    steps, lower, n_trials, censored_at = simulate_scenario(1, 8, 0.2, seed=5)
    steps, lower = np.round(steps), np.round(lower)  # a store holds whole steps
    trial_steps = {int(b): steps[0, j] for j, b in enumerate(BATCH_SIZES)}
    best = np.argmin(steps[0], axis=1)
    steps_lower = {int(b): int(lower[0, j, best[j]]) for j, b in enumerate(BATCH_SIZES)}
    estimate = bootstrap_critical_batch_size(trial_steps, n_boot=50, seed=0, steps_lower=steps_lower)
    y, resolution, kind, trial_sd, trial_dof = fit_inputs(steps, lower, n_trials, censored_at)
    direct = profile_intervals(BATCH_SIZES, y, resolution, kind, level=LEVEL, trial_sd=trial_sd, trial_dof=trial_dof)
    low, high = estimate.intervals["mccandlish_b_crit"]
    assert low == pytest.approx(direct["b_crit_low"][0], rel=1e-6)
    assert high == pytest.approx(direct["b_crit_high"][0], rel=1e-6)
    assert estimate.fit.b_crit == pytest.approx(direct["b_crit"][0], rel=1e-9)  # one fit: estimate and interval
    summary = estimate.to_dict()
    assert "hyperbola" in summary["critical_batch_sizes"]["mccandlish_b_crit"]["interval"]["target"]
    row = summary["regimes"][3]
    assert row["steps_interval"][0] is None and row["steps_interval"][1] >= row["steps"]
    assert row["steps_interval_target"].startswith("median of the best-of-K")
    assert "one-sided" in row["steps_interval_note"]
