"""Coverage of batchlab's nominal 90% intervals on synthetic studies with a known truth, beside the old
fit (the fixed censoring penalty and the 5% floor of batchlab before issue 21) and the plain bootstrap of
a minimum, in one process.

The simulation is the one tests/analysis/test_coverage.py asserts (80-97% in every scenario; the
tight-budget lines: tests/analysis/test_scatter.py); this script prints the measured coverages
(docs/methods.md, "Intervals"). The old fit is read from the git history (commit :data:`BASELINE`, its
``profile_intervals``), so the baseline is the code that ran then.
Run: ``.venv/bin/python benchmarks/interval_coverage.py [replications]`` (default 1000).
"""

import subprocess
import sys
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "analysis"))
import test_coverage as T  # noqa: E402  (the simulation shared with the test)
import test_scatter as S  # noqa: E402  (the tight-budget simulation its test asserts)

BASELINE = "6d1190e"  # the last commit with the fixed censoring penalty (CENSOR_STRENGTH) and the 5% floor


def old_profile_intervals():
    """``profile_intervals`` of the fit at :data:`BASELINE`, or the reason it cannot be loaded."""
    try:
        source = subprocess.run(["git", "-C", str(ROOT), "show", f"{BASELINE}:src/batchlab/analysis/critical_batch_size.py"],
                                capture_output=True, text=True, check=True).stdout
        module = types.ModuleType("critical_batch_size_at_baseline")
        sys.modules[module.__name__] = module  # dataclasses look their module up
        exec(compile(source, f"{BASELINE}:critical_batch_size.py", "exec"), module.__dict__)
        return module.profile_intervals
    except Exception as err:  # noqa: BLE001  (any failure: the baseline is optional, the reason is printed)
        return f"old fit not available ({type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''})"


def weak_index(scenario):
    """Index of the weak study's batch size (``None`` without one)."""
    weak = scenario.get("weak")
    if weak is None:
        return None
    return int(np.flatnonzero(T.BATCH_SIZES == (16 if weak == "small" else T.BATCH_SIZES[-1]))[0])


def main(reps: int = 1000) -> None:
    old = old_profile_intervals()
    print(f"nominal level {T.LEVEL:.0%}, {reps} synthetic curves per scenario, true B_crit {T.TRUE_B_CRIT:g}; "
          f"'old' = the fit at {BASELINE}")
    if isinstance(old, str):
        print(old)
    print(f"{'scenario':52s} {'new':>6s} {'old':>6s} {'new high/low':>12s}  notes")
    for name, scenario in T.SCENARIOS.items():
        out, (y, resolution, kind) = T.scenario_intervals(name, reps=reps)
        new = T.coverage(out)
        old_cov = np.nan if isinstance(old, str) else T.coverage(old(T.BATCH_SIZES, y, resolution, kind, level=T.LEVEL))
        notes = []
        j = weak_index(scenario)
        if j is not None:
            censored = kind[:, j] == T.LOWER
            covered = (out["b_crit_low"] <= T.TRUE_B_CRIT) & (T.TRUE_B_CRIT <= out["b_crit_high"])
            line = f"B={int(T.BATCH_SIZES[j])} censored in {censored.mean():.0%}: new {covered[censored].mean():.2f}"
            if not isinstance(old, str):
                o = old(T.BATCH_SIZES, y[censored], resolution[censored], kind[censored], level=T.LEVEL)
                line += f", old {T.coverage(o):.2f}"
            notes.append(line + " there")
        if scenario.get("rise"):
            notes.append(f"rise found in {np.mean(out['n_rising'] > 0):.0%}")
        width = np.nanmedian(out["b_crit_high"] / out["b_crit_low"])
        print(f"{name:52s} {new:6.3f} {old_cov:6.3f} {width:12.3f}  {'; '.join(notes)}", flush=True)
    # Outside the scatter model: log-normal trials (a Gaussian lower tail), not asserted by the test.
    for k in (2, 4, 8):
        for scale in (0.1, 0.3):
            sim = T.simulate_scenario(reps, k, scale, seed=7, tail="gaussian")
            y, resolution, kind, trial_sd, trial_dof = T.fit_inputs(*sim)
            out = T.profile_intervals(T.BATCH_SIZES, y, resolution, kind, level=T.LEVEL, trial_sd=trial_sd,
                                      trial_dof=trial_dof)
            true_sd = np.log(sim[0].min(axis=2)).std(axis=0).mean()
            print(f"{f'K={k}, log-normal trials, sd {scale}':52s} {T.coverage(out):6.3f} {'':6s} "
                  f"{np.nanmedian(out['b_crit_high'] / out['b_crit_low']):12.3f}  trials' sd / true sd of the best "
                  f"{np.nanmedian(trial_sd[:, 0]) / true_sd:.2f}")
    # Tight budgets (test_scatter.py's TIGHT_BUDGET and two more): every study stops at 1.3x its true S, so the
    # second trial is often unreached; the censored-exponential tail scale beside the one that drops such studies.
    for k, scale in ((2, 0.1), (2, 0.2), (2, 0.3), (4, 0.2), (4, 0.3)):
        sim = S.tight_budget_trials(k, scale, 1.3, reps, seed=21)
        y, resolution, kind, drop_sd, drop_dof = T.fit_inputs(*sim, censored_seconds=False)
        trial_sd, trial_dof, theta = S.censored_trial_scatter(sim[0], sim[2], sim[3])
        out = T.profile_intervals(T.BATCH_SIZES, y, resolution, kind, level=T.LEVEL, trial_sd=trial_sd,
                                  trial_dof=trial_dof)
        dropped = T.profile_intervals(T.BATCH_SIZES, y, resolution, kind, level=T.LEVEL, trial_sd=drop_sd,
                                      trial_dof=drop_dof)
        print(f"{f'K={k}, {scale:.0%} noise, budget 1.3x S everywhere':52s} {T.coverage(out):6.3f} {'':6s} "
              f"{np.nanmedian(out['b_crit_high'] / out['b_crit_low']):12.3f}  tail scale / truth "
              f"{np.nanmedian(theta) / scale:.2f}; dropping censored seconds: coverage {T.coverage(dropped):.3f}, "
              f"tail scale / truth {np.nanmedian(drop_sd[:, 0]) * k / scale:.2f}", flush=True)
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
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
