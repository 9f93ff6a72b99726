import os

import pyarrow.parquet as pq
import pytest

from batchlab.store import Store
from batchlab.store.batch_science_import import import_batch_science
from batchlab.store.maintenance import compact, store_info

QUERIES = [
    "SELECT * FROM workloads ORDER BY ALL",
    "SELECT * FROM studies ORDER BY ALL",
    "SELECT * FROM trials ORDER BY ALL",
    "SELECT * FROM measurements ORDER BY ALL",
    "SELECT workload, batch_size, min(step) FROM measurements WHERE metric = 'val/classification_error' "
    "AND value < 0.3 GROUP BY ALL ORDER BY ALL",
]


def answers(store):
    con = store.connect()
    return [con.execute(q).fetchall() for q in QUERIES]


def fill(store, release_root, n_writers=5):
    import_batch_science(store, release_root / "cifar_10")
    for i in range(n_writers):
        w = store.trial_writer(workload="mnist/fc_64_64_64/sgd", batch_size=16, trial_id=i + 1,
                               trial_key=f"w{i}", parameters={"learning_rate": i / 10})
        for step in range(0, 30, 7):
            w.record(step, {"val/classification_error": 1 / (1 + step + i)})
        w.finish(status=("COMPLETE", "INFEASIBLE")[i % 2], steps=28)
    import_batch_science(store, release_root)


def test_info_counts(store, release):
    fill(store, release[0])
    info = store_info(store)
    assert info["workloads"] == 4 and info["studies"] == 7
    assert info["trials"] == {"COMPLETE": 12 + 3, "INCOMPLETE": 6, "INFEASIBLE": 6 + 2, "STOPPED_AT_GOAL": 0, "RACED": 0}
    assert len(info["study_definitions"]) == 7
    mine = [s for s in info["study_definitions"] if s["workload"] == "mnist/fc_64_64_64/sgd"]
    assert len(mine) == 1 and mine[0]["n_trials"] == 5 and mine[0]["source"] == "batchlab"
    assert mine[0]["statuses"] == {"COMPLETE": 3, "INCOMPLETE": 0, "INFEASIBLE": 2, "STOPPED_AT_GOAL": 0, "RACED": 0}
    assert info["measurements"] == 24 * 10 + 5 * 5


def test_compaction_preserves_every_answer_and_merges(store, release):
    fill(store, release[0])
    before = answers(store)
    files_before = {k: len(v) for k, v in store.state().files.items()}
    assert files_before["measurements"] == 7
    reader = store.connect()  # opened before the compaction: must keep working (grace period)
    report = compact(store, grace_seconds=600)
    assert report.merged["measurements"] == 7 and report.written["measurements"] == 1
    assert {k: len(v) for k, v in store.state().files.items()} == {
        "workloads": 1, "studies": 1, "trials": 1, "measurements": 1}
    assert answers(store) == before
    assert reader.execute(QUERIES[3]).fetchall() == before[3]
    # a second compaction with no grace removes the replaced files and old log entries
    report = compact(store, grace_seconds=0)
    assert report.deleted_files == 7 + 7 + 3 + 3 and report.deleted_log_entries == 7
    live = {os.path.join(store.root, f) for f in store.state().all_files()}
    on_disk = {str(p) for p in (store.root / "data").rglob("*.parquet")}
    assert on_disk == live
    assert answers(Store.open(store.root)) == before


def test_garbage_of_dead_writers_is_collected_but_live_files_are_kept(store, release, tmp_path):
    fill(store, release[0], n_writers=1)
    # a file of a writer that died (its claim is not locked) and one of a live writer (this one)
    dead = store.root / "data" / "measurements" / "deadbeef-0.parquet"
    pq.write_table(store.table("measurements"), dead)
    _, live_path = store.new_data_path("measurements")
    pq.write_table(store.table("measurements"), live_path)
    compact(store, grace_seconds=0)
    assert not dead.exists() and live_path.exists()


def test_compaction_writes_measurements_in_the_import_layout(store, release, monkeypatch):
    # Many small files (one per trial writer); the merged file is re-sorted by
    # (workload, metric, batch_size, trial_id, step) with the layout's row groups.
    from batchlab.store import maintenance, schema
    from test_batch_science_import import sorted_by_layout

    fill(store, release[0])
    before = answers(store)
    monkeypatch.setattr(schema, "MEASUREMENT_ROW_GROUP_ROWS", 32)
    compact(store, grace_seconds=600)
    (merged,) = store.state().files["measurements"]
    parquet = pq.ParquetFile(store.root / merged)
    assert sorted_by_layout(parquet.read())
    sizes = [parquet.metadata.row_group(i).num_rows for i in range(parquet.metadata.num_row_groups)]
    assert sizes[:-1] == [32] * (len(sizes) - 1) and 0 < sizes[-1] <= 32
    assert sum(sizes) == 24 * 10 + 5 * 5
    assert parquet.schema_arrow.field("metric").type == maintenance.SCHEMAS["measurements"].field("metric").type
    assert answers(store) == before


def _three_commits(store, release_root):
    for part in ("mnist", "cifar_10", "mnist_subsets"):
        import_batch_science(store, release_root / part)
    store.release_claim()  # as when the importing process has ended: its uncommitted files are garbage


def _data_files(store):
    return {str(p.relative_to(store.root)): p.read_bytes() for p in (store.root / "data").rglob("*.parquet")}


def test_compact_never_deletes_the_files_of_a_deleted_log_entry(store, release):
    from batchlab.errors import BatchlabError

    _three_commits(store, release[0])
    files = _data_files(store)
    (store.root / "log" / "000000000002.json").unlink()  # its data files are intact
    with pytest.raises(BatchlabError, match="log entry log/000000000002.json is missing"):
        compact(store, grace_seconds=0)
    assert _data_files(store) == files  # nothing merged, nothing deleted: repair can restore the entry


def test_compact_never_merges_a_file_whose_checksum_does_not_match(store, release):
    from batchlab.errors import BatchlabError

    _three_commits(store, release[0])
    victim = store.root / store.state().files["measurements"][1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, Parquet magic intact: only the sha256 tells
    victim.write_bytes(bytes(data))
    files = _data_files(store)
    with pytest.raises(BatchlabError, match="does not match the sha256 its commit recorded"):
        compact(store, grace_seconds=0)
    assert _data_files(store) == files and store.state().seq == 3
