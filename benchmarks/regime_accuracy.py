"""How often the data-read end of perfect scaling is right on an exact hyperbola measured with noisy trials,
for the contiguous rule batchlab uses (docs/methods.md, "Regimes read from the data") and the rule it
replaced ("the largest measured B with S(B) B within (1 + tol) of S(B0) B0"), in one process.

Truth: S(B) = 1000 (1 + B_crit / B) at B = 1, 2, 4, ..., 2048 (B0 = 1), tolerance 0.1; the true end is
the largest of these B with (B + B_crit) / (1 + B_crit) <= 1.1. Each batch size's steps are the best of
K = 8 trials, each trial ceil(S(B) exp(sigma Z)) with Z standard normal (sigma = 0.2: "20% trial noise").
Each rule's reported end is classed as null (no value: below or beyond the measured range, or
undetermined), right, or early/late by whole octaves. Then, per study, the shares of trial-resampled
curves (trials resampled with replacement within each batch size, as ``--bootstrap`` does) giving each
end (:func:`batchlab.analysis.regimes.bound_shares`): the median share of the true end, and how often the
true end is among the values given by at least 5% of the resamples. Run: ``.venv/bin/python benchmarks/regime_accuracy.py``.
"""

from collections import Counter

import numpy as np

from batchlab.analysis.curve import StepsCurve
from batchlab.analysis.regimes import bound_shares, read_regimes

BATCH_SIZES = 2 ** np.arange(12)
TOLERANCE = 0.1
REPLICATIONS = 2000
RESAMPLED_STUDIES, RESAMPLES = 300, 200  # the shares of resamples, on fewer studies


def old_rule_end(batch_sizes, steps, tolerance=TOLERANCE):
    """The replaced rule: the largest measured B with S(B) B <= (1 + tol) S(B0) B0 (B0 the smallest), null
    when only B0 qualifies or when no measured batch size fails (every point reached here)."""
    examples = steps * batch_sizes
    within = examples <= (1 + tolerance) * examples[0]
    end = batch_sizes[within].max()
    if within.sum() < 2 or not (batch_sizes > end).any():
        return None
    return int(end)


def true_end(b_crit, tolerance=TOLERANCE):
    ratio = (BATCH_SIZES + b_crit) / (1 + b_crit)
    return int(BATCH_SIZES[ratio <= 1 + tolerance].max())


def classed(end, truth):
    if end is None:
        return "null"
    octaves = int(np.rint(np.log2(end / truth)))
    return "right" if octaves == 0 else f"{abs(octaves)} octave(s) {'late' if octaves > 0 else 'early'}"


def main() -> None:
    print(f"tolerance {TOLERANCE}, B = 1..2048, {REPLICATIONS} simulated studies per line, best of K trials")
    for b_crit in (64.0, 100.0, 256.0):
        truth = true_end(b_crit)
        for k, sigma in ((8, 0.2), (8, 0.1), (8, 0.3)):
            rng = np.random.default_rng(int(b_crit) * 100 + k + int(100 * sigma))
            mean = 1000 * (1 + b_crit / BATCH_SIZES)
            trials = np.ceil(mean * np.exp(sigma * rng.standard_normal((REPLICATIONS, k, BATCH_SIZES.size))))
            best = trials.min(axis=1)
            old, new = Counter(), Counter()
            for row in best:
                old[classed(old_rule_end(BATCH_SIZES, row), truth)] += 1
                new[classed(read_regimes(_curve(row), TOLERANCE)["perfect_scaling_end"]["value"], truth)] += 1
            print(f"B_crit {b_crit:g} (true end {truth}), K={k}, sigma {sigma}:")
            for name, counts in (("old (largest within)", old), ("new (contiguous)", new)):
                text = ", ".join(f"{c} {n / REPLICATIONS:.0%}" for c, n in sorted(counts.items(), key=_order))
                print(f"  {name:22s} {text}")
    print(f"shares of {RESAMPLES} trial resamples (new rule), {RESAMPLED_STUDIES} studies, K=8, sigma 0.2:")
    for b_crit in (64.0, 100.0, 256.0):
        median_true, covered, median_own = resampled(b_crit)
        print(f"  B_crit {b_crit:g} (true end {true_end(b_crit)}): median share of the true end {median_true:.2f}; "
              f"true end given by >= 5% of resamples in {covered:.0%} of studies; median share of the reported end "
              f"{median_own:.2f}")


def resampled(b_crit, k=8, sigma=0.2, seed=1):
    """The shares of resamples of the new rule's end on simulated studies: (median share of the true end,
    share of studies whose true end is given by >= 5% of the resamples, median share of the reported end)."""
    rng = np.random.default_rng(seed)
    truth = true_end(b_crit)
    mean = 1000 * (1 + b_crit / BATCH_SIZES)
    true_share, covered, own_share = [], [], []
    for _ in range(RESAMPLED_STUDIES):
        trials = np.ceil(mean * np.exp(sigma * rng.standard_normal((k, BATCH_SIZES.size))))
        reported = read_regimes(_curve(trials.min(axis=0)), TOLERANCE)["perfect_scaling_end"]["value"]
        pick = rng.integers(0, k, size=(RESAMPLES, k, BATCH_SIZES.size))
        best = np.take_along_axis(np.broadcast_to(trials, pick.shape), pick, axis=1).min(axis=1)
        shares = {e["value"]: e["share"] for e in
                  bound_shares([read_regimes(_curve(row), TOLERANCE) for row in best])["perfect_scaling_end"]["shares"]}
        true_share.append(shares.get(truth, 0.0))
        covered.append(shares.get(truth, 0.0) >= 0.05)
        own_share.append(shares.get(reported, 0.0))
    return float(np.median(true_share)), float(np.mean(covered)), float(np.median(own_share))


def _curve(best_steps):
    return StepsCurve.from_points(zip(BATCH_SIZES.tolist(), best_steps.astype(int).tolist()))


def _order(item):
    c = item[0]
    if c == "null":
        return (-10, 0)
    if c == "right":
        return (0, 0)
    n = int(c.split()[0])
    return (n if c.endswith("late") else -n, 0)


if __name__ == "__main__":
    main()
