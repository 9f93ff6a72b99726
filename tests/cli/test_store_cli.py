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
    assert (code, out) == (2, "") and err.count("\n") == 1 and "8/study.json" in err  # bad JSON, or not UTF-8
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


# ------------------------------------------------------------- damaged, read-only and full stores
from store_damage import DAMAGE, data_bytes, every_file, flip_middle, read_only, three_commits  # noqa: E402

CSV = "workload,batch_size,trial_id,step,val/classification_error\nmnist/fc_64_64_64/sgd,8,1,0,0.5\n"


def _commands(tmp_path):
    """One command of each kind that reads a store (argument lists, the store as ``{store}``)."""
    (tmp_path / "runs.csv").write_text(CSV)
    return {
        "info": ["store", "info", "--store", "{store}"],
        "compact": ["store", "compact", "--store", "{store}"],
        "export": ["export", "batch-science", "--store", "{store}", "--out", str(tmp_path / "out")],
        "import table": ["import", "table", str(tmp_path / "runs.csv"), "--store", "{store}"],
        "import batch-science": ["import", "batch-science", str(tmp_path / "rel"), "--store", "{store}"],
        "analyze": ["analyze", "steps-to-result", "--store", "{store}", "--workload", "mnist/simple_cnn_base/sgd",
                    "--metric", "val/classification_error", "--goal", "0.5"],
        "report": ["report", "--store", "{store}", "--out", str(tmp_path / "report.html")],
        "train": ["train", "mnist/fc_64_64_64", "--optimizer", "sgd", "--batch-size", "32", "--learning-rate", "0.1",
                  "--steps", "4", "--train-examples", "128", "--store", "{store}"],
    }


def _one_line_exit_2(capsys, args, store, *fragments):
    code, out, err = run(capsys, *[a.replace("{store}", str(store)) for a in args])
    assert code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1, (args, err)
    assert all(f in err for f in fragments), (args, err)


@pytest.mark.parametrize("damage", ["log entry deleted", *(f"{kind} {table} file" for kind in sorted(DAMAGE)
                                                         for table in ("workloads", "studies", "trials", "measurements"))])
def test_a_damaged_store_is_one_line_in_every_command_and_stays_as_it_is(tmp_path, capsys, damage):
    store = three_commits(tmp_path)
    if damage == "log entry deleted":
        (store.root / "log" / "000000000002.json").unlink()
        fragments = ("log entry log/000000000002.json is missing", "would restore log entry 2 from its copy")
    else:
        damage, table, _ = damage.split()
        target = store.state().files[table][0]
        DAMAGE[damage](store.root / target)
        fragments = (f"data file {target}", "would move 4 data files of log entry 1 to quarantine/")
    before = every_file(store.root)
    for args in _commands(tmp_path).values():
        _one_line_exit_2(capsys, args, store.root, f"store repair --store {store.root}", *fragments)
    assert every_file(store.root) == before


def test_store_repair_restores_a_deleted_entry_and_says_what_it_recovered(tmp_path, capsys):
    store = three_commits(tmp_path)
    (store.root / "log" / "000000000002.json").unlink()
    code, out, _ = run(capsys, "store", "repair", "--store", store.root, "--dry-run")
    assert code == 0 and out.startswith("restore log entry 2 from its copy data/log/000000000002.json")
    assert not (store.root / "log" / "000000000002.json").exists()
    code, out, _ = run(capsys, "store", "repair", "--store", store.root, "--json")
    (action,) = json.loads(out)["actions"]
    assert code == 0 and (action["kind"], action["seq"], action["trials"]) == ("restore", 2, 8)
    code, out, _ = run(capsys, "store", "info", "--store", store.root, "--json")
    assert code == 0 and sum(json.loads(out)["trials"].values()) == 24
    code, out, _ = run(capsys, "store", "repair", "--store", store.root)
    assert code == 0 and out == f"store {store.root} is intact: every commit present, every data file matches its size and sha256\n"


def test_a_file_damaged_in_place_is_one_line_when_read_and_repair_quarantines_it(tmp_path, capsys):
    store = three_commits(tmp_path)
    target = store.state().files["measurements"][1]
    flip_middle(store.root / target)  # same size, magic intact: passes the per-read checks
    _one_line_exit_2(capsys, _commands(tmp_path)["export"], store.root, "cannot read the store's data files",
                     "store repair --store DIR --dry-run")
    everything = data_bytes(store.root)
    code, out, _ = run(capsys, "store", "repair", "--store", store.root)
    assert code == 0 and out.startswith("moved 4 data files of log entry 2 to quarantine/ and commit their removal")
    assert "does not match the sha256 its commit recorded" in out and "8 trials no longer visible" in out
    assert data_bytes(store.root) == everything  # moved, never deleted
    code, out, _ = run(capsys, "export", "batch-science", "--store", store.root, "--out", tmp_path / "out2")
    assert code == 0 and "16 trials" in out


def test_a_read_only_store_is_one_line_for_every_command_that_writes(tmp_path, capsys, monkeypatch):
    store = three_commits(tmp_path)
    (tmp_path / "runs.csv").write_text(CSV)
    make_release(tmp_path / "rel2", n_trials=5)  # trials the store does not hold yet
    before = every_file(store.root)
    read_only(monkeypatch, store.root)
    for args in (["import", "table", str(tmp_path / "runs.csv"), "--store", "{store}"],
                 ["import", "batch-science", str(tmp_path / "rel2"), "--store", "{store}"],
                 ["store", "compact", "--store", "{store}"],
                 ["store", "repair", "--store", "{store}"],
                 ["train", "mnist/fc_64_64_64", "--optimizer", "sgd", "--batch-size", "32", "--learning-rate", "0.1",
                  "--steps", "4", "--train-examples", "128", "--store", "{store}"]):
        _one_line_exit_2(capsys, args, store.root, "Read-only file system (EROFS)")
    code, out, _ = run(capsys, "store", "info", "--store", store.root, "--json")
    assert code == 0 and sum(json.loads(out)["trials"].values()) == 24  # reading needs no write
    monkeypatch.undo()
    assert every_file(store.root) == before


@pytest.mark.skipif(getattr(__import__("os"), "geteuid", lambda: 0)() == 0,
                    reason="root ignores permission bits; the EROFS variant above runs as root too")
def test_a_store_without_write_permission_is_one_line(tmp_path, capsys):
    import os
    import stat

    store = three_commits(tmp_path)
    (tmp_path / "runs.csv").write_text(CSV)
    before = every_file(store.root)
    dirs = [p for p in [store.root, *store.root.rglob("*")] if p.is_dir()]
    for d in dirs:
        os.chmod(d, stat.S_IRUSR | stat.S_IXUSR)
    try:
        _one_line_exit_2(capsys, ["import", "table", str(tmp_path / "runs.csv"), "--store", "{store}"], store.root,
                         "Permission denied (EACCES)")
        _one_line_exit_2(capsys, ["store", "compact", "--store", "{store}"], store.root, "Permission denied (EACCES)")
    finally:
        for d in dirs:
            os.chmod(d, stat.S_IRWXU)
    assert every_file(store.root) == before


def test_a_disk_that_fills_while_publishing_is_one_line_and_the_store_is_unchanged(tmp_path, capsys, monkeypatch):
    import errno

    import pyarrow.parquet as pq

    store = three_commits(tmp_path)
    (tmp_path / "runs.csv").write_text(CSV)
    before = every_file(store.root)
    real = pq.write_table

    def full(table, where, *args, **kwargs):
        real(table, where, *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq, "write_table", full)
    _one_line_exit_2(capsys, ["import", "table", str(tmp_path / "runs.csv"), "--store", "{store}"], store.root,
                     f"in store {store.root}: No space left on device (ENOSPC)", "the store is unchanged")
    assert every_file(store.root) == before


def _csv_line(path, index, text):
    lines = path.read_text().splitlines()
    lines[index] = text
    path.write_text("\n".join(lines) + "\n")


#: The seven malformed release trees of issue 20 (each left a pending/<claim>.claim behind).
MALFORMED_TREES = {
    "bad JSON": lambda s: (s / "2" / "metadata.json").write_text("[1, "),
    "missing metadata.json": lambda s: (s / "3" / "metadata.json").unlink(),
    "bad CSV header": lambda s: _csv_line(s / "1" / "measurements.csv", 0, "stepp,val/classification_error"),
    "unknown status": lambda s: (s / "4" / "metadata.json").write_text(json.dumps(
        {"parameters": {}, "status": "DONE", "steps": 1, "trial_id": 4})),
    "batch-size mismatch": lambda s: (s / "study.json").write_text(json.dumps(
        dict(json.loads((s / "study.json").read_text()), batch_size=9))),
    "non-UTF-8": lambda s: (s / "2" / "metadata.json").write_bytes(b'{"status": "\xff\xfe"}'),
    "duplicate step": lambda s: _csv_line(s / "3" / "measurements.csv", 3,
                                          (s / "3" / "measurements.csv").read_text().splitlines()[2]),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_TREES))
def test_a_refused_release_import_leaves_no_claim_or_anything_else(tmp_path, capsys, case):
    studies = make_release(tmp_path / "rel")
    store = tmp_path / "store"
    code, _, _ = run(capsys, "import", "batch-science", tmp_path / "rel" / "cifar_10", "--store", store)
    assert code == 0
    before = every_file(store)
    MALFORMED_TREES[case](studies[("mnist/simple_cnn_base/sgd", 64)])
    code, out, err = run(capsys, "import", "batch-science", tmp_path / "rel", "--store", store)
    assert code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1, err
    assert every_file(store) == before  # no pending/<uuid>.claim, no data file
    assert not list((store / "pending").iterdir())  # and the successful import left none either


def test_an_import_table_with_a_colliding_trial_id_leaves_no_claim_or_anything_else(tmp_path, capsys):
    store = tmp_path / "store"
    (tmp_path / "a.csv").write_text(CSV)
    (tmp_path / "b.csv").write_text(CSV.replace("0.5", "0.25"))  # the same trial id, another file: another key
    code, _, _ = run(capsys, "import", "table", tmp_path / "a.csv", "--store", store)
    assert code == 0
    before = every_file(store)
    code, out, err = run(capsys, "import", "table", tmp_path / "b.csv", "--store", store)
    assert code == 2 and "already published under another trial key" in err and err.count("\n") == 1
    assert every_file(store) == before
    assert not list((store / "pending").iterdir())
