"""Default search spaces per optimizer."""

import pytest

from batchlab.errors import BatchlabError
from batchlab.optim import build_training_algorithm, optimizer_defaults, optimizer_names
from batchlab.search import SearchSpace, default_search_space


@pytest.mark.parametrize("name", optimizer_names())
@pytest.mark.parametrize("schedule", ["constant", "linear"])
def test_every_default_point_is_a_valid_hyperparameter_set(name, schedule):
    import torch.nn.functional as F
    from torch import nn

    space = default_search_space(name, train_steps=100, schedule=schedule)
    assert SearchSpace.from_batch_science(space.to_batch_science()) == space
    assert set(space.names) <= set(optimizer_defaults(name))
    assert "learning_rate" in space.names
    for point in space.sample(4, seed=0):
        build_training_algorithm(name, nn.Linear(2, 2), F.cross_entropy, point, total_steps=100)


def test_expected_parameters_per_optimizer():
    assert default_search_space("sgd").names == ["learning_rate"]
    assert default_search_space("momentum").names == ["learning_rate", "momentum"]
    assert default_search_space("adam").names == ["learning_rate", "beta1", "beta2", "epsilon"]
    assert "damping" in default_search_space("kfac").names
    momentum = default_search_space("nesterov").to_batch_science()["momentum"]
    assert momentum["scale"] == "REVERSE_LOG_SCALE" and momentum["min_value"] <= 0.9 and momentum["max_value"] >= 0.99


def test_linear_schedule_decay_steps_follow_train_steps():
    configs = default_search_space("momentum", train_steps=1001, schedule="linear").to_batch_science()
    decay = configs["learning_rate_decay_steps"]
    assert decay == {"type": "INTEGER", "min_value": 501, "max_value": 1001, "scale": "LINEAR_SCALE"}
    assert configs["end_learning_rate_factor"]["scale"] == "LOG_SCALE"
    assert default_search_space("sgd", train_steps=1, schedule="linear").to_batch_science()[
        "learning_rate_decay_steps"]["min_value"] == 1


def test_errors():
    with pytest.raises(BatchlabError, match="did you mean 'adam'"):
        default_search_space("adma")
    with pytest.raises(BatchlabError, match="allowed: constant, linear"):
        default_search_space("sgd", schedule="cosine")
    with pytest.raises(BatchlabError, match="needs train_steps"):
        default_search_space("sgd", schedule="linear")


def test_new_optimizers_spaces():
    assert default_search_space("adamw").names == ["learning_rate", "beta1", "beta2", "weight_decay"]
    assert default_search_space("soap").names == ["learning_rate", "beta1", "beta2"]
    assert default_search_space("muon").names == ["learning_rate", "momentum", "adam_learning_rate"]
    # Each library's own default lies inside its searched range.
    for name, key in (("adamw", "learning_rate"), ("soap", "learning_rate"), ("soap", "beta2"),
                      ("muon", "learning_rate"), ("muon", "momentum"), ("muon", "adam_learning_rate")):
        config = default_search_space(name).to_batch_science()[key]
        assert config["min_value"] <= optimizer_defaults(name)[key] <= config["max_value"], (name, key)


def test_a_registered_optimizer_has_its_own_space(monkeypatch):
    import torch

    from batchlab.optim import OptimizerEntry, register_optimizer, registry
    from batchlab.search import Parameter

    registry._registry()
    monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    register_optimizer(OptimizerEntry(
        name="my_adagrad", summary="Adagrad", defaults={"learning_rate": 0.01},
        search_space=(Parameter("learning_rate", "DOUBLE", "LOG", 1e-3, 1.0),),
        build=lambda params, h: torch.optim.Adagrad(params, lr=h["learning_rate"]),
    ))
    space = default_search_space("my_adagrad", train_steps=10, schedule="linear")
    assert space.names == ["learning_rate", "learning_rate_decay_steps", "end_learning_rate_factor"]
    assert space.to_batch_science()["learning_rate"]["max_value"] == 1.0


def _with_spaces(spaces):
    import dataclasses

    from batchlab.workloads import get_workload

    return dataclasses.replace(get_workload("mnist/fc_64_64_64"), name="mnist/fc_declared", search_spaces=spaces)


LR = {"learning_rate": {"type": "DOUBLE", "min_value": 0.05, "max_value": 0.5, "scale": "LOG_SCALE"}}
GIVEN = {"learning_rate": {"type": "DOUBLE", "min_value": 0.1, "max_value": 0.2, "scale": "LINEAR_SCALE"}}


def test_a_study_searches_the_given_space_then_the_workloads_then_the_optimizers_default():
    from batchlab.search import study_search_space

    workload = _with_spaces({"sgd": LR})
    assert study_search_space("sgd", GIVEN, workload).to_batch_science() == GIVEN
    assert study_search_space("sgd", None, workload).to_batch_science() == LR
    assert study_search_space("momentum", None, workload) == default_search_space("momentum")  # not declared
    assert study_search_space("sgd", None, None) == default_search_space("sgd")
    assert study_search_space("sgd", {}, workload).names == []  # an empty space given is taken as given


def test_the_linear_schedule_adds_to_a_workloads_space_the_decay_parameters_it_does_not_name():
    declared = {**LR, "end_learning_rate_factor": {"type": "DISCRETE", "feasible_points": [0.01]}}
    space = default_search_space("sgd", train_steps=100, schedule="linear", workload=_with_spaces({"sgd": declared}))
    configs = space.to_batch_science()
    assert space.names == ["learning_rate", "end_learning_rate_factor", "learning_rate_decay_steps"]
    assert configs["end_learning_rate_factor"] == declared["end_learning_rate_factor"]  # the workload's, kept
    assert configs["learning_rate_decay_steps"]["min_value"] == 50 and configs["learning_rate"] == LR["learning_rate"]
