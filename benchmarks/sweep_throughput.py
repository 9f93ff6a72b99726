"""Sweep throughput: workers, vectorized trials, executor overhead. Prints ratios against baselines run
in the same process.

1. Trials per hour with 2 local workers against 1 (goal: >= 1.8x on 2 cores): the same trials
   (``mnist/fc_128_128_128``, batch size 64) through :class:`LocalPoolExecutor`, pools warmed up first.
2. Vectorized against sequential whole trials for fc nets (``--vectorized-workloads``, default
   ``mnist/fc_64_64_64``) at batch sizes 16 and 256 with K = 16, 2000 steps (goal: >= 2x): the K trials of one
   study with ONE shared batch order (``data_order_seed``), the sweep's own protocol (default search
   space, the workload's evaluation schedule, stop at the goal with the replay of its bracket), one
   after another with ``run_trial`` against one ``run_trials_vectorized`` call (the fused MLP path,
   vectorized evaluation), same specs, same process; wall and CPU time (CPU time: this process's,
   which other processes on shared cores do not inflate), and which held on this machine (named by
   torch version, CPU capability, threads and numpy's SIMD level): whether the exactness self-check
   (``vectorized_identical``) finds the vectorized path bit-identical, so ``vectorize = "auto"`` would
   use it, and whether the whole trials are identical to the bit; when not, how far apart they are
   (the first step where a measurement differs and the largest relative difference there, the trials
   whose status, steps or bracket differ, and the differences beyond rounding).
   ``--only rule``: what the measured cost rule (``batchlab.sweep.vectorize_choice.vectorization_costs``)
   estimates, whether the self-check finds the path exact here, and what ``auto`` chooses (cheaper
   and exact) at batch sizes 1..1024, shared and own batch orders.
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


def _shared_specs(workload: str, optimizer: str, batch_size: int, k: int, steps: int, final_only: bool = False):
    """K trials of one study with ONE shared batch order (``data_order_seed``): the sweep's own trial
    definitions (default search space, seeds 0..K-1, stop at the workload's goal, the workload's
    evaluation schedule with replay, the whole training set)."""
    from batchlab.search import default_search_space
    from batchlab.train import TrialSpec

    points = default_search_space(optimizer).sample(k, seed=0)
    return [
        TrialSpec(workload=workload, optimizer=optimizer, batch_size=batch_size, hyperparameters=p, steps=steps,
                  seed=i, data_seed=0, data_order_seed=0, evaluation_steps=[steps] if final_only else None,
                  stop_at_goal=True, device="cpu")
        for i, p in enumerate(points)
    ]


def _timed(fn):
    """``(result, wall seconds, CPU seconds of this process)`` of ``fn()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def _disagreements(sequential, vectorized) -> list[str]:
    """Where the vectorized results differ from the sequential ones: status, steps, steps to goal and
    its bracket exactly; measurements within rounding (classification errors within 2 flipped
    examples in 1000, other metrics within 1e-3 relative)."""
    import math

    problems = []
    for s, v in zip(sequential, vectorized):
        mine = (v.status, v.steps, v.steps_to_goal, v.steps_lower)
        theirs = (s.status, s.steps, s.steps_to_goal, s.steps_lower)
        if mine != theirs:
            problems.append(f"trial seed {s.seed}: (status, steps, steps_to_goal, steps_lower) vectorized {mine} vs sequential {theirs}")
            continue
        if [m["step"] for m in s.measurements] != [m["step"] for m in v.measurements]:
            problems.append(f"trial seed {s.seed}: measured at different steps")
            continue
        for a, b in zip(s.measurements, v.measurements):
            for name, value in a.items():
                other = b.get(name, math.nan)
                tolerance = 2e-3 if "classification" in name else 1e-3 * max(1.0, abs(value))
                if math.isfinite(value) and not abs(value - other) <= tolerance:
                    problems.append(f"trial seed {s.seed}, step {a['step']}: {name} {value:.6g} vs {other:.6g}")
    return problems


def _machine() -> str:
    """What the numerics depend on here: torch version, CPU capability, threads, numpy's SIMD targets."""
    import numpy
    import torch
    try:  # numpy 2; numpy 1.x keeps it under numpy.core
        from numpy._core import _multiarray_umath as umath
    except ImportError:
        from numpy.core import _multiarray_umath as umath

    simd = [f for f in umath.__cpu_dispatch__ if umath.__cpu_features__.get(f)] or ["baseline"]
    return (f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
            f"{torch.get_num_threads()} thread(s), numpy {numpy.__version__} SIMD {'/'.join(simd)}")


def _how_far_apart(sequential, vectorized) -> str:
    """Where whole trials of the two paths first differ: the earliest evaluation step at which any
    measurement is not bitwise equal, the largest relative difference at that step (metric, trial),
    and how many trials end with another status, step count or bracket."""
    import math

    first, worst = None, (0.0, "", 0)
    for s, v in zip(sequential, vectorized):
        for a, b in zip(s.measurements, v.measurements):
            if a == b:
                continue
            if first is None or a["step"] < first:
                first, worst = a["step"], (0.0, "", 0)
            if a["step"] == first:
                for name, value in a.items():
                    other = b.get(name, math.nan)
                    if name != "step" and value != other:
                        rel = abs(value - other) / max(abs(value), 1e-300)
                        worst = max(worst, (rel, name, s.seed))
            break
    ends = sum((s.status, s.steps, s.steps_to_goal, s.steps_lower) != (v.status, v.steps, v.steps_to_goal, v.steps_lower)
               for s, v in zip(sequential, vectorized))
    where = (f"first at step {first} (largest relative difference there {worst[0]:.1e}, {worst[1]} of trial seed "
             f"{worst[2]})" if first is not None else "in their measured steps")
    return f"{where}; {ends}/{len(sequential)} trials end with another status, step count or bracket"


def vectorized_ratio(workloads: list[str], optimizer: str, k: int, steps: dict[int, int]) -> None:
    """Whole trials (training, the workload's evaluation schedule, replay of the goal's bracket): K
    trials with one shared batch order one after another with ``run_trial`` against one
    ``run_trials_vectorized`` call, same specs, same process; checks that the results agree."""
    from batchlab.sweep.vectorize_choice import vectorization_costs
    from batchlab.sweep.vectorized import StackedTrials, run_trials_vectorized
    from batchlab.train import prepare_trial, run_trial

    for workload in workloads:
        run_trial(_shared_specs(workload, optimizer, 16, 1, 2)[0])  # load the data once
        for batch_size, budget in steps.items():
            specs = _shared_specs(workload, optimizer, batch_size, k, budget)
            fused = StackedTrials([prepare_trial(s) for s in specs[:2]], check=False).fused
            sequential, seq_wall, seq_cpu = _timed(lambda: [run_trial(spec) for spec in specs])
            vectorized, vec_wall, vec_cpu = _timed(lambda: run_trials_vectorized(specs))
            estimate = vectorization_costs(specs)
            problems = _disagreements(sequential, vectorized)
            reached = sum(r.steps_to_goal is not None for r in sequential)
            statuses = sorted({r.status for r in sequential})
            print(f"vectorized: {workload} {optimizer} B={batch_size:>3} K={k} {budget} steps, whole trials "
                  f"({reached}/{k} reached the goal; statuses {', '.join(statuses)}; fused path: {fused}): "
                  f"sequential {seq_wall:.1f} s wall / {seq_cpu:.1f} s CPU, vectorized {vec_wall:.1f} s / {vec_cpu:.1f} s "
                  f"= {seq_wall / vec_wall:.2f}x wall, {seq_cpu / vec_cpu:.2f}x CPU (goal >= 2x); "
                  f"the cost rule estimated {estimate.ratio:.2f}x", flush=True)
            identical = all((s.status, s.steps, s.steps_to_goal, s.steps_lower, s.measurements)
                            == (v.status, v.steps, v.steps_to_goal, v.steps_lower, v.measurements)
                            for s, v in zip(sequential, vectorized))
            check = "bit-identical (auto would vectorize where it pays)" if estimate.exact else \
                "NOT bit-identical (auto runs these trials one at a time)"
            print(f"  on this machine ({_machine()}): the self-check finds the vectorized path {check}")
            if identical:
                print("  whole trials identical: statuses, steps, steps to goal, brackets and every measurement, to the bit")
            else:
                print(f"  whole trials NOT identical: they differ {_how_far_apart(sequential, vectorized)}")
                if problems:
                    print(f"  beyond rounding in {len(problems)} place(s): " + "; ".join(problems[:5]))
            if identical and not estimate.exact:
                print("  (the self-check was stricter than these trials needed: auto loses speed here, never a result)")
            elif estimate.exact and not identical:
                print("  WARNING: the self-check passed but the trials differ: its evidence missed a kernel here")


def cost_rule(workload: str, optimizer: str, k: int, steps: int) -> None:
    """What the measured cost rule (``vectorization_costs`` / ``vectorization_pays``) estimates and
    chooses per batch size, with a shared and with each trial's own batch order."""
    from dataclasses import replace

    from batchlab.sweep.vectorize_choice import vectorization_costs

    def choice(cost) -> str:
        exact = "exact" if cost.exact else "not exact here"
        return f"{cost.ratio:.2f}x, {exact}: {'vectorized' if cost.ratio > 1 and cost.exact else 'sequential'}"

    print(f"rule: on this machine ({_machine()}); auto vectorizes where cheaper and exact")
    for batch_size in (1, 16, 64, 256, 1024):
        specs = _shared_specs(workload, optimizer, batch_size, k, steps)
        shared = vectorization_costs(specs)
        own = vectorization_costs([replace(s, data_order_seed=None) for s in specs])
        print(f"rule: {workload} B={batch_size:>4} K={k}: estimated per-trial speed-up, shared order "
              f"{choice(shared)}; own orders {choice(own)}", flush=True)


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
    parser.add_argument("--vectorized-workloads", default="mnist/fc_64_64_64",
                        help="comma-separated fc workloads for the vectorized comparison (default: %(default)s)")
    parser.add_argument("--optimizer", default="sgd", help="optimizer of the vectorized comparison (default: %(default)s)")
    parser.add_argument("--trials", type=int, default=None, help="K, trials per vectorized run (default 16; --quick 4)")
    parser.add_argument("--steps", type=int, default=None,
                        help="step budget of every vectorized-comparison trial (default 2000; --quick 200)")
    args = parser.parse_args()
    q = args.quick
    k = args.trials or (4 if q else 16)
    steps = args.steps or (200 if q else 2000)
    if args.only in (None, "workers"):
        workers_ratio(n_trials=4 if q else 12, steps=40 if q else 150)
    if args.only in (None, "vectorized"):
        vectorized_ratio(args.vectorized_workloads.split(","), args.optimizer, k, {16: steps, 256: steps})
    if args.only in (None, "rule"):
        cost_rule(args.vectorized_workloads.split(",")[0], args.optimizer, k, steps)
    if args.only in (None, "dask"):
        dask_overhead(n_trials=5 if q else 20)
    if args.only in (None, "budget"):
        budget_rule()


if __name__ == "__main__":
    main()
