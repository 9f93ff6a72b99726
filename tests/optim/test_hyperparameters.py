"""Hyperparameter defaults and validation: one-line errors naming the allowed values."""

import json

import pytest
import torch.nn.functional as F
from torch import nn

from batchlab.errors import BatchlabError
from batchlab.optim import build_training_algorithm, optimizer_defaults, optimizer_names


def build(name, h, total_steps=None):
    return build_training_algorithm(name, nn.Linear(2, 2), F.cross_entropy, h, total_steps=total_steps)


@pytest.mark.parametrize("name", optimizer_names())
def test_defaults_are_json_ready_and_build(name):
    defaults = optimizer_defaults(name)
    json.dumps(defaults)
    assert defaults["learning_rate"] > 0
    assert {"weight_decay", "learning_rate_decay_steps", "end_learning_rate_factor", "warmup_steps",
            "label_smoothing", "ema_decay"} <= set(defaults)
    algo = build(name, defaults)
    assert algo.learning_rate == defaults["learning_rate"]


def test_optimizer_specific_names():
    assert {"beta1", "beta2", "epsilon"} <= set(optimizer_defaults("adam"))
    assert {"damping", "factor_decay", "inverse_update_period", "momentum"} <= set(optimizer_defaults("kfac"))
    assert "trust_coefficient" in optimizer_defaults("lars")
    assert "momentum" not in optimizer_defaults("sgd")


@pytest.mark.parametrize(
    ("name", "h", "fragment"),
    [
        ("sgd", {"learning_rate": 0.0}, "learning_rate must be a number > 0"),
        ("sgd", {"learning_rate": -1.0}, "learning_rate must be a number > 0"),
        ("sgd", {"learning_rate": float("nan")}, "learning_rate must be"),
        ("sgd", {"learning_rate": "fast"}, "learning_rate must be"),
        ("sgd", {"learning_rate": True}, "learning_rate must be"),
        ("momentum", {"momentum": 1.0}, r"momentum must be a number in \[0, 1\)"),
        ("nesterov", {"momentum": -0.1}, r"momentum must be a number in \[0, 1\)"),
        ("adam", {"beta2": 1.0}, r"beta2 must be a number in \[0, 1\)"),
        ("adam", {"epsilon": 0.0}, "epsilon must be a number > 0"),
        ("kfac", {"damping": 0.0}, "damping must be a number > 0"),
        ("kfac", {"inverse_update_period": 2.5}, "inverse_update_period must be an integer >= 1"),
        ("kfac", {"factor_decay": 1.0}, "factor_decay must be"),
        ("lars", {"trust_coefficient": -1e-3}, "trust_coefficient must be a number > 0"),
        ("sgd", {"weight_decay": -0.1}, "weight_decay must be a number >= 0"),
        ("sgd", {"learning_rate_decay_steps": 0}, "learning_rate_decay_steps must be an integer >= 1"),
        ("sgd", {"end_learning_rate_factor": 1.5}, r"end_learning_rate_factor must be a number in \[0, 1\]"),
        ("sgd", {"warmup_steps": -1}, "warmup_steps must be an integer >= 0"),
        ("sgd", {"label_smoothing": 1.0}, "label_smoothing must be"),
        ("sgd", {"ema_decay": 1.0}, "ema_decay must be"),
        ("sgd", {"learning_rate": None}, "learning_rate must be"),
        ("sgd", {"momentum": 0.9}, "unknown hyperparameter for sgd 'momentum'"),
        ("adam", {"learnig_rate": 0.1}, "did you mean 'learning_rate'"),
    ],
)
def test_bad_values_give_one_line_errors(name, h, fragment):
    with pytest.raises(BatchlabError, match=fragment) as info:
        build(name, h)
    assert "\n" not in str(info.value)


def test_unknown_optimizer_suggests_closest():
    with pytest.raises(BatchlabError, match="did you mean 'nesterov'"):
        build("nesterof", {})
    with pytest.raises(BatchlabError, match="known: adam"):
        optimizer_defaults("rmsprop")


def test_integral_floats_become_ints_and_off_values_accept_null():
    algo = build("sgd", {"learning_rate_decay_steps": 10.0, "warmup_steps": 2.0, "ema_decay": None})
    assert algo.hyperparameters["learning_rate_decay_steps"] == 10
    assert isinstance(algo.hyperparameters["warmup_steps"], int)
    assert algo.hyperparameters["end_learning_rate_factor"] == 0.0  # decay to zero unless given


def test_end_factor_without_decay_steps_needs_total_steps():
    with pytest.raises(BatchlabError, match="needs total_steps"):
        build("sgd", {"end_learning_rate_factor": 0.1})
    with pytest.raises(BatchlabError, match="total_steps must be an integer >= 1"):
        build("sgd", {}, total_steps=0)


def test_values_beyond_float32_are_one_line_errors_not_torch_overflows():
    from batchlab.optim.hyperparameters import FLOAT32_MAX, resolve_hyperparameters

    with pytest.raises(BatchlabError, match=r"learning_rate must be a number > 0 and at most 3\.403e\+38") as info:
        resolve_hyperparameters("sgd", {"learning_rate": 1e300})
    assert "\n" not in str(info.value)
    with pytest.raises(BatchlabError, match="weight_decay"):
        resolve_hyperparameters("sgd", {"weight_decay": 1e39})
    assert resolve_hyperparameters("sgd", {"learning_rate": FLOAT32_MAX})["learning_rate"] == FLOAT32_MAX


def test_an_integer_beyond_the_float_range_is_a_one_line_error_not_an_overflow():
    # float(10**400) raises OverflowError; the check used to let it escape as a traceback
    from batchlab.optim.hyperparameters import resolve_hyperparameters

    with pytest.raises(BatchlabError, match="hyperparameter learning_rate must be") as info:
        resolve_hyperparameters("sgd", {"learning_rate": 10**400})
    assert "\n" not in str(info.value)
