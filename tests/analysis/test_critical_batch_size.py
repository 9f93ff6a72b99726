import math

import numpy as np
import pytest

from batchlab.analysis.critical_batch_size import (
    DIMINISHING_RETURNS,
    MAXIMAL_DATA_PARALLELISM,
    PERFECT_SCALING,
    REGISTRY,
    fit_steps,
    fit_steps_curve,
    overhead_batch_size,
    regime,
    summarize_curve,
)
from batchlab.analysis.curve import StepsCurve, curve_from_arrays
from batchlab.analysis.definitions import get_definition
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
    assert not fit.extrapolated and fit.warnings == () and fit.dof == 14 and fit.p_value > 0.99
    assert [r["use"] for r in fit.residuals] == ["point"] * 16


def test_fit_is_robust_to_noise():
    fit = fit_steps_curve(hyperbola_curve(noise=0.05, seed=3))
    assert fit.b_crit == pytest.approx(256.0, rel=0.3)


def test_fit_steps_on_arrays_matches_the_curve_fit():
    curve = hyperbola_curve(noise=0.05, seed=4)
    b, s = curve.reached_arrays()
    assert fit_steps(b, s, label="synthetic") == fit_steps_curve(curve)


def test_censored_fit_recovers_b_crit_with_40_percent_censored():
    # 10 batch sizes; 4 (40%) never reached the goal: the two smallest ran 70% and the two largest 90% of
    # the steps they needed. The censored points enter as S > censored_at.
    rng = np.random.default_rng(7)
    b = 2.0 ** np.arange(0, 10)
    true = 1000.0 * (1 + 64.0 / b)
    measured = np.round(true * np.exp(rng.normal(0, 0.03, b.size)))
    censored = np.array([True, True, False, False, False, False, False, False, True, True])
    steps = np.where(censored, np.inf, measured)
    budget = np.where(censored, np.round(true * np.where(b < 8, 0.7, 0.9)), np.nan)
    curve = curve_from_arrays(b, steps, censored_at=budget)
    assert sum(not r for r in curve.reached) / len(curve.reached) == 0.4
    fit = fit_steps_curve(curve)
    assert fit.n_points == 6 and fit.n_censored == 4
    assert fit.b_crit == pytest.approx(64.0, rel=0.15)
    assert fit.s_min == pytest.approx(1000.0, rel=0.1)
    censored_rows = [r for r in fit.residuals if r["use"] == "censored"]
    assert len(censored_rows) == 4 and all(r["consistent"] for r in censored_rows)


def test_unreached_large_batch_sizes_keep_the_fit_above_their_budget():
    # The example: goal reached at 16/64/256; every trial at 1024 and 4096 ran 3000 steps without
    # reaching it. Dropping them lets the fit predict far fewer than 3000 steps there.
    points = [(16, 64000), (64, 16500), (256, 4600), (1024, None), (4096, None)]
    dropped = fit_steps_curve(StepsCurve.from_points(points))
    assert dropped.predicted_steps(1024) < 3000
    curve = StepsCurve.from_points(points, censored_at=[None, None, None, 3000, 3000])
    fit = fit_steps_curve(curve)
    assert fit.predicted_steps(1024) > 3000 and fit.predicted_steps(4096) > 0.999 * 3000
    summary = summarize_curve(curve)
    assert [r["regime"] for r in summary["regimes"]][3:] == [None, None]  # unreached: no regime label
    assert summary["censored_batch_sizes"] == [1024, 4096]


def test_brackets_weight_the_fit():
    # A wide bracket at one batch size pulls the fit less than the tight ones around it.
    b = [1, 2, 4, 8, 16, 32, 64]
    true = [1000 * (1 + 8 / x) for x in b]
    steps = [int(s) for s in true]
    steps[3] = int(true[3] * 1.5)  # an outlier measured with a 2x bracket
    lower = [s - 1 for s in steps]
    lower[3] = steps[3] // 2
    tight = fit_steps_curve(StepsCurve.from_points(list(zip(b, steps))))
    weighted = fit_steps_curve(StepsCurve.from_points(list(zip(b, steps)), steps_lower=lower))
    assert abs(weighted.b_crit - 8) < abs(tight.b_crit - 8)
    row = weighted.residuals[3]
    assert row["steps_lower"] == lower[3] and row["weight"] < weighted.residuals[2]["weight"] / 10


def test_named_batch_sizes_follow_their_definitions():
    curve = hyperbola_curve()
    fit = fit_steps_curve(curve)
    named = {d.name: d.value(fit, 0.1, fit.b0, None) for d in REGISTRY}  # no curve: data-read ones None
    assert {k for k, v in named.items() if v is not None} == {d.name for d in REGISTRY if d.source == "fit"}
    b0 = 1.0
    assert fit.b0 == b0
    assert named["overhead_20pct"] == pytest.approx(0.2 * fit.b_crit + 1.2 * b0)
    # At the 20% batch size the overhead over perfect scaling from B0 is exactly 20%.
    b20 = named["overhead_20pct"]
    ratio = fit.predicted_steps(b20) * b20 / (fit.predicted_steps(b0) * b0)
    assert ratio == pytest.approx(1.2)
    assert named["fit_perfect_scaling_end"] == pytest.approx(0.1 * fit.b_crit)
    assert named["fit_maximal_parallelism_start"] == pytest.approx(10 * fit.b_crit)
    # At B_crit, steps are twice the minimum.
    assert fit.predicted_steps(fit.b_crit) == pytest.approx(2 * fit.s_min)
    assert overhead_batch_size(fit, 1.0) == pytest.approx(fit.b_crit + 2 * b0)
    summary = summarize_curve(curve, tolerance=0.1)
    assert list(summary["critical_batch_sizes"]) == [d.name for d in REGISTRY]
    for d in REGISTRY:
        if d.source == "fit":
            assert summary["critical_batch_sizes"][d.name]["value"] == named[d.name]


def test_b0_can_be_shared_between_curves():
    curve = hyperbola_curve()
    summary = summarize_curve(curve, b0=16)
    assert summary["b0"] == 16
    assert summary["critical_batch_sizes"]["overhead_20pct"]["value"] == pytest.approx(0.2 * 256 + 1.2 * 16, rel=1e-3)
    assert summary["data_regimes"]["b0"] == 16
    assert summary["regimes"][0]["regime"] is None  # below B0: no label
    with pytest.raises(BatchlabError, match=r"b0 must be a batch size that reached the goal, one of \[1, 2"):
        summarize_curve(curve, b0=3)


def test_fit_regimes():
    fit = fit_steps_curve(hyperbola_curve())
    assert regime(fit, 4) == PERFECT_SCALING
    assert regime(fit, 256) == DIMINISHING_RETURNS
    assert regime(fit, 8192) == MAXIMAL_DATA_PARALLELISM


def test_pure_perfect_scaling_has_infinite_b_crit():
    b = 2.0 ** np.arange(0, 10)
    fit = fit_steps_curve(curve_from_arrays(b, 1e6 / b))
    assert math.isinf(fit.b_crit) and fit.extrapolated
    assert any("infinite" in w for w in fit.warnings)
    summary = summarize_curve(curve_from_arrays(b, 1e6 / b))
    assert summary["critical_batch_sizes"]["mccandlish_b_crit"]["value"] is None
    assert all(r["regime"] == PERFECT_SCALING for r in summary["regimes"])
    assert summary["critical_batch_sizes"]["perfect_scaling_end"]["value"] is None
    assert "beyond the measured range" in summary["critical_batch_sizes"]["perfect_scaling_end"]["reason"]


def test_summary_says_what_the_number_rests_on():
    curve = StepsCurve.from_points([(4, 1000), (16, 300), (64, None)])
    summary = summarize_curve(curve)
    assert summary["b0"] == 4 and summary["batch_size_range"] == [4, 16] and summary["points_used"] == 2
    assert any("two reached batch sizes" in w for w in summary["warnings"])
    assert summary["fit"]["dof"] == 0 and summary["fit"]["p_value"] is None
    for name, entry in summary["critical_batch_sizes"].items():
        assert entry["definition"] == get_definition(name).definition and entry["source"] in ("fit", "data")
    far = summarize_curve(hyperbola_curve(b_crit=1e6))
    assert far["extrapolated"] and any("extrapolated" in w for w in far["warnings"])


def test_unreached_points_without_bound_are_left_out():
    curve = StepsCurve.from_points([(1, 2000), (2, 1000), (4, 500), (8, None)])
    fit = fit_steps_curve(curve)
    assert fit.n_points == 3 and fit.n_censored == 0
    assert fit.residuals[3]["use"] == "unused"


def test_too_few_points_is_a_clear_error():
    with pytest.raises(BatchlabError, match="at least 2"):
        fit_steps_curve(StepsCurve.from_points([(1, 10), (2, None)]))


@pytest.mark.parametrize("tolerance", [0, 1, 1.5, -0.1])
def test_tolerance_must_be_in_the_open_unit_interval(tolerance):
    with pytest.raises(BatchlabError, match=r"tolerance must be in \(0, 1\)"):
        summarize_curve(hyperbola_curve(), tolerance=tolerance)


def test_curve_validation():
    with pytest.raises(BatchlabError, match="positive"):
        StepsCurve(batch_sizes=(0, 1), steps=(1, 1))
    with pytest.raises(BatchlabError, match="increasing"):
        StepsCurve(batch_sizes=(2, 1), steps=(1, 1))


def test_profiled_offset_is_the_exact_minimum_with_mixed_censoring():
    # The closed-form offset of the censored objective against a brute-force scan.
    from batchlab.analysis.critical_batch_size import ABSENT, LOWER, POINT, UPPER, _best_offset, _penalty

    rng = np.random.default_rng(0)
    a = rng.normal(0, 1, (200, 7))
    w = rng.uniform(0.5, 5, (200, 7))
    kind = rng.choice([POINT, LOWER, UPPER, ABSENT], size=(200, 7), p=[0.4, 0.25, 0.25, 0.1])
    kind[:, 0] = POINT
    c, objective = _best_offset(a, w, kind)
    scan = np.linspace(-6, 6, 24001)
    brute = np.stack([_penalty(np.full(200, x), a, w, kind) for x in scan[::20]], axis=1)
    assert np.all(objective <= brute.min(axis=1) + 1e-9)
    assert np.allclose(objective, _penalty(c, a, w, kind))


def test_a_bracket_from_zero_is_an_upper_bound_and_too_few_points_give_nan():
    from batchlab.analysis.critical_batch_size import fit_many

    curve = StepsCurve.from_points([(1, 2000), (2, 1000), (4, 500), (8, 300)], steps_lower=[1900, 950, 480, 0])
    fit = fit_steps_curve(curve)
    assert fit.residuals[3]["use"] == "upper_bound" and fit.n_points == 3
    s_min, e_min, b_crit, objective = fit_many([1, 2, 4], np.zeros((1, 3)), np.ones((1, 3)), np.array([[0, -1, 1]]))
    assert np.isnan(b_crit[0]) and np.isnan(objective[0])


def test_two_points_pulled_off_by_a_censoring_bound_are_not_called_an_exact_fit():
    pulled = StepsCurve(batch_sizes=(16, 64, 256), steps=(1000, 260, None), steps_lower=(990, 257, None),
                        censored_at=(None, None, 3000))
    warnings = fit_steps_curve(pulled).warnings
    assert not any("exactly" in w for w in warnings)
    assert any("no residual degrees of freedom" in w for w in warnings)
    exact = StepsCurve(batch_sizes=(16, 64), steps=(1000, 260), steps_lower=(990, 257))
    assert any("passes through them exactly" in w for w in fit_steps_curve(exact).warnings)


def test_batch_sizes_reached_at_their_first_evaluation_are_named_when_too_few_points_remain():
    # A goal met at the first evaluation, (0, S], bounds S from above only: the fit cannot use it as a
    # point, and its refusal says so instead of "got 0" batch sizes that reached the goal (the goal was
    # reached at every batch size here).
    curve = StepsCurve.from_points([(16, 1), (64, 1), (256, 3)], steps_lower=[0, 0, 2])
    with pytest.raises(BatchlabError) as err:
        fit_steps_curve(curve)
    message = str(err.value)
    assert "got 1 with a resolved bracket; 2 more reached it at their first evaluation" in message
    assert "B=16 (0, 1], B=64 (0, 1]" in message and "\n" not in message
