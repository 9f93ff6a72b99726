"""``batchlab sweep`` on the command line: validation before anything runs, tables, budget growth."""

from __future__ import annotations

import os
import subprocess
import sys


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


def test_tables_budget_growth_and_conflicting_resume(tmp_path):
    store = tmp_path / "store"
    args = ["mnist/fc_64_64_64", "--optimizer", "sgd", "--batch-sizes", "8", "--trials", "2", "--steps", "3",
            "--train-examples", "256", "--workers", "1", "--grow-budget", "--store", str(store)]
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "steps to result" in out and "not reached" in out
    assert "budget grown: mnist/fc_64_64_64/sgd b=8" in out and "with 6 steps" in out and "with 12 steps" in out
    assert "mccandlish_b_crit" in out and "no fit for mnist/fc_64_64_64/sgd" in out  # one batch size: no S(B) fit
    assert "all studies" in result.stderr  # the progress display

    # The same store with another budget: trial ids would clash, so it is refused before running.
    args[args.index("--steps") + 1] = "5"
    message = _one_line_error(run_cli(*args))
    assert "already holds trial 0 of mnist/fc_64_64_64/sgd" in message and "another --store" in message


def test_non_finite_goal_is_rejected_before_any_trial_runs(tmp_path):
    store = tmp_path / "store"
    message = _one_line_error(run_cli("mnist/fc_64_64_64", "--batch-sizes", "8", "--trials", "1", "--steps", "2",
                                      "--train-examples", "256", "--goal", "nan", "--store", str(store)))
    assert "field 'goal': must be a finite number, got nan" in message
    assert not store.exists()
