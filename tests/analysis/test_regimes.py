"""Regimes read from the data (docs/methods.md, "Regimes read from the data")."""

import pytest

from batchlab.analysis.critical_batch_size import (
    DIMINISHING_RETURNS,
    MAXIMAL_DATA_PARALLELISM,
    PERFECT_SCALING,
    read_regimes,
    summarize_curve,
)
from batchlab.analysis.curve import StepsCurve
from batchlab.errors import BatchlabError
from batchlab.nqm.dynamics import Algorithm
from batchlab.nqm.problem import zhang2019_binned
from batchlab.nqm.tuning import steps_curve, tune

EVERY_OTHER_POWER = [2**k for k in range(2, 21, 2)]  # 4, 16, ..., 2^20


@pytest.fixture(scope="module")
def nqm_sgd_p0():
    """Exact NQM, SGD p=0, zhang2019-binned, target 0.01, the notebook's (official) learning-rate grid."""
    points = tune(zhang2019_binned(), Algorithm("sgd", 0.0), EVERY_OTHER_POWER, 0.01, grid="official")
    return steps_curve(points, label="sgd p=0")


def test_nqm_sgd_p0_regimes_read_from_the_data(nqm_sgd_p0):
    summary = summarize_curve(nqm_sgd_p0)
    named = summary["critical_batch_sizes"]
    # Measured: S*B at 256 is 1.098 x S(4)*4, at 1024 1.80 x; S at 16384 is 1.025 x the minimum, at 4096 1.117 x.
    assert named["perfect_scaling_end"]["value"] == 256
    assert named["perfect_scaling_end"]["interpolated"] == pytest.approx(257, abs=1)
    assert named["maximal_parallelism_start"]["value"] == 16384
    assert named["maximal_parallelism_start"]["interpolated"] == pytest.approx(5230, rel=0.01)
    # The fit's regime bounds are model quantities (tol * B_crit and B_crit / tol), far from the data's.
    assert named["fit_perfect_scaling_end"]["value"] == pytest.approx(80, rel=0.05)
    assert named["fit_maximal_parallelism_start"]["value"] == pytest.approx(8005, rel=0.05)
    # S_min: the fitted asymptote sits ~4% below the measured plateau.
    measured = summary["s_min"]["measured"]
    assert measured["plateau_seen"] and measured["value"] == 7269
    assert summary["s_min"]["fit"] / measured["value"] == pytest.approx(0.96, abs=0.01)
    labels = {r["batch_size"]: r["regime"] for r in summary["regimes"]}
    assert labels[4] == labels[256] == PERFECT_SCALING
    assert labels[1024] == labels[4096] == DIMINISHING_RETURNS
    assert labels[16384] == labels[2**20] == MAXIMAL_DATA_PARALLELISM
    assert summary["b0"] == 4 and summary["batch_size_range"] == [4, 2**20] and summary["points_used"] == 10


def test_nqm_sgd_p075_regimes_are_beyond_the_measured_range():
    points = tune(zhang2019_binned(), Algorithm("sgd", 0.75), [4, 16, 64, 256, 1024, 4096], 0.01, grid="official")
    summary = summarize_curve(steps_curve(points))
    named = summary["critical_batch_sizes"]
    ps, mp = named["perfect_scaling_end"], named["maximal_parallelism_start"]
    assert ps["value"] is None and ps["reason"].startswith("beyond the measured range") and ps["lower_bound"] == 4096
    assert mp["value"] is None and mp["reason"].startswith("beyond the measured range")
    assert all(r["regime"] == PERFECT_SCALING for r in summary["regimes"])
    assert summary["extrapolated"] and named["mccandlish_b_crit"]["value"] > 10 * 4096
    assert not summary["s_min"]["measured"]["plateau_seen"]
    assert any("extrapolated" in w for w in summary["warnings"])
    assert any(w.startswith("maximal_parallelism_start: beyond the measured range") for w in summary["warnings"])


def test_each_regime_needs_two_measured_batch_sizes():
    # perfect scaling only at B0; plateau only at the last point
    curve = StepsCurve.from_points([(1, 1000), (2, 800), (4, 500), (8, 300), (16, 150)])
    regimes = read_regimes(curve, 0.1)
    assert regimes["perfect_scaling_end"]["value"] is None
    assert regimes["perfect_scaling_end"]["reason"].startswith("below the measured range")
    assert regimes["perfect_scaling_end"]["upper_bound"] == 2
    assert regimes["maximal_parallelism_start"]["value"] is None
    assert regimes["maximal_parallelism_start"]["lower_bound"] == 8
    # B0 alone shows no scaling; 2..8 are past perfect scaling and outside the plateau band; 16 is undetermined
    assert [p["regime"] for p in regimes["points"]] == [None] + [DIMINISHING_RETURNS] * 3 + [None]


def test_unreached_batch_sizes_get_no_label_and_censoring_counts():
    points = [(1, 8000), (2, 4000), (4, 2100), (8, 1300), (16, 1050), (32, 1000), (64, None)]
    plain = read_regimes(StepsCurve.from_points(points), 0.1)
    assert plain["maximal_parallelism_start"]["value"] == 16
    assert plain["points"][-1]["regime"] is None
    # a censoring bound above the plateau band at 64: the plateau is broken, so it never starts in range
    broken = read_regimes(StepsCurve.from_points(points, censored_at=[None] * 6 + [5000]), 0.1)
    assert broken["maximal_parallelism_start"]["value"] is None
    # the reason names the censoring bound (not the 1.1 x minimum threshold) and says the steps rise again
    reason = broken["maximal_parallelism_start"]["reason"]
    assert reason.startswith("not seen in the measured range") and "5000 steps (B = 64)" in reason
    assert "rise again" in reason
    # a censoring bound below the band says nothing: noted
    unknown = read_regimes(StepsCurve.from_points(points, censored_at=[None] * 6 + [500]), 0.1)
    assert unknown["maximal_parallelism_start"]["value"] == 16 and "unknown" in unknown["maximal_parallelism_start"]["note"]
    # perfect scaling whose end is only known from a censoring bound
    scaling = [(1, 8000), (2, 4000), (4, 2000), (8, None)]
    ended = read_regimes(StepsCurve.from_points(scaling, censored_at=[None, None, None, 1500]), 0.1)
    assert ended["perfect_scaling_end"]["value"] == 4
    open_ended = read_regimes(StepsCurve.from_points(scaling), 0.1)
    assert open_ended["perfect_scaling_end"]["value"] is None and open_ended["perfect_scaling_end"]["lower_bound"] == 4


def test_tolerance_changes_the_bounds_and_is_validated(nqm_sgd_p0):
    loose = read_regimes(nqm_sgd_p0, 0.5)
    assert loose["perfect_scaling_end"]["value"] == 256  # 1024 is 1.80x
    assert loose["maximal_parallelism_start"]["value"] == 1024  # 1.46x the minimum
    for bad in (0, 1, 2, -0.5):
        with pytest.raises(BatchlabError, match=r"tolerance must be in \(0, 1\)"):
            read_regimes(nqm_sgd_p0, bad)
    with pytest.raises(BatchlabError, match="no batch size reached the goal"):
        read_regimes(StepsCurve.from_points([(1, None), (2, None)]), 0.1)


def test_steps_rising_at_large_batch_sizes_show_no_plateau_but_label_the_middle():
    # The measured MNIST momentum curve of the issue-8 sweep: the minimum at B=512, more steps at 1024.
    curve = StepsCurve.from_points(
        [(8, 1996), (16, 1012), (32, 448), (64, 292), (128, 240), (256, 144), (512, 75), (1024, 106)]
    )
    regimes = read_regimes(curve, tolerance=0.1)
    start = regimes["maximal_parallelism_start"]
    assert start["value"] is None and "steps rise again at large batch sizes" in start["reason"]
    assert "unreached" not in start["reason"]
    labels = {p["batch_size"]: p["regime"] for p in regimes["points"]}
    assert labels[32] == "perfect_scaling" and regimes["perfect_scaling_end"]["value"] == 32
    # below the minimum's batch size and more than 1.1 x its steps: diminishing returns
    assert [labels[b] for b in (64, 128, 256)] == ["diminishing_returns"] * 3
    assert labels[512] is None and labels[1024] is None  # not determined by the data
