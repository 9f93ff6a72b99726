"""Raced sweeps (``race = true``): the same table as the full protocol, vectorized or one trial at a
time, and a raced sweep SIGKILLed mid-way resumes to the same store."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest

from batchlab.sweep.config import parse_sweep_config
from batchlab.sweep.executors import InlineExecutor
from batchlab.sweep.runner import prepare_sweep, run_sweep
from sweep_helpers import child_env, run_sweep_cli, store_contents, sweep_command

# SGD's learning rate over [0.01, 1] (the example file): each study searches its own points, and over
# the default [1e-3, 10] only one of 5 (or 8) points per study reaches the goal here, so nothing is raced
from pathlib import Path

SPACE_FILE = Path(__file__).resolve().parents[2] / "src/batchlab/sweep/examples/sgd_learning_rate.toml"
LEARNING_RATE = {"type": "DOUBLE", "min_value": 0.01, "max_value": 1.0, "scale": "LOG_SCALE"}
SETTINGS = {"workloads": ["mnist/fc_64_64_64"], "optimizers": ["sgd"], "batch_sizes": [32, 128], "trials": 5,
            "steps": 80, "train_examples": 512, "seed": 0, "goal": 0.5,
            "search_spaces": {"sgd": {"learning_rate": LEARNING_RATE}}}
CLI = ["mnist/fc_64_64_64", "--optimizer", "sgd", "--batch-sizes", "32,128", "--trials", "5", "--steps", "80",
       "--train-examples", "512", "--seed", "0", "--goal", "0.5", "--race", "--vectorize",
       "--search-space", str(SPACE_FILE)]


def _sweep(path, **overrides):
    config = parse_sweep_config({**SETTINGS, **overrides})
    return run_sweep(prepare_sweep(config, str(path)), executor_factory=InlineExecutor)


def _vectorized_identical_here(summary) -> bool:
    """Whether the forced vectorized studies of ``summary``'s sweep were found bit-identical to
    sequential trials on this machine (their definitions record it when not: its own study)."""
    from batchlab.store import Store

    con = Store.open(summary.store_path).connect()
    definitions = [json.loads(d) for (d,) in con.execute("select definition from studies").fetchall()]
    con.close()
    return not any("vectorized" in d for d in definitions)


def _answer(summary):
    """Per batch size: what racing must keep exact (steps, bracket, best trial, its parameters, and
    the one-sided steps interval read from the second-best trial)."""
    rows = summary.results["mnist/fc_64_64_64/sgd"]
    intervals = {r["batch_size"]: r["steps_interval"] for r in (summary.fits["mnist/fc_64_64_64/sgd"] or {}).get("regimes", [])}
    return [(r.batch_size, r.steps, r.steps_lower, r.trial_id, r.parameters, intervals.get(r.batch_size)) for r in rows]


@pytest.fixture(scope="module")
def full_and_raced(tmp_path_factory):
    root = tmp_path_factory.mktemp("race")
    return {(race, vectorize): _sweep(root / f"{race}-{vectorize}", race=race, vectorize=vectorize)
            for race, vectorize in ((False, "always"), (True, "always"))}


def test_a_raced_sweep_gives_the_full_protocols_table(full_and_raced):
    """Vectorized: all trials of a study race together. (One trial at a time, each races those run
    before it: tests/train/test_race.py and below.) Racing drops trials from the stacked computation,
    so the remaining ones compute at other stack sizes than in the full run: the same answer is
    guaranteed, to the bit, where the vectorized path is bit-identical to sequential trials at every
    stack size on this machine (the driver's self-check); where it is not, each sweep's studies say so
    in their definitions (both branches are real: which one runs is this machine's CPU's doing)."""
    full, raced = full_and_raced[(False, "always")], full_and_raced[(True, "always")]
    assert all(row[1] is not None for row in _answer(full))  # every batch size reached the goal
    identical = _vectorized_identical_here(full)
    assert _vectorized_identical_here(raced) == identical  # the same check, the same machine
    if identical:
        assert _answer(raced) == _answer(full)
    else:  # other stack sizes round otherwise: the same batch sizes, each reached, nothing more is guaranteed
        assert [row[0] for row in _answer(raced)] == [row[0] for row in _answer(full)]
        assert all(row[1] is not None for row in _answer(raced))
    statuses = raced.statuses["mnist/fc_64_64_64/sgd"]
    assert any(counts.get("RACED") for counts in statuses.values()), statuses


def test_raced_studies_are_their_own_studies(full_and_raced):
    full, raced = full_and_raced[(False, "always")], full_and_raced[(True, "always")]
    assert full.sweep_id != raced.sweep_id
    from batchlab.store import Store

    con = Store.open(raced.store_path).connect()
    definitions = [json.loads(d) for (d,) in con.execute("select definition from studies").fetchall()]
    con.close()
    assert definitions and all(d["race"] == {"keep": 2} for d in definitions)


def test_race_without_stopping_at_the_goal_is_refused():
    from batchlab.errors import BatchlabError

    with pytest.raises(BatchlabError, match="race needs trials that stop at the goal"):
        parse_sweep_config({**SETTINGS, "race": True, "stop_at_goal": False})


def test_a_raced_sweep_killed_mid_way_resumes_to_the_same_store(full_and_raced, tmp_path):
    base = store_contents(full_and_raced[(True, "always")].store_path)
    path = tmp_path / "store"
    driver = subprocess.Popen(sweep_command(*CLI, "--workers", "1", "--store", str(path), "--json"),
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=child_env())
    for line in driver.stdout:
        if json.loads(line)["event"] == "trial":  # the first study is published: kill before the second is
            driver.send_signal(signal.SIGKILL)
            break
    driver.wait(timeout=30)
    result, events = run_sweep_cli(*CLI, "--workers", "1", "--store", str(path), "--json")
    assert result.returncode == 0, result.stderr
    assert store_contents(path) == base


def test_one_trial_at_a_time_a_raced_study_is_published_trial_by_trial(full_and_raced, tmp_path):
    """Not vectorized, each trial of a raced study is its own task, sent once the one before is
    published and racing the published trials: the full protocol's table, and a sweep stopped after
    its second trial keeps both (a study is no longer published only when all its trials end)."""
    from batchlab.sweep.runner import Reporter, SweepInterrupted

    full = _sweep(tmp_path / "full", race=False, vectorize="never", trials=8)
    tasks = []

    class Recording(InlineExecutor):
        def submit(self, task):
            tasks.append(task)
            super().submit(task)

    config = parse_sweep_config({**SETTINGS, "race": True, "vectorize": "never", "trials": 8})
    raced = run_sweep(prepare_sweep(config, str(tmp_path / "raced")), executor_factory=Recording)
    assert _answer(raced) == _answer(full)
    statuses = raced.statuses["mnist/fc_64_64_64/sgd"]
    assert any(counts.get("RACED") for counts in statuses.values()), statuses
    assert len(tasks) == 16 and all(len(task.trials) == 1 for task in tasks)
    assert any(task.race_prior for task in tasks)  # later trials race the published ones

    class StopAfterTwo(Reporter):
        seen = 0

        def trial(self, progress, outcome, totals):
            self.seen += 1
            if self.seen == 2:
                raise KeyboardInterrupt

    path = tmp_path / "stopped"
    with pytest.raises(SweepInterrupted):
        run_sweep(prepare_sweep(config, str(path)), reporter=StopAfterTwo(), executor_factory=InlineExecutor)
    from batchlab.store import Store

    assert len(Store.open(path).table("trials")) == 2
    resumed = run_sweep(prepare_sweep(config, str(path)), executor_factory=InlineExecutor)
    assert _answer(resumed) == _answer(raced)
    assert store_contents(path) == store_contents(raced.store_path)
