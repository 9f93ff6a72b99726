"""Stores with several commits and the ways the tests damage them (imported as ``store_damage``)."""

from __future__ import annotations

import builtins
import errno
import io
import os
from pathlib import Path

from batchlab.store import Store
from batchlab.store.batch_science_import import import_batch_science
from release_trees import make_release

#: The release's top-level directories, imported one per commit (8 trials each).
PARTS = ("mnist", "cifar_10", "mnist_subsets")


def three_commits(tmp_path: Path) -> Store:
    """A store holding the small release in three commits (seq 1, 2, 3: one per :data:`PARTS`)."""
    make_release(tmp_path / "rel")
    store = Store.open(tmp_path / "store", create=True)
    for part in PARTS:
        import_batch_science(store, tmp_path / "rel" / part)
    store.release_claim()  # as at the end of the importing process: its claim is released
    return store


def rows(store: Store, table: str) -> list[tuple]:
    """Every row of view ``table``, sorted."""
    con = store.connect()
    try:
        return con.execute(f"SELECT * FROM {table} ORDER BY ALL").fetchall()
    finally:
        con.close()


def entry_files(store: Store, seq: int) -> list[str]:
    """The data files log entry ``seq`` added (read from its copy, which outlives a deleted entry)."""
    import json

    from batchlab.store.log import LOG_COPY_DIR, entry_name

    entry = json.loads((store.root / LOG_COPY_DIR / entry_name(seq)).read_bytes())
    return sorted(f for files in entry["add"].values() for f in files)


def every_file(root: Path) -> dict[str, bytes]:
    """{path relative to ``root``: content} of every file under ``root`` (the lock file aside)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "_lock"}


def data_bytes(root: Path) -> list[bytes]:
    """The contents of every Parquet file under ``root`` (data/ and quarantine/), sorted: what must
    never be lost, wherever repair moved it."""
    return sorted(p.read_bytes() for p in root.rglob("*.parquet"))


DAMAGE = {
    "truncated": lambda path: path.write_bytes(path.read_bytes()[: path.stat().st_size // 2]),
    "deleted": lambda path: path.unlink(),
    "garbage": lambda path: path.write_bytes(b"this is not a Parquet file\n" * 8),
}


def flip_middle(path: Path) -> None:
    """Overwrite the middle third of ``path`` with other bytes (same size, Parquet magic intact)."""
    data = bytearray(path.read_bytes())
    third = len(data) // 3
    data[third: 2 * third] = bytes(b ^ 0xFF for b in data[third: 2 * third])
    path.write_bytes(bytes(data))


def read_only(monkeypatch, root: Path) -> None:
    """Make every write under ``root`` fail with EROFS, as on a read-only mount (works as root, whom
    permission bits do not stop): ``os.open`` with a write flag, ``open`` in a write mode, and the
    calls that create, rename or remove names. Reads are untouched."""
    root = str(Path(root).resolve())

    def under(path) -> bool:
        try:
            return str(Path(os.fsdecode(path)).resolve()).startswith(root)
        except (TypeError, ValueError):
            return False

    def refuse(path):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))

    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    real_os_open, real_open = os.open, builtins.open

    def os_open(path, flags, *args, **kwargs):
        if flags & writes and under(path):
            refuse(path)
        return real_os_open(path, flags, *args, **kwargs)

    def py_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)) and set(mode) & set("wxa+") and under(file):
            refuse(file)
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(builtins, "open", py_open)
    monkeypatch.setattr(io, "open", py_open)
    for name in ("mkdir", "replace", "rename", "link", "unlink", "rmdir"):
        real = getattr(os, name)

        def guarded(path, *args, _real=real, **kwargs):
            if under(path):
                refuse(path)
            return _real(path, *args, **kwargs)

        monkeypatch.setattr(os, name, guarded)
