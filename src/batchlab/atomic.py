"""Atomic file writes: the one mechanism every package uses to write a file a user or reader relies on.

A file is written under a temporary name in the destination's directory (so the rename is atomic on
POSIX), optionally fsynced, then moved into place with ``os.replace``. A reader or a crash therefore
sees either the old file (or none) or the whole new one, never a partial file. On any error,
KeyboardInterrupt included, the temporary file is removed and the destination is left as it was.

Temporary names are ``.tmp-<32 hex>-<final name>``; the store's garbage collector recognises them.
"""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

TMP_PREFIX = ".tmp-"


def os_error_text(exc: OSError) -> str:
    """``"<strerror> (<ERRNO NAME>): <file>"`` of an OSError, fit for a one-line message (a full disk:
    ``No space left on device (ENOSPC): <file>``)."""
    if not exc.errno:  # raised by a library (pyarrow: "Could not open Parquet input source ...")
        return str(exc)
    text = f"{exc.strerror or exc} ({errno.errorcode.get(exc.errno, exc.errno)})"
    return f"{text}: {exc.filename}" if exc.filename else text


def temporary_path(final: Path) -> Path:
    """A unique temporary name beside ``final`` (same directory, so ``os.replace`` is atomic)."""
    return final.with_name(f"{TMP_PREFIX}{uuid.uuid4().hex}-{final.name}")


def write_path_atomic(path: str | os.PathLike, write_to: Callable[[Path], None], *, durable: bool = True) -> Path:
    """Call ``write_to(tmp)`` to write a temporary file beside ``path``, fsync it if ``durable``, rename it to ``path``.

    Use this form when a library writes to a path itself (``pyarrow.parquet.write_table``,
    ``Figure.savefig``); the temporary name keeps the final suffix. Returns ``path``.
    """
    path = Path(path)
    tmp = temporary_path(path)
    try:
        write_to(tmp)
        if durable:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_stream_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], None], *, durable: bool = True) -> Path:
    """Call ``write(handle)`` on a binary handle of a temporary file beside ``path``, then rename it to ``path``.

    ``write`` may raise to abandon the file (e.g. a checksum mismatch): nothing is left behind.
    """

    def write_to(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            write(handle)

    return write_path_atomic(path, write_to, durable=durable)
