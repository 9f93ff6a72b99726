import functools
import hashlib
import http.server
import io
import os
import pickle
import tarfile
import threading

import numpy as np
import pytest

from batchlab.data import cifar10
from batchlab.errors import BatchlabError

from .cifar_archive import make_cifar_archive


def md5_of(path):
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_read_archive_splits_and_layout(tmp_path):
    arrays = cifar10.read_archive(make_cifar_archive(tmp_path / "c.tar.gz", per_batch=8, test_size=6))
    assert arrays["train_x"].shape == (4 * 8 + 4, 3, 32, 32) and arrays["train_x"].dtype == np.uint8
    assert arrays["val_x"].shape == (4, 3, 32, 32) and arrays["test_x"].shape == (6, 3, 32, 32)
    # batch 5 (index 4) image 4 is the first validation image; channel-major planes
    assert np.all(arrays["val_x"][0, 0] == 4 * 16 + 4) and np.all(arrays["val_x"][0, 1] == (4 * 16 + 4) // 2)
    assert arrays["train_y"].dtype == np.int64 and len(arrays["train_y"]) == 36


def test_load_standardises_with_train_statistics_and_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHLAB_CACHE", str(tmp_path / "cache"))
    archive = make_cifar_archive(tmp_path / "c.tar.gz")
    data = cifar10.load_cifar10(archive)
    assert data.sizes() == {"train": 36, "val": 4, "test": 6} and data.num_classes == 10
    assert data.train_x.dtype == np.float32
    np.testing.assert_allclose(data.train_x.mean(axis=(0, 2, 3)), 0.0, atol=1e-5)
    np.testing.assert_allclose(data.train_x.std(axis=(0, 2, 3)), 1.0, atol=1e-4)
    archive.unlink()
    again = cifar10.load_cifar10(archive)  # from the cache
    np.testing.assert_array_equal(again.val_x, data.val_x)


def test_archive_from_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(cifar10.ARCHIVE_ENV, str(make_cifar_archive(tmp_path / "c.tar.gz")))
    assert cifar10.find_archive() == tmp_path / "c.tar.gz"


def test_download_from_a_file_url_checks_md5(tmp_path):
    source = make_cifar_archive(tmp_path / "src.tar.gz")
    target = tmp_path / "cache" / cifar10.ARCHIVE_NAME
    got = cifar10.download(source.as_uri(), target, md5=md5_of(source))
    assert got == target and target.read_bytes() == source.read_bytes()
    other = tmp_path / "other" / cifar10.ARCHIVE_NAME
    with pytest.raises(BatchlabError, match="is corrupt"):
        cifar10.download(source.as_uri(), other, md5="0" * 32)
    assert os.listdir(other.parent) == []  # nothing left behind


@pytest.fixture
def local_server(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_download_missing_archive_from_a_local_server(tmp_path, monkeypatch, local_server):
    root, base = local_server
    monkeypatch.setenv("BATCHLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(cifar10.ARCHIVE_ENV, raising=False)
    source = make_cifar_archive(root / cifar10.ARCHIVE_NAME)
    path = cifar10.find_archive(url=f"{base}/{cifar10.ARCHIVE_NAME}", md5=md5_of(source))
    assert path == tmp_path / "cache" / cifar10.ARCHIVE_NAME
    assert cifar10.read_archive(path)["test_x"].shape == (6, 3, 32, 32)
    with pytest.raises(BatchlabError, match=r"could not download .*missing\.tar\.gz .*download https://www\.cs\.toronto\.edu"):
        cifar10.download(f"{base}/missing.tar.gz", tmp_path / "x.tar.gz")
    assert not (tmp_path / "x.tar.gz").exists()


def test_missing_archive_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHLAB_CACHE", str(tmp_path))
    monkeypatch.delenv(cifar10.ARCHIVE_ENV, raising=False)
    with pytest.raises(BatchlabError, match="does not exist; download https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"):
        cifar10.find_archive(tmp_path / "nope.tar.gz")
    with pytest.raises(BatchlabError, match="CIFAR-10 archive not found") as info:
        cifar10.find_archive(download_missing=False)
    assert "\n" not in str(info.value)


def test_archive_with_code_in_its_pickles_is_refused(tmp_path):
    path = tmp_path / "evil.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            payload = pickle.dumps({"data": os.getcwd, "labels": []}, protocol=2)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
    with pytest.raises(BatchlabError, match="refusing to unpickle"):
        cifar10.read_archive(path)
