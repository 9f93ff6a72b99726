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
    # one example probes the default batch rule (once per model), then the capped subset in batches of 1000
    assert w.eval_batch_size is None and calls == [1, 1000, 1000]
    assert sum(calls[1:]) == w.eval_examples["train"] < data.num_train
    calls.clear()
    assert w.evaluate(model, data.train_x, data.train_y, split="train") == out and calls == [1000, 1000]
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


# --- user workloads: the public constructor -------------------------------------------------------

from batchlab.workloads import Workload, classification, regression  # noqa: E402
from batchlab.workloads.metrics import evaluate_classifier  # noqa: E402


def _regression_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 4, generator=g)
    return {"train": (x[:50], x[:50] @ torch.ones(4)), "val": (x[50:], x[50:] @ torch.ones(4))}


def _linear():
    return torch.nn.Sequential(torch.nn.Linear(4, 1), torch.nn.Flatten(0))


def test_a_user_workload_needs_only_name_model_data_task_and_goal():
    w = Workload(name="toy/linear", make_model=_linear, data=_regression_data, task=regression(), goal=0.1)
    assert (w.metric, w.maximize, w.goal_split) == ("val/mse", False, "val")
    assert dict(w.split_sizes) == {"train": 50, "val": 10}  # counted from the data
    data = w.load_data(train_examples=20, seed=3)
    assert data.num_train == 20 and data.test is None
    model = w.build_model(0)
    out = w.evaluate(model, data.val, split="val")
    assert set(out) == {"val/mse", "val/mae"} and out == w.evaluate(model, (data.val_x, data.val_y))
    loss = w.loss(model(data.train_x), data.train_y)
    train_mse = w.evaluate(model, data.train, split="train")["train/mse"]  # the training loss is the MSE
    assert loss.ndim == 0 and loss.item() == pytest.approx(train_mse, rel=1e-5)
    d = w.describe()
    assert json.loads(json.dumps(d)) == d
    assert (d["task"], d["splits"], d["input_shape"], d["input_dtype"], d["num_parameters"], d["reference"]) == (
        "regression", {"train": 50, "val": 10}, [4], "float32", 5, None)


class _Images(torch.utils.data.Dataset):
    """(x[i], a Python int label): unlike TensorDataset, the targets go through default_collate's int path."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


def test_dataset_data_gives_the_same_measurements_as_tensors():
    base = get_workload(FC)
    tensors = base.load_data(train_examples=600, seed=1)
    as_dataset = Workload(name="mnist/fc_dataset", make_model=base.make_model, goal=0.03,
                          data=lambda: (_Images(tensors.train_x, tensors.train_y), _Images(tensors.val_x[:700], tensors.val_y[:700])),
                          eval_examples={"train": 250, "val": None, "test": None}, eval_batch_size=128)
    data = as_dataset.load_data(train_examples=300, seed=2)
    assert torch.equal(data.train.batch(torch.arange(300))[0], tensors.train_x[torch.randperm(600, generator=torch.Generator().manual_seed(2))[:300].sort().values])
    model = base.build_model(0)
    for split, (x, y) in {"train": (data.train.batch(torch.arange(300))), "val": (tensors.val_x[:700], tensors.val_y[:700])}.items():
        expected = evaluate_classifier(model, x, y, split=split, batch_size=128, max_examples=as_dataset.eval_examples[split])
        assert as_dataset.evaluate(model, data.split(split), split=split) == expected


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": "toy"}, "workload name must be 'dataset/model'"),
        ({"name": "a/b/c"}, "workload name must be 'dataset/model'"),
        ({"name": "pkg:a/b"}, "workload name must be 'dataset/model'"),
        ({"goal": float("nan")}, "workload toy/x: goal must be a finite number, got nan"),
        ({"goal": "0.1"}, "goal must be a finite number"),
        ({"data": None}, "give its data as data="),
        ({"metric": "val/accuracy"}, "metric 'val/accuracy' is not one of task 'classification''s metrics; allowed: val/cross_entropy_error, val/classification_error"),
        ({"metric": "dev/classification_error"}, "metric must be '<split>/<name>'"),
        ({"default_steps": 0}, "default_steps must be an integer >= 1, got 0"),
        ({"default_batch_size": 2.5}, "default_batch_size must be an integer"),
        ({"task": "regression"}, "task must be a batchlab.workloads.Task"),
        ({"make_model": 3}, "make_model must be a function"),
        ({"eval_examples": {"train": 0}}, "eval_examples['train'] must be an integer >= 1, got 0"),
        ({"eval_examples": {"dev": 10}}, "eval_examples must map splits (train, val, test) to a number of examples or None"),
    ],
)
def test_bad_workload_declarations_are_one_line_errors(changes, message):
    fields = {"name": "toy/x", "make_model": _linear, "data": _regression_data, "goal": 0.1, **changes}
    with pytest.raises(BatchlabError, match=re_escape(message)):
        Workload(**fields)


def re_escape(text):
    import re

    return re.escape(text)


def test_regression_workload_refuses_label_smoothing_and_a_model_that_is_not_a_module():
    w = Workload(name="toy/linear", make_model=_linear, data=_regression_data, task=regression(), goal=0.1)
    with pytest.raises(BatchlabError, match="label_smoothing applies to classification tasks only"):
        w.loss(torch.zeros(3), torch.zeros(3), label_smoothing=0.1)
    with pytest.raises(BatchlabError, match="make_model returned int, not a torch.nn.Module"):
        Workload(name="toy/bad", make_model=lambda: 3, data=_regression_data, goal=0.1).build_model(0)


def test_a_data_function_that_fails_is_one_line_naming_the_workload():
    def broken():
        raise OSError("disk\nfull")

    w = Workload(name="toy/broken", make_model=_linear, data=broken, task=classification(), goal=0.1)
    with pytest.raises(BatchlabError, match="^workload toy/broken: its data function raised OSError: disk full$"):
        w.load_data()


def test_builtin_loss_and_evaluation_are_the_classification_functions_bitwise():
    from batchlab.workloads.metrics import cross_entropy_loss

    for name in (FC, "shakespeare/lstm_char"):
        w = get_workload(name)
        data = w.load_data(train_examples=2500, seed=0)
        model = w.build_model(1)
        x, y = data.train.batch(torch.arange(16))
        assert torch.equal(w.loss(model(x), y, label_smoothing=0.1), cross_entropy_loss(model(x), y, 0.1))
        for split in ("train", "val"):
            split_data = data.split(split)
            expected = evaluate_classifier(model, split_data.x, split_data.y, split=split, batch_size=w.eval_batch_size,
                                           max_examples=w.eval_examples.get(split))
            assert w.evaluate(model, split_data.x, split_data.y, split=split) == expected
            assert w.evaluate(model, split_data, split=split) == expected


def test_data_may_be_given_directly_instead_of_a_function():
    splits = _regression_data()
    w = Workload(name="toy/direct", make_model=_linear, data=(splits["train"], splits["val"]), task=regression(), goal=0.1)
    assert w.load_data().num_train == 50 and torch.equal(w.load_data().val_x, splits["val"][0])


# --- declared search spaces -------------------------------------------------------------------------

LR_SPACE = {"learning_rate": {"type": "DOUBLE", "min_value": 0.01, "max_value": 1, "scale": "LOG"}}


def test_declared_search_spaces_are_kept_in_the_canonical_form_and_described():
    w = Workload(name="toy/spaces", make_model=_linear, data=_regression_data, task=regression(), goal=0.1,
                 search_spaces={"sgd": LR_SPACE})
    canonical = {"learning_rate": {"type": "DOUBLE", "min_value": 0.01, "max_value": 1.0, "scale": "LOG_SCALE"}}
    assert w.search_spaces == {"sgd": canonical}
    assert w.describe()["search_spaces"] == {"sgd": canonical}
    assert Workload(name="toy/none", make_model=_linear, data=_regression_data, goal=0.1).search_spaces == {}


@pytest.mark.parametrize(
    ("spaces", "message"),
    [
        ({"sdg": LR_SPACE}, "workload toy/x: search_spaces['sdg']: unknown optimizer 'sdg' (did you mean 'sgd'?)"),
        ({"sgd": {"momentum": {"type": "DOUBLE", "min_value": 0.5, "max_value": 0.9}}},
         "workload toy/x: search_spaces['sgd']: sgd takes no hyperparameter 'momentum'; allowed: learning_rate,"),
        ({"sgd": {"learning_rate": {"type": "DOUBLE", "min_value": 0, "max_value": 1, "scale": "LOG"}}},
         "workload toy/x: search_spaces['sgd']: parameter 'learning_rate': LOG scale needs 0 < min_value"),
        ({"sgd": [1]}, "workload toy/x: search_spaces['sgd']: each parameter config in a list needs a string 'name'"),
        ({1: LR_SPACE}, "workload toy/x: search_spaces[1]: optimizer names must be strings"),
        ([("sgd", LR_SPACE)], "workload toy/x: search_spaces must map optimizer names to parameter_configs objects"),
    ],
)
def test_bad_declared_search_spaces_are_one_line_naming_workload_and_optimizer(spaces, message):
    with pytest.raises(BatchlabError, match=re_escape(message)) as info:
        Workload(name="toy/x", make_model=_linear, data=_regression_data, goal=0.1, search_spaces=spaces)
    assert "\n" not in str(info.value)
