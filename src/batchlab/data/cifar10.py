"""CIFAR-10 from the official python archive ``cifar-10-python.tar.gz``.

CIFAR-10 is in no package registry, so the archive is looked for, in order, at the ``archive``
argument, at ``$BATCHLAB_CIFAR10``, and as ``cifar-10-python.tar.gz`` in the cache directory; when
absent and ``download`` is allowed it is downloaded from the official address :data:`URL` into the
cache (streamed to a temporary file, MD5-checked against :data:`MD5`, then renamed into place).

Archive format: members ``cifar-10-batches-py/data_batch_1`` .. ``data_batch_5`` (10,000 images each)
and ``test_batch``; each a pickle of a dict with ``data`` (uint8 ``(10000, 3072)``, channel-major
32x32 red, green, blue planes) and ``labels`` (list of ints 0..9). The pickles are read with an
unpickler that only builds plain containers and numpy arrays, so an archive cannot run code.

Splits (fixed):

- **train** (45,000) = ``data_batch_1`` .. ``data_batch_4`` and the first half (5,000 images) of
  ``data_batch_5``;
- **val** (5,000) = the second half of ``data_batch_5``; the workload goal is measured here;
- **test** (10,000) = ``test_batch``, the official test set.

Inputs are float32 ``(N, 3, 32, 32)``: pixel / 255, then standardised per channel with the mean and
standard deviation of the train split (no data augmentation). Labels int64. The decoded split is
cached (uint8) as ``cifar10-v1.npz``.
"""

from __future__ import annotations

import codecs
import hashlib
import io
import os
import pickle
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from batchlab.data.cache import cache_dir, cached_arrays
from batchlab.data.splits import SplitArrays
from batchlab.atomic import write_stream_atomic
from batchlab.errors import BatchlabError

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
MD5 = "c58f30108f718f92721af3b95e74349a"  # of the official archive (170,498,071 bytes)
ARCHIVE_NAME = "cifar-10-python.tar.gz"
ARCHIVE_ENV = "BATCHLAB_CIFAR10"
CACHE_NAME = "cifar10-v1.npz"
HOW_TO_GET = f"download {URL} and set {ARCHIVE_ENV} to its path"


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles only what the CIFAR batches contain: builtin containers and numpy arrays."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),  # how Python 3 writes bytes in protocol-2 pickles
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}")
        if module == "_codecs":
            return codecs.encode
        if name in ("ndarray", "dtype"):
            return getattr(np, name)
        multiarray = getattr(np, "_core", None) or np.core  # numpy >= 2 renamed numpy.core
        return getattr(multiarray.multiarray, name)


def _md5(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(url: str, destination: str | os.PathLike, md5: str | None = MD5, timeout: float = 60.0) -> Path:
    """Download ``url`` to the file ``destination`` atomically, checking its MD5 when ``md5`` is given.

    On any failure (no network, HTTP error, checksum mismatch) nothing is left at ``destination`` and
    a one-line BatchlabError is raised.
    """
    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)

    def fetch(out) -> None:
        digest = hashlib.md5()
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                for block in iter(lambda: response.read(1 << 20), b""):
                    digest.update(block)
                    out.write(block)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise BatchlabError(f"could not download {url} ({reason}); {HOW_TO_GET}") from None
        if md5 is not None and digest.hexdigest() != md5:
            raise BatchlabError(f"download of {url} is corrupt (MD5 {digest.hexdigest()} is not {md5}); {HOW_TO_GET}")

    write_stream_atomic(destination, fetch)
    return destination


def find_archive(archive: str | os.PathLike | None = None, download_missing: bool = True, url: str = URL, md5: str | None = MD5) -> Path:
    """Return the archive path: the argument, else ``$BATCHLAB_CIFAR10``, else the cache (downloading
    it there from ``url`` when ``download_missing``)."""
    given = archive or os.environ.get(ARCHIVE_ENV)
    if given:
        path = Path(given).expanduser()
        if not path.is_file():
            raise BatchlabError(f"CIFAR-10 archive {str(path)!r} does not exist; {HOW_TO_GET}")
        return path
    path = cache_dir() / ARCHIVE_NAME
    if path.is_file():
        return path
    if not download_missing:
        raise BatchlabError(f"CIFAR-10 archive not found (no {ARCHIVE_ENV}, nothing in {cache_dir()}); {HOW_TO_GET}")
    return download(url, path, md5)


def _read_batch(archive: tarfile.TarFile, name: str) -> tuple[np.ndarray, np.ndarray]:
    member = archive.extractfile(f"cifar-10-batches-py/{name}")
    if member is None:
        raise KeyError(name)
    batch = _ArrayUnpickler(io.BytesIO(member.read()), encoding="latin1").load()
    images = np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
    labels = np.asarray(batch["labels"], dtype=np.int64)
    if len(images) != len(labels):
        raise ValueError(f"{name}: {len(images)} images but {len(labels)} labels")
    return images, labels


def read_archive(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Return the uint8 split of the module docstring (``train_x``, ``train_y``, ``val_x``, ...) from an archive."""
    try:
        with tarfile.open(path, "r:*") as archive:
            batches = [_read_batch(archive, f"data_batch_{i}") for i in range(1, 6)]
            test_x, test_y = _read_batch(archive, "test_batch")
    except (tarfile.TarError, KeyError, ValueError, OSError, EOFError, pickle.UnpicklingError) as exc:
        raise BatchlabError(f"{str(path)!r} is not a readable CIFAR-10 python archive ({type(exc).__name__}: {exc}); {HOW_TO_GET}") from None
    last_x, last_y = batches[-1]
    half = len(last_x) // 2  # 5,000 in the official archive
    return {
        "train_x": np.concatenate([x for x, _ in batches[:-1]] + [last_x[:half]]),
        "train_y": np.concatenate([y for _, y in batches[:-1]] + [last_y[:half]]),
        "val_x": last_x[half:],
        "val_y": last_y[half:],
        "test_x": test_x,
        "test_y": test_y,
    }


def load_cifar10(archive: str | os.PathLike | None = None, download_missing: bool = True) -> SplitArrays:
    """Return CIFAR-10 as 45,000 train / 5,000 val / 10,000 test images, standardised per channel."""
    arrays = cached_arrays(CACHE_NAME, lambda: read_archive(find_archive(archive, download_missing)))
    train = arrays["train_x"].astype(np.float32) / np.float32(255.0)
    mean = train.mean(axis=(0, 2, 3), keepdims=True, dtype=np.float64).astype(np.float32)
    std = train.std(axis=(0, 2, 3), keepdims=True, dtype=np.float64).astype(np.float32)

    def standardise(x: np.ndarray) -> np.ndarray:
        return (x.astype(np.float32) / np.float32(255.0) - mean) / np.maximum(std, np.float32(1e-6))

    return SplitArrays(
        train_x=standardise(arrays["train_x"]),
        train_y=arrays["train_y"],
        val_x=standardise(arrays["val_x"]),
        val_y=arrays["val_y"],
        test_x=standardise(arrays["test_x"]),
        test_y=arrays["test_y"],
        num_classes=10,
    )
