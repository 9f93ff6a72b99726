"""The gradient noise scale against closed forms: linear regression with Gaussian inputs.

Problem. Inputs x ~ N(0, C), C diagonal; labels y = w*^T x + xi, xi ~ N(0, s2) independent; model
f(x) = w^T x; per-example loss l = (f(x) - y)^2 / 2. At parameters w, with a = w - w*, one example's
gradient is g = (a^T x - xi) x. Gaussian moments (Isserlis: E[(a^T x)^2 x x^T] = (a^T C a) C +
2 C a a^T C) give, exactly:

    G       = E[g] = C a
    E[g g^T] = (a^T C a + s2) C + 2 C a a^T C
    Sigma   = E[g g^T] - G G^T = (a^T C a + s2) C + C a a^T C
    H       = C                       (Hessian of the expected loss; constant)
    tr(Sigma)  = (a^T C a + s2) tr(C) + |C a|^2,        |G|^2 = |C a|^2
    tr(H Sigma) = (a^T C a + s2) tr(C^2) + a^T C^3 a,    G^T H G = a^T C^3 a

so B_simple = tr(Sigma) / |G|^2 and B_noise = tr(H Sigma) / (G^T H G) are known. With a diagonal
preconditioner P (update w -= lr P g) the same quantities in P's metric are tr(P Sigma) / (G^T P G)
and tr(H P Sigma P) / (G^T P H P G), i.e. the plain formulas with C -> P C and a -> P^(-1/2) a (the
change of variables w = P^(1/2) phi turns the problem into one with inputs P^(1/2) x).

The model has two layers, ``first`` on coordinates 0-1 and ``second`` on 2-3 (no biases), so
per-layer traces and squared norms are the closed forms restricted to those coordinates:
tr(Sigma)_S = (a^T C a + s2) tr(C_S) + |(C a)_S|^2, |G_S|^2 = |(C a)_S|^2.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from batchlab.errors import BatchlabError
from batchlab.probes.noise_scale import (
    Interval,
    adam_preconditioner,
    moments_from_norms,
    noise_scale,
    ratio_interval,
)

C = np.array([2.0, 1.0, 0.6, 0.3])
A = np.array([0.5, -0.4, 0.3, 0.5])  # w - w*
W_STAR = np.array([0.2, 0.1, -0.3, 0.4])
S2 = 0.1
LAYERS = {"first": slice(0, 2), "second": slice(2, 4)}


def closed_form(c=C, a=A, s2=S2, coords=slice(None)):
    """Exact (tr Sigma, |G|^2, tr(H Sigma), G^T H G) of the problem above (``coords``: a layer)."""
    aca = float(a @ (c * a))
    ca = c * a
    trace_sigma = (aca + s2) * c[coords].sum() + (ca[coords] ** 2).sum()
    grad_norm_sq = (ca[coords] ** 2).sum()
    trace_h_sigma = (aca + s2) * (c**2).sum() + float(a @ (c**3 * a))
    grad_h_grad = float(a @ (c**3 * a))
    return trace_sigma, grad_norm_sq, trace_h_sigma, grad_h_grad


class TwoLayers(nn.Module):
    """f(x) = first(x[:, :2]) + second(x[:, 2:]): a linear model in two parameter groups."""

    def __init__(self, w, scale=None):
        super().__init__()
        self.first = nn.Linear(2, 1, bias=False, dtype=torch.float64)
        self.second = nn.Linear(2, 1, bias=False, dtype=torch.float64)
        with torch.no_grad():
            self.first.weight.copy_(torch.as_tensor(w[:2])[None])
            self.second.weight.copy_(torch.as_tensor(w[2:])[None])

    def forward(self, x):
        return self.first(x[:, :2]) + self.second(x[:, 2:])


def half_squared_error(outputs, targets):
    return 0.5 * (outputs - targets).square().mean()


def regression_batches(n_batches, batch_size, seed, input_scale=None):
    """Batches of (x, y) with x ~ N(0, C), y = w*^T x + N(0, S2); inputs times ``input_scale``."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        x = torch.randn(batch_size, 4, generator=g, dtype=torch.float64) * torch.as_tensor(np.sqrt(C))
        y = x @ torch.as_tensor(W_STAR) + torch.randn(batch_size, generator=g, dtype=torch.float64) * math.sqrt(S2)
        if input_scale is not None:
            x = x * torch.as_tensor(input_scale)
        out.append((x, y[:, None]))
    return out


def covers(interval: Interval, value: float) -> bool:
    return (interval.low is None or interval.low <= value) and (interval.high is None or value <= interval.high)


def test_b_simple_per_example_matches_closed_form():
    trace_sigma, grad_norm_sq, _, _ = closed_form()
    truth = trace_sigma / grad_norm_sq
    result = noise_scale(TwoLayers(W_STAR + A), half_squared_error, regression_batches(50, 1000, seed=1))
    assert result.method == "per_example" and result.examples == 50_000 and result.small_batch_size == 1
    assert result.b_simple == pytest.approx(truth, rel=0.03)
    assert result.trace_sigma == pytest.approx(trace_sigma, rel=0.03)
    assert result.grad_norm_sq == pytest.approx(grad_norm_sq, rel=0.03)
    assert covers(result.b_simple_interval, truth)
    assert result.b_simple_interval.level == 0.9 and result.b_simple_interval.method.startswith("fieller")
    assert result.b_noise is None and result.b_noise_interval is None


def test_b_simple_two_batch_matches_closed_form():
    trace_sigma, grad_norm_sq, _, _ = closed_form()
    truth = trace_sigma / grad_norm_sq
    result = noise_scale(TwoLayers(W_STAR + A), half_squared_error, regression_batches(100, 1000, seed=2),
                         method="two_batch", micro_batches=200)
    assert result.method == "two_batch" and result.small_batch_size == 5 and result.batch_size == 1000
    assert result.b_simple == pytest.approx(truth, rel=0.05)
    assert covers(result.b_simple_interval, truth)


@pytest.mark.parametrize("method", ["per_example", "two_batch"])
def test_b_noise_matches_closed_form(method):
    """20,000 examples: the estimates' standard errors are about 2% (per_example) and 3% (two_batch)."""
    _, _, trace_h_sigma, grad_h_grad = closed_form()
    truth = trace_h_sigma / grad_h_grad
    result = noise_scale(TwoLayers(W_STAR + A), half_squared_error, regression_batches(40, 500, seed=3),
                         method=method, hessian=True, micro_batches=100)
    assert result.b_noise == pytest.approx(truth, rel=0.05)
    assert covers(result.b_noise_interval, truth)
    assert result.trace_h_sigma == pytest.approx(trace_h_sigma, rel=0.05)
    assert result.grad_h_grad == pytest.approx(grad_h_grad, rel=0.05)
    assert result.hvps > 0 and result.b_noise_interval.method == "fieller (20 replicates)"
    # H is not a multiple of the identity here, so the two noise scales differ
    trace_sigma, grad_norm_sq, _, _ = closed_form()
    assert abs(truth / (trace_sigma / grad_norm_sq) - 1) > 0.1


def test_preconditioned_equals_plain_after_change_of_variables():
    p = np.array([0.5, 2.0, 1.5, 4.0])
    batches = regression_batches(20, 500, seed=4)
    diag = {"first.weight": torch.as_tensor(p[None, :2]), "second.weight": torch.as_tensor(p[None, 2:])}
    pre = noise_scale(TwoLayers(W_STAR + A), half_squared_error, batches, hessian=True, preconditioner=diag)
    # phi = P^(-1/2) w with inputs P^(1/2) x: the same predictions, gradients P^(1/2) g, Hessian P^(1/2) H P^(1/2)
    moved = [(x * torch.as_tensor(np.sqrt(p)), y) for x, y in batches]
    plain = noise_scale(TwoLayers((W_STAR + A) / np.sqrt(p)), half_squared_error, moved, hessian=True)
    assert pre.preconditioner == "diagonal" and plain.preconditioner is None
    for name in ("b_simple", "trace_sigma", "grad_norm_sq", "b_noise", "trace_h_sigma", "grad_h_grad"):
        assert getattr(pre, name) == pytest.approx(getattr(plain, name), rel=1e-9), name
    # and both are near the closed form in P's metric: C -> P C, a -> P^(-1/2) a
    trace_sigma, grad_norm_sq, trace_h_sigma, grad_h_grad = closed_form(c=p * C, a=A / np.sqrt(p))
    assert pre.b_simple == pytest.approx(trace_sigma / grad_norm_sq, rel=0.1)
    assert pre.b_noise == pytest.approx(trace_h_sigma / grad_h_grad, rel=0.1)
    assert pre.b_simple != pytest.approx(noise_scale(TwoLayers(W_STAR + A), half_squared_error, batches).b_simple, rel=0.05)


def test_adam_preconditioner_from_optimizer_and_state_dict():
    model = TwoLayers(W_STAR + A)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-3)
    for x, y in regression_batches(3, 64, seed=5):
        optimizer.zero_grad()
        half_squared_error(model(x), y).backward()
        optimizer.step()
    expected = {}
    for name, param in model.named_parameters():
        state = optimizer.state[param]
        v_hat = state["exp_avg_sq"] / (1 - 0.95 ** float(state["step"]))
        expected[name] = 1 / (v_hat.sqrt() + 1e-3)
    got = adam_preconditioner(optimizer, model)
    from_state = adam_preconditioner(optimizer.state_dict(), model)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name])
        torch.testing.assert_close(from_state[name], expected[name])
    batches = regression_batches(4, 200, seed=6)
    a = noise_scale(model, half_squared_error, batches, preconditioner=optimizer)
    b = noise_scale(model, half_squared_error, batches, preconditioner=expected)
    assert a.preconditioner == "adam" and b.preconditioner == "diagonal"
    assert a.b_simple == pytest.approx(b.b_simple, rel=1e-12)
    labelled = noise_scale(model, half_squared_error, batches, preconditioner=got, preconditioner_label="adam")
    assert labelled.preconditioner == "adam" and labelled.b_simple == pytest.approx(a.b_simple, rel=1e-12)


def test_adam_preconditioner_needs_second_moments():
    model = TwoLayers(W_STAR + A)
    with pytest.raises(BatchlabError, match="second-moment"):
        noise_scale(model, half_squared_error, regression_batches(1, 8, seed=0),
                    preconditioner=torch.optim.Adam(model.parameters()))
    with pytest.raises(BatchlabError, match="second-moment"):
        noise_scale(model, half_squared_error, regression_batches(1, 8, seed=0),
                    preconditioner=torch.optim.SGD(model.parameters(), lr=0.1))


def test_per_layer_closed_form_and_sums():
    result = noise_scale(TwoLayers(W_STAR + A), half_squared_error, regression_batches(50, 1000, seed=7))
    assert list(result.per_layer) == ["first", "second"]
    for layer, coords in LAYERS.items():
        trace_sigma, grad_norm_sq, _, _ = closed_form(coords=coords)
        entry = result.per_layer[layer]
        assert entry["trace_sigma"] == pytest.approx(trace_sigma, rel=0.03)
        assert entry["grad_norm_sq"] == pytest.approx(grad_norm_sq, rel=0.05)
        assert entry["b_simple"] == pytest.approx(entry["trace_sigma"] / entry["grad_norm_sq"])
    assert sum(e["trace_sigma"] for e in result.per_layer.values()) == pytest.approx(result.trace_sigma, rel=1e-12)
    assert sum(e["grad_norm_sq"] for e in result.per_layer.values()) == pytest.approx(result.grad_norm_sq, rel=1e-12)


@pytest.mark.parametrize("method", ["per_example", "two_batch"])
def test_per_layer_sums_on_an_mlp_with_biases(method):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(32, 5, generator=g), torch.randint(0, 3, (32,), generator=g)) for _ in range(4)]
    result = noise_scale(model, nn.functional.cross_entropy, batches, method=method, micro_batches=4)
    assert list(result.per_layer) == ["0", "2"]  # weight and bias of each Linear grouped
    assert sum(e["trace_sigma"] for e in result.per_layer.values()) == pytest.approx(result.trace_sigma, rel=1e-9)
    assert sum(e["grad_norm_sq"] for e in result.per_layer.values()) == pytest.approx(result.grad_norm_sq, rel=1e-9)
    d = result.to_dict()
    assert d["method"] == method and set(d["per_layer"]) == {"0", "2"} and d["b_simple_interval"]["level"] == 0.9


def test_per_example_matches_a_loop_over_examples():
    """The vmapped per-example gradients against plain autograd one example at a time."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()
    x, y = torch.randn(6, 3, dtype=torch.float64), torch.randint(0, 2, (6,))
    grads = []
    for i in range(6):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    grads = torch.stack(grads)
    small, big = float(grads.square().sum(1).mean()), float(grads.mean(0).square().sum())
    grad_norm_sq, trace_sigma = moments_from_norms(small, big, 1, 6)
    result = noise_scale(model, nn.functional.cross_entropy, [(x, y)])
    assert result.grad_norm_sq == pytest.approx(grad_norm_sq, rel=1e-10)
    assert result.trace_sigma == pytest.approx(trace_sigma, rel=1e-10)
    # and tr(Sigma) is the sum of the unbiased per-coordinate sample variances
    assert trace_sigma == pytest.approx(float(grads.var(0, unbiased=True).sum()), rel=1e-10)


def test_moments_from_norms_is_unbiased_arithmetic():
    # exact expectations in, exact moments out: E|G_b|^2 = |G|^2 + tr(Sigma)/b
    g2, tr = 3.0, 40.0
    assert moments_from_norms(g2 + tr / 4, g2 + tr / 64, 4, 64) == pytest.approx((g2, tr))
    per_layer = moments_from_norms(np.array([g2 + tr, 1 + 2.0]), np.array([g2 + tr / 8, 1 + 2.0 / 8]), 1, 8)
    np.testing.assert_allclose(per_layer[0], [g2, 1.0])
    np.testing.assert_allclose(per_layer[1], [tr, 2.0])
    with pytest.raises(BatchlabError, match="small < big"):
        moments_from_norms(1.0, 1.0, 8, 8)


def test_fieller_interval_coverage_on_gaussian_gradients():
    """90% intervals cover the true B_simple in about 90% of simulated probes (Gaussian gradients)."""
    rng = np.random.default_rng(0)
    d, batch, batches, reps = 10, 50, 20, 300
    sigma_diag = np.linspace(0.5, 2.0, d)
    grad = np.full(d, 0.12)
    truth = sigma_diag.sum() / (grad @ grad)  # 87: large against the probe batch, as late in training
    g = grad + rng.standard_normal((reps, batches, batch, d)) * np.sqrt(sigma_diag)
    small = (g**2).sum(-1).mean(-1)
    big = (g.mean(2) ** 2).sum(-1)
    g2, tr = moments_from_norms(small, big, 1, batch)
    hits = sum(covers(ratio_interval(tr[r], g2[r], 0.9), truth) for r in range(reps))
    assert 0.84 <= hits / reps <= 0.96


def test_fieller_interval_unbounded_when_gradient_is_noise():
    rng = np.random.default_rng(1)
    interval = ratio_interval(rng.normal(10.0, 1.0, 8), rng.normal(0.0, 1.0, 8), 0.9)
    assert interval.high is None and interval.low is not None and interval.low >= 0
    assert ratio_interval([1.0], [1.0]).low is None


def test_user_errors():
    model = TwoLayers(W_STAR + A)
    batches = regression_batches(1, 8, seed=0)
    with pytest.raises(BatchlabError, match="unknown noise-scale method"):
        noise_scale(model, half_squared_error, batches, method="bogus")
    with pytest.raises(BatchlabError, match="at least two batches"):
        noise_scale(model, half_squared_error, batches, hessian=True)
    with pytest.raises(BatchlabError, match="batch-norm"):
        noise_scale(nn.Sequential(nn.Linear(4, 2), nn.BatchNorm1d(2)), lambda o, t: o.square().mean(),
                    [(torch.randn(8, 4), torch.zeros(8))])
    with pytest.raises(BatchlabError, match="no entry for parameter"):
        noise_scale(model, half_squared_error, batches, preconditioner={"first.weight": torch.ones(1, 2)})


def test_two_batch_runs_with_training_batch_norm_and_leaves_the_model_alone():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(32, 4, generator=g), torch.randint(0, 2, (32,), generator=g)) for _ in range(4)]
    result = noise_scale(model, nn.functional.cross_entropy, batches, method="two_batch", micro_batches=4,
                         hessian=True)
    assert math.isfinite(result.trace_sigma) and math.isfinite(result.trace_h_sigma)
    assert result.small_batch_size == 8 and result.hvps == 4 * (4 + 1)
    assert model.training and all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("method", ["per_example", "two_batch"])
def test_b_noise_falls_back_to_reverse_mode_products_for_an_lstm(method, monkeypatch):
    """The CPU LSTM kernel has no forward-mode AD: the Hessian-vector products fall back to reverse
    over reverse, the same matrix (checked against the forward products on a model where both work)."""
    from batchlab.probes import noise_scale as module

    g = torch.Generator().manual_seed(0)
    mlp = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
    loss = nn.functional.cross_entropy
    fn = module._Functional(mlp, loss)
    x, y = torch.randn(16, 3, generator=g), torch.randint(0, 2, (16,), generator=g)
    vectors = tuple(torch.randn(4, *p.shape, generator=g) for p in fn.params)
    forward = fn.hvps(vectors, x, y, 2)
    assert fn.forward_mode
    fn.forward_mode = False
    for a, b in zip(fn.hvps(vectors, x, y, 2), forward):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)

    class TinyLSTM(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(3)
            self.lstm = nn.LSTM(3, 4, batch_first=True)
            self.head = nn.Linear(4, 2)

        def forward(self, inputs):
            return self.head(self.lstm(inputs)[0][:, -1])

    batches = [(torch.randn(8, 5, 3, generator=g), torch.randint(0, 2, (8,), generator=g)) for _ in range(4)]
    result = noise_scale(TinyLSTM(), loss, batches, method=method, hessian=True, micro_batches=4)
    assert result.b_noise is not None and math.isfinite(result.b_noise) and result.hvps > 0
    assert math.isfinite(result.trace_h_sigma) and math.isfinite(result.grad_h_grad)


def test_ratio_interval_is_the_fieller_solve_with_students_quantile():
    """ratio_interval and the tracker share one solve (fieller_weighted); its quantile (special.stdtrit)
    is scipy.stats.t.ppf's, so the interval is the textbook one to float rounding."""
    from scipy import stats

    from batchlab.probes.noise_scale import fieller_weighted

    rng = np.random.default_rng(5)
    x, y = rng.normal(30.0, 5.0, 12), rng.normal(2.0, 0.4, 12)
    got = ratio_interval(x, y, 0.9)
    cov = np.cov(x, y, ddof=1) / 12
    t2 = stats.t.ppf(0.95, 11) ** 2
    a = y.mean() ** 2 - t2 * cov[1, 1]
    b = -2 * (x.mean() * y.mean() - t2 * cov[0, 1])
    c = x.mean() ** 2 - t2 * cov[0, 0]
    roots = sorted(np.roots([a, b, c]).real)
    assert got.low == pytest.approx(roots[0], rel=1e-9) and got.high == pytest.approx(roots[1], rel=1e-9)
    same = fieller_weighted(x.mean(), y.mean(), cov[0, 0], cov[1, 1], cov[0, 1], 11, 0.9, got.method)
    assert same == got
    assert fieller_weighted(1.0, 1.0, 0.1, 0.1, 0.0, 0, 0.9, "m").low is None  # no degrees of freedom
