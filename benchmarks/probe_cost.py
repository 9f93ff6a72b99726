"""What the noise-scale tracker costs per training step, in a plain loop and in a Lightning loop.

For every built-in workload's model (``batchlab.workloads.registry.BUILTIN_NAMES``; inputs are random
tensors of the workload's shapes from ``Workload.example_batch``, since the cost of a step does not
depend on their values) at its default batch size B, SGD, each step one batch of B examples cut into
2 micro-batches of B/2 (gradient accumulation, each micro-batch loss divided by 2), seven loops on one
model are timed in segments, interleaved in rotating order:

* ``plain``: a hand-written loop (``zero_grad``, 2 forward/backward passes, ``step``): the baseline;
* ``plain+tracker``: the same with :class:`batchlab.probes.tracker.NoiseScaleTracker` updated at
  every step (its hooks see each micro-batch gradient, ``update`` reads ``.grad``);
* ``plain+every10``: the same with ``NoiseScaleTracker(..., every=10)`` (one step in 10 measured);
* ``plain+floor``: the plain loop with only the norms of all gradients an exact estimator needs
  (after each backward pass and before the step), no tracker: what is left without its Python;
* ``lightning``: a ``LightningModule`` around the same model, ``Trainer(accumulate_grad_batches=2,
  logger=False)`` without progress bar, checkpointing, model summary or validation, one CPU device:
  the baseline of the three Lightning loops;
* ``lightning+callback`` / ``lightning+every10``: the same Trainer with
  :class:`batchlab.integrations.lightning.NoiseScaleCallback` (every step / ``every=10``).

Each reported figure is the tracker's own cost per step as a fraction of the step: the median over
rounds of (segment with the tracker) / (neighbouring baseline segment of the same loop kind) - 1,
robust to other processes on a shared machine. ``+-`` is its noise: 1.25 x 1.48 x the median absolute
deviation of the per-round ratios / sqrt(rounds), about the standard error of the median. ``floor``
(plain loop only): the same loop with only the k + 1 = 3 fused norms of all gradients that any
unbiased two-batch estimator needs, no tracker. Clocks: CPU seconds of this process
(``time.process_time``, one torch thread), so other processes do not count; a Lightning segment is
timed from the start of its first measured micro-batch to the end of its last (the Trainer's setup
and 2 warm-up steps left out). The every=10 segments hold a multiple of 10 steps. Goal: under 5% at
every step; each entry is marked m (met: median + 2 noise < 5%), x (missed: median - 2 noise > 5%)
or o (open), a test fixed before the run.

Measured (2-core machine, nothing else running, CPU, torch 2.13, lightning 2.6; step = the
baseline's ms per step; full table, two reruns with the floor and their reading: docs/methods.md,
"NoiseScaleTracker", **Overhead**):

    workload                          B rnd  plain ms   every noise g every10 noise g  light ms   every noise g every10 noise g
    cifar_10/resnet_8               128   5    197.30   -0.1% ±4.3% o   +1.6% ±4.1% o    202.04   -5.5% ±1.3% m   -2.9% ±3.7% m
    fashion_mnist/simple_cnn_base   128   6    154.79   +1.1% ±0.6% m   -0.0% ±2.8% o    148.35   +5.8% ±0.6% o   +0.3% ±1.4% m
    mnist/fc_1024_1024_1024         128  15     33.58   +4.4% ±2.1% o   +0.5% ±2.7% o     33.68   +3.6% ±2.1% o   +1.5% ±3.8% o
    mnist/fc_128_128_128            128  15      1.69  +13.1% ±0.7% x   +2.6% ±1.4% o      2.38  +11.3% ±0.4% x   +3.1% ±0.8% m
    mnist/fc_256_256_256            128  15      3.60   +9.1% ±0.9% x   +1.1% ±0.8% m      4.50   +8.9% ±1.4% x   +1.5% ±1.1% m
    mnist/fc_64_64_64               128  15      1.09  +17.2% ±1.1% x   +5.3% ±1.5% o      1.78  +15.1% ±1.4% x   +4.9% ±1.0% o
    mnist/simple_cnn_base           128   6    158.15   -0.9% ±1.8% m   -0.7% ±2.8% m    149.40   -2.6% ±1.5% m   +0.6% ±3.3% o
    mnist/simple_cnn_narrow         128  15     43.14   +1.8% ±0.7% m   +0.9% ±1.2% m     44.71   +0.1% ±0.6% m   -0.3% ±0.8% m
    mnist/simple_cnn_wide           128   5    530.05   +1.6% ±1.3% m   +1.3% ±1.1% m    559.07   -4.7% ±4.5% m   -2.2% ±3.1% m
    nqm/quadratic                    16  15      0.34  +16.8% ±0.5% x   +5.0% ±0.2% o      0.95  +11.4% ±0.7% x   +6.4% ±2.2% o
    shakespeare/lstm_char            32  15     53.50   +2.1% ±0.7% m   +0.5% ±1.2% m     55.26   +0.4% ±1.3% m   -1.2% ±1.0% m
    shakespeare/transformer_char     32  11     80.83   +3.2% ±2.0% o   -0.6% ±1.8% m     82.35   +3.5% ±1.7% o   +2.2% ±1.3% m

(The floor loop was added after this run; the two reruns have it.) The noise understates the spread
between runs (negative medians; simple_cnn_narrow's plain entry +1.8%, +7.7%, +13.1% in three runs),
so docs/methods.md counts an entry as meeting the goal only when no run missed it. Missed at every
step in every run: the fc_64, fc_128, fc_256 nets and nqm/quadratic (steps of 0.3 to 4.5 ms); the
floor alone costs +5.8% to +8.5% of the fc_64 and fc_128 steps, so this benchmark cannot show that any
unbiased two-batch estimator stays under 5% there on this CPU. With every=10 every entry is met or
open.

Run (about 11 minutes): ``OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE .venv/bin/python
benchmarks/probe_cost.py``; ``--quick`` (3 rounds of short segments, a minute or two),
``--workloads mnist/fc_64_64_64,nqm/quadratic`` (a subset), ``--loops plain`` (only the plain loops,
with the floor).
What a prediction of the critical batch size costs against the measured sweep is a claim of its own:
``benchmarks/predict_cost.py``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from batchlab.probes.tracker import NoiseScaleTracker  # noqa: E402
from batchlab.workloads import get_workload  # noqa: E402
from batchlab.workloads.registry import BUILTIN_NAMES  # noqa: E402

MICRO_BATCHES = 2
EVERY = 10
WARM_STEPS = 2  # Lightning: steps of each segment before its clock starts
POOL = 4  # distinct batches cycled through


def order_of_workloads() -> list[str]:
    """Built-in workloads, by name."""
    return sorted(BUILTIN_NAMES)


def make_batches(workload, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [workload.example_batch(batch_size, seed=seed) for seed in range(POOL)]


# -- the plain loop ---------------------------------------------------------------------------------


def plain_loop(model, optimizer, loss_fn, batches, steps: int, tracker: NoiseScaleTracker | None,
               floor: bool = False) -> float:
    """CPU seconds per step of ``steps`` SGD steps, each over one batch cut into ``MICRO_BATCHES``.
    ``floor``: instead of a tracker, only the norms any unbiased two-batch estimator needs, one fused
    norm of all gradients after each backward pass and one more before the step (k + 1 full reads
    of the gradients), with no hooks and no bookkeeping."""
    params = [p for p in model.parameters() if p.requires_grad]
    start = time.process_time()
    for step in range(steps):
        x, y = batches[step % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        for xm, ym in zip(x.chunk(MICRO_BATCHES), y.chunk(MICRO_BATCHES)):
            (loss_fn(model(xm), ym) / MICRO_BATCHES).backward()
            if floor:
                torch._foreach_norm([p.grad for p in params])
        if floor:
            torch._foreach_norm([p.grad for p in params])
        if tracker is not None:
            tracker.update(model, batch_size=len(x), grad_scale=1 / MICRO_BATCHES)
        optimizer.step()
    return (time.process_time() - start) / steps


# -- the Lightning loop -----------------------------------------------------------------------------


def lightning_parts():
    """The LightningModule and clock callback classes (lightning imported only when used)."""
    import lightning.pytorch as pl

    for name in list(logging.root.manager.loggerDict):  # the Trainer's notices on every fit
        if name.startswith("lightning"):
            logging.getLogger(name).setLevel(logging.ERROR)

    class Module(pl.LightningModule):
        def __init__(self, model, loss_fn):
            super().__init__()
            self.model = model
            self.loss_fn = loss_fn

        def training_step(self, batch, batch_idx):
            x, y = batch
            return self.loss_fn(self.model(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    class Clock(pl.Callback):
        """CPU seconds from the first measured micro-batch's start to the last one's end."""

        def __init__(self, first: int, last: int):
            self.first, self.last, self.start, self.seconds = first, last, None, None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == self.first:
                self.start = time.process_time()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx == self.last:
                self.seconds = time.process_time() - self.start

    return pl, Module, Clock


def lightning_loop(model, loss_fn, micro_batches, steps: int, every: int | None) -> float:
    """CPU seconds per optimizer step of ``steps`` Lightning steps (after ``WARM_STEPS``), with a
    ``NoiseScaleCallback(every=every)`` unless ``every`` is None."""
    from batchlab.integrations.lightning import NoiseScaleCallback

    pl, Module, Clock = lightning_parts()
    total = WARM_STEPS + steps
    data = [micro_batches[i % len(micro_batches)] for i in range(total * MICRO_BATCHES)]
    loader = torch.utils.data.DataLoader(data, batch_size=None, shuffle=False)
    clock = Clock(WARM_STEPS * MICRO_BATCHES, total * MICRO_BATCHES - 1)
    callbacks = [clock] + ([] if every is None else [NoiseScaleCallback(every=every)])
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=total, max_epochs=1,
                         accumulate_grad_batches=MICRO_BATCHES, logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=0, callbacks=callbacks)
    trainer.fit(Module(model, loss_fn), train_dataloaders=loader)
    if clock.seconds is None:
        raise RuntimeError("the Lightning segment ended before its last measured micro-batch")
    return clock.seconds / steps


# -- one workload -----------------------------------------------------------------------------------


def segment_steps(per_step: float, segment_s: float) -> tuple[int, int]:
    """Steps per segment: of the every-step loops, and of the every=10 loops (a multiple of 10)."""
    steps = max(2, int(round(segment_s / max(per_step, 1e-6))))
    return steps, max(EVERY, int(math.ceil(steps / EVERY)) * EVERY)


def noise(ratios: np.ndarray) -> float:
    """About the standard error of the median of ``ratios``."""
    mad = float(np.median(np.abs(ratios - np.median(ratios))))
    return 1.2533 * 1.4826 * mad / math.sqrt(len(ratios))


def measure(name: str, loops: tuple[str, ...], segment_s: float, budget_s: float, min_rounds: int,
            max_rounds: int) -> dict:
    workload = get_workload(name)
    batch_size = workload.default_batch_size
    batches = make_batches(workload, batch_size)
    micro = [(xm, ym) for x, y in batches for xm, ym in zip(x.chunk(MICRO_BATCHES), y.chunk(MICRO_BATCHES))]
    model = workload.build_model(seed=0)  # one model for every loop: no layout differences between them
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = workload.loss

    def tracked(steps: int, every: int) -> float:
        tracker = NoiseScaleTracker(model, beta=0.99, every=every)  # hooks on for this segment only
        try:
            return plain_loop(model, optimizer, loss_fn, batches, steps, tracker)
        finally:
            tracker.remove()

    plain_loop(model, optimizer, loss_fn, batches, 2, None)  # warm up (allocator, first-call costs)
    per_step = plain_loop(model, optimizer, loss_fn, batches, 3, None)
    steps, steps10 = segment_steps(per_step, segment_s)
    table = {}
    if "plain" in loops:
        table.update({
            "plain": lambda: plain_loop(model, optimizer, loss_fn, batches, steps, None),
            "plain+tracker": lambda: tracked(steps, 1),
            "plain+floor": lambda: plain_loop(model, optimizer, loss_fn, batches, steps, None, floor=True),
            "plain+every10": lambda: tracked(steps10, EVERY),
        })
    if "lightning" in loops:
        lightning_loop(model, loss_fn, micro, 2, 1)  # warm up Lightning's first-call costs
        table.update({
            "lightning": lambda: lightning_loop(model, loss_fn, micro, steps, None),
            "lightning+callback": lambda: lightning_loop(model, loss_fn, micro, steps, 1),
            "lightning+every10": lambda: lightning_loop(model, loss_fn, micro, steps10, EVERY),
        })
    kinds = sum(1 for loop in ("plain", "lightning") if loop in loops)
    round_s = kinds * per_step * (3 * steps + steps10) * 1.5  # Lightning's own work: about half again
    rounds = int(min(max_rounds, max(min_rounds, budget_s // max(round_s, 1e-9))))
    times = {k: [] for k in table}
    names = list(table)
    for r in range(rounds):  # rotating order: each ratio compares neighbouring segments
        for key in names[r % len(names):] + names[: r % len(names)]:
            times[key].append(table[key]())
    t = {k: np.array(v) for k, v in times.items()}
    out = {"workload": name, "batch_size": batch_size, "rounds": rounds, "steps": steps, "steps10": steps10,
           "parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
           "tensors": sum(1 for p in model.parameters() if p.requires_grad)}
    for base, with_tracker, every10 in (("plain", "plain+tracker", "plain+every10"),
                                        ("lightning", "lightning+callback", "lightning+every10")):
        if base not in t:
            continue
        out[f"{base}_ms"] = 1e3 * float(np.median(t[base]))
        for label, key in (("every", with_tracker), ("every10", every10), ("floor", f"{base}+floor")):
            if key not in t:
                continue
            ratios = t[key] / t[base]
            out[f"{base}_{label}"] = float(np.median(ratios) - 1)
            out[f"{base}_{label}_noise"] = noise(ratios)
        out[f"{base}_every_us"] = 1e6 * float(np.median(t[with_tracker] - t[base]))
    return out


GOAL = 0.05
MARK = {"met": "m", "missed": "x", "open": "o"}


def verdict(median: float, noise: float) -> str:
    """The goal test of one entry, decided before the run: ``met`` when median + 2 noise < 5%,
    ``missed`` when median - 2 noise > 5%, else ``open`` (the noise does not decide it)."""
    if median + 2 * noise < GOAL:
        return "met"
    if median - 2 * noise > GOAL:
        return "missed"
    return "open"


def row(r: dict, loops: tuple[str, ...]) -> str:
    text = f"{r['workload']:<30} {r['batch_size']:>4} {r['rounds']:>3}"
    for base in ("plain", "lightning"):
        if base in loops:
            text += f" {r[f'{base}_ms']:>9.2f}"
            for label in ("every", "every10") + (("floor",) if base == "plain" else ()):
                median, spread = r[f"{base}_{label}"], r[f"{base}_{label}_noise"]
                text += f" {median:>+7.1%} ±{spread:>4.1%} {MARK[verdict(median, spread)]}"
    return text


def header(loops: tuple[str, ...]) -> str:
    text = f"{'workload':<30} {'B':>4} {'rnd':>3}"
    for base in ("plain", "lightning"):
        if base in loops:
            labels = ("every", "every10") + (("floor",) if base == "plain" else ())
            text += f" {base[:5] + ' ms':>9}" + "".join(f" {label:>7} {'noise':>5} g" for label in labels)
    return text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds of short segments (for trying it)")
    parser.add_argument("--workloads", default=None, help="comma-separated workload names (default: all built-ins)")
    parser.add_argument("--loops", default="plain,lightning", help="plain, lightning or both (comma-separated)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    names = order_of_workloads() if args.workloads is None else [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in BUILTIN_NAMES]
    if unknown:
        raise SystemExit(f"unknown workload {unknown[0]!r}; built-ins: {', '.join(sorted(BUILTIN_NAMES))}")
    loops = tuple(x.strip() for x in args.loops.split(","))
    if not loops or any(x not in ("plain", "lightning") for x in loops):
        raise SystemExit(f"--loops takes plain and/or lightning, got {args.loops!r}")
    if "lightning" in loops:
        warnings.filterwarnings("ignore")  # Lightning's advice on dataloader workers and the like
    segment_s, budget_s, min_rounds, max_rounds = (0.03, 5.0, 3, 3) if args.quick else (0.12, 40.0, 5, 15)
    print(header(loops), flush=True)
    for name in names:
        print(row(measure(name, loops, segment_s, budget_s, min_rounds, max_rounds), loops), flush=True)
    print(f"every = (loop with the tracker at every step) / (the same loop without it) - 1; "
          f"every{EVERY}: NoiseScaleTracker(every={EVERY}) / NoiseScaleCallback(every={EVERY}); floor: the "
          f"{MICRO_BATCHES + 1} full-gradient norms alone; "
          "noise: ~ standard error of the median ratio; ms: the baseline's CPU ms per step (2 micro-batches). "
          "Goal: < 5% at every step; g: m = met (median + 2 noise < 5%), x = missed (median - 2 noise > 5%), "
          "o = open (not decided by the noise).")


if __name__ == "__main__":
    main()
