import numpy as np
import pytest

from batchlab.errors import BatchlabError
from batchlab.nqm.dynamics import (
    Algorithm,
    dense_losses,
    losses_at_steps,
    map_power,
    moment_recurrence,
)
from batchlab.nqm.problem import from_eigenvalues, power_law, zhang2019_binned


def _steady_state(rec, batch_size):
    """Fixed point u* = (I - T)^-1 g / B of a single configuration, per bin, and its loss."""
    T = rec.transition[:, :, 0, 0, :]  # (m, m, J)
    g = rec.noise[:, 0, 0, :] / batch_size
    m, _, J = T.shape
    u = np.stack([np.linalg.solve(np.eye(m) - T[:, :, j], g[:, j]) for j in range(J)], axis=1)
    return u


def test_sgd_closed_form_with_preconditioning():
    problem = power_law(1.0, 1.0, 30)
    h, c = problem.curvature, problem.noise
    lr, B, p = 0.3, 8.0, 0.5
    steps = np.array([0, 1, 7, 100, 5000])
    exact = losses_at_steps(moment_recurrence(problem, Algorithm("sgd", p), lr), B, steps)[0]
    z, a = lr * h ** (1 - p), lr * h ** (-p)
    beta = (1 - z) ** 2
    steady = a**2 * c / B / (1 - beta)
    s = steady + beta ** steps[:, None] * (1 - steady)
    assert np.allclose(exact, (0.5 * h * s).sum(1), rtol=1e-12)
    # docs/methods.md, "Algorithms, exactly": steady-state loss per direction lr h^-p c / (2 B (2 - lr h^(1-p)))
    assert np.allclose(0.5 * h * steady, lr * h ** (-p) * c / (2 * B * (2 - z)), rtol=1e-12)


def test_momentum_transition_matches_published_matrix():
    problem = from_eigenvalues([0.3])
    lr, mu = 0.7, 0.6
    rec = moment_recurrence(problem, Algorithm("momentum"), lr, momentum=mu)
    z = lr * 0.3
    ours = rec.transition[:, :, 0, 0, 0]  # order (xx, xv, vv)
    science = np.array(  # order (xx, vv, xv), eq. (21)
        [[(1 - z) ** 2, mu**2, 2 * mu * (1 - z)], [z**2, mu**2, -2 * mu * z], [-z * (1 - z), mu**2, mu * (1 - 2 * z)]]
    )
    perm = [0, 2, 1]
    assert np.allclose(ours, science[np.ix_(perm, perm)])


@pytest.mark.parametrize("lr, mu", [(0.1, 0.9), (0.5, 0.3), (1.9, 0.5), (0.05, 0.0)])
def test_theorem1_transient_and_steady_state(lr, mu):
    h, c, B = 1.0, 1.0, 16.0
    problem = from_eigenvalues([h])
    rec = moment_recurrence(problem, Algorithm("momentum"), lr, momentum=mu)
    # Noise-free transient equals the squared deterministic factor (complex roots allowed).
    roots = np.roots([1.0, -(1 - lr * h + mu), mu]).astype(complex)
    r1, r2 = roots
    steps = np.arange(0, 40)
    factor = ((r1 ** (steps + 1) - r2 ** (steps + 1)) - mu * (r1**steps - r2**steps)) / (r1 - r2)
    noiseless = losses_at_steps(rec, np.inf, steps)[0]
    assert np.allclose(noiseless, 0.5 * h * np.abs(factor.real) ** 2, rtol=1e-9, atol=1e-15)
    # Steady state = the fixed point of T.
    u = _steady_state(rec, B)
    theorem = (1 + mu) * lr * c / (2 * B * (2 * mu + 2 - lr * h) * (1 - mu))
    assert 0.5 * h * u[0, 0] == pytest.approx(theorem, rel=1e-10)
    assert losses_at_steps(rec, B, [10**6])[0, 0] == pytest.approx(theorem, rel=1e-8)


@pytest.mark.parametrize("lr, gamma", [(0.1, 0.5), (0.3, 0.95), (1.5, 0.8)])
def test_theorem2_transient_and_steady_state(lr, gamma):
    h, c, B = 1.0, 1.0, 4.0
    problem = from_eigenvalues([h])
    rec = moment_recurrence(problem, Algorithm("ema"), lr, ema_decay=gamma)
    r1, r2 = 1 - lr * h, gamma
    steps = np.arange(0, 30)
    factor = ((r1 ** (steps + 1) - r2 ** (steps + 1)) - gamma * (1 - lr * h) * (r1**steps - r2**steps)) / (r1 - r2)
    noiseless = losses_at_steps(rec, np.inf, steps)[0]
    assert np.allclose(noiseless, 0.5 * h * factor**2, rtol=1e-9, atol=1e-15)
    u = _steady_state(rec, B)
    ema_second_moment = u[-1, 0]  # last pair is (x_ema, x_ema)
    theorem = lr * c / (2 * B * (2 - lr * h)) * (1 - gamma) * (1 + (1 - lr * h) * gamma) / (
        (1 + gamma) * (1 - (1 - lr * h) * gamma)
    )
    assert 0.5 * h * ema_second_moment == pytest.approx(theorem, rel=1e-10)


def test_degenerate_and_critically_damped_cases_are_finite_and_nonnegative():
    # EMA with 1 - lr h == decay (defective T) and momentum at critical damping mu = (1 - sqrt(z))^2.
    problem = from_eigenvalues([1.0, 0.5, 1e-4])
    cases = [
        moment_recurrence(problem, Algorithm("ema"), 0.1, ema_decay=0.9),
        moment_recurrence(problem, Algorithm("momentum"), 0.04, momentum=(1 - np.sqrt(0.04)) ** 2),
        moment_recurrence(problem, Algorithm("momentum+ema"), 1e-3, momentum=0.999, ema_decay=0.999),
    ]
    for rec in cases:
        dense = dense_losses(rec, 4.0, 5000)[0]
        sparse = losses_at_steps(rec, 4.0, [0, 1, 17, 4096, 5000])[0]
        assert np.all(np.isfinite(dense)) and np.all(dense >= 0)
        assert np.allclose(dense[[0, 1, 17, 4096, 5000]], sparse, rtol=1e-10)
        P, g = map_power(rec, 10**7)
        assert np.all(np.isfinite(P)) and np.all(np.isfinite(g))


def test_dense_matches_step_by_step_iteration():
    problem = zhang2019_binned()
    rec = moment_recurrence(problem, Algorithm("nesterov", 0.25), [0.05, 0.3], momentum=[0.9, 0.5])
    dense = dense_losses(rec, 32.0, 300, block=64)
    T, g = rec.transition, rec.noise
    u = rec.initial_state(1)
    manual = [rec.loss(u)[:, 0]]
    for _ in range(300):
        u = np.einsum("ikgbj,kgbj->igbj", T, u) + g / 32.0
        manual.append(rec.loss(u)[:, 0])
    assert np.allclose(dense, np.array(manual).T, rtol=1e-11)


def test_bad_hyperparameters():
    problem = from_eigenvalues([1.0])
    with pytest.raises(BatchlabError, match=r"\[0, 1\]"):
        Algorithm("sgd", 1.5)
    with pytest.raises(BatchlabError, match=r"\[0, 1\)"):
        moment_recurrence(problem, Algorithm("momentum"), 0.1, momentum=1.0)
    with pytest.raises(BatchlabError, match=r"\[0, 1\)"):
        moment_recurrence(problem, Algorithm("ema"), 0.1, ema_decay=-0.1)
    with pytest.raises(BatchlabError, match="unknown optimizer"):
        Algorithm("adam")
    with pytest.raises(BatchlabError, match="needs a momentum"):
        moment_recurrence(problem, Algorithm("nesterov"), 0.1)


def test_dense_chunks_cover_every_step_once():
    from batchlab.nqm.dynamics import iter_dense_losses

    rec = moment_recurrence(zhang2019_binned(), Algorithm("momentum"), [0.1, 0.02], momentum=[0.9, 0.5])
    chunks = list(iter_dense_losses(rec, 16.0, 1000, block=32, group=3))
    assert [start for start, _ in chunks] == list(range(0, 1001, 96))
    joined = np.concatenate([losses for _, losses in chunks], axis=1)
    assert np.allclose(joined, losses_at_steps(rec, 16.0, np.arange(1001)), rtol=1e-10)
