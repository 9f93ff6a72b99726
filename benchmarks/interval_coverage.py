"""Coverage of batchlab's nominal 90% intervals on synthetic studies with a known truth, against the
plain bootstrap of a minimum (the baseline it replaced), in one process.

The simulation is the one tests/analysis/test_coverage.py asserts (80-97%); this script prints the
measured coverages (docs/methods.md, "Intervals"). Run: ``.venv/bin/python benchmarks/interval_coverage.py``.
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "analysis"))
import test_coverage as T  # noqa: E402  (the simulation shared with the test)


def covered(low, high, truth=T.TRUE_B_CRIT):
    return float(((low <= truth) & (truth <= high)).mean())


def main() -> None:
    print(f"nominal level {T.LEVEL:.0%}, {T.REPLICATIONS} synthetic studies per line, true B_crit {T.TRUE_B_CRIT:g}")
    for k, scale in [(20, 0.3), (5, 0.3), (3, 1.0)]:
        steps, lower = T.simulate(T.REPLICATIONS, k, scale, seed=k)
        out = T.profile_intervals(T.BATCH_SIZES, *T.curve_arrays(steps, lower), level=T.LEVEL)
        width = np.median(out["b_crit_high"] / out["b_crit_low"])
        print(f"B_crit, K={k} trials, slowdown scale {scale}: coverage {covered(out['b_crit_low'], out['b_crit_high']):.3f}"
              f" (median high/low {width:.3f})")
    budget = 6000.0
    steps, lower = T.simulate(T.REPLICATIONS, 5, 0.3, seed=11, budget=budget)
    y, resolution, kind = T.curve_arrays(steps, lower, budget)
    out = T.profile_intervals(T.BATCH_SIZES, y, resolution, kind, level=T.LEVEL)
    print(f"B_crit, K=5, budget {budget:g} ({np.mean(kind == T.LOWER):.0%} of points censored): "
          f"coverage {covered(out['b_crit_low'], out['b_crit_high']):.3f}")
    s = T.true_steps()[6]  # B = 64
    for k, scale, miss in [(20, 0.3, 0.0), (5, 1.0, 0.3), (100, 0.5, 0.5), (2, 0.5, 0.0)]:
        rng = np.random.default_rng(k)
        q = 1 - 0.5 ** (1 / k)  # the median of the best of K is this quantile of one trial's steps
        truth = np.ceil(s * np.exp(-scale * np.log(1 - q / (1 - miss))))
        trials = np.ceil(s * np.exp(rng.exponential(scale, size=(T.REPLICATIONS, k))))
        trials = np.where(rng.random(trials.shape) < miss, np.inf, trials)
        bounds = [T.best_of_k_upper(row, T.LEVEL) for row in trials]
        coverage = np.mean([upper is None or truth <= upper for upper, _, _ in bounds])
        print(f"S at B=64 (one-sided upper bound), K={k}, scale {scale}, {miss:.0%} of trials unreached: "
              f"order {bounds[0][1]}, exact coverage {bounds[0][2]:.3f}, simulated {coverage:.3f}")
    # Baseline: the plain bootstrap percentile interval of the minimum (what batchlab used before).
    rng = np.random.default_rng(20)
    k, scale = 20, 0.3
    truth = s * np.exp(scale * np.log(2) / k)
    trials = s * np.exp(rng.exponential(scale, size=(T.REPLICATIONS, k)))
    boot = np.array([np.quantile(row[rng.integers(0, k, (400, k))].min(axis=1), [0.05, 0.95]) for row in trials])
    print(f"baseline: plain bootstrap of the minimum, S at B=64, K=20: coverage "
          f"{np.mean((boot[:, 0] <= truth) & (truth <= boot[:, 1])):.3f}")


if __name__ == "__main__":
    main()
