"""The store's integrity: the check every read makes, and ``store repair``.

**What every read checks** (:func:`verified_state`; :meth:`batchlab.store.Store.state` calls it, so
every command that reads a store does, and every commit and ``compact`` do under the store lock):

- the commit log's sequence: every entry from the latest checkpoint (from 1 if there is none) up to
  the newest entry or entry copy is present (:func:`batchlab.store.log.missing_entries`): a deleted
  entry, even the newest, is found through its copy in ``data/log/``;
- every visible data file exists, has the size its commit recorded, and begins and ends with the
  Parquet magic ``PAR1`` (a truncated, emptied or overwritten file fails one of these).

Its cost: one more directory listing, one ``stat`` per visible file, and, the first time this process
sees a file (by device, inode, size and modification time), one ``open`` and two 4-byte reads. The
sha256 recorded for each file is checked by ``store repair`` (every file) and by ``compact`` (the files
it merges), not by every read: hashing reads every byte of the store, where a query reads only the
row groups it needs. A damaged store is a :class:`StoreDamaged` (a one-line BatchlabError) naming the
first problem, how many there are, and what ``store repair`` would do.

**Repair** (:func:`repair`, under the store lock; it never deletes a file):

1. a missing entry whose copy parses and whose files all match the copy's records (size and sha256)
   is restored from the copy, byte for byte;
2. a missing entry without a verifiable copy is replaced by an empty ``repair`` entry, so the sequence
   is whole again; the files its copy names, or (no copy) every data file that no entry or copy names
   and whose writer is gone, are moved to ``quarantine/`` (they cannot be verified, so their trials
   stay invisible);
3. a visible file that is missing, has the wrong size, is not Parquet, or (``checksums``) does not
   match its sha256 is removed from the state by a ``repair`` commit and moved to ``quarantine/``
   with the other files its commit added, so no trial is left half visible (a checkpoint's file was
   merged from many commits and is moved alone);
4. every entry gets its copy, and files that have no record (a store from before records) are
   recorded by a checkpoint.

Every move is recorded in the entry that made it (its ``"repair"`` key: ``{"quarantined": [{"file",
"to", "reason"}]}``); ``compact`` never deletes a file that a ``repair`` entry removed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from batchlab.errors import BatchlabError
from batchlab.store.files import (
    TMP_PREFIX,
    exclusive_lock,
    file_record,
    lock_held,
    os_error_text,
    store_writes,
)
from batchlab.store.log import (
    LOG_COPY_DIR,
    CommitPlan,
    StoreState,
    append_entry,
    entry_name,
    list_entries,
    missing_entries,
    well_formed,
    write_entry,
    read_state,
    state_from_entries,
    write_log_copy,
)
from batchlab.store.schema import DATA_DIR, LOCK_FILE, LOG_DIR, PENDING_DIR, TABLES

__all__ = ["QUARANTINE_DIR", "StoreDamaged", "RepairAction", "check_checksums", "check_state", "verified_state",
           "plan_repair", "repair", "named_files"]

#: Where ``store repair`` moves what it cannot verify (relative to the store; same relative paths below).
QUARANTINE_DIR = "quarantine"
_MAGIC = b"PAR1"

# Files whose Parquet magic this process checked: {(st_dev, st_ino, st_size, st_mtime_ns)}; bounded.
_CHECKED: set[tuple[int, int, int, int]] = set()
_CHECKED_LIMIT = 1_000_000
_CHECKED_LOCK = threading.Lock()


class StoreDamaged(BatchlabError):
    """A store whose commit log has a gap or whose visible data files are damaged (one line)."""


@dataclass(frozen=True)
class Damage:
    """One problem: ``text`` names it; ``seq`` is the missing entry or the one that made ``file``
    visible; ``problem`` says what is wrong with ``file`` ("is missing", ...)."""

    text: str
    seq: int | None
    file: str | None = None
    problem: str = ""


def _has_magic(path: str, size: int) -> bool:
    if size < 12:  # magic, footer length, magic
        return False
    with open(path, "rb") as handle:
        head = handle.read(4)
        handle.seek(size - 4)
        return head == handle.read(4) == _MAGIC


def file_problem(root: Path, rel: str, record: dict | None, *, checksum: bool) -> str | None:
    """What is wrong with data file ``rel`` given its commit's ``record`` (None: none recorded), or None.
    ``checksum``: also compare its sha256 (reads the whole file)."""
    path = os.path.join(root, rel)  # not pathlib: this runs once per visible file at every read
    try:
        info = os.stat(path)
        if record is not None and info.st_size != record.get("size"):
            return f"has {info.st_size} bytes where its commit recorded {record.get('size')}"
        key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        if key not in _CHECKED:
            if not _has_magic(path, info.st_size):
                return "is not a Parquet file (no PAR1 magic at its start and end)"
            with _CHECKED_LOCK:
                if len(_CHECKED) >= _CHECKED_LIMIT:
                    _CHECKED.clear()
                _CHECKED.add(key)
        if checksum and record is not None and file_record(path)["sha256"] != record.get("sha256"):
            return "does not match the sha256 its commit recorded"
    except FileNotFoundError:
        return "is missing"
    except OSError as exc:
        return f"cannot be read: {os_error_text(exc)}"
    return None


def _damage(root: Path, state: StoreState, copy_seqs: list[int], *, checksums: bool) -> list[Damage]:
    damages = [Damage(f"log entry {LOG_DIR}/{entry_name(s)} is missing", s)
               for s in missing_entries(state, copy_seqs)]
    return damages + _file_damage(root, state, sorted(state.all_files()), checksums=checksums)


def _file_damage(root: Path, state: StoreState, files: list[str], *, checksums: bool) -> list[Damage]:
    damages = []
    for rel in files:
        problem = file_problem(root, rel, state.records.get(rel), checksum=checksums)
        if problem is not None:
            seq = state.added_by.get(rel)
            damages.append(Damage(f"data file {rel} (made visible by log entry {seq}) {problem}", seq, rel, problem))
    return damages


def check_state(root: Path, state: StoreState) -> None:
    """Raise :class:`StoreDamaged` if ``state`` (read under the store lock, which the caller holds) has
    a missing entry or a damaged visible file (the per-read checks of the module docstring)."""
    damages = _damage(root, state, list_entries(root / LOG_COPY_DIR), checksums=False)
    if damages:
        raise StoreDamaged(_message(root, damages))


def check_checksums(root: Path, state: StoreState, files: list[str]) -> None:
    """Raise :class:`StoreDamaged` unless each of ``files`` (visible in ``state``) matches its recorded
    size and sha256 (files without a record: existence and Parquet magic). Reads every byte of them."""
    damages = _file_damage(root, state, files, checksums=True)
    if damages:
        raise StoreDamaged(_message(root, damages))


def verified_state(root: Path) -> StoreState:
    """The current state of the store at ``root`` (lock-free), after the per-read checks; else
    :class:`StoreDamaged`, one line: the first problem, how many, and what ``store repair`` would do."""
    for _attempt in range(2):  # damage seen once may be a compaction that just replaced the files read
        copy_seqs = list_entries(root / LOG_COPY_DIR)  # before the log: see missing_entries
        state = read_state(root)
        damages = _damage(root, state, copy_seqs, checksums=False)
        if not damages:
            return state
    raise StoreDamaged(_message(root, damages))


def _message(root: Path, damages: list[Damage]) -> str:
    more = f" (and {len(damages) - 1} more problem{'s' if len(damages) > 2 else ''})" if len(damages) > 1 else ""
    command = f"`batchlab store repair --store {root}`"
    try:
        actions = [a for a in plan_repair(root, checksums=False) if a.kind in ("restore", "fill", "quarantine")]
    except (OSError, BatchlabError):
        actions = []
    if actions:
        would = "; ".join(a.describe(done=False) for a in actions[:2])
        if len(actions) > 2:
            would += f"; and {len(actions) - 2} more"
        what = f"{command} would {would}"
    else:
        what = f"see what {command} would do with --dry-run"
    return f"store {root} is damaged: {damages[0].text}{more}; {what}"


# ----------------------------------------------------------------------------------------- repair
#: (to do, done) of each kind of repair step.
_VERBS = {"restore": ("restore", "restored"), "fill": ("replace", "replaced"), "quarantine": ("move", "moved"),
          "copy": ("write", "wrote"), "record": ("record", "recorded")}


@dataclass
class RepairAction:
    """One step of a repair. ``kind``: ``restore`` (entry ``seq`` from its copy), ``fill`` (entry
    ``seq`` replaced by an empty one, ``files`` quarantined), ``quarantine`` (``files`` removed from the
    state and moved), ``copy`` (copies of the entries ``seqs`` written), ``record`` (records of
    ``files`` written by a checkpoint). ``reason``: why; ``trials``: trial rows in ``files``."""

    kind: str
    seq: int | None = None
    files: list[str] = field(default_factory=list)
    reason: str = ""
    trials: int = 0
    seqs: list[int] = field(default_factory=list)

    def describe(self, *, done: bool) -> str:
        """One clause: what this step does (``done``: did)."""
        verb = _VERBS[self.kind][done]
        n = len(self.files)
        files = f"{n} data file{'s' if n != 1 else ''}"
        trials = f"{self.trials} trial{'s' if self.trials != 1 else ''}"
        if self.kind == "restore":
            return (f"{verb} log entry {self.seq} from its copy {LOG_COPY_DIR}/{entry_name(self.seq)} "
                    f"({files} verified by size and sha256; {trials} visible again)")
        if self.kind == "fill":
            moved = f", moving {files} to {QUARANTINE_DIR}/" if n else ""
            return f"{verb} missing log entry {self.seq} by an empty entry{moved} ({self.reason})"
        if self.kind == "quarantine":
            return (f"{verb} {files} of log entry {self.seq} to {QUARANTINE_DIR}/ and commit their removal "
                    f"({self.reason}; {trials} no longer visible)")
        if self.kind == "copy":
            return f"{verb} the missing copies of {len(self.seqs)} log entries to {LOG_COPY_DIR}/"
        return f"{verb} the size and sha256 of {files} that had none (a checkpoint)"

    def as_dict(self) -> dict:
        return {"kind": self.kind, "seq": self.seq, "files": self.files, "reason": self.reason,
                "trials": self.trials, "seqs": self.seqs}


def _load_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return value if well_formed(value) else None


def _entry_files(entry: dict) -> list[str]:
    """Every data file ``entry`` adds (a checkpoint: every file of its state)."""
    source = entry.get("checkpoint") or entry.get("add") or {}
    return [f for fs in source.values() for f in fs]


def _trial_rows(root: Path, files: list[str]) -> int:
    rows = 0
    for rel in files:
        if rel.startswith(f"{DATA_DIR}/trials/"):
            try:
                rows += pq.ParquetFile(root / rel).metadata.num_rows
            except Exception:  # noqa: BLE001 - an unreadable file has no countable rows
                continue
    return rows


def named_files(root: Path) -> set[str]:
    """Every data file that an entry of the log or a copy names (adds, lists in a checkpoint, or removes)."""
    names: set[str] = set()
    for directory in (root / LOG_DIR, root / LOG_COPY_DIR):
        for seq in list_entries(directory):
            entry = _load_json(directory / entry_name(seq)) or {}
            names.update(_entry_files(entry))
            names.update(entry.get("remove") or [])
            if "checkpoint" in entry:
                names.update(f for fs in (entry.get("add") or {}).values() for f in fs)
    return names


def _orphans(root: Path, named: set[str]) -> list[str]:
    """Data files that no entry or copy names, whose writer is gone (its claim is not locked)."""
    out = []
    for table in TABLES:
        directory = root / DATA_DIR / table
        for path in sorted(directory.iterdir()) if directory.is_dir() else []:
            rel = f"{DATA_DIR}/{table}/{path.name}"
            if path.name.startswith(TMP_PREFIX) or rel in named:
                continue
            if not lock_held(root / PENDING_DIR / f"{path.name.split('-', 1)[0]}.claim", exclusive=True):
                out.append(rel)
    return out


def plan_repair(root: Path, *, checksums: bool = True) -> list[RepairAction]:
    """What :func:`repair` would do to the store at ``root`` now, in order (writes nothing).
    ``checksums``: compare every visible file's sha256 too (else the per-read checks only; the files
    of a missing entry's copy are always compared)."""
    log_seqs = list_entries(root / LOG_DIR)
    entries = {s: e for s in log_seqs if (e := _load_json(root / LOG_DIR / entry_name(s))) is not None}
    present = sorted(entries)
    state = state_from_entries([entries[s] for s in present], present)
    copy_seqs = list_entries(root / LOG_COPY_DIR)
    actions: list[RepairAction] = []
    unverifiable_gap = None
    for seq in missing_entries(state, copy_seqs):
        copy = _load_json(root / LOG_COPY_DIR / entry_name(seq)) if seq in copy_seqs else None
        if copy is None or copy.get("seq") != seq:
            actions.append(RepairAction("fill", seq, reason="it has no readable copy to verify files against"))
            unverifiable_gap = unverifiable_gap or actions[-1]
            continue
        records = copy.get("files") if isinstance(copy.get("files"), dict) else {}
        files = _entry_files(copy)
        problems = [f"{f} {p}" for f in files
                    if (p := "has no record" if f not in records
                        else file_problem(root, f, records[f], checksum=True)) is not None]
        if problems:
            kept = [f for f in files if (root / f).exists()]
            actions.append(RepairAction("fill", seq, kept, reason=f"its data file {problems[0]}",
                                        trials=_trial_rows(root, kept)))
        else:
            entries[seq] = copy
            actions.append(RepairAction("restore", seq, files, trials=_trial_rows(root, files)))
    if unverifiable_gap is not None:
        unverifiable_gap.files = _orphans(root, named_files(root))
        unverifiable_gap.trials = _trial_rows(root, unverifiable_gap.files)
        if unverifiable_gap.files:
            unverifiable_gap.reason += "; the data files no entry names are moved, as they may be its files"
    restored = sorted(entries)
    state = state_from_entries([entries[s] for s in restored], restored)
    visible = state.all_files()
    groups: dict[object, RepairAction] = {}
    for damage in _damage(root, state, [], checksums=checksums):
        if damage.file is None:
            continue
        entry = entries.get(damage.seq, {})
        whole_commit = "checkpoint" not in entry  # a checkpoint's file holds many commits' rows: alone
        key = damage.seq if whole_commit else damage.file
        if key in groups:
            continue
        siblings = [f for f in _entry_files(entry) if f in visible] if whole_commit else []
        files = sorted({damage.file, *siblings})
        intact = [f for f in files if f != damage.file
                  and file_problem(root, f, state.records.get(f), checksum=False) is None]
        groups[key] = RepairAction("quarantine", damage.seq, files, reason=f"{damage.file} {damage.problem}",
                                   trials=_trial_rows(root, intact))
        actions.append(groups[key])
    no_copy = [s for s in present if s not in copy_seqs]
    if no_copy:
        actions.append(RepairAction("copy", seqs=no_copy))
    quarantined = {f for a in actions if a.kind == "quarantine" for f in a.files}
    unrecorded = sorted(f for f in state.all_files() if f not in state.records and f not in quarantined)
    if unrecorded:
        actions.append(RepairAction("record", files=unrecorded))
    return actions


def _quarantine_target(root: Path, rel: str) -> str:
    """A free path under ``quarantine/`` for file ``rel`` (relative to the store): ``quarantine/<rel>``."""
    target = f"{QUARANTINE_DIR}/{rel}"
    n = 0
    while (root / target).exists():
        n += 1
        target = f"{QUARANTINE_DIR}/{rel}.{n}"
    return target


def _quarantine(root: Path, moves: list[dict]) -> None:
    """Move each ``{"file", "to"}`` of ``moves`` (paths relative to the store); never deletes."""
    for move in moves:
        target = root / move["to"]
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(root / move["file"], target)


def _moves(root: Path, files: list[str], reason: str) -> list[dict]:
    """The quarantine records of the ``files`` that exist: ``{"file", "to", "reason"}``."""
    return [{"file": f, "to": _quarantine_target(root, f), "reason": reason} for f in files if (root / f).exists()]


def repair(root: Path, *, dry_run: bool = False) -> list[RepairAction]:
    """Repair the store at ``root`` (see the module docstring) and return what was done, in order
    (``dry_run``: what would be done; nothing is written and the lock is not taken). Every sha256 is
    compared. An OSError (a full disk, a read-only store) is a one-line BatchlabError."""
    if dry_run:
        return plan_repair(root)
    with store_writes(root, "repair"), exclusive_lock(root / LOCK_FILE):
        actions = plan_repair(root)
        for action in actions:
            if action.kind not in ("restore", "fill"):
                continue
            name = f"{LOG_DIR}/{entry_name(action.seq)}"
            _quarantine(root, _moves(root, [name], "the log entry is not valid JSON or not a log entry"))  # a damaged entry
            if action.kind == "restore":  # the copy's own bytes (its copy is rewritten as it was)
                write_entry(root, action.seq, (root / LOG_COPY_DIR / entry_name(action.seq)).read_bytes())
                continue
            moves = _moves(root, action.files, action.reason)
            _quarantine(root, moves)  # first: once the gap is filled, compact may collect unnamed files
            write_entry(root, action.seq, json.dumps(
                {"seq": action.seq, "time": time.time(), "operation": "repair", "add": {}, "remove": [],
                 "repair": {"lost_entry": action.seq, "reason": action.reason, "quarantined": moves}}).encode())
        state = read_state(root)
        for action in actions:
            if action.kind == "quarantine":  # commit first, so the state never names a moved file
                moves = _moves(root, action.files, action.reason)
                state = append_entry(root, state, CommitPlan("repair", remove=action.files,
                                                             note={"quarantined": moves}))
                _quarantine(root, moves)
            elif action.kind == "copy":
                for seq in action.seqs:
                    write_log_copy(root, seq, (root / LOG_DIR / entry_name(seq)).read_bytes())
            elif action.kind == "record":
                state = append_entry(root, state, CommitPlan("repair", checkpoint=True))
    return actions
