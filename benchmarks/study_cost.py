"""CPU cost of a batch-size curve: the full protocol against batchlab's fastest exact mode.

The curve: ``mnist/fc_64_64_64`` trained with SGD at batch sizes 16, 64, 256, 1024 and 4096, 16 trials
per batch size at the default search space's quasi-random points, the default step budgets (the
workload's budget rule: docs/methods.md, "Sweeps"), stopping at the workload's goal
(``val/classification_error < 0.03``). Every study runs through the product's own path
(``prepare_sweep`` / ``run_sweep`` with the in-process executor, one batch size per study) in a
worker process, which reports the CPU seconds (``time.process_time``) the study took; studies run
``--workers`` at a time. All modes share one batch order per study (``batch_order = "shared"``,
recorded in the study definition) so that all of them define the same trials; the seed is the same.

Modes (``--modes``, default all three):

* ``full``: the full protocol: every trial one after another to its goal or budget, no racing.
* ``race``: the same, raced (``race = true``: a trial stops once it can no longer be among its study's
  two best; docs/methods.md, "Racing").
* ``fast``: raced and vectorized (``vectorize = "always"``: the 16 trials as one batched computation
  with a shared input and batched evaluation).

The benchmark asserts that every mode gives the same answer at every batch size (steps to result,
its bracket ``steps_lower``, the best trial's id and parameters, and the one-sided steps interval)
where the vectorized path is bit-identical to sequential trials on the machine it runs on (the
sweep's self-check; it says per batch size which held, and lists the answers that differ where it
did not: those studies are recorded as their own, docs/methods.md, "Devices and reproducibility"),
then prints the CPU-time ratio ``full / fast`` (goal: at least 5x) and each part's share of the
saving: racing (``full - race``) and vectorization with batched evaluation (``race - fast``).

Measured on a loaded 2-core machine: full 1,623 CPU s, race 874 s, fast 355 s (4.57x; racing 59% of
the saving, vectorization and batched evaluation 41%), identical answers; 1,962 s wall on 2 workers.
Half of the fast mode is the study at B = 4096, 87% of which (cProfile) is the training matrix
products of the trials that run until two of them reach the goal (docs/methods.md, "Racing").

Run (about 50 minutes of CPU at the defaults; ``--quick`` is a 5-minute check on a subset)::

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/study_cost.py [--workers 2] [--quick]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import concurrent.futures as cf  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

WORKLOAD = "mnist/fc_64_64_64"
BATCH_SIZES = (16, 64, 256, 1024, 4096)
MODES = {
    "full": {"race": False, "vectorize": "never"},
    "race": {"race": True, "vectorize": "never"},
    "fast": {"race": True, "vectorize": "always"},
}


def run_study(mode: str, batch_size: int, trials: int, train_examples: int | None, steps: int | None,
              store_root: str, extra: dict | None = None) -> dict:
    """One study in this (worker) process; its answer and CPU seconds."""
    import torch

    torch.set_num_threads(1)
    from batchlab.sweep.config import parse_sweep_config
    from batchlab.sweep.executors import InlineExecutor
    from batchlab.sweep.runner import prepare_sweep, run_sweep

    settings = {"workloads": [WORKLOAD], "optimizers": ["sgd"], "batch_sizes": [batch_size], "trials": trials,
                "seed": 0, "batch_order": "shared", **MODES[mode], **(extra or {})}
    if train_examples is not None:
        settings["train_examples"] = train_examples
    if steps is not None:
        settings["steps"] = steps
    store = os.path.join(store_root, f"{mode}-{batch_size}")
    started = time.process_time()
    plan = prepare_sweep(parse_sweep_config(settings), store)
    summary = run_sweep(plan, executor_factory=InlineExecutor)
    cpu = time.process_time() - started
    name = f"{WORKLOAD}/sgd"
    row = summary.results[name][0]
    regimes = (summary.fits.get(name) or {}).get("regimes") or []
    interval = next((r["steps_interval"] for r in regimes if r["batch_size"] == batch_size), None)
    return {
        "mode": mode, "batch_size": batch_size, "cpu_s": cpu,
        "answer": {"steps": row.steps, "steps_lower": row.steps_lower, "trial_id": row.trial_id,
                   "parameters": row.parameters, "censored_at": row.censored_at, "steps_interval": interval},
        "statuses": summary.statuses.get(name, {}).get(batch_size, {}),
        # False where vectorize = "always" runs a path the self-check found not bit-identical here
        "identical_to_sequential": not any(s.inexact_vectorized for s in plan.studies),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--modes", default="full,race,fast")
    parser.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)))
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--quick", action="store_true",
                        help="a check, not the claim: 4096 training examples, B = 16, 64, 256, budgets of 1500 steps, "
                             "goal 0.1")
    parser.add_argument("--out", help="write the per-study results as JSON to this file")
    args = parser.parse_args()
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    train_examples = steps = None
    extra: dict = {}
    if args.quick:
        train_examples, steps, batch_sizes = 4096, 1500, [b for b in batch_sizes if b <= 256]
        extra["goal"] = 0.1  # reachable on 4096 examples within 1500 steps
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise SystemExit(f"unknown modes {unknown}; allowed: {', '.join(MODES)}")

    # The workers run a snapshot of src/ taken now (spawned processes inherit sys.path), so editing
    # the working tree during this hour-long run cannot mix two versions of the code in one process.
    import shutil
    import sys

    snapshot = tempfile.mkdtemp(prefix="study_cost_src_")
    shutil.copytree(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "src", "batchlab"),
                    os.path.join(snapshot, "batchlab"))
    sys.path.insert(0, snapshot)
    # The claim's two modes first (full, fast), then race; longest studies first within each.
    order = {"full": 0, "fast": 1, "race": 2}
    jobs = sorted(((m, b) for m in modes for b in batch_sizes), key=lambda mb: (order[mb[0]], -mb[1]))
    results: dict[tuple[str, int], dict] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as root, cf.ProcessPoolExecutor(
            args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(run_study, m, b, args.trials, train_examples, steps, root, extra): (m, b) for m, b in jobs}
        for future in cf.as_completed(futures):
            out = future.result()
            results[(out["mode"], out["batch_size"])] = out
            print(f"  {out['mode']:>4} B={out['batch_size']:<5} {out['cpu_s']:8.1f} CPU s  "
                  f"steps={out['answer']['steps']} best trial={out['answer']['trial_id']}  {out['statuses']}", flush=True)
    wall = time.perf_counter() - started

    reference = modes[0]
    mismatches, unclaimed = [], []
    for b in batch_sizes:
        for m in modes[1:]:
            if results[(m, b)]["answer"] != results[(reference, b)]["answer"]:
                found = (b, m, results[(reference, b)]["answer"], results[(m, b)]["answer"])
                claimed = results[(m, b)]["identical_to_sequential"] and results[(reference, b)]["identical_to_sequential"]
                (mismatches if claimed else unclaimed).append(found)
    inexact = sorted(b for (m, b), r in results.items() if not r["identical_to_sequential"])
    print("\nvectorized path on this machine: " + (
        f"NOT bit-identical to sequential trials at B = {', '.join(map(str, inexact))} (those studies are their own; "
        "their answers need not match the full protocol's)" if inexact else "bit-identical at every batch size"))
    for b, m, want, got in unclaimed:
        print(f"differs (not bit-identical here) at B={b}: {reference} {want} vs {m} {got}")
    cpu = {m: sum(results[(m, b)]["cpu_s"] for b in batch_sizes) for m in modes}
    print(f"\n{WORKLOAD}, sgd, B in {batch_sizes}, {args.trials} trials per batch size"
          f"{' (--quick)' if args.quick else ''}; {wall:.0f} s wall on {args.workers} workers")
    print(f"{'B':>6} " + " ".join(f"{m + ' CPU s':>12}" for m in modes) + "   steps  steps_lower  best trial")
    for b in batch_sizes:
        a = results[(reference, b)]["answer"]
        print(f"{b:>6} " + " ".join(f"{results[(m, b)]['cpu_s']:>12.1f}" for m in modes)
              + f"   {a['steps']}  {a['steps_lower']}  {a['trial_id']}")
    print("total  " + " ".join(f"{cpu[m]:>12.1f}" for m in modes))
    if "full" in cpu and "fast" in cpu:
        saved = cpu["full"] - cpu["fast"]
        print(f"\nCPU-time ratio full / fast: {cpu['full'] / cpu['fast']:.2f}x (goal: >= 5x)")
        if "race" in cpu and saved > 0:
            print(f"share of the saving: racing {(cpu['full'] - cpu['race']) / saved:.0%}, "
                  f"vectorization and batched evaluation {(cpu['race'] - cpu['fast']) / saved:.0%}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump([{**v} for v in results.values()], fh, indent=1)
    if mismatches:
        for b, m, want, got in mismatches:
            print(f"MISMATCH at B={b}: {reference} {want} != {m} {got}")
        raise SystemExit(1)
    same = [b for b in batch_sizes if not any(u[0] == b for u in unclaimed)]
    print("identical answers at batch sizes: " + ", ".join(map(str, same)))


if __name__ == "__main__":
    main()
