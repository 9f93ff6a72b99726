"""Trial throughput: a batchlab trial against a minimal plain-PyTorch loop, in the same process.

For ``mnist/fc_128_128_128`` and ``mnist/simple_cnn_base`` at batch sizes 16, 256 and 4096, on the
full 55,000-example MNIST training set, SGD at a small learning rate:

* ``plain``: the loop a person would write by hand: one ``torch.randperm`` per epoch, gather the
  batch with ``index_select`` (2.5-20x faster than ``x[idx]`` on 4-d image tensors, so the baseline
  is not handicapped), ``zero_grad``/forward/cross-entropy/``backward``/``step``; model and optimizer
  built inside the timing, as a trial does. Examples per second.
* ``loop``: ``batchlab.train.run_trial`` (store in a temporary directory) over the same number of
  steps, timed from outside, minus what it reports spending on evaluating and recording
  (``TrialResult.evaluation_*``: its one evaluation, at the last step, and the publish). This is the
  trainer's own cost: building model and optimizer, sampling batches, updates, divergence checks.
* ``default``: a whole trial at the workload's default budget with its default evaluation schedule
  (dense early, regular later), evaluations and store included, projected from measured parts:
  ``budget * loop_step + evaluations * (evaluate + record) + publish``, against ``budget * plain_step``.
  For ``mnist/fc_128_128_128`` at batch size 16 the whole default trial is also run directly, to
  check the projection.

Clocks: compute is timed in this process's CPU seconds (``time.process_time``; single-threaded
torch, so this is the work done, robust to other processes on a shared machine); the store's
record and publish, which wait on fsync, in wall seconds. Ratios are plain time / batchlab time,
so 1.0 = no overhead; each is the best of ``REPEATS`` interleaved runs. Goal: >= 0.9.

Also printed: the model's FLOP/s in the plain loop (matmul/conv FLOPs of forward + backward counted
with ``torch.utils.flop_counter.FlopCounterMode``) against the machine's float32 ``torch.mm`` rate
measured in the same run.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/train_overhead.py`` (a few minutes unloaded).
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
from batchlab.train.evaluation import measure  # noqa: E402
from batchlab.workloads import get_workload  # noqa: E402

WORKLOADS = ("mnist/fc_128_128_128", "mnist/simple_cnn_base")
BATCH_SIZES = (16, 256, 4096)
LEARNING_RATE = 0.01
TARGET_S = 1.0  # CPU seconds per timed loop
MIN_STEPS = 2
REPEATS = 5  # 2 when one step takes over half a second
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


def batchlab_trial(name: str, batch_size: int, steps: int, schedule):
    """(CPU seconds of run_trial, its TrialResult), recording into a temporary store."""
    spec = TrialSpec(workload=name, optimizer="sgd", batch_size=batch_size,
                     hyperparameters={"learning_rate": LEARNING_RATE}, steps=steps, evaluation_steps=schedule)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(os.path.join(tmp, "store"), create=True)
        start = time.process_time()
        result = run_trial(spec, store=store)
        cpu = time.process_time() - start
    assert result.status == "COMPLETE" and result.steps == steps, result.status
    return cpu, result


def evaluation_costs(workload, data, repeats: int = 2) -> tuple[float, float, float]:
    """(CPU s of one evaluation, wall s of recording it, wall s of publishing a trial), best of ``repeats``."""
    model = workload.build_model(seed=0)
    splits = {"train": (data.train_x, data.train_y), "val": (data.val_x, data.val_y)}
    evaluate_cpu = record_wall = float("inf")
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(os.path.join(tmp, "store"), create=True)
        writer = store.trial_writer(workload=f"{workload.name}/sgd", batch_size=1, trial_id=1, trial_key="k",
                                    parameters={})
        for step in range(repeats):
            start = time.process_time()
            metrics = measure(workload, model, splits)
            evaluate_cpu = min(evaluate_cpu, time.process_time() - start)
            start = time.perf_counter()
            writer.record(step, metrics)
            record_wall = min(record_wall, time.perf_counter() - start)
        start = time.perf_counter()
        writer.finish(status="COMPLETE", steps=repeats)
        publish_wall = time.perf_counter() - start
    return evaluate_cpu, record_wall, publish_wall


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
          f"best of {REPEATS} (2 above 0.5 s per step); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    mm = matmul_rate()
    print(f"torch.mm float32 1024x1024: {mm / 1e9:.1f} GFLOP/s")
    ratios = []
    for name in WORKLOADS:
        workload = get_workload(name)
        data = workload.load_data()
        per_example = flops_per_example(workload, data)
        evaluate_cpu, record_wall, publish_wall = evaluation_costs(workload, data)
        budget = workload.default_steps
        evaluations = len(workload.evaluation_steps(budget))
        print(f"\n{name}: {per_example / 1e6:.2f} MFLOP per example (forward + backward); one evaluation "
              f"{evaluate_cpu:.3f} s + record {record_wall * 1e3:.1f} ms; publish {publish_wall:.3f} s; "
              f"default budget {budget} steps, {evaluations} evaluations")
        print(f"{'B':>5} {'steps':>5} {'plain ex/s':>11} {'loop':>6} {'default':>8} {'eval %':>6} "
              f"{'GFLOP/s':>8} {'of mm':>6}")
        for batch_size in BATCH_SIZES:
            plain_loop(workload, data, batch_size, 1)  # warm up allocations
            calibration = plain_loop(workload, data, batch_size, 1)
            steps = max(MIN_STEPS, round(TARGET_S / max(calibration, 1e-6)))
            plain_s, loop_s = [], []
            for _ in range(REPEATS if calibration < 0.5 else 2):  # interleaved, so both see the same machine
                plain_s.append(plain_loop(workload, data, batch_size, steps))
                cpu, result = batchlab_trial(name, batch_size, steps, [steps])
                loop_s.append(cpu - result.evaluation_cpu_s)
            plain_step, loop_step = min(plain_s) / steps, min(loop_s) / steps
            evaluating = evaluations * (evaluate_cpu + record_wall) + publish_wall
            projected = budget * loop_step + evaluating
            default_ratio = budget * plain_step / projected
            gflops = per_example * batch_size / plain_step / 1e9
            ratios.append((plain_step / loop_step, default_ratio))
            print(f"{batch_size:>5} {steps:>5} {batch_size / plain_step:>11.0f} {plain_step / loop_step:>6.3f} "
                  f"{default_ratio:>8.3f} {100 * evaluating / projected:>5.1f}% {gflops:>8.2f} {gflops * 1e9 / mm:>6.1%}")
            if (name, batch_size) == DIRECT_CHECK:
                cpu, result = batchlab_trial(name, batch_size, budget, None)
                measured = cpu + len(result.measurements) * record_wall + publish_wall
                plain_budget = plain_loop(workload, data, batch_size, budget)
                print(f"      direct check, whole default trial: ratio {plain_budget / measured:.3f} "
                      f"(projected {default_ratio:.3f}), {len(result.measurements)} evaluations")
    print("\nloop = plain / run_trial without evaluating and recording; default = plain / whole trial at the "
          "default budget and schedule (projected); eval % = evaluation + store share of that trial; goal >= 0.9")
    print(f"worst loop ratio {min(r[0] for r in ratios):.3f}; worst default-schedule ratio {min(r[1] for r in ratios):.3f}")


if __name__ == "__main__":
    main()
