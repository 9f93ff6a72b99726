"""Coverage of ``batchlab analyze scaling``'s nominal 90% exponent intervals on synthetic steps tables with a
known power law, in one process (docs/methods.md, "Scaling across groups").

Each table: groups at sizes x = 1e6 * 4**k (k = 0, 1, ...), B_crit = 0.1 x**0.5 and S_min = 2000 (x / 1e6)**0.2,
every step count the hyperbola times exp(noise * N(0, 1)) (tests/analysis/test_scaling.py's ``write_table``,
seeded 0, 1, ...). Printed per setting: the share of the tables with a power law (``no fit``: how many had
fewer than two groups with a bounded interval) whose exponent interval holds the true exponent,
for the fit as it is (centred on each group's interval, residual-scaled covariance, t quantile), and for two
alternatives the docs compare it with: trusting the weights unless exceeded (covariance scaled by
max(1, chi2/dof)) and centring each group on its point estimate (same standard error).
Run: ``.venv/bin/python benchmarks/scaling_coverage.py [tables]`` (default 150; about a minute).
"""

import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "analysis"))
from test_scaling import EXPONENT, S_MIN_EXPONENT, write_table  # noqa: E402  (the tables the test fits)

from batchlab.analysis.scaling import fit_scaling_table, power_law_fit  # noqa: E402

TRUTH = {"mccandlish_b_crit": EXPONENT, "s_min": S_MIN_EXPONENT}
NAMES = {"mccandlish_b_crit": "B_crit", "s_min": "S_min"}
#: (groups, batch sizes per group, noise, label of the batch sizes)
SETTINGS = [
    (5, tuple(2**k for k in range(2, 16)), 0.2, "14: 4...32768"),
    (3, tuple(2**k for k in range(2, 16)), 0.1, "14: 4...32768"),
    (8, tuple(4**k for k in range(1, 7)), 0.1, "6: 4, 16, ..., 4096"),
    (4, tuple(4**k for k in range(1, 6)), 0.3, "5: 4, 16, ..., 1024"),
]


def covers(exponent: dict, truth: float) -> bool:
    return exponent["low"] is not None and exponent["low"] <= truth <= exponent["high"]


def trusted_covers(fit: dict, truth: float) -> bool:
    """The same fit with the covariance scaled by max(1, chi2/dof) instead of chi2/dof (t quantile kept)."""
    scale = fit["residual_scale"]
    half = (fit["exponent"]["high"] - fit["exponent"]["value"]) * math.sqrt(max(1.0, scale) / scale)
    return abs(fit["exponent"]["value"] - truth) <= half


def point_centred(groups: list[dict], key: str) -> list[dict]:
    """The groups with each interval moved to be centred (in log) on the group's point estimate."""
    out = []
    for g in groups:
        q = dict(g[key])
        if q["low"] and q["high"] and q["value"]:
            half = 0.5 * (math.log(q["high"]) - math.log(q["low"]))
            q["low"], q["high"] = q["value"] * math.exp(-half), q["value"] * math.exp(half)
        out.append({**g, key: q})
    return out


def main(tables: int = 150) -> None:
    print(f"nominal 90% exponent intervals, {tables} seeded tables per setting; truth b = {EXPONENT} (B_crit), "
          f"{S_MIN_EXPONENT} (S_min)")
    print(f"{'groups':>6s} {'batch sizes':22s} {'noise':>5s} {'quantity':8s} {'fit':>6s} {'trusted':>8s} "
          f"{'point-centred':>13s} {'no fit':>6s}")
    with tempfile.TemporaryDirectory() as tmp:
        for n_groups, batch_sizes, noise, label in SETTINGS:
            sizes = tuple(1e6 * 4**k for k in range(n_groups))
            hits = {key: [0, 0, 0, 0] for key in TRUTH}  # fit, trusted, point-centred, no fit
            for seed in range(tables):
                path = write_table(Path(tmp) / f"t{seed}.csv", seed=seed, sizes=sizes, noise=noise,
                                   batch_sizes=batch_sizes)
                out = fit_scaling_table(path, "model", "params", n_boot=1)
                for key, truth in TRUTH.items():
                    fit = out["fits"][key]
                    if fit.get("error"):
                        hits[key][3] += 1
                        continue
                    hits[key][0] += covers(fit["exponent"], truth)
                    hits[key][1] += fit["residual_scale"] is not None and trusted_covers(fit, truth)
                    moved = power_law_fit(point_centred(out["groups"], key), key, NAMES[key], n_boot=1)
                    hits[key][2] += covers(moved["exponent"], truth)
            for key in TRUTH:
                fit, trusted, centred, failed = hits[key]
                fitted = max(tables - failed, 1)
                print(f"{n_groups:6d} {label:22s} {noise:5.1f} {NAMES[key]:8s} {fit / fitted:6.3f} "
                      f"{trusted / fitted:8.3f} {centred / fitted:13.3f} {failed:6d}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 150)
