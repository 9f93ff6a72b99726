"""advise.rounds: the examples bound, the spanning batch sizes and the choice of the next study."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchlab.advise.rounds import (examples_bound, exponential_quantiles, interval_ratio, next_study,
                                    spanning_batch_sizes)

CANDIDATES = [2**i for i in range(0, 13)]


def _inputs(batch_sizes, s_min=100.0, e_min=20000.0, theta=0.05, k=4, budget=None):
    """Fit inputs (as store_fit_inputs gives them) of trials scattered about S(B) = S_min + E_min / B."""
    trial_steps = {}
    for b in batch_sizes:
        s = s_min + e_min / b
        trial_steps[b] = np.ceil(s * np.exp(theta * exponential_quantiles(k))) if (budget is None or s < budget) \
            else np.full(k, np.inf)
    return {"trial_steps": trial_steps, "label": "synthetic", "metadata": {},
            "steps_lower": {b: int(np.min(v) / 1.05) if np.isfinite(np.min(v)) else None for b, v in trial_steps.items()},
            "censored_at": {b: (budget if not np.isfinite(np.min(v)) else None) for b, v in trial_steps.items()},
            "unknown_from": {}, "budget": {b: float(budget) for b, v in trial_steps.items() if not np.isfinite(np.min(v))}}


def test_examples_bound_is_every_trial_at_its_whole_budget():
    assert examples_bound(64, 4, 1000) == 4 * 1000 * 64


def test_spanning_batch_sizes_keeps_both_ends_and_spreads_in_log():
    assert spanning_batch_sizes(4, 1024, CANDIDATES) == [4, 32, 128, 1024]
    assert spanning_batch_sizes(16, 64, CANDIDATES) == [16, 32, 64]
    assert spanning_batch_sizes(5000, 6000, CANDIDATES) == []


def test_interval_ratio_is_infinite_when_open():
    assert interval_ratio(100.0, 300.0) == pytest.approx(3.0)
    assert math.isinf(interval_ratio(None, 300.0)) and math.isinf(interval_ratio(100.0, None))
    assert math.isinf(interval_ratio(100.0, math.inf))


def test_exponential_quantiles_are_increasing_and_centred():
    q = exponential_quantiles(4)
    assert np.all(np.diff(q) > 0)
    assert np.mean(exponential_quantiles(2000)) == pytest.approx(1.0, rel=0.01)  # Exponential(1) has mean 1


def test_one_reached_batch_size_asks_for_its_nearest_neighbour():
    inputs = _inputs([64])
    step = next_study(inputs, {64: 4}, CANDIDATES, trials=4, max_trials=16, budget_steps=lambda b: 5000, level=0.9)
    assert step is not None and step.action == "new batch size" and step.batch_size == 128  # tie in log: the larger
    assert step.examples_bound == 4 * 5000 * 128


def test_no_reached_batch_size_stops():
    inputs = _inputs([64, 256], budget=10)
    assert next_study(inputs, {64: 4, 256: 4}, CANDIDATES, trials=4, max_trials=16, budget_steps=lambda b: 10,
                      level=0.9) is None


def test_an_interval_open_above_extends_the_range_upwards():
    # every measured batch size deep in perfect scaling: no plateau, B_crit unbounded above
    inputs = _inputs([2, 4, 8], s_min=1.0, e_min=20000.0)
    step = next_study(inputs, {2: 4, 4: 4, 8: 4}, CANDIDATES, trials=4, max_trials=16, budget_steps=lambda b: 20000,
                      level=0.9)
    assert step is not None and step.batch_size == 16 and "open above" in step.reason


def test_scored_options_pick_a_study_that_narrows_the_interval():
    """With both ends bounded, the chosen option's expected interval is narrower than now, and it is the
    best score of the options (recomputed here from the reason's figures)."""
    sizes = [16, 64, 256, 1024]
    inputs = _inputs(sizes, theta=0.1)
    step = next_study(inputs, {b: 4 for b in sizes}, CANDIDATES, trials=4, max_trials=16,
                      budget_steps=lambda b: 30000 // b + 200, level=0.9)
    assert step is not None and step.score is not None and step.score > 0
    before, after = (float(x.rstrip("x")) for x in step.reason.rsplit("from ", 1)[1].split(" to "))
    assert after < before
    assert step.action in ("new batch size", "more trials")
    if step.action == "more trials":
        assert step.trials == 8 and step.batch_size in sizes
    else:
        assert step.batch_size not in sizes


def test_more_trials_never_exceed_max_trials():
    sizes = [16, 64, 256, 1024]
    inputs = _inputs(sizes, theta=0.1)
    # every candidate measured: only more trials remain, and max_trials = 4 forbids them
    assert next_study(inputs, {b: 4 for b in sizes}, sizes, trials=4, max_trials=4,
                      budget_steps=lambda b: 30000 // b + 200, level=0.9) is None


def test_without_a_scatter_or_an_interval_the_trials_are_doubled_first():
    """Two reached batch sizes, one reached trial each: no scatter, no interval; more trials come first,
    at the reached batch size with the fewest trials."""
    inf = np.inf
    inputs = _inputs([64, 512])
    inputs["trial_steps"] = {64: np.array([1680.0, inf, inf, inf]), 512: np.array([400.0, inf, inf, inf]),
                             4: np.array([inf] * 4), 8192: np.array([inf] * 4)}
    inputs["steps_lower"] = {64: 1643, 512: 390, 4: None, 8192: None}
    inputs["censored_at"] = {64: None, 512: None, 4: 16000, 8192: 400}
    inputs["budget"] = {64: 2400.0, 512: 1000.0, 4: 16000.0, 8192: 400.0}
    measured = {4: 4, 64: 4, 512: 4, 8192: 4}
    step = next_study(inputs, measured, [4, 64, 128, 512, 8192], trials=4, max_trials=16,
                      budget_steps=lambda b: {4: 16000, 64: 2400, 128: 1600, 512: 1000, 8192: 400}[b], level=0.9)
    assert step is not None and step.action == "more trials" and step.trials == 8
    assert step.batch_size in (64, 512) and "scatter" in step.reason
