"""Trial throughput: a batchlab trial against a minimal plain-PyTorch loop, in the same process.

For ``mnist/fc_128_128_128`` and ``mnist/simple_cnn_base`` at batch sizes 16, 256 and 4096, on the
full 55,000-example MNIST training set, SGD at a small learning rate, it prints per batch size:

* ``plain ex/s``: the loop a person would write by hand: one ``torch.randperm`` per epoch, gather
  the batch with ``index_select`` (2.5-20x faster than ``x[idx]`` on 4-d image tensors, so the
  baseline is not handicapped), ``zero_grad``/forward/cross-entropy/``backward``/``step``; model and
  optimizer built inside the timing, as a trial does.
* ``loop``: plain time / ``batchlab.train.run_trial`` time (store in a temporary directory) over the
  same number of steps, minus what the trial reports spending on evaluating and recording
  (``TrialResult.evaluation_*``: its one evaluation, at the last step, and the publish). This is the
  trainer's own cost: building model and optimizer, sampling batches, updates, divergence checks.
* ``default``: plain / a whole trial at the workload's default step budget with its default
  evaluation plan (every metric at the full steps, dense early and regular later; the workload's
  evaluation subsets; the goal is not reached at this learning rate, so the default ``replay`` of
  the goal's bracket at the resolution steps never runs), evaluations and store included, projected
  from measured parts: ``budget * loop_step + evaluations * (evaluate + record) + publish`` against
  ``budget * plain_step``. ``benchmarks/eval_resolution.py`` measures what the resolution steps add
  (replayed or dense), on whole trials that reach the goal.
* ``budget10``: the same with ``TrialSpec(eval_budget=0.1)`` (``--eval-budget 0.1``): the plan of
  :func:`batchlab.train.evaluation.budgeted_plan`, each of its evaluations measured as it runs.
* ``GFLOP/s`` and ``of mm``: the model's FLOP/s in the plain loop (matmul/conv FLOPs of forward +
  backward counted with ``torch.utils.flop_counter.FlopCounterMode``) against the machine's float32
  ``torch.mm`` rate measured in the same run.

For ``mnist/fc_128_128_128`` at batch size 16 the whole trial (default budget) is also run directly,
with the default plan and with the 10% budget, to check the projections.

Clocks: compute is timed in this process's CPU seconds (``time.process_time``; single-threaded
torch, so this is the work done, robust to other processes on a shared machine); the store's
record and publish, which wait on fsync, in wall seconds (steady state: the first publish of a
process also imports pandas through pyarrow, printed separately). Ratios are plain time / batchlab
time, so 1.0 = no overhead; each is the best of a few interleaved runs. Goal: >= 0.9.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/train_overhead.py`` (about 3 minutes unloaded).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from batchlab.store import Store  # noqa: E402
from batchlab.train import TrialSpec, run_trial  # noqa: E402
from batchlab.train.evaluation import EvaluationPlan, budgeted_plan, measure, subset_splits  # noqa: E402
from batchlab.workloads import get_workload  # noqa: E402

WORKLOADS = ("mnist/fc_128_128_128", "mnist/simple_cnn_base")
BATCH_SIZES = (16, 256, 4096)
LEARNING_RATE = 0.01
TARGET_S = 0.8  # CPU seconds per timed loop
MIN_STEPS = 3
REPEATS = 3  # 1 when one step takes over half a second
EVAL_BUDGET = 0.1
DIRECT_CHECK = ("mnist/fc_128_128_128", 16)


def plain_loop(workload, data, batch_size: int, steps: int, seed: int = 0) -> float:
    """CPU seconds for ``steps`` updates of a minimal hand-written loop (model built inside, like a trial)."""
    start = time.process_time()
    model = workload.build_model(seed=seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    x, y = data.train_x, data.train_y
    n = len(x)
    per_epoch = n // batch_size
    generator = torch.Generator().manual_seed(seed)
    permutation = None
    for step in range(steps):
        position = step % per_epoch
        if position == 0:
            permutation = torch.randperm(n, generator=generator)
        idx = permutation[position * batch_size : (position + 1) * batch_size]
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x.index_select(0, idx)), y.index_select(0, idx))
        loss.backward()
        optimizer.step()
    return time.process_time() - start


def batchlab_trial(name: str, batch_size: int, steps: int, schedule, eval_budget=None):
    """(CPU seconds of run_trial, wall seconds, its TrialResult), recording into a temporary store."""
    spec = TrialSpec(workload=name, optimizer="sgd", batch_size=batch_size, eval_budget=eval_budget,
                     hyperparameters={"learning_rate": LEARNING_RATE}, steps=steps, evaluation_steps=schedule,
                     device="cpu")  # the plain loop runs on the CPU too, also where a GPU is present
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(os.path.join(tmp, "store"), create=True)
        start, start_wall = time.process_time(), time.perf_counter()
        result = run_trial(spec, store=store)
        cpu, wall = time.process_time() - start, time.perf_counter() - start_wall
    assert result.status == "COMPLETE" and result.steps == steps, result.status
    return cpu, wall, result


def default_plan(workload, data, total_steps: int) -> EvaluationPlan:
    """The workload's own evaluation plan for a trial of ``total_steps`` (as ``prepare_trial`` builds it)."""
    sizes = {"train": len(data.train_x), "val": len(data.val_x)}
    examples = {k: n if workload.eval_examples.get(k) is None else min(n, workload.eval_examples[k])
                for k, n in sizes.items()}
    # the default refine mode, replay, measures the goal at the resolution steps only inside the bracket
    # where the goal is first met (none here: the trials run at a small learning rate)
    return EvaluationPlan(workload.full_evaluation_steps(total_steps), examples, [], workload.goal_split)


class EvaluationCost:
    """CPU seconds of one evaluation on given subset sizes (measured once per size, best of two if cheap)."""

    def __init__(self, workload, data):
        self.workload, self.model = workload, workload.build_model(seed=0)
        self.splits = {"train": (data.train_x, data.train_y), "val": (data.val_x, data.val_y)}
        self._seconds: dict[tuple, float] = {}

    def __call__(self, examples: dict[str, int]) -> float:
        key = tuple(sorted(examples.items()))
        if key not in self._seconds:
            cut = subset_splits({k: v for k, v in self.splits.items() if k in examples}, examples)
            best = float("inf")
            for _ in range(2):
                start = time.process_time()
                measure(self.workload, self.model, cut)
                best = min(best, time.process_time() - start)
                if best > 1.0:
                    break
            self._seconds[key] = best
        return self._seconds[key]


def store_costs(name: str, metrics: dict[str, float], trials: int = 5, records: int = 30) -> dict[str, float]:
    """Wall and CPU seconds of the store: per record, per publish (steady state) and the first publish."""
    costs = {"record_wall": float("inf"), "record_cpu": float("inf"), "publish_wall": float("inf"),
             "publish_cpu": float("inf")}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(os.path.join(tmp, "store"), create=True)
        for trial in range(trials):
            writer = store.trial_writer(workload=f"{name}/sgd", batch_size=1, trial_id=trial + 1,
                                        trial_key=f"k{trial}", parameters={"learning_rate": LEARNING_RATE})
            start, start_cpu = time.perf_counter(), time.process_time()
            for step in range(records):
                writer.record(step, metrics)
            costs["record_wall"] = min(costs["record_wall"], (time.perf_counter() - start) / records)
            costs["record_cpu"] = min(costs["record_cpu"], (time.process_time() - start_cpu) / records)
            start, start_cpu = time.perf_counter(), time.process_time()
            writer.finish(status="COMPLETE", steps=records)
            wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
            if trial == 0:
                costs["first_publish_wall"] = wall
            else:
                costs["publish_wall"] = min(costs["publish_wall"], wall)
                costs["publish_cpu"] = min(costs["publish_cpu"], cpu)
    return costs


def flops_per_example(workload, data) -> float:
    """Matmul/conv FLOPs of one forward + backward pass, per example (counted at batch 16)."""
    model = workload.build_model(seed=0)
    x, y = data.train_x[:16], data.train_y[:16]
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), y).backward()
    return counter.get_total_flops() / 16


def matmul_rate(n: int = 1024, seconds: float = 1.0) -> float:
    """float32 FLOP/s of ``torch.mm`` on n x n matrices (best CPU time of the repetitions)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best, spent = float("inf"), 0.0
    while spent < seconds:
        start = time.process_time()
        torch.mm(a, b)
        elapsed = time.process_time() - start
        best, spent = min(best, elapsed), spent + elapsed
    return 2 * n**3 / best


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); SGD lr={LEARNING_RATE}; "
          f"best of {REPEATS} (1 above 0.5 s per step); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    mm = matmul_rate()
    print(f"torch.mm float32 1024x1024: {mm / 1e9:.1f} GFLOP/s")
    ratios = []
    for name in WORKLOADS:
        workload = get_workload(name)
        data = workload.load_data()
        per_example = flops_per_example(workload, data)
        budget = workload.default_steps
        plan = default_plan(workload, data, budget)
        evaluation_cpu = EvaluationCost(workload, data)
        metrics = measure(workload, workload.build_model(seed=0), subset_splits(evaluation_cpu.splits, {"train": 10, "val": 10}))
        store = store_costs(name, metrics)
        print(f"\n{name}: {per_example / 1e6:.2f} MFLOP per example (forward + backward); default budget {budget} "
              f"steps, {len(plan.steps)} evaluations of {plan.examples}, each {evaluation_cpu(plan.examples):.3f} CPU s, "
              f"and {len(plan.goal_only_steps())} of the goal split alone")
        print(f"  store: record {store['record_wall'] * 1e3:.2f} ms wall ({store['record_cpu'] * 1e3:.2f} ms CPU); "
              f"publish {store['publish_wall'] * 1e3:.1f} ms wall ({store['publish_cpu'] * 1e3:.1f} ms CPU); "
              f"first publish of the process {store['first_publish_wall']:.3f} s wall")
        print(f"{'B':>5} {'steps':>5} {'plain ex/s':>11} {'loop':>6} {'default':>8} {'eval %':>6} {'budget10':>8} "
              f"{'eval %':>6}  {'budget10 plan':<34} {'GFLOP/s':>8} {'of mm':>6}")
        for batch_size in BATCH_SIZES:
            calibration = plain_loop(workload, data, batch_size, 1)  # also warms up allocations
            if calibration < 0.1:  # one step is mostly building the model: time the steps themselves
                calibration = max((plain_loop(workload, data, batch_size, 21) - calibration) / 20, 1e-6)
            steps = max(MIN_STEPS, round(TARGET_S / calibration))
            plain_s, loop_s = [], []
            for _ in range(REPEATS if calibration < 0.5 else 1):  # interleaved, so both see the same machine
                plain_s.append(plain_loop(workload, data, batch_size, steps))
                cpu, _, result = batchlab_trial(name, batch_size, steps, [steps])
                loop_s.append(cpu - result.evaluation_cpu_s)
            plain_step, loop_step = min(plain_s) / steps, min(loop_s) / steps
            row = []
            for chosen in (plan, budgeted_plan(plan, EVAL_BUDGET, batch_size, budget)):
                goal_only = {chosen.goal_split: chosen.examples[chosen.goal_split]}
                evaluating = (len(chosen.steps) * (evaluation_cpu(chosen.examples) + store["record_wall"])
                              + len(chosen.goal_only_steps()) * (evaluation_cpu(goal_only) + store["record_wall"])
                              + store["publish_wall"])
                projected = budget * loop_step + evaluating
                row.append((budget * plain_step / projected, evaluating / projected, chosen))
            (default_ratio, default_share, _), (budget_ratio, budget_share, thin) = row
            gflops = per_example * batch_size / plain_step / 1e9
            ratios.append((plain_step / loop_step, default_ratio, budget_ratio))
            described = f"{len(thin.steps)}+{len(thin.goal_only_steps())} evals x {thin.examples['train']}+{thin.examples['val']} ex"
            print(f"{batch_size:>5} {steps:>5} {batch_size / plain_step:>11.0f} {plain_step / loop_step:>6.3f} "
                  f"{default_ratio:>8.3f} {100 * default_share:>5.1f}% {budget_ratio:>8.3f} {100 * budget_share:>5.1f}%  "
                  f"{described:<34} {gflops:>8.2f} {gflops * 1e9 / mm:>6.1%}")
            if (name, batch_size) == DIRECT_CHECK:
                plain_budget, whole = [], {"default": [], "budget10": []}
                for _ in range(2):  # interleaved; best of two of each
                    plain_budget.append(plain_loop(workload, data, batch_size, budget))
                    for label, eval_budget in (("default", None), ("budget10", EVAL_BUDGET)):
                        cpu, wall, result = batchlab_trial(name, batch_size, budget, None, eval_budget)
                        # CPU of the trial plus the store's waits (wall minus CPU of its records and publish)
                        waits = len(result.measurements) * (store["record_wall"] - store["record_cpu"]) + (
                            store["publish_wall"] - store["publish_cpu"])
                        whole[label].append((cpu + waits, len(result.measurements), result.wall_time_s))
                for label, projected_ratio in (("default", default_ratio), ("budget10", budget_ratio)):
                    seconds, evaluations, wall = min(whole[label])
                    print(f"      direct check, whole {label} trial: ratio {min(plain_budget) / seconds:.3f} "
                          f"(projected {projected_ratio:.3f}), {evaluations} evaluations, {wall:.2f} s wall")
    print("\nloop = plain / run_trial without evaluating and recording; default = plain / whole trial at the default "
          f"budget and plan (projected); budget10 = the same with eval_budget={EVAL_BUDGET}; eval % = evaluation + "
          "store share of that trial; goal >= 0.9")
    print(f"worst loop ratio {min(r[0] for r in ratios):.3f}; worst default ratio {min(r[1] for r in ratios):.3f}; "
          f"worst budget10 ratio {min(r[2] for r in ratios):.3f}")


if __name__ == "__main__":
    main()
