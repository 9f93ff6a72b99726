"""Benchmark: the whole NQM figure set (official grids) vs a per-configuration reimplementation of the notebook.

    .venv/bin/python benchmarks/nqm_figures.py            # about 30 s on an idle machine

What is timed (CPU seconds of this process plus its reaped worker processes, and wall seconds):

1. **Ours, computation only, one process** (``figure_data(workers=1)``, the better of two runs): every
   curve of every figure.
   This is the like-for-like comparison with the baseline, which is also single-process and draws nothing.
2. **Ours, computation only, 2 worker processes** (``figure_data(workers=2)``).
3. **Ours, the whole set** (``compute_and_draw_nqm_figures(workers=2)``, what ``batchlab nqm figures`` runs):
   computation plus drawing the 9 PNGs, split into its compute and draw phases (the compute phase includes
   the matplotlib import, which overlaps it).

Baseline (the official notebook's method, written here in numpy, run in this process on a random sample of
its searches; each figure's per-search CPU cost is extrapolated to the number of searches of the set):

* For every grid configuration and every batch size separately, a binary search on the step count k with
  the official bounds (``high`` = 1e9 for SGD, 1e7 for momentum/EMA), keeping ``L(low) >= C > L(high)``.
  One shortcut favours the baseline: a configuration whose loss at ``high`` is not below C returns
  ``high - 1`` after one probe (the notebook bisects all the way to the same answer).
* Loss at a probe k: SGD uses its closed form ``s_k = s* + beta^k (s_0 - s*)`` (vectorised over the bins,
  as the notebook is); momentum and EMA eigendecompose each bin's 3 x 3 second-moment transition matrix
  once per (configuration, batch size) (``numpy.linalg.eig``, vectorised over bins) and evaluate
  ``u_k = V (L^k (V^-1 u_0 - w*) + w*)``.
* PWC schedules: bisection on the piece length k in [0, 1e8) with an L-BFGS-B optimisation of the K log
  learning rates, cold-started at -5, at every probe; the loss and its exact gradient are a plain loop
  over the pieces (:func:`baseline_pwc_loss_and_gradient`, written here so that our optimisations of
  the library's version do not speed up the baseline).
* Search counts: SGD 100 learning rates x (5 targets + 3 preconditioners) x 20 batch sizes (the SGD
  curves of the optimizer comparisons are sub-sweeps of these, so they are not counted again); momentum
  2,000 configurations x 4 preconditioners x 10 batch sizes; EMA 2,000 x 10; one PWC bisection per
  batch size (9 for 50 pieces, 10 for 10 pieces).

Finally a small sweep shows how our cost grows with the dimension D, the number of grid points and the
step budget.
"""

from __future__ import annotations

import os
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("MPLBACKEND", "Agg")

import numpy as np  # noqa: E402
from scipy.optimize import minimize  # noqa: E402

from batchlab.nqm import figures  # noqa: E402
from batchlab.nqm.dynamics import Algorithm, PowerLevels, moment_recurrence  # noqa: E402
from batchlab.nqm.problem import power_law, zhang2019_binned  # noqa: E402
from batchlab.nqm.steps import best_candidates, certify  # noqa: E402
from batchlab.nqm.algorithms import SECOND_GRID  # noqa: E402
from batchlab.nqm.tuning import tune  # noqa: E402

PROBLEM = zhang2019_binned()
H, C, N = PROBLEM.curvature, PROBLEM.noise, PROBLEM.counts
W = 0.5 * N * H


# --- the baseline -------------------------------------------------------------------------------------------


def _bisect(loss, target, high):
    """Notebook bisection: keep ``loss(low) >= target > loss(high)``; return ``low``."""
    low = 0
    if not loss(high) < target:
        return high - 1
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if loss(mid) < target else (mid, high)
    return low


def baseline_sgd_low(lr, batch_size, target, p=0.0, high=10**9):
    """Notebook SGD: closed form per probe."""
    z, a = lr * H ** (1 - p), lr * H ** (-p)
    beta = (1 - z) ** 2
    steady = a**2 * C / batch_size / (1 - beta)

    def loss(k):
        with np.errstate(over="ignore", invalid="ignore"):
            return W @ (steady + beta**k * (1 - steady))

    return max(_bisect(loss, target, high), 1)


def baseline_eig_low(lr, second, batch_size, target, kind, p=0.0, high=10**7):
    """Notebook momentum/EMA: per-bin eigendecomposition of T, ``u_k = V (L^k (V^-1 u0 - w*) + w*)``."""
    z, a = lr * H ** (1 - p), lr * H ** (-p)
    zero = 0 * z
    if kind == "momentum":
        mu = second
        T = np.stack([
            np.stack([(1 - z) ** 2, mu**2 + zero, 2 * mu * (1 - z)], -1),
            np.stack([z**2, mu**2 + zero, -2 * mu * z], -1),
            np.stack([-z * (1 - z), mu**2 + zero, mu * (1 - 2 * z)], -1),
        ], -2)
        u0 = np.array([1.0, 0.0, 0.0])
        read = np.array([1.0, 0.0, 0.0])
    else:
        g = second
        T = np.stack([
            np.stack([(1 - z) ** 2, zero, zero], -1),
            np.stack([(1 - z) ** 2, g**2 + zero, 2 * g * (1 - z)], -1),
            np.stack([(1 - z) ** 2, zero, g * (1 - z)], -1),
        ], -2)
        u0 = np.array([1.0, 1 / (1 - g) ** 2, 1 / (1 - g)])
        read = np.array([0.0, (1 - g) ** 2, 0.0])
    n = (a**2 * C / batch_size)[:, None] * np.ones(3)
    lam, V = np.linalg.eig(T)
    Vinv = np.linalg.inv(V)
    with np.errstate(all="ignore"):
        w_star = np.einsum("jab,jb->ja", Vinv, n) / (1 - lam)
        start = np.einsum("jab,b->ja", Vinv, u0 + 0j) - w_star

    def loss(k):
        with np.errstate(all="ignore"):
            u = np.einsum("jab,jb->ja", V, lam**k * start + w_star).real
            return W @ (u @ read)

    return _bisect(loss, target, high)


def baseline_pwc_loss_and_gradient(log_lr, k, h_step, h_noise, c_over_b, s0, weights):
    """Loss after K pieces of k SGD steps and its exact gradient w.r.t. log lr: a plain loop over pieces."""
    lr = np.exp(log_lr)
    z = lr[:, None] * h_step[None, :]
    beta = (1.0 - z) ** 2
    steady = lr[:, None] * h_noise[None, :] * c_over_b / (2.0 - z)
    with np.errstate(under="ignore"):
        decay = beta**k
    s = s0.copy()
    inputs = np.empty((lr.size, s0.size))
    for i in range(lr.size):
        inputs[i] = s
        s = decay[i] * (s - steady[i]) + steady[i]
    loss = float(weights @ s)
    adjoint = weights.copy()
    grad = np.empty(lr.size)
    for i in range(lr.size - 1, -1, -1):
        dbeta = -2.0 * (1.0 - z[i]) * h_step
        with np.errstate(under="ignore", invalid="ignore"):
            ddecay = np.where(k > 0, k * beta[i] ** max(k - 1, 0) * dbeta, 0.0)
        dsteady = 2.0 * h_noise * c_over_b / (2.0 - z[i]) ** 2
        grad[i] = float(adjoint @ (ddecay * (inputs[i] - steady[i]) + (1.0 - decay[i]) * dsteady)) * lr[i]
        adjoint = adjoint * decay[i]
    return loss, grad


def baseline_pwc(batch_size, pieces, target=0.01, p=0.0):
    """Notebook PWC: bisection on k in [0, 1e8), cold-started L-BFGS-B at every probe; returns ``high``."""
    bound = np.log(2 / (1 + 10 ** (-4 * (1 - p)) + 1e-4))
    low, high = 0, 10**8
    args = (H ** (1 - p), H ** (-1 - p), C / batch_size, np.ones(H.size), W)

    def optimised(k):
        return minimize(
            baseline_pwc_loss_and_gradient, np.full(pieces, -5.0), args=(k, *args), jac=True,
            method="L-BFGS-B", bounds=[(None, bound)] * pieces,
        ).fun

    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if optimised(mid) < target else (mid, high)
    return high


# --- timing helpers -----------------------------------------------------------------------------------------


def cpu_seconds() -> float:
    """User + system CPU seconds of this process (``time.process_time``, fine resolution) and of its
    reaped children, the worker processes (``os.times``, 10 ms resolution)."""
    t = os.times()
    return time.process_time() + t.children_user + t.children_system


def timed(function, *args, **kwargs):
    """``(result, cpu_s, wall_s)``."""
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    result = function(*args, **kwargs)
    return result, cpu_seconds() - cpu0, time.perf_counter() - wall0


def per_search(function, argument_list) -> tuple[float, float]:
    """Mean ``(cpu_s, wall_s)`` per call over ``argument_list``."""
    _, cpu, wall = timed(lambda: [function(*args) for args in argument_list])
    return cpu / len(argument_list), wall / len(argument_list)


# --- the sweeps ---------------------------------------------------------------------------------------------


def _momentum_grid_cost(problem, lr_points, batch_sizes=(4, 64, 1024), target=0.01):
    """CPU-s of our method on a momentum grid (``lr_points`` x 20 momenta): pruned lifting + certification."""
    lrs, mus = np.meshgrid(np.logspace(-8, 1, lr_points), SECOND_GRID, indexing="ij")
    algorithm = Algorithm("momentum")

    def run():
        rec = moment_recurrence(problem, algorithm, lrs.ravel(), momentum=mus.ravel())
        index, steps = best_candidates(rec, batch_sizes, target, 10**7 - 1)
        for b, i, k in zip(batch_sizes, index, steps):
            single = moment_recurrence(problem, algorithm, [lrs.ravel()[i]], momentum=[mus.ravel()[i]])
            certify(single, float(b), target, int(k), 10**7 - 1)

    return min(timed(run)[1] for _ in range(2))  # the better of two runs: less sensitive to other load


def scaling_sweep() -> None:
    print("\ncost growth (ours, CPU-s, one process):")
    row = []
    for dimension in (50, 100, 200, 400):
        problem = power_law(1.0, 1.0, dimension)
        row.append(f"D={dimension}: {_momentum_grid_cost(problem, 100):.2f}")
    print("  dimension D (unbinned power law h = c = 1/i, momentum official grid, B = 4, 64, 1024): " + ", ".join(row))
    row = [f"{25 * k}x20: {_momentum_grid_cost(PROBLEM, 25 * k):.2f}" for k in (1, 2, 4, 8)]
    print("  grid points (zhang2019-binned momentum, lr points x momenta, B = 4, 64, 1024): " + ", ".join(row))
    lrs, mus = np.meshgrid(np.logspace(-8, 1, 100), SECOND_GRID, indexing="ij")
    rec = moment_recurrence(PROBLEM, Algorithm("momentum"), lrs.ravel(), momentum=mus.ravel())
    row = []
    for budget in (10**4, 10**6, 10**8, 10**10):
        levels = budget.bit_length()
        tables = min(timed(PowerLevels, rec, levels)[1] for _ in range(2))
        search = min(timed(best_candidates, rec, (4, 64, 1024), 0.01, budget)[1] for _ in range(2))
        row.append(f"{budget:.0e} ({levels} levels): tables {tables:.3f}, search {search:.3f}")
    print(
        "  step budget (zhang2019-binned momentum official grid, B = 4, 64, 1024; the search is the pruned "
        "lifting incl. its tables; a budget too small to reach the target at some B prunes nothing there): "
        + ", ".join(row)
    )
    row = []
    momentum = Algorithm("momentum")
    for batch_size in (1024, 64, 4):
        (point,) = tune(PROBLEM, momentum, [batch_size], 0.01, "official")
        single = moment_recurrence(PROBLEM, momentum, [point.learning_rate], momentum=[point.momentum])
        _, cpu, _ = timed(certify, single, float(batch_size), 0.01, point.result.steps, 10**7 - 1)
        row.append(f"{point.result.steps} steps: {cpu * 1e3:.0f} ms")
    print("  dense certification of one momentum winner (linear in its steps): " + ", ".join(row))


# --- main ---------------------------------------------------------------------------------------------------


def main() -> None:
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start")
    # The better of two single-process runs (the machine may be shared); every other figure is one run.
    compute1_cpu, compute1_wall = min(timed(figures.figure_data, workers=1)[1:] for _ in range(2))
    _, compute2_cpu, compute2_wall = timed(figures.figure_data, workers=2)
    from batchlab.plots.nqm import compute_and_draw_nqm_figures

    with tempfile.TemporaryDirectory() as out:
        (_, _, phases), whole_cpu, whole_wall = timed(compute_and_draw_nqm_figures, out, workers=2)

    rng = np.random.default_rng(0)
    sgd_lrs, eig_lrs = np.logspace(-5, 0.5, 100), np.logspace(-8, 1, 100)
    preconditions = np.array(figures.PRECONDITIONS)
    n_sgd = 100 * (len(figures.TARGETS) + 3) * len(figures.ALL_BATCH_SIZES)
    n_momentum = 4 * 2000 * len(figures.COMPARE_BATCH_SIZES)
    n_ema = 2000 * len(figures.COMPARE_BATCH_SIZES)
    n_pwc = {50: len(figures.PWC50_BATCH_SIZES), 10: len(figures.COMPARE_BATCH_SIZES)}
    compare = np.array(figures.COMPARE_BATCH_SIZES, float)

    def sample_eig(kind, count):
        return [
            (eig_lrs[i], SECOND_GRID[j], compare[b], 0.01, kind, preconditions[q] if kind == "momentum" else 0.0)
            for i, j, b, q in zip(rng.integers(0, 100, count), rng.integers(0, 20, count),
                                  rng.integers(0, compare.size, count), rng.integers(0, 4, count))
        ]

    sgd_args = [
        (sgd_lrs[i], float(figures.ALL_BATCH_SIZES[b]), figures.TARGETS[t], preconditions[q])
        for i, b, t, q in zip(rng.integers(0, 100, 200), rng.integers(0, 20, 200), rng.integers(0, 5, 200),
                              rng.integers(0, 4, 200))
    ]
    sgd = per_search(baseline_sgd_low, sgd_args)
    momentum = per_search(baseline_eig_low, sample_eig("momentum", 200))
    ema = per_search(baseline_eig_low, sample_eig("ema", 100))
    pwc10 = per_search(baseline_pwc, [(64.0, 10), (4096.0, 10)])
    pwc50 = per_search(baseline_pwc, [(256.0, 50)])
    counts = (n_sgd, n_momentum, n_ema, n_pwc[10], n_pwc[50])
    costs = (sgd, momentum, ema, pwc10, pwc50)
    baseline_cpu = sum(n * c[0] for n, c in zip(counts, costs))
    baseline_wall = sum(n * c[1] for n, c in zip(counts, costs))

    draw_wall = phases["draw_s"]
    print(f"ours, computation, 1 process:    {compute1_cpu:6.2f} CPU-s, {compute1_wall:6.2f} s wall")
    print(f"ours, computation, 2 workers:    {compute2_cpu:6.2f} CPU-s, {compute2_wall:6.2f} s wall")
    print(
        f"ours, whole set (compute + draw 9 PNGs, 2 workers): {whole_cpu:6.2f} CPU-s, {whole_wall:6.2f} s wall "
        f"(compute phase {phases['compute_s']:.2f} s wall incl. the overlapped matplotlib import, "
        f"draw phase {draw_wall:.2f} s wall; {phases['compute_cpu_s']:.2f} + {phases['draw_cpu_s']:.2f} CPU-s)"
    )
    print(
        "baseline per search, CPU: "
        f"sgd {sgd[0] * 1e3:.2f} ms, momentum {momentum[0] * 1e3:.2f} ms, ema {ema[0] * 1e3:.2f} ms, "
        f"pwc10 {pwc10[0]:.2f} s, pwc50 {pwc50[0]:.2f} s (per batch size)"
    )
    print(
        f"baseline extrapolated to the set ({n_sgd} SGD, {n_momentum} momentum, {n_ema} EMA, "
        f"{sum(n_pwc.values())} PWC searches): {baseline_cpu:.0f} CPU-s ({baseline_wall:.0f} s wall)"
    )
    like_for_like = baseline_cpu / compute1_cpu
    print(f"ratio, computation vs baseline (CPU-s, both one process; like for like): {like_for_like:.0f}x")
    print(f"ratio, computation on 2 workers vs baseline (wall): {baseline_wall / compute2_wall:.0f}x")
    print(f"ratio, whole set incl. drawing vs baseline (CPU-s): {baseline_cpu / whole_cpu:.0f}x")
    print(f"ratio, whole set incl. drawing vs baseline (wall): {baseline_wall / whole_wall:.0f}x")
    scaling_sweep()
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
