"""The commit log: which immutable Parquet files make up each table right now.

``<store>/log/<seq>.json`` (``seq`` zero-padded, increasing) records one commit:
``{"seq", "time", "operation", "add": {table: [file, ...]}, "remove": [file, ...]}``; a compaction's
entry also carries ``"checkpoint": {table: [file, ...]}``, the complete state after it. Files are
paths relative to the store. A reader lists the log, starts from the latest checkpoint and replays
the entries after it; it never takes the lock. Writers append an entry under the store lock, so
sequence numbers never collide and each entry is written atomically: the data files of a commit
become visible all at once, when its entry appears, and never before. Data files not named by the
state (a crashed writer's, or ones a compaction replaced) are invisible; ``compact`` removes them
once they are older than its grace period.

Log entries never change once written, so each process keeps the entries it has parsed, keyed by
the entry file's identity (device, inode, size and modification time in nanoseconds, so a store
deleted and re-created at the same path is never confused with the old one): replaying the log
then costs one directory listing and one ``stat`` per entry since the last checkpoint, plus reading
the entries that are new, instead of re-reading and parsing every entry since the last checkpoint
at every commit and every reader connection.

**Integrity records.** An entry also carries ``"files": {file: {"size", "sha256"}}`` for every file it
adds (a checkpoint: for every file of its state), computed by :func:`commit` from the file on disk
when it is committed, so damage done later is recognisable (:mod:`batchlab.store.integrity`).
Entries of older stores have no ``"files"``; their files are checked for existence and Parquet magic
only, until a compaction or ``store repair`` writes a checkpoint that records them. After writing
entry ``seq`` a commit writes a byte-identical copy at ``<store>/data/log/<seq>.json``
(:data:`LOG_COPY_DIR`), so a deleted entry is detected (a copy without its entry) and restored from
the copy once its files verify; ``compact`` removes copies together with their entries.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from batchlab.errors import BatchlabError
from batchlab.store.files import exclusive_lock, file_record, fsync_directory, store_writes, write_bytes_atomic
from batchlab.store.schema import DATA_DIR, LOCK_FILE, LOG_DIR, TABLES

__all__ = [
    "CommitPlan", "StoreState", "LOG_COPY_DIR", "commit", "entry_name", "list_entries", "missing_entries",
    "read_state", "state_from_entries", "well_formed", "write_entry", "write_log_copy",
]

#: The directory, relative to the store, of the copies of the log entries (one per entry, same name).
LOG_COPY_DIR = f"{DATA_DIR}/log"


@dataclass
class StoreState:
    """The visible files of every table after commit ``seq`` (relative paths, in commit order).

    ``records``: the integrity record (``{"size", "sha256"}``) of each visible file whose commit
    recorded one; ``added_by``: the seq of the entry that made each visible file visible (a
    checkpoint's seq for the files it lists); ``log_seqs``: the entries listed in ``log/`` when the
    state was read; ``checkpoint_seq``: the latest checkpoint among them (0 if none)."""

    seq: int
    files: dict[str, list[str]] = field(default_factory=lambda: {t: [] for t in TABLES})
    records: dict[str, dict] = field(default_factory=dict)
    added_by: dict[str, int] = field(default_factory=dict)
    log_seqs: list[int] = field(default_factory=list)
    checkpoint_seq: int = 0

    def all_files(self) -> set[str]:
        """Every data file the state references."""
        return {f for files in self.files.values() for f in files}


@dataclass
class CommitPlan:
    """What one commit adds and removes; ``checkpoint`` marks a compaction entry."""

    operation: str
    add: dict[str, list[str]] = field(default_factory=dict)
    remove: list[str] = field(default_factory=list)
    checkpoint: bool = False
    note: dict | None = None  # recorded as the entry's "repair" key (what ``store repair`` did)


def entry_name(seq: int) -> str:
    """The file name of log entry ``seq`` (in ``log/`` and in :data:`LOG_COPY_DIR`)."""
    return f"{seq:012d}.json"


def _entry_seq(name: str) -> int | None:
    stem, dot, ext = name.partition(".")
    return int(stem) if dot and ext == "json" and stem.isdigit() else None


def list_entries(directory: Path) -> list[int]:
    """The seqs of the entries in ``directory`` (``log/`` or the copies), sorted; [] if it is missing."""
    try:
        return sorted(s for p in directory.iterdir() if (s := _entry_seq(p.name)) is not None)
    except FileNotFoundError:
        return []


def _apply(state: StoreState, entry: dict) -> None:
    seq = entry["seq"]
    if "checkpoint" in entry:
        state.files = {t: list(entry["checkpoint"].get(t, [])) for t in TABLES}
        state.records = {}
        state.added_by = {f: seq for fs in state.files.values() for f in fs}
    else:
        removed = set(entry.get("remove", []))
        if removed:
            state.files = {t: [f for f in fs if f not in removed] for t, fs in state.files.items()}
            for f in removed:
                state.records.pop(f, None)
                state.added_by.pop(f, None)
        for table, files in entry.get("add", {}).items():
            state.files[table].extend(files)
            state.added_by.update((f, seq) for f in files)
    records = entry.get("files")
    if isinstance(records, dict):
        state.records.update(records)
    state.seq = seq


# Parsed log entries of this process: {(st_dev, st_ino, st_size, st_mtime_ns of the file): entry}.
# Bounded: cleared when it grows past _ENTRY_CACHE_LIMIT (entries are then simply read again).
_ENTRY_CACHE: dict[tuple[int, int, int, int], dict] = {}
_ENTRY_CACHE_LIMIT = 100_000
_ENTRY_CACHE_LOCK = threading.Lock()


def _file_lists(value: object) -> bool:
    """Whether ``value`` is ``{table: [file, ...]}`` (a known table, file names as strings)."""
    return isinstance(value, dict) and all(
        t in TABLES and isinstance(fs, list) and all(isinstance(f, str) for f in fs) for t, fs in value.items())


def well_formed(entry: object) -> bool:
    """Whether ``entry`` has the shape of a log entry (module docstring): an integer ``seq``, ``add``
    and ``checkpoint`` as ``{table: [file, ...]}``, ``remove`` a list of files, ``files`` records as
    objects. Valid JSON of another shape is damage, as bad JSON is."""
    if not isinstance(entry, dict) or isinstance(entry.get("seq"), bool) or not isinstance(entry.get("seq"), int):
        return False
    if any(k in entry and not _file_lists(entry[k]) for k in ("add", "checkpoint")):
        return False
    remove, files = entry.get("remove", []), entry.get("files", {})
    return (isinstance(remove, list) and all(isinstance(f, str) for f in remove)
            and isinstance(files, dict) and all(isinstance(r, dict) for r in files.values()))


def _read_entry(path: Path) -> dict:
    """The parsed log entry at ``path`` (from this process's cache when this very file was read)."""
    info = os.stat(path)
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    entry = _ENTRY_CACHE.get(key)
    if entry is None:
        try:
            entry = json.loads(path.read_bytes())
            damage = None if well_formed(entry) else "is not a log entry (valid JSON of another shape)"
        except ValueError:  # bad JSON or bad UTF-8: entries are written atomically, so this is damage
            damage = "is not valid JSON"
        if damage is not None:
            root = path.parent.parent
            raise BatchlabError(f"store {root} is damaged: log entry {path.name} {damage}; "
                                f"`batchlab store repair --store {root}` restores it from its copy in "
                                f"{LOG_COPY_DIR}/ if that verifies (--dry-run says what it would do)") from None
        with _ENTRY_CACHE_LOCK:
            if len(_ENTRY_CACHE) >= _ENTRY_CACHE_LIMIT:
                _ENTRY_CACHE.clear()
            _ENTRY_CACHE[key] = entry
    return entry


def state_from_entries(entries: list[dict], log_seqs: list[int]) -> StoreState:
    """The state after replaying ``entries`` (in seq order) from the latest checkpoint among them;
    ``log_seqs``: the entries the log lists (kept in the state)."""
    start = max((i for i, e in enumerate(entries) if "checkpoint" in e), default=0)
    state = StoreState(seq=0, log_seqs=list(log_seqs))
    for entry in entries[start:]:
        _apply(state, entry)
    state.checkpoint_seq = entries[start]["seq"] if entries and "checkpoint" in entries[start] else 0
    return state


def missing_entries(state: StoreState, copy_seqs: list[int]) -> list[int]:
    """The seqs of the entries that must be in the log but are not: every seq from the latest
    checkpoint (1 if none) to the newest entry or copy (:data:`LOG_COPY_DIR`) that the log lacks.
    ``copy_seqs`` must be listed before ``state`` was read (an entry is written before its copy, so a
    commit made in between is never taken for a missing entry). Entries before the latest checkpoint
    are not needed (the checkpoint holds the whole state) and ``compact`` removes them."""
    start = state.checkpoint_seq or 1
    present = set(state.log_seqs)
    top = max([s for s in state.log_seqs if s >= start] + [s for s in copy_seqs if s >= start], default=0)
    return [s for s in range(start, top + 1) if s not in present]


def read_state(root: Path) -> StoreState:
    """Replay the log of the store at ``root`` and return the current state (lock-free)."""
    log_dir = root / LOG_DIR
    for _attempt in range(20):
        seqs = list_entries(log_dir)
        entries = []
        try:
            # Walk back to the latest checkpoint, then replay forward.
            for seq in reversed(seqs):
                entry = _read_entry(log_dir / entry_name(seq))
                entries.append(entry)
                if "checkpoint" in entry:
                    break
        except FileNotFoundError:
            continue  # a compaction removed old entries after a newer checkpoint: list again
        return state_from_entries(list(reversed(entries)), seqs)
    raise RuntimeError(f"could not read a consistent commit log in {log_dir}")


def commit(root: Path, plan_commit: Callable[[StoreState], CommitPlan | None], *,
           check: Callable[[StoreState], None] | None = None) -> StoreState:
    """Under the store lock, ask ``plan_commit(current_state)`` what to commit and append it.

    ``plan_commit`` runs while the lock is held, so it sees every earlier commit and no other
    commit can interleave (use it to drop trials whose keys are already published). It returns
    ``None`` to commit nothing. ``check(state)``, if given, runs first under the lock (the store's
    integrity check: a damaged store gets no commit); without it a missing entry
    (:func:`missing_entries`) is refused, so no commit ever takes the seq of a lost one. The entry
    records the size and sha256 of every file it adds (a checkpoint: of every file of its state);
    then its copy is written to :data:`LOG_COPY_DIR` (:func:`append_entry`). Returns the state after
    the commit. An OSError (a full disk, a read-only store) is a one-line BatchlabError, with nothing
    committed.
    """
    with store_writes(root, "commit"), exclusive_lock(root / LOCK_FILE):
        state = read_state(root)
        if check is not None:
            check(state)
        elif missing := missing_entries(state, list_entries(root / LOG_COPY_DIR)):
            raise BatchlabError(f"store {root} is damaged: log entry {entry_name(missing[0])} is missing; "
                                f"run `batchlab store repair --store {root}` before writing to it")
        plan = plan_commit(state)
        if plan is None or (not any(plan.add.values()) and not plan.remove and not plan.checkpoint):
            return state
        return append_entry(root, state, plan)


def append_entry(root: Path, state: StoreState, plan: CommitPlan) -> StoreState:
    """Append the entry of ``plan`` after ``state`` (the current state, read under the store lock,
    which the caller holds) with its integrity records, then its copy; returns the new state."""
    seq = state.seq + 1
    entry: dict = {
        "seq": seq,
        "time": time.time(),
        "operation": plan.operation,
        "add": {t: fs for t, fs in plan.add.items() if fs},
        "remove": plan.remove,
    }
    if plan.note is not None:
        entry["repair"] = plan.note
    added = [f for fs in entry["add"].values() for f in fs]
    records = {f: file_record(root / f) for f in added}
    _apply(state, {**entry, "files": records})
    if plan.checkpoint:
        entry["checkpoint"] = state.files
        records = {f: state.records.get(f) or file_record(root / f) for f in state.all_files()}
        state.records = dict(records)
    entry["files"] = records
    write_entry(root, seq, json.dumps(entry).encode())
    return state


def write_entry(root: Path, seq: int, data: bytes) -> None:
    """Write log entry ``seq`` (its bytes ``data``) atomically and durably, then its copy
    (:func:`write_log_copy`); the caller holds the store lock."""
    log_dir = root / LOG_DIR
    write_bytes_atomic(log_dir / entry_name(seq), data)
    fsync_directory(log_dir)
    write_log_copy(root, seq, data)


def write_log_copy(root: Path, seq: int, data: bytes) -> None:
    """Write the copy of entry ``seq`` (its exact bytes ``data``) to :data:`LOG_COPY_DIR`. The copy is
    redundancy: the entry is already committed, so a copy that cannot be written (a full disk) is not
    an error, and ``store repair`` writes it later."""
    copies = root / LOG_COPY_DIR
    try:
        copies.mkdir(exist_ok=True)
        write_bytes_atomic(copies / entry_name(seq), data)
    except OSError:
        pass
