"""Sweep throughput: workers, vectorized trials, executor overhead. Prints ratios against baselines run
in the same process.

1. Trials per hour with 2 local workers against 1 (goal: >= 1.8x on 2 cores): the same trials
   (``mnist/fc_128_128_128``, batch size 64) through :class:`LocalPoolExecutor`, pools warmed up first.
2. Vectorized against sequential trials for ``mnist/fc_128_128_128`` at batch sizes 16 and 256 with
   K = 16 (goal: >= 4x): K trials one after another with ``run_trial`` against one
   ``run_trials_vectorized`` call, once with the workload's evaluation schedule (whole trials) and
   once evaluating only at the last step (the training loop alone).
3. Per-trial overhead of the Dask executor (a loopback LocalCluster) against the local pool: the
   same one-step trials through both, one worker each; plus the bare dispatch cost of a no-op task.
4. ``--only budget``: what the default budget rule (docs/methods.md, "Sweeps") gives each batch size
   of a 2^0..2^14 sweep, and the sweep's training cost (examples) against one fixed budget of the
   workload's ``default_steps`` at every batch size (no training; arithmetic from the rule).

Run: ``OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/sweep_throughput.py [--quick]``
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import time  # noqa: E402

WORKLOAD = "mnist/fc_128_128_128"


def noop(task):
    return task


def _specs(batch_size: int, k: int, steps: int, final_only: bool, train_examples: int = 10_000):
    from batchlab.search import default_search_space
    from batchlab.train import TrialSpec

    points = default_search_space("momentum").sample(k, seed=0)
    return [
        TrialSpec(workload=WORKLOAD, optimizer="momentum", batch_size=batch_size, hyperparameters=p, steps=steps,
                  train_examples=train_examples, seed=i, data_seed=0,
                  evaluation_steps=[steps] if final_only else None, stop_at_goal=False, device="cpu")
        for i, p in enumerate(points)
    ]


def _tasks(n: int, batch_size: int, steps: int):
    """``n`` one-trial tasks of the sweep's own kind (sequential trials) of equal cost: SGD with a learning
    rate of 0.01 (none diverges or stops early), evaluated on the workload's schedule."""
    from batchlab.sweep.config import parse_sweep_config
    from batchlab.sweep.plan import make_tasks, plan_studies

    fixed_rate = {"learning_rate": {"type": "DOUBLE", "min_value": 0.01, "max_value": 0.01, "scale": "LINEAR"}}
    config = parse_sweep_config({"workloads": [WORKLOAD], "optimizers": ["sgd"], "batch_sizes": [batch_size],
                                 "trials": n, "steps": steps, "train_examples": 10_000, "stop_at_goal": False,
                                 "search_spaces": {"sgd": fixed_rate}})
    study = plan_studies(config)[0]
    return make_tasks(study, study.trial_plans(), vectorized=False, group_size=1)


def _run_all(executor, tasks) -> float:
    start = time.perf_counter()
    for task in tasks:
        executor.submit(task)
    for outcome in executor.outcomes():
        if outcome.error is not None:
            raise outcome.error
    return time.perf_counter() - start


def workers_ratio(n_trials: int, steps: int) -> None:
    import psutil

    from batchlab.sweep.executors import LocalPoolExecutor
    from batchlab.sweep.worker import run_task

    tasks = _tasks(n_trials, 64, steps)
    rates, cores = {}, {}
    for workers in (1, 2):
        with LocalPoolExecutor(run_task, workers=workers) as pool:
            _run_all(pool, _tasks(workers, 64, 2))  # warm up: start workers, import torch, load data
            procs = [psutil.Process(pid) for pid in pool.worker_pids()]
            cpu_before = sum(sum(p.cpu_times()[:2]) for p in procs)
            wall = _run_all(pool, tasks)
            cpu = sum(sum(p.cpu_times()[:2]) for p in procs) - cpu_before
        rates[workers] = n_trials / wall * 3600
        cores[workers] = cpu / wall
        print(f"  {workers} worker(s): {n_trials} trials in {wall:.1f} s = {rates[workers]:.0f} trials/hour; "
              f"the workers got {cores[workers]:.2f} cores of CPU time ({n_trials / cpu * 3600:.0f} trials per CPU-hour)")
    print(f"workers: 2 vs 1 = {rates[2] / rates[1]:.2f}x trials/hour (goal >= 1.8x on 2 free cores; cores: {os.cpu_count()}, "
          f"load average now {os.getloadavg()[0]:.1f}; CPU obtained 2 vs 1: {cores[2] / cores[1]:.2f}x)")


def vectorized_ratio(k: int, steps: int) -> None:
    from batchlab.sweep.vectorized import run_trials_vectorized
    from batchlab.train import run_trial

    run_trial(_specs(16, 1, 2, True)[0])  # load data once
    for batch_size in (16, 256):
        for final_only in (False, True):
            specs = _specs(batch_size, k, steps, final_only)
            start = time.perf_counter()
            for spec in specs:
                run_trial(spec)
            sequential = time.perf_counter() - start
            start = time.perf_counter()
            run_trials_vectorized(specs)
            vectorized = time.perf_counter() - start
            what = "training only (one evaluation)" if final_only else "whole trials (workload evaluation schedule)"
            print(f"vectorized: batch size {batch_size:>3}, K={k}, {steps} steps, {what}: sequential {sequential:.2f} s, "
                  f"vectorized {vectorized:.2f} s = {sequential / vectorized:.2f}x trials/hour (goal >= 4x)")


def vectorize_rule(k: int, steps: int) -> None:
    """Training-loop speed-up at more batch sizes: the evidence behind ``VECTORIZE_MAX_WORK``."""
    from batchlab.sweep.runner import VECTORIZE_MAX_WORK
    from batchlab.sweep.vectorized import run_trials_vectorized
    from batchlab.train import run_trial
    from batchlab.workloads import get_workload

    params = get_workload(WORKLOAD).num_parameters()
    for batch_size in (1, 4, 64):
        specs = _specs(batch_size, k, steps, True)
        start = time.perf_counter()
        for spec in specs:
            run_trial(spec)
        sequential = time.perf_counter() - start
        start = time.perf_counter()
        run_trials_vectorized(specs)
        vectorized = time.perf_counter() - start
        auto = "vectorized" if batch_size * params <= VECTORIZE_MAX_WORK else "sequential"
        print(f"rule: batch size {batch_size:>3}, K={k}, training only: {sequential / vectorized:.2f}x "
              f"(auto rule picks {auto}: batch_size * {params} parameters vs {VECTORIZE_MAX_WORK})")


def dask_overhead(n_trials: int) -> None:
    from batchlab.sweep.executors import DaskExecutor, LocalPoolExecutor
    from batchlab.sweep.worker import run_task

    tasks = _tasks(n_trials, 16, 1)
    walls = {}
    for name, make in (("local pool", lambda fn: LocalPoolExecutor(fn, workers=1)),
                       ("dask", lambda fn: DaskExecutor(fn, workers=1))):
        with make(run_task) as executor:
            _run_all(executor, _tasks(1, 16, 1))  # warm up
            walls[name] = _run_all(executor, tasks)
        with make(noop) as executor:
            _run_all(executor, list(range(5)))
            walls[name + " no-op"] = _run_all(executor, list(range(n_trials)))
    per_local = walls["local pool"] / n_trials
    per_dask = walls["dask"] / n_trials
    print(f"dask: one-step trials: local pool {1000 * per_local:.1f} ms/trial, dask {1000 * per_dask:.1f} ms/trial; "
          f"dask overhead {1000 * (per_dask - per_local):+.1f} ms/trial ({per_dask / per_local:.2f}x)")
    print(f"dask: bare dispatch of a no-op task: local pool {1000 * walls['local pool no-op'] / n_trials:.2f} ms, "
          f"dask {1000 * walls['dask no-op'] / n_trials:.2f} ms per task")


def budget_rule() -> None:
    """Step budgets of the default rule against a fixed budget, per workload (no training)."""
    from batchlab.sweep.config import parse_sweep_config
    from batchlab.workloads import get_workload

    batch_sizes = [2**k for k in range(15)]
    for name in ("mnist/fc_64_64_64", "mnist/simple_cnn_base", "shakespeare/lstm_char"):
        workload = get_workload(name)
        fits = [b for b in batch_sizes if b <= workload.split_sizes["train"]]
        config = parse_sweep_config({"workloads": [name], "optimizers": ["sgd"], "batch_sizes": fits, "trials": 1})
        steps = {b: config.study_steps(workload, b) for b in fits}
        rule = config.budget_rule(workload)
        ruled = sum(s * b for b, s in steps.items())
        fixed = sum(workload.default_steps * b for b in fits)
        updates = sum(steps.values())
        fixed_updates = workload.default_steps * len(fits)
        shown = ", ".join(f"{b}:{s}" for b, s in steps.items())
        print(f"budget: {name}: examples {rule['examples']}, min_steps {rule['min_steps']}: steps(B) {shown}; "
              f"against {workload.default_steps} steps everywhere: training examples {ruled:.3g} vs {fixed:.3g} "
              f"({ruled / fixed:.3f}x), updates {updates} vs {fixed_updates} ({updates / fixed_updates:.2f}x; "
              "small batch sizes, where a CPU step costs about the same whatever B, dominate the updates)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    parser.add_argument("--only", choices=["workers", "vectorized", "rule", "dask", "budget"], default=None)
    args = parser.parse_args()
    q = args.quick
    if args.only in (None, "workers"):
        workers_ratio(n_trials=4 if q else 12, steps=40 if q else 150)
    if args.only in (None, "vectorized"):
        vectorized_ratio(k=4 if q else 16, steps=30 if q else 200)
    if args.only in (None, "rule"):
        vectorize_rule(k=4 if q else 16, steps=20 if q else 100)
    if args.only in (None, "dask"):
        dask_overhead(n_trials=5 if q else 20)
    if args.only in (None, "budget"):
        budget_rule()


if __name__ == "__main__":
    main()
