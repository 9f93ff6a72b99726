"""What predicting the critical batch size costs, against measuring it with a sweep, in one process.

The measured sweep is the demo's (``src/batchlab/sweep/examples/demo_mnist_fc64.toml``:
``mnist/fc_64_64_64``, SGD and momentum, B = 16 ... 1024, 4 trials per study, raced, one shared batch
order per study), run through the product's own path (``prepare_sweep`` / ``run_sweep`` with the
in-process executor) into a temporary store. Then :func:`batchlab.probes.predict.predict` runs for
SGD against that store with its defaults (reference run at the workload's default batch size and the
optimizer's default learning rate, checkpoint at a quarter of the default budget, 1,024 probe
examples, the branched measurement included). Its ``progress`` calls mark where each phase starts,
so the CPU seconds of each phase are read from the same clock.

Printed, per predictor: its critical batch size and the measured one (``mccandlish_b_crit`` of the SGD
unit) with the ratio; ``examples``: the predictor's examples processed (reference run included) over
the SGD unit's sweep examples (docs/methods.md, "Predicting the critical batch size"); ``CPU``: the
predictor's CPU seconds (the reference run plus its own phases) over the CPU seconds of the whole
sweep's SGD half (the sweep's CPU times the SGD unit's share of the sweep's examples). The goal (issue
12): some predictor within 2x of the measured critical batch size at no more than 10% of the sweep's
compute.

Clocks: ``time.process_time`` of this process (one torch thread; the in-process executor trains here),
so other processes on a shared machine do not count.

Measured (shared, loaded 2-core machine; torch 2.13 CPU; the sweep 159 CPU s, its SGD half 7.1 M
examples and about 86 CPU s; predict 13.5 CPU s in all, the reference run trained to step 750):

    predictor          B_crit  measured   ratio  examples     CPU
    b_simple             2399       262    9.14      1.4%    3.8%
    b_noise               375       262    1.43      5.1%    3.8%
    calibrated_nqm     158364       262  603.35      5.6%   13.8%
    branched              128       262    0.49      2.0%    2.7%

B_noise is within 2x of the measured critical batch size at about 4-5% of the sweep's compute, and
the branched estimate within 2x at about 2-3%; B_simple (9x) and the calibrated NQM (600x) are not
(experiments/README.md, "Predictions", says why). The calibrated NQM's CPU is mostly Lanczos on the
curvature (8.5 s), not the exact engine (0.1 s).

Run (about 6 minutes of CPU): ``OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/predict_cost.py``
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import tomllib  # noqa: E402
from pathlib import Path  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "src" / "batchlab" / "sweep" / "examples" / "demo_mnist_fc64.toml"
WORKLOAD = "mnist/fc_64_64_64"
#: Which phases (``progress`` messages, by their first word) each predictor's CPU includes.
PHASES = {
    "b_simple": ("training", "noise"),
    "b_noise": ("training", "noise"),
    "calibrated_nqm": ("training", "noise", "curvature:", "tuning"),
    "branched": ("training", "branched:"),
}


def run_sweep_cpu(store: str) -> float:
    """Run the demo sweep into ``store`` in this process; its CPU seconds."""
    import torch

    torch.set_num_threads(1)
    from batchlab.sweep.config import parse_sweep_config
    from batchlab.sweep.executors import InlineExecutor
    from batchlab.sweep.runner import prepare_sweep, run_sweep

    settings = tomllib.loads(CONFIG.read_text())
    started = time.process_time()
    run_sweep(prepare_sweep(parse_sweep_config(settings), store), executor_factory=InlineExecutor)
    return time.process_time() - started


def store_examples(store: str) -> dict[str, int]:
    """Examples processed (steps x batch size) per store workload, over every trial."""
    from batchlab.store import Store

    con = Store.open(store, create=False).connect()
    try:
        return {w: int(e) for w, e in con.execute("SELECT workload, sum(steps * batch_size) FROM trials GROUP BY 1")
                .fetchall()}
    finally:
        con.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimizer", default="sgd", choices=("sgd", "momentum"))
    args = parser.parse_args()
    from batchlab.probes.predict import predict

    with tempfile.TemporaryDirectory() as root:
        store = os.path.join(root, "store")
        sweep_cpu = run_sweep_cpu(store)
        examples = store_examples(store)
        mine = f"{WORKLOAD}/{args.optimizer}"
        share = examples[mine] / sum(examples.values())
        unit_cpu = sweep_cpu * share
        marks: list[tuple[str, float]] = []
        started = time.process_time()
        result = predict(WORKLOAD, args.optimizer, store=store,
                         progress=lambda message: marks.append((message.split()[0], time.process_time())))
        total = time.process_time() - started
    ends = [t for _, t in marks[1:]] + [started + total]
    phase_cpu: dict[str, float] = {}
    for (name, begin), end in zip(marks, ends):
        phase_cpu[name] = phase_cpu.get(name, 0.0) + end - begin
    print(f"sweep {CONFIG.name}: {sweep_cpu:.0f} CPU s, {sum(examples.values())} examples; {mine}: "
          f"{examples[mine]} examples ({share:.0%}), {unit_cpu:.0f} CPU s by that share")
    print("predict phases (CPU s): " + ", ".join(f"{k} {v:.1f}" for k, v in phase_cpu.items()) + f"; total {total:.1f}")
    print(f"{'predictor':<16}{'B_crit':>9}{'measured':>10}{'ratio':>8}{'examples':>10}{'CPU':>8}")
    def show(value, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    for row in result["rows"]:
        cpu = sum(phase_cpu.get(p, 0.0) for p in PHASES.get(row["predictor"], ()))
        print(f"{row['predictor']:<16}{show(row['critical_batch_size'], '.0f'):>9}{show(row['measured'], '.0f'):>10}"
              f"{show(row['ratio'], '.2f'):>8}{show(row['compute_fraction'], '.1%'):>10}"
              f"{show(cpu / unit_cpu if row['predictor'] in PHASES else None, '.1%'):>8}")
    print("examples and CPU: fractions of the measured sweep's (its SGD half); goal: some predictor within 2x at "
          "<= 10%")


if __name__ == "__main__":
    main()
