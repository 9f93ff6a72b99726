"""K-FAC: the preconditioned update against a dense Kronecker computation built by hand."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from batchlab.errors import BatchlabError
from batchlab.optim import build_training_algorithm
from batchlab.optim.algorithm import TrainingAlgorithm
from batchlab.optim.hyperparameters import resolve_hyperparameters
from batchlab.optim.kfac import KfacPreconditioner


CONV = {"kernel_size": 2}  # output 3 x 3 on 4 x 4 inputs
CONV_PADDED = {"kernel_size": 2, "padding": 1, "stride": 2}  # also 3 x 3


def tiny_network(conv=CONV) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(2, 3, **conv), nn.Tanh(), nn.Flatten(), nn.Linear(3 * 3 * 3, 4), nn.Tanh(), nn.Linear(4, 3)
    ).double()


def batch():
    torch.manual_seed(1)
    return torch.randn(5, 2, 4, 4, dtype=torch.float64), torch.randint(0, 3, (5,))


def hand_factors(model, x, y, conv=CONV):
    """A = E[a a^T] (inputs with a trailing 1; conv patches averaged over positions) and
    G = (1/N) sum over examples (and positions) of g g^T, g = d loss_n / d layer output."""
    conv_layer = model[0]
    n = x.shape[0]
    outputs, inputs = {}, {}
    h = x
    for index, layer in enumerate(model):
        if index in (0, 3, 5):
            inputs[index] = h.detach()
            h = layer(h)
            h.retain_grad()
            outputs[index] = h
        else:
            h = layer(h)
    F.cross_entropy(h, y, reduction="sum").backward()  # row n of d/ds is d loss_n / d s_n
    factors = {}
    patches = F.unfold(inputs[0], **conv).transpose(1, 2).reshape(-1, 2 * 2 * 2)  # (N L, C k k)
    patches = torch.cat([patches, torch.ones(patches.shape[0], 1, dtype=patches.dtype)], 1)
    g_conv = outputs[0].grad.permute(0, 2, 3, 1).reshape(-1, 3)  # (N L, C_out)
    factors[conv_layer] = (patches.T @ patches / patches.shape[0], g_conv.T @ g_conv / n)
    for index in (3, 5):
        a = torch.cat([inputs[index], torch.ones(n, 1, dtype=x.dtype)], 1)
        g = outputs[index].grad
        factors[model[index]] = (a.T @ a / n, g.T @ g / n)
    model.zero_grad()
    return factors


def dense_preconditioned(layer, a_factor, g_factor, damping):
    """Solve ((A + sqrt(d) I) kron (G + sqrt(d) I)) p = vec([W b]) densely; return p as [W b]."""
    loss_grad = torch.cat([layer.weight.grad.flatten(1), layer.bias.grad.unsqueeze(1)], 1)
    shift = damping**0.5
    a = a_factor + shift * torch.eye(a_factor.shape[0], dtype=a_factor.dtype)
    g = g_factor + shift * torch.eye(g_factor.shape[0], dtype=g_factor.dtype)
    vec = loss_grad.T.reshape(-1)  # column stacking
    p = torch.linalg.solve(torch.kron(a, g), vec)
    return p.reshape(loss_grad.shape[1], loss_grad.shape[0]).T


def kfac_algorithm(model, damping, factor_decay, period):
    h = resolve_hyperparameters(
        "kfac",
        {"learning_rate": 1.0, "momentum": 0.0, "damping": damping,
         "factor_decay": factor_decay, "inverse_update_period": period},
    )
    return TrainingAlgorithm("kfac", model, F.cross_entropy, h, preconditioner_options={"fisher_type": "empirical"})


@pytest.mark.parametrize(("period", "conv"), [(1, CONV), (2, CONV), (1, CONV_PADDED)])
def test_preconditioned_update_matches_dense_kronecker_solve(period, conv):
    damping, decay = 0.05, 0.5
    model, (x, y) = tiny_network(conv), batch()
    algo = kfac_algorithm(model, damping, decay, period)
    layers = [model[0], model[3], model[5]]
    averaged = None
    for step in range(2):
        fresh = hand_factors(model, x, y, conv)
        if averaged is None:
            averaged = fresh
        else:
            averaged = {m: tuple(decay * o + (1 - decay) * f for o, f in zip(averaged[m], fresh[m])) for m in layers}
        if step % period == 0:
            used = averaged  # inverses refreshed at steps 0, P, 2P, ...
        F.cross_entropy(model(x), y).backward()
        expected = {m: dense_preconditioned(m, *used[m], damping) for m in layers}
        model.zero_grad()
        before = {m: torch.cat([m.weight.flatten(1), m.bias.unsqueeze(1)], 1).detach().clone() for m in layers}
        algo.step(x, y)
        for m in layers:
            after = torch.cat([m.weight.flatten(1), m.bias.unsqueeze(1)], 1).detach()
            torch.testing.assert_close(before[m] - after, expected[m], rtol=1e-6, atol=1e-9)


def test_library_factors_match_hand_factors():
    model, (x, y) = tiny_network(), batch()
    preconditioner = KfacPreconditioner(model, 1e-3, 0.95, 1, fisher_type="empirical")
    inputs, gradients = preconditioner.batch_factors(x, y, torch.Size([5, 3]))
    hand = hand_factors(model, x, y)
    for name, layer in preconditioner.layers.items():
        torch.testing.assert_close(inputs[name], hand[layer][0])
        torch.testing.assert_close(gradients[name], hand[layer][1])


def test_monte_carlo_kfac_lowers_the_loss_on_sequence_outputs():
    torch.manual_seed(0)

    class TokenModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(7, 8)
            self.out = nn.Linear(8, 7)

        def forward(self, tokens):
            return self.out(torch.tanh(self.embed(tokens)))  # (batch, time, classes)

    model = TokenModel()
    tokens = torch.randint(0, 7, (16, 5))
    targets = (tokens + 1) % 7

    def loss_fn(logits, y):
        return F.cross_entropy(logits.reshape(-1, 7), y.reshape(-1))

    algo = build_training_algorithm(
        "kfac", model, loss_fn, {"learning_rate": 0.05, "damping": 0.1, "momentum": 0.5}
    )
    first = algo.step(tokens, targets)
    for _ in range(4):
        algo.step(tokens, targets)
    assert loss_fn(model(tokens), targets).item() < first


def test_model_without_linear_or_conv_layers_is_refused():
    model = nn.Sequential(nn.Embedding(4, 3))
    with pytest.raises(BatchlabError, match="Linear or Conv2d"):
        build_training_algorithm("kfac", model, F.cross_entropy, {"learning_rate": 0.1})


def test_diverged_model_returns_nan_instead_of_raising():
    model, (x, y) = tiny_network(), batch()
    algo = build_training_algorithm("kfac", model, F.cross_entropy, {"learning_rate": 0.1})
    algo.step(x, y)
    with torch.no_grad():
        model[3].weight.fill_(float("nan"))
    assert math.isnan(algo.step(x, y))
    assert algo.steps_taken == 2


def test_damped_inverse_of_an_indefinite_round_off_factor_falls_back_to_eigh():
    from batchlab.optim.kfac import _damped_inverse

    factor = torch.tensor([[1.0, 0.0], [0.0, -1e-3]], dtype=torch.float64)  # slightly indefinite
    inverse = _damped_inverse(factor, 1e-4)
    torch.testing.assert_close(inverse, torch.diag(torch.tensor([1 / (1 + 1e-4), 1e4], dtype=torch.float64)))
    spd = torch.tensor([[2.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
    torch.testing.assert_close(_damped_inverse(spd, 0.5), torch.linalg.inv(spd + 0.5 * torch.eye(2, dtype=torch.float64)))
