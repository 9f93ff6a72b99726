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
from batchlab.store.files import exclusive_lock, fsync_directory, write_bytes_atomic
from batchlab.store.schema import LOCK_FILE, LOG_DIR, TABLES

__all__ = ["CommitPlan", "StoreState", "commit", "read_state"]


@dataclass
class StoreState:
    """The visible files of every table after commit ``seq`` (relative paths, in commit order)."""

    seq: int
    files: dict[str, list[str]] = field(default_factory=lambda: {t: [] for t in TABLES})

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


def _entry_seq(name: str) -> int | None:
    stem, dot, ext = name.partition(".")
    return int(stem) if dot and ext == "json" and stem.isdigit() else None


def _list_entries(log_dir: Path) -> list[int]:
    return sorted(s for p in log_dir.iterdir() if (s := _entry_seq(p.name)) is not None)


def _apply(state: StoreState, entry: dict) -> None:
    if "checkpoint" in entry:
        state.files = {t: list(entry["checkpoint"].get(t, [])) for t in TABLES}
    else:
        removed = set(entry.get("remove", []))
        if removed:
            state.files = {t: [f for f in fs if f not in removed] for t, fs in state.files.items()}
        for table, files in entry.get("add", {}).items():
            state.files[table].extend(files)
    state.seq = entry["seq"]


# Parsed log entries of this process: {(st_dev, st_ino, st_size, st_mtime_ns of the file): entry}.
# Bounded: cleared when it grows past _ENTRY_CACHE_LIMIT (entries are then simply read again).
_ENTRY_CACHE: dict[tuple[int, int, int, int], dict] = {}
_ENTRY_CACHE_LIMIT = 100_000
_ENTRY_CACHE_LOCK = threading.Lock()


def _read_entry(path: Path) -> dict:
    """The parsed log entry at ``path`` (from this process's cache when this very file was read)."""
    info = os.stat(path)
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    entry = _ENTRY_CACHE.get(key)
    if entry is None:
        try:
            entry = json.loads(path.read_bytes())
        except ValueError:  # bad JSON or bad UTF-8: entries are written atomically, so this is damage
            raise BatchlabError(f"store {path.parent.parent} is damaged: log entry {path.name} is not valid JSON") from None
        with _ENTRY_CACHE_LOCK:
            if len(_ENTRY_CACHE) >= _ENTRY_CACHE_LIMIT:
                _ENTRY_CACHE.clear()
            _ENTRY_CACHE[key] = entry
    return entry


def read_state(root: Path) -> StoreState:
    """Replay the log of the store at ``root`` and return the current state (lock-free)."""
    log_dir = root / LOG_DIR
    for _attempt in range(20):
        seqs = _list_entries(log_dir)
        entries = []
        try:
            # Walk back to the latest checkpoint, then replay forward.
            for seq in reversed(seqs):
                entry = _read_entry(log_dir / f"{seq:012d}.json")
                entries.append(entry)
                if "checkpoint" in entry:
                    break
        except FileNotFoundError:
            continue  # a compaction removed old entries after a newer checkpoint: list again
        state = StoreState(seq=0)
        for entry in reversed(entries):
            _apply(state, entry)
        return state
    raise RuntimeError(f"could not read a consistent commit log in {log_dir}")


def commit(root: Path, plan_commit: Callable[[StoreState], CommitPlan | None]) -> StoreState:
    """Under the store lock, ask ``plan_commit(current_state)`` what to commit and append it.

    ``plan_commit`` runs while the lock is held, so it sees every earlier commit and no other
    commit can interleave (use it to drop trials whose keys are already published). It returns
    ``None`` to commit nothing. Returns the state after the commit.
    """
    log_dir = root / LOG_DIR
    with exclusive_lock(root / LOCK_FILE):
        state = read_state(root)
        plan = plan_commit(state)
        if plan is None or (not any(plan.add.values()) and not plan.remove and not plan.checkpoint):
            return state
        entry: dict = {
            "seq": state.seq + 1,
            "time": time.time(),
            "operation": plan.operation,
            "add": {t: fs for t, fs in plan.add.items() if fs},
            "remove": plan.remove,
        }
        _apply(state, entry)
        if plan.checkpoint:
            entry["checkpoint"] = state.files
        write_bytes_atomic(log_dir / f"{entry['seq']:012d}.json", json.dumps(entry).encode())
        fsync_directory(log_dir)
        return state
