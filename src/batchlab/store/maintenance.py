"""Store maintenance: counts (``store info``), compaction and garbage collection.

Compaction merges the small Parquet files of each table into larger ones, outside the lock, from a
snapshot of the state, then commits "remove the inputs, add the merged files" as one checkpoint
entry, only if every input is still committed (another compaction may have won meanwhile). Rows
are copied unchanged, so every query answers the same. Replaced files are deleted only once they
were retired more than ``grace_seconds`` ago, so a reader that opened its views just before keeps
working. Uncommitted files are deleted only when the process that wrote them is gone (its claim is
no longer locked), so a running import or trial writer never loses a file.

Nothing is deleted from a damaged store: ``compact`` first checks it as every read does
(:mod:`batchlab.store.integrity`: a gap in the log or a damaged visible file is one line naming it and
what ``store repair`` would do) and compares the sha256 of every file it merges, so a damaged file is
never merged into a new one with a fresh checksum. A data file that any log entry or entry copy names
is deleted only once an entry other than ``store repair``'s removed it more than ``grace_seconds`` ago
(it was replaced by a compaction): a file that a missing entry added, still named by that entry's
copy, stays for ``store repair`` to restore. Only files no entry ever named are deleted as soon as
their writer is gone.

Every data file, whoever writes it (the trial writer, the table and release imports, compaction),
has its table's one Parquet layout (:func:`batchlab.store.schema.parquet_options`): measurements
rows sorted by :data:`~batchlab.store.schema.MEASUREMENT_ORDER` in row groups of
:data:`~batchlab.store.schema.MEASUREMENT_ROW_GROUP_ROWS` rows, so each row group spans few
(workload, metric) pairs and a query filtering on them skips the rest through the row groups'
min/max statistics. Compaction re-sorts merged measurements with DuckDB (bounded memory) and writes
them with the same options.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from batchlab.atomic import write_path_atomic
from batchlab.store.files import (
    TMP_PREFIX,
    exclusive_lock,
    fsync_directory,
    lock_held,
    store_writes,
)
from batchlab.store.integrity import check_checksums, check_state, named_files
from batchlab.store.log import LOG_COPY_DIR, CommitPlan, StoreState, commit, entry_name, read_state
from batchlab.store.schema import (
    DATA_DIR,
    LOCK_FILE,
    LOG_DIR,
    MEASUREMENT_ORDER,
    PENDING_DIR,
    SCHEMAS,
    STATUSES,
    TABLES,
    conform,
    parquet_options,
    row_group_rows,
)
from batchlab.store.store import Store
from batchlab.store.studies import early_stopping

MERGE_TARGET_ROWS = 16_000_000  # rows per merged measurements file
SMALL_FILE_ROWS = 4_000_000  # measurements files below this are merged
SORT_MEMORY_LIMIT = "1GB"  # DuckDB's memory for compaction's sort (it spills beyond)


def study_summary(entry: dict) -> dict:
    """One study of :meth:`Store.study_definitions` as ``store info`` lists it."""
    d = entry["definition"]
    return {
        "workload": entry["workload"], "batch_size": entry["batch_size"], "study_id": entry["study_id"],
        "source": d.get("source"), "train_steps": d.get("train_steps"),
        "train_examples": d.get("train_examples"), "stop_rule": d.get("stop_rule"),
        "early_stopping": early_stopping(d),
        "evaluation": d.get("evaluation"), "seed": d.get("seed"),
        "device": d.get("device", "cpu"),  # definitions of CPU trials have no device key
        "race": d.get("race"),  # {"keep": k} for a raced study (docs/methods.md, "Racing"), else None
        "n_trials": entry["n_trials"], "statuses": entry["statuses"], "definition": d,
    }


def store_info(store: Store, workload: str | None = None) -> dict:
    """Counts of workloads, studies, trials by status and measurements, file counts, and every
    study definition (``study_definitions``: one entry per study, see :func:`study_summary`;
    of ``workload`` only if given)."""
    con = store.connect()
    try:
        by_status = dict(con.execute("SELECT status, count(*) FROM trials GROUP BY 1").fetchall())
        counts = {name: con.execute(f"SELECT count(*) FROM {name}").fetchone()[0] for name in TABLES}
    finally:
        con.close()
    state = store.state()
    studies = [study_summary(e) for e in store.study_definitions(workload)]
    per_key = Counter((s["workload"], s["batch_size"]) for s in studies)
    for s in studies:  # > 1: this batch size holds trials run under different definitions
        s["definitions_at_batch_size"] = per_key[(s["workload"], s["batch_size"])]
    return {
        "store": str(store.root),
        "workloads": counts["workloads"],
        "studies": counts["studies"],
        "trials": {status: by_status.get(status, 0) for status in STATUSES},
        "measurements": counts["measurements"],
        "files": {name: len(state.files[name]) for name in TABLES},
        "pending_trials": len(store.pending_headers()),
        "commits": state.seq,
        "study_definitions": studies,
    }


def _rows(path: Path) -> int:
    return pq.ParquetFile(path).metadata.num_rows


def _merge_groups(store: Store, name: str, files: list[str]) -> list[list[str]]:
    """Groups of committed files of table ``name`` to merge (each group becomes one file)."""
    if name != "measurements":
        return [files] if len(files) > 1 else []
    groups, current, rows = [], [], 0
    for rel in files:
        n = _rows(store.root / rel)
        if n >= SMALL_FILE_ROWS:
            continue
        current.append(rel)
        rows += n
        if rows >= MERGE_TARGET_ROWS:
            groups.append(current)
            current, rows = [], 0
    if len(current) > 1:
        groups.append(current)
    return [g for g in groups if len(g) > 1]


def _merge(store: Store, name: str, group: list[str]) -> str:
    """Write the rows of ``group`` to one new uncommitted file, streaming.

    Measurements are re-sorted by :data:`MEASUREMENT_ORDER` (DuckDB's external sort, so memory
    stays bounded) and written in the measurements layout; the other tables keep their row order and
    every column (``study_id`` and ``definition`` included)."""
    rel, path = store.new_data_path(name)
    if name == "measurements":
        write_path_atomic(path, lambda tmp: _write_sorted_measurements(store, group, tmp))
        return rel
    schema = SCHEMAS[name]

    def copy(tmp: Path) -> None:
        with pq.ParquetWriter(tmp, schema, **parquet_options(name)) as writer:
            for src in group:
                reader = pq.ParquetFile(store.root / src)
                for i in range(reader.num_row_groups):
                    # conform: a file from before study definitions gets null study_id/definition
                    # columns (the views fill them in exactly as for the unmerged file)
                    writer.write_table(conform(reader.read_row_group(i), name),
                                       row_group_size=row_group_rows(name))

    write_path_atomic(path, copy)
    return rel


def _write_sorted_measurements(store: Store, group: list[str], out: Path) -> None:
    """The rows of the measurements files ``group``, sorted by :data:`MEASUREMENT_ORDER`, into
    ``out`` with row groups of exactly ``row_group_rows("measurements")`` rows (the last shorter).

    DuckDB sorts within :data:`SORT_MEMORY_LIMIT`, spilling to a temporary directory beyond it."""
    schema = SCHEMAS["measurements"]
    group_rows = row_group_rows("measurements")
    paths = [str(store.root / rel) for rel in group]
    with tempfile.TemporaryDirectory(prefix="batchlab-sort-") as spill:
        con = duckdb.connect(config={"memory_limit": SORT_MEMORY_LIMIT, "temp_directory": spill})
        try:
            con.execute("SET enable_progress_bar = false")
            reader = con.execute(
                f"SELECT {', '.join(schema.names)} FROM read_parquet($files) "
                f"ORDER BY {', '.join(MEASUREMENT_ORDER)}",
                {"files": paths},
            ).to_arrow_reader(group_rows)
            with pq.ParquetWriter(out, schema, **parquet_options("measurements")) as writer:
                batches, rows = [], 0
                for batch in reader:
                    batches.append(batch)
                    rows += batch.num_rows
                    if rows >= group_rows:  # write whole groups, carry the rest
                        table = pa.Table.from_batches(batches)
                        whole = rows - rows % group_rows
                        writer.write_table(table.slice(0, whole).cast(schema),
                                           row_group_size=group_rows)
                        rest = table.slice(whole)
                        batches, rows = rest.to_batches(), rest.num_rows
                if batches:
                    writer.write_table(pa.Table.from_batches(batches).cast(schema),
                                       row_group_size=group_rows)
        finally:
            con.close()


@dataclass
class CompactReport:
    """What a compaction did."""

    merged: dict[str, int] = field(default_factory=dict)  # table -> input files merged
    written: dict[str, int] = field(default_factory=dict)  # table -> merged files written
    deleted_files: int = 0
    deleted_log_entries: int = 0

    def as_dict(self) -> dict:
        return {"merged": self.merged, "written": self.written,
                "deleted_files": self.deleted_files, "deleted_log_entries": self.deleted_log_entries}


def compact(store: Store, grace_seconds: float = 600.0) -> CompactReport:
    """Merge small files of every table and collect garbage; no query answer changes."""
    with store_writes(store.root, "compact"):
        return _compact(store, grace_seconds)


def _compact(store: Store, grace_seconds: float) -> CompactReport:
    report = CompactReport()
    snapshot = store.state()
    written: list[str] = []
    removed: list[str] = []
    add: dict[str, list[str]] = {}
    try:
        for name in TABLES:
            for group in _merge_groups(store, name, snapshot.files[name]):
                check_checksums(store.root, snapshot, group)  # never merge a damaged file into a new one
                add.setdefault(name, []).append(_merge(store, name, group))
                written.append(add[name][-1])
                removed.extend(group)
                report.merged[name] = report.merged.get(name, 0) + len(group)
                report.written[name] = report.written.get(name, 0) + 1

        def plan(state: StoreState) -> CommitPlan | None:
            live = state.all_files()
            if not removed or any(f not in live for f in removed):
                return None  # another compaction replaced some inputs first: keep the store as is
            return CommitPlan(operation="compact", add=add, remove=removed, checkpoint=True)

        after = commit(store.root, plan, check=lambda state: check_state(store.root, state))
        if written and any(f not in after.all_files() for f in written):
            raise RuntimeError("concurrent compaction")
    except RuntimeError:
        for rel in written:
            (store.root / rel).unlink(missing_ok=True)
        report = CompactReport()
    except BaseException:
        for rel in written:
            (store.root / rel).unlink(missing_ok=True)
        raise
    deleted_files, deleted_entries = collect_garbage(store, grace_seconds)
    report.deleted_files, report.deleted_log_entries = deleted_files, deleted_entries
    return report


def _claim_alive(pending: Path, claim_id: str) -> bool:
    """Whether the process holding ``pending/<claim_id>.claim`` lives: its file is ``flock``-ed.

    The file is opened read-only, so a claim of another user of a shared store (mode 0644) can be
    tested; one that cannot be opened at all (PermissionError) counts as alive, as does any lock
    that cannot be tested. The test takes an exclusive lock, which conflicts with the owner's shared
    lock (:attr:`batchlab.store.Store.claim_id`); where ``flock`` is emulated with POSIX locks (NFS),
    an exclusive lock needs a writable descriptor, so it is retried on one (a file that cannot be
    opened for writing then counts as alive)."""
    return lock_held(pending / f"{claim_id}.claim", exclusive=True)


def collect_garbage(store: Store, grace_seconds: float) -> tuple[int, int]:
    """Delete data files that no entry names and whose writer is gone, files a compaction replaced
    more than ``grace_seconds`` ago, dead claims (the store's, and sweep drivers' trial claims), and
    log entries (with their copies) older than the latest checkpoint by more than ``grace_seconds``;
    a damaged store (:func:`batchlab.store.integrity.check_state`) raises and nothing is deleted.
    Returns (files deleted, log entries deleted)."""
    root = store.root
    now = time.time()
    log_dir = root / LOG_DIR
    pending = root / PENDING_DIR
    deleted = 0
    with exclusive_lock(root / LOCK_FILE):  # no commit may reference a file while we look
        state = read_state(root)
        check_state(root, state)
        live = state.all_files()
        named = named_files(root)  # by an entry or a copy: committed once
        recently_retired: set[str] = set()  # readers may still use these
        retired: set[str] = set()  # committed once, replaced by a compaction long ago
        entries = []
        for p in sorted(log_dir.glob("*.json")):
            entry = json.loads(p.read_bytes())
            entries.append((p, entry))
            if entry.get("operation") == "repair":
                continue  # what repair removed was moved to quarantine/: never deleted
            if now - entry["time"] < grace_seconds:
                recently_retired.update(entry.get("remove", []))
            else:
                retired.update(entry.get("remove", []))
        alive: dict[str, bool] = {}
        for table in TABLES:
            for path in (root / DATA_DIR / table).iterdir():
                rel = f"{DATA_DIR}/{table}/{path.name}"
                if rel in live or rel in recently_retired or (rel in named and rel not in retired):
                    continue
                file_name = path.name
                if file_name.startswith(TMP_PREFIX):  # ".tmp-<hex>-<final name>": a write cut short
                    file_name = file_name[len(TMP_PREFIX):].split("-", 1)[-1]
                claim = file_name.split("-", 1)[0]
                if claim not in alive:
                    alive[claim] = _claim_alive(pending, claim)
                if rel in retired or not alive[claim]:
                    path.unlink(missing_ok=True)
                    deleted += 1
        for claim_path in pending.glob("*.claim"):
            claim = claim_path.stem
            if claim != store._claim_id and not alive.get(claim, _claim_alive(pending, claim)):
                claim_path.unlink(missing_ok=True)
        from batchlab.sweep.claims import collect_dead_claims

        collect_dead_claims(store.root, own=store._claim_id or "")  # trial claims of sweep drivers that died
        for tmp in log_dir.glob(f"{TMP_PREFIX}*"):  # we hold the lock: no commit is being written
            tmp.unlink(missing_ok=True)
        # log entries before the latest checkpoint are not needed by new readers
        last_checkpoint = max((e["seq"] for _, e in entries if "checkpoint" in e), default=0)
        removed_entries = 0
        for p, entry in entries:
            if entry["seq"] < last_checkpoint and now - entry["time"] >= grace_seconds:
                p.unlink(missing_ok=True)
                (root / LOG_COPY_DIR / entry_name(entry["seq"])).unlink(missing_ok=True)
                removed_entries += 1
        for name in TABLES:
            fsync_directory(root / DATA_DIR / name)
    return deleted, removed_entries
