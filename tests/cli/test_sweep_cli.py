"""``batchlab sweep`` on the command line: validation before anything runs, tables, budget growth."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from batchlab.sweep.config import MAX_TRIALS_PER_STUDY


def run_cli(*args, cwd=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "batchlab", "sweep", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def _one_line_error(result):
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.strip().count("\n") == 0
    assert "Traceback" not in result.stderr
    return result.stderr


def test_malformed_config_is_rejected_before_any_trial_runs(tmp_path):
    store = tmp_path / "store"
    config = tmp_path / "sweep.toml"
    config.write_text(
        f'workloads = ["mnist/fc_64_64_64"]\noptimizers = ["sgd"]\nbatch_sizes = [8]\ntrials = 2\n'
        f'store = "{store}"\nexecutor = "ray"\n'
    )
    message = _one_line_error(run_cli("--config", str(config)))
    assert "field 'executor'" in message and "'local' or 'dask'" in message
    assert not store.exists()  # nothing written

    config.write_text(f'workloads = ["mnist/fc_64_64_64"]\noptimizers = ["sgd"]\nbatch_sizes = [8, 100000]\n'
                      f'trials = 2\nstore = "{store}"\n')
    message = _one_line_error(run_cli("--config", str(config)))
    assert "batch sizes [100000] exceed the training set" in message and "allowed: 1 to 55000" in message
    assert not store.exists()


def test_missing_options_and_bad_lists(tmp_path):
    assert "missing --batch-sizes, --trials" in _one_line_error(run_cli("mnist/fc_64_64_64", "--store", str(tmp_path / "s")))
    assert "comma-separated list of integers" in _one_line_error(
        run_cli("mnist/fc_64_64_64", "--batch-sizes", "8,x", "--trials", "1", "--store", str(tmp_path / "s")))
    assert not (tmp_path / "s").exists()


def test_tables_budget_growth_and_another_sweep_kept_apart(tmp_path):
    store = tmp_path / "store"
    args = ["mnist/fc_64_64_64", "--optimizer", "sgd", "--batch-sizes", "8", "--trials", "2", "--steps", "3",
            "--train-examples", "256", "--workers", "1", "--grow-budget", "--store", str(store)]
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())  # wrapped lines joined
    assert "steps to result" in out and "this sweep's trials only" in out and "> 12" in out  # censored bracket
    assert "budget grown: mnist/fc_64_64_64/sgd b=8" in out and "with 6 steps, decay and warmup steps stretched x2" in out
    assert "with 12 steps, decay and warmup steps stretched x4" in out
    assert "12 (round 2)" in out  # the last round is the one reported
    assert "no fit for mnist/fc_64_64_64/sgd" in out  # one batch size: no S(B) fit
    assert "all studies" in result.stderr  # the progress display

    # The same store with another budget: a new study definition gets its own block of trial ids.
    args[args.index("--steps") + 1] = "5"
    result = run_cli(*args, "--json")
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    ids = sorted(e["trial_id"] for e in events if e["event"] == "trial")
    assert ids[:2] == [3 * MAX_TRIALS_PER_STUDY, 3 * MAX_TRIALS_PER_STUDY + 1]  # blocks 0-2: the first sweep
    (row,) = [e for e in events if e["event"] == "steps_to_result"]
    assert row["n_trials"] == 2 and row["budget"] == 20 and row["censored_at"] == 20


def test_budget_rule_flags(tmp_path):
    store = tmp_path / "store"
    result = run_cli("mnist/fc_64_64_64", "--batch-sizes", "8,64", "--trials", "1", "--budget-epochs", "0.5",
                     "--min-steps", "2", "--max-steps", "20", "--train-examples", "256", "--workers", "1",
                     "--no-stop-at-goal", "--store", str(store), "--json")
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    budgets = {b["batch_size"]: b["steps"] for b in events[0]["budgets"]}
    assert budgets == {8: 16, 64: 2}  # ceil(0.5 x 256 / B), floor 2
    rule = events[0]["budget_rule"]["mnist/fc_64_64_64"]
    assert rule["rule"] == "examples" and rule["examples"] == 128 and rule["min_steps"] == 2
    message = _one_line_error(run_cli("mnist/fc_64_64_64", "--batch-sizes", "8", "--trials", "1", "--steps", "5",
                                      "--budget-epochs", "2", "--store", str(tmp_path / "other")))
    assert "exclude each other" in message


def test_trials_stop_at_and_record_the_sweeps_goal(tmp_path):
    store = tmp_path / "s"
    result = run_cli("mnist/fc_64_64_64", "--optimizer", "sgd", "--batch-sizes", "64", "--trials", "1",
                     "--steps", "3", "--train-examples", "256", "--goal", "0.999", "--store", str(store), "--json")
    assert result.returncode == 0, result.stderr
    from batchlab.store import Store

    rows = Store.open(store).study_definitions("mnist/fc_64_64_64/sgd")
    assert [r["definition"]["stop_rule"]["goal"] for r in rows] == [0.999]
    trials = Store.open(store).table("trials").to_pylist()
    assert [t["status"] for t in trials] == ["STOPPED_AT_GOAL"]  # 0.999 error is beaten at the first evaluation


def test_non_finite_goal_is_rejected_before_any_trial_runs(tmp_path):
    store = tmp_path / "store"
    message = _one_line_error(run_cli("mnist/fc_64_64_64", "--batch-sizes", "8", "--trials", "1", "--steps", "2",
                                      "--train-examples", "256", "--goal", "nan", "--store", str(store)))
    assert "field 'goal': must be a finite number, got nan" in message
    assert not store.exists()


def test_resumed_sweep_progress_counts_the_trials_already_in_the_store(tmp_path):
    # A re-run that finds every trial published must not end with its bars at "0/2 done, 2 left".
    args = ["mnist/fc_64_64_64", "--optimizer", "sgd", "--batch-sizes", "8", "--trials", "2", "--steps", "2",
            "--train-examples", "256", "--workers", "1", "--no-stop-at-goal", "--store", str(tmp_path / "s")]
    assert run_cli(*args).returncode == 0
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    assert "(2 already in the store)" in result.stderr
    bars = [" ".join(line.split()) for line in result.stderr.splitlines() if "done" in line and "left" in line]
    assert bars and all("2/2 done" in bar and " 0 left" in bar for bar in bars), bars
