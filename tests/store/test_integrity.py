"""The checks every read of a store makes (the log's sequence, every visible file's existence, size
and Parquet magic), the records a commit writes, and writes that fail (a full disk, a read-only
store): one line, the store unchanged."""

import errno
import json

import pyarrow.parquet as pq
import pytest

from batchlab.errors import BatchlabError
from batchlab.store import Store, TrialRecord, publish_trials
from batchlab.store.files import file_record
from batchlab.store.integrity import StoreDamaged
from batchlab.store.log import LOG_COPY_DIR, entry_name
from batchlab.store.maintenance import compact
from batchlab.store.schema import LOG_DIR, TABLES
from store_damage import DAMAGE, every_file, read_only, three_commits


def _record(trial_id, key):
    return TrialRecord(workload="mnist/fc_64_64_64/sgd", batch_size=16, trial_id=trial_id, trial_key=key,
                       parameters={"learning_rate": 0.1}, status="COMPLETE", steps=4,
                       measurements=[(0, "val/classification_error", 0.9), (4, "val/classification_error", 0.5)])


def test_each_commit_records_its_files_and_writes_a_copy_of_its_entry(store):
    publish_trials(store, [_record(1, "a")])
    entry = json.loads((store.root / LOG_DIR / entry_name(1)).read_bytes())
    added = sorted(f for files in entry["add"].values() for f in files)
    assert sorted(entry["files"]) == added and len(added) == 4
    assert all(entry["files"][f] == file_record(store.root / f) for f in added)
    assert (store.root / LOG_COPY_DIR / entry_name(1)).read_bytes() == (store.root / LOG_DIR / entry_name(1)).read_bytes()
    publish_trials(store, [_record(2, "b")])
    compact(store, grace_seconds=600)  # a checkpoint records every file of its state
    state = store.state()
    assert state.checkpoint_seq == 3 and set(state.records) == state.all_files()


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_data_file_of_any_table_is_one_line_naming_it(tmp_path, table, kind):
    store = three_commits(tmp_path)
    target = next(f for f in store.state().files[table])
    DAMAGE[kind](store.root / target)
    before = every_file(store.root)
    for read in (store.state, store.connect, lambda: store.table("trials"), store.finished_trial_keys):
        with pytest.raises(StoreDamaged) as info:
            read()
        message = str(info.value)
        assert "\n" not in message and f"data file {target} (made visible by log entry 1)" in message
        assert {"deleted": "is missing", "truncated": "bytes where its commit recorded",
                "garbage": "bytes where its commit recorded"}[kind] in message
        assert f"`batchlab store repair --store {store.root}` would move 4 data files of log entry 1" in message
    assert every_file(store.root) == before


def test_a_file_without_a_record_is_checked_for_its_parquet_magic(tmp_path):
    store = three_commits(tmp_path)
    for path in (store.root / LOG_DIR).glob("*.json"):  # as an older version wrote it
        entry = json.loads(path.read_bytes())
        del entry["files"]
        path.write_text(json.dumps(entry))
    target = store.state().files["trials"][0]
    (store.root / target).write_bytes(b"x" * 100)
    with pytest.raises(StoreDamaged, match="is not a Parquet file"):
        store.state()


def test_publishing_into_a_damaged_store_is_refused_and_takes_no_seq(tmp_path):
    store = three_commits(tmp_path)
    (store.root / LOG_DIR / entry_name(3)).unlink()  # the newest: found only through its copy
    with pytest.raises(StoreDamaged, match="log entry log/000000000003.json is missing"):
        publish_trials(Store(store.root), [_record(1, "a")])
    assert not (store.root / LOG_DIR / entry_name(3)).exists()
    assert json.loads((store.root / LOG_COPY_DIR / entry_name(3)).read_bytes())["seq"] == 3


def _without_claims(files):
    """``files`` less the claim this process holds (released when its store object is done)."""
    return {k: v for k, v in files.items() if not k.endswith(".claim")}


def _full_disk_after_half(real):
    """``real`` (a function writing a file at its second argument), which writes part of the file and
    then fails as a full disk does."""
    def write(table, path, *args, **kwargs):
        real(table, path, *args, **kwargs)
        with open(path, "r+b") as handle:
            handle.truncate(handle.seek(0, 2) // 2)
        raise OSError(errno.ENOSPC, "No space left on device")
    return write


def test_a_full_disk_while_publishing_is_one_line_and_the_store_is_unchanged(store, monkeypatch):
    publish_trials(store, [_record(1, "a")])
    before = every_file(store.root)
    monkeypatch.setattr(pq, "write_table", _full_disk_after_half(pq.write_table))
    with pytest.raises(BatchlabError) as info:
        publish_trials(store, [_record(2, "b")])
    assert "\n" not in str(info.value) and "No space left on device (ENOSPC)" in str(info.value)
    assert str(store.root) in str(info.value)
    assert _without_claims(every_file(store.root)) == _without_claims(before)


def test_a_full_disk_while_writing_the_log_entry_is_one_line_and_the_store_is_unchanged(store, monkeypatch):
    from batchlab.store import log

    publish_trials(store, [_record(1, "a")])
    before = every_file(store.root)
    real = log.write_bytes_atomic

    def full(path, data, **kwargs):
        if path.parent.name == LOG_DIR:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data, **kwargs)

    monkeypatch.setattr(log, "write_bytes_atomic", full)
    with pytest.raises(BatchlabError, match=r"cannot commit in store .*No space left on device \(ENOSPC\)"):
        publish_trials(store, [_record(2, "b")])
    assert _without_claims(every_file(store.root)) == _without_claims(before)
    assert [r["trial_key"] for r in Store(store.root).table("trials").to_pylist()] == ["a"]


def test_a_read_only_store_reads_and_refuses_writes_in_one_line(tmp_path, monkeypatch):
    store = three_commits(tmp_path)
    before = every_file(store.root)
    read_only(monkeypatch, store.root)
    reader = Store.open(store.root)
    assert reader.table("trials").num_rows == 24  # reading writes nothing
    for write in (lambda: publish_trials(Store.open(store.root), [_record(1, "a")]),
                  lambda: compact(Store.open(store.root)),
                  lambda: Store.open(store.root).trial_writer(workload="mnist/fc_64_64_64/sgd", batch_size=16,
                                                              trial_id=1, trial_key="w", parameters={})):
        with pytest.raises(BatchlabError) as info:
            write()
        assert "\n" not in str(info.value) and "Read-only file system (EROFS)" in str(info.value)
    monkeypatch.undo()
    assert every_file(store.root) == before
