import math

import numpy as np
import pytest

from batchlab.analysis.critical_batch_size import (
    DIMINISHING_RETURNS,
    MAXIMAL_DATA_PARALLELISM,
    PERFECT_SCALING,
    critical_batch_sizes,
    fit_steps_curve,
    overhead_batch_size,
    regime,
    summarize_curve,
)
from batchlab.analysis.curve import StepsCurve, curve_from_arrays
from batchlab.errors import BatchlabError


def hyperbola_curve(s_min=1000.0, b_crit=256.0, noise=0.0, seed=0):
    b = 2.0 ** np.arange(0, 16)
    s = s_min * (1 + b_crit / b)
    if noise:
        s = s * np.exp(np.random.default_rng(seed).normal(0, noise, b.size))
    return curve_from_arrays(b, s, label="synthetic")


def test_fit_recovers_exact_hyperbola():
    fit = fit_steps_curve(hyperbola_curve())
    assert fit.s_min == pytest.approx(1000.0, rel=1e-3)
    assert fit.b_crit == pytest.approx(256.0, rel=1e-3)
    assert fit.e_min == pytest.approx(256_000.0, rel=1e-3)
    assert fit.rms_log_residual < 1e-3


def test_fit_is_robust_to_noise():
    fit = fit_steps_curve(hyperbola_curve(noise=0.05, seed=3))
    assert fit.b_crit == pytest.approx(256.0, rel=0.3)


def test_named_batch_sizes_follow_their_definitions():
    fit = fit_steps_curve(hyperbola_curve())
    named = critical_batch_sizes(fit, tolerance=0.1)
    b0 = 1.0
    assert named["overhead_20pct"] == pytest.approx(0.2 * fit.b_crit + 1.2 * b0)
    # At the 20% batch size the overhead over perfect scaling from B0 is exactly 20%.
    b20 = named["overhead_20pct"]
    ratio = fit.predicted_steps(b20) * b20 / (fit.predicted_steps(b0) * b0)
    assert ratio == pytest.approx(1.2)
    assert named["perfect_scaling_end"] == pytest.approx(0.1 * fit.b_crit)
    assert named["maximal_parallelism_start"] == pytest.approx(10 * fit.b_crit)
    # At B_crit, steps are twice the minimum.
    assert fit.predicted_steps(fit.b_crit) == pytest.approx(2 * fit.s_min)
    assert overhead_batch_size(fit, 1.0) == pytest.approx(fit.b_crit + 2 * b0)


def test_regimes():
    fit = fit_steps_curve(hyperbola_curve())
    assert regime(fit, 4) == PERFECT_SCALING
    assert regime(fit, 256) == DIMINISHING_RETURNS
    assert regime(fit, 8192) == MAXIMAL_DATA_PARALLELISM


def test_pure_perfect_scaling_has_infinite_b_crit():
    b = 2.0 ** np.arange(0, 10)
    fit = fit_steps_curve(curve_from_arrays(b, 1e6 / b))
    assert math.isinf(fit.b_crit)
    summary = summarize_curve(curve_from_arrays(b, 1e6 / b))
    assert summary["critical_batch_sizes"]["mccandlish_b_crit"]["value"] is None
    assert all(r["regime"] == PERFECT_SCALING for r in summary["regimes"])


def test_unreached_points_are_censored_not_fitted():
    curve = StepsCurve.from_points([(1, 2000), (2, 1000), (4, 500), (8, None)])
    fit = fit_steps_curve(curve)
    assert fit.n_points == 3
    assert curve.reached == (True, True, True, False)


def test_too_few_points_is_a_clear_error():
    with pytest.raises(BatchlabError, match="at least 2"):
        fit_steps_curve(StepsCurve.from_points([(1, 10), (2, None)]))


def test_curve_validation():
    with pytest.raises(BatchlabError, match="positive"):
        StepsCurve(batch_sizes=(0, 1), steps=(1, 1))
    with pytest.raises(BatchlabError, match="increasing"):
        StepsCurve(batch_sizes=(2, 1), steps=(1, 1))
    with pytest.raises(BatchlabError, match="tolerance"):
        critical_batch_sizes(fit_steps_curve(hyperbola_curve()), tolerance=1.5)
