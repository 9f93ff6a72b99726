"""The local data cache: where prepared data sets live, and atomic writes into it.

The cache directory is ``$BATCHLAB_CACHE`` when set, else ``$XDG_CACHE_HOME/batchlab``, else
``~/.cache/batchlab``. Every file is written under a temporary name in the same directory and then
moved into place with ``os.replace``, so a reader sees either no file or a whole one, never a partial
one (two processes preparing the same set at once both succeed; the last rename wins with identical
content).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np

from batchlab.atomic import write_stream_atomic
from batchlab.errors import BatchlabError


def cache_dir() -> Path:
    """Return the batchlab cache directory (created if missing); BatchlabError if it cannot be."""
    root = os.environ.get("BATCHLAB_CACHE")
    if root:
        path = Path(root).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        path = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "batchlab"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file in the way, no permission, read-only file system
        raise BatchlabError(
            f"cannot use {str(path)!r} as the data cache ({exc.strerror}); set BATCHLAB_CACHE to a writable directory"
        ) from None
    return path


def write_atomically(path: Path, write: Callable[[BinaryIO], None]) -> Path:
    """Write ``path`` by calling ``write(file)`` on a temporary file beside it, then renaming it.

    On any error the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_stream_atomic(path, write)


def save_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> Path:
    """Save named numpy arrays as an uncompressed ``.npz`` file, atomically."""
    return write_atomically(path, lambda handle: np.savez(handle, **arrays))


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """Load every array of an ``.npz`` file into memory (no pickled objects allowed)."""
    with np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def cached_arrays(name: str, prepare: Callable[[], Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Return the arrays cached as ``<cache_dir>/<name>``, preparing and saving them on a miss.

    A cache file that cannot be read (truncated by hand, wrong format) is rebuilt.
    """
    path = cache_dir() / name
    if path.exists():
        try:
            return load_arrays(path)
        except (OSError, ValueError, EOFError):
            pass
    arrays = {key: np.asarray(value) for key, value in prepare().items()}
    save_arrays(path, arrays)
    return arrays
