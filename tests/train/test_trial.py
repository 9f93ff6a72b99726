import json

import pytest
import torch

from batchlab.errors import BatchlabError
from batchlab.store import Store
from batchlab.train import TrialSpec, run_trial
from batchlab.train.divergence import DIVERGENCE_FACTOR
from batchlab.workloads import get_workload

FAST = dict(workload="mnist/fc_64_64_64", train_examples=512)
MOMENTUM = {"learning_rate": 0.1, "momentum": 0.9}


def spec(**overrides):
    base = dict(FAST, optimizer="momentum", batch_size=64, hyperparameters=dict(MOMENTUM), steps=30,
                evaluation_steps=[0, 5, 10, 20], stop_at_goal=False)  # whole runs unless a test stops them
    base.update(overrides)
    return TrialSpec(**base)


def test_store_holds_the_trial_its_measurements_and_status(tmp_path):
    store = Store.open(tmp_path / "s", create=True)
    seen = []
    search_space = {"learning_rate": {"type": "DOUBLE", "min_value": 0.01, "max_value": 1.0, "scale": "LOG"}}
    result = run_trial(spec(search_space=search_space), store=store, on_measurement=seen.append)

    assert result.status == "COMPLETE" and result.steps == 30
    assert [m["step"] for m in result.measurements] == [0, 5, 10, 20, 30]  # the budget always ends with one
    assert seen == result.measurements
    assert set(result.measurements[0]) == {
        "step", "train/cross_entropy_error", "train/classification_error",
        "val/cross_entropy_error", "val/classification_error",
    }
    con = store.connect()
    trials = con.execute("select workload, batch_size, trial_id, trial_key, parameters, status, steps, seed from trials").fetchall()
    assert trials == [("mnist/fc_64_64_64/momentum", 64, 1, result.trial_key, json.dumps(MOMENTUM, sort_keys=True), "COMPLETE", 30, 0)]
    assert result.trial_id == 1 and result.workload == "mnist/fc_64_64_64/momentum"
    rows = con.execute("select step, metric, value from measurements order by step, metric").fetchall()
    expected = sorted((m["step"], k, v) for m in result.measurements for k, v in m.items() if k != "step")
    assert rows == expected and len(rows) == 5 * 4
    study = con.execute("select search_space, train_steps, early_stopping from studies").fetchone()
    assert json.loads(study[0]) == search_space and study[1] == 30 and study[2] is False
    assert con.execute("select dataset, model, optimizer from workloads").fetchall() == [("mnist", "fc_64_64_64", "momentum")]
    assert result.trial_key in store.finished_trial_keys()

    second = run_trial(spec(seed=1), store=store)
    assert second.trial_id == 2  # ids per study from store.next_trial_id


def test_same_seed_gives_identical_measurements_and_other_seeds_differ():
    first = run_trial(spec(evaluation_steps=[3, 9]))
    again = run_trial(spec(evaluation_steps=[3, 9]))
    assert first.measurements == again.measurements
    other = run_trial(spec(evaluation_steps=[3, 9], seed=5))
    assert other.measurements != first.measurements
    state = torch.random.get_rng_state()
    run_trial(spec(steps=2, evaluation_steps=[]))
    assert torch.equal(state, torch.random.get_rng_state())  # the caller's RNG is untouched


def test_default_schedule_is_the_workloads(tmp_path):
    result = run_trial(spec(steps=12, evaluation_steps=None))
    assert [m["step"] for m in result.measurements] == get_workload("mnist/fc_64_64_64").evaluation_steps(12)
    assert [m["step"] for m in result.measurements] == list(range(1, 13))  # every step below 1/r = 20
    assert result.resolution == 0.0


def test_goal_only_steps_measure_the_goal_split_and_full_steps_everything():
    result = run_trial(spec(steps=200, evaluation_steps=None, evaluations=4, refine="dense"))
    workload = get_workload("mnist/fc_64_64_64")
    full = set(workload.full_evaluation_steps(200, num_regular=4))
    assert full == {1, 2, 3, 5, 8, 12, 18, 27, 41, 50, 100, 150, 200}
    steps = [m["step"] for m in result.measurements]
    assert steps == workload.evaluation_steps(200, num_regular=4) and set(steps) > full
    bounded = 0
    for row in result.measurements:
        expected = {"step", "val/cross_entropy_error", "val/classification_error"}
        if row["step"] in full:
            expected |= {"train/cross_entropy_error", "train/classification_error"}
        elif "val/classification_error:bound" in row:  # a goal check stopped once decided: the bound alone
            bounded += 1
            expected = {"step", "val/classification_error", "val/classification_error:bound"}
            assert row["val/classification_error:bound"] in (1.0, -1.0)
        assert set(row) == expected
    assert bounded > 0  # the untrained model's error is far above the goal: decided long before the end
    assert 0.04 < result.resolution <= 0.05 + 1e-12


REPLAY_CASES = [
    ("sgd", {"learning_rate": 0.3}),
    ("momentum", {"learning_rate": 0.05, "momentum": 0.9, "learning_rate_decay_steps": 150, "end_learning_rate_factor": 0.1}),
    ("nesterov", {"learning_rate": 0.05, "momentum": 0.9, "warmup_steps": 20}),
    ("adam", {"learning_rate": 0.003}),
    ("lars", {"learning_rate": 0.5, "momentum": 0.9}),
    ("lamb", {"learning_rate": 0.01}),
    ("kfac", {"learning_rate": 0.05, "momentum": 0.9}),
    ("momentum", {"learning_rate": 0.05, "momentum": 0.9, "ema_decay": 0.9}),
    ("adamw", {"learning_rate": 0.003}),
    ("soap", {"learning_rate": 0.003}),
    ("muon", {"learning_rate": 0.02}),
]


@pytest.mark.parametrize("optimizer, hyperparameters", REPLAY_CASES)
def test_replay_refines_the_bracket_like_dense_evaluation(tmp_path, optimizer, hyperparameters, easy_workload, monkeypatch):
    import dataclasses

    from batchlab.workloads import registry

    workload = registry.WORKLOADS[easy_workload]
    monkeypatch.setitem(registry.WORKLOADS, easy_workload, dataclasses.replace(workload, goal=0.5, schedule=dataclasses.replace(workload.schedule, num_regular=4)))
    common = dict(workload=easy_workload, optimizer=optimizer, batch_size=32, hyperparameters=hyperparameters, steps=200,
                  train_examples=512, seed=3, resolution=0.1, stop_at_goal=False)
    dense = run_trial(TrialSpec(**common, refine="dense"))
    store = Store.open(tmp_path / "s", create=True)
    replayed = run_trial(TrialSpec(**common), store=store)
    assert dense.steps_to_goal is not None, (optimizer, dense.measurements[-1])
    # what replay must find: the first resolution step meeting the goal after the last full step that does not
    full = set(get_workload(easy_workload).full_evaluation_steps(200))
    met = {m["step"]: m["val/classification_error"] < 0.5 for m in dense.measurements}
    reaching_full = min(t for t in full if met.get(t))
    previous_full = max([t for t in full if t < reaching_full], default=0)
    expected = min(t for t in met if previous_full < t <= reaching_full and met[t])
    lower = max([t for t in met if t < expected], default=0)
    assert (replayed.steps_to_goal, replayed.steps_lower, replayed.status) == (expected, lower, dense.status)
    if dense.steps_to_goal > previous_full:  # no earlier passage between full steps: the same bracket
        assert (dense.steps_to_goal, dense.steps_lower) == (expected, lower)
    goal_rows = [m["step"] for m in replayed.measurements if m["step"] not in full]
    assert goal_rows == [t for t in sorted(met) if previous_full < t <= expected and t not in full]
    assert replayed.steps == dense.steps
    dense_rows = {m["step"]: m for m in dense.measurements}
    for row in replayed.measurements:  # the replayed copy follows the trial's own trajectory exactly
        assert row == dense_rows[row["step"]]
    stopped = run_trial(TrialSpec(**{**common, "stop_at_goal": True}))
    assert (stopped.status, stopped.steps, stopped.steps_to_goal) == ("STOPPED_AT_GOAL", expected, expected)
    assert stopped.measurements == [m for m in replayed.measurements if m["step"] <= expected]
    rows = store.connect().execute("select count(*) from measurements").fetchone()[0]
    assert rows == sum(len(m) - 1 for m in replayed.measurements)


def test_brackets_contain_the_true_first_passage(monkeypatch):
    """A deterministic trial measured at every step gives the true first passage of a goal; the default
    schedule's bracket (steps_lower, steps_to_goal] must contain it and be at most a factor 1 + r (or
    one step) wide, whenever the metric stays past the goal once it passed it (here the validation
    cross entropy at a small learning rate, which falls almost monotonically). For any metric,
    steps_to_goal is an evaluation where the goal is met and steps_lower one where it is not."""
    import dataclasses

    from batchlab.workloads import registry

    workload = get_workload("mnist/fc_64_64_64")
    smooth = dataclasses.replace(workload, metric="val/cross_entropy_error",
                                 eval_examples={"train": 200, "val": 1000, "test": None})
    monkeypatch.setitem(registry.WORKLOADS, workload.name, smooth)
    base = dict(workload=workload.name, optimizer="sgd", batch_size=32, hyperparameters={"learning_rate": 0.05},
                steps=300, train_examples=1024, seed=2)
    every = run_trial(TrialSpec(**base, evaluation_steps=list(range(1, 301))))
    values = {m["step"]: m["val/cross_entropy_error"] for m in every.measurements}
    clean = set()
    for k in (60, 100, 150, 190, 230, 270):
        goal = max(values[t] for t in range(k, 301)) + 1e-7  # met at every step from k on
        truth = min(t for t, v in values.items() if v < goal)  # the true first passage
        monkeypatch.setitem(registry.WORKLOADS, workload.name, dataclasses.replace(smooth, goal=goal))
        for resolution, refine in ((0.05, "replay"), (0.05, "dense"), (0.2, "replay")):
            result = run_trial(TrialSpec(**base, resolution=resolution, refine=refine))
            for row in result.measurements:  # the same trajectory, measured more sparsely
                assert row["val/cross_entropy_error"] == values[row["step"]]
            lower, upper = result.steps_lower, result.steps_to_goal
            assert truth <= upper and values[upper] < goal and (lower == 0 or values[lower] >= goal)
            assert upper <= max(lower + 1, (1 + resolution) * lower)
            if all(values[t] < goal for t in range(truth, 301)):  # once met, met for good
                assert lower < truth <= upper, (goal, resolution, lower, truth, upper)
                clean.add(truth)
                if k == 230 and refine == "replay" and resolution == 0.05:  # another budget: the same bracket
                    other = run_trial(TrialSpec(**{**base, "steps": 280}, resolution=resolution))
                    assert (other.steps_lower, other.steps_to_goal) == (lower, upper)
                    clean.add("another budget")
    assert "another budget" in clean
    assert len({t for t in clean if t != "another budget" and t > 45}) >= 4, clean  # past the every-step part


def test_stop_at_goal_stops_at_the_first_evaluation_beating_it(tmp_path, easy_workload):
    store = Store.open(tmp_path / "s", create=True)
    every = list(range(2, 61, 2))
    full = run_trial(spec(workload=easy_workload, steps=60, evaluation_steps=every))
    assert full.status == "COMPLETE" and full.steps == 60
    reached = [m["step"] for m in full.measurements if m["val/classification_error"] < 0.75]
    assert reached and full.steps_to_goal == reached[0] < 60

    assert full.steps_lower == full.steps_to_goal - 2  # the evaluation before the reaching one

    stopped = run_trial(spec(workload=easy_workload, steps=60, evaluation_steps=every, stop_at_goal=True), store=store)
    assert stopped.status == "STOPPED_AT_GOAL"  # not COMPLETE: it did not run its budget
    assert stopped.steps == stopped.steps_to_goal == full.steps_to_goal
    assert stopped.steps_lower == full.steps_lower
    assert stopped.measurements == full.measurements[: len(stopped.measurements)]
    assert stopped.measurements[-1]["step"] == stopped.steps_to_goal
    con = store.connect()
    assert con.execute("select status, steps from trials").fetchone() == ("STOPPED_AT_GOAL", stopped.steps)
    early, definition = con.execute("select early_stopping, definition from studies").fetchone()
    assert early is True
    definition = json.loads(definition)
    assert definition["stop_rule"] == {"metric": "val/classification_error", "goal": 0.75, "maximize": False}
    assert definition["evaluation"] == {"rule": "steps", "steps": every}
    assert definition["source"] == "batchlab train" and definition["train_steps"] == 60
    assert definition["workload"] == f"{easy_workload}/momentum" and definition["train_examples"] == 512
    assert con.execute("select max(step) from measurements").fetchone() == (stopped.steps_to_goal,)


def test_stopping_at_the_last_step_is_complete(easy_workload):
    full = run_trial(spec(workload=easy_workload, steps=60, evaluation_steps=[1, 60]))
    assert full.steps_to_goal == 60 and full.steps_lower == 1
    stopped = run_trial(spec(workload=easy_workload, steps=60, evaluation_steps=[1, 60], stop_at_goal=True))
    assert (stopped.status, stopped.steps) == ("COMPLETE", 60)  # it ran its whole budget


def test_default_study_definition_and_a_given_one(tmp_path):
    from batchlab.store.studies import make_study_definition, study_id

    store = Store.open(tmp_path / "s", create=True)
    result = run_trial(spec(evaluation_steps=None, steps=30, resolution=0.1, data_seed=4), store=store)
    assert result.study_definition["evaluation"] == {"rule": "geometric", "resolution": 0.1, "refine": "replay"}
    assert result.study_definition["stop_rule"] is None and result.study_definition["seed"] == 4
    given = make_study_definition(workload="mnist/fc_64_64_64/momentum", batch_size=64, train_steps=30,
                                  evaluation={"rule": "geometric", "resolution": 0.1}, source="test", sweep="abc")
    run_trial(spec(evaluation_steps=None, steps=30, resolution=0.1, study_definition=given, seed=1), store=store)
    con = store.connect()
    ids = dict(con.execute("select trial_id, study_id from trials").fetchall())
    assert ids == {1: study_id(result.study_definition), 2: study_id(given)}


def test_huge_learning_rate_is_infeasible_and_recorded(tmp_path):
    store = Store.open(tmp_path / "s", create=True)
    result = run_trial(spec(optimizer="sgd", hyperparameters={"learning_rate": 1e4}, evaluation_steps=[0, 1, 2, 3, 30]), store=store)
    assert result.status == "INFEASIBLE"
    assert result.steps < 30
    assert result.steps_to_goal is None
    assert [m["step"] for m in result.measurements] == [s for s in (0, 1, 2, 3) if s < result.steps]
    con = store.connect()
    assert con.execute("select status, steps from trials").fetchone() == ("INFEASIBLE", result.steps)
    assert con.execute("select count(distinct step) from measurements").fetchone() == (len(result.measurements),)


def test_slowly_exploding_loss_is_infeasible_too():
    # Adam at learning rate 10 keeps the loss finite for a while but far above its start.
    result = run_trial(spec(optimizer="adam", hyperparameters={"learning_rate": 10.0}, steps=40, evaluation_steps=[]))
    assert result.status == "INFEASIBLE"
    assert result.steps < 40
    assert DIVERGENCE_FACTOR == 10.0


def test_eval_budget_thins_the_schedule_and_keeps_the_format(tmp_path):
    store = Store.open(tmp_path / "s", create=True)
    full = run_trial(spec(steps=60, evaluation_steps=None, batch_size=16, refine="dense"))
    budgeted = run_trial(spec(steps=60, evaluation_steps=None, batch_size=16, eval_budget=0.5, refine="dense"), store=store)
    default_steps = [m["step"] for m in full.measurements]
    steps = [m["step"] for m in budgeted.measurements]
    assert steps[-1] == 60 and set(steps) < set(default_steps)
    full_rows = [m for m in budgeted.measurements if "train/cross_entropy_error" in m]
    goal_rows = [m for m in budgeted.measurements if "train/cross_entropy_error" not in m]
    assert full_rows and goal_rows and full_rows[-1]["step"] == 60
    assert all(set(m) == set(full.measurements[0]) for m in full_rows)
    assert all(set(m) == {"step", "val/cross_entropy_error", "val/classification_error"} for m in goal_rows)
    assert budgeted.steps == full.steps and budgeted.status == full.status
    assert budgeted.resolution > full.resolution  # the budget coarsened the resolution steps
    # the shared steps measure the same model; only the evaluation subsets differ
    assert store.table("measurements").num_rows == 4 * len(full_rows) + 2 * len(goal_rows)


def test_train_eval_examples_only_changes_train_metrics():
    full = run_trial(spec(steps=10, evaluation_steps=[10]))
    small = run_trial(spec(steps=10, evaluation_steps=[10], train_eval_examples=100))
    (a,), (b,) = full.measurements, small.measurements
    assert a["val/cross_entropy_error"] == b["val/cross_entropy_error"]
    assert a["train/cross_entropy_error"] != b["train/cross_entropy_error"]
    assert (b["train/classification_error"] * 100) % 1 == pytest.approx(0, abs=1e-9)  # on 100 examples


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (dict(workload="mnist/fc_64"), "did you mean 'mnist/fc_64_64_64'"),
        (dict(optimizer="momentun"), "did you mean 'momentum'"),
        (dict(batch_size=0), "batch size must be >= 1"),
        (dict(batch_size=513), "batch size 513 is out of range; allowed: 1 to 512"),
        (dict(hyperparameters={"learning_rate": 0.0}), "learning rate must be > 0"),
        (dict(hyperparameters={"learning_rate": -1.0}), "learning rate must be > 0"),
        (dict(hyperparameters={"learning_rate": 0.1, "momentum": 1.5}), "momentum"),
        (dict(hyperparameters={"learning_rate": 0.1, "label_smoothing": 0.95}), "label_smoothing"),
        (dict(evaluation_steps=[31]), "evaluation step 31 is out of range"),
        (dict(steps=0), "steps must be >= 1"),
        (dict(eval_budget=0.0, evaluation_steps=None), "evaluation budget must be a number > 0"),
        (dict(eval_budget=0.1), "either an evaluation budget or explicit evaluation steps"),
        (dict(train_eval_examples=0), "train eval examples must be >= 1"),
    ],
)
def test_bad_input_raises_one_line_and_writes_nothing(tmp_path, overrides, fragment):
    store = Store.open(tmp_path / "s", create=True)
    with pytest.raises(BatchlabError, match=fragment) as err:
        run_trial(spec(**overrides), store=store)
    assert "\n" not in str(err.value)
    assert store.table("trials").num_rows == 0 and store.pending_headers() == []


def test_bounded_goal_checks_are_stored_flagged_and_read_as_bounds(tmp_path):
    """Dense goal-only steps are goal checks: far from the goal (val error < 0.03) each pass stops once
    the errors counted exceed what the goal allows; the store keeps that lower bound with its flag row
    (and not the split's other metrics), and steps to result read from the store agrees with the trial."""
    from batchlab.analysis.steps_to_result import steps_to_result

    store = Store.open(tmp_path / "s", create=True)
    result = run_trial(spec(steps=40, evaluation_steps=None, evaluations=2, refine="dense"), store=store)
    con = store.connect()
    flags = dict(con.execute("select step, value from measurements where metric = 'val/classification_error:bound'").fetchall())
    values = dict(con.execute("select step, value from measurements where metric = 'val/classification_error'").fetchall())
    losses = {s for (s,) in con.execute("select step from measurements where metric = 'val/cross_entropy_error'").fetchall()}
    assert flags and set(flags.values()) == {1.0}  # lower bounds: the goal was not met there
    assert all(values[step] >= 0.03 for step in flags) and not set(flags) & losses
    row = steps_to_result(con, "mnist/fc_64_64_64/momentum", "val/classification_error", 0.03)[0]
    con.close()
    assert result.steps_to_goal is None and row.steps is None
    assert result.final_metric() == values[40]  # the last full evaluation, never a bound


@pytest.mark.parametrize("refine", ["replay", "dense"])
def test_a_goal_met_before_any_update_is_zero_steps_and_the_first_bracket_starts_after_step_0(refine, monkeypatch):
    """The initial model is checked once the goal is first met in the first bracket (a replayed goal
    check of the kept initial state): a goal it already meets is steps to result 0 (it used to read
    ``(0, 1]``, excluding the true first passage), and a goal met later in that bracket has a recorded
    miss at step 0 as its lower end."""
    import dataclasses

    from batchlab.workloads import registry

    base = get_workload("mnist/fc_64_64_64")
    # seed 0 at learning rate 0.5: the first update lowers the validation error from ~0.90 to ~0.82
    common = dict(workload=base.name, optimizer="sgd", batch_size=32, hyperparameters={"learning_rate": 0.5},
                  steps=40, train_examples=512, seed=0, refine=refine)
    every = run_trial(TrialSpec(**common, evaluation_steps=list(range(0, 41)), stop_at_goal=False))
    values = {m["step"]: m["val/classification_error"] for m in every.measurements}
    at_init = values[0]
    # goal met at step 0 already (and at the first evaluation, step 1, which then finds step 0)
    monkeypatch.setitem(registry.WORKLOADS, base.name, dataclasses.replace(base, goal=max(at_init, values[1]) + 1e-6))
    met = run_trial(TrialSpec(**common))
    assert (met.status, met.steps, met.steps_to_goal, met.steps_lower) == ("STOPPED_AT_GOAL", 0, 0, 0)
    assert [m["step"] for m in met.measurements] == [0]
    # a goal first met after step 0 and at or before the first evaluation (step 1): (0, 1] with 0 measured
    later = values[1]
    assert later < at_init - 0.02  # the first update lowered the error: a goal between the two is met first at step 1
    goal = (later + at_init) / 2
    monkeypatch.setitem(registry.WORKLOADS, base.name, dataclasses.replace(base, goal=goal))
    first = run_trial(TrialSpec(**common))
    assert (first.steps_to_goal, first.steps_lower) == (1, 0)
    zero = [m for m in first.measurements if m["step"] == 0]
    assert len(zero) == 1 and not zero[0]["val/classification_error"] < goal
    # a goal never met at the first evaluations measures nothing at step 0
    monkeypatch.setitem(registry.WORKLOADS, base.name, dataclasses.replace(base, goal=min(values.values()) + 1e-6))
    late = run_trial(TrialSpec(**common))
    assert late.steps_to_goal is not None and late.steps_to_goal > 1
    assert 0 not in [m["step"] for m in late.measurements]
