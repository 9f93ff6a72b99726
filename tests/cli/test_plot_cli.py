"""``batchlab plot ...``: every figure command writes a PNG from an imported release-format store."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from analysis_fixtures import trial, write_release  # noqa: E402

from batchlab.cli import main  # noqa: E402
from cli_runner import run  # noqa: E402

NESTEROV = "mnist/simple_cnn_base/nesterov_momentum"
SGD = "mnist/fc_1024/sgd"
E = "val/classification_error"
PNG = b"\x89PNG\r\n\x1a\n"


def build_trials():
    trials = []
    for workload, b_crit in ((NESTEROV, 64), (SGD, 8)):
        for b in (1, 4, 16, 64, 256):
            for t in (1, 2, 3):
                hit = int(300 * (1 + b_crit / b) * (1 + 0.2 * t))
                params = {"learning_rate": 0.001 * b * t}
                if workload == NESTEROV:
                    params["momentum"] = 1 - 10.0 ** (-t)
                status = "INFEASIBLE" if t == 3 and b == 256 else "COMPLETE"
                rows = [(hit // 4, {E: 0.3}), (hit, {E: 0.009}), (3 * hit, {E: 0.004})]
                trials.append(trial(workload, b, t, rows, status=status, **params))
    return trials


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    root = write_release(tmp_path_factory.mktemp("release") / "batch_science", build_trials())
    path = tmp_path_factory.mktemp("store") / "store"
    main(["import", "batch-science", str(root), "--store", str(path), "--json"])
    return path


@pytest.mark.parametrize(
    "command, args",
    [
        ("steps-to-result", ["--workload", NESTEROV, "--metric", E, "--goal", "0.01", "--bootstrap", "20"]),
        ("compare-workloads", ["--workload", NESTEROV, "--workload", SGD, "--metric", E, "--goal", "0.01",
                               "--reference-batch-size", "4"]),
        ("goals", ["--workload", NESTEROV, "--metric", E, "--goal", "0.01", "--goal", "0.005", "--no-fit"]),
        ("metaparameters", ["--workload", NESTEROV, "--metric", E, "--goal", "0.01"]),
        ("lr-momentum", ["--workload", NESTEROV, "--metric", E, "--goal", "0.01", "--batch-size", "1",
                         "--batch-size", "256"]),
        ("best-measurement", ["--workload", SGD, "--metric", E, "--step-budget", "500", "--step-budget", "5000"]),
    ],
)
def test_every_plot_command_writes_a_png(capsys, store_dir, tmp_path, command, args):
    out_file = tmp_path / f"{command}.png"
    code, out, err = run(capsys, "plot", command, "--store", str(store_dir), *args, "--out", str(out_file))
    assert code == 0, err
    assert out.strip() == str(out_file)
    assert out_file.read_bytes()[:8] == PNG
    assert [p.name for p in tmp_path.iterdir()] == [out_file.name]


@pytest.mark.parametrize(
    "command, args, message",
    [
        ("steps-to-result", ["--workload", NESTEROV, "--metric", E, "--goal", "0.01", "--out", "{tmp}/f.jpg"],
         "must end in one of"),
        ("steps-to-result", ["--workload", "mnist/nope/sgd", "--metric", E, "--goal", "0.01", "--out", "{tmp}/f.png"],
         "unknown workload"),
        ("compare-workloads", ["--workload", NESTEROV, "--workload", SGD, "--metric", E, "--goal", "0.01",
                               "--goal", "0.02", "--goal", "0.03", "--out", "{tmp}/f.png"], "give --goal once"),
        ("lr-momentum", ["--workload", SGD, "--metric", E, "--goal", "0.01", "--out", "{tmp}/f.png"],
         "momentum optimizers only"),
        ("best-measurement", ["--workload", SGD, "--metric", E, "--step-budget", "5", "--example-budget", "5",
                              "--out", "{tmp}/f.png"], "budgets of one kind"),
        ("metaparameters", ["--workload", SGD, "--metric", E, "--goal", "0.0001", "--out", "{tmp}/f.png"],
         "no batch size reached"),
        ("steps-to-result", ["--workload", NESTEROV, "--metric", E, "--goal", "0.01", "--bootstrap", "3",
                             "--seed", "-1", "--out", "{tmp}/f.png"], "seed must be an integer >= 0"),
    ],
)
def test_plot_errors_are_one_line_and_write_nothing(capsys, store_dir, tmp_path, command, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code, out, err = run(capsys, "plot", command, "--store", str(store_dir), *args)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and message in err and err.strip().count("\n") == 0
    assert list(tmp_path.iterdir()) == []


def test_out_that_is_an_existing_directory_is_one_line_and_kept(capsys, store_dir, tmp_path):
    target = tmp_path / "figure.png"
    target.mkdir()
    code, out, err = run(capsys, "plot", "steps-to-result", "--store", str(store_dir), "--workload", NESTEROV,
                         "--metric", E, "--goal", "0.01", "--out", str(target))
    assert (code, out) == (2, "") and err.count("\n") == 1 and "is an existing directory" in err
    assert target.is_dir() and list(tmp_path.iterdir()) == [target]
