"""running_moments: folding m steps at once equals folding them one by one (to rounding).

Tolerance: the chunked fold sums beta^(m-1-j) x_j in one dot product where the step-by-step fold
multiplies by beta and adds m times; in float64 both are within ~m ulps of the exact value, so
rel=1e-12 is orders of magnitude above rounding and far below any arithmetic slip (a wrong power
of beta, a missing bias correction) which changes the result at the percent level.
"""

from __future__ import annotations

import numpy as np
import pytest

from batchlab.probes.running_moments import RatioMoments, TensorSums, step_weights


@pytest.mark.parametrize("beta", [None, 0.0, 0.9, 0.99])
def test_chunks_equal_steps(beta):
    rng = np.random.default_rng(0)
    g2, s = rng.normal(1.0, 0.5, (150, 3)), rng.normal(5.0, 2.0, (150, 3))
    chunked, stepwise = TensorSums.empty(3), TensorSums.empty(3)
    moments_chunked, moments_stepwise = RatioMoments(), RatioMoments()
    for start, stop in ((0, 1), (1, 64), (64, 100), (100, 150)):
        chunked = chunked.folded(g2[start:stop], s[start:stop], beta)
        moments_chunked = moments_chunked.folded(s[start:stop].sum(1), g2[start:stop].sum(1), beta)
    for t in range(150):
        stepwise = stepwise.folded_some(np.arange(3), g2[t], s[t], beta)
        moments_stepwise = moments_stepwise.folded(s[t:t + 1].sum(1), g2[t:t + 1].sum(1), beta)
    for a, b in zip(chunked.corrected(beta), stepwise.corrected(beta)):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    for field in ("weight", "weight_sq", "mean", "m2"):
        np.testing.assert_allclose(getattr(moments_chunked, field), getattr(moments_stepwise, field), rtol=1e-12)


@pytest.mark.parametrize("beta", [None, 0.8])
def test_moments_are_the_weighted_sample_moments(beta):
    """Against the definitions computed directly: weights beta^(n-1-t), weighted means, weighted sums
    of squared deviations."""
    rng = np.random.default_rng(1)
    x, y = rng.normal(3.0, 1.0, 40), rng.normal(2.0, 0.5, 40)
    moments = RatioMoments().folded(x[:17], y[:17], beta).folded(x[17:], y[17:], beta)
    w = step_weights(40, beta)
    mx, my = w @ x / w.sum(), w @ y / w.sum()
    assert moments.weight == pytest.approx(w.sum(), rel=1e-12)
    assert moments.weight_sq == pytest.approx(w @ w, rel=1e-12)
    assert moments.mean == pytest.approx((mx, my), rel=1e-12)
    assert moments.m2 == pytest.approx((w @ ((x - mx) ** 2), w @ ((x - mx) * (y - my)), w @ ((y - my) ** 2)), rel=1e-12)
    assert moments.effective_steps == pytest.approx(w.sum() ** 2 / (w @ w), rel=1e-12)
    assert RatioMoments.from_state(moments.to_state()) == moments
