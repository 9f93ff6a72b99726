"""The measurement store: a directory of immutable Parquet files queried through DuckDB views.

Layout of a store directory (the names are in :mod:`batchlab.store.schema`)::

    batchlab-store.json       marker and format version
    _lock                     commit lock (flock)
    log/<seq>.json            commit log (see :mod:`batchlab.store.log`)
    data/<table>/<claim>-<uuid>.parquet   (.s2.parquet for trials and studies)
    data/log/<seq>.json       a copy of each log entry (:mod:`batchlab.store.integrity`)
    pending/<uuid>.jsonl      journals of trials being written (durable, never visible)
    pending/<claim>.claim     locked while the process writing files under that claim lives
    quarantine/               what ``store repair`` could not verify (moved, never deleted)

Every read checks the log's sequence and the visible files (:func:`batchlab.store.integrity.verified_state`):
a damaged store is one line naming the damage and what ``batchlab store repair`` would do.

Readers (:meth:`Store.connect`) open a fresh in-memory DuckDB connection whose views name only
the files of committed trials, so they see whole trials only and no ``.duckdb`` file is shared.
Many processes may write at once: data files get unique names and commits are serialised by a
short lock, during which a commit drops trials whose ``trial_key`` is already published.

Writing trials is :mod:`batchlab.store.writer` (:meth:`Store.trial_writer` is a shortcut to it);
the writer depends on this module's :class:`Store` only through the methods it calls, and does not
import this module.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batchlab.errors import BatchlabError, unknown_name_error
from batchlab.store.files import (
    TMP_PREFIX,
    exclusive_lock,
    fsync_directory,
    store_writes,
    write_bytes_atomic,
    write_data_table,
)
from batchlab.store.integrity import check_state, verified_state
from batchlab.store.log import CommitPlan, StoreState, commit, read_state
from batchlab.store.schema import (
    ADVICE_DIR,
    DATA_DIR,
    FORMAT_VERSION,
    LOCK_FILE,
    LOG_DIR,
    MARKER,
    PENDING_DIR,
    SCHEMAS,
    STATUSES,
    STORE_DIRS,
    TABLES,
    conform,
    data_file_name,
    empty_table,
    view_sql,
)
from batchlab.store.studies import TRIAL_ID_BLOCK, id_block
from batchlab.store.writer import TrialWriter

__all__ = ["Store", "store_for_import"]  # the schema's names are batchlab.store.schema's


class Store:
    """A measurement store rooted at a directory (see the module docstring for the layout)."""

    def __init__(self, root: Path, claim_id: str | None = None):
        self.root = Path(root)
        # Parquet files never change once written, so small tables are cached per file.
        self._file_cache: dict[str, pa.Table] = {}
        # Data files are written under a claim (see ``claim_id``); a forked worker reuses the
        # claim of the process that will commit its files.
        self._claim_id = claim_id
        self._claim_fd: int | None = None
        self.created = False  # this object's open() made the store (open_or_create reports it)

    @property
    def claim_id(self) -> str:
        """The id prefixed to every data file this process writes before committing it.

        ``pending/<id>.claim`` stays flock-ed while this process lives, which tells ``compact``
        that the uncommitted files named ``<id>-*.parquet`` are in use and must be kept; once
        the process is gone (even by SIGKILL) they are garbage.
        """
        if self._claim_id is None:
            claim_id = uuid.uuid4().hex
            with store_writes(self.root, "write"):
                fd = os.open(self.root / PENDING_DIR / f"{claim_id}.claim", os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_SH)
            self._claim_id, self._claim_fd = claim_id, fd
        return self._claim_id

    def release_claim(self) -> None:
        """Remove this process's claim file, when it made one (the end of a one-shot write such as an
        import): data files of the claim that are not committed are then garbage for ``compact``, and
        nothing of a refused write stays behind. Never raises; a later write takes a new claim. Not
        for a store object whose claim forked workers still use."""
        if self._claim_fd is None:
            return
        try:
            (self.root / PENDING_DIR / f"{self._claim_id}.claim").unlink(missing_ok=True)
        except OSError:
            pass
        os.close(self._claim_fd)
        self._claim_id, self._claim_fd = None, None

    # ----------------------------------------------------------------- opening
    @classmethod
    def open(cls, path: str | Path, create: bool = False) -> Store:
        """Open the store at ``path``; with ``create=True`` make it if missing (or empty).

        Raises BatchlabError if ``path`` is not a store and ``create`` is false, or if it is a
        non-empty directory that is not a store.
        """
        root = Path(path)
        marker = root / MARKER
        if marker.is_file():
            try:
                info = json.loads(marker.read_bytes())
            except (OSError, ValueError):  # ValueError covers bad JSON and bad UTF-8
                info = None
            if not isinstance(info, dict):
                raise BatchlabError(f"{root} is not a readable batchlab store: its {MARKER} is not a JSON object")
            if info.get("version") != FORMAT_VERSION:
                raise BatchlabError(
                    f"store {root} has format version {info.get('version')!r}; "
                    f"this batchlab reads version {FORMAT_VERSION}"
                )
            if not (root / LOG_DIR).is_dir():
                raise BatchlabError(f"store {root} is damaged: its {LOG_DIR}/ directory is missing")
            return cls(root)
        if root.exists() and not root.is_dir():
            raise BatchlabError(f"store path {root} is a file, not a directory")
        if not create:
            raise BatchlabError(
                f"no batchlab store at {root} (create one by importing or writing trials into it)"
            )
        if root.is_symlink() and not root.exists():
            raise BatchlabError(f"cannot create a store at {root}: it is a symbolic link to "
                                f"{os.readlink(root)}, which does not exist")
        if root.is_dir():  # an existing (empty) directory, a symbolic link to one, a mount point
            return cls._create_in_place(root)
        return cls._create_by_rename(root)

    @classmethod
    def _created(cls, root: Path) -> Store:
        store = cls(root)
        store.created = True
        return store

    @classmethod
    def _create_in_place(cls, root: Path) -> Store:
        """Make a store inside the existing directory ``root`` (empty, or holding only a store being
        made by another process): the subdirectories first, then the marker, hard-linked from a
        temporary file in the store, so it appears whole and exactly one process's link succeeds;
        that process made the store (``created``), the others open it."""
        marker = root / MARKER
        try:
            names = [p.name for p in root.iterdir()]
        except OSError as exc:
            raise BatchlabError(f"cannot create a store at {root}: {exc.strerror or exc}") from None
        layout = {LOCK_FILE, "lost+found", ADVICE_DIR, *(sub.split("/", 1)[0] for sub in STORE_DIRS)}  # lost+found: an ext4 mount point
        if any(n not in layout and n != MARKER and not (n.startswith(TMP_PREFIX) and n.endswith(MARKER))
               for n in names):
            if marker.is_file():  # another process created it meanwhile
                return cls.open(root)
            raise BatchlabError(f"{root} is a non-empty directory that is not a batchlab store")
        if marker.is_file():
            return cls.open(root)
        content = json.dumps({"format": "batchlab-store", "version": FORMAT_VERSION}).encode()
        tmp = root / f"{TMP_PREFIX}{uuid.uuid4().hex}-{MARKER}"
        try:
            for sub in STORE_DIRS:
                (root / sub).mkdir(parents=True, exist_ok=True)
            _write_new_file(tmp, content)
            try:
                os.link(tmp, marker)  # atomic, and fails if the marker exists: one creator wins
            except FileExistsError:
                return cls.open(root)  # another process made it
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK):
                    raise
                # no hard links on this file system: create the marker exclusively instead
                try:
                    _write_new_file(marker, content)
                except FileExistsError:
                    return cls.open(root)
            try:
                fsync_directory(root)
            except OSError:
                pass
        except OSError as exc:
            raise BatchlabError(f"cannot create a store at {root}: {exc.strerror or exc}") from None
        finally:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
        return cls._created(root)

    @classmethod
    def _create_by_rename(cls, root: Path) -> Store:
        """Make a store at the path ``root``, which does not exist: built in a hidden sibling
        directory and renamed into place (atomic), so no process ever sees a half-made store, and of
        two processes creating one store at once the loser opens the winner's. The sibling stays
        ``flock``-ed while it is built, so one left by a killed process is recognised and removed by
        the next creation. If ``root`` appeared meanwhile as an empty directory, it is made in place."""
        marker = root / MARKER
        parent = root.absolute().parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BatchlabError(f"cannot create a store at {root}: {exc.strerror or exc}") from None
        _remove_dead_builds(parent, root.name)
        building = parent / f"{TMP_PREFIX}{uuid.uuid4().hex}-{root.name}"
        try:
            building.mkdir()
        except OSError as exc:
            if root.is_dir():  # the parent is not writable, but the store's directory appeared
                return cls._create_in_place(root)
            raise BatchlabError(f"cannot create a store at {root}: {exc.strerror or exc}") from None
        fd = None
        try:
            try:
                fd = os.open(building, os.O_RDONLY)
                fcntl.flock(fd, fcntl.LOCK_EX)  # "being built": not a leftover of a killed process
                for sub in STORE_DIRS:
                    (building / sub).mkdir(parents=True, exist_ok=True)
                write_bytes_atomic(
                    building / MARKER, json.dumps({"format": "batchlab-store", "version": FORMAT_VERSION}).encode()
                )
            except OSError as exc:
                raise BatchlabError(f"cannot create a store at {root}: {exc.strerror or exc}") from None
            try:
                os.rename(building, root)
            except OSError as exc:
                if marker.is_file():  # another process won the race: use its store
                    return cls.open(root)
                if root.is_dir():  # appeared meanwhile (an empty directory, a mount point): build in it
                    return cls._create_in_place(root)
                if root.exists():
                    raise BatchlabError(f"store path {root} is a file, not a directory") from None
                raise BatchlabError(f"cannot create a store at {root}: {exc.strerror or exc}") from None
        finally:
            if building.exists():
                shutil.rmtree(building, ignore_errors=True)
            if fd is not None:
                os.close(fd)
        return cls._created(root)

    @classmethod
    def open_or_create(cls, path: str | Path) -> tuple[Store, bool]:
        """The store at ``path`` and whether this call created it: ``(store, created)``.

        A new store is created when ``path`` does not exist or is an empty directory; its parent
        directory must exist, so a mistyped path (``runs/stor/x`` for ``runs/store/x``) is a one-line
        BatchlabError and creates nothing. Callers tell the user when ``created`` is true (the CLI
        prints "created a new store at PATH" on stderr). Otherwise as :meth:`open`: BatchlabError for a
        file, a non-empty directory that is not a store, or an unreadable store.
        """
        root = Path(path)
        if (root / MARKER).is_file():
            return cls.open(root), False
        if not root.exists():
            parent = root.absolute().parent
            if parent.exists() and not parent.is_dir():
                raise BatchlabError(f"cannot create a store at {root}: {parent} is a file, not a directory")
            if not parent.is_dir():
                raise BatchlabError(
                    f"cannot create a store at {root}: directory {parent} does not exist "
                    "(create it first, or check the path)"
                )
        store = cls.open(root, create=True)
        return store, store.created

    # ----------------------------------------------------------------- reading
    def state(self) -> StoreState:
        """The committed files of every table, now, after the integrity checks every read makes
        (:func:`batchlab.store.integrity.verified_state`: the log's sequence, and each visible file's
        existence, size and Parquet magic); a damaged store raises a one-line
        :class:`batchlab.store.integrity.StoreDamaged`."""
        return verified_state(self.root)

    def connect(self, threads: int | None = None):
        """A fresh in-memory DuckDB connection with views ``workloads``, ``studies``, ``trials``
        and ``measurements`` over the files committed at the time of the call."""
        import duckdb

        con = duckdb.connect()
        # Data files are immutable and uniquely named, so their Parquet footers can be cached: a
        # query that scans the measurements once per (workload, metric) parses each footer once.
        con.execute("SET parquet_metadata_cache = true")
        if threads is not None:
            con.execute(f"SET threads TO {int(threads)}")
        state = self.state()
        for name in TABLES:
            files = [str(self.root / f) for f in state.files[name]]
            con.execute(f"CREATE VIEW {name} AS {view_sql(name, files)}")
        return con

    def table(self, name: str) -> pa.Table:
        """The view ``name`` as an Arrow table (``.to_pandas()`` for pandas)."""
        if name not in TABLES:
            raise unknown_name_error("table", name, TABLES)
        con = self.connect()
        try:
            return con.table(name).to_arrow_table()
        finally:
            con.close()

    def _read_files(self, files: Iterable[str], columns: list[str] | None = None,
                    name: str | None = None) -> pa.Table:
        tables = []
        for rel in files:
            table = self._file_cache.get(rel)
            if table is None:
                table = pq.read_table(self.root / rel)
                if name in ("trials", "studies"):  # a file from before study definitions: add nulls
                    table = conform(table, name)
                self._file_cache[rel] = table
            tables.append(table.select(columns) if columns else table)
        if not tables:
            return None
        return pa.concat_tables(tables)

    def _committed(self, name: str, state: StoreState, columns: list[str]) -> pa.Table:
        table = self._read_files(state.files[name], columns, name)
        return table if table is not None else empty_table(name).select(columns)

    def finished_trial_keys(self) -> set[str]:
        """Keys of every published (finished) trial."""
        keys = self._committed("trials", self.state(), ["trial_key"]).column("trial_key")
        return set(keys.to_pylist())

    def next_trial_id(self, workload: str, batch_size: int) -> int:
        """One more than the largest trial id used at (workload, batch_size), published or pending;
        1 when there is none. Trial ids are unique per (workload, batch_size). When that id falls in a
        block of ids (``TRIAL_ID_BLOCK``) that holds a sweep's trials, the first id of the next block
        instead, so the sweep's own block stays free for more of its points."""
        state = self.state()
        trials = self._committed("trials", state, ["workload", "batch_size", "trial_id", "study_id"])
        trials = trials.filter(pc.and_(
            pc.equal(trials["workload"], workload), pc.equal(trials["batch_size"], batch_size)
        ))
        ids = trials["trial_id"]
        largest = pc.max(ids).as_py() if len(ids) else 0
        for header in self.pending_headers():
            if header["workload"] == workload and header["batch_size"] == batch_size:
                largest = max(largest, header["trial_id"])
        candidate = largest + 1
        block = id_block(candidate)
        if block in self._sweep_blocks(state, workload, batch_size, trials):
            candidate = (block + 1) * TRIAL_ID_BLOCK + 1
        return candidate

    def _sweep_blocks(self, state: StoreState, workload: str, batch_size: int, trials: pa.Table) -> set[int]:
        """The id blocks at (workload, batch_size) that hold ``trials`` (those published there) of a
        sweep's study definitions (definitions with a ``sweep`` key)."""
        studies = self._committed("studies", state, ["workload", "batch_size", "study_id", "definition"])
        studies = studies.filter(pc.and_(
            pc.equal(studies["workload"], workload), pc.equal(studies["batch_size"], batch_size)
        ))
        swept = {sid for sid, text in zip(studies["study_id"].to_pylist(), studies["definition"].to_pylist())
                 if text and "sweep" in json.loads(text)}
        return {id_block(tid) for tid, sid in zip(trials["trial_id"].to_pylist(), trials["study_id"].to_pylist())
                if sid in swept}

    def pending_headers(self) -> list[dict]:
        """Headers of the journals of trials being written (or abandoned by a crash)."""
        headers = []
        for path in sorted((self.root / PENDING_DIR).glob("*.jsonl")):
            try:
                with open(path, "rb") as handle:
                    first = handle.readline()
                headers.append(json.loads(first)["header"])
            except (FileNotFoundError, ValueError, KeyError):
                continue  # finished (removed) meanwhile, or killed before its header was durable
        return headers

    def study_definitions(self, workload: str | None = None) -> list[dict]:
        """Every study of the store (of ``workload`` only, if given), sorted by workload, batch size
        and study id: one dict per study with ``workload``, ``batch_size``, ``study_id``,
        ``definition`` (dict), ``n_trials`` and ``statuses`` ({status: count}, every status)."""
        con = self.connect()
        try:
            where, params = ("WHERE workload = ?", [workload]) if workload is not None else ("", [])
            rows = con.execute(
                f"""
                WITH s AS (SELECT workload, batch_size, study_id, any_value(definition) AS definition
                           FROM studies {where} GROUP BY ALL),
                     t AS (SELECT workload, batch_size, study_id, status, count(*) AS n
                           FROM trials {where} GROUP BY ALL)
                SELECT s.workload, s.batch_size, s.study_id, s.definition, t.status, t.n
                FROM s LEFT JOIN t USING (workload, batch_size, study_id)
                ORDER BY 1, 2, 3
                """, params + params).fetchall()
        finally:
            con.close()
        out: dict[tuple, dict] = {}
        for w, b, sid, definition, status, n in rows:
            entry = out.setdefault((w, b, sid), {
                "workload": w, "batch_size": b, "study_id": sid,
                "definition": json.loads(definition) if definition else {},
                "n_trials": 0, "statuses": {s: 0 for s in STATUSES},
            })
            if status is not None:
                entry["statuses"][status] = entry["statuses"].get(status, 0) + int(n)
                entry["n_trials"] += int(n)
        return list(out.values())

    # ----------------------------------------------------------------- writing
    def trial_writer(
        self,
        *,
        workload: str,
        batch_size: int,
        trial_id: int,
        trial_key: str,
        parameters: Mapping[str, Any],
        seed: int | None = None,
        source: str = "batchlab",
        search_space: Mapping[str, Any] | None = None,
        train_steps: int | None = None,
        early_stopping: bool = False,
        tags: Mapping[str, Any] | None = None,
        study_definition: Mapping[str, Any] | None = None,
    ):
        """Start writing one trial; see :class:`batchlab.store.writer.TrialWriter`.

        ``study_definition`` (:func:`batchlab.store.studies.make_study_definition`) names the study
        the trial belongs to; None builds one from ``train_steps``, ``search_space``, ``seed``,
        ``source`` and ``early_stopping``."""
        return TrialWriter(
            self,
            workload=workload,
            batch_size=batch_size,
            trial_id=trial_id,
            trial_key=trial_key,
            parameters=parameters,
            seed=seed,
            source=source,
            search_space=search_space,
            train_steps=train_steps,
            early_stopping=early_stopping,
            tags=tags,
            study_definition=study_definition,
        )

    def new_data_path(self, table: str) -> tuple[str, Path]:
        """A fresh unique file name for ``table``: (path relative to the store, absolute path)."""
        rel = data_file_name(table, self.claim_id, uuid.uuid4().hex)
        return rel, self.root / rel

    def write_data_file(self, table: str, data: pa.Table, *, presorted: bool = False) -> str:
        """Write ``data`` (cast to the table's schema) as a new, not yet committed, file in the
        table's one Parquet layout (:func:`batchlab.store.files.write_data_table`; measurement rows
        are sorted into the layout's order unless ``presorted``); returns its path relative to the
        store."""
        rel, path = self.new_data_path(table)
        with store_writes(self.root, f"write a {table} file"):
            write_data_table(table, data, path, presorted=presorted)
        return rel

    def publish(
        self,
        trials: pa.Table,
        measurement_files: list[str],
        workloads: pa.Table | None = None,
        studies: pa.Table | None = None,
        operation: str = "append",
    ) -> int:
        """Commit ``trials`` (TRIALS_SCHEMA rows) with their already written measurement files.

        Under the store lock: trials whose ``trial_key`` is already published are dropped (their
        measurements are filtered out of the given files, which are rewritten if needed); a trial
        whose (workload, batch_size, trial_id) is already published under another key raises
        BatchlabError and commits nothing. Workload rows already present, and study rows whose
        (workload, batch_size, study_id) is already present, are dropped.
        Returns the number of trials published.
        """
        trials = trials.cast(SCHEMAS["trials"])
        _check_unique_within(trials)
        written: list[str] = []

        published = [0]

        def plan(state: StoreState) -> CommitPlan | None:
            missing = [f for f in measurement_files if not (self.root / f).is_file()]
            if missing:
                raise BatchlabError(f"uncommitted data file {missing[0]} vanished before the commit")
            committed = self._committed(
                "trials", state, ["workload", "batch_size", "trial_id", "trial_key"]
            )
            new_trials = trials
            m_files = list(measurement_files)
            if committed.num_rows:
                dup = pc.is_in(trials["trial_key"], committed["trial_key"])
                if pc.any(dup).as_py():
                    dropped = trials.filter(dup)
                    new_trials = trials.filter(pc.invert(dup))
                    m_files = self._drop_measurements(m_files, dropped, written)
                _check_no_id_collision(new_trials, committed)
            add: dict[str, list[str]] = {"measurements": m_files}
            if new_trials.num_rows:
                add["trials"] = [self.write_data_file("trials", new_trials)]
            if workloads is not None and workloads.num_rows:
                have = self._committed("workloads", state, ["workload"])["workload"]
                fresh = workloads.filter(pc.invert(pc.is_in(workloads["workload"], have)))
                if fresh.num_rows:
                    add["workloads"] = [self.write_data_file("workloads", fresh)]
            if studies is not None and studies.num_rows:
                key = ["workload", "batch_size", "study_id"]
                studies_now = _dedup(studies.cast(SCHEMAS["studies"]), key)
                have = self._committed("studies", state, key)
                fresh = _anti_join(studies_now, have, key)
                if fresh.num_rows:
                    add["studies"] = [self.write_data_file("studies", fresh)]
            written.extend(f for name, files in add.items() if name != "measurements" for f in files)
            published[0] = new_trials.num_rows
            if not any(add.values()):
                return None
            return CommitPlan(operation=operation, add=add)

        try:
            commit(self.root, plan, check=lambda state: check_state(self.root, state))
        except BaseException:
            for rel in written:
                (self.root / rel).unlink(missing_ok=True)
            raise
        return published[0]

    def _drop_measurements(self, files: list[str], dropped: pa.Table, written: list[str]) -> list[str]:
        """Rewrite measurement ``files`` without the rows of the ``dropped`` trials."""
        kept = []
        keys = ["workload", "batch_size", "trial_id"]
        for rel in files:
            table = pq.read_table(self.root / rel)
            remaining = _anti_join(table, dropped.select(keys), keys)
            if remaining.num_rows == table.num_rows:
                kept.append(rel)
                continue
            if remaining.num_rows:
                new_rel = self.write_data_file("measurements", remaining)
                written.append(new_rel)
                kept.append(new_rel)
            (self.root / rel).unlink(missing_ok=True)
        return kept


#: A hidden sibling build directory older than this and not locked was left by a killed creator.
_DEAD_BUILD_S = 60.0


def _remove_dead_builds(parent: Path, name: str) -> None:
    """Remove hidden ``.tmp-<hex>-<name>`` build directories in ``parent`` that a creator killed
    while building left behind: unlocked, and older than :data:`_DEAD_BUILD_S`. Never raises."""
    import time

    try:
        candidates = [p for p in parent.glob(f"{TMP_PREFIX}*-{name}")
                      if len(p.name) == len(TMP_PREFIX) + 33 + len(name)]
    except OSError:
        return
    for path in candidates:
        try:
            if not path.is_dir() or path.is_symlink() or time.time() - path.stat().st_mtime < _DEAD_BUILD_S:
                continue
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # being built
        try:
            shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)


def _plain(table: pa.Table) -> pa.Table:
    """``table`` with dictionary columns decoded (Arrow joins do not take dictionary columns)."""
    for i, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type):
            table = table.set_column(i, field.name, table[field.name].cast(field.type.value_type))
    return table


def _anti_join(left: pa.Table, right: pa.Table, keys: list[str]) -> pa.Table:
    """Rows of ``left`` whose ``keys`` do not occur in ``right`` (order not preserved)."""
    if right.num_rows == 0 or left.num_rows == 0:
        return left
    right_keys = _plain(right.select(keys)).group_by(keys).aggregate([])
    return _plain(left).join(right_keys, keys=keys, join_type="left anti")


def _dedup(table: pa.Table, keys: list[str]) -> pa.Table:
    """The first row of ``table`` for each value of ``keys`` (order kept)."""
    if table.num_rows < 2:
        return table
    index = pa.array(range(table.num_rows), pa.int64())
    first = table.select(keys).append_column("_i", index).group_by(keys, use_threads=False).aggregate(
        [("_i", "min")])["_i_min"]
    return table.take(pc.sort_indices(first))


def _check_unique_within(trials: pa.Table) -> None:
    keys = trials["trial_key"]
    if len(pc.unique(keys)) != len(keys):
        counts = pc.value_counts(keys)
        dup = [v["values"] for v in counts.to_pylist() if v["counts"] > 1][0]
        raise BatchlabError(f"trial key {dup!r} occurs twice in one commit; trial keys must be unique")
    ids = trials.select(["workload", "batch_size", "trial_id"]).group_by(
        ["workload", "batch_size", "trial_id"]
    ).aggregate([])
    if ids.num_rows != trials.num_rows:
        raise BatchlabError("a trial id occurs twice for one workload and batch size in one commit")


def _check_no_id_collision(new_trials: pa.Table, committed: pa.Table) -> None:
    keys = ["workload", "batch_size", "trial_id"]
    clash = new_trials.select(keys + ["trial_key"]).join(
        committed.select(keys), keys=keys, join_type="inner"
    )
    if clash.num_rows:
        row = clash.slice(0, 1).to_pylist()[0]
        raise BatchlabError(
            f"trial id {row['trial_id']} of {row['workload']} at batch size {row['batch_size']} is "
            f"already published under another trial key (new key {row['trial_key']!r}); "
            "use store.next_trial_id(...) for a free id"
        )


@contextmanager
def store_for_import(path: str | Path) -> Iterator[tuple[Store, bool]]:
    """``(store, created)`` of :meth:`Store.open_or_create` for one import (or any one-shot write).

    If the block raises (a malformed file, Ctrl-C) while the store was created by this call and has no
    commit yet, the new store is removed again, so a failed import leaves no empty store behind: its
    own entries (marker, lock, ``log/``, ``pending/``, ``data/``), then the directory if this call
    created it and it is empty. Nothing else is ever deleted: an existing store, one that got a commit
    (commits are atomic, so a failed import adds nothing to it), one another process is writing into
    (a live claim or a trial journal not of this store object), and any file that is not part of the
    store's layout are all left as they are. The original exception propagates unchanged. Either way
    the store object's claim is released at the end (:meth:`Store.release_claim`), so an import, failed
    or not, leaves no ``pending/<claim>.claim`` behind."""
    root = Path(path)
    existed = root.exists()
    store, created = Store.open_or_create(root)
    try:
        yield store, created
    except BaseException:
        if created:
            _remove_new_store(store, keep_directory=existed)
        raise
    finally:
        store.release_claim()


def _remove_new_store(store: Store, *, keep_directory: bool) -> bool:
    """Remove the store ``store`` (just created by this process) if nobody committed to or is writing
    into it; returns whether it was removed (see :func:`store_for_import`). Never raises."""
    root = store.root
    try:
        with exclusive_lock(root / LOCK_FILE):  # no commit can start while we look and delete
            if read_state(root).seq != 0:
                return False
            own = f"{store._claim_id}.claim" if store._claim_id is not None else None
            if any(p.name != own for p in (root / PENDING_DIR).iterdir()):
                return False  # another writer's claim or journal: the store is in use
            for name in (MARKER, LOG_DIR, PENDING_DIR, DATA_DIR):
                target = root / name
                if target.is_dir():
                    shutil.rmtree(target)
                else:
                    target.unlink(missing_ok=True)
        (root / LOCK_FILE).unlink(missing_ok=True)
        if not keep_directory:
            root.rmdir()  # only if empty: whatever else is there stays
    except OSError:
        return False
    return True


def _write_new_file(path: Path, content: bytes) -> None:
    """Create ``path`` exclusively (FileExistsError if it exists) holding ``content``, synced to disk."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, content)
        os.fsync(fd)
    finally:
        os.close(fd)
