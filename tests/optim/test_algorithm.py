"""Training algorithms: every optimizer lowers the loss, update conventions by hand, schedules, EMA."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from batchlab.optim import build_training_algorithm, optimizer_names

LEARNING_RATES = {
    "sgd": 0.5, "momentum": 0.1, "nesterov": 0.1, "adam": 1e-2, "kfac": 0.05, "lars": 1.0, "lamb": 1e-2,
    "adamw": 1e-2, "muon": 0.05,
}  # soap: its first update only initialises the preconditioner (tests/optim/test_builtin.py trains it)


def classification_problem():
    torch.manual_seed(0)
    x = torch.randn(32, 1, 6, 6)
    y = torch.randint(0, 3, (32,))
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 8), nn.ReLU(), nn.Linear(8, 3)
    )
    return model, x, y


def test_optimizer_names_are_the_issue_list():
    assert optimizer_names()[:10] == [
        "sgd", "momentum", "nesterov", "adam", "kfac", "lars", "lamb", "adamw", "soap", "muon"
    ]


@pytest.mark.parametrize("name", list(LEARNING_RATES))
def test_one_step_lowers_the_loss(name):
    model, x, y = classification_problem()
    algo = build_training_algorithm(name, model, F.cross_entropy, {"learning_rate": LEARNING_RATES[name]}, total_steps=10)
    with torch.no_grad():
        before = F.cross_entropy(model(x), y).item()
    returned = algo.step(x, y)
    assert returned == pytest.approx(before, rel=1e-6)  # the loss before the update
    with torch.no_grad():
        after = F.cross_entropy(model(x), y).item()
    assert after < before
    assert algo.steps_taken == 1


def quadratic_problem():
    """loss = 0.5 * sum(c * theta^2): gradient c * theta, theta a single (2,) parameter."""
    theta = nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    curvature = torch.tensor([1.0, 3.0], dtype=torch.float64)

    class Quadratic(nn.Module):
        def __init__(self):
            super().__init__()
            self.theta = theta

        def forward(self, x):
            return self.theta

    def loss_fn(out, y):
        return 0.5 * (curvature * out**2).sum()

    return Quadratic(), loss_fn, curvature


@pytest.mark.parametrize("name", ["sgd", "momentum", "nesterov"])
def test_update_conventions_by_hand(name):
    """sgd: theta -= eta g; heavy ball: v = gamma v + g, theta -= eta v; Nesterov: theta -= eta (g + gamma v)."""
    eta, gamma = 0.1, 0.9
    model, loss_fn, c = quadratic_problem()
    h = {"learning_rate": eta} if name == "sgd" else {"learning_rate": eta, "momentum": gamma}
    algo = build_training_algorithm(name, model, loss_fn, h)
    theta = model.theta.detach().clone()
    v = torch.zeros_like(theta)
    for _ in range(4):
        g = c * theta
        v = gamma * v + g
        if name == "sgd":
            theta = theta - eta * g
        elif name == "momentum":
            theta = theta - eta * v
        else:
            theta = theta - eta * (g + gamma * v)
        algo.step(None, None)
        torch.testing.assert_close(model.theta.detach(), theta)


def test_adam_uses_beta1_beta2_epsilon():
    model, loss_fn, c = quadratic_problem()
    eta, b1, b2, eps = 0.01, 0.5, 0.9, 1e-3
    algo = build_training_algorithm("adam", model, loss_fn, {"learning_rate": eta, "beta1": b1, "beta2": b2, "epsilon": eps})
    theta = model.theta.detach().clone()
    m = torch.zeros_like(theta)
    s = torch.zeros_like(theta)
    for t in range(1, 4):
        g = c * theta
        m = b1 * m + (1 - b1) * g
        s = b2 * s + (1 - b2) * g * g
        theta = theta - eta * (m / (1 - b1**t)) / ((s / (1 - b2**t)).sqrt() + eps)
        algo.step(None, None)
    torch.testing.assert_close(model.theta.detach(), theta)


def learning_rates_over(h, steps, total_steps=None):
    model, loss_fn, _ = quadratic_problem()
    algo = build_training_algorithm("sgd", model, loss_fn, h, total_steps=total_steps)
    rates = []
    for _ in range(steps):
        rates.append(algo.learning_rate)
        algo.step(None, None)
    return rates


def test_constant_schedule():
    assert learning_rates_over({"learning_rate": 0.3}, 5) == [0.3] * 5


def test_linear_decay_is_the_shallue_formula():
    eta0, alpha, T = 0.8, 0.1, 4
    rates = learning_rates_over(
        {"learning_rate": eta0, "learning_rate_decay_steps": T, "end_learning_rate_factor": alpha}, 7
    )
    expected = [eta0 - (1 - alpha) * eta0 * min(t, T) / T for t in range(7)]
    assert rates == pytest.approx(expected, rel=1e-12)
    assert rates[-1] == pytest.approx(alpha * eta0)


def test_end_factor_alone_decays_over_total_steps():
    rates = learning_rates_over({"learning_rate": 1.0, "end_learning_rate_factor": 0.0}, 5, total_steps=4)
    assert rates == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])


def test_warmup_then_constant():
    rates = learning_rates_over({"learning_rate": 1.0, "warmup_steps": 4}, 6)
    assert rates == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])


def test_sgd_step_uses_the_scheduled_rate():
    model, loss_fn, c = quadratic_problem()
    algo = build_training_algorithm("sgd", model, loss_fn, {"learning_rate": 1.0, "warmup_steps": 2})
    theta = model.theta.detach().clone()
    algo.step(None, None)  # rate 0.5
    torch.testing.assert_close(model.theta.detach(), theta - 0.5 * c * theta)


def test_ema_swaps_in_and_out():
    model, loss_fn, c = quadratic_problem()
    decay = 0.5
    algo = build_training_algorithm("sgd", model, loss_fn, {"learning_rate": 0.1, "ema_decay": decay})
    with algo.evaluation_weights():  # no update yet: the weights themselves
        initial = model.theta.detach().clone()
    ema = None
    for _ in range(3):
        algo.step(None, None)
        current = model.theta.detach().clone()
        ema = current if ema is None else decay * ema + (1 - decay) * current
    with algo.evaluation_weights() as evaluated:
        assert evaluated is model
        torch.testing.assert_close(model.theta.detach(), ema)
    torch.testing.assert_close(model.theta.detach(), current)
    assert not torch.equal(ema, current) and not torch.equal(initial, current)


def test_evaluation_weights_without_ema_are_the_weights():
    model, loss_fn, _ = quadratic_problem()
    algo = build_training_algorithm("momentum", model, loss_fn, {"learning_rate": 0.1})
    algo.step(None, None)
    current = model.theta.detach().clone()
    with algo.evaluation_weights():
        torch.testing.assert_close(model.theta.detach(), current)


def test_ema_restores_weights_after_an_exception():
    model, loss_fn, _ = quadratic_problem()
    algo = build_training_algorithm("sgd", model, loss_fn, {"learning_rate": 0.1, "ema_decay": 0.9})
    algo.step(None, None)
    algo.step(None, None)
    current = model.theta.detach().clone()
    with pytest.raises(RuntimeError):
        with algo.evaluation_weights():
            raise RuntimeError("evaluation failed")
    torch.testing.assert_close(model.theta.detach(), current)


def test_weight_decay_adds_l2_gradient():
    model, loss_fn, c = quadratic_problem()
    algo = build_training_algorithm("sgd", model, loss_fn, {"learning_rate": 0.1, "weight_decay": 0.5})
    theta = model.theta.detach().clone()
    algo.step(None, None)
    torch.testing.assert_close(model.theta.detach(), theta - 0.1 * (c * theta + 0.5 * theta))


def test_nan_loss_is_returned_not_raised():
    model, _, _ = quadratic_problem()
    algo = build_training_algorithm("sgd", model, lambda out, y: (out * math.inf).sum() * 0.0, {"learning_rate": 0.1})
    assert math.isnan(algo.step(None, None))
