"""``batchlab probe branched`` on a tiny MNIST reference run."""

import json
import re

import pytest

from tests.cli.cli_runner import run

TINY = ["mnist/fc_64_64_64", "--steps-at", "0,3", "--train-examples", "256", "--batch-size", "16", "--examples", "64",
        "--multipliers", "1,2,4", "--window", "64", "--device", "cpu"]


def json_lines(text):
    return [json.loads(line) for line in text.strip().splitlines()]


def test_branched_prints_one_json_object_per_checkpoint(capsys, tmp_path):
    code, out, err = run(capsys, "probe", "branched", *TINY, "--out", tmp_path, "--json")
    assert code == 0, err
    rows = json_lines(out)
    assert [r["step"] for r in rows] == [0, 3]
    for row in rows:
        assert {"step", "workload", "optimizer", "learning_rate", "reference_loss", "critical_batch_size", "interval",
                "branches", "warmup_batch_size", "examples_processed", "computed", "settings"} <= set(row)
        assert [b["batch_size"] for b in row["branches"]] == [16, 32, 64]
        assert [b["factor"] for b in row["branches"]] == [1.0, 2.0, 4.0]  # sgd: the linear rule
        assert row["branches"][0]["loss"] == row["reference_loss"] and row["interval"]["method"] == "bracket"
        assert row["settings"]["rule"] == "linear" and row["settings"]["window"] == 64
        assert row["settings"]["learning_rate"] == 0.1 and row["computed"] == 6
        assert row["warmup_batch_size"] >= row["critical_batch_size"]
    assert (tmp_path / "branched.json").exists()
    code, again, err = run(capsys, "probe", "branched", *TINY, "--out", tmp_path, "--json")
    assert code == 0, err
    resumed = json_lines(again)
    assert [r["computed"] for r in resumed] == [0, 0]
    assert [r["branches"] for r in resumed] == [r["branches"] for r in rows]


def test_branched_adam_defaults_to_the_sqrt_rule_and_prints_a_table(capsys):
    code, out, err = run(capsys, "probe", "branched", *TINY, "--steps-at", "2", "--optimizer", "adam")
    assert code == 0, err
    assert "branched critical batch size" in out and "rule=sqrt" in out and "critical B" in out
    assert "step 2: branch k=4" in err


@pytest.mark.parametrize("args, message", [
    (["--multipliers", "1,4,2"], "multipliers must be strictly increasing"),
    (["--multipliers", "1,x"], "--multipliers must be a comma-separated list of integers"),
    (["--window", "0"], "window must be an integer >= 1"),
    (["--window", "32"], "less than one update at the largest batch size 64"),
    (["--rule", "cubic"], "unknown learning-rate rule 'cubic'"),
    (["--tolerance", "-1"], "tolerance must be a number >= 0"),
    (["--workers", "0"], "workers must be an integer >= 1"),
    (["--optimizer", "adma"], "unknown optimizer 'adma'"),
    (["--steps-at", "3,0"], "strictly increasing"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    code, out, err = run(capsys, "probe", "branched", *TINY, *args)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and re.search(message, err), err
