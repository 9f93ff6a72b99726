"""Creating a store: a new path (built in a hidden sibling, renamed into place), an existing empty
directory, a symbolic link to one or a mount point (built in place, the marker hard-linked last), and
two processes creating one store at once (exactly one reports ``created``)."""

from __future__ import annotations

import errno
import fcntl
import json
import multiprocessing
import os
import time

import pytest

from batchlab.errors import BatchlabError
from batchlab.store import Store
from batchlab.store.schema import MARKER, STORE_DIRS


def _is_store(path) -> bool:
    return json.loads((path / MARKER).read_bytes())["format"] == "batchlab-store" and all(
        (path / sub).is_dir() for sub in STORE_DIRS)


def _hidden(parent) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(".tmp-"))


def test_a_symbolic_link_to_an_empty_directory_becomes_a_store(tmp_path):
    (tmp_path / "volume").mkdir()
    (tmp_path / "store").symlink_to(tmp_path / "volume")
    store, created = Store.open_or_create(tmp_path / "store")
    assert created and store.root == tmp_path / "store"
    assert (tmp_path / "store").is_symlink() and _is_store(tmp_path / "volume")
    assert _hidden(tmp_path) == [] and _hidden(tmp_path / "volume") == []
    again, created = Store.open_or_create(tmp_path / "store")
    assert not created


def test_an_existing_empty_directory_is_made_in_place(tmp_path):
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "lost+found").mkdir()  # an ext4 mount point
    inode = (tmp_path / "store").stat().st_ino
    store, created = Store.open_or_create(tmp_path / "store")
    assert created and _is_store(tmp_path / "store") and (tmp_path / "store").stat().st_ino == inode
    assert _hidden(tmp_path) == [] and _hidden(tmp_path / "store") == []
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("keep")
    with pytest.raises(BatchlabError, match="is a non-empty directory that is not a batchlab store"):
        Store.open(tmp_path / "other", create=True)
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["notes.txt"]


def test_a_broken_symbolic_link_is_a_one_line_error(tmp_path):
    (tmp_path / "store").symlink_to(tmp_path / "gone")
    with pytest.raises(BatchlabError, match="symbolic link to .*gone, which does not exist"):
        Store.open(tmp_path / "store", create=True)


def test_a_path_that_appears_as_an_empty_directory_during_the_rename_is_made_in_place(tmp_path, monkeypatch):
    import batchlab.store.store as store_module

    class BusyRename:  # the module's os: the path became an empty mount point meanwhile (EBUSY)
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def rename(src, dst):
            os.mkdir(dst)
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(dst))

    monkeypatch.setattr(store_module, "os", BusyRename())
    store, created = Store.open_or_create(tmp_path / "store")
    assert created and _is_store(tmp_path / "store") and _hidden(tmp_path) == []


def test_creation_errors_keep_the_reason(tmp_path, monkeypatch):
    import batchlab.store.store as store_module

    class NoRename:
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def rename(src, dst):
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), str(dst))

    monkeypatch.setattr(store_module, "os", NoRename())
    with pytest.raises(BatchlabError, match=f"cannot create a store at .*: {os.strerror(errno.EXDEV)}$"):
        Store.open(tmp_path / "store", create=True)
    assert _hidden(tmp_path) == [] and not (tmp_path / "store").exists()


def test_a_build_directory_left_by_a_killed_creator_is_removed(tmp_path):
    dead = tmp_path / f".tmp-{'a' * 32}-store"
    young = tmp_path / f".tmp-{'b' * 32}-store"
    busy = tmp_path / f".tmp-{'c' * 32}-store"
    for path in (dead, young, busy):
        (path / "log").mkdir(parents=True)
    for path in (dead, busy):
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    fd = os.open(busy, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another creator is building it
    try:
        assert Store.open_or_create(tmp_path / "store")[1]
    finally:
        os.close(fd)
    assert not dead.exists() and young.exists() and busy.exists()


# ----------------------------------------------------------------------------- two creators at once
def _creator(paths, results, barrier) -> None:
    while True:
        path = paths.get()
        if path is None:
            return
        barrier.wait(timeout=60)
        try:
            store, created = Store.open_or_create(path)
            results.put((created, os.path.realpath(store.root), None))
        except Exception as exc:  # reported to the test
            results.put((None, None, f"{type(exc).__name__}: {exc}"))


@pytest.mark.parametrize("kind", ["new", "empty", "symlink"])
def test_two_processes_creating_one_store_at_once(tmp_path, kind):
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    results = context.Queue()
    queues = [context.Queue() for _ in range(2)]
    workers = [context.Process(target=_creator, args=(q, results, barrier), daemon=True) for q in queues]
    for worker in workers:
        worker.start()
    try:
        for round_ in range(20):
            path = tmp_path / f"store{round_}"
            if kind == "empty":
                path.mkdir()
            elif kind == "symlink":
                (tmp_path / f"volume{round_}").mkdir()
                path.symlink_to(tmp_path / f"volume{round_}")
            for q in queues:
                q.put(str(path))
            got = [results.get(timeout=120) for _ in range(2)]
            assert [error for _, _, error in got] == [None, None], got
            assert sorted(created for created, _, _ in got) == [False, True], (round_, got)
            assert got[0][1] == got[1][1] == os.path.realpath(path)
            assert _is_store(path) and _hidden(tmp_path) == [] and _hidden(path) == []
    finally:
        for q in queues:
            q.put(None)
        for worker in workers:
            worker.join(timeout=30)
