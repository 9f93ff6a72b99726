"""NoiseScaleTracker: running B_simple from micro-batch (or local) and step gradients.

The known distribution is the linear regression of tests/probes/test_noise_scale.py at fixed
parameters: x ~ N(0, C) with C diagonal, y = w*^T x + N(0, s2), loss (f(x) - y)^2 / 2, a = w - w*;
then tr(Sigma) = (a^T C a + s2) tr(C) + |C a|^2 and |G|^2 = |C a|^2 exactly (derivation there). The
parameters are not updated, so every step's two gradients are draws at the same point.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from batchlab.errors import BatchlabError
from batchlab.probes.noise_scale import moments_from_norms
from batchlab.probes.tracker import NoiseScaleTracker

C = np.array([2.0, 1.0, 0.6, 0.3])
A = np.array([0.5, -0.4, 0.3, 0.5])
W_STAR = np.array([0.2, 0.1, -0.3, 0.4])
S2 = 0.1
TRACE_SIGMA = (A @ (C * A) + S2) * C.sum() + ((C * A) ** 2).sum()
GRAD_NORM_SQ = ((C * A) ** 2).sum()
B_SIMPLE = TRACE_SIGMA / GRAD_NORM_SQ


def model_at(w=W_STAR + A):
    model = nn.Sequential(nn.Linear(4, 1, bias=False, dtype=torch.float64))
    with torch.no_grad():
        model[0].weight.copy_(torch.as_tensor(w)[None])
    return model


def draw(batch_size, generator):
    x = torch.randn(batch_size, 4, generator=generator, dtype=torch.float64) * torch.as_tensor(np.sqrt(C))
    y = x @ torch.as_tensor(W_STAR) + torch.randn(batch_size, generator=generator, dtype=torch.float64) * math.sqrt(S2)
    return x, y[:, None]


def loss_fn(outputs, targets):
    return 0.5 * (outputs - targets).square().mean()


def accumulate(model, x, y, micro_batches):
    """One step of gradient accumulation as a user writes it: each micro-batch loss divided by k."""
    model.zero_grad(set_to_none=True)
    for xm, ym in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
        (loss_fn(model(xm), ym) / micro_batches).backward()


def test_running_b_simple_converges_to_the_truth():
    model = model_at()
    mean = NoiseScaleTracker(model, beta=None)  # the plain mean over steps
    ema = NoiseScaleTracker(model, beta=0.99)
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        x, y = draw(512, g)
        accumulate(model, x, y, 8)  # small = 64 examples, big = 512
        mean.update(model, batch_size=512, grad_scale=1 / 8)
        ema.update(model, batch_size=512, grad_scale=1 / 8)
    assert mean.steps == 300 and mean.last["small_batch_size"] == 64
    assert mean.b_simple == pytest.approx(B_SIMPLE, rel=0.05)
    # grad_scale undoes the 1/k of the accumulation: the moments of the per-example loss itself
    assert mean.trace_sigma == pytest.approx(TRACE_SIGMA, rel=0.05)
    assert mean.grad_norm_sq == pytest.approx(GRAD_NORM_SQ, rel=0.05)
    # the EMA weights about the last 200 steps: looser, but around the same value
    assert ema.b_simple == pytest.approx(B_SIMPLE, rel=0.15)
    layer = mean.per_layer["0"]
    assert layer["trace_sigma"] == pytest.approx(mean.trace_sigma) and layer["b_simple"] == pytest.approx(mean.b_simple)


def test_each_step_is_the_two_batch_arithmetic_and_the_ema_is_bias_corrected():
    model = model_at()
    tracker = NoiseScaleTracker(model, beta=0.9)
    x, y = draw(24, torch.Generator().manual_seed(1))
    accumulate(model, x, y, 3)
    b_simple = tracker.update(model, batch_size=24)
    parts = []
    for xm, ym in zip(x.chunk(3), y.chunk(3)):
        model.zero_grad()
        (loss_fn(model(xm), ym) / 3).backward()
        parts.append(model[0].weight.grad.clone())
    small = float(np.mean([float(p.square().sum()) for p in parts]))
    big = float((sum(parts) / 3).square().sum())
    grad_norm_sq, trace_sigma = moments_from_norms(small, big, 8, 24)
    # after one step the bias-corrected EMA is that step's estimate
    assert tracker.grad_norm_sq == pytest.approx(grad_norm_sq, rel=1e-12)
    assert tracker.trace_sigma == pytest.approx(trace_sigma, rel=1e-12)
    assert b_simple == pytest.approx(trace_sigma / grad_norm_sq, rel=1e-12)


def run_steps(model, trackers, generator, steps):
    out = []
    for _ in range(steps):
        x, y = draw(32, generator)
        accumulate(model, x, y, 2)
        out.append([t.update(model, batch_size=32) for t in trackers])
    return out


def test_state_dict_round_trip_continues_identically():
    model = model_at()
    first = NoiseScaleTracker(model, beta=0.95)
    g = torch.Generator().manual_seed(2)
    run_steps(model, [first], g, 20)
    state = json.loads(json.dumps(first.state_dict()))  # plain Python: survives JSON and torch.save
    second = NoiseScaleTracker(model, beta=0.5)
    second.load_state_dict(state)
    assert second.beta == 0.95 and second.steps == 20 and second.b_simple == first.b_simple
    history = run_steps(model, [first, second], g, 20)
    assert all(a == b for a, b in history)
    assert first.state_dict() == second.state_dict() and first.per_layer == second.per_layer
    with pytest.raises(BatchlabError, match="version"):
        second.load_state_dict({**state, "version": 99})


def simulate_data_parallel(n_workers, global_batch, steps, seed, sync_with=None, sync=True):
    """n replicas, each back-propagating its own shard of B/n examples (its local gradient, which the
    tracker's hooks see), then the all-reduce as DDP does it: every replica's .grad := the mean."""
    replicas = [model_at() for _ in range(n_workers)]
    trackers = [NoiseScaleTracker(r, beta=None, sync=sync) for r in replicas]
    g = torch.Generator().manual_seed(seed)
    local_sq = []
    for _ in range(steps):
        x, y = draw(global_batch, g)
        for r, xs, ys in zip(replicas, x.chunk(n_workers), y.chunk(n_workers)):
            r.zero_grad(set_to_none=True)
            loss_fn(r(xs), ys).backward()
        mean = sum(r[0].weight.grad for r in replicas) / n_workers
        local_sq.append([float(r[0].weight.grad.square().sum()) for r in replicas])
        for r in replicas:
            r[0].weight.grad = mean.clone()
        if sync_with is not None:
            sync_with(sum(local_sq[-1]))
        for r, t in zip(replicas, trackers):
            t.update(r, batch_size=global_batch, world_size=n_workers)
    return trackers, np.array(local_sq)


def test_data_parallel_arithmetic_local_against_all_reduced():
    n, batch = 4, 64
    trackers, local_sq = simulate_data_parallel(n, batch, steps=1, seed=3)
    # each worker: small = its local gradient (B/n = 16 examples), big = the all-reduced mean (64)
    for worker, tracker in enumerate(trackers):
        assert tracker.last["small_batch_size"] == 16
        big = tracker.last  # the same all-reduced gradient on every worker
        grad_norm_sq, trace_sigma = moments_from_norms(local_sq[0, worker], _big_sq(tracker), 16, 64)
        assert big["grad_norm_sq"] == pytest.approx(grad_norm_sq, rel=1e-12)
        assert big["trace_sigma"] == pytest.approx(trace_sigma, rel=1e-12)


def _big_sq(tracker):
    return float(tracker._params[0].grad.square().sum())


def test_data_parallel_matches_accumulation_and_converges():
    """Averaged over workers, the data-parallel estimate is the one of a single process that
    accumulates the same shards as micro-batches; over many steps it converges to the truth."""
    n, batch, steps = 4, 256, 200
    trackers, _ = simulate_data_parallel(n, batch, steps, seed=4)
    single = model_at()
    tracker = NoiseScaleTracker(single, beta=None)
    g = torch.Generator().manual_seed(4)
    for _ in range(steps):
        x, y = draw(batch, g)
        accumulate(single, x, y, n)
        tracker.update(single, batch_size=batch, grad_scale=1 / n)
    assert np.mean([t.trace_sigma for t in trackers]) == pytest.approx(tracker.trace_sigma, rel=1e-9)
    assert np.mean([t.grad_norm_sq for t in trackers]) == pytest.approx(tracker.grad_norm_sq, rel=1e-9)
    assert tracker.b_simple == pytest.approx(B_SIMPLE, rel=0.1)


def test_data_parallel_sync_averages_the_local_norms(monkeypatch):
    """With torch.distributed initialized (faked here), every worker all-reduces its small norm and
    all hold the same, pooled estimate."""
    import torch.distributed as dist

    from batchlab.probes import tracker as tracker_module

    n = 4
    monkeypatch.setattr(tracker_module, "_world_size", lambda: n)
    pooled = {}

    def fake_all_reduce(tensor, *args, **kwargs):  # SUM over workers of the local squared norms
        tensor.copy_(torch.full_like(tensor, pooled["sum"]))

    monkeypatch.setattr(dist, "all_reduce", fake_all_reduce)
    trackers, local_sq = simulate_data_parallel(n, 64, steps=3, seed=5,
                                                sync_with=lambda s: pooled.__setitem__("sum", s))
    values = {t.trace_sigma for t in trackers}
    assert len(values) == 1  # every rank the same
    unsynced, _ = simulate_data_parallel(n, 64, steps=3, seed=5, sync=False)
    assert trackers[0].trace_sigma == pytest.approx(np.mean([t.trace_sigma for t in unsynced]), rel=1e-9)


def test_registers_on_the_first_update_when_built_without_a_model():
    model = model_at()
    tracker = NoiseScaleTracker()
    g = torch.Generator().manual_seed(6)
    x, y = draw(32, g)
    accumulate(model, x, y, 2)
    assert tracker.update(model, batch_size=32) is None and tracker.steps == 0 and math.isnan(tracker.b_simple)
    run_steps(model, [tracker], g, 3)
    assert tracker.steps == 3 and math.isfinite(tracker.b_simple)
    assert tracker.to_dict()["steps"] == 3


def test_one_gradient_per_step_is_an_error():
    model = model_at()
    tracker = NoiseScaleTracker(model)
    x, y = draw(16, torch.Generator().manual_seed(7))
    with pytest.raises(BatchlabError, match="after backward"):
        tracker.update(model, batch_size=16)
    loss_fn(model(x), y).backward()
    with pytest.raises(BatchlabError, match="micro-batches"):
        tracker.update(model, batch_size=16, world_size=1)
    with pytest.raises(BatchlabError, match="beta"):
        NoiseScaleTracker(model, beta=1.5)


def test_remove_detaches_the_hooks():
    model = model_at()
    tracker = NoiseScaleTracker(model)
    tracker.remove()
    assert model[0].weight._backward_hooks is None  # no empty hook dictionary left behind
    x, y = draw(8, torch.Generator().manual_seed(8))
    loss_fn(model(x), y).backward()
    assert tracker._pending == []


def test_copy_of_a_model_is_not_tracked():
    model = model_at()
    tracker = NoiseScaleTracker(model)
    clone = copy.deepcopy(model)
    x, y = draw(8, torch.Generator().manual_seed(9))
    loss_fn(clone(x), y).backward()
    assert tracker._pending == []


def test_every_measures_one_step_in_n_with_the_hooks_off_in_between():
    model = model_at()
    sparse = NoiseScaleTracker(model, beta=None, every=3)
    dense = NoiseScaleTracker(model, beta=None)
    g = torch.Generator().manual_seed(10)
    measured = []
    for call in range(9):
        x, y = draw(32, g)
        accumulate(model, x, y, 2)
        dense.update(model, batch_size=32)
        sparse.update(model, batch_size=32)
        if call % 3 == 0:
            measured.append(dense.last["trace_sigma"])
        assert bool(sparse._handles) == ((call + 1) % 3 == 0)  # on only for the next measured step
    assert sparse.steps == 3 and sparse.calls == 9 and dense.steps == 9
    assert sparse.trace_sigma == pytest.approx(np.mean(measured), rel=1e-12)
    restored = NoiseScaleTracker(model_at(), every=1)
    restored.load_state_dict(sparse.state_dict())
    assert restored.every == 3 and restored.calls == 9 and bool(restored._handles)
    with pytest.raises(BatchlabError, match="every"):
        NoiseScaleTracker(model, every=0)


@pytest.mark.parametrize("beta", [None, 0.9])
def test_a_parameter_without_gradient_at_some_steps_is_averaged_over_its_own_steps(beta):
    """Two independent linear models in one tracker, the second used only at every third step: its
    per-layer running estimates equal those of a tracker of the second model alone, fed at those steps
    (each parameter tensor carries its own EMA weight or count)."""
    first, second = model_at(), model_at(W_STAR - A)
    both = nn.ModuleDict({"a": first, "b": second})
    together = NoiseScaleTracker(both, beta=beta)
    alone = NoiseScaleTracker(second, beta=beta)
    g = torch.Generator().manual_seed(3)
    for step in range(12):
        x, y = draw(64, g)
        both.zero_grad(set_to_none=True)
        for xm, ym in zip(x.chunk(4), y.chunk(4)):
            loss = loss_fn(first(xm), ym) + (loss_fn(second(xm), ym) if step % 3 == 0 else 0.0)
            (loss / 4).backward()
        together.update(both, batch_size=64, grad_scale=1 / 4)
        if step % 3 == 0:
            alone.update(second, batch_size=64, grad_scale=1 / 4)
    shared, own = together.per_layer["b.0"], alone.per_layer["0"]
    assert shared["trace_sigma"] == pytest.approx(own["trace_sigma"], rel=1e-12)
    assert shared["grad_norm_sq"] == pytest.approx(own["grad_norm_sq"], rel=1e-12)
    state = together.state_dict()
    restored = NoiseScaleTracker(beta=beta)
    restored.load_state_dict(json.loads(json.dumps(state)))
    assert restored.per_layer["b.0"]["trace_sigma"] == pytest.approx(shared["trace_sigma"], rel=1e-12)
