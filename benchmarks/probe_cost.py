"""What the noise-scale tracker costs per training step, against a plain step in the same process.

For ``mnist/fc_64_64_64`` and ``mnist/simple_cnn_narrow`` (the workloads' own models; inputs are
random MNIST-shaped tensors, since the cost of a step does not depend on their values), SGD, at batch
sizes 128 and 1024 (the CNN: 64 and 256), four loops on one model are timed in short segments,
interleaved in rotating order, and each ratio is the median over rounds of neighbouring segments
(robust to other processes on a shared machine):

* ``plain``: one forward/backward of the whole batch and ``optimizer.step()``: the baseline;
* ``split``: the same batch as 2 micro-batches (gradient accumulation, each loss divided by 2);
* ``tracked``: ``split`` plus :class:`batchlab.probes.tracker.NoiseScaleTracker` (its hooks see
  each micro-batch gradient, ``update`` reads ``.grad``): the two-batch estimator, every step;
* ``every10``: the same with ``NoiseScaleTracker(..., every=10)`` (one step in 10 measured).

Printed per model and batch size: ``tracker`` = tracked / split - 1, the tracker's own cost per step
as a fraction of the step, which is all it costs a loop that already has two gradients per step
(gradient accumulation, or DistributedDataParallel where the local and the all-reduced gradients are
the two); ``split`` = split / plain - 1, what cutting a single-batch step in two costs; and
``total`` = tracked / plain - 1. Goal: ``tracker`` < 5%.

Clocks: CPU seconds of this process (``time.process_time``, one torch thread), so other processes
on a shared machine do not count.

Measured (shared 2-core machine under load, CPU, torch 2.13; 31 rounds of 0.1 s segments; the
rounds' spread puts a few percent of noise on each figure):

    workload                   B  plain ms  tracker  every10   split   total
    mnist/fc_64_64_64        128      1.24   +27.1%    +4.4%  +45.4%  +89.6%
    mnist/fc_64_64_64       1024      5.12    +8.2%    -1.0%   +9.7%  +16.6%
    mnist/simple_cnn_narrow   64     35.84    +4.9%    +1.9%   +1.5%   +4.9%
    mnist/simple_cnn_narrow  256    142.99    +3.1%    -0.7%  -11.1%   -9.7%

A measured step costs about 0.5 ms of per-call overhead on this CPU (a Python hook call per
parameter tensor per backward pass, the update's host-side arithmetic), whatever the batch size,
plus one read of every gradient per backward pass and per update (59 k parameters in the small
model, 0.82 M in the CNN). That is under the 5% goal for the CNN at every step, and for the small
fully-connected model (1-6 ms steps) with ``every=10`` (+4.4% at batch 128, within noise of 0 at
1024); measuring every step there costs +8% to +27%. Splitting a one-batch step in two costs the
small model +10% to +45% (two small matrix products per layer instead of one) and the CNN nothing
consistent (+1.5%, -11%).
Two earlier runs, before the hooks were fully cleared between measured steps, gave the same
every-step figures within 5 points.

What a prediction of the critical batch size costs against the measured sweep (the branched
estimate's compute among them) is a claim of its own: ``benchmarks/predict_cost.py``.

Run (about 5 minutes): ``OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/probe_cost.py``
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from batchlab.probes.tracker import NoiseScaleTracker  # noqa: E402
from batchlab.workloads import get_workload  # noqa: E402

BATCH_SIZES = {"mnist/fc_64_64_64": (128, 1024), "mnist/simple_cnn_narrow": (64, 256)}
MICRO_BATCHES = 2
EVERY = 10
SEGMENT_S = 0.1  # CPU seconds per timed segment
ROUNDS = 31  # segments per loop, interleaved; ratios are medians over rounds
POOL = 8  # distinct input batches cycled through


def make_data(batch_size: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(batch_size, 1, 28, 28, generator=g), torch.randint(0, 10, (batch_size,), generator=g))
            for _ in range(POOL)]


def run_loop(model, optimizer, data, steps: int, micro_batches: int, tracker: NoiseScaleTracker | None) -> float:
    """CPU seconds of ``steps`` SGD steps, each over one batch cut into ``micro_batches``."""
    start = time.process_time()
    for step in range(steps):
        x, y = data[step % len(data)]
        optimizer.zero_grad(set_to_none=True)
        if micro_batches == 1:
            F.cross_entropy(model(x), y).backward()
        else:
            for xm, ym in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
                (F.cross_entropy(model(xm), ym) / micro_batches).backward()
        if tracker is not None:
            tracker.update(model, batch_size=len(x), grad_scale=1 / micro_batches)
        optimizer.step()
    return time.process_time() - start


def measure(name: str, batch_size: int) -> dict:
    workload = get_workload(name)
    data = make_data(batch_size)
    model = workload.build_model(seed=0)  # one model for every loop: no layout differences between them
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    kept = {}

    def tracked(n: int, every: int) -> float:
        tracker = NoiseScaleTracker(model, beta=0.99, every=every)  # hooks on for this segment only
        try:
            return run_loop(model, optimizer, data, n, MICRO_BATCHES, tracker)
        finally:
            tracker.remove()
            kept["b_simple"] = tracker.b_simple

    loops = {
        "plain": lambda n: run_loop(model, optimizer, data, n, 1, None),
        "split": lambda n: run_loop(model, optimizer, data, n, MICRO_BATCHES, None),
        "tracked": lambda n: tracked(n, 1),
        "sparse": lambda n: tracked(n, EVERY),
    }
    for loop in loops.values():  # warm up (allocator, first-call costs)
        loop(EVERY)
    per_step = loops["plain"](3) / 3
    steps = max(EVERY, int(SEGMENT_S / max(per_step, 1e-6)) // EVERY * EVERY)
    times = {k: [] for k in loops}
    names = list(loops)
    for r in range(ROUNDS):  # short segments, rotating order: the ratios of neighbours, robust to load
        for key in names[r % len(names):] + names[: r % len(names)]:
            times[key].append(loops[key](steps) / steps)
    t = {k: np.array(v) for k, v in times.items()}

    def ratio(a: str, b: str) -> float:
        return float(np.median(t[a] / t[b]) - 1)

    return {
        "workload": name,
        "batch_size": batch_size,
        "steps": steps * ROUNDS,
        "plain_ms": 1e3 * float(np.median(t["plain"])),
        "tracker": ratio("tracked", "split"),
        "sparse": ratio("sparse", "split"),
        "split": ratio("split", "plain"),
        "total": ratio("tracked", "plain"),
        "b_simple": kept["b_simple"],
    }


def main() -> None:
    torch.set_num_threads(1)
    print(f"{'workload':<26} {'B':>5} {'steps':>6} {'plain ms':>9} {'tracker':>8} {f'every{EVERY}':>8} {'split':>7} "
          f"{'total':>7} {'B_simple':>9}")
    for name, sizes in BATCH_SIZES.items():
        for batch_size in sizes:
            r = measure(name, batch_size)
            print(f"{r['workload']:<26} {r['batch_size']:>5} {r['steps']:>6} {r['plain_ms']:>9.2f} {r['tracker']:>+8.1%} "
                  f"{r['sparse']:>+8.1%} {r['split']:>+7.1%} {r['total']:>+7.1%} {r['b_simple']:>9.1f}", flush=True)
    print(f"tracker = tracked/split - 1 (the tracker's own cost per step; goal < 5%); every{EVERY}: the same measuring "
          f"one step in {EVERY}; split = split/plain - 1 ({MICRO_BATCHES} micro-batches instead of one batch); "
          "total = tracked/plain - 1")


if __name__ == "__main__":
    main()
