"""A user's own workload (an object, or a reference to a file) trained by run_trial and vectorized."""

import pytest
import torch

from batchlab.sweep.vectorized import run_trials_vectorized
from batchlab.sweep.vectorize_choice import vectorized_identical
from batchlab.train import TrialSpec, run_trial
from batchlab.workloads import Workload, regression

WORKLOAD_SOURCE = '''
import torch
from torch import nn

from batchlab.workloads import Workload, regression


def data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(600, 8, generator=generator)
    y = x @ torch.linspace(-1.0, 1.0, 8) + 0.1 * torch.randn(600, generator=generator)
    return {"train": (x[:400], y[:400]), "val": (x[400:], y[400:])}


def model():
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def workload():
    return Workload(name="toy/regression_mlp", make_model=model, data=data, task=regression(), goal=0.3,
                    default_steps=60, default_batch_size=32)
'''


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The same workload as an in-process object and as a file reference."""
    path = tmp_path_factory.mktemp("user") / "toy_workload.py"
    path.write_text(WORKLOAD_SOURCE)
    namespace = {}
    exec(compile(WORKLOAD_SOURCE, "toy_in_test", "exec"), namespace)
    return namespace["workload"](), f"{path}:workload", namespace


def _spec(workload, **overrides):
    base = dict(workload=workload, optimizer="sgd", batch_size=32, hyperparameters={"learning_rate": 0.05}, steps=40,
                seed=1, evaluation_steps=[5, 20, 40], stop_at_goal=False)
    base.update(overrides)
    return TrialSpec(**base)


def test_an_object_and_a_file_reference_train_identically(toy):
    obj, reference, _ = toy
    by_object = run_trial(_spec(obj))
    by_reference = run_trial(_spec(reference))
    assert by_object.workload == by_reference.workload == "toy/regression_mlp/sgd"
    assert by_object.measurements == by_reference.measurements
    assert set(by_object.measurements[-1]) == {"step", "train/mse", "train/mae", "val/mse", "val/mae"}
    assert by_object.status == "COMPLETE" and by_object.metric == "val/mse"
    first, last = by_object.measurements[0]["val/mse"], by_object.measurements[-1]["val/mse"]
    assert last < first  # it learns
    assert by_object.steps_to_goal is not None and by_object.steps_lower is not None


def test_a_dataset_split_samples_the_same_batches_as_tensors(toy):
    obj, _, namespace = toy

    def dataset_data():
        splits = namespace["data"]()
        return {name: torch.utils.data.TensorDataset(*pair) for name, pair in splits.items()}

    as_dataset = Workload(name="toy/regression_mlp_ds", make_model=namespace["model"], data=dataset_data,
                          task=regression(), goal=0.3)
    tensors = run_trial(_spec(obj, train_examples=300, data_seed=2))
    dataset = run_trial(_spec(as_dataset, train_examples=300, data_seed=2))
    assert dataset.measurements == tensors.measurements  # the same examples in the same order, bitwise


def test_vectorized_user_workload_matches_sequential(toy):
    obj, reference, _ = toy
    points = [{"learning_rate": 0.05}, {"learning_rate": 0.2}, {"learning_rate": 0.01}]
    for workload in (obj, reference):
        specs = [_spec(workload, hyperparameters=h, seed=10 + i) for i, h in enumerate(points)]
        vectorized = run_trials_vectorized(specs)
        # Whole trials are equal to the bit where the exactness self-check finds the vectorized path
        # identical on this machine; elsewhere a last-bit difference (float32 sums in another order)
        # grows step after step, so only the first evaluation (after the first few updates from the same
        # initial model, before the difference has grown past rounding) is compared, within float32
        # rounding of a mean over the validation split.
        identical = vectorized_identical(specs)
        for spec, result in zip(specs, vectorized):
            sequential = run_trial(spec)
            if identical:
                assert (result.status, result.steps, result.steps_to_goal, result.steps_lower, result.measurements) == (
                    sequential.status, sequential.steps, sequential.steps_to_goal, sequential.steps_lower,
                    sequential.measurements)
                continue
            first, other = sequential.measurements[0], result.measurements[0]
            assert first.keys() == other.keys()
            for name in first:
                assert other[name] == pytest.approx(first[name], rel=1e-5, abs=1e-7), (name, first, other)


def test_data_cache_keeps_distinct_user_objects_apart(toy):
    obj, _, namespace = toy

    def other_data():
        splits = namespace["data"]()
        return {name: (x, 2.0 * y) for name, (x, y) in splits.items()}

    scaled = Workload(name="toy/regression_mlp", make_model=namespace["model"], data=other_data, task=regression(), goal=0.3)
    a = run_trial(_spec(obj, evaluation_steps=[0], steps=1))
    b = run_trial(_spec(scaled, evaluation_steps=[0], steps=1))
    assert a.measurements[0]["val/mse"] != b.measurements[0]["val/mse"]  # same name, different data


def test_a_bad_reference_is_one_line(tmp_path):
    from batchlab.errors import BatchlabError

    missing = tmp_path / "nowhere.py"
    with pytest.raises(BatchlabError, match="nowhere.py") as err:
        run_trial(_spec(f"{missing}:workload"))
    assert "\n" not in str(err.value)


def test_data_cache_follows_a_re_registered_name_and_a_modified_copy(toy, monkeypatch):
    import dataclasses

    from batchlab.workloads import register_workload, registry, resolve_workload

    obj, reference, namespace = toy
    monkeypatch.setattr(registry, "WORKLOADS", dict(registry.WORKLOADS))

    def doubled():
        return {name: (x, 2.0 * y) for name, (x, y) in namespace["data"]().items()}

    first = _spec("toy/regression_mlp", evaluation_steps=[0], steps=1)
    register_workload(obj)
    before = run_trial(first).measurements[0]["val/mse"]
    register_workload(dataclasses.replace(obj, data=doubled))  # a re-run notebook cell with new data
    assert run_trial(first).measurements[0]["val/mse"] != before  # the name now means the new data

    original = resolve_workload(reference)
    changed = dataclasses.replace(original, data=doubled)  # keeps the reference field, not its data
    a = run_trial(_spec(original, evaluation_steps=[0], steps=1)).measurements[0]["val/mse"]
    b = run_trial(_spec(changed, evaluation_steps=[0], steps=1)).measurements[0]["val/mse"]
    assert a == before and b != a


def test_a_goal_on_the_test_split_is_measured_and_needs_a_test_split(toy):
    import dataclasses

    from batchlab.errors import BatchlabError

    obj, _, namespace = toy

    def with_test():
        splits = namespace["data"]()
        x, y = splits["val"]
        return {**splits, "test": (x[:100], y[:100])}

    on_test = dataclasses.replace(obj, data=with_test, metric="test/mse")
    result = run_trial(_spec(on_test, evaluation_steps=[5, 20, 40]))
    assert all("test/mse" in row for row in result.measurements) and result.metric == "test/mse"
    assert result.steps_to_goal is not None  # the goal metric was read
    no_test = dataclasses.replace(obj, metric="test/mse")
    with pytest.raises(BatchlabError, match="^workload toy/regression_mlp: its goal metric test/mse is on the test split, "
                                            "but its data have no test split$"):
        run_trial(_spec(no_test))


def test_a_goal_metric_the_task_does_not_return_is_refused_before_training(toy, tmp_path):
    import dataclasses

    import torch.nn.functional as F

    from batchlab.errors import BatchlabError
    from batchlab.store import Store
    from batchlab.workloads import custom_task

    obj, _, namespace = toy

    def metrics(outputs, targets):
        error = (outputs.reshape(targets.shape) - targets).abs()
        return {"mae": (error.sum(), error.numel())}

    task = custom_task(lambda o, t: F.l1_loss(o.reshape(t.shape), t), metrics, name="l1")  # no declared names
    typo = Workload(name="toy/l1", make_model=namespace["model"], data=namespace["data"], task=task, metric="val/mea",
                    goal=0.3)
    store = Store.open(tmp_path / "s", create=True)
    with pytest.raises(BatchlabError, match=r"^workload toy/l1: its goal metric val/mea is not among the metrics its "
                                            r"task 'l1' returns \(mae\)$"):
        run_trial(_spec(typo), store=store)
    assert store.table("trials").num_rows == 0
    fixed = run_trial(_spec(dataclasses.replace(typo, metric="val/mae")))
    assert fixed.status == "COMPLETE" and all("val/mae" in row for row in fixed.measurements)
