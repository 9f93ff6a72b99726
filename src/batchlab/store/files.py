"""Atomic file writes and the store's commit lock.

Every file of a store is written under a temporary name in its final directory and then renamed
with ``os.replace``, so a reader or a crash never sees a half-written file. Commits to the log are
serialised with an exclusive ``flock`` on ``<store>/_lock`` (released by the kernel when a process
dies, so a killed writer never leaves the store locked).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

TMP_PREFIX = ".tmp-"


def temporary_path(final: Path) -> Path:
    """A unique temporary name beside ``final`` (same directory, so ``os.replace`` is atomic)."""
    return final.with_name(f"{TMP_PREFIX}{uuid.uuid4().hex}-{final.name}")


def write_bytes_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (temp file, optional fsync, rename)."""
    tmp = temporary_path(path)
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_parquet_atomic(table: pa.Table, path: Path, *, row_group_size: int = 1 << 20,
                         compression: str = "zstd", use_dictionary: bool | list[str] = True) -> None:
    """Write an Arrow table to ``path`` as Parquet, atomically and durably."""
    tmp = temporary_path(path)
    try:
        pq.write_table(table, tmp, compression=compression, row_group_size=row_group_size,
                       use_dictionary=use_dictionary)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
