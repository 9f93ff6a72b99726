"""Benchmark: the whole NQM figure set (official grids) vs the notebook's per-configuration method.

Ours: ``figure_data`` (exact moment recurrences, repeated squaring shared across batch sizes, pruned binary
lifting, certified first passage) plus drawing, timed end to end in this process (2 worker processes).

Baseline (written here, numpy, the official notebook's method): for every grid configuration and batch
size separately, an eigendecomposition of each bin's transition matrix (momentum, EMA) or the SGD closed
form, then a binary search on the step count (high = 1e9 SGD, 1e7 momentum/EMA) evaluating the closed
form at each probe; the PWC figures bisect k in [0, 1e8) with a cold-started L-BFGS-B per probe. It runs
on a subset of each job type, and the per-search cost is extrapolated to the number of searches in the
full set. Prints the ratio and our absolute time.

    .venv/bin/python benchmarks/nqm_figures.py
"""

from __future__ import annotations

import os
import resource
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

import numpy as np  # noqa: E402
from scipy.optimize import minimize  # noqa: E402

from batchlab.nqm import figures  # noqa: E402
from batchlab.nqm.problem import zhang2019_binned  # noqa: E402
from batchlab.nqm.schedules import _pwc_loss_and_gradient  # noqa: E402
from batchlab.nqm.tuning import SECOND_GRID  # noqa: E402
from batchlab.plots.nqm import compute_and_draw_nqm_figures  # noqa: E402

PROBLEM = zhang2019_binned()
H, C, N = PROBLEM.curvature, PROBLEM.noise, PROBLEM.counts
W = 0.5 * N * H


def baseline_sgd_low(lr, batch_size, target, p=0.0, high=10**9):
    """Notebook SGD: closed form per probe, bisection keeping L(low) >= C > L(high)."""
    z, a = lr * H ** (1 - p), lr * H ** (-p)
    beta = (1 - z) ** 2
    steady = a**2 * C / batch_size / (1 - beta)

    def loss(k):
        with np.errstate(over="ignore", invalid="ignore"):
            return W @ (steady + beta**k * (1 - steady))

    low = 0
    if not loss(high) < target:
        return high - 1
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if loss(mid) < target else (mid, high)
    return max(low, 1)


def baseline_eig_low(lr, second, batch_size, target, kind, p=0.0, high=10**7):
    """Notebook momentum/EMA: per-bin eigendecomposition of T, u_k = V (L^k (V^-1 u0 - w*) + w*)."""
    z, a = lr * H ** (1 - p), lr * H ** (-p)
    if kind == "momentum":
        mu = second
        T = np.stack([
            np.stack([(1 - z) ** 2, mu**2 + 0 * z, 2 * mu * (1 - z)], -1),
            np.stack([z**2, mu**2 + 0 * z, -2 * mu * z], -1),
            np.stack([-z * (1 - z), mu**2 + 0 * z, mu * (1 - 2 * z)], -1),
        ], -2)
        u0 = np.array([1.0, 0.0, 0.0])
        noise = np.ones(3)
        read = np.array([1.0, 0.0, 0.0])
    else:
        g = second
        T = np.stack([
            np.stack([(1 - z) ** 2, 0 * z, 0 * z], -1),
            np.stack([(1 - z) ** 2, g**2 + 0 * z, 2 * g * (1 - z)], -1),
            np.stack([(1 - z) ** 2, 0 * z, g * (1 - z)], -1),
        ], -2)
        u0 = np.array([1.0, 1 / (1 - g) ** 2, 1 / (1 - g)])
        noise = np.ones(3)
        read = np.array([0.0, (1 - g) ** 2, 0.0])
    n = (a**2 * C / batch_size)[:, None] * noise
    lam, V = np.linalg.eig(T)
    Vinv = np.linalg.inv(V)
    with np.errstate(all="ignore"):
        w_star = np.einsum("jab,jb->ja", Vinv, n) / (1 - lam)
        start = np.einsum("jab,b->ja", Vinv, u0 + 0j) - w_star

    def loss(k):
        with np.errstate(all="ignore"):
            u = np.einsum("jab,jb->ja", V, lam**k * start + w_star).real
            return W @ (u @ read)

    low = 0
    if not loss(high) < target:
        return high - 1
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if loss(mid) < target else (mid, high)
    return low


def baseline_pwc(batch_size, pieces, target=0.01, p=0.0):
    """Notebook PWC: bisection on k in [0, 1e8), cold-started L-BFGS-B at every probe."""
    bound = np.log(2 / (1 + 10 ** (-4 * (1 - p)) + 1e-4))
    low, high = 0, 10**8

    def optimised(k):
        f = lambda x: _pwc_loss_and_gradient(x, k, H ** (1 - p), H ** (-1 - p), C / batch_size, np.ones(H.size), W)  # noqa: E731
        return minimize(f, np.full(pieces, -5.0), jac=True, method="L-BFGS-B", bounds=[(None, bound)] * pieces).fun

    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if optimised(mid) < target else (mid, high)
    return high


_baseline_wall = [0.0]


def _cpu_seconds() -> float:
    """CPU seconds of this process and its finished children (the figure workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def per_search_seconds(function, argument_list):
    start = time.perf_counter()
    for args in argument_list:
        function(*args)
    elapsed = time.perf_counter() - start
    _baseline_wall[0] += elapsed
    return elapsed / len(argument_list)


def main() -> None:
    rng = np.random.default_rng(0)
    # Our whole figure set, end to end (2 worker processes; CPU time includes the workers).
    cpu0 = _cpu_seconds()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        _, _, timings = compute_and_draw_nqm_figures(out, workers=2)
    ours = time.perf_counter() - start
    ours_cpu = _cpu_seconds() - cpu0
    computed = timings["compute_s"]

    # Number of (configuration, batch size) searches in the full set, by job type.
    n_sgd = 100 * (5 * len(figures.ALL_BATCH_SIZES) + 3 * len(figures.ALL_BATCH_SIZES) + 4 * len(figures.COMPARE_BATCH_SIZES))
    n_momentum = 4 * 2000 * len(figures.COMPARE_BATCH_SIZES)
    n_ema = 2000 * len(figures.COMPARE_BATCH_SIZES)
    n_pwc = {50: len(figures.PWC50_BATCH_SIZES), 10: len(figures.COMPARE_BATCH_SIZES)}

    lrs_sgd = np.logspace(-5, 0.5, 100)
    lrs = np.logspace(-8, 1, 100)
    sample = lambda k: rng.choice(len(lrs), k)  # noqa: E731
    base_cpu0 = _cpu_seconds()
    sgd = per_search_seconds(baseline_sgd_low, [(lrs_sgd[i], 16.0, 0.01) for i in rng.choice(100, 40)])
    mom = per_search_seconds(
        baseline_eig_low, [(lrs[i], SECOND_GRID[j], 64.0, 0.01, "momentum") for i, j in zip(sample(30), rng.choice(20, 30))]
    )
    ema = per_search_seconds(
        baseline_eig_low, [(lrs[i], SECOND_GRID[j], 64.0, 0.01, "ema") for i, j in zip(sample(30), rng.choice(20, 30))]
    )
    pwc10 = per_search_seconds(baseline_pwc, [(256.0, 10)])
    pwc50 = per_search_seconds(baseline_pwc, [(256.0, 50)])
    baseline = n_sgd * sgd + n_momentum * mom + n_ema * ema + n_pwc[10] * pwc10 + n_pwc[50] * pwc50
    # The baseline is single-process, so its CPU time per search tracks its wall time; the machine may be
    # shared, so the CPU-time ratio is reported too (less sensitive to other load).
    base_cpu_fraction = (_cpu_seconds() - base_cpu0) / max(_baseline_wall[0], 1e-9)
    print(
        f"ours: whole NQM figure set in {ours:.2f} s wall on 2 workers (computation {computed:.2f} s, "
        f"drawing {ours - computed:.2f} s); {ours_cpu:.2f} CPU-s in total"
    )
    print(
        f"baseline per search: sgd {sgd * 1e3:.2f} ms, momentum {mom * 1e3:.2f} ms, ema {ema * 1e3:.2f} ms, "
        f"pwc10 {pwc10:.2f} s, pwc50 {pwc50:.2f} s (per batch size)"
    )
    print(
        f"baseline extrapolated to the full set ({n_sgd} SGD, {n_momentum} momentum, {n_ema} EMA searches, "
        f"{sum(n_pwc.values())} PWC searches): {baseline:.0f} s"
    )
    print(f"ratio (baseline / ours, whole set incl. drawing, wall): {baseline / ours:.0f}x")
    print(f"ratio (baseline / ours, CPU seconds): {baseline * base_cpu_fraction / ours_cpu:.0f}x")


if __name__ == "__main__":
    main()
