import json

import pytest
import torch

from batchlab.errors import BatchlabError
from batchlab.workloads import get_workload
from batchlab.workloads.schedule import resolution_steps

FC = "mnist/fc_64_64_64"


def test_names_and_metric():
    w = get_workload("mnist/fc_128_128_128")
    assert (w.name, w.dataset, w.model) == ("mnist/fc_128_128_128", "mnist", "fc_128_128_128")
    assert (w.metric, w.goal, w.maximize) == ("val/classification_error", 0.03, False)
    assert w.default_steps > 0 and w.default_batch_size > 0


def test_load_data_full_and_subset():
    w = get_workload(FC)
    full = w.load_data()
    assert full.num_train == 55000 and full.train_x.dtype == torch.float32 and full.train_y.dtype == torch.int64
    assert full.val_x.shape == (5000, 1, 28, 28)
    a = w.load_data(train_examples=300, seed=1)
    b = w.load_data(train_examples=300, seed=1)
    c = w.load_data(train_examples=300, seed=2)
    assert a.num_train == 300 and torch.equal(a.train_x, b.train_x) and torch.equal(a.train_y, b.train_y)
    assert not torch.equal(a.train_y, c.train_y)
    assert a.val_x.shape == full.val_x.shape  # validation is always whole


@pytest.mark.parametrize("bad", [0, -5, 55001, 2.5, True])
def test_bad_train_examples(bad):
    with pytest.raises(BatchlabError, match=r"train_examples must be an integer in \[1, 55000\]"):
        get_workload(FC).load_data(train_examples=bad)


def test_build_model_is_deterministic_and_leaves_global_rng_alone():
    w = get_workload(FC)
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    m1 = w.build_model(seed=5)
    after = torch.rand(1)
    assert torch.equal(before, after)
    m2, m3 = w.build_model(seed=5), w.build_model(seed=6)
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1, p2)
    assert any(not torch.equal(p1, p3) for p1, p3 in zip(m1.parameters(), m3.parameters()))


def test_evaluate_train_split_uses_a_capped_fixed_subset():
    w = get_workload(FC)
    data = w.load_data()
    model = w.build_model(0)
    calls = []
    model.register_forward_hook(lambda module, inputs, output: calls.append(len(inputs[0])))
    out = w.evaluate(model, data.train_x, data.train_y, split="train")
    assert set(out) == {"train/cross_entropy_error", "train/classification_error"}
    assert sum(calls) == w.eval_examples["train"] < data.num_train
    assert 2.0 < out["train/cross_entropy_error"] < 2.6  # an untrained 10-class net: about log(10)


def test_evaluation_steps_uses_the_workload_schedule_and_overrides():
    w = get_workload(FC)
    assert w.evaluation_steps(1000)[-1] == 1000
    assert w.full_evaluation_steps(1000, num_regular=5)[-5:] == [200, 400, 600, 800, 1000]
    assert w.evaluation_steps(1000, num_regular=5) == sorted(set(w.full_evaluation_steps(1000, num_regular=5)) | set(resolution_steps(1000)))
    assert w.evaluation_steps(1000, resolution=None) == w.full_evaluation_steps(1000)  # the schedule before resolution steps
    assert w.evaluation_steps(1000, resolution=0.2)[-3:] == [926, 960, 1000]
    assert w.goal_split == "val"
    with pytest.raises(BatchlabError, match="unknown evaluation schedule setting"):
        w.evaluation_steps(1000, every=3)


def test_describe_is_json():
    d = get_workload(FC).describe()
    assert json.loads(json.dumps(d)) == d
    assert d["name"] == FC and d["num_parameters"] == 784 * 64 + 64 + 2 * (64 * 64 + 64) + 64 * 10 + 10
    assert d["splits"] == {"train": 55000, "val": 5000, "test": 10000}
