"""The built-in entries: the torch optimizers they build, and the new ones (adamw, soap, muon) training."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from batchlab.optim import build_training_algorithm, get_optimizer, resolve_hyperparameters


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def data():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(64, 6, generator=generator), torch.randint(0, 3, (64,), generator=generator)


# The optimizers the seven original entries have always built: class and the arguments passed.
EXPECTED = {
    "sgd": ("SGD", {"lr": 0.1, "momentum": 0, "dampening": 0, "nesterov": False, "weight_decay": 0.0}),
    "momentum": ("SGD", {"lr": 0.01, "momentum": 0.9, "dampening": 0.0, "nesterov": False, "weight_decay": 0.0}),
    "nesterov": ("SGD", {"lr": 0.01, "momentum": 0.9, "dampening": 0.0, "nesterov": True, "weight_decay": 0.0}),
    "adam": ("Adam", {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False}),
    "kfac": ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.0, "nesterov": False, "weight_decay": 0.0}),
    "lars": ("LARS", {"lr": 1.0, "momentum": 0.9, "dampening": 0.0, "trust_coefficient": 1e-3, "weight_decay": 0.0}),
    "lamb": ("Lamb", {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.0}),
    "adamw": ("AdamW", {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}),
    "soap": ("SOAP", {"lr": 3e-3, "betas": (0.95, 0.95), "eps": 1e-8, "weight_decay": 0.0, "precondition_frequency": 10}),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_builds_the_documented_torch_optimizer(name):
    model = mlp()
    params = list(model.parameters())
    optimizer = get_optimizer(name).build(params, resolve_hyperparameters(name, {}))
    kind, arguments = EXPECTED[name]
    assert type(optimizer).__name__ == kind
    assert {k: optimizer.defaults[k] for k in arguments} == arguments
    assert len(optimizer.param_groups) == 1 and optimizer.param_groups[0]["params"] == params  # model order


def test_muon_takes_matrices_and_leaves_vectors_to_adamw():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 3), nn.LayerNorm(3))
    h = resolve_hyperparameters("muon", {"learning_rate": 0.05, "adam_learning_rate": 1e-3, "weight_decay": 0.1})
    optimizer = get_optimizer("muon").build(list(model.parameters()), h)
    muon, adamw = optimizer.param_groups
    assert type(optimizer).__name__ == "Muon"
    assert muon["use_muon"] and muon["params"] == [model[0].weight, model[2].weight]  # conv kernel too
    assert muon["lr"] == 0.05 and muon["momentum"] == 0.95 and muon["nesterov"] and muon["weight_decay"] == 0.1
    assert not adamw["use_muon"] and adamw["params"] == [model[0].bias, model[2].bias, model[3].weight, model[3].bias]
    assert adamw["lr"] == 1e-3 and adamw["betas"] == (0.9, 0.95) and adamw["eps"] == 1e-10 and adamw["weight_decay"] == 0.1
    no_bias = get_optimizer("muon").build(list(nn.Linear(4, 2, bias=False).parameters()), h)
    assert [g["use_muon"] for g in no_bias.param_groups] == [True]


def test_muon_schedule_scales_both_groups():
    h = {"learning_rate": 0.1, "adam_learning_rate": 0.01, "warmup_steps": 2}
    algo = build_training_algorithm("muon", mlp(), F.cross_entropy, h)
    x, y = data()
    assert [g["lr"] for g in algo.optimizer.param_groups] == pytest.approx([0.05, 0.005])
    algo.step(x, y)
    assert algo.learning_rate == pytest.approx(0.1)
    assert [g["lr"] for g in algo.optimizer.param_groups] == pytest.approx([0.1, 0.01])


def test_adamw_decay_is_decoupled_and_scaled_by_the_learning_rate():
    """With a zero gradient Adam's direction is 0, so one AdamW update is theta (1 - eta weight_decay)."""
    theta = nn.Parameter(torch.tensor([1.0, -2.0]))

    class Constant(nn.Module):
        def __init__(self):
            super().__init__()
            self.theta = theta

        def forward(self, x):
            return self.theta

    algo = build_training_algorithm("adamw", Constant(), lambda out, y: (out * 0.0).sum(),
                                    {"learning_rate": 0.1, "weight_decay": 0.5})
    algo.step(None, None)
    torch.testing.assert_close(theta.detach(), torch.tensor([1.0, -2.0]) * (1 - 0.1 * 0.5))


def test_soap_first_update_only_initialises_then_moves():
    algo = build_training_algorithm("soap", mlp(), F.cross_entropy, {"precondition_frequency": 2})
    x, y = data()
    before = [p.detach().clone() for p in algo.model.parameters()]
    algo.step(x, y)
    assert all(torch.equal(a, p) for a, p in zip(before, algo.model.parameters()))
    algo.step(x, y)
    assert not all(torch.equal(a, p) for a, p in zip(before, algo.model.parameters()))
    assert algo.optimizer.param_groups[0]["precondition_frequency"] == 2


@pytest.mark.parametrize("name", ["adamw", "soap", "muon"])
def test_new_optimizers_lower_the_loss_on_a_tiny_model(name):
    algo = build_training_algorithm(name, mlp(), F.cross_entropy, {})
    x, y = data()
    before = [p.detach().clone() for p in algo.model.parameters()]
    losses = [algo.step(x, y) for _ in range(15)]
    with torch.no_grad():
        final = F.cross_entropy(algo.model(x), y).item()
    assert all(torch.isfinite(torch.tensor(losses))) and final < losses[0]
    assert all(not torch.equal(a, p) for a, p in zip(before, algo.model.parameters()))


@pytest.mark.parametrize("name", ["adamw", "soap", "muon"])
def test_new_optimizers_train_through_run_trial(name):
    from batchlab.train import TrialSpec, run_trial

    result = run_trial(TrialSpec(workload="mnist/fc_64_64_64", optimizer=name, batch_size=64, hyperparameters={},
                                 steps=20, train_examples=2000, evaluation_steps=[0]))
    assert result.status == "COMPLETE" and result.steps == 20
    first, last = result.measurements[0], result.measurements[-1]
    assert last["step"] == 20 and last["train/cross_entropy_error"] < first["train/cross_entropy_error"]
