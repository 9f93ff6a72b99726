"""Tuning flags (docs/methods.md, "Tuning flags") on hand-made studies with known truth, a small store,
and the fit with and without the flagged points."""

import json

import numpy as np
import pytest
from analysis_fixtures import tables_from_trials, trial

from batchlab.analysis.curve import StepsCurve
from batchlab.analysis.selection import Selection
from batchlab.analysis.tables import connect_tables
from batchlab.analysis.tuning_flags import (
    KINDS,
    POINT_KINDS,
    StudyTuning,
    TuningFlag,
    flagged_fit_effect,
    store_fit_fn,
    tuning_flags,
    tuning_from_store,
)
from batchlab.errors import BatchlabError
from batchlab.search import SearchSpace

W = "mnist/fc_64/momentum"
M = "val/classification_error"
SPACE = SearchSpace.from_batch_science({
    "learning_rate": {"type": "DOUBLE", "min_value": 1e-3, "max_value": 10.0, "scale": "LOG_SCALE"},
    "momentum": {"type": "DOUBLE", "min_value": 0.5, "max_value": 0.999, "scale": "REVERSE_LOG_SCALE"},
    "fixed": {"type": "DOUBLE", "min_value": 0.1, "max_value": 0.1, "scale": "LINEAR_SCALE"},
    "smoothing": {"type": "DISCRETE", "feasible_points": [0.0, 0.1]},
})


def study(b, steps, n_reached=4, n_trials=4, space=SPACE, **point):
    point = point or {"learning_rate": 0.01 * b ** 0.5, "momentum": 0.9 + 0.001 * np.log2(b)}  # distinct, interior
    return StudyTuning(b, steps, n_reached, n_trials, point if steps is not None else None, space)


def kinds_at(flags):
    return [(f.batch_size, f.kind) for f in flags]


def test_the_demos_momentum_curve_flags_b16_as_better_than_perfect_scaling():
    # demo momentum: 8186, 3600, 1500 steps at 16, 32, 64; B=16: 1 of 4 trials reached
    flags = tuning_flags([study(16, 8186, n_reached=1), study(32, 3600), study(64, 1500)])
    assert kinds_at(flags) == [(16, "better_than_perfect_scaling"), (16, "one_reaching_trial"),
                               (32, "better_than_perfect_scaling")]  # 64 * 1500 = 96000 < 115200 / 1.1 too
    first = flags[0]
    assert first.message == ("batch size 16: S(32) x 32 = 115200 examples < S(16) x 16 = 130976 / (1 + 0.1) (ratio "
                             "0.880): the larger batch size needs fewer examples, better than perfect scaling; B=16 "
                             "is probably under-tuned")
    assert first.detail["neighbour"] == 32 and first.detail["examples_ratio"] == pytest.approx(115200 / 130976)
    assert flags[1].message == "batch size 16: steps to result 8186 rests on 1 of 4 trials reaching the goal; its scatter is unknown"
    # the tolerance decides: ratios 0.880 (16 -> 32) and 0.833 (32 -> 64) against 1 / 1.15 = 0.870
    assert kinds_at(tuning_flags([study(16, 8186), study(32, 3600), study(64, 1500)], tolerance=0.15)) == [
        (32, "better_than_perfect_scaling")]


def test_perfect_and_sub_perfect_scaling_are_not_flagged_and_unreached_sizes_are_skipped():
    # examples 8000, 8000/1.09 (within the tolerance), then diminishing returns
    curve = [study(8, 1000), study(16, 459), study(32, 400), study(64, None, n_reached=0), study(128, 300)]
    assert tuning_flags(curve) == []
    # 32 and 128 are neighbours among the reached sizes (64 not reached): 128 * 50 = 6400 < 12800 / 1.1
    flags = tuning_flags([study(32, 400), study(64, None, n_reached=0), study(128, 50)])
    assert kinds_at(flags) == [(32, "better_than_perfect_scaling")] and flags[0].detail["neighbour"] == 128


def test_a_learning_rate_shared_across_batch_sizes_is_a_shared_grid_point():
    # demo SGD: best lr 0.355 at every batch size from 128 to 1024 (4 trials, the same searched points)
    lrs = {64: 0.0674, 128: 0.355, 256: 0.355, 512: 0.355, 1024: 0.355}
    studies = [study(b, int(200 + 60000 / b), learning_rate=lr, momentum=0.9 if b < 512 else 0.99, fixed=0.1,
                     smoothing=0.0) for b, lr in lrs.items()]
    flags = tuning_flags(studies)
    assert kinds_at(flags) == [(64, "shared_grid_point"), (128, "shared_grid_point"), (256, "shared_grid_point"),
                               (512, "shared_grid_point"), (1024, "shared_grid_point")]
    by_b = {f.batch_size: f for f in flags}
    assert by_b[64].parameters == ("momentum",)  # 0.9 at 64..256; lr 0.0674 only at 64
    assert by_b[128].parameters == ("learning_rate", "momentum")  # the unsearched 'fixed' and discrete never count
    assert by_b[128].detail["batch_sizes"]["learning_rate"] == [128, 256, 512, 1024]
    assert by_b[1024].detail == {"values": {"learning_rate": 0.355, "momentum": 0.99},
                                 "batch_sizes": {"learning_rate": [128, 256, 512, 1024], "momentum": [512, 1024]}}
    assert by_b[1024].message.startswith("batch size 1024: the best trial's learning_rate = 0.355 (also at B = 128, "
                                         "256, 512); momentum = 0.99 (also at B = 512): the same searched point won")
    # a user sweep with 3 trials: 0.00674, 0.674, 6.74 at every batch size; without a known space only
    # the learning rate is compared (a fixed momentum would be identical anyway)
    sweep = [study(b, int(100 + 6400 / b), space=None, learning_rate=lr, momentum=0.9)
             for b, lr in ((8, 0.674), (16, 0.674), (32, 6.74), (64, 0.00674))]
    flags = tuning_flags(sweep)
    assert kinds_at(flags) == [(8, "shared_grid_point"), (16, "shared_grid_point")]
    assert all(f.parameters == ("learning_rate",) for f in flags)
    # values equal only to a few digits are different points: no flag
    assert tuning_flags([study(8, 800, learning_rate=0.355), study(16, 400, learning_rate=0.35500001)]) == []


def test_a_batch_size_resting_on_one_trial():
    flags = tuning_flags([study(8, 900, n_reached=1, n_trials=3), study(16, 500, n_reached=2, n_trials=3),
                          study(32, 300, n_reached=1, n_trials=1), study(64, None, n_reached=0, n_trials=1),
                          study(128, None, n_reached=0, n_trials=3), study(256, None, n_reached=0, n_trials=0)])
    assert kinds_at(flags) == [(8, "one_reaching_trial"), (32, "one_reaching_trial"), (64, "one_reaching_trial")]
    assert flags[0].detail == {"n_reached": 1, "n_trials": 3, "steps": 900}
    assert flags[1].message == "batch size 32: steps to result 300 rests on its only trial; its scatter is unknown"
    assert flags[2].message == "batch size 64: its censoring (not reached) rests on its only trial; its scatter is unknown"


def test_a_best_trial_at_a_search_edge():
    flags = tuning_flags([study(8, 1000, learning_rate=0.0012, momentum=0.9),  # lr in the low 10% (log)
                          study(16, 500, learning_rate=0.1, momentum=0.95),  # inside
                          study(32, 260, learning_rate=8.0, momentum=0.9985),  # both high
                          study(64, 200, space=None, learning_rate=9.9, momentum=0.8)])  # no space: no check
    assert kinds_at(flags) == [(8, "search_edge"), (32, "search_edge")]
    assert flags[0].parameters == ("learning_rate",) and flags[1].parameters == ("learning_rate", "momentum")
    assert flags[0].message == ("batch size 8: the best trial's learning_rate = 0.0012 in the low 10% of [0.001, 10] "
                                "(log): the optimum may lie outside the searched range")
    assert [e["edge"] for e in flags[1].detail["edges"]] == ["high", "high"]


def test_flags_are_json_ready_and_bad_input_is_one_line():
    flags = tuning_flags([study(16, 8186, n_reached=1), study(32, 3600, learning_rate=9.0)])
    assert {f.kind for f in flags} <= set(KINDS)
    text = json.dumps([f.to_dict() for f in flags])
    assert json.loads(text)[0] == {"kind": "better_than_perfect_scaling", "batch_size": 16, "message": flags[0].message,
                                   "parameters": [], "detail": flags[0].detail}
    for bad in (0, 1, -0.1, True, "0.1"):
        with pytest.raises(BatchlabError, match=r"tolerance must be a number in \(0, 1\)"):
            tuning_flags([study(16, 100)], tolerance=bad)
    with pytest.raises(BatchlabError, match=r"more than one study at batch size\(s\) \[16\]"):
        tuning_flags([study(16, 100), study(16, 90)])
    assert tuning_flags([]) == []


# --- from a store ---------------------------------------------------------------------------------


def rows(step, value):
    return [(step // 2, {M: 0.5}), (step, {M: value})]


def store(trials, space):
    tables = tables_from_trials(trials)
    tables["studies"]["search_space"] = json.dumps(space.to_batch_science())
    return connect_tables(**tables)


def test_tuning_from_store_counts_trials_and_reads_the_best_points_space():
    trials = [
        trial(W, 8, 1, rows(1000, 0.005), learning_rate=0.0012, momentum=0.8),  # best at 8, lr at the low edge
        trial(W, 8, 2, rows(1000, 0.5), learning_rate=0.1, momentum=0.9),  # not reached
        trial(W, 8, 3, [(5, {M: float("nan")})], status="INFEASIBLE", learning_rate=9.0, momentum=0.99),
        trial(W, 32, 1, rows(200, 0.005), learning_rate=0.1, momentum=0.9),  # best at 32
        trial(W, 32, 2, rows(400, 0.005), learning_rate=0.02, momentum=0.95),
        trial(W, 128, 1, rows(300, 0.005), learning_rate=0.1, momentum=0.95),  # the same lr as 32's best
        trial(W, 128, 2, rows(600, 0.005), learning_rate=0.3, momentum=0.9),
        trial(W, 512, 1, rows(600, 0.5), learning_rate=0.3, momentum=0.9),  # not reached by its only trial
    ]
    con = store(trials, SPACE)
    try:
        selection = Selection(W, M, 0.01)
        tuning = tuning_from_store(con, selection)
        assert [(t.batch_size, t.steps, t.n_reached, t.n_trials) for t in tuning] == [
            (8, 1000, 1, 3), (32, 200, 2, 2), (128, 300, 2, 2), (512, None, 0, 1)]  # the diverged trial counts
        assert tuning[0].best_point == {"learning_rate": 0.0012, "momentum": 0.8} and tuning[3].best_point is None
        assert all(t.space == SPACE for t in tuning)
        flags = tuning_flags(tuning)
        assert kinds_at(flags) == [(8, "better_than_perfect_scaling"), (8, "one_reaching_trial"), (8, "search_edge"),
                                   (32, "shared_grid_point"), (128, "shared_grid_point"), (512, "one_reaching_trial")]
        # a store without search spaces: no edge flags, the learning rate still compared
        tables = tables_from_trials(trials)
        plain = connect_tables(**tables)
        try:
            bare = tuning_flags(tuning_from_store(plain, selection))
            assert all(t.space is None for t in tuning_from_store(plain, selection))
            assert kinds_at(bare) == [k for k in kinds_at(flags) if k[1] != "search_edge"]
        finally:
            plain.close()
    finally:
        con.close()


# --- the fit with and without the flagged points --------------------------------------------------


def hyperbola(sizes, s_min=100.0, b_crit=64.0):
    return [round(s_min + s_min * b_crit / b) for b in sizes]


def test_leaving_an_under_tuned_point_out_recovers_the_true_b_crit():
    sizes = (8, 16, 32, 64, 128, 256, 512)
    steps = hyperbola(sizes)
    steps[0] *= 3  # B=8 under-tuned: three times the true steps
    curve = StepsCurve(sizes, tuple(steps))
    flags = tuning_flags([study(b, s) for b, s in zip(sizes, steps)])
    assert kinds_at(flags) == [(8, "better_than_perfect_scaling")]
    effect = flagged_fit_effect(curve, flags)
    assert effect.left_out == (8,) and effect.kinds == {8: ("better_than_perfect_scaling",)}
    assert effect.all_points["batch_sizes"] == list(sizes) and effect.without_flagged["batch_sizes"] == list(sizes[1:])
    assert effect.without_flagged["b_crit"] == pytest.approx(64.0, rel=0.02)  # the truth, up to rounded steps
    assert effect.all_points["b_crit"] > 1.2 * 64.0  # the under-tuned point pulls B_crit up
    assert effect.all_points["low"] is None and effect.without_flagged["n_points"] == 6  # a ScalingFit: no interval
    assert effect.text().startswith("B_crit ") and "without the flagged B = 8" in effect.text()
    json.dumps(effect.to_dict())
    # no flags: both sides are the same fit; flags off the curve are ignored
    same = flagged_fit_effect(curve, [TuningFlag("search_edge", 4096, "off the curve")])
    assert same.left_out == () and same.all_points == same.without_flagged
    assert same.text().startswith("no batch size flagged")
    # too few points left: the reason, not an exception
    few = flagged_fit_effect(StepsCurve((8, 16), (300, 140)), [TuningFlag("one_reaching_trial", 8, "x")])
    assert few.without_flagged["b_crit"] is None and "need at least 2" in few.without_flagged["error"]
    # 300 -> 140 steps from B = 8 to 16 falls faster than perfect scaling (150): no plateau, B_crit infinite
    assert few.all_points["b_crit"] == np.inf and few.all_points["error"] is None


def test_the_store_fit_is_the_reports_fit_with_every_point_and_gives_intervals():
    from batchlab.analysis.bootstrap import critical_batch_size_with_intervals
    from batchlab.analysis.steps_to_result import steps_curve, steps_to_result

    sizes = (8, 16, 32, 64, 128, 256)
    trials = []
    for b, s in zip(sizes, hyperbola(sizes)):
        for t, factor in enumerate((1.0, 1.2, 1.5)):
            step = int(s * factor) * (3 if b == 8 else 1)  # B=8 under-tuned
            trials.append(trial(W, b, t + 1, [(step - 1, {M: 0.5}), (step, {M: 0.005})], learning_rate=0.01 * b,
                                momentum=0.9 + 0.001 * np.log2(b) - 0.1 * t))
    con = store(trials, SPACE)
    try:
        selection = Selection(W, M, 0.01)
        fit_fn = store_fit_fn(con, selection, n_boot=20, seed=0)
        curve = steps_curve(steps_to_result(con, W, M, 0.01))
        reference = critical_batch_size_with_intervals(con, selection, n_boot=20, seed=0)
        mine = fit_fn(curve)
        assert mine.estimates["mccandlish_b_crit"] == reference.estimates["mccandlish_b_crit"]  # the same path
        assert mine.intervals["mccandlish_b_crit"] == reference.intervals["mccandlish_b_crit"]
        flags = tuning_flags(tuning_from_store(con, selection))
        assert kinds_at(flags) == [(8, "better_than_perfect_scaling")]
        effect = flagged_fit_effect(curve, flags, fit_fn, full=reference)
        low, high = reference.intervals["mccandlish_b_crit"]
        assert (effect.all_points["low"], effect.all_points["high"]) == (low, high)
        without = effect.without_flagged
        assert without["low"] is not None and without["low"] <= without["b_crit"] <= without["high"]
        # the truth (64, up to rounded steps) once the under-tuned point is out; pulled up with it
        assert without["b_crit"] == pytest.approx(64.0, rel=0.02) and effect.all_points["b_crit"] > 1.2 * 64.0
        assert effect.left_out == (8,) and without["batch_sizes"] == list(sizes[1:])
    finally:
        con.close()


def test_leaving_out_only_some_kinds():
    sizes = (8, 16, 32, 64, 128, 256, 512)
    steps = hyperbola(sizes)
    steps[0] *= 3
    curve = StepsCurve(sizes, tuple(steps))
    flags = [TuningFlag("better_than_perfect_scaling", 8, "a"), TuningFlag("shared_grid_point", 256, "b"),
             TuningFlag("shared_grid_point", 512, "c"), TuningFlag("one_reaching_trial", 8, "d")]
    points = flagged_fit_effect(curve, flags, leave_out=POINT_KINDS)
    assert points.left_out == (8,) and points.kinds == {8: ("better_than_perfect_scaling", "one_reaching_trial")}
    assert points.without_flagged["batch_sizes"] == list(sizes[1:]) and points.leave_out == POINT_KINDS
    every = flagged_fit_effect(curve, flags)
    assert every.left_out == (8, 256, 512) and every.without_flagged["batch_sizes"] == [16, 32, 64, 128]
    assert points.to_dict()["leave_out"] == list(POINT_KINDS)
    for bad in ((), ("typo",)):
        with pytest.raises(BatchlabError, match="flag kinds to leave out must be some of"):
            flagged_fit_effect(curve, flags, leave_out=bad)
