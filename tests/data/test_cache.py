import os

import numpy as np
import pytest

from batchlab.data import cache


def test_cache_dir_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHLAB_CACHE", str(tmp_path / "c"))
    assert cache.cache_dir() == tmp_path / "c"
    assert (tmp_path / "c").is_dir()


def test_save_and_load_arrays_round_trip(tmp_path):
    arrays = {"a": np.arange(6, dtype=np.uint8).reshape(2, 3), "b": np.array([1.5, -2.0])}
    path = cache.save_arrays(tmp_path / "x.npz", arrays)
    loaded = cache.load_arrays(path)
    assert set(loaded) == {"a", "b"}
    np.testing.assert_array_equal(loaded["a"], arrays["a"])
    assert loaded["a"].dtype == np.uint8
    assert [p.name for p in tmp_path.iterdir()] == ["x.npz"]  # no temporary file left behind


def test_failed_write_leaves_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "keep.bin"
    target.write_bytes(b"old")

    def broken(handle):
        handle.write(b"partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        cache.write_atomically(target, broken)
    assert target.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["keep.bin"]


def test_cached_arrays_prepares_once_and_rebuilds_a_corrupt_file(tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHLAB_CACHE", str(tmp_path))
    calls = []

    def prepare():
        calls.append(1)
        return {"v": np.array([1, 2, 3])}

    first = cache.cached_arrays("t.npz", prepare)
    second = cache.cached_arrays("t.npz", prepare)
    assert len(calls) == 1
    np.testing.assert_array_equal(first["v"], second["v"])
    (tmp_path / "t.npz").write_bytes(b"not an npz")
    third = cache.cached_arrays("t.npz", prepare)
    assert len(calls) == 2
    np.testing.assert_array_equal(third["v"], [1, 2, 3])


def test_cache_dir_that_is_a_file_is_a_one_line_error(tmp_path, monkeypatch):
    from batchlab.errors import BatchlabError

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("BATCHLAB_CACHE", str(blocker))
    with pytest.raises(BatchlabError, match="cannot use .*not-a-dir.* as the data cache .*set BATCHLAB_CACHE") as info:
        cache.cache_dir()
    assert "\n" not in str(info.value)
