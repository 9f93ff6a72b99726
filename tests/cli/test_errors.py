import json
import subprocess
import sys

import pytest

from batchlab.errors import unknown_name_error


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "batchlab", *args], capture_output=True, text=True)


def test_unknown_command_is_one_line_exit_2():
    result = run_cli("no-such-command")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert result.stderr.startswith("error: ")
    assert "Traceback" not in result.stderr


def test_unknown_option_is_one_line_exit_2():
    result = run_cli("version", "--bogus")
    assert result.returncode == 2
    assert "--bogus" in result.stderr and "Traceback" not in result.stderr


def test_unknown_name_suggests_closest():
    err = unknown_name_error("optimizer", "momentm", ["sgd", "momentum", "adam"])
    assert "did you mean 'momentum'" in str(err)
    assert "adam, momentum, sgd" in str(err)


def test_ctrl_c_in_any_command_is_one_line_and_status_130(capsys, monkeypatch):
    # typer turns KeyboardInterrupt into a returned status 130 without standalone mode; main() must
    # exit with it (it used to exit 0, silently)
    import batchlab.train

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(batchlab.train, "prepare_trial", interrupted)
    from batchlab.cli import main

    try:
        main(["train", "mnist/fc_64_64_64", "--optimizer", "sgd", "--batch-size", "8", "--learning-rate", "0.1"])
        code = 0
    except SystemExit as exc:
        code = exc.code
    assert code == 130
    assert capsys.readouterr().err == "interrupted\n"


# ---- bad inputs across commands: exit 2, one line "error: ...", nothing written -------------------

W = "mnist/fc_64_64_64/sgd"
TABLE_HEADER = "workload,batch_size,trial_id,step,val/classification_error"


def _tree(root):
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def assert_refused(capsys, root, *args, fragment):
    """``batchlab ARGS`` (run in-process) exits 2 with one printable line ``error: ...`` containing
    ``fragment`` and leaves ``root`` as it was."""
    from cli_runner import run

    before = _tree(root)
    code, out, err = run(capsys, *args)
    assert code == 2, (code, out, err)
    assert err.startswith("error: ") and err.endswith("\n") and err[:-1].isprintable(), err
    assert fragment in err and "Traceback" not in err, err
    assert _tree(root) == before


@pytest.mark.parametrize("data, fragment", [
    # a Latin-1 CSV gave a UnicodeDecodeError traceback; a workload "../../escaped/sgd" imported with exit 0
    ((TABLE_HEADER + "\nm\xe9nist/fc/sgd,8,1,0,0.5\n").encode("latin-1"), "is not UTF-8 text (byte 0xe9 on line 2"),
    (("\ufeff" + TABLE_HEADER + f"\n{W},8,1,0,0.5\n").encode("utf-16"), "is UTF-16 text"),
    (bytes(range(256)) + b"\x1b[31m", "holds NUL bytes"),
    ((TABLE_HEADER + "\n../../escaped/sgd,8,1,0,0.5\n").encode(), "not of the form dataset/model/optimizer"),
    ((TABLE_HEADER + f"\n{W},true,1,0,0.5\n").encode(), "column 'batch_size' must hold integers, got 'true'"),
])
def test_import_table_of_a_bad_file_is_one_line_and_creates_no_store(tmp_path, capsys, data, fragment):
    (tmp_path / "t.csv").write_bytes(data)
    assert_refused(capsys, tmp_path, "import", "table", tmp_path / "t.csv", "--store", tmp_path / "store",
                   fragment=fragment)


def test_import_table_takes_trial_ids_up_to_int64_max(tmp_path, capsys):
    # ids from about 2^63 - 512 were refused: "must be <= 9223372036854775807, got 9223372036854775806"
    from cli_runner import run

    rows = [f"{W},8,{2**63 - k},0,0.5" for k in (1, 2, 512)]
    (tmp_path / "t.csv").write_text("\n".join([TABLE_HEADER, *rows]) + "\n")
    code, out, err = run(capsys, "import", "table", tmp_path / "t.csv", "--store", tmp_path / "s", "--json")
    assert code == 0, err
    assert json.loads(out.splitlines()[-1])["trials_added"] == 3


def test_import_batch_science_of_a_utf16_measurements_file_is_one_line(tmp_path, capsys):
    study = tmp_path / "rel" / "mnist" / "fc" / "sgd" / "8"
    (study / "1").mkdir(parents=True)
    (study / "study.json").write_text(json.dumps({"batch_size": 8, "dataset": "mnist", "model": "fc", "optimizer": "sgd",
                                                  "early_stopping": False, "train_steps": 10, "parameter_configs": {}}))
    (study / "1" / "metadata.json").write_text(json.dumps({"status": "COMPLETE", "steps": 10, "trial_id": 1,
                                                           "parameters": {}}))
    (study / "1" / "measurements.csv").write_bytes("step,val/err\n0,0.5\n".encode("utf-16"))
    assert_refused(capsys, tmp_path, "import", "batch-science", tmp_path / "rel", "--store", tmp_path / "store",
                   fragment="measurements.csv: the file is UTF-16 text")


@pytest.mark.parametrize("data, fragment", [
    (b"[" * 100_000 + b"]" * 100_000 + b"\n", "line 1 is not a record: its JSON nests too deeply"),  # a RecursionError
    ('{"predictor": "m\xe9"}\n'.encode("latin-1"), "is not UTF-8 text"),
])
def test_report_predictions_that_are_no_records_are_one_line(tmp_path, capsys, data, fragment):
    (tmp_path / "p.jsonl").write_bytes(data)
    assert_refused(capsys, tmp_path, "report", "--store", tmp_path / "store", "--out", tmp_path / "r.html",
                   "--predictions", tmp_path / "p.jsonl", fragment=fragment)


@pytest.mark.parametrize("text, fragment", [
    ("batch_size,steps\n1,1e300\n2,50\n", "steps must be >= 0 and <= 2^53"),  # a TypeError traceback
    ("batch_size,steps\n9223372036854775808,100\n2,50\n", "batch sizes must be whole numbers > 0 and <= 2^53"),
])
def test_analyze_a_steps_table_out_of_range_is_one_line(tmp_path, capsys, text, fragment):
    (tmp_path / "s.csv").write_text(text)
    assert_refused(capsys, tmp_path, "analyze", "critical-batch-size", "--steps-table", tmp_path / "s.csv",
                   fragment=fragment)


@pytest.fixture
def small_store(tmp_path, capsys):
    """A store of one imported workload (two batch sizes, two trials each) and the directory holding it."""
    from cli_runner import run

    rows = [f"{W},{b},{t},{s},{0.9 - 0.1 * s / b}" for b in (8, 16) for t in (1, 2) for s in (0, 8, 16, 32)]
    (tmp_path / "t.csv").write_text("\n".join([TABLE_HEADER, *rows]) + "\n")
    code, _, err = run(capsys, "import", "table", tmp_path / "t.csv", "--store", tmp_path / "store")
    assert code == 0, err
    return tmp_path


ANALYZE = ("--workload", W, "--metric", "val/classification_error", "--goal", "0.6")


@pytest.mark.parametrize("args, fragment", [
    # each used to exit 0 (a list item or a name dropped or overridden silently) or give a traceback
    (("nqm", "sweep", "--batch-sizes", "4,,8"), "--batch-sizes has an empty item"),
    (("sweep", "mnist/fc_64_64_64", "--optimizer", "sgd", "--trials", "1", "--batch-sizes", "4,,8", "--store", "{d}/s"),
     "--batch-sizes has an empty item"),
    (("sweep", "mnist/fc_64_64_64", "--optimizer", "sgd", "--trials", "1", "--batch-sizes", "4,8",
      "--only-batch-sizes", "4,4", "--store", "{d}/s"), "--only-batch-sizes must be distinct, got 4 more than once"),
    (("sweep", "mnist/fc_64_64_64", "--optimizer", "sgd", "--trials", "1", "--batch-sizes", "4,8",
      "--only-optimizers", "sgd,sgd", "--store", "{d}/s"), "--only-optimizers must be distinct, got sgd"),
    (("train", "mnist/fc_64_64_64", "--optimizer", "sgd", "--batch-size", "4", "--learning-rate", "0.1",
      "--hparam", "weight_decay=1", "--hparam", "weight_decay=2", "--store", "{d}/s"), "--hparam weight_decay is given twice"),
    (("analyze", "steps-to-result", "--store", "{d}/store", *ANALYZE, "--max-trials", "99999999999999999999999"),
     "--max-trials must be a positive integer, 'all' or 'auto' (at most 2^63 - 1)"),  # an OverflowError traceback
    (("analyze", "steps-to-result", "--store", "{d}/store", *ANALYZE, "--step-budget", "99999999999999999999999"),
     "--step-budget"),  # an OverflowError traceback
    (("analyze", "critical-batch-size", "--store", "{d}/store", *ANALYZE, "--bootstrap", "99999999999999999999"),
     "--bootstrap"),  # "Maximum allowed dimension exceeded" traceback
    (("nqm", "sweep", "--power-law", "1,1", "--dim", "99999999999999", "--batch-sizes", "4"),
     "needs more memory than this machine has"),  # a MemoryError traceback
    (("plot", "steps-to-result", "--store", "{d}/store", *ANALYZE, "--out", "{d}/f.png", "--level", "0"),
     "--level must be in (0, 1)"),  # wrote the figure
    (("plot", "steps-to-result", "--store", "{d}/store", *ANALYZE, "--out", "{d}/f.png", "--seed", "-1"), "seed must be an integer >= 0, got -1"),
])
def test_bad_flag_values_are_one_line_and_write_nothing(small_store, capsys, args, fragment):
    assert_refused(capsys, small_store, *(a.format(d=small_store) for a in args), fragment=fragment)


def test_checked_int_accepts_index_types_and_refuses_bools_floats_and_out_of_range():
    import numpy as np

    from batchlab.errors import BatchlabError, checked_int

    assert checked_int("n", 3, 1) == 3 and type(checked_int("n", np.int64(3), 1)) is int
    assert checked_int("batch size", 4096, 1, 4096) == 4096
    cases = [
        (("n", True, 1), "n must be an integer >= 1, got True"),
        (("n", 2.0, 0), "n must be an integer >= 0, got 2.0"),
        (("n", "3", 1), "n must be an integer >= 1, got '3'"),
        (("n", 0, 1), "n must be >= 1, got 0"),
        (("batch size", 2.5, 1, 64), "batch size must be an integer from 1 to 64, got 2.5"),
        (("batch size", 0, 1, 64), "batch size 0 is out of range; allowed: integers from 1 to 64"),
        (("batch size", 65, 1, 64), "batch size 65 is out of range; allowed: integers from 1 to 64"),
    ]
    for args, message in cases:
        with pytest.raises(BatchlabError) as info:
            checked_int(*args)
        assert str(info.value) == message
