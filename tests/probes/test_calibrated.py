"""The calibrated NQM: built from known spectra it is the engine's own problem; on linear regression its
curvatures are the model's Hessian eigenvalues."""

import numpy as np
import pytest
import torch

from batchlab.errors import BatchlabError
from batchlab.nqm.algorithms import Algorithm
from batchlab.nqm.problem import from_eigenvalues
from batchlab.nqm.tuning import tune
from batchlab.probes.calibrated import calibrated_problem, matching_fraction, predict_steps, target_loss

H = 1.0 / np.arange(1, 31)
BATCHES = [4, 16, 64, 256, 1024]


def test_known_spectrum_reproduces_the_engines_curve():
    # h_max = 1, tr Sigma = tr H (c = h), |G|^2 = sum h^2 (sigma^2 = 1): exactly from_eigenvalues(h)
    problem = calibrated_problem(H, trace_sigma=H.sum(), grad_norm_sq=(H**2).sum(), target_fraction=0.02)
    np.testing.assert_allclose(problem.curvature, H)
    np.testing.assert_allclose(problem.noise, H)
    assert problem.metadata["kappa"] == pytest.approx(1.0) and problem.metadata["moment_scale"] == pytest.approx(1.0)
    engine = from_eigenvalues(H)
    target = 0.02 * engine.initial_loss()
    assert target_loss(problem) == pytest.approx(target)
    curves = predict_steps(problem, ["sgd", "adam", "momentum"], BATCHES)
    for name, algorithm in (("sgd", Algorithm("sgd")), ("adam", Algorithm("momentum", 0.5)),
                            ("momentum", Algorithm("momentum"))):
        expected = [p.result.steps for p in tune(engine, algorithm, BATCHES, target, grid="official")]
        assert [r["steps"] for r in curves[name].rows] == expected
        assert curves[name].nqm_algorithm == algorithm.name and curves[name].precondition == algorithm.precondition
    sgd = curves["sgd"]
    assert sgd.b_crit is not None and sgd.b_crit > 0
    assert sgd.b_crit == pytest.approx(sgd.summary["critical_batch_sizes"]["mccandlish_b_crit"]["value"])
    assert set(sgd.critical_batch_sizes) >= {"mccandlish_b_crit"}


def test_scaling_the_measurements_leaves_the_steps_unchanged():
    # curvature x10, start moments x3 (|G|^2 x 300), per-example noise x 10^2 x 3 (c ~ h_max^2 sigma^2): the
    # normalised problem, hence every step count, is the same
    base = calibrated_problem(H, trace_sigma=H.sum(), grad_norm_sq=(H**2).sum())
    scaled = calibrated_problem(10 * H, trace_sigma=300 * H.sum(), grad_norm_sq=300 * (H**2).sum())
    np.testing.assert_allclose(scaled.curvature, base.curvature)
    np.testing.assert_allclose(scaled.noise, base.noise)
    assert scaled.metadata["curvature_scale"] == pytest.approx(10.0)
    a, b = predict_steps(base, ["sgd"], BATCHES)["sgd"], predict_steps(scaled, ["sgd"], BATCHES)["sgd"]
    assert [r["steps"] for r in a.rows] == [r["steps"] for r in b.rows]
    for ra, rb in zip(a.rows, b.rows):  # the model-unit learning rate is the engine's / h_max
        assert rb["learning_rate_model"] == pytest.approx(ra["learning_rate"] / 10.0)


def _linear_regression(d=6, n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    scales = torch.linspace(0.5, 2.0, d, dtype=torch.float64)
    x = torch.randn(n, d, generator=g, dtype=torch.float64) * scales
    y = x @ torch.ones(d, dtype=torch.float64) + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)
    model = torch.nn.Linear(d, 1, bias=False).double()

    def loss_fn(out, target):
        return 0.5 * (out.reshape(-1) - target).square().mean()

    hessian = (x.T @ x / n).numpy()
    return model, loss_fn, [(x[:128], y[:128]), (x[128:], y[128:])], np.linalg.eigvalsh(hessian)[::-1]


def test_linear_regression_calibrated_eigenvalues_are_the_models():
    from batchlab.probes.noise_scale import noise_scale
    from batchlab.probes.spectrum import spectral_density, top_eigenvalues

    model, loss_fn, batches, exact = _linear_regression()
    spectrum = top_eigenvalues(model, loss_fn, batches, k=5, tol=0)
    density = spectral_density(model, loss_fn, batches, lanczos_steps=6, probes=1)
    ns = noise_scale(model, loss_fn, batches)
    problem = calibrated_problem(spectrum.eigenvalues, density=density, trace_sigma=ns.trace_sigma,
                                 grad_norm_sq=ns.grad_norm_sq, bins=1000)
    h = problem.curvature * problem.metadata["curvature_scale"]
    # the top 5 exactly, and the remaining direction from the density (full Lanczos: its nodes are exact)
    np.testing.assert_allclose(h, exact, rtol=1e-8)
    np.testing.assert_allclose(problem.counts, np.ones(6), rtol=1e-8)
    assert problem.metadata["dropped_directions"] == pytest.approx(0.0)
    # the Hessian-proportional noise reproduces the measured tr(Sigma) and |G|^2
    assert problem.metadata["trace_sigma_model"] == pytest.approx(ns.trace_sigma)
    s0 = problem.metadata["moment_scale"]
    assert s0 * (problem.counts * h**2).sum() == pytest.approx(ns.grad_norm_sq)
    # eigenvalues alone: the same top 5
    top_only = calibrated_problem(spectrum.eigenvalues, trace_sigma=ns.trace_sigma, grad_norm_sq=ns.grad_norm_sq)
    np.testing.assert_allclose(top_only.curvature * top_only.metadata["curvature_scale"], exact[:5], rtol=1e-8)


def test_density_bins_keep_directions_and_trace():
    nodes = [[0.001, 0.01, 0.5, 2.0], [0.002, 0.02, 1.0]]
    weights = [[0.4, 0.3, 0.2, 0.1], [0.5, 0.3, 0.2]]
    density = {"nodes": nodes, "weights": weights, "parameters": 1000}
    problem = calibrated_problem(density=density, trace_sigma=1.0, grad_norm_sq=1.0, bins=8)
    h = problem.curvature * problem.metadata["curvature_scale"]
    counts = 1000 * np.concatenate([np.asarray(w) for w in weights]) / 2
    flat = np.concatenate([np.asarray(n) for n in nodes])
    assert problem.counts.sum() == pytest.approx(1000)
    assert (problem.counts * h).sum() == pytest.approx((counts * flat).sum())
    assert np.all(problem.counts >= 1)


def test_dropped_trace_counts_top_eigenvalues_below_the_floor():
    """With top eigenvalues and a density, a top eigenvalue at or below the floor is dropped: it counts
    in dropped_directions and in dropped_trace_fraction, whose total is the trace as modelled."""
    density = {"nodes": [[1e-9, 0.01, 0.1]], "weights": [[0.5, 0.3, 0.2]], "parameters": 100}
    top = np.array([2.0, 1.0, 1e-7])  # floor 1e-6 x 2: the last is dropped, with the bulk's node 1e-9
    problem = calibrated_problem(top, density=density, trace_sigma=1.0, grad_norm_sq=1.0, bins=8)
    meta = problem.metadata
    bulk_scale = (100 - 3) / 100  # the bulk's counts rescaled to the directions the top ones leave
    bulk = np.array([1e-9, 0.01, 0.1]) * np.array([0.5, 0.3, 0.2]) * 100 * bulk_scale
    assert meta["dropped_directions"] == pytest.approx(0.5 * 100 * bulk_scale + 1)
    assert meta["dropped_trace_fraction"] == pytest.approx((bulk[0] + 1e-7) / (top.sum() + bulk.sum()))


def test_bad_input_is_one_line():
    with pytest.raises(BatchlabError, match="curvature spectrum"):
        calibrated_problem(grad_norm_sq=1.0, trace_sigma=1.0)
    with pytest.raises(BatchlabError, match="no positive eigenvalue"):
        calibrated_problem([-1.0, -2.0], grad_norm_sq=1.0, trace_sigma=1.0)
    with pytest.raises(BatchlabError, match="noise model"):
        calibrated_problem(H, grad_norm_sq=1.0, trace_sigma=1.0, noise="pink")
    with pytest.raises(BatchlabError, match="trace_sigma"):
        calibrated_problem(H, grad_norm_sq=1.0)
    problem = calibrated_problem(H, grad_norm_sq=1.0, trace_sigma=1.0)
    with pytest.raises(BatchlabError, match="no NQM model"):
        predict_steps(problem, ["lars"], BATCHES)
    with pytest.raises(BatchlabError, match="no NQM model"):
        predict_steps(problem, ["nope"], BATCHES)
    assert matching_fraction(2.0, 0.5, 0.0) == pytest.approx(0.25)
    with pytest.raises(BatchlabError, match="floor < goal < start"):
        matching_fraction(1.0, 2.0)
