"""What the bounded-resolution evaluation schedule costs: whole trials, new default schedule vs the old one.

For one workload (default ``mnist/fc_64_64_64``, its default step budget, the full training set) at a
few batch sizes (default 16, 128, 1024), SGD at learning rate 0.1 (reaches the goal within the
budget at these batch sizes; no stop at the goal, so every trial runs its whole budget), it runs
the same trial three ways in the same process, interleaved, best of ``--repeats``:

* ``old``: the schedule batchlab used before resolution steps (every metric at 1, then x1.5 up to a
  regular interval of budget/25 (budget/20 for CNNs and language models), every interval, and the
  budget): ``TrialSpec(evaluation_steps=workload.evaluation_steps(T, resolution=None))``;
* ``replay`` (the default, ``TrialSpec()``, resolution r = 0.05): every metric at those same full
  steps; when a full evaluation first meets the goal, the copy of the trial kept at the previous
  full evaluation is trained again and the goal split (``val``) measured at the resolution steps in
  between, up to the first that meets the goal;
* ``dense`` (``TrialSpec(refine="dense")``): the goal split measured at every resolution step as the
  trial runs (every step up to 40, then consecutive steps within a factor 1.05, and the budget).

It prints the resolution each schedule guarantees (the largest relative gap ``b/a - 1`` between
consecutive evaluation steps more than one step apart: 1.0 means a steps to result can be read 2x
too high), then per batch size and way: evaluations (full + goal-only), the bracket of steps to the goal
``(steps_lower, steps_to_goal]`` and its relative width, the wall seconds of the whole trial
(training, evaluations, replay and recording into a temporary store), the part spent evaluating
(``TrialResult.evaluation_time_s``, replay included), the CPU seconds of the whole trial
(``time.process_time``: single-threaded torch, so robust to other processes on a shared machine),
``ratio`` / ``CPU ratio`` = wall / old wall and CPU / old CPU (the added evaluation cost as a factor
on the whole trial), and ``added`` = (eval s - old eval s) / old wall, the same added cost timed
inside the trial only where it is spent (less exposed to the noise of a shared machine). Each time
is the best of the repeats (the measurements are the same in every repeat).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/eval_resolution.py`` (a few minutes on an idle
core), or with ``--workload NAME --batch-sizes 32,256 --steps N --learning-rate X --repeats K``. No
thresholds: it measures; docs/methods.md ("Evaluation schedule and resolution") quotes its result.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from batchlab.store import Store  # noqa: E402
from batchlab.train import TrialSpec, run_trial  # noqa: E402
from batchlab.workloads import get_workload  # noqa: E402
from batchlab.workloads.schedule import DEFAULT_RESOLUTION, schedule_resolution  # noqa: E402

MODES = ("old", "replay", "dense")


def run(name: str, batch_size: int, steps: int, mode: str, optimizer: str, learning_rate: float) -> tuple[float, float, object]:
    """Wall and CPU seconds of one whole trial recorded into a temporary store, and its result."""
    workload = get_workload(name)
    schedule = workload.evaluation_steps(steps, resolution=None) if mode == "old" else None
    spec = TrialSpec(workload=name, optimizer=optimizer, batch_size=batch_size, steps=steps,
                     hyperparameters={"learning_rate": learning_rate}, evaluation_steps=schedule,
                     refine="dense" if mode == "dense" else "replay", stop_at_goal=False, device="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(os.path.join(tmp, "store"), create=True)
        start, start_cpu = time.perf_counter(), time.process_time()
        result = run_trial(spec, store=store)
        wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    return wall, cpu, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="mnist/fc_64_64_64")
    parser.add_argument("--batch-sizes", default="16,128,1024")
    parser.add_argument("--steps", type=int, default=None, help="step budget (default: the workload's)")
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    workload = get_workload(args.workload)
    steps = args.steps or workload.default_steps
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    run(args.workload, batch_sizes[0], 5, "replay", args.optimizer, args.learning_rate)  # warm-up: data, imports, first publish

    print(f"{args.workload}, {args.optimizer} lr {args.learning_rate}, budget {steps} steps, goal "
          f"{workload.metric} {'>' if workload.maximize else '<'} {workload.goal:g}, resolution r = {DEFAULT_RESOLUTION}, "
          f"torch threads {torch.get_num_threads()}; best of {args.repeats}")
    old_res = schedule_resolution(workload.evaluation_steps(steps, resolution=None))
    new_res = schedule_resolution(workload.evaluation_steps(steps))
    print(f"schedule resolution (largest relative bracket width b/a - 1 over consecutive evaluation steps a < b): "
          f"old {old_res:.3f}, new {new_res:.3f}")
    print(f"{'batch':>6} {'way':>7} {'evals (full+goal)':>18} {'bracket':>16} {'width':>7} {'wall s':>8} "
          f"{'eval s':>7} {'CPU s':>8} {'ratio':>6} {'CPU ratio':>9} {'added':>6}")
    ratios: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpu_ratios: dict[str, list[float]] = {mode: [] for mode in MODES}
    added_share: dict[str, list[float]] = {mode: [] for mode in MODES}
    for batch_size in batch_sizes:
        best: dict[str, tuple[float, float, float, object]] = {
            mode: (float("inf"), float("inf"), float("inf"), None) for mode in MODES}
        for _ in range(args.repeats):
            for mode in MODES:  # interleaved, so load changes hit all alike
                wall, cpu, result = run(args.workload, batch_size, steps, mode, args.optimizer, args.learning_rate)
                best[mode] = (min(wall, best[mode][0]), min(cpu, best[mode][1]),
                              min(result.evaluation_time_s, best[mode][2]), result)
        old_wall, old_cpu, old_eval, _ = best["old"]
        for mode in MODES:
            wall, cpu, evaluating, result = best[mode]
            full = sum(1 for m in result.measurements if any(k.startswith("train/") for k in m))
            goal_only = len(result.measurements) - full
            if result.steps_to_goal is None:
                bracket, width = f"> {result.steps}", "-"
            else:
                bracket = f"({result.steps_lower}, {result.steps_to_goal}]"
                width = f"{(result.steps_to_goal - result.steps_lower) / max(result.steps_lower, 1):.3f}"
            ratio, cpu_ratio = wall / old_wall, cpu / old_cpu
            added = (evaluating - old_eval) / old_wall
            ratios[mode].append(ratio)
            cpu_ratios[mode].append(cpu_ratio)
            added_share[mode].append(added)
            print(f"{batch_size:>6} {mode:>7} {f'{full}+{goal_only}':>18} {bracket:>16} {width:>7} {wall:>8.2f} "
                  f"{evaluating:>7.2f} {cpu:>8.2f} {ratio:>6.2f} {cpu_ratio:>9.2f} {added:>6.1%}")
    for mode in ("replay", "dense"):
        print(f"whole trial, {mode} / old schedule: wall {min(ratios[mode]):.2f} to {max(ratios[mode]):.2f}, "
              f"CPU {min(cpu_ratios[mode]):.2f} to {max(cpu_ratios[mode]):.2f}; added evaluation time "
              f"{min(added_share[mode]):.1%} to {max(added_share[mode]):.1%} of the old trial's wall time")


if __name__ == "__main__":
    main()
