"""Builds tiny archives in the official CIFAR-10 python format (for the tests)."""

import io
import pickle
import tarfile

import numpy as np


def make_cifar_archive(path, per_batch=8, test_size=6, seed=0):
    """Write a cifar-10-python.tar.gz lookalike; image i of batch b has every pixel = (b * 16 + i) % 256."""
    rng = np.random.default_rng(seed)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    with tarfile.open(path, "w:gz") as archive:
        for b, name in enumerate(names):
            n = test_size if name == "test_batch" else per_batch
            data = np.repeat(((b * 16 + np.arange(n)) % 256).astype(np.uint8)[:, None], 3072, axis=1)
            data[:, 1024:2048] //= 2  # the green plane differs from the red one
            batch = {
                "batch_label": f"batch {b}",
                "labels": rng.integers(0, 10, n).tolist(),
                "data": data,
                "filenames": [f"img_{b}_{i}.png" for i in range(n)],
            }
            payload = pickle.dumps(batch, protocol=2)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
        meta = pickle.dumps({"label_names": ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]}, protocol=2)
        info = tarfile.TarInfo("cifar-10-batches-py/batches.meta")
        info.size = len(meta)
        archive.addfile(info, io.BytesIO(meta))
    return path
