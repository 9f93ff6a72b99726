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


# ------------------------------------------------------------------ --adapter: the user's own checkpoints

from tests.integrations.test_checkpoint_branches import write_user_run


@pytest.fixture()
def user_run(tmp_path, monkeypatch):
    """A tiny run of the user's own: its adapter module and checkpoints (tests/integrations)."""
    return write_user_run(tmp_path, monkeypatch)


def adapter_args(runs, adapter="tiny_adapter:SGDAdapter", run="sgd"):
    return ["--adapter", adapter, *[a for s, p in runs[run].items() for a in ("--checkpoint", f"{s}={p}")],
            "--batch-size", "16", "--multipliers", "1,2,4", "--window", "64"]


def test_adapter_mode_prints_rows_writes_schedules_and_resumes(capsys, tmp_path, user_run):
    _, runs, _ = user_run
    out, schedule, olmo = tmp_path / "out", tmp_path / "schedule.json", tmp_path / "olmo.json"
    code, text, err = run(capsys, "probe", "branched", *adapter_args(runs), "--out", out, "--json",
                          "--schedule-out", schedule, "--olmo-core-out", olmo, "--tokens-per-example", "32")
    assert code == 0, err
    rows = json_lines(text)
    assert [r["step"] for r in rows] == [0, 4, 8]
    for row in rows:
        assert row["adapter"] == "tiny_adapter:SGDAdapter" and row["workload"] is None and row["computed"] == 9
        assert [b["batch_size"] for b in row["branches"]] == [16, 32, 64] and row["learning_rate"] == 0.1
        assert row["settings"]["rule"] == "linear"  # SGD: the default rule read from the adapter's optimizer
        assert row["settings"]["checkpoints"][str(row["step"])] == runs["sgd"][row["step"]]
    from batchlab.integrations.schedule import BatchSizeSchedule

    saved = BatchSizeSchedule.load(schedule)
    assert saved.unit == "tokens" and saved.points[0] == (0, 16 * 32)
    warmup = {r["step"]: r["warmup_batch_size"] for r in rows}
    for step, size in warmup.items():  # the step-t warmup starts at t·B examples = t·B·32 tokens
        assert saved.batch_size_at(step * 16 * 32) == size * 32
    assert json.loads(olmo.read_text()) == saved.to_olmo_core()
    code, again, err = run(capsys, "probe", "branched", *adapter_args(runs), "--out", out, "--json")
    assert code == 0, err
    assert [r["computed"] for r in json_lines(again)] == [0, 0, 0]
    assert [r["branches"] for r in json_lines(again)] == [r["branches"] for r in rows]


def test_adapter_mode_table(capsys, user_run):
    _, runs, _ = user_run
    code, out, err = run(capsys, "probe", "branched", *adapter_args(runs, "tiny_adapter:AdamAdapter", "adam"))
    assert code == 0, err
    flat = " ".join(out.split())  # the title may wrap
    assert "adapter tiny_adapter:AdamAdapter B=16 lr=per checkpoint rule=sqrt" in flat  # Adam: the sqrt rule
    assert "step 8: branch k=4" in err


@pytest.mark.parametrize("args, message", [
    (["mnist/fc_64_64_64", "--adapter", "tiny_adapter:SGDAdapter", "--checkpoint", "0=PATH0"], "give either a WORKLOAD"),
    (["--adapter", "tiny_adapter:SGDAdapter", "--batch-size", "16"], "--adapter needs at least one --checkpoint"),
    (["--checkpoint", "0=PATH0", "--batch-size", "16"], "--checkpoint needs --adapter"),
    (["--adapter", "tiny_adapter:SGDAdapter", "--checkpoint", "0=PATH0"], "--adapter needs --batch-size"),
    (["--adapter", "tiny_adapter:SGDAdapter", "--checkpoint", "x=PATH0", "--batch-size", "16"],
     "STEP must be an integer >= 0"),
    (["--adapter", "tiny_adapter:SGDAdapter", "--checkpoint", "PATH0", "--batch-size", "16"], "expected STEP=PATH"),
    (["--adapter", "tiny_adapter:SGDAdapter", "--checkpoint", "0=PATH0", "--checkpoint", "0=PATH0", "--batch-size",
      "16"], "step 0 given twice"),
    (["--adapter", "tiny_adapter:SGDAdapter", "--checkpoint", "3=/no/such/file.pt", "--batch-size", "16"],
     "checkpoint for step 3: '/no/such/file.pt' does not exist"),
    (["--adapter", "no_such_module_xyz:A", "--checkpoint", "0=PATH0", "--batch-size", "16", "--rule", "linear"],
     "module 'no_such_module_xyz' not found"),
    (["--adapter", "tiny_adapter:NoLoss", "--checkpoint", "0=PATH0", "--batch-size", "16", "--rule", "linear"],
     "lacks loss"),
    (["--adapter", "tiny_adapter:failing_load", "--checkpoint", "0=PATH0", "--batch-size", "16", "--window", "64",
      "--multipliers", "1,2"], r"failing_load: load raised RuntimeError: load broke on two lines \(checkpoint step 0, "),
    (["--adapter", "tiny_adapter:SGDAdapter", "--checkpoint", "0=PATH0", "--batch-size", "16", "--steps-at", "0",
      "--device", "cpu"], "--steps-at, --device define a WORKLOAD's reference run"),
    (["--adapter", "tiny_adapter:AdamAdapter", "--checkpoint", "0=PATH0", "--batch-size", "16", "--window", "64",
      "--multipliers", "1,2"], r"the step of the Adam from build \(after load\) raised KeyError: 'betas'"),
    (["mnist/fc_64_64_64", "--dask"], "--dask and --scheduler run the branches of --adapter"),
    (["mnist/fc_64_64_64", "--olmo-core-out", "x.json"], "--olmo-core-out needs --tokens-per-example"),
    (["--adapter", "tiny_adapter:SGDAdapter", "--checkpoint", "0=PATH0", "--batch-size", "16", "--steps", "0"],
     "--steps define a WORKLOAD's reference run"),  # a zero is given, not absent
    (["mnist/fc_64_64_64", "--tokens-per-example", "64"], "--tokens-per-example counts the schedule files"),
    ([], "give a WORKLOAD, or --adapter"),
])
def test_adapter_mode_bad_input_is_one_line_and_exit_2(capsys, user_run, args, message):
    _, runs, _ = user_run
    args = [a.replace("PATH0", runs["sgd"][0]) for a in args]
    code, out, err = run(capsys, "probe", "branched", *args)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and re.search(message, err), err
