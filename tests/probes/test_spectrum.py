"""Curvature probes on problems whose spectrum is known in closed form (float64, seeded)."""

import numpy as np
import pytest
import torch

from batchlab.errors import BatchlabError
from batchlab.probes.spectrum import CurvatureOperator, lanczos_tridiagonal, spectral_density, top_eigenvalues

TOP = [10.0, 7.0, 5.0]


def half_squared_error(outputs, targets):
    return 0.5 * ((outputs - targets) ** 2).sum(-1).mean()


def least_squares(dim=24, examples=240, batches=2):
    """A linear model with squared loss whose input second moment X^T X / N has the eigenvalues
    TOP + linspace(1, 0.1): the Hessian (and Gauss-Newton matrix) of the mean loss, exactly."""
    eigenvalues = np.concatenate([TOP, np.linspace(1.0, 0.1, dim - len(TOP))])
    rotation, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((dim, dim)))
    frame, _ = np.linalg.qr(np.random.default_rng(1).standard_normal((examples, dim)))
    x = torch.tensor(np.sqrt(examples) * frame @ np.diag(np.sqrt(eigenvalues)) @ rotation.T)
    y = torch.randn(examples, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(3)
    model = torch.nn.Linear(dim, 1, bias=False).double()
    size = examples // batches
    return model, [(x[i : i + size], y[i : i + size]) for i in range(0, examples, size)], np.sort(eigenvalues)[::-1]


class Quadratic(torch.nn.Module):
    """``outputs = theta``; with :func:`quadratic_loss` the loss is ``0.5 theta^T A theta``."""

    def __init__(self, dim):
        super().__init__()
        self.theta = torch.nn.Parameter(torch.randn(dim, dtype=torch.float64, generator=torch.Generator().manual_seed(4)))

    def forward(self, x):
        return self.theta.expand(x.shape[0], -1)


def quadratic(eigenvalues):
    """A model whose loss is ``0.5 theta^T A theta`` with A = Q diag(eigenvalues) Q^T (any signs)."""
    dim = len(eigenvalues)
    q, _ = np.linalg.qr(np.random.default_rng(5).standard_normal((dim, dim)))
    a = torch.tensor(q @ np.diag(eigenvalues) @ q.T)

    def loss(outputs, targets):
        return 0.5 * torch.einsum("bi,ij,bj->b", outputs, a, outputs).mean()

    return Quadratic(dim), loss, [(torch.zeros(3, 1, dtype=torch.float64), torch.zeros(3))]


def test_top_eigenvalues_of_least_squares_are_the_input_covariance_eigenvalues():
    model, batches, _ = least_squares()
    spectrum = top_eigenvalues(model, half_squared_error, batches, k=3, tol=1e-10, seed=0)
    np.testing.assert_allclose(spectrum.eigenvalues, TOP, rtol=1e-8)
    assert spectrum.curvature == "hessian" and spectrum.converged and spectrum.examples == 240
    assert spectrum.parameters == 24 and spectrum.k == 3
    assert 3 < spectrum.matvecs <= 200  # counted products; ARPACK needs a few dozen here
    assert spectrum.to_dict()["matvecs"] == spectrum.matvecs
    again = top_eigenvalues(model, half_squared_error, batches, k=3, tol=1e-10, seed=0)
    assert again.eigenvalues == spectrum.eigenvalues and again.matvecs == spectrum.matvecs  # seeded: identical


def test_gauss_newton_equals_hessian_for_linear_least_squares():
    model, batches, _ = least_squares()
    hessian = CurvatureOperator(model, half_squared_error, batches, "hessian")
    ggn = CurvatureOperator(model, half_squared_error, batches, "ggn")
    rng = np.random.default_rng(6)
    for _ in range(3):
        v = rng.standard_normal(hessian.size)
        np.testing.assert_allclose(ggn(v), hessian(v), rtol=1e-10, atol=1e-12)
    assert hessian.matvecs == ggn.matvecs == 3
    top = top_eigenvalues(model, half_squared_error, batches, k=3, curvature="ggn", tol=1e-10)
    np.testing.assert_allclose(top.eigenvalues, TOP, rtol=1e-8)


def test_indefinite_quadratic_gives_the_algebraically_largest_and_ggn_is_a():
    eigenvalues = [4.0, 2.5, -6.0, -1.0, 0.5, 0.25, 0.0, -0.5]
    model, loss, batches = quadratic(eigenvalues)
    spectrum = top_eigenvalues(model, loss, batches, k=2, tol=0)
    np.testing.assert_allclose(spectrum.eigenvalues, [4.0, 2.5], rtol=1e-10)  # -6 is larger in magnitude only
    ggn = top_eigenvalues(model, loss, batches, k=2, curvature="ggn", tol=0)  # J = I: G = A
    np.testing.assert_allclose(ggn.eigenvalues, [4.0, 2.5], rtol=1e-10)


def test_density_integrates_to_one_and_puts_its_mass_at_the_eigenvalues():
    values = np.repeat([1.0, 3.0, 8.0], [20, 30, 50])  # three distinct eigenvalues, multiplicities 20/30/50
    model, loss, batches = quadratic(values)
    density = spectral_density(model, loss, batches, lanczos_steps=10, probes=20, seed=0)
    # Lanczos exhausts the 3-dimensional Krylov space after 3 products: the nodes are the eigenvalues.
    assert density.matvecs == 20 * 3
    for nodes in density.nodes:
        np.testing.assert_allclose(nodes, [1.0, 3.0, 8.0], rtol=1e-9)
    assert all(abs(sum(w) - 1) < 1e-12 for w in density.weights)
    np.testing.assert_allclose(np.trapezoid(density.density, density.grid), 1.0, atol=1e-3)
    # the weight at each eigenvalue estimates its multiplicity / P (Rademacher probes: error ~ 0.02 here)
    for value, share in [(1.0, 0.2), (3.0, 0.3), (8.0, 0.5)]:
        assert density.mass(value - 0.1, value + 0.1) == pytest.approx(share, abs=0.05)
    peak = density.grid[np.argmax(density.density)]
    assert abs(peak - 8.0) < 2 * density.sigma
    out = density.to_dict(grid=True)
    assert out["matvecs"] == 60 and len(out["grid"]) == len(out["density"]) == 512


def test_density_of_least_squares_has_mass_at_the_top_eigenvalue():
    model, batches, eigenvalues = least_squares(dim=24)
    density = spectral_density(model, half_squared_error, batches, lanczos_steps=24, probes=2, seed=1)
    assert density.matvecs <= 2 * 24
    for nodes in density.nodes:  # a full Krylov space: every eigenvalue is a node
        np.testing.assert_allclose(max(nodes), 10.0, rtol=1e-8)
    np.testing.assert_allclose(np.trapezoid(density.density, density.grid), 1.0, atol=1e-3)
    assert density.mass(9.9, 10.1) == pytest.approx(1 / 24, abs=0.08)


def test_lanczos_tridiagonal_reproduces_a_small_matrix():
    a = np.diag([3.0, 2.0, 1.0, 0.5])
    alpha, beta = lanczos_tridiagonal(lambda v: a @ v, np.ones(4), 4)
    t = np.diag(alpha) + np.diag(beta, 1) + np.diag(beta, -1)
    np.testing.assert_allclose(np.linalg.eigvalsh(t), [0.5, 1.0, 2.0, 3.0], rtol=1e-12)


@pytest.mark.parametrize("kwargs, message", [
    ({"k": 0}, "k must be >= 1"),
    ({"k": 24}, "k must be in 1..23"),
    ({"curvature": "fisher"}, "unknown curvature 'fisher'"),
    ({"tol": -1.0}, "tol must be a number >= 0"),
])
def test_bad_arguments_are_one_line_errors(kwargs, message):
    model, batches, _ = least_squares()
    with pytest.raises(BatchlabError, match=message):
        top_eigenvalues(model, half_squared_error, batches, **kwargs)


def test_no_batches_is_an_error():
    model, _, _ = least_squares()
    with pytest.raises(BatchlabError, match="at least one batch"):
        top_eigenvalues(model, half_squared_error, [], k=1)
    with pytest.raises(BatchlabError, match="lanczos_steps must be >= 1"):
        spectral_density(model, half_squared_error, [(torch.zeros(1, 24, dtype=torch.float64), torch.zeros(1, 1))],
                         lanczos_steps=0)


class TinyLSTM(torch.nn.Module):
    """An LSTM classifier over 5-step sequences: on the CPU its kernel has no forward-mode AD."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.lstm = torch.nn.LSTM(3, 4, batch_first=True)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.lstm(x)[0][:, -1])


@pytest.mark.parametrize("curvature", ["hessian", "ggn"])
def test_reverse_mode_products_equal_the_forward_ones_and_serve_an_lstm(curvature):
    """Where forward-mode AD is missing (the CPU LSTM), products fall back to reverse mode: the same
    matrix (checked on a model where both work), and an LSTM's spectrum is measured."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(16, 3, generator=g), torch.randint(0, 2, (16,), generator=g)) for _ in range(2)]
    loss = torch.nn.functional.cross_entropy
    forward = CurvatureOperator(model, loss, batches, curvature)
    reverse = CurvatureOperator(model, loss, batches, curvature)
    reverse.forward_mode = False
    v = np.random.default_rng(1).standard_normal(forward.size)
    np.testing.assert_allclose(reverse(v), forward(v), rtol=1e-5, atol=1e-7)

    lstm = TinyLSTM()
    sequences = [(torch.randn(8, 5, 3, generator=g), torch.randint(0, 2, (8,), generator=g)) for _ in range(2)]
    spectrum = top_eigenvalues(lstm, loss, sequences, k=2, curvature=curvature, seed=0)
    assert len(spectrum.eigenvalues) == 2 and all(np.isfinite(spectrum.eigenvalues))
    operator = CurvatureOperator(lstm, loss, sequences, curvature)
    w = np.random.default_rng(2).standard_normal(operator.size)
    u = np.random.default_rng(3).standard_normal(operator.size)
    assert float(u @ operator(w)) == pytest.approx(float(w @ operator(u)), rel=1e-4, abs=1e-7)  # symmetric
