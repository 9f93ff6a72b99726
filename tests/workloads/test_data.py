import numpy as np
import pytest
import torch

from batchlab.data.splits import SplitArrays
from batchlab.errors import BatchlabError
from batchlab.train.sampling import batch_indices
from batchlab.workloads import DatasetSplit, TensorSplit, WorkloadData
from batchlab.workloads.data import as_split, as_workload_data


Pairs = torch.utils.data.TensorDataset  # a map-style Dataset of (x[i], y[i])


def tensors(n=50):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, 4, generator=g), torch.randint(0, 5, (n,), generator=g)


def test_tensor_split_batch_is_index_select():
    x, y = tensors()
    split = TensorSplit(x, y)
    idx = torch.tensor([7, 3, 3, 40])
    bx, by = split.batch(idx)
    assert torch.equal(bx, x.index_select(0, idx)) and torch.equal(by, y.index_select(0, idx))
    assert len(split) == 50 and split.x is x


def test_dataset_split_batches_equal_tensor_split_batches_for_the_same_indices():
    x, y = tensors()
    tensor, dataset = TensorSplit(x, y), DatasetSplit(Pairs(x, y))
    for step in range(12):  # several epochs of the seeded sampler
        idx = batch_indices(50, 16, 3, step)
        (tx, ty), (dx, dy) = tensor.batch(idx), dataset.batch(idx)
        assert torch.equal(tx, dx) and torch.equal(ty, dy) and dy.dtype == torch.int64
    for (tx, ty), (dx, dy) in zip(tensor.batches(16), dataset.batches(16), strict=True):
        assert torch.equal(tx, dx) and torch.equal(ty, dy)
    keep = torch.tensor([4, 1, 30])
    assert torch.equal(tensor.subset(keep).batch(torch.tensor([2, 0]))[0], dataset.subset(keep).batch(torch.tensor([2, 0]))[0])


def test_batches_cover_the_split_in_order_with_a_short_last_batch():
    x, y = tensors(10)
    sizes = [len(bx) for bx, _ in DatasetSplit(Pairs(x, y)).batches(4)]
    assert sizes == [4, 4, 2]
    assert torch.equal(torch.cat([by for _, by in TensorSplit(x, y).batches(4)]), y)


def test_dataset_items_with_int_labels_are_collated():
    data = [(torch.full((2,), float(i)), i) for i in range(6)]
    bx, by = DatasetSplit(data).batch(torch.tensor([5, 0]))
    assert bx.tolist() == [[5.0, 5.0], [0.0, 0.0]] and by.tolist() == [5, 0]


def test_bad_splits_are_one_line_errors():
    with pytest.raises(BatchlabError, match="as many inputs as targets"):
        TensorSplit(torch.zeros(3, 2), torch.zeros(4))
    with pytest.raises(BatchlabError, match="map-style dataset"):
        DatasetSplit(iter([1, 2]))
    with pytest.raises(BatchlabError, match="must be an \\(inputs, targets\\) pair"):
        as_split(3, "train")
    with pytest.raises(BatchlabError, match="items must be \\(input, target\\) pairs"):
        DatasetSplit([torch.zeros(2)] * 3).batch(torch.tensor([0, 1]))


def test_workload_data_from_the_accepted_shapes():
    x, y = tensors()
    arrays = SplitArrays(x.numpy(), y.numpy(), x[:5].numpy(), y[:5].numpy(), x[:2].numpy(), y[:2].numpy(), num_classes=5)
    for value in [
        arrays,
        {"train": (x, y), "val": (x[:5], y[:5]), "test": (x[:2], y[:2]), "num_classes": 5},
        ((x, y), Pairs(x[:5], y[:5]), (x[:2], y[:2])),
    ]:
        data = as_workload_data(value)
        assert data.num_train == 50 and data.sizes() == {"train": 50, "val": 5, "test": 2}
    data = as_workload_data({"train": (x, y), "val": (x[:5], y[:5])})
    assert data.test is None and data.sizes() == {"train": 50, "val": 5}
    assert torch.equal(data.train_x, x) and torch.equal(data.val_y, y[:5])
    with pytest.raises(BatchlabError, match="no test split"):
        data.split("test")
    with pytest.raises(BatchlabError, match="unknown split 'dev'"):
        data.split("dev")


def test_tensor_properties_of_a_dataset_split_say_what_to_use():
    x, y = tensors()
    data = WorkloadData(Pairs(x, y), (x, y))
    assert isinstance(data.train, DatasetSplit) and isinstance(data.val, TensorSplit)
    with pytest.raises(BatchlabError, match="train_x exists only for tensor data.*data.train.batch"):
        data.train_x


def test_bad_data_shapes_are_one_line_errors():
    x, y = tensors()
    with pytest.raises(BatchlabError, match="keys \\['train', 'valid'\\]"):
        as_workload_data({"train": (x, y), "valid": (x, y)})
    with pytest.raises(BatchlabError, match="returned list"):
        as_workload_data([x, y])
    with pytest.raises(BatchlabError, match="the train split is empty"):
        WorkloadData((x[:0], y[:0]), (x, y))
    assert np.array_equal(WorkloadData.from_tensors(x.numpy(), y.numpy(), x, y).train_x.numpy(), x.numpy())


def test_dataset_items_that_are_not_pairs_of_tensors_are_one_line_errors():
    x, y = tensors(6)
    as_dicts = [{"image": x[i], "label": y[i]} for i in range(6)]
    triples = [(x[i], y[i], i) for i in range(6)]
    nested = [({"pixels": x[i]}, y[i]) for i in range(6)]
    for items, fragment in ((as_dicts, "gave dict of 2"), (triples, "gave list of 3"),
                            (nested, r"gave \(inputs, targets\) of types \(dict, Tensor\), not tensors")):
        with pytest.raises(BatchlabError, match=fragment) as err:
            DatasetSplit(items).batch(torch.tensor([0, 1]))
        assert "\n" not in str(err.value) and "collate_fn=" in str(err.value)
    fixed = DatasetSplit(as_dicts, collate_fn=lambda items: (torch.stack([i["image"] for i in items]),
                                                              torch.stack([i["label"] for i in items])))
    bx, by = fixed.batch(torch.tensor([4, 2]))
    assert torch.equal(bx, x[[4, 2]]) and torch.equal(by, y[[4, 2]])
