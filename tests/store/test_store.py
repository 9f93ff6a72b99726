import json

import pyarrow as pa
import pytest

from batchlab.errors import BatchlabError
from batchlab.store import Store, TrialRecord, publish_trials
from batchlab.store.schema import VIEW_COLUMNS

W = "mnist/fc_128_128_128/sgd"


def writer(store, key="k1", trial_id=1, **kw):
    return store.trial_writer(workload=W, batch_size=64, trial_id=trial_id, trial_key=key,
                              parameters={"learning_rate": 0.1}, seed=0, **kw)


def test_open_missing_store_is_a_user_error(tmp_path):
    with pytest.raises(BatchlabError, match="no batchlab store"):
        Store.open(tmp_path / "nope")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x.txt").write_text("hi")
    with pytest.raises(BatchlabError, match="not a batchlab store"):
        Store.open(tmp_path / "full", create=True)


@pytest.mark.parametrize("marker", [b"garbage", b"[1]", b"\xff\xfe"])
def test_unreadable_marker_is_a_one_line_user_error(tmp_path, marker):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "batchlab-store.json").write_bytes(marker)
    with pytest.raises(BatchlabError, match="not a readable batchlab store") as info:
        Store.open(tmp_path / "s")
    assert "\n" not in str(info.value)


def test_creating_a_store_below_a_file_is_a_user_error(tmp_path):
    (tmp_path / "afile").write_text("keep")
    with pytest.raises(BatchlabError, match="cannot create a store at"):
        Store.open(tmp_path / "afile" / "store", create=True)
    assert (tmp_path / "afile").read_text() == "keep"


def test_store_without_its_log_is_reported_damaged(tmp_path):
    Store.open(tmp_path / "s", create=True)
    (tmp_path / "s" / "log").rmdir()
    with pytest.raises(BatchlabError, match="damaged: its log/ directory is missing"):
        Store.open(tmp_path / "s")


def test_unreadable_log_entry_is_reported_damaged(tmp_path):
    store = Store.open(tmp_path / "s", create=True)
    w = writer(store)
    w.record(0, {"val/classification_error": 0.9})
    assert w.finish(status="COMPLETE", steps=1) is True
    entries = sorted((tmp_path / "s" / "log").glob("*.json"))
    assert entries
    entries[-1].write_bytes(b"{truncated")
    with pytest.raises(BatchlabError, match=f"damaged: log entry {entries[-1].name} is not valid JSON"):
        Store.open(tmp_path / "s").connect()


def test_views_have_the_documented_columns(store):
    con = store.connect()
    for name, columns in VIEW_COLUMNS.items():
        assert tuple(d[0] for d in con.execute(f"SELECT * FROM {name}").description) == columns
        assert con.execute(f"SELECT count(*) FROM {name}").fetchone()[0] == 0
    with pytest.raises(BatchlabError, match="unknown table"):
        store.table("trial")


def test_trial_is_invisible_until_finished_then_whole(store):
    w = writer(store, search_space={"learning_rate": {"type": "DOUBLE"}}, train_steps=100,
               tags={"note": "x"})
    w.record(0, {"val/classification_error": 0.9, "train/cross_entropy_error": 2.3})
    w.record(50, {"val/classification_error": 0.4})
    # written through to the OS as it goes (survives the death of the process): the journal holds every record
    lines = w.journal_path.read_text().splitlines()
    assert json.loads(lines[0])["header"]["trial_key"] == "k1"
    assert json.loads(lines[2]) == {"step": 50, "values": {"val/classification_error": 0.4}}
    assert store.table("measurements").num_rows == 0 and store.finished_trial_keys() == set()
    assert w.finish(status="COMPLETE", steps=100) is True
    assert not w.journal_path.exists()
    assert store.finished_trial_keys() == {"k1"}
    m = store.table("measurements").to_pandas().sort_values(["step", "metric"])
    assert m[["step", "metric", "value"]].values.tolist() == [
        [0, "train/cross_entropy_error", 2.3], [0, "val/classification_error", 0.9],
        [50, "val/classification_error", 0.4]]
    t = store.table("trials").to_pylist()[0]
    assert (t["status"], t["steps"], t["seed"], t["source"]) == ("COMPLETE", 100, 0, "batchlab")
    assert json.loads(t["parameters"]) == {"learning_rate": 0.1}
    s = store.table("studies").to_pylist()[0]
    assert json.loads(s["search_space"]) == {"learning_rate": {"type": "DOUBLE"}}
    assert s["train_steps"] == 100
    wl = store.table("workloads").to_pylist()[0]
    assert (wl["dataset"], wl["model"], wl["optimizer"]) == ("mnist", "fc_128_128_128", "sgd")
    assert json.loads(wl["tags"]) == {"note": "x"}


def test_next_trial_id_counts_published_and_pending(store):
    assert store.next_trial_id(W, 64) == 1
    w = writer(store, trial_id=store.next_trial_id(W, 64))
    assert store.next_trial_id(W, 64) == 2  # a running writer holds its id
    w.finish("INFEASIBLE", steps=3)
    assert store.next_trial_id(W, 64) == 2
    assert store.next_trial_id(W, 128) == 1


def test_republishing_a_key_adds_nothing(store):
    w = writer(store)
    w.record(1, {"a": 1.0})
    w.finish()
    again = writer(store, trial_id=7)
    again.record(1, {"a": 2.0})
    assert again.finish() is False
    assert store.table("measurements")["value"].to_pylist() == [1.0]
    assert store.table("trials").num_rows == 1


def test_trial_id_clash_under_another_key_is_refused(store):
    writer(store, key="a").finish()
    with pytest.raises(BatchlabError, match="already published under another trial key"):
        writer(store, key="b").finish()
    assert store.finished_trial_keys() == {"a"}


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda w: w.record(-1, {"a": 1.0}), "step must be an integer"),
        (lambda w: w.record(1.5, {"a": 1.0}), "step must be an integer"),
        (lambda w: w.record(1, {"a": "x"}), "must be a number"),
        (lambda w: (w.record(1, {"a": 1.0}), w.record(1, {"a": 2.0})), "twice at step 1"),
        (lambda w: w.finish("DONE"), "unknown trial status 'DONE'"),
    ],
)
def test_writer_rejects_bad_input(store, call, message):
    with pytest.raises(BatchlabError, match=message):
        call(writer(store))


def test_bad_writer_fields(store):
    with pytest.raises(BatchlabError, match="dataset/model/optimizer"):
        store.trial_writer(workload="mnist/sgd", batch_size=1, trial_id=1, trial_key="k",
                           parameters={})
    with pytest.raises(BatchlabError, match="batch_size must be an integer >= 1"):
        store.trial_writer(workload=W, batch_size=0, trial_id=1, trial_key="k", parameters={})


def test_publish_trials_in_one_commit(store):
    records = [
        TrialRecord(workload=W, batch_size=8, trial_id=i, trial_key=f"r{i}", parameters={"lr": i},
                    status="COMPLETE", steps=10, measurements=[(0, "loss", 1.0), (10, "loss", 0.5)])
        for i in range(1, 4)
    ]
    assert publish_trials(store, records) == 3
    assert publish_trials(store, records) == 0
    assert store.state().seq == 1
    con = store.connect()
    assert con.execute("SELECT count(*) FROM measurements").fetchone()[0] == 6
    assert isinstance(store.table("measurements"), pa.Table)


def test_numpy_numbers_are_accepted(store):
    import numpy as np

    w = store.trial_writer(workload=W, batch_size=np.int64(64), trial_id=np.int64(2), trial_key="np",
                           parameters={"learning_rate": np.float32(0.5)}, seed=np.int64(3),
                           train_steps=np.int64(10))
    w.record(np.int64(10), {"loss": np.float32(0.25)})
    assert w.finish(steps=np.int64(10))
    t = store.table("trials").to_pylist()[0]
    assert (t["batch_size"], t["trial_id"], t["seed"], t["steps"]) == (64, 2, 3, 10)
    assert json.loads(t["parameters"]) == {"learning_rate": 0.5}
    assert store.table("measurements")["value"].to_pylist() == [0.25]


def test_journal_is_fsynced_once_at_finish_not_per_record(store, monkeypatch):
    import os
    import shutil

    synced = []
    real_fsync = os.fsync
    w = writer(store)
    journal_fd = w._journal.fileno()
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    for step in range(20):
        w.record(step, {"val/classification_error": 0.5})
    assert journal_fd not in synced
    # another process sees every record without any fsync (the page cache outlives a killed writer)
    copy = store.root / "copy.jsonl"
    shutil.copyfile(w.journal_path, copy)
    assert len(copy.read_text().splitlines()) == 21
    assert w.finish() is True
    assert synced.count(journal_fd) == 1  # durable before the publish


def test_log_replay_does_not_confuse_a_recreated_store(tmp_path):
    import shutil

    first = Store.open(tmp_path / "s", create=True)
    publish_trials(first, [TrialRecord(W, 8, 1, "a", {"learning_rate": 0.1}, "COMPLETE", 3)])
    publish_trials(first, [TrialRecord(W, 8, 2, "b", {"learning_rate": 0.1}, "COMPLETE", 3)])
    assert first.finished_trial_keys() == {"a", "b"}
    shutil.copytree(tmp_path / "s", tmp_path / "copy")
    shutil.rmtree(tmp_path / "s")  # its inodes are free for the new store to reuse
    again = Store.open(tmp_path / "s", create=True)
    publish_trials(again, [TrialRecord(W, 8, 1, "c", {"learning_rate": 0.1}, "COMPLETE", 3)])
    assert again.finished_trial_keys() == {"c"} and again.state().seq == 1
    assert Store.open(tmp_path / "copy").finished_trial_keys() == {"a", "b"}


def test_open_or_create_reports_creation_and_refuses_a_missing_parent(tmp_path):
    store, created = Store.open_or_create(tmp_path / "new")
    assert created and (tmp_path / "new" / "batchlab-store.json").is_file()
    again, created = Store.open_or_create(tmp_path / "new")
    assert not created and again.root == store.root
    (tmp_path / "empty").mkdir()
    assert Store.open_or_create(tmp_path / "empty")[1]
    # a mistyped parent: one line, nothing created anywhere
    with pytest.raises(BatchlabError, match=r"cannot create a store at .*typo/store: directory .*typo does not exist") as info:
        Store.open_or_create(tmp_path / "typo" / "store")
    assert "\n" not in str(info.value) and not (tmp_path / "typo").exists()
    (tmp_path / "afile").write_text("keep")
    with pytest.raises(BatchlabError, match="is a file"):
        Store.open_or_create(tmp_path / "afile")
    with pytest.raises(BatchlabError, match=r"afile is a file, not a directory"):
        Store.open_or_create(tmp_path / "afile" / "store")
    assert (tmp_path / "afile").read_text() == "keep"


def test_a_failed_import_leaves_no_new_store_behind(tmp_path):
    from batchlab.store import store_for_import

    def failing(path):
        with pytest.raises(BatchlabError, match="bad file"):
            with store_for_import(path) as (target, created):
                assert created
                target.write_data_file("measurements", pa.table({
                    "workload": [W], "batch_size": [1], "trial_id": [1], "step": [0], "metric": ["m"],
                    "value": [1.0]}))  # an uncommitted file: removed with the store
                raise BatchlabError("bad file")

    failing(tmp_path / "new")
    assert not (tmp_path / "new").exists()
    (tmp_path / "empty").mkdir()
    failing(tmp_path / "empty")  # the user's empty directory stays, empty
    assert (tmp_path / "empty").is_dir() and list((tmp_path / "empty").iterdir()) == []
    # an existing store is never removed, and one that got a commit is kept
    store = Store.open(tmp_path / "kept", create=True)
    with pytest.raises(BatchlabError):
        with store_for_import(tmp_path / "kept") as (target, created):
            assert not created
            raise BatchlabError("bad file")
    with pytest.raises(BatchlabError):
        with store_for_import(tmp_path / "committed") as (target, created):
            publish_trials(target, [TrialRecord(workload=W, batch_size=1, trial_id=1, trial_key="k",
                                                parameters={}, status="COMPLETE", steps=0)])
            raise BatchlabError("later problem")
    assert Store.open(store.root).state().seq == 0
    assert len(Store.open(tmp_path / "committed").finished_trial_keys()) == 1


def test_a_failed_import_deletes_nothing_but_the_new_store(tmp_path):
    """The clean-up removes only the store's own entries: a file that is not part of the store stays
    (and so does its directory), and a store another process is writing into is kept whole."""
    from batchlab.store import store_for_import

    with pytest.raises(KeyboardInterrupt):
        with store_for_import(tmp_path / "new") as (target, created):
            (target.root / "notes.txt").write_text("the user's")  # not part of a store's layout
            raise KeyboardInterrupt
    assert [p.name for p in (tmp_path / "new").iterdir()] == ["notes.txt"]
    assert (tmp_path / "new" / "notes.txt").read_text() == "the user's"

    with pytest.raises(BatchlabError, match="bad file"):
        with store_for_import(tmp_path / "shared") as (target, created):
            other = Store.open(tmp_path / "shared")  # another writer, uncommitted
            other.write_data_file("measurements", pa.table({
                "workload": [W], "batch_size": [1], "trial_id": [1], "step": [0], "metric": ["m"], "value": [1.0]}))
            raise BatchlabError("bad file")
    kept = Store.open(tmp_path / "shared")
    assert kept.state().seq == 0 and len(list((tmp_path / "shared" / "data" / "measurements").iterdir())) == 1
