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
from batchlab.probes.noise_scale import moments_from_norms, ratio_interval
from batchlab.probes.noise_scale import fieller_weighted
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
    assert tracker.update(model, batch_size=24) is None  # update records; readings fold
    b_simple = tracker.b_simple
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
        for t in trackers:
            t.update(model, batch_size=32)
        out.append([t.b_simple for t in trackers])
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
    assert first.reading() == second.reading() and first.reading()["steps"] == 40  # the interval's sums too
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
    monkeypatch.setattr(tracker_module, "_world_size", lambda group=None: n)
    pooled = {}

    def fake_all_reduce(tensor, *args, **kwargs):  # SUM over workers of the local squared norms
        tensor[:-1] = pooled["sum"]  # the last entry: the count of workers with nothing to measure
        tensor[-1] = 0.0

    monkeypatch.setattr(dist, "all_reduce", fake_all_reduce)
    trackers, _ = simulate_data_parallel(n, 64, steps=3, seed=5,
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


def totals_of(model, tracker, generator, steps, batch=32, micro=2):
    """Run ``steps`` steps at fixed parameters; the per-step totals (tr Sigma_t, |G|^2_t)."""
    out = []
    for _ in range(steps):
        x, y = draw(batch, generator)
        accumulate(model, x, y, micro)
        tracker.update(model, batch_size=batch, grad_scale=1 / micro)
        out.append((tracker.last["trace_sigma"], tracker.last["grad_norm_sq"]))
    return np.array(out)


def test_interval_of_the_plain_mean_is_fieller_over_the_steps():
    model = model_at()
    tracker = NoiseScaleTracker(model, beta=None)
    totals = totals_of(model, tracker, torch.Generator().manual_seed(11), 25)
    want = ratio_interval(totals[:, 0], totals[:, 1], 0.9)
    got = tracker.b_simple_interval(0.9)
    # the same set; the tracker's means and (co)variances come from running (Welford) sums, not arrays
    assert got.low == pytest.approx(want.low, rel=1e-9) and got.high == pytest.approx(want.high, rel=1e-9)
    reading = tracker.reading(0.9)
    assert set(reading) == {"b_simple", "b_simple_low", "b_simple_high", "trace_sigma", "grad_norm_sq", "steps",
                            "resolved", "level"}
    assert reading["resolved"] and reading["steps"] == 25 and reading["level"] == 0.9
    assert reading["b_simple_low"] <= reading["b_simple"] <= reading["b_simple_high"]
    assert reading["b_simple"] == tracker.b_simple
    assert reading["b_simple"] == pytest.approx(totals[:, 0].mean() / totals[:, 1].mean(), rel=1e-12)
    d = tracker.to_dict()
    assert d["b_simple_low"] == reading["b_simple_low"] and d["resolved"] and d["level"] == 0.9


def test_interval_of_the_ema_weights_the_steps_like_the_ema():
    """beta = 0.8: weights w_t = beta^(T - t); the weighted means are the bias-corrected EMA (the point
    estimate), their variance s^2 sum w^2 / (sum w)^2 with the reliability-weighted s^2, and Student's
    t with n_eff - 1 dof, n_eff = (sum w)^2 / sum w^2 (computed here from explicit weights)."""
    beta = 0.8
    model = model_at()
    tracker = NoiseScaleTracker(model, beta=beta)
    totals = totals_of(model, tracker, torch.Generator().manual_seed(12), 30)
    w = beta ** np.arange(len(totals))[::-1]
    sw, sw2 = w.sum(), (w * w).sum()
    mean = (w[:, None] * totals).sum(0) / sw
    assert mean == pytest.approx([tracker.trace_sigma, tracker.grad_norm_sq], rel=1e-12)
    dev = totals - mean
    cov = (w[:, None, None] * dev[:, :, None] * dev[:, None, :]).sum(0) / (sw - sw2 / sw) * sw2 / sw**2
    want = fieller_weighted(mean[0], mean[1], cov[0, 0], cov[1, 1], cov[0, 1], sw * sw / sw2 - 1, 0.9, "")
    got = tracker.b_simple_interval(0.9)
    assert tracker.effective_steps == pytest.approx(sw * sw / sw2, rel=1e-12)
    assert got.low == pytest.approx(want.low, rel=1e-9) and got.high == pytest.approx(want.high, rel=1e-9)
    assert got.low <= tracker.b_simple <= got.high
    # the EMA's window is shorter than the plain mean's: a wider interval than over all 30 steps
    plain = ratio_interval(totals[:, 0], totals[:, 1], 0.9)
    assert got.high - got.low > plain.high - plain.low


@pytest.mark.parametrize("beta", [None, 0.9])
def test_interval_covers_the_truth_at_about_its_level(beta):
    """At fixed parameters the steps are independent replicates: over 100 independent runs of 30 steps
    the 90% interval holds the exact B_simple in about 90% of them (binomial sd 3%; the bounds are
    over 3 sd away). With beta=0.9 (n_eff about 16 of 30) the weighting changes the width, not the
    coverage."""
    covered = 0
    for seed in range(100):
        model = model_at()
        tracker = NoiseScaleTracker(model, beta=beta)
        totals_of(model, tracker, torch.Generator().manual_seed(100 + seed), 30, batch=16, micro=2)
        interval = tracker.b_simple_interval(0.9)
        covered += interval.low <= B_SIMPLE and (interval.high is None or B_SIMPLE <= interval.high)
    assert 0.80 <= covered / 100 <= 0.99


def test_unresolved_reading_is_a_lower_bound():
    """At the optimum (|G|^2 = 0) the gradient cannot be told from noise: no upper end, b_simple None,
    b_simple_low a finite lower bound; before two steps there is no interval at all."""
    model = model_at(W_STAR)
    tracker = NoiseScaleTracker(model, beta=None)
    g = torch.Generator().manual_seed(13)
    totals_of(model, tracker, g, 1)
    first = tracker.reading()
    assert first["b_simple_low"] is None and first["b_simple_high"] is None and not first["resolved"]
    totals_of(model, tracker, g, 19)
    reading = tracker.reading()
    assert not reading["resolved"] and reading["b_simple"] is None and reading["b_simple_high"] is None
    assert reading["b_simple_low"] is not None and math.isfinite(reading["b_simple_low"])
    assert reading["trace_sigma"] > 0 and json.loads(json.dumps(reading)) == reading
    with pytest.raises(BatchlabError, match="level"):
        tracker.reading(1.5)


def test_grad_at_backward_reads_before_clipping_in_one_process():
    model = model_at()
    at_backward = NoiseScaleTracker(model, beta=None, grad_at="backward")
    at_update = NoiseScaleTracker(model, beta=None)  # reads .grad after the clipping: another value
    twin = model_at()  # the same steps, no clipping
    reference = NoiseScaleTracker(twin, beta=None)
    g = torch.Generator().manual_seed(14)
    for _ in range(3):
        x, y = draw(32, g)
        accumulate(model, x, y, 2)
        accumulate(twin, x, y, 2)
        reference.update(batch_size=32)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        at_backward.update(model, batch_size=32)
        at_update.update(model, batch_size=32)
    assert at_backward.trace_sigma == reference.trace_sigma  # the same numbers on the same path
    assert at_backward.grad_norm_sq == reference.grad_norm_sq
    assert at_update.grad_norm_sq != pytest.approx(reference.grad_norm_sq, rel=0.5)
    state = at_backward.state_dict()
    restored = NoiseScaleTracker(model_at())
    restored.load_state_dict(json.loads(json.dumps(state)))
    assert restored.grad_at == "backward" and restored.reading() == at_backward.reading()
    with pytest.raises(BatchlabError, match="version 1"):
        restored.load_state_dict({**state, "version": 1})


def test_half_precision_gradients_are_normed_in_float32():
    """bfloat16 gradients: the norms are accumulated in float32 (a bfloat16 norm keeps 3 digits), so
    the step's estimate is the float64 arithmetic on the same bfloat16 gradients to float32 rounding."""
    model = nn.Sequential(nn.Linear(4, 1, bias=False, dtype=torch.bfloat16))
    tracker = NoiseScaleTracker(model, beta=None)
    x, y = draw(64, torch.Generator().manual_seed(15))
    parts = []
    for xm, ym in zip(x.chunk(2), y.chunk(2)):
        model.zero_grad(set_to_none=True)
        loss_fn(model(xm.bfloat16()), ym.bfloat16()).backward()
        parts.append(model[0].weight.grad.clone())
    tracker._pending, tracker._seen = [], []  # measure only the accumulated step below
    model.zero_grad(set_to_none=True)
    for xm, ym in zip(x.chunk(2), y.chunk(2)):
        loss_fn(model(xm.bfloat16()), ym.bfloat16()).backward()
    tracker.update(model, batch_size=64)
    small = np.mean([float(p.double().square().sum()) for p in parts])
    big = float((model[0].weight.grad.double() / 2).square().sum())
    grad_norm_sq, trace_sigma = moments_from_norms(small, big, 32, 64)
    assert tracker.trace_sigma == pytest.approx(trace_sigma, rel=1e-4)  # float32 norms of the same numbers
    assert tracker.grad_norm_sq == pytest.approx(grad_norm_sq, rel=1e-4)


@pytest.mark.parametrize("grad_at", ["update", "backward"])
def test_discard_leaves_the_step_out(grad_at):
    """discard() drops what was recorded since the last update: the tracker then continues exactly as
    one that never saw the discarded step (restored from the state before it)."""
    model = model_at()
    tracker = NoiseScaleTracker(model, beta=0.9, grad_at=grad_at)
    g = torch.Generator().manual_seed(16)
    run_steps(model, [tracker], g, 3)
    before = tracker.state_dict()
    x, y = draw(32, g)
    accumulate(model, x, y, 2)  # the step to leave out
    tracker.discard()
    assert tracker.calls == 3 and tracker.steps == 3 and tracker.state_dict() == before
    reference = NoiseScaleTracker(model, beta=0.9, grad_at=grad_at)  # hooked after the discarded step
    reference.load_state_dict(before)
    history = run_steps(model, [tracker, reference], g, 3)
    assert all(a == b for a, b in history)
    assert tracker.state_dict() == reference.state_dict()  # the same path twice: bitwise
    # with every=2 a discarded measured step keeps the hooks on: the next step is the measured one
    sparse = NoiseScaleTracker(model, beta=None, every=2)
    accumulate(model, x, y, 2)
    sparse.discard()
    assert bool(sparse._handles) and sparse.calls == 0
    accumulate(model, x, y, 2)
    sparse.update(model, batch_size=32)
    assert sparse.steps == 1 and sparse.calls == 1


def test_a_non_finite_step_is_left_out_and_counted():
    """An overflowed step (an inf in the gradients, as a GradScaler's first steps have) is left out and
    counted in nonfinite_steps, instead of making every later reading NaN: the tracker goes on exactly
    as one that never saw it."""
    model = model_at()
    tracker = NoiseScaleTracker(model, beta=0.9)
    g = torch.Generator().manual_seed(18)
    run_steps(model, [tracker], g, 3)
    before = tracker.state_dict()
    x, y = draw(32, g)
    model.zero_grad(set_to_none=True)
    for xm, ym in zip(x.chunk(2), y.chunk(2)):
        (loss_fn(model(xm), ym) * math.inf).backward()
    tracker.update(model, batch_size=32)
    assert tracker.nonfinite_steps == 1 and tracker.steps == 3 and math.isfinite(tracker.b_simple)
    state = tracker.state_dict()
    assert state.pop("nonfinite_steps") == 1 and state.pop("calls") == 4
    before.pop("nonfinite_steps"), before.pop("calls")
    assert state == before  # nothing folded in
    restored = NoiseScaleTracker(model_at(), beta=0.9)
    restored.load_state_dict(tracker.state_dict())
    assert restored.nonfinite_steps == 1


@pytest.mark.parametrize("norm_in_hook", [True, False])
def test_first_gradient_read_from_grad_equals_the_incoming_one(norm_in_hook):
    """Three ways to the same norms: on the CPU (the default) each incoming gradient is normed in its
    hook; elsewhere (forced here) a tensor's first gradient of a step is read from .grad at the end of
    its pass (set_to_none=True, one process), else kept from the hook (.grad already holds zeros, or a
    post-accumulate-grad hook could consume .grad)."""
    g = torch.Generator().manual_seed(17)
    x, y = draw(48, g)
    results = []
    for variant in ("none", "zeros", "post_hook"):
        model = nn.Sequential(nn.Linear(4, 3, dtype=torch.float64), nn.Tanh(), nn.Linear(3, 1, dtype=torch.float64))
        torch.manual_seed(0)
        for p in model.parameters():
            nn.init.normal_(p)
        if variant == "post_hook":
            handles = [p.register_post_accumulate_grad_hook(lambda p: None) for p in model.parameters()]
        tracker = NoiseScaleTracker(model, beta=None)
        assert tracker._norm_in_hook and tracker._read_first == (variant != "post_hook")
        tracker._norm_in_hook = norm_in_hook
        for _ in range(2):
            model.zero_grad(set_to_none=variant != "zeros")
            for xm, ym in zip(x.chunk(3), y.chunk(3)):
                (loss_fn(model(xm), ym) / 3).backward()
            tracker.update(model, batch_size=48, grad_scale=1 / 3)
        results.append((tracker.trace_sigma, tracker.grad_norm_sq))
        if variant == "post_hook":
            for handle in handles:
                handle.remove()
    # the same tensors' norms: .grad after the pass is the incoming gradient (or 0 + it), bitwise
    assert results[0] == results[1] == results[2]
    reference = NoiseScaleTracker(model_at(), beta=None)
    assert reference._norm_in_hook  # CPU parameters


@pytest.mark.parametrize("norm_in_hook", [True, False])
def test_a_pass_that_does_not_accumulate(norm_in_hook):
    """torch.autograd.grad delivers gradients to the hooks but not to .grad. Normed in the hook (CPU),
    it counts as a micro-batch like every pass between updates (the contract: do not mix it in); read
    from .grad (accelerators), there is nothing to read when it comes first in a step, so it is not
    counted."""
    model = model_at()
    tracker = NoiseScaleTracker(model, beta=None)
    tracker._norm_in_hook = norm_in_hook
    x, y = draw(32, torch.Generator().manual_seed(18))
    torch.autograd.grad(loss_fn(model(x[:16]), y[:16]), list(model.parameters()))
    assert len(tracker._pending) == (1 if norm_in_hook else 0)
    accumulate(model, x, y, 2)
    tracker.update(model, batch_size=32)
    assert tracker.steps == 1 and tracker.last["small_batch_size"] == (32 / 3 if norm_in_hook else 16)


# -- folding in chunks, passes that miss a tensor ------------------------------------------------------


def test_readings_and_checkpoints_do_not_change_a_bit():
    """Steps are folded in chunks of FOLD_EVERY; reading (or saving) in between folds a copy. A tracker
    read and saved at every step, one never read, and one restored mid-chunk from a JSON state all
    end with the same state (the same path: bitwise), across two chunk boundaries."""
    from batchlab.probes.tracker import FOLD_EVERY

    model = model_at()
    quiet, busy = NoiseScaleTracker(model, beta=0.95), NoiseScaleTracker(model, beta=0.95)
    g = torch.Generator().manual_seed(24)
    restored = None
    for step in range(2 * FOLD_EVERY + 10):
        x, y = draw(32, g)
        accumulate(model, x, y, 2)
        for t in (quiet, busy) + (() if restored is None else (restored,)):
            t.update(model, batch_size=32)
        busy.reading(), busy.per_layer, busy.state_dict()
        if step == FOLD_EVERY + 5:  # mid-chunk: the state carries the recorded steps
            state = json.loads(json.dumps(quiet.state_dict()))
            assert len(state["recorded"]["norms"]) == 6 and state["steps"] == FOLD_EVERY + 6
            restored = NoiseScaleTracker(model, beta=0.95)
            restored.load_state_dict(state)
    assert quiet.state_dict() == busy.state_dict() == restored.state_dict()
    assert quiet.reading() == busy.reading() == restored.reading() and quiet.steps == 2 * FOLD_EVERY + 10


def test_a_pass_that_does_not_reach_a_tensor_delivered_it_zero():
    """A branch skipped in one micro-batch of four (a mixture-of-experts route): the tensor has a .grad
    at the update, so it is measured, with a zero gradient for the pass that did not reach it."""
    first, second = model_at(), model_at(W_STAR - A)
    both = nn.ModuleDict({"a": first, "b": second})
    tracker = NoiseScaleTracker(both, beta=None)
    x, y = draw(64, torch.Generator().manual_seed(25))
    both.zero_grad(set_to_none=True)
    parts = []
    for m, (xm, ym) in enumerate(zip(x.chunk(4), y.chunk(4))):
        before = None if second[0].weight.grad is None else second[0].weight.grad.clone()
        loss = loss_fn(first(xm), ym) + (loss_fn(second(xm), ym) if m != 2 else 0.0)
        (loss / 4).backward()
        after = second[0].weight.grad
        parts.append(after.clone() if before is None else after - before)
    tracker.update(both, batch_size=64, grad_scale=1 / 4)
    assert float(parts[2].abs().max()) == 0.0
    small = float(np.mean([float(p.square().sum()) for p in parts])) * 16  # x 1 / grad_scale^2
    big = float(second[0].weight.grad.square().sum())
    grad_norm_sq, trace_sigma = moments_from_norms(small, big, 16, 64)
    layer = tracker.per_layer["b.0"]
    assert layer["grad_norm_sq"] == pytest.approx(grad_norm_sq, rel=1e-12)
    assert layer["trace_sigma"] == pytest.approx(trace_sigma, rel=1e-12)


def test_state_version_2_loads_with_nothing_recorded():
    model = model_at()
    tracker = NoiseScaleTracker(model, beta=0.9)
    g = torch.Generator().manual_seed(26)
    run_steps(model, [tracker], g, 70)  # 64 folded, 6 recorded
    tracker._commit()  # a version 2 tracker had folded every step
    state = tracker.state_dict()
    assert state.pop("recorded") is None
    restored = NoiseScaleTracker(model, beta=0.9)
    restored.load_state_dict({**state, "version": 2})
    assert restored.reading() == tracker.reading() and restored.steps == 70


def test_the_accelerator_path_records_tensors_and_folds_them_like_the_host_path():
    """On an accelerator a step's norms are kept as one stacked tensor (no device-to-host copy) and
    converted when folded; forced here on the CPU (``_host = False``). A non-finite step is found when
    its chunk is folded, counted once, also through a strict-JSON checkpoint taken before the fold,
    and the restored tracker goes on with the original's bits (the same path). Against the host path:
    equal to rel 1e-12, not bitwise, since the host drops the non-finite step when it is recorded, so
    its chunks end one step later (a chunk's fold equals the step-by-step fold to ~m ulps)."""
    model = model_at()
    host, device = NoiseScaleTracker(model, beta=0.9), NoiseScaleTracker(model, beta=0.9)
    device._host = False
    g = torch.Generator().manual_seed(27)
    run_steps(model, [host, device], g, 5)
    assert isinstance(device._recorded.rows[0], torch.Tensor)
    x, y = draw(32, g)
    model.zero_grad(set_to_none=True)
    for xm, ym in zip(x.chunk(2), y.chunk(2)):
        (loss_fn(model(xm), ym) * math.inf).backward()
    host.update(model, batch_size=32)
    device.update(model, batch_size=32)
    assert len(device._recorded.rows) == 6 and len(host._recorded.rows) == 5  # found at once on the host
    state = json.loads(json.dumps(device.state_dict(), allow_nan=False))
    assert state["steps"] == 5 and state["nonfinite_steps"] == 1
    restored = NoiseScaleTracker(model, beta=0.9)
    restored.load_state_dict(state)
    assert restored.steps == 5 and restored.nonfinite_steps == 1
    run_steps(model, [host, device, restored], g, 70)  # across a fold
    assert device.nonfinite_steps == host.nonfinite_steps == restored.nonfinite_steps == 1
    assert device.steps == host.steps == 75
    assert device.state_dict() == restored.state_dict() and device.reading() == restored.reading()
    for key, value in host.reading().items():
        assert device.reading()[key] == (pytest.approx(value, rel=1e-12) if isinstance(value, float) else value), key


def test_a_state_with_recorded_steps_reads_before_the_model_is_attached():
    model = model_at()
    tracker = NoiseScaleTracker(model, beta=0.9)
    run_steps(model, [tracker], torch.Generator().manual_seed(28), 5)  # recorded, not folded
    restored = NoiseScaleTracker(beta=0.9)  # no model yet
    restored.load_state_dict(json.loads(json.dumps(tracker.state_dict())))
    assert restored.reading() == tracker.reading() and restored.per_layer == tracker.per_layer
