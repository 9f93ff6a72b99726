"""Wall time of the official NQM momentum grid through the command line, baseline vs working tree.

Four ``batchlab nqm sweep`` calls (momentum, p in {0, .25, .5, .75}, the official grid, the ten batch
sizes and the target of the momentum comparison figure, :mod:`batchlab.nqm.figures`), each a fresh
process, so start-up counts. The baseline is the code of commit ``48b76e7`` (``git archive 48b76e7 src``
into a temporary directory); the working tree is ``src/``. The two alternate, best of 3; the script
prints both wall times and their ratio and checks that the ``--json`` outputs are byte-identical.
Issue 10 asks for at least 2.5x. Both run in the caller's environment: with ``PYTHONDONTWRITEBYTECODE=1``
every call compiles the modules it imports, so start-up is what a command imports (docs/internals.md,
"The command line").

    OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1 .venv/bin/python benchmarks/nqm_cli_speed.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "48b76e7"
PRECONDITIONS = ("0", "0.25", "0.5", "0.75")
BATCH_SIZES = ",".join(str(2**k) for k in range(2, 21, 2))  # COMPARE_BATCH_SIZES of batchlab.nqm.figures
TARGET = "0.01"
LAUNCH = "import sys; from batchlab.cli import main; main(sys.argv[1:])"


def _args(p: str) -> list[str]:
    return ["nqm", "sweep", "--preset", "zhang2019-binned", "--optimizer", "momentum", "--precondition", p,
            "--grid", "official", "--batch-sizes", BATCH_SIZES, "--target", TARGET, "--json"]


def _run_all(src: Path) -> tuple[float, list[bytes]]:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1",
           "MPLBACKEND": "Agg"}
    outputs = []
    start = time.perf_counter()
    for p in PRECONDITIONS:
        done = subprocess.run([sys.executable, "-c", LAUNCH, *_args(p)], env=env, capture_output=True, check=True)
        outputs.append(done.stdout)
    return time.perf_counter() - start, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default=BASELINE, help="commit whose src/ is the baseline")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", args.baseline, "src"], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        sources = {"baseline": Path(tmp) / "src", "working tree": ROOT / "src"}
        times = {name: [] for name in sources}
        outputs = {}
        for _ in range(args.repeats):
            for name, src in sources.items():
                seconds, out = _run_all(src)
                times[name].append(seconds)
                if outputs.setdefault(name, out) != out:
                    raise SystemExit(f"{name}: outputs differ between repeats")
    identical = outputs["baseline"] == outputs["working tree"]
    base, new = min(times["baseline"]), min(times["working tree"])
    print(f"official momentum grid, 4 CLI calls (p = {', '.join(PRECONDITIONS)}), B = {BATCH_SIZES}, target {TARGET}")
    for name in sources:
        print(f"  {name:13s} best of {args.repeats}: {min(times[name]):.3f} s  "
              f"(all: {', '.join(f'{t:.3f}' for t in times[name])})")
    print(f"  speed-up: {base / new:.2f}x")
    print(f"  --json outputs byte-identical: {identical}")
    if not identical:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
