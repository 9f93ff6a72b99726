"""The training core: the per-trial bookkeeping state machine, the replay driver and the loop."""

import math

import pytest
import torch

from batchlab.train.core import (
    RACED,
    COMPLETE,
    INFEASIBLE,
    STOPPED_AT_GOAL,
    TrialProgress,
    batch_source,
    device_split,
    evaluate_trials,
    replay_bracket,
    train_loop,
)
from batchlab.workloads.data import TensorSplit

METRIC = "val/error"


def progress(stop_at_goal=False, total=100, seen=None):
    return TrialProgress(metric=METRIC, goal=0.5, maximize=False, stop_at_goal=stop_at_goal, total_steps=total,
                         on_record=None if seen is None else seen.append)


def feed(trial, rows):
    """Evaluations without replay: {step: error}; returns the steps whose evaluation met the goal first."""
    first = []
    for step, error in rows.items():
        if trial.stopped:
            break
        if trial.evaluated(step, {METRIC: error, "val/loss": 1.0}):
            first.append(step)
            trial.settle_goal()
    return first


def test_goal_met_without_replay_brackets_with_the_previous_evaluation():
    seen = []
    trial = progress(seen=seen)
    assert feed(trial, {0: 0.9, 10: 0.7, 20: 0.4, 30: 0.3}) == [20]  # only the first meeting counts
    assert (trial.status, trial.steps_to_goal, trial.steps_lower, trial.stopped) == (COMPLETE, 20, 10, False)
    assert [m["step"] for m in trial.measurements] == [0, 10, 20, 30] and seen == trial.measurements
    trial.finish(100)
    assert trial.steps == 100


def test_stop_at_goal_before_the_budget_and_at_the_last_step():
    early = progress(stop_at_goal=True)
    feed(early, {10: 0.7, 20: 0.4, 30: 0.3})
    early.finish(20)
    assert (early.status, early.steps, early.steps_to_goal, early.steps_lower) == (STOPPED_AT_GOAL, 20, 20, 10)
    assert [m["step"] for m in early.measurements] == [10, 20]
    last = progress(stop_at_goal=True, total=30)
    feed(last, {10: 0.7, 30: 0.4})
    assert (last.status, last.stopped, last.steps_to_goal) == (COMPLETE, True, 30)  # it ran its whole budget


def test_non_finite_evaluation_is_recorded_and_infeasible():
    trial = progress()
    feed(trial, {10: 0.7, 20: math.nan, 30: 0.1})
    assert trial.status == INFEASIBLE and trial.stopped and [m["step"] for m in trial.measurements] == [10, 20]
    assert trial.steps_to_goal is None and trial.steps_lower is None
    diverged = progress()
    diverged.diverged()
    assert (diverged.status, diverged.stopped, diverged.searching) == (INFEASIBLE, True, False)


@pytest.mark.parametrize("stop_at_goal", [False, True])
def test_replayed_rows_refine_the_bracket(stop_at_goal):
    trial = progress(stop_at_goal=stop_at_goal)
    feed(trial, {10: 0.7})
    assert trial.evaluated(20, {METRIC: 0.4})
    assert trial.measurements[-1]["step"] == 10  # the goal-meeting row waits for the replay
    trial.settle_goal([{"step": 12, METRIC: 0.6}, {"step": 14, METRIC: 0.45}], 14)
    assert (trial.steps_to_goal, trial.steps_lower) == (14, 12)
    if stop_at_goal:  # stopped at the replayed step; the live run's row at 20 is discarded
        trial.finish(20)
        assert (trial.status, trial.steps, [m["step"] for m in trial.measurements]) == (STOPPED_AT_GOAL, 14, [10, 12, 14])
    else:
        assert trial.status == COMPLETE and [m["step"] for m in trial.measurements] == [10, 12, 14, 20]
    unrefined = progress()
    feed(unrefined, {10: 0.7})
    unrefined.evaluated(20, {METRIC: 0.4})
    unrefined.settle_goal([{"step": 12, METRIC: 0.6}, {"step": 14, METRIC: 0.55}], None)  # not met inside
    assert (unrefined.steps_to_goal, unrefined.steps_lower) == (20, 14)


def test_replay_bracket_advances_once_per_step_and_stops_each_trial_at_its_goal():
    a, b, c = progress(), progress(), progress()
    errors = {"a": {12: 0.6, 14: 0.4, 17: 0.3}, "b": {12: 0.45}, "c": {12: 0.7, 14: math.inf, 17: 0.1}}
    advanced, measured = [], []

    def measure(key, step):
        measured.append((key, step))
        return {METRIC: errors[key][step]}

    found = replay_bracket({"a": a, "b": b, "c": c}, [12, 14, 17], 10, advanced.append, measure)
    assert advanced == [10, 11, 12, 13]  # until every trial stopped searching (at 14)
    assert measured == [("a", 12), ("b", 12), ("c", 12), ("a", 14), ("c", 14)]
    assert found["a"] == ([{"step": 12, METRIC: 0.6}, {"step": 14, METRIC: 0.4}], 14)
    assert found["b"] == ([{"step": 12, METRIC: 0.45}], 12)
    assert found["c"][1] is None and [r["step"] for r in found["c"][0]] == [12, 14]  # non-finite: stops, not met
    assert replay_bracket({"a": progress()}, [], 10, advanced.append, measure) == {"a": ([], None)}


def test_evaluate_trials_replays_only_the_trials_that_first_meet_the_goal():
    trials = {0: progress(), 1: progress(), 2: progress()}
    metrics = {0: {METRIC: 0.4}, 1: {METRIC: 0.9}, 2: {METRIC: 0.3}}
    calls = []

    def replay(reached, step):
        calls.append((sorted(reached), step))
        return {0: ([{"step": 5, METRIC: 0.45}], 5)}

    evaluate_trials(8, trials.items(), metrics.__getitem__, replay)
    assert calls == [([0, 2], 8)]
    assert (trials[0].steps_to_goal, trials[2].steps_to_goal, trials[1].steps_to_goal) == (5, 8, None)
    evaluate_trials(9, trials.items(), lambda key: {METRIC: 0.1}, replay)  # only trial 1 is new
    assert calls[-1] == ([1], 9)
    no_replay = progress()
    evaluate_trials(3, [("x", no_replay)], lambda key: {METRIC: 0.1}, None)
    assert no_replay.steps_to_goal == 3


def test_train_loop_runs_updates_and_scheduled_evaluations():
    events = []

    def update(step):
        events.append(("update", step))
        return False

    def evaluate(step):
        events.append(("eval", step))
        return False

    assert train_loop(3, [0, 2, 3], update, evaluate) == 3
    assert events == [("eval", 0), ("update", 0), ("update", 1), ("eval", 2), ("update", 2), ("eval", 3)]
    events.clear()
    assert train_loop(5, [1, 2, 5], update, lambda step: events.append(("eval", step)) or step == 2) == 2
    assert events[-1] == ("eval", 2)
    events.clear()
    diverge = train_loop(5, [1, 2, 5], lambda step: step == 1, evaluate)  # diverged in update 1: no evaluation at 2
    assert diverge == 2 and events == [("eval", 1)]
    assert train_loop(4, [0], update, lambda step: True) == 0  # stopped by the evaluation before any update


def test_batches_on_the_cpu_are_the_splits_own():
    split = TensorSplit(torch.arange(20.0).reshape(10, 2), torch.arange(10))
    cpu = torch.device("cpu")
    assert device_split(split, cpu) is split
    x, y = batch_source(split, cpu)(torch.tensor([3, 1]))
    assert torch.equal(x, torch.tensor([[6.0, 7.0], [2.0, 3.0]])) and torch.equal(y, torch.tensor([3, 1]))


def test_the_statuses_a_trial_ends_with_are_the_stores():
    from batchlab.store.schema import DEFAULT_ANALYSIS_STATUSES, STATUSES

    assert {COMPLETE, STOPPED_AT_GOAL, INFEASIBLE, RACED} <= set(STATUSES)
    # what best_trial ranks, plus RACED trials, which never met the goal (the analysis reads them as unknown)
    assert set(DEFAULT_ANALYSIS_STATUSES) == {COMPLETE, STOPPED_AT_GOAL, RACED}
