"""Racing (batchlab.train.race): the rule on scripted trials, and a raced study equals the full one."""

from __future__ import annotations

import json
import math
import random

import pytest

from batchlab.store import Store
from batchlab.train.core import RACED, TrialProgress, evaluate_trials
from batchlab.train.race import Race, Racer, published_keys
from batchlab.train.study import run_study


def test_bound_is_the_keep_th_best_key_and_ties_go_to_the_lower_id():
    race = Race(keep=2)
    assert race.bound is None and race.can_place(99, 10**9)
    race.met(5, 100)
    assert race.bound is None  # one trial met the goal: nothing can be ruled out yet
    race.met(3, 100)
    assert race.bound == (100, 5)
    assert race.can_place(4, 100)  # a tie at step 100 with a lower id than trial 5 still places
    assert not race.can_place(6, 100)  # a tie with a higher id does not
    assert not race.can_place(1, 101)
    race.met(7, 40)
    assert race.bound == (100, 3)  # only ever decreases


def test_a_race_starts_from_published_keys():
    race = Race(keep=2, reached=[(50, 2), (60, 1), (70, 3)])
    assert race.bound == (60, 1)
    with pytest.raises(ValueError):
        Race(keep=0)


def test_earliest_is_the_next_reportable_step():
    racer = Racer(Race(), {0: 1}, [10, 5, 20, 6, 7])
    assert racer.earliest(0) == 5
    assert racer.earliest(7) == 10
    assert racer.earliest(20) is None


def _scripted_run(curves, ids, schedule, goal, racer):
    """Run scripted trials (``curves[k][step]``: the goal metric after ``step`` updates; ``nan`` =
    non-finite) through the core's evaluation bookkeeping, all evaluated at ``schedule``; with
    replay of the bracket at every step in between. Returns each trial's progress."""
    progress = {k: TrialProgress(metric="m", goal=goal, maximize=False, stop_at_goal=True,
                                 total_steps=schedule[-1]) for k in curves}
    last = {k: 0 for k in curves}

    def replay(reached, upto):
        out = {}
        for k in reached:
            rows, found = [], None
            for s in range(last[k] + 1, upto):
                rows.append({"step": s, "m": curves[k][s]})
                if curves[k][s] < goal:
                    found = s
                    break
            out[k] = (rows, found)
        return out

    for step in schedule:
        running = [(k, p) for k, p in progress.items() if not p.stopped]
        if not running:
            break
        evaluate_trials(step, running, lambda k: {"m": curves[k][step]}, replay, racer)
        for k, p in running:
            last[k] = step
            if not p.stopped:
                p.steps = step
    return progress


def _random_study(seed):
    """Eight scripted trials of 60 steps with random rates, offsets, noise and non-finite values,
    rounded so that trials tie at the goal; evaluated at 8 random steps plus 0 and 60."""
    rng = random.Random(seed)
    total = 60
    schedule = sorted({0, total, *rng.sample(range(1, total), 8)})
    curves, ids = {}, {}
    for k in range(8):
        rate = rng.choice([0.0, 0.02, 0.05, 0.1, 0.2])
        level = rng.choice([0.3, 0.5, 1.0])
        curve = [max(0.0, level * math.exp(-rate * s) + rng.choice([0, 0, 0.05])) for s in range(total + 1)]
        if rng.random() < 0.15:  # a non-finite evaluation (INFEASIBLE when it falls on an evaluation)
            curve[rng.randrange(1, total + 1)] = math.nan
        curves[k], ids[k] = [round(v, 2) for v in curve], k + 1  # rounding makes ties at the goal steps
    goal = 0.2
    full = _scripted_run(curves, ids, schedule, goal, None)
    raced = _scripted_run(curves, ids, schedule, goal, Racer(Race(keep=2), ids, list(range(1, total + 1))))
    return ids, full, raced


def test_random_studies_do_race():
    raced_trials = [sum(p.status == RACED for p in _random_study(seed)[2].values()) for seed in range(40)]
    assert sum(n > 0 for n in raced_trials) >= 10, raced_trials


@pytest.mark.parametrize("seed", range(40))
def test_racing_keeps_the_two_best_exact_on_random_curves(seed):
    """Random noisy curves with ties, plateaus and non-finite values: the two best (first step below
    the goal, trial id) are those of the full run, and every raced trial's rows are a prefix of its
    full run's rows, none meeting the goal."""
    ids, full, raced = _random_study(seed)

    def best(progress):
        keys = sorted((p.steps_to_goal, ids[k]) for k, p in progress.items() if p.steps_to_goal is not None)
        return keys[:2]

    assert best(raced) == best(full)
    for k, p in raced.items():
        if p.status == RACED:
            n = len(p.measurements)
            assert p.measurements == full[k].measurements[:n]
            assert p.steps_to_goal is None
            assert full[k].steps_to_goal is None or (full[k].steps_to_goal, ids[k]) > best(full)[-1]
        else:
            assert (p.status, p.steps_to_goal, p.steps_lower, p.measurements) == (
                full[k].status, full[k].steps_to_goal, full[k].steps_lower, full[k].measurements)


SGD_NARROW = {"learning_rate": {"type": "DOUBLE", "min_value": 0.01, "max_value": 1.0, "scale": "LOG_SCALE"}}


def test_a_raced_study_gives_the_full_protocols_answer_for_less_compute(tmp_path, easy_workload):
    results = {}
    for race in (False, True):
        store = Store.open(tmp_path / f"race{race}", create=True)
        # SGD's learning rate over [0.01, 1]: each study searches its own points, and on the default
        # [1e-3, 10] only two of this study's six reach the goal, so racing would rule none out
        results[race] = (store, run_study(easy_workload, "sgd", 32, trials=6, store=store, steps=80,
                                          train_examples=512, seed=0, race=race, search_space=SGD_NARROW))
    (_, full), (store, raced) = results[False], results[True]
    assert full.best is not None
    assert (raced.best.trial_id, raced.best.steps_to_goal, raced.best.steps_lower, raced.best.parameters) == (
        full.best.trial_id, full.best.steps_to_goal, full.best.steps_lower, full.best.parameters)

    def top(trials):
        return sorted((t.steps_to_goal, t.trial_id) for t in trials if t.steps_to_goal is not None)[:2]

    assert top(raced.trials) == top(full.trials)
    statuses = [t.status for t in raced.trials]
    assert RACED in statuses, statuses  # this study does rule trials out
    assert sum(t.steps for t in raced.trials) < sum(t.steps for t in full.trials)
    for r, f in zip(raced.trials, full.trials):
        if r.status == RACED:
            assert r.measurements == f.measurements[:len(r.measurements)]
            assert f.steps_to_goal is None or (f.steps_to_goal, f.trial_id) > top(full.trials)[-1]
        else:
            assert (r.status, r.steps, r.steps_to_goal, r.measurements) == (f.status, f.steps, f.steps_to_goal,
                                                                            f.measurements)
    con = store.connect()
    definition = json.loads(con.execute("select definition from studies").fetchone()[0])
    con.close()
    assert definition["race"] == {"keep": 2}
    sid = con_study_id(store)
    assert sorted(published_keys(store, sid, "val/classification_error", 0.75, False)) == top(raced.trials) + sorted(
        (t.steps_to_goal, t.trial_id) for t in raced.trials if t.steps_to_goal is not None)[2:]


def con_study_id(store) -> str:
    con = store.connect()
    try:
        return con.execute("select distinct study_id from trials").fetchone()[0]
    finally:
        con.close()


def test_racing_needs_stopping_at_the_goal(tmp_path, easy_workload):
    from batchlab.errors import BatchlabError

    with pytest.raises(BatchlabError, match="racing needs trials that stop at the goal"):
        run_study(easy_workload, "sgd", 32, trials=2, store=Store.open(tmp_path / "s", create=True), steps=10,
                  train_examples=512, stop_at_goal=False, race=True)
    assert not any((tmp_path / "s" / "data").rglob("*.parquet"))
