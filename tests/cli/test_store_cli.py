"""``batchlab store info/compact``, ``import batch-science`` and ``export batch-science``."""

import json
import sys
from pathlib import Path

import pytest


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))
from release_trees import make_release  # noqa: E402
from cli_runner import run  # noqa: E402


def _rows(out):
    """The cells of every body row of the tables in ``out``."""
    return [[c.strip() for c in r.split("│")[1:-1]] for r in out.splitlines() if r.startswith("│")]


def test_import_info_compact_export(tmp_path, capsys):
    make_release(tmp_path / "rel")
    store = tmp_path / "store"
    code, out, err = run(capsys, "import", "batch-science", tmp_path / "rel", "--store", store, "--json")
    assert code == 0 and err == f"created a new store at {store}\n"
    report = json.loads(out)
    assert (report["trials_added"], report["measurements_added"]) == (24, 240)
    code, out, err = run(capsys, "import", "batch-science", tmp_path / "rel", "--store", store)
    assert code == 0 and "imported 0 trials" in out and "24 already present" in out and err == ""
    code, out, _ = run(capsys, "store", "info", "--store", store, "--json")
    assert out.count("\n") == 1
    info = json.loads(out)
    assert (info["workloads"], info["studies"], info["measurements"]) == (3, 6, 240)
    assert info["trials"] == {"COMPLETE": 12, "INCOMPLETE": 6, "INFEASIBLE": 6, "STOPPED_AT_GOAL": 0, "RACED": 0}
    assert len(info["study_definitions"]) == 6
    assert {s["source"] for s in info["study_definitions"]} == {"batch_science"}
    code, out, _ = run(capsys, "store", "info", "--store", store)
    assert code == 0 and "study definitions (6)" in out
    row = next(c for c in _rows(out) if c[:2] == ["mnist/simple_cnn_base/sgd", "64"])
    assert row[3:5] == ["batch_science", "1000"]  # source, budget
    assert max(len(r) for r in out.splitlines()) > 80  # a pipe gets the whole table, never an 80-column cut
    code, out, _ = run(capsys, "store", "compact", "--store", store, "--json")
    assert code == 0 and json.loads(out)["deleted_files"] == 0
    code, out, _ = run(capsys, "export", "batch-science", "--store", store, "--out", tmp_path / "out")
    assert code == 0 and "exported 6 studies, 24 trials, 240 measurements" in out
    assert (tmp_path / "out/mnist/simple_cnn_base/sgd/64/3/measurements.csv").is_file()


def test_malformed_import_is_one_line_exit_2_and_skip_bad_lists(tmp_path, capsys):
    studies = make_release(tmp_path / "rel")
    bad = studies[("mnist/simple_cnn_base/sgd", 8)] / "2" / "metadata.json"
    bad.write_text("{oops")
    store = tmp_path / "store"
    code, out, err = run(capsys, "import", "batch-science", tmp_path / "rel", "--store", store)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and str(bad) in err and "bad JSON" in err
    assert not store.exists()  # nothing written: the failed import leaves no new, empty store behind
    code, out, err = run(capsys, "import", "batch-science", tmp_path / "rel", "--store", store, "--skip-bad")
    assert code == 0 and "imported 23 trials" in out and "1 skipped" in out
    assert err.startswith(f"skipped: {bad}: bad JSON") and err.endswith(f"created a new store at {store}\n")


def test_failed_import_into_an_existing_store_keeps_it(tmp_path, capsys):
    make_release(tmp_path / "good")
    store = tmp_path / "store"
    assert run(capsys, "import", "batch-science", tmp_path / "good", "--store", store)[0] == 0
    studies = make_release(tmp_path / "bad")
    (studies[("mnist/simple_cnn_base/sgd", 8)] / "study.json").write_bytes(b"\xff garbage")
    code, out, err = run(capsys, "import", "batch-science", tmp_path / "bad", "--store", store)
    assert (code, out) == (2, "") and err.count("\n") == 1 and "bad JSON" in err
    code, out, _ = run(capsys, "store", "info", "--store", store, "--json")
    assert code == 0 and json.loads(out)["measurements"] == 240


@pytest.mark.parametrize("below", ["x", "x/y"])
def test_export_below_a_file_is_one_line_exit_2(tmp_path, capsys, below):
    make_release(tmp_path / "rel")
    store = tmp_path / "store"
    assert run(capsys, "import", "batch-science", tmp_path / "rel", "--store", store)[0] == 0
    (tmp_path / "afile").write_text("keep")
    code, out, err = run(capsys, "export", "batch-science", "--store", store, "--out", tmp_path / "afile" / below)
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert ("is not a directory" if below == "x" else "does not exist") in err
    assert (tmp_path / "afile").read_text() == "keep"


@pytest.mark.parametrize("command", [["import", "batch-science", "{tmp}/rel"], ["import", "table", "{tmp}/t.csv"],
                                     ["export", "batch-science", "--store", "{tmp}/store"]])
def test_a_mistyped_parent_directory_is_an_error_and_creates_nothing(tmp_path, capsys, command):
    make_release(tmp_path / "rel")
    (tmp_path / "t.csv").write_text(TABLE)
    assert run(capsys, "import", "table", tmp_path / "t.csv", "--store", tmp_path / "store")[0] == 0
    option = "--out" if command[0] == "export" else "--store"
    args = [a.format(tmp=tmp_path) for a in command] + [option, tmp_path / "typo" / "store"]
    code, out, err = run(capsys, *args)
    assert (code, out) == (2, "") and err.startswith("error: ") and err.count("\n") == 1
    assert "does not exist" in err and not (tmp_path / "typo").exists()


@pytest.mark.parametrize("args, message", [
    (["store", "info", "--store", "{tmp}/missing"], "no batchlab store"),
    (["export", "batch-science", "--store", "{tmp}/missing", "--out", "{tmp}/o"], "no batchlab store"),
    (["import", "batch-science", "{tmp}/nothing", "--store", "{tmp}/s"], "not a directory"),
    (["import", "batch-science", "{tmp}/empty", "--store", "{tmp}/s"], "no studies"),
])
def test_user_errors(tmp_path, capsys, args, message):
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, *[a.format(tmp=tmp_path) for a in args])
    assert code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]  # nothing written


TABLE = """workload,batch_size,trial_id,step,val/classification_error,param:learning_rate,status
mnist/fc_64_64_64/sgd,64,1,0,0.9,0.1,
mnist/fc_64_64_64/sgd,64,1,10,0.5,0.1,
mnist/fc_64_64_64/sgd,128,1,0,0.9,0.2,STOPPED_AT_GOAL
mnist/fc_64_64_64/sgd,128,1,5,0.02,0.2,STOPPED_AT_GOAL
"""


def test_import_table_then_info_lists_its_study_definitions(tmp_path, capsys):
    (tmp_path / "runs.csv").write_text(TABLE)
    store = tmp_path / "store"
    code, out, _ = run(capsys, "import", "table", tmp_path / "runs.csv", "--store", store)
    assert code == 0 and out.startswith("imported 2 trials (4 measurements") and "in 2 studies" in out
    code, out, _ = run(capsys, "import", "table", tmp_path / "runs.csv", "--store", store, "--json")
    assert code == 0 and json.loads(out)["trials_already_present"] == 2
    code, out, _ = run(capsys, "store", "info", "--store", store)
    assert code == 0 and "study definitions (2)" in out
    row = next(c for c in _rows(out) if c[1] == "128")
    assert row[3] == "table import:runs.csv" and row[8:10] == ["cpu", "1 (STOPPED_AT_GOAL 1)"]
    code, out, _ = run(capsys, "store", "info", "--store", store, "--json")
    studies = json.loads(out)["study_definitions"]
    assert [(s["batch_size"], s["statuses"]["STOPPED_AT_GOAL"]) for s in studies] == [(64, 0), (128, 1)]
    assert set(studies[0]) >= {"study_id", "source", "train_steps", "train_examples", "stop_rule",
                               "evaluation", "n_trials", "statuses", "definition"}
    code, out, _ = run(capsys, "export", "batch-science", "--store", store, "--out", tmp_path / "out")
    assert code == 0 and "1 STOPPED_AT_GOAL trial(s) written as status COMPLETE" in out


@pytest.mark.parametrize("table, message", [
    ("workload,batch_size,step,val/x\nmnist/fc/sgd,64,0,1\n", "missing column(s) trial_id"),
    ("workload,batch_size,trial_id,step,val/x\nmnist/fc/sgd,64,1,abc,1\n", "column 'step' must hold integers"),
    ("workload,batch_size,trial_id,step,val/x\nmnist/fc/sgd,0,1,0,1\n", "column 'batch_size' must be >= 1"),
    ("workload,batch_size,trial_id,step,val/x,status\nmnist/fc/sgd,8,1,0,1,COMPLETE\nmnist/fc/sgd,8,1,1,1,INCOMPLETE\n",
     "conflicting 'status'"),
])
def test_import_table_errors_are_one_line_exit_2_and_write_nothing(tmp_path, capsys, table, message):
    (tmp_path / "bad.csv").write_text(table)
    code, out, err = run(capsys, "import", "table", tmp_path / "bad.csv", "--store", tmp_path / "store")
    assert (code, out) == (2, "") and err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "store").exists()


def test_info_prints_the_stop_rule_as_strict(tmp_path, capsys):
    """Review fix: a trial stops when its metric strictly beats the goal (goal_reached: value < goal),
    but `store info` printed the rule as `<= goal`."""
    from batchlab.store import Store, TrialRecord, publish_trials
    from batchlab.store.studies import make_study_definition

    w = "mnist/fc_64_64_64/sgd"
    store = Store.open(tmp_path / "store", create=True)
    for goal, maximize in ((0.08, False), (0.9, True)):
        definition = make_study_definition(
            workload=w, batch_size=64 if maximize else 32, train_steps=100, train_examples=None, search_space=None,
            evaluation=None, stop_rule={"metric": "val/classification_error", "goal": goal, "maximize": maximize},
            seed=0, source="batchlab")
        publish_trials(store, [TrialRecord(
            workload=w, batch_size=64 if maximize else 32, trial_id=0, trial_key=f"k{goal}", parameters={},
            status="STOPPED_AT_GOAL", steps=10, measurements=[(10, "val/classification_error", 0.05)],
            study_definition=definition)])
    code, out, err = run(capsys, "store", "info", "--store", tmp_path / "store")
    assert code == 0, err
    assert "val/classification_error < 0.08" in out and "val/classification_error > 0.9" in out
    assert "<=" not in out and ">=" not in out


def test_info_lists_the_device_of_each_study(tmp_path, capsys):
    from batchlab.store import Store, TrialRecord, publish_trials
    from batchlab.store.studies import make_study_definition

    w = "mnist/fc_64_64_64/sgd"
    store = Store.open(tmp_path / "store", create=True)
    for i, device in enumerate(("cpu", "cuda:0")):
        definition = make_study_definition(workload=w, batch_size=64, train_steps=100, device=device)
        publish_trials(store, [TrialRecord(workload=w, batch_size=64, trial_id=i + 1, trial_key=f"k{i}", parameters={},
                                           status="COMPLETE", steps=100, study_definition=definition)])
    code, out, _ = run(capsys, "store", "info", "--store", tmp_path / "store", "--json")
    assert code == 0 and sorted(s["device"] for s in json.loads(out)["study_definitions"]) == ["cpu", "cuda"]
    code, out, _ = run(capsys, "store", "info", "--store", tmp_path / "store")
    rows = [r for r in _rows(out) if r[0] == w]
    assert sorted(r[8] for r in rows) == ["cpu", "cuda"] and all(r[10] == "2 definitions at this batch size" for r in rows)
