"""``batchlab analyze ...`` on a store imported from a release-format tree written here."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from analysis_fixtures import trial, write_release  # noqa: E402

from batchlab.cli import main  # noqa: E402
from cli_runner import run  # noqa: E402

W = "mnist/simple_cnn_base/nesterov_momentum"
E = "val/classification_error"


def rows(pairs):
    return [(step, {E: value, "val/cross_entropy_error": 2 * value}) for step, value in pairs]


def build_trials():
    trials = []
    for b in (1, 2, 4, 8, 16, 32, 64, 128):
        s = int(500 * (1 + 16 / b))
        for t, slowdown in ((1, 1.3), (2, 1.0), (3, 1.1)):
            hit = int(s * slowdown)
            trials.append(trial(W, b, t, rows([(hit // 3, 0.5), (hit, 0.008), (hit * 2, 0.004)]),
                                learning_rate=0.01 * b ** 0.5 * t, momentum=0.9))
    trials.append(trial(W, 256, 1, rows([(100, 0.5), (5000, 0.02)]), learning_rate=1.0, momentum=0.9))
    return trials


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    root = write_release(tmp_path_factory.mktemp("release") / "batch_science", build_trials())
    path = tmp_path_factory.mktemp("store") / "store"
    main(["import", "batch-science", str(root), "--store", str(path), "--json"])
    return path


def test_steps_to_result_json_lines(capsys, store_dir):
    code, out, err = run(capsys, "analyze", "steps-to-result", "--store", str(store_dir), "--workload", W,
                         "--metric", E, "--goal", "0.01", "--json")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [d["batch_size"] for d in lines] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    first = lines[0]
    assert first["steps"] == 500 * 17 and first["reached"] is True and first["trial_id"] == 2
    assert first["parameters"] == {"learning_rate": 0.02, "momentum": 0.9}
    assert first["effective_learning_rate"] == pytest.approx(0.2)
    assert lines[-1]["steps"] is None and lines[-1]["reached"] is False and lines[-1]["trial_id"] is None


def test_steps_to_result_options_reach_the_analysis(capsys, store_dir):
    base = ["analyze", "steps-to-result", "--store", str(store_dir), "--workload", W, "--metric", E, "--json"]
    code, out, _ = run(capsys, *base, "--goal", "0.01", "--max-trials", "1")
    assert json.loads(out.splitlines()[0])["trial_id"] == 1
    code, out, _ = run(capsys, *base, "--goal", "0.01", "--step-budget", "8000")
    assert [json.loads(line)["steps"] for line in out.splitlines()][:2] == [None, 4500]
    code, out, _ = run(capsys, *base, "--goal", "0.01", "--example-budget", "8500")
    assert json.loads(out.splitlines()[0])["steps"] == 8500
    code, out, _ = run(capsys, *base, "--goal", "0.3", "--maximize")
    assert json.loads(out.splitlines()[0])["steps"] == 500 * 17 // 3  # 0.5 > 0.3 at the first evaluation
    code, out, _ = run(capsys, *base, "--goal", "0.01", "--status", "COMPLETE", "--status", "INCOMPLETE")
    assert code == 0


def test_steps_to_result_table(capsys, store_dir):
    code, out, _ = run(capsys, "analyze", "steps-to-result", "--store", str(store_dir), "--workload", W,
                       "--metric", E, "--goal", "0.01")
    assert code == 0 and "not reached" in out and "8500" in out and "effective lr" in out


def test_critical_batch_size_json_and_table(capsys, store_dir):
    args = ["analyze", "critical-batch-size", "--store", str(store_dir), "--workload", W, "--metric", E,
            "--goal", "0.01", "--bootstrap", "50", "--seed", "1"]
    code, out, err = run(capsys, *args, "--json")
    assert code == 0, err
    (line,) = out.splitlines()
    summary = json.loads(line)
    b_crit = summary["critical_batch_sizes"]["mccandlish_b_crit"]
    assert b_crit["value"] == pytest.approx(16.0, rel=0.05)
    assert b_crit["low"] <= b_crit["value"] <= b_crit["high"]
    assert summary["bootstrap"]["n_boot"] == 50 and summary["bootstrap"]["seed"] == 1
    assert summary["selection"]["goal"] == 0.01
    assert [r["batch_size"] for r in summary["regimes"]][-1] == 256
    assert summary["regimes"][0]["regime"] == "perfect_scaling"
    code, out, _ = run(capsys, *args)
    assert code == 0 and "mccandlish_b_crit" in out and "overhead_20pct" in out and "failed fits" in out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--workload", "mnist/simple_cnn_base/nesterov", "--metric", E], "unknown workload 'mnist/simple_cnn_base/nesterov'"),
        (["--workload", W, "--metric", "val/accuracy"], "unknown metric 'val/accuracy'"),
        (["--workload", W, "--metric", E, "--status", "DONE"], "unknown trial status 'DONE'"),
        (["--workload", W, "--metric", E, "--max-trials", "0"], "--max-trials"),
    ],
)
def test_bad_selection_is_one_line_exit_2(capsys, store_dir, extra, message):
    for command in ("steps-to-result", "critical-batch-size"):
        code, out, err = run(capsys, "analyze", command, "--store", str(store_dir), "--goal", "0.01", *extra)
        assert code == 2 and out == ""
        assert err.startswith("error: ") and message in err and err.strip().count("\n") == 0


def test_unknown_names_list_what_exists(capsys, store_dir):
    _, _, err = run(capsys, "analyze", "steps-to-result", "--store", str(store_dir), "--workload", "x/y/z",
                    "--metric", E, "--goal", "0.01")
    assert f"known: {W}" in err
    _, _, err = run(capsys, "analyze", "steps-to-result", "--store", str(store_dir), "--workload", W,
                    "--metric", "val/acc", "--goal", "0.01")
    assert "known: val/classification_error, val/cross_entropy_error" in err


def test_negative_bootstrap_seed_is_one_line_exit_2(capsys, store_dir):
    code, out, err = run(capsys, "analyze", "critical-batch-size", "--store", str(store_dir), "--workload", W,
                         "--metric", E, "--goal", "0.01", "--bootstrap", "5", "--seed", "-1", "--json")
    assert (code, out) == (2, "") and err == "error: seed must be an integer >= 0, got -1\n"


def test_empty_store_says_it_has_no_workloads(capsys, tmp_path):
    from batchlab.store import Store

    Store.open(tmp_path / "empty", create=True)
    code, out, err = run(capsys, "analyze", "steps-to-result", "--store", str(tmp_path / "empty"), "--workload", W,
                         "--metric", E, "--goal", "0.01")
    assert (code, out) == (2, "") and err.count("\n") == 1 and "the store has no workloads yet" in err


def test_too_few_reached_batch_sizes(capsys, store_dir):
    code, out, err = run(capsys, "analyze", "critical-batch-size", "--store", str(store_dir), "--workload", W,
                         "--metric", E, "--goal", "0.001", "--json")
    assert code == 2 and out == "" and "need at least 2 batch sizes" in err


def test_missing_store_as_a_process(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "batchlab", "analyze", "steps-to-result", "--store", str(tmp_path / "none"),
         "--workload", W, "--metric", E, "--goal", "0.01", "--json"],
        capture_output=True, text=True,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: no batchlab store") and "Traceback" not in result.stderr
