"""Atomic file writes and the store's commit lock.

Every file of a store is written under a temporary name in its final directory and then renamed
with ``os.replace``, so a reader or a crash never sees a half-written file. Commits to the log are
serialised with an exclusive ``flock`` on ``<store>/_lock`` (released by the kernel when a process
dies, so a killed writer never leaves the store locked).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from batchlab.atomic import TMP_PREFIX, os_error_text, temporary_path, write_path_atomic, write_stream_atomic
from batchlab.errors import BatchlabError
from batchlab.store.schema import SCHEMAS, parquet_options, row_group_rows, sort_measurements

__all__ = [
    "TMP_PREFIX", "temporary_path", "write_bytes_atomic", "write_data_table", "fsync_directory",
    "exclusive_lock", "file_record", "store_writes",
]

#: Bytes read at a time when hashing a data file.
_HASH_CHUNK = 1 << 20


def file_record(path: Path) -> dict:
    """``{"size": bytes, "sha256": hex digest}`` of the file at ``path`` (read once, streaming): what a
    commit records of each file it adds, and what ``store repair`` checks the file against."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": digest.hexdigest()}


@contextlib.contextmanager
def store_writes(root: Path, doing: str) -> Iterator[None]:
    """Turn an OSError raised in the block (a full disk, a read-only directory, a quota) into a one-line
    BatchlabError: ``cannot <doing> in store <root>: <reason> (<ERRNO>): <file>``. Writes are atomic
    (temporary name, then rename) and commits all-or-nothing, so the store is as it was before."""
    try:
        yield
    except OSError as exc:
        raise BatchlabError(f"cannot {doing} in store {root}: {os_error_text(exc)}; "
                            "the store is unchanged") from None


def write_bytes_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (temp file, optional fsync, rename)."""
    write_stream_atomic(path, lambda handle: handle.write(data), durable=durable)


def write_data_table(name: str, table: pa.Table, path: Path, *, presorted: bool = False) -> None:
    """Write rows of store table ``name`` to ``path`` as Parquet in the table's one layout
    (:func:`batchlab.store.schema.parquet_options`, :func:`~batchlab.store.schema.row_group_rows`;
    measurements sorted by :data:`~batchlab.store.schema.MEASUREMENT_ORDER` unless the caller says
    they already are), cast to the table's on-disk schema, atomically and durably."""
    if name == "measurements" and not presorted:
        table = sort_measurements(table)
    table = table.cast(SCHEMAS[name])
    write_path_atomic(path, lambda tmp: pq.write_table(table, tmp, row_group_size=row_group_rows(name),
                                                       **parquet_options(name)))


def fsync_directory(directory: Path) -> None:
    """Make renames inside ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` for the duration of the block."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def lock_held(path: str | os.PathLike, exclusive: bool) -> bool:
    """Whether another process holds a ``flock`` on ``path``, tested without blocking and without
    writing: a missing file is not held; a file that cannot be opened (another user's) or a lock
    that cannot be tested counts as held (never take a live process's files).

    ``exclusive``: test with an exclusive lock (conflicts with the holder's shared or exclusive
    lock); else a shared one (conflicts only with an exclusive lock). The file is opened read-only;
    where ``flock`` is emulated with POSIX locks (NFS) an exclusive test needs a writable descriptor,
    so on EBADF it is retried on one."""
    flags = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
    for mode in (os.O_RDONLY, os.O_RDWR):
        try:
            fd = os.open(path, mode)
        except FileNotFoundError:
            return False
        except OSError:
            return True
        try:
            fcntl.flock(fd, flags)
            return False
        except OSError as exc:
            if not (exclusive and mode == os.O_RDONLY and exc.errno == errno.EBADF):
                return True  # held (EAGAIN, EACCES), or cannot tell
        finally:
            os.close(fd)
    return True
