"""Every fenced block of README.md, docs/workloads.md, examples/README.md, docs/tutorial.md and docs/integrations.md,
run or checked as written.

Each document's command blocks run in document order in one fresh directory of their own (holding a
link ``examples`` to the repository's examples, so the documented relative references resolve and
``--store runs``, ``steps.png`` and the like are written there). A block is one of:

* **commands** (no info string, ``bash``): every command runs and must exit 0. Lines starting with
  ``#`` are comments (the report block's ``# report: ...`` lines show its output); a command may end
  in ``\\`` and go on on the next line, and may end in a ``# comment``. ``make TARGET`` runs as
  ``make -n TARGET`` (the recipe exists and parses: ``make demo`` takes minutes and ``make test`` is
  this suite); the install block's commands are checked for the files they name (they need a
  network or a package index).
* **synopsis**: the block's first line is ``# synopsis ...`` in the document (visible there). Each
  command is parsed, not run: every ``--flag`` it names must be listed by that subcommand's ``--help``.
  A command block with ``[`` or ``|`` in a command that is not a synopsis fails this test.
* **output** (no command at all: tables and error lines shown as output) and **toml** (parsed with
  tomllib) blocks.
* **python**: run with the repository's interpreter in the document's directory, unless its first
  line is in :data:`PYTHON_FRAGMENTS` (fragments that name objects they do not define), which must
  list only fragments that exist.

What runs on smaller settings than the text shows, and why, is :data:`SMALL` (each replacement must
match, so a stale entry fails); the files commands read are written first (:func:`_setup`).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ("README.md", "docs/workloads.md", "examples/README.md", "docs/tutorial.md", "docs/integrations.md")
BIN = Path(sys.executable).parent

#: ``{document: [(text as documented, text run instead, why)]}``: the small settings the tests run.
SMALL = {
    "README.md": [
        ("PATH/TO/batch_science", "release",
         "a synthetic release (batchlab.store.synthetic_release, 100 trials at 4 batch sizes) written by the test"),
        ("--steps-at 0,100,1000", "--steps-at 0,10 --examples 256",
         "probes: a 10-step reference run instead of 1,000 steps, 256 probe examples (default 1,024)"),
        ("--steps-at 100 --k 10", "--steps-at 10 --k 3 --examples 256", "probe spectrum: 3 eigenvalues at step 10"),
        ("--steps-at 0,50,400", "--steps-at 0,10 --examples 256", "probe branched: checkpoints 0 and 10"),
        ("--store demo/store --steps-at 100", "--store demo/store --steps-at 10 --examples 256",
         "predict: a 10-step reference run, 256 probe examples"),
        ("--store demo/store$", "--store demo/store --steps-at 10 --examples 256",
         "predict (at the end of its command): a 10-step reference run, 256 probe examples"),
        ("predict mnist/fc_64_64_64 --optimizer sgd --store demo/store",
         "predict examples/regression_mlp.py:workload --optimizer sgd --store demo/store",
         "predict against the store the test swept (the regression example; demo/store is `make demo`'s)"),
        ("--steps 3000 --stop-at-goal", "--steps 20 --stop-at-goal", "train: 20 steps"),
        ("--batch-size 64 --trials 20 --store mystore", "--batch-size 64 --trials 2 --steps 20 --store mystore",
         "study: 2 trials of 20 steps"),
    ],
    "docs/workloads.md": [],
    "examples/README.md": [],
    "docs/integrations.md": [],
    "docs/tutorial.md": [
        ("--budget-examples 1500000", "--budget-examples 300000",
         "advise (both runs, the resume included): a budget that stops after round 1 (about 1 min on 2 cores) "
         "instead of the documented run to the target (2.5 min); the same flow, stopped by the budget"),
    ],
}

#: The documents whose sweeps are analysed by their own ``analyze steps-to-result`` commands (README's read
#: the imported release; docs/integrations.md runs training loops, not sweeps).
SWEPT = ("docs/workloads.md", "examples/README.md", "docs/tutorial.md")

#: Python blocks that are fragments (they use names they do not define), by first line.
PYTHON_FRAGMENTS = {
    "from batchlab.probes import NoiseScaleTracker": "a training-loop fragment: model, loader, loss_fn are yours",
    '{"train": (x, y), "val": (x_val, y_val)}                       # a test split is optional':
        "the forms a data function may return, not a program",
    "w.load_data(train_examples=None, seed=0) -> WorkloadData   # .train, .val, .test (DataSplit; test may be None)":
        "the methods batchlab calls, with their signatures",
    "from batchlab.workloads import Workload, custom_task": "uses make_model and make_data of the example above",
    'LOG_LR = {"type": "DOUBLE", "min_value": 0.01, "max_value": 1.0, "scale": "LOG_SCALE"}':
        "uses make_model and make_data of the example above",
}


@dataclass
class Block:
    document: str
    line: int  # of the opening fence, 1-based
    info: str
    lines: list[str]

    @property
    def first(self) -> str:
        return next((text for text in self.lines if text.strip()), "")

    def __str__(self) -> str:
        return f"{self.document}:{self.line}"


def fenced_blocks(document: str) -> list[Block]:
    """The fenced blocks of ``document`` (relative to the repository root), in order."""
    blocks, current = [], None
    for number, text in enumerate((ROOT / document).read_text().splitlines(), start=1):
        if text.startswith("```"):
            if current is None:
                current = Block(document, number, text[3:].strip(), [])
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current.lines.append(text)
    assert current is None, f"{document}: unclosed fence at line {number}"
    return blocks


def commands(block: Block) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments and trailing comments removed."""
    out, pending = [], ""
    for text in block.lines:
        text = pending + text.strip()
        pending = ""
        if text.endswith("\\"):
            pending = text[:-1].rstrip() + " "
            continue
        if not text or text.startswith("#"):
            continue
        out.append(re.sub(r"\s+#\s.*$", "", text).strip())
    assert not pending, f"{block}: a continuation line ends the block"
    return out


def kind(block: Block) -> str:
    """``commands``, ``synopsis``, ``output``, ``toml`` or ``python`` (see the module docstring)."""
    if block.info == "toml":
        return "toml"
    if block.info == "python":
        return "python"
    assert block.info in ("", "bash", "sh"), f"{block}: unknown block type {block.info!r}"
    if block.first.startswith("# synopsis"):
        return "synopsis"
    found = commands(block)
    if not any(c.split()[0] in ("batchlab", "make", "python", "python3") or c.startswith(".venv/") for c in found):
        return "output"
    return "commands"


def all_blocks() -> list[Block]:
    return [block for document in DOCUMENTS for block in fenced_blocks(document)]


# --- synopsis: every flag exists --------------------------------------------------------------------

def _help_text(words: list[str]) -> str:
    """``--help`` of the batchlab subcommand ``words`` names (its leading words before any option)."""
    path = []
    for word in words[1:]:
        if word.startswith("-") or "/" in word or "." in word or word.isupper():
            break
        path.append(word)
    result = subprocess.run([str(BIN / "batchlab"), *path, "--help"], capture_output=True, text=True,
                            env=_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_synopsis_blocks_name_only_existing_flags():
    synopses = [b for b in all_blocks() if kind(b) == "synopsis"]
    assert synopses, "the documents' synopses are marked '# synopsis'"
    for block in synopses:
        for command in commands(block):
            words = command.split()
            assert words[0] == "batchlab", f"{block}: a synopsis lists batchlab commands: {command}"
            help_text = _help_text(words)
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", command):
                assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text), \
                    f"{block}: {flag} is not an option of '{' '.join(words[:3])}'"


def test_every_block_is_classified_and_no_command_is_an_unmarked_synopsis():
    seen_fragments = set()
    for block in all_blocks():
        found = kind(block)
        if found == "commands":
            for command in commands(block):
                unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", "", command)
                assert "[" not in unquoted and "|" not in unquoted, \
                    f"{block}: '{command}' is a synopsis; mark the block '# synopsis'"
        if found == "python" and block.first in PYTHON_FRAGMENTS:
            seen_fragments.add(block.first)
        if found == "toml":
            tomllib.loads("\n".join(block.lines))
    assert seen_fragments == set(PYTHON_FRAGMENTS), "PYTHON_FRAGMENTS lists blocks the documents no longer have"


# --- running the command blocks ---------------------------------------------------------------------

def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", MPLBACKEND="Agg", COLUMNS="200",
                PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")


def _small(document: str, command: str, used: set) -> str:
    """``command`` with the replacements of :data:`SMALL` (a documented text ending in ``$`` matches
    only at the end of the command)."""
    for k, (documented, instead, _) in enumerate(SMALL[document]):
        if documented.endswith("$") and command.endswith(documented[:-1]):
            command = command[:-len(documented) + 1] + instead
            used.add(k)
        elif not documented.endswith("$") and documented in command:
            command = command.replace(documented, instead)
            used.add(k)
    return command


def _setup(document: str, cwd: Path) -> None:
    """The directory a document's commands run in, with the files they read."""
    for name in ("examples", "src"):  # the documents name files under both, relative to the repository root
        (cwd / name).symlink_to(ROOT / name)
    if document != "README.md":
        return
    from batchlab.store.synthetic_release import StudyShape, generate_release

    # mnist/simple_cnn_base/sgd, 100 COMPLETE trials (the paper's first-100 default) at 4 batch sizes
    generate_release(cwd / "release", [StudyShape("mnist/simple_cnn_base/sgd", b, 100, 0, 0) for b in (16, 64, 256, 1024)],
                     total_measurements=8_000)
    (cwd / "runs.csv").write_text("workload,batch_size,trial_id,step,val/error\n"
                                  "mytrainer/mlp/sgd,16,1,0,0.9\nmytrainer/mlp/sgd,16,1,100,0.1\n"
                                  "mytrainer/mlp/sgd,64,1,0,0.9\nmytrainer/mlp/sgd,64,1,40,0.1\n")
    (cwd / "steps.csv").write_text("batch_size,steps,optimizer\n" + "".join(
        f"{b},{s},{o}\n" for o, scale in (("sgd", 1.0), ("momentum", 0.8))
        for b, s in ((16, int(scale * 4000)), (64, int(scale * 1200)), (256, int(scale * 500)),
                     (1024, int(scale * 380)))))
    (cwd / "sweep.toml").write_text('workloads = ["examples/regression_mlp.py:workload"]\noptimizers = ["sgd"]\n'
                                    'batch_sizes = [16, 64]\ntrials = 2\nsteps = 30\nworkers = 1\nstore = "sweeps"\n')
    # the store of predict and report (`make demo`'s demo/store, here the regression example swept)
    (cwd / "demo").mkdir()
    _run(cwd, "batchlab sweep examples/regression_mlp.py:workload --optimizer sgd --batch-sizes 16,64,256 "
              "--trials 2 --steps 200 --workers 1 --store demo/store")


def _run(cwd: Path, command: str) -> subprocess.CompletedProcess:
    import time

    start = time.perf_counter()
    result = subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, env=_env(),
                            timeout=400)
    print(f"{time.perf_counter() - start:6.1f} s  {command}")  # shown by pytest -s, and on a failure
    assert result.returncode == 0, f"{command}\nexit {result.returncode}\n{result.stderr[-3000:]}"
    return result


def _sweep_rows_reached(cwd: Path, command: str) -> int:
    """The rows of the sweeps (units of group ``sweep ...``) that an ``analyze steps-to-result`` command
    answers, checked to have reached the goal: the documented sweeps reach it at every batch size."""
    import json

    rows = [json.loads(text) for text in _run(cwd, command.replace(" --json", "") + " --json").stdout.splitlines()]
    sweeps = [r for r in rows if str(r.get("study_group", "")).startswith("sweep")]
    assert all(r["reached"] for r in sweeps), \
        f"{command}: not reached at {[(r['unit'], r['batch_size']) for r in sweeps if not r['reached']]}"
    return len(sweeps)


def _check_install(block: Block, command: str) -> None:
    for name in re.findall(r"-(?:c|r) (\S+)", command):
        assert (ROOT / name).is_file(), f"{block}: {command} names {name}, which does not exist"
    extras = re.findall(r"\.\[([a-z,]+)\]", command)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for extra in (e for group in extras for e in group.split(",")):
        assert extra in pyproject["project"]["optional-dependencies"], f"{block}: no extra {extra!r}"


@pytest.mark.slow
@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_command_block_runs_as_written(document, tmp_path):
    _setup(document, tmp_path)
    used: set = set()
    ran, sweep_rows = [], 0
    for block in fenced_blocks(document):
        found = kind(block)
        if found == "commands":
            for command in commands(block):
                words = shlex.split(command)
                if words[0] == "make":
                    result = subprocess.run(["make", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True)
                    assert result.returncode == 0, f"{block}: {command}: {result.stderr}"
                elif words[0] in ("python", "python3") and words[1:3] == ["-m", "venv"] or words[0].startswith(".venv/"):
                    _check_install(block, command)
                else:
                    _run(tmp_path, _small(document, command, used))
                    if words[1:3] == ["analyze", "steps-to-result"] and document != "README.md":
                        sweep_rows += _sweep_rows_reached(tmp_path, _small(document, command, used))
                ran.append(command)
        elif found == "python" and block.first not in PYTHON_FRAGMENTS:
            script = tmp_path / f"block_{block.line}.py"
            script.write_text("\n".join(block.lines) + "\n")
            _run(tmp_path, f"{shlex.quote(sys.executable)} {script.name}")
            ran.append(block.first)
    assert used == set(range(len(SMALL[document]))), "SMALL lists replacements the document no longer needs"
    assert ran
    if document in SWEPT:
        assert sweep_rows, "the documented sweeps were analysed"
