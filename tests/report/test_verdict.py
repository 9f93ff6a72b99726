"""The learning-rate scaling-rule verdict (batchlab.report.verdict), on hand-made optima."""

import math

import numpy as np

from batchlab.report.verdict import resolution, scaling_verdict

B = np.array([8, 16, 32, 64, 128, 256], dtype=float)
FINE = [0.05] * 6  # the optimum is located within 5% at every batch size


def test_linear_optimum_fits_the_linear_rule_only():
    v = scaling_verdict(B, 0.01 * B / 8, [False] * 6, FINE)
    assert v.anchor == 8
    assert v.fits["linear"].end == 256 and v.fits["linear"].stop is None
    assert v.fits["square_root"].end is None and v.fits["square_root"].why == "departure"
    assert "the linear rule fits from B=8 to B=256" in v.text
    assert all(abs(s - 1.0) < 1e-9 for _, _, s in v.slopes)


def test_square_root_then_flat_departs_where_the_optimum_stops_growing():
    y = 0.01 * np.sqrt(np.minimum(B, 64) / 8)
    v = scaling_verdict(B, y, [False] * 6, FINE)
    assert v.fits["square_root"].end == 64 and v.fits["square_root"].stop == 128
    assert math.isclose(v.fits["square_root"].ratio, 1 / math.sqrt(2))
    assert v.fits["linear"].end is None
    assert "square-root rule fits from B=8 to B=64" in v.text and "departs at B=128" in v.text


def test_search_edge_optima_are_undetermined_never_a_fit():
    y = 0.01 * B / 8
    v = scaling_verdict(B, y, [False, False, True, False, False, False], FINE)
    assert v.fits["linear"].end == 16 and v.fits["linear"].why == "search edge" and v.fits["linear"].stop == 32
    assert "undetermined from B=32" in v.text
    v = scaling_verdict(B, y, [True] * 6, FINE)
    assert v.anchor is None and v.text.startswith("undetermined")
    v = scaling_verdict(B, y, [True, False, False, False, False, False], FINE)
    assert v.anchor == 16 and "undetermined below B=16" in v.text


def test_a_coarse_search_cannot_tell_the_rules_apart():
    v = scaling_verdict(B[:3], 0.01 * B[:3] / 8, [False] * 3, [1.0] * 3)
    assert v.fits["linear"].end == v.fits["square_root"].end == 32
    assert "too coarse to tell them apart" in v.text


def test_neither_rule_when_the_optimum_falls():
    v = scaling_verdict(B, 0.01 * (8 / B), [False] * 6, FINE)
    assert v.fits["linear"].end is None and v.fits["square_root"].end is None
    assert v.text.startswith("neither rule fits from B=8")


def test_resolution_is_the_log_distance_to_the_nearest_other_trial():
    assert math.isclose(resolution(1.0, np.array([2.0, 0.25, np.nan])), math.log(2))
    assert resolution(1.0, np.array([np.nan])) == math.inf
