"""``batchlab sweep`` on the command line: validation before anything runs, tables, budget growth."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from batchlab.sweep.config import MAX_TRIALS_PER_STUDY, SweepConfig


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
    # off a terminal: a progress line after every trial here (not only at the end), counting grown rounds
    assert "progress: 1/2 trials done" in result.stderr and "progress: 6/6 trials done" in result.stderr

    # The same store with another budget: a new study definition gets its own block of trial ids.
    args[args.index("--steps") + 1] = "5"
    result = run_cli(*args, "--json")
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    ids = sorted(e["trial_id"] for e in events if e["event"] == "trial")
    assert ids[:2] == [3 * MAX_TRIALS_PER_STUDY + 1, 3 * MAX_TRIALS_PER_STUDY + 2]  # blocks 0-2: the first sweep
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
    lines = [line for line in result.stderr.splitlines() if line.startswith("progress:")]
    assert lines and all("2/2 trials done" in line and " 0 left" in line for line in lines), lines


TINY = ["mnist/fc_64_64_64", "--optimizer", "sgd", "--batch-sizes", "8,64", "--trials", "2", "--steps", "4",
        "--train-examples", "256", "--workers", "1", "--no-stop-at-goal", "--no-vectorize"]


def _strict_json(text):
    """JSON lines parsed strictly: NaN and Infinity are not JSON."""
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return [json.loads(line, parse_constant=refuse) for line in text.splitlines() if line.strip()]


def test_ctrl_c_exits_130_with_one_line_and_the_rerun_resumes(tmp_path):
    store = tmp_path / "store"
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    # trials long enough (1,000 steps, about 1.3 s each here) that the sweep cannot finish between the
    # first trial's line and the signal on a loaded machine
    slow = list(TINY)
    slow[slow.index("--steps") + 1] = "1000"
    # the child gets SIGINT's default action back: a shell without job control starts background
    # commands (a test run with `&`) with SIGINT ignored, and children inherit that; Python then
    # installs no KeyboardInterrupt handler and the sweep would run to the end and exit 0
    driver = subprocess.Popen([sys.executable, "-m", "batchlab", "sweep", *slow, "--store", str(store), "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in driver.stdout:
        if json.loads(line)["event"] == "trial":  # the first trial is saved: Ctrl-C
            driver.send_signal(signal.SIGINT)
            break
    rest, err = driver.communicate(timeout=120)
    assert driver.returncode == 130, err
    saved = [line for line in err.splitlines() if line.startswith("interrupted")]
    assert len(saved) == 1 and "Traceback" not in err
    assert saved[0].endswith("trials saved; re-run the same command to resume")
    n = int(saved[0].split()[1])
    from batchlab.store import Store

    assert 1 <= n < 4 and len(Store.open(store).table("trials")) == n
    result = run_cli(*slow, "--store", str(store), "--json")
    assert result.returncode == 0, result.stderr
    events = _strict_json(result.stdout)
    assert events[0]["finished_before"] == n
    assert len([e for e in events if e["event"] == "trial"]) == 4 - n
    assert sorted(t["trial_id"] for t in Store.open(store).table("trials").to_pylist()) == [1, 1, 2, 2]


def test_tables_in_a_pipe_keep_workload_names_and_study_ids_whole(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update(OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    result = subprocess.run([sys.executable, "-m", "batchlab", "sweep", *TINY, "--goal", "0.99", "--store",
                             str(tmp_path / "s")], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if "mnist/fc_64_64_64/sgd" in line and "#" in line]
    assert len(rows) == 2, result.stdout  # one row per batch size: the whole workload name, the best trial
    from batchlab.store import Store

    study_ids = {d["study_id"] for d in Store.open(tmp_path / "s").study_definitions()}
    assert all(any(sid in row for sid in study_ids) for row in rows)
    assert "…" not in result.stdout
    assert "created a new store at" in result.stderr


def test_store_under_a_missing_directory_is_one_line_and_creates_nothing(tmp_path):
    store = tmp_path / "missing" / "store"
    message = _one_line_error(run_cli(*TINY, "--store", str(store)))
    assert "does not exist" in message and str(tmp_path / "missing") in message
    assert not (tmp_path / "missing").exists()


def test_bad_device_is_one_line_before_anything_runs(tmp_path):
    message = _one_line_error(run_cli(*TINY, "--device", "tpu", "--store", str(tmp_path / "s")))
    assert "'tpu'" in message and "cuda:N" in message
    assert not (tmp_path / "s").exists()


def test_json_output_is_strict_json_even_when_trials_diverge(tmp_path):
    config = tmp_path / "sweep.toml"
    config.write_text(textwrap.dedent(f"""\
        workloads = ["mnist/fc_64_64_64"]
        optimizers = ["sgd"]
        batch_sizes = [8, 64]
        trials = 1
        steps = 4
        train_examples = 256
        workers = 1
        store = "{tmp_path / 'store'}"
        [search_spaces.sgd.learning_rate]
        type = "DOUBLE"
        min_value = 1e6
        max_value = 1e7
        scale = "LOG_SCALE"
        """))
    result = run_cli("--config", str(config), "--json")
    assert result.returncode == 0, result.stderr
    events = _strict_json(result.stdout)
    assert {e["status"] for e in events if e["event"] == "trial"} == {"INFEASIBLE"}
    assert events[-1]["event"] == "done"


def test_help_points_to_the_readme_and_lists_every_config_key():
    from batchlab.cli.sweep import CONFIG_KEYS

    assert set(CONFIG_KEYS) == set(SweepConfig.model_fields)
    result = run_cli("--help")
    text = " ".join(result.stdout.split())
    assert "README.md" in text and "Sweep config files" in text and "mnist_fc128_sgd_momentum.toml" in text
    assert all(key in text for key in CONFIG_KEYS)


def test_readme_documents_every_config_key_and_the_example_file():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("### Sweep config files", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    assert "src/batchlab/sweep/examples/mnist_fc128_sgd_momentum.toml" in section
    missing = [key for key in SweepConfig.model_fields if f"`{key}`" not in section]
    assert not missing, missing


USER_WORKLOAD = """
import torch
from torch import nn

from batchlab.workloads import Workload, regression


def make_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(320, 4, generator=g)
    y = x.sum(dim=1)
    return {"train": (x[:256], y[:256]), "val": (x[256:], y[256:])}


def workload():
    return Workload(name="toy/linear_long_name_for_tables", summary="a linear model", task=regression(),
                    make_model=lambda: nn.Sequential(nn.Linear(4, 1), nn.Flatten(0)), data=make_data,
                    metric="val/mse", goal=0.5, default_steps=4, default_batch_size=8)
"""


def test_a_workload_given_by_file_reference_sweeps_on_pool_workers(tmp_path):
    path = tmp_path / "toy.py"
    path.write_text(USER_WORKLOAD)
    reference = f"{path}:workload"
    result = run_cli(reference, "--optimizer", "sgd", "--batch-sizes", "8,16", "--trials", "2", "--steps", "3",
                     "--workers", "1", "--store", str(tmp_path / "s"), "--json")
    assert result.returncode == 0, result.stderr
    events = _strict_json(result.stdout)
    trials = [e for e in events if e["event"] == "trial"]
    assert len(trials) == 4 and {t["workload"] for t in trials} == {"toy/linear_long_name_for_tables/sgd"}
    assert all(t["trial_key"].startswith("toy/linear_long_name_for_tables/sgd|") for t in trials)
    # bad references: one line, exit 2, nothing written
    for bad, fragment in ((f"{tmp_path / 'nope.py'}:workload", "nope.py"), (f"{path}:missing", "missing")):
        message = _one_line_error(run_cli(bad, "--batch-sizes", "8", "--trials", "1", "--store",
                                          str(tmp_path / "t")))
        assert fragment in message
    assert not (tmp_path / "t").exists()


def test_a_workload_registered_in_this_process_only_is_refused_by_pool_workers(tmp_path):
    import dataclasses

    from batchlab.errors import BatchlabError
    from batchlab.sweep import SweepConfig as Config, prepare_sweep, run_sweep
    from batchlab.workloads import get_workload

    local = dataclasses.replace(get_workload("mnist/fc_64_64_64"), name="mnist/fc_local_only")
    config = Config(workloads=[local], optimizers=["sgd"], batch_sizes=[8], trials=1, steps=2, train_examples=256)
    assert config.workloads == ["mnist/fc_local_only"]
    plan = prepare_sweep(config, str(tmp_path / "s"))
    with pytest.raises(BatchlabError, match="registered in this process only"):
        run_sweep(plan)
    assert not (tmp_path / "s").exists()


def test_only_batch_sizes_runs_a_part_of_the_same_sweep(tmp_path):
    """--only-batch-sizes (and --only-optimizers) run some studies first; the whole sweep run afterwards finds them
    (same sweep id and trial keys) and runs only the rest."""
    store = tmp_path / "store"
    args = ["mnist/fc_64_64_64", "--optimizer", "sgd", "--batch-sizes", "8,16", "--trials", "2", "--steps", "3",
            "--train-examples", "256", "--workers", "1", "--store", str(store), "--json"]
    bad = run_cli(*args, "--only-batch-sizes", "16,32")
    assert "--only-batch-sizes 32: not in this sweep; allowed: 8, 16" in _one_line_error(bad)
    bad = run_cli(*args, "--only-optimizers", "adam")
    assert "--only-optimizers adam: not in this sweep; allowed: sgd" in _one_line_error(bad)
    assert not store.exists()

    def events(result):
        assert result.returncode == 0, result.stderr
        return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]

    part = events(run_cli(*args, "--only-batch-sizes", "16", "--only-optimizers", "sgd"))
    whole = events(run_cli(*args))
    (plan_part,), (plan_whole,) = [[e for e in ev if e["event"] == "plan"] for ev in (part, whole)]
    assert plan_part["sweep"] == plan_whole["sweep"]
    assert (plan_part["trials"], plan_whole["trials"], plan_whole["finished_before"]) == (2, 4, 2)
    assert sorted(e["batch_size"] for e in part if e["event"] == "trial") == [16, 16]
    assert sorted(e["batch_size"] for e in whole if e["event"] == "trial") == [8, 8]  # 16 was found in the store


def test_a_config_that_is_not_utf8_is_one_line_and_writes_nothing(tmp_path):
    config = tmp_path / "sweep.toml"
    config.write_bytes(f'workloads = ["mnist/fc_64_64_64"]\nstore = "{tmp_path / "store"}"\n# caf'.encode()
                       + b"\xe9\n")
    message = _one_line_error(run_cli("--config", str(config)))
    assert "is not UTF-8 text (byte 0xe9" in message and "sweep.toml" in message
    assert not (tmp_path / "store").exists()


def test_config_workload_and_search_space_combine_the_command_line_winning(tmp_path):
    store = tmp_path / "store"
    config = tmp_path / "sweep.toml"
    config.write_text(textwrap.dedent(f"""\
        workloads = ["mnist/fc_128_128_128"]
        optimizers = ["sgd", "momentum"]
        batch_sizes = [8]
        trials = 2
        steps = 2
        train_examples = 256
        workers = 1
        stop_at_goal = false
        store = "{store}"
        [search_spaces.sgd.learning_rate]
        type = "DOUBLE"
        min_value = 1e-3
        max_value = 10.0
        scale = "LOG_SCALE"
        """))
    space = tmp_path / "space.json"
    space.write_text('{"learning_rate": {"type": "DOUBLE", "min_value": 0.05, "max_value": 0.1, "scale": "LOG"}}')
    bad = tmp_path / "bad.json"
    bad.write_text('{"learning_rate": {"type": "DOUBLE", "min_value": 0.05}}')
    message = _one_line_error(run_cli("mnist/fc_64_64_64", "--config", str(config), "--optimizer", "sgd",
                                      "--search-space", str(bad)))
    assert "search-space file" in message and "needs min_value and max_value (missing max_value)" in message
    assert not store.exists()

    result = run_cli("mnist/fc_64_64_64", "--config", str(config), "--optimizer", "sgd", "--search-space", str(space),
                     "--json")
    assert result.returncode == 0, result.stderr
    from batchlab.store import Store

    (row,) = Store.open(store).study_definitions()
    assert row["definition"]["workload"] == "mnist/fc_64_64_64/sgd"  # WORKLOAD and --optimizer beat the file's
    assert row["definition"]["search_space"] == {
        "learning_rate": {"type": "DOUBLE", "min_value": 0.05, "max_value": 0.1, "scale": "LOG_SCALE"}}
    rates = [json.loads(t["parameters"])["learning_rate"] for t in Store.open(store).table("trials").to_pylist()]
    assert len(rates) == 2 and all(0.05 <= r <= 0.1 for r in rates)
