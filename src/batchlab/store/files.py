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
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from batchlab.atomic import TMP_PREFIX, temporary_path, write_path_atomic, write_stream_atomic

__all__ = [
    "TMP_PREFIX", "temporary_path", "write_bytes_atomic", "write_parquet_atomic", "fsync_directory", "exclusive_lock",
]


def write_bytes_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (temp file, optional fsync, rename)."""
    write_stream_atomic(path, lambda handle: handle.write(data), durable=durable)


def write_parquet_atomic(table: pa.Table, path: Path, *, row_group_size: int = 1 << 20,
                         compression: str = "zstd", use_dictionary: bool | list[str] = True) -> None:
    """Write an Arrow table to ``path`` as Parquet, atomically and durably."""
    write_path_atomic(path, lambda tmp: pq.write_table(table, tmp, compression=compression,
                                                       row_group_size=row_group_size, use_dictionary=use_dictionary))


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
