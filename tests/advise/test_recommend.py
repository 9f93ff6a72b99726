"""The recommendation (batchlab.advise.recommend) on hand-built points with known answers, and
unit_points on one tiny real sweep read as `batchlab analyze` reads it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from batchlab.advise.recommend import (
    MeasuredPoint,
    Recommendation,
    UnitPoints,
    _check_bounds,
    check_interval,
    learning_rate_rule,
    recommend,
    steps_interval,
    unit_points,
    warmup_schedule,
)
from batchlab.advise.rules import _run_phases
from batchlab.errors import BatchlabError

GOAL = {"metric": "val/error", "goal": 0.1, "maximize": False, "source": "test"}


class FakeThroughput:
    """Step times per batch size (``{B: seconds}``), a 10% spread, and a memory limit."""

    def __init__(self, times: dict, largest: int | None = None):
        self.times = times
        self.largest = largest
        self.step_times = [{"batch_size": b, "low": t, "high": t * 1.1} for b, t in times.items()]

    def seconds_per_step(self, batch_size):
        return self.times.get(batch_size)

    def fits(self, batch_size):
        return None if self.largest is None else batch_size <= self.largest


def make_points(steps: dict, sd: float | None = 0.01, lrs: dict | None = None, trials: int = 4,
                unreached: tuple = (), theta: float | None = None) -> UnitPoints:
    points = []
    for b in sorted(set(steps) | set(unreached)):
        reached = b in steps
        hp = {"learning_rate": (lrs or {}).get(b, 0.1)} if reached else {}
        points.append(MeasuredPoint(batch_size=b, reached=reached, steps=steps.get(b),
                                    steps_lower=int(steps[b] * 0.95) if reached else None,
                                    censored_at=None if reached else 500, n_trials=trials,
                                    n_reached=trials if reached else 0, best_hyperparameters=hp,
                                    best_trial_id=b + 1 if reached else None, budget_steps=500,
                                    examples_spent=trials * 500 * b, trials_run=trials))
    scatter = None if sd is None else {"tail_scale": sd * trials if theta is None else theta}
    return UnitPoints(unit="w/m/sgd [sweep abc]", goal=GOAL, points=points, scatter=scatter,
                      best_of_k_sd=None if sd is None else {p.batch_size: sd for p in points},
                      trials=trials * len(points), examples_spent=sum(p.examples_spent for p in points))


# time: 40, 25.2, 18, 30 seconds -> B = 128
TIME_STEPS = {32: 4000, 64: 2100, 128: 1200, 256: 1000}
TIMES = {32: 0.01, 64: 0.012, 128: 0.015, 256: 0.03}


def test_time_objective_picks_the_least_time_and_its_indistinguishable_set():
    rec = recommend(make_points(TIME_STEPS), FakeThroughput(TIMES), "time")
    assert rec.batch_size == 128 and rec.trial_id == 129
    assert rec.seconds["value"] == pytest.approx(1200 * 0.015)
    assert rec.seconds["low"] < rec.seconds["value"] < rec.seconds["high"]
    assert rec.indistinguishable == [128]  # tight scatter: nothing else overlaps
    assert [r["batch_size"] for r in rec.table if r["recommended"]] == [128]
    assert rec.bounded_by == []
    wide = recommend(make_points(TIME_STEPS, sd=0.5), FakeThroughput(TIMES), "time")
    assert wide.batch_size == 128 and wide.indistinguishable == [32, 64, 128, 256]
    # doubling: steps(B) / steps(2B), with the range of the two intervals
    row = next(r for r in rec.table if r["batch_size"] == 64)
    assert row["doubling"]["value"] == pytest.approx(2100 / 1200)
    assert row["doubling"]["low"] < row["doubling"]["value"] < row["doubling"]["high"]
    assert next(r for r in rec.table if r["batch_size"] == 256)["doubling"] is None
    text = "\n".join(rec.lines())
    assert "use B = 128 at learning_rate 0.1" in text and "rests on 4 trials at B = 128" in text and "16 trials" in text


def test_examples_objective_largest_within_1_2x_of_the_least():
    steps = {16: 1000, 32: 520, 64: 290, 128: 200}  # examples 16000, 16640, 18560, 25600
    rec = recommend(make_points(steps), None, "examples")
    assert rec.batch_size == 64 and rec.examples["value"] == 290 * 64
    assert rec.seconds is None
    assert any("smallest measured batch size (B = 16)" in line for line in rec.bounded_by)


def test_edges_are_said():
    # least time at the largest measured B, which is the largest that fits
    steps = {32: 4000, 64: 2000, 128: 1000}
    times = {32: 0.01, 64: 0.01, 128: 0.01}
    rec = recommend(make_points(steps), FakeThroughput(times, largest=128), "time", largest_fitting=128,
                    stop={"reason": "budget", "text": "the budget is spent"})
    assert rec.batch_size == 128
    assert any("largest measured batch size (B = 128)" in b and "memory" in b for b in rec.bounded_by)
    assert any("the budget is spent" in b for b in rec.bounded_by)
    rec = recommend(make_points(steps), FakeThroughput(times), "time", stop={"reason": "budget", "text": "spent"})
    assert any("budget ran out" in b for b in rec.bounded_by)
    # a larger batch size measured but not reached
    rec = recommend(make_points(steps, unreached=(256,)), FakeThroughput(times), "time")
    assert any("B = 256 did not reach it" in b for b in rec.bounded_by)
    # least time at the smallest
    rec = recommend(make_points(steps), FakeThroughput({32: 0.001, 64: 0.01, 128: 0.1}), "time",
                    stop={"reason": "target", "text": "met"})
    assert rec.batch_size == 32 and any("smallest measured" in b for b in rec.bounded_by)
    assert not any("met" in b for b in rec.bounded_by)


def test_nothing_reached_is_a_bounded_answer():
    rec = recommend(make_points({}, unreached=(32, 64)), FakeThroughput(TIMES), "time")
    assert rec.batch_size is None and "no measured batch size (B = 32, 64) reached" in rec.bounded_by[0]
    assert rec.lines()[0].startswith("no recommendation")
    assert check_interval(rec) == (None, None)


def test_bad_input_is_one_line():
    points = make_points(TIME_STEPS)
    with pytest.raises(BatchlabError) as error:
        recommend(points, FakeThroughput(TIMES), "speed")
    assert "'speed'" in str(error.value) and "'time'" in str(error.value) and "'examples'" in str(error.value)
    assert "\n" not in str(error.value)
    with pytest.raises(BatchlabError, match="step time"):
        recommend(points, None, "time")
    with pytest.raises(BatchlabError, match="level"):
        recommend(points, None, "examples", level=1.5)


def test_learning_rate_rule():
    b = [16, 32, 64, 128]
    linear = learning_rate_rule(make_points({x: 1000 for x in b}, lrs={x: 0.001 * x for x in b}))
    assert linear["learning_rate"]["rule"] == "linear" and linear["learning_rate"]["slope"] == pytest.approx(1.0)
    assert linear["effective_learning_rate"] is None and len(linear["table"]) == 4
    root = learning_rate_rule(make_points({x: 1000 for x in b}, lrs={x: 0.01 * math.sqrt(x) for x in b}))
    assert root["learning_rate"]["rule"] == "square root"
    noisy = learning_rate_rule(make_points({x: 1000 for x in b}, lrs=dict(zip(b, [0.1, 0.05, 0.3, 0.02]))))
    assert noisy["learning_rate"]["rule"] == "measured optimum" and noisy["learning_rate"]["low"] is not None
    two = learning_rate_rule(make_points({16: 1000, 32: 600}, lrs={16: 0.1, 32: 0.2}))
    assert two["learning_rate"]["rule"] == "measured optimum" and "at least 3" in two["learning_rate"]["reason"]
    # momentum: the effective rate lr / (1 - momentum) too
    points = make_points({x: 1000 for x in b})
    points.points = [MeasuredPoint(**{**p.to_dict(), "best_hyperparameters": {"learning_rate": 0.1,
                                                                               "momentum": 1 - 0.1 / p.batch_size}})
                     for p in points.points]
    momentum = learning_rate_rule(points)
    assert momentum["effective_learning_rate"]["rule"] == "linear"
    assert momentum["learning_rate"]["slope"] == pytest.approx(0.0, abs=1e-9)


BRANCHED = {"reference": {"batch_size": 32},
            "branched_by_step": [{"step": 100, "examples": 3200, "value": 32, "low": 32, "high": 64},
                                 {"step": 200, "examples": 6400, "value": 64, "low": 64, "high": 128},
                                 {"step": 400, "examples": 12800, "value": 256, "low": 256, "high": None}],
            "warmup_schedule": [[100, 32], [200, 64], [400, 256]]}


def test_warmup_from_a_growing_branched_estimate():
    points = make_points(TIME_STEPS)
    rec = recommend(points, FakeThroughput(TIMES), "time", bracket=BRANCHED)
    assert rec.batch_size == 128
    w = rec.warmup
    assert w["schedule"] == [[0, 32], [6400, 64], [12800, 128]]  # steps x 32, capped at 128, from 0
    s = w["predicted"]
    # by hand: progress 6400 / E(32) then 6400 / E(64), the rest at E(128)
    e = {b: TIME_STEPS[b] * b for b in TIME_STEPS}
    done = 6400 / e[32] + 6400 / e[64]
    assert s["examples"] == pytest.approx(12800 + (1 - done) * e[128])
    assert s["steps"] == pytest.approx(6400 / 32 + 6400 / 64 + (1 - done) * e[128] / 128)
    assert s["examples_saved"] == pytest.approx(e[128] - s["examples"]) and s["examples_saved"] > 0
    assert s["steps_added"] > 0 and s["seconds_added"] is not None
    assert s["saved_fraction_low"] <= s["saved_fraction"] <= s["saved_fraction_high"]
    assert any(line.startswith("batch-size warmup (examples): B = 32 from 0") for line in rec.lines())
    flat = dict(BRANCHED, branched_by_step=[dict(BRANCHED["branched_by_step"][0]),
                                            dict(BRANCHED["branched_by_step"][1], low=48)])
    none, why = warmup_schedule(points, flat, 128)
    assert none is None and "does not grow beyond its intervals" in why
    assert recommend(points, FakeThroughput(TIMES), "time").warmup_reason.startswith("no bracket")


def test_run_phases_stops_at_the_goal():
    # the first phase alone reaches the goal: the rest is not run
    examples, steps, per = _run_phases([[0, 8], [10_000, 64]], {8: 800.0, 64: 6400.0}, 64)
    assert examples == pytest.approx(800.0) and steps == pytest.approx(100.0) and per[64] == 0


def test_steps_and_check_intervals_cover_under_the_scatter_model():
    rng = np.random.default_rng(0)
    theta, k, level, n = 0.4, 4, 0.9, 40_000
    best = rng.exponential(theta, (n, k)).min(axis=1)  # log S = 0
    rerun = rng.exponential(theta, (n, k)).min(axis=1)
    fresh = rng.exponential(theta, n)
    # the rerun's best of K: +- (theta / K) ln(1 / (1 - level)) around the measured best
    c = theta / k * math.log(1 / (1 - level))
    assert np.mean(np.abs(rerun - best) <= c) == pytest.approx(level, abs=0.01)
    # one fresh trial: the check's interval
    lows, highs = zip(*(_check_bounds(math.exp(b), math.exp(b), theta, k, level) for b in best[:5000]))
    inside = (np.exp(fresh[:5000]) >= np.array(lows)) & (np.exp(fresh[:5000]) <= np.array(highs))
    assert inside.mean() == pytest.approx(level, abs=0.02)
    points = make_points({64: 1000}, sd=theta / 4, theta=theta)
    span = steps_interval(points, 64, level)
    assert span["low"] == pytest.approx(950 * math.exp(-c)) and span["high"] == pytest.approx(1000 * math.exp(c))
    no_scatter = make_points({64: 1000}, sd=None)
    assert steps_interval(no_scatter, 64)["method"] == "bracket"
    assert check_interval(no_scatter, 64) == (None, None)


def test_to_dict_round_trip():
    rec = recommend(make_points(TIME_STEPS), FakeThroughput(TIMES), "time", bracket=BRANCHED,
                    stop={"reason": "budget", "text": "spent"})
    data = json.loads(json.dumps(rec.to_dict(), allow_nan=False))
    again = Recommendation.from_dict(data)
    assert again == rec and again.to_dict() == data and data["lines"] == rec.lines()
    low, high = check_interval(again)
    assert low < rec.steps["value"] < high
    assert check_interval(again, level=0.5)[1] < high
    points = make_points(TIME_STEPS)
    assert UnitPoints.from_dict(json.loads(json.dumps(points.to_dict()))).to_dict() == points.to_dict()


# --- one small real store ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    from batchlab.sweep.config import parse_sweep_config
    from batchlab.sweep.executors import InlineExecutor
    from batchlab.sweep.runner import prepare_sweep, run_sweep

    config = parse_sweep_config({"workloads": ["mnist/fc_64_64_64"], "optimizers": ["momentum"],
                                 "batch_sizes": [16, 32, 64], "trials": 3, "steps": 100, "train_examples": 2048,
                                 "seed": 0, "goal": 0.6, "vectorize": "never"})
    path = tmp_path_factory.mktemp("advise") / "store"
    summary = run_sweep(prepare_sweep(config, str(path)), executor_factory=lambda fn, **kw: InlineExecutor(fn))
    return path, summary.sweep_id


def _files(path):
    return sorted((str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*"))


def test_unit_points_reads_the_store_as_analyze_does(tiny_store):
    from batchlab.analysis.bootstrap import critical_batch_size_with_intervals
    from batchlab.analysis.steps_to_result import steps_to_result
    from batchlab.analysis.units import find_units, unit_selection
    from batchlab.store import Store

    path, sweep = tiny_store
    before = _files(path)
    points = unit_points(path, workload="mnist/fc_64_64_64/momentum", sweep=sweep, n_boot=50)
    assert _files(path) == before  # no store writes
    con = Store.open(path).connect()
    try:
        (unit,) = find_units(con)
        results = steps_to_result(con, unit.workload, "val/classification_error", 0.6, studies=unit.study_ids)
        trials, examples = con.execute("SELECT count(*), sum(steps * batch_size) FROM trials").fetchone()
        estimate = critical_batch_size_with_intervals(con, unit_selection(con, unit), n_boot=50).to_dict()
    finally:
        con.close()
    assert points.unit == unit.name and points.goal["goal"] == 0.6
    assert [(p.batch_size, p.steps, p.steps_lower, p.n_trials, p.n_reached, p.best_trial_id) for p in points.points] == [
        (r.batch_size, r.steps, r.steps_lower, r.n_trials, r.n_reached, r.trial_id) for r in results]
    assert [p.best_hyperparameters for p in points.points] == [r.parameters for r in results]
    assert all(p.budget_steps == 100 and p.trials_run == 3 for p in points.points)
    assert points.trials == trials == 9 and points.examples_spent == examples
    assert sum(p.examples_spent for p in points.points) == examples
    assert any(p.reached for p in points.points)
    if estimate is not None and points.estimate is not None:
        named = estimate["critical_batch_sizes"]["mccandlish_b_crit"]
        assert points.b_crit["value"] == pytest.approx(named["value"])
    assert unit_points(path, unit.name, n_boot=50).to_dict() == points.to_dict()
    with pytest.raises(BatchlabError, match="allowed"):
        unit_points(path, "no such unit")
    rec = recommend(points, FakeThroughput({16: 0.01, 32: 0.015, 64: 0.025}), "time")
    assert rec.batch_size in [p.batch_size for p in points.reached]
    assert rec.hyperparameters == points.point(rec.batch_size).best_hyperparameters
    json.dumps(rec.to_dict(), allow_nan=False)
