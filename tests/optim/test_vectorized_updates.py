"""Vectorized updates on stacked trials equal each trial's own torch optimizer, step for step."""

import pytest
import torch

from batchlab.optim import get_optimizer, resolve_hyperparameters, vectorized_optimizer_names

# Three trials per optimizer, with different hyperparameters (one with weight decay).
TRIALS = {
    "sgd": [{"learning_rate": 0.1}, {"learning_rate": 0.5, "weight_decay": 0.1}, {"learning_rate": 0.01}],
    "momentum": [{"learning_rate": 0.1, "momentum": 0.9}, {"learning_rate": 0.05, "momentum": 0.5, "weight_decay": 0.01},
                 {"learning_rate": 0.01, "momentum": 0.99}],
    "nesterov": [{"learning_rate": 0.1, "momentum": 0.9}, {"learning_rate": 0.05, "momentum": 0.5, "weight_decay": 0.01},
                 {"learning_rate": 0.01, "momentum": 0.99}],
    "adam": [{"learning_rate": 1e-2}, {"learning_rate": 1e-3, "beta1": 0.5, "beta2": 0.9, "epsilon": 1e-4,
                                       "weight_decay": 0.1}, {"learning_rate": 0.1, "beta2": 0.99}],
}
SHAPES = {"weight": (4, 3), "bias": (4,)}


def test_the_vectorized_optimizers_are_the_ones_tested_here():
    assert vectorized_optimizer_names() == list(TRIALS)


@pytest.mark.parametrize("name", list(TRIALS))
def test_stacked_update_equals_the_torch_optimizer(name):
    entry = get_optimizer(name)
    hypers = [resolve_hyperparameters(name, h) for h in TRIALS[name]]
    k = len(hypers)
    generator = torch.Generator().manual_seed(0)
    initial = {n: torch.randn(k, *shape, generator=generator) for n, shape in SHAPES.items()}
    grads_per_step = [{n: torch.randn(k, *shape, generator=generator) for n, shape in SHAPES.items()}
                      for _ in range(4)]

    stacked = {n: v.clone() for n, v in initial.items()}
    state = {s: {n: torch.zeros_like(v) for n, v in stacked.items()} for s in entry.vectorized.state_names}
    lr = torch.tensor([h["learning_rate"] for h in hypers], dtype=torch.float32)

    def column(key):
        return torch.tensor([h[key] for h in hypers], dtype=torch.float32)

    references = []
    for row, h in enumerate(hypers):
        params = [torch.nn.Parameter(initial[n][row].clone()) for n in SHAPES]
        references.append((params, entry.build(params, h)))

    for step, grads in enumerate(grads_per_step, start=1):
        with torch.no_grad():
            entry.vectorized.update(stacked, grads, state, lr, column, step, any(h["weight_decay"] for h in hypers))
        for row, (params, optimizer) in enumerate(references):
            for p, n in zip(params, SHAPES):
                p.grad = grads[n][row].clone()
            optimizer.step()
        for row, (params, _) in enumerate(references):
            for p, n in zip(params, SHAPES):
                torch.testing.assert_close(stacked[n][row], p.detach(), msg=f"{name} trial {row} {n} step {step}")
    assert not torch.equal(stacked["weight"], initial["weight"])
