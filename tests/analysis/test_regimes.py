"""Regimes read from the data (docs/methods.md, "Regimes read from the data")."""

import math

import numpy as np
import pytest

from batchlab.analysis.critical_batch_size import (
    DIMINISHING_RETURNS,
    MAXIMAL_DATA_PARALLELISM,
    PERFECT_SCALING,
    read_regimes,
    summarize_curve,
)
from batchlab.analysis.curve import StepsCurve
from batchlab.analysis.regimes import bound_shares
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


# --- contiguous regimes on hand-made curves (docs/methods.md, "Regimes read from the data") ---

FC64_B = [4 * 2**k for k in range(12)]  # 4 .. 8192
FC64_MOMENTUM = [26379, 15360, 8186, 2804, 1680, 876, 470, 321, 337, 306, 288, 292]
FC64_SGD = [26379, 13440, 6720, 3240, 1643, 1115, 720, 700, 835, 427, 470, 759]


def _labels(regimes):
    return {p["batch_size"]: p["regime"] for p in regimes["points"]}


def test_perfect_scaling_ends_before_the_first_failure_and_never_resumes():
    # ratios S(B) B / S(1): 1, 1, 1, 1.6 (fails), 1.04, 1.056 (back within 0.1), 2.56
    curve = StepsCurve.from_points([(1, 1000), (2, 500), (4, 250), (8, 200), (16, 65), (32, 33), (64, 40)])
    regimes = read_regimes(curve, 0.1)
    ps = regimes["perfect_scaling_end"]
    assert ps["value"] == 4 and ps["kind"] == "read" and ps["n_points"] == 3  # the old rule said 32
    assert ps["reason"] == "perfect scaling ends at B = 4: B = 8 needs 1.6x the examples of B0 = 1 (tolerance 0.1)"
    assert ps["interpolated"] == pytest.approx(4 * 2 ** (0.0953 / 0.47), rel=0.01)  # log 1.1 / log 1.6
    assert ps["note"] == ("B = 16 and 32 return within the tolerance after the first failure at B = 8: "
                          "under-tuned smaller batch sizes?")
    labels = _labels(regimes)
    assert [labels[b] for b in (1, 2, 4)] == [PERFECT_SCALING] * 3
    assert PERFECT_SCALING not in [labels[b] for b in (8, 16, 32, 64)]


def test_fc64_momentum_ends_perfect_scaling_at_b0_and_sgd_at_64():
    momentum = read_regimes(StepsCurve.from_points(zip(FC64_B, FC64_MOMENTUM)), 0.1)
    ps = momentum["perfect_scaling_end"]
    # B = 8 needs 15360 * 8 / (26379 * 4) = 1.16x the examples of B0 = 4: perfect scaling ends at B0
    # (one measured batch size: no value, its end lies before 8); the old rule said 128
    assert ps["value"] is None and ps["kind"] == "below_range" and ps["upper_bound"] == 8
    assert ps["reason"] == ("below the measured range: perfect scaling ends at B0 = 4, the only measured batch size "
                            "inside it: B = 8 needs 1.16x the examples of B0 = 4 (tolerance 0.1)")
    assert "B = 32, 64 and 128 return within the tolerance after the first failure at B = 8" in ps["note"]
    labels = _labels(momentum)
    assert PERFECT_SCALING not in labels.values()
    assert [labels[b] for b in FC64_B[1:9]] == [DIMINISHING_RETURNS] * 8
    mp = momentum["maximal_parallelism_start"]
    # 1024 needs 337 / 288 = 1.17x the minimum; 2048, 4096 and 8192 are within 1.1x
    assert mp["value"] == 2048 and mp["n_points"] == 3
    assert mp["reason"] == ("maximal data parallelism starts at B = 2048: every measured S from there on is within 0.1 "
                            "of the minimum measured steps (288 at B = 4096); B = 1024 needs 1.17x the minimum")
    assert [labels[b] for b in (2048, 4096, 8192)] == [MAXIMAL_DATA_PARALLELISM] * 3

    sgd = read_regimes(StepsCurve.from_points(zip(FC64_B, FC64_SGD)), 0.1)
    ps = sgd["perfect_scaling_end"]
    assert ps["value"] == 64 and ps["n_points"] == 5 and ps["note"] is None
    assert ps["reason"] == "perfect scaling ends at B = 64: B = 128 needs 1.35x the examples of B0 = 4 (tolerance 0.1)"
    assert sgd["maximal_parallelism_start"]["kind"] == "not_seen"  # 759 steps at 8192, 1.78x the minimum
    labels = _labels(sgd)
    assert [labels[b] for b in (128, 256, 512, 1024)] == [DIMINISHING_RETURNS] * 4
    assert labels[2048] is None  # the fewest steps: never diminishing returns


def test_an_exact_hyperbola_reads_its_true_bounds():
    # S = 1000 (1 + 64 / B): examples ratio (B + 64) / 65, 1.046 at 4 and 1.108 at 8 (the true crossing at
    # B = 1.1 + 6.4 = 7.5); S(512) = 1125 is within 1.1x S(2048) = 1032, S(256) = 1250 is not
    b = [2**k for k in range(12)]
    curve = StepsCurve.from_points([(x, math.ceil(1000 * (1 + 64 / x))) for x in b])
    regimes = read_regimes(curve, 0.1)
    ps, mp = regimes["perfect_scaling_end"], regimes["maximal_parallelism_start"]
    assert ps["value"] == 4 and ps["note"] is None
    assert ps["interpolated"] == pytest.approx(7.5, rel=0.03)
    assert mp["value"] == 512 and mp["n_points"] == 3
    assert "B = 256 needs 1.21x the minimum" in mp["reason"]
    labels = [p["regime"] for p in regimes["points"]]
    assert labels == [PERFECT_SCALING] * 3 + [DIMINISHING_RETURNS] * 6 + [MAXIMAL_DATA_PARALLELISM] * 3


def test_the_batch_size_with_the_fewest_steps_is_never_diminishing_returns():
    # the minimum at 16 (1000 steps), then 1400 at 32 (outside 1.1x), the plateau 64-128: the old code
    # labelled 16 diminishing returns (below the plateau's start)
    curve = StepsCurve.from_points([(1, 8000), (2, 4000), (4, 2000), (8, 1500), (16, 1000), (32, 1400), (64, 1050),
                                    (128, 1020)])
    regimes = read_regimes(curve, 0.1)
    assert regimes["perfect_scaling_end"]["value"] == 4
    assert regimes["maximal_parallelism_start"]["value"] == 64
    labels = _labels(regimes)
    assert labels[16] is None
    assert labels[8] == labels[32] == DIMINISHING_RETURNS
    assert labels[64] == labels[128] == MAXIMAL_DATA_PARALLELISM
    # inside a plateau the minimum is maximal data parallelism; inside perfect scaling, perfect scaling
    plateau = _labels(read_regimes(StepsCurve.from_points([(1, 4000), (2, 2000), (4, 1200), (8, 1000), (16, 1050)])))
    assert plateau[8] == MAXIMAL_DATA_PARALLELISM
    scaling = _labels(read_regimes(StepsCurve.from_points([(1, 4000), (2, 2000), (4, 1000)])))
    assert scaling[4] == PERFECT_SCALING


def test_censored_batch_sizes_between_measured_ones():
    points = [(1, 8000), (2, 4000), (4, None), (8, 1000), (16, 600)]
    # B = 4 unreached at 2500 steps: S(4) * 4 > 10000 = 1.25 x 8000, a failure; 8 returns within it
    failed = read_regimes(StepsCurve.from_points(points, censored_at=[None, None, 2500, None, None]), 0.1)
    ps = failed["perfect_scaling_end"]
    assert ps["value"] == 2 and ps["kind"] == "read" and ps["interpolated"] is None
    assert ps["reason"] == ("perfect scaling ends at B = 2: B = 4 did not reach the goal in 2500 steps, so it needs "
                            "more than 1.25x the examples of B0 = 1 (tolerance 0.1)")
    assert ps["note"].startswith("B = 8 returns within the tolerance after the first failure at B = 4")
    # past perfect scaling, below the minimum's batch size (600 at 16) and above 1.1x it
    assert _labels(failed)[8] == DIMINISHING_RETURNS
    # a bound of 1500 steps (ratio above 0.75 only) decides nothing: undetermined from B = 2, and 16 fails (1.2x)
    open_ = read_regimes(StepsCurve.from_points(points, censored_at=[None, None, 1500, None, None]), 0.1)
    ps = open_["perfect_scaling_end"]
    assert ps["value"] is None and ps["kind"] == "undetermined"
    assert ps["lower_bound"] == 2 and ps["upper_bound"] == 16
    assert ps["reason"] == ("undetermined beyond B = 2: the unreached B = 4 did not reach the goal in 1500 steps, which "
                            "puts its examples ratio only above 0.75x, not above 1 + 0.1; perfect scaling ends before "
                            "B = 16: B = 16 needs 1.2x the examples of B0 = 1 (tolerance 0.1)")
    labels = _labels(open_)
    assert labels[1] == labels[2] == PERFECT_SCALING and labels[8] is None
    # no censoring bound at all: undetermined too, and said so
    bare = read_regimes(StepsCurve.from_points(points), 0.1)["perfect_scaling_end"]
    assert bare["kind"] == "undetermined" and "the unreached B = 4 has no censoring bound" in bare["reason"]


def test_reasons_never_claim_failing_batch_sizes_are_within_the_tolerance():
    rng = np.random.default_rng(3)
    b = np.array([2**k for k in range(12)])
    for _ in range(200):
        steps = np.ceil(1000 * (1 + 64 / b) * np.exp(0.2 * rng.standard_normal(b.size))).astype(int)
        regimes = read_regimes(StepsCurve.from_points(zip(b.tolist(), steps.tolist())), 0.1)
        ps = regimes["perfect_scaling_end"]
        ratios = [p["examples_ratio"] for p in regimes["points"]]
        fails = [x > 1.1 for x in ratios]
        first = fails.index(True) if any(fails) else None
        end = first - 1 if first is not None else b.size - 1  # index of the last batch size before the first failure
        assert not any(fails[: end + 1])
        if first is None:
            assert ps["kind"] == "beyond_range" and ps["lower_bound"] == b[-1]
            assert ps["reason"].startswith(f"beyond the measured range: every measured batch size from B0 = 1 to {b[-1]}")
        elif end == 0:
            assert ps["kind"] == "below_range" and ps["upper_bound"] == b[first]
        else:
            assert ps["value"] == b[end] and f"B = {b[first]} needs" in ps["reason"]
        in_scaling = [p["regime"] == PERFECT_SCALING for p in regimes["points"]]
        assert in_scaling == [end >= 1 and i <= end for i in range(b.size)]


def test_bound_shares_of_resampled_regimes():
    ends_at_4 = read_regimes(StepsCurve.from_points([(1, 8000), (2, 4000), (4, 2000), (8, 1500), (16, 1400)]))
    ends_at_8 = read_regimes(StepsCurve.from_points([(1, 8000), (2, 4000), (4, 2000), (8, 1000), (16, 1000)]))
    below = read_regimes(StepsCurve.from_points([(1, 8000), (2, 6000), (4, 3000), (8, 2000), (16, 1900)]))
    assert ends_at_4["perfect_scaling_end"]["value"] == 4 and ends_at_8["perfect_scaling_end"]["value"] == 8
    assert below["perfect_scaling_end"]["kind"] == "below_range"
    shares = bound_shares([ends_at_4, ends_at_8, ends_at_4, below, None])
    ps = shares["perfect_scaling_end"]
    assert ps["n_replicates"] == 5
    assert ps["shares"] == [{"value": 4, "share": 0.4}, {"value": 8, "share": 0.2}, {"value": None, "share": 0.4}]
    assert ps["null_shares"] == {"below_range": 0.2, "not_read": 0.2}
    mp = shares["maximal_parallelism_start"]  # 8 (1500, 1400) for the first, 8 (1000, 1000), 8 (2000, 1900)
    assert mp["shares"] == [{"value": 8, "share": 0.8}, {"value": None, "share": 0.2}]
    assert mp["null_shares"] == {"not_read": 0.2}
    assert sum(e["share"] for e in ps["shares"]) == pytest.approx(1)
    with pytest.raises(BatchlabError, match="at least one resampled curve"):
        bound_shares([])
