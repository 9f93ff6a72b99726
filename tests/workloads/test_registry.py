import pytest
import torch

from batchlab.errors import BatchlabError
from batchlab.workloads import get_workload, workload_names

REQUIRED = {
    "mnist/fc_64_64_64": 0.03,
    "mnist/fc_128_128_128": 0.03,
    "mnist/fc_256_256_256": 0.03,
    "mnist/fc_1024_1024_1024": 0.03,
    "mnist/simple_cnn_narrow": 0.01,
    "mnist/simple_cnn_base": 0.01,
    "mnist/simple_cnn_wide": 0.01,
}


def test_required_workloads_and_goals():
    names = workload_names()
    assert names == sorted(names)
    for name, goal in REQUIRED.items():
        assert name in names
        assert get_workload(name).goal == goal


@pytest.mark.parametrize("name", workload_names())
def test_model_maps_a_batch_to_logits_and_a_finite_loss(name):
    w = get_workload(name)
    x, y = w.example_batch(3)
    if not w.task.classes:  # a regression task (nqm/quadratic): outputs and a finite loss, no logits
        assert torch.isfinite(w.loss(w.build_model(0)(x), y))
        return
    logits = w.build_model(0)(x)
    assert logits.shape == (*y.shape, w.num_classes)
    loss = w.loss(logits, y, label_smoothing=0.1)
    assert loss.ndim == 0 and torch.isfinite(loss)


def test_unknown_name_suggests_the_closest():
    with pytest.raises(BatchlabError, match=r"unknown workload 'mnist/simple_cnn_bas' \(did you mean 'mnist/simple_cnn_base'\?\)"):
        get_workload("mnist/simple_cnn_bas")


@pytest.mark.parametrize("name", ["mnist/fc_64_64_64", "shakespeare/lstm_char"])
def test_declared_split_sizes_and_classes_match_the_data(name):
    w = get_workload(name)
    data = w.load_data()
    assert {"train": data.num_train, "val": len(data.val_x), "test": len(data.test_x)} == w.split_sizes
    assert data.num_classes == w.num_classes
    assert tuple(data.train_x.shape[1:]) == w.input_shape
    assert data.train_x.dtype == (torch.int64 if w.token_inputs else torch.float32)


@pytest.mark.slow
def test_fashion_mnist_workload_matches_its_data():
    w = get_workload("fashion_mnist/simple_cnn_base")
    data = w.load_data(train_examples=100)
    assert data.num_train == 100 and len(data.val_x) == w.split_sizes["val"]
    assert tuple(data.val_x.shape[1:]) == w.input_shape


def test_a_few_sgd_steps_lower_the_training_loss():
    w = get_workload("mnist/fc_64_64_64")
    data = w.load_data(train_examples=256, seed=0)
    model = w.build_model(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = w.evaluate(model, data.train_x, data.train_y, split="train")["train/cross_entropy_error"]
    for _ in range(30):
        optimizer.zero_grad()
        w.loss(model(data.train_x), data.train_y, label_smoothing=0.1).backward()
        optimizer.step()
    after = w.evaluate(model, data.train_x, data.train_y, split="train")["train/cross_entropy_error"]
    assert after < 0.8 * before


def test_every_description_is_json_with_the_release_metric_names():
    import json

    for name in workload_names():
        d = get_workload(name).describe()
        assert json.loads(json.dumps(d)) == d
        # the release's metric names, and the known-answer quadratic's excess loss (docs/methods.md)
        assert d["metric"] in {"val/classification_error", "val/cross_entropy_error", "val/excess_loss"}, name
        assert d["num_parameters"] > 0 and d["default_steps"] > 0
