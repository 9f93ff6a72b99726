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
                evaluation_steps=[0, 5, 10, 20])
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


def test_stop_at_goal_stops_at_the_first_evaluation_beating_it(tmp_path, easy_workload):
    store = Store.open(tmp_path / "s", create=True)
    every = list(range(2, 61, 2))
    full = run_trial(spec(workload=easy_workload, steps=60, evaluation_steps=every))
    assert full.status == "COMPLETE" and full.steps == 60
    reached = [m["step"] for m in full.measurements if m["val/classification_error"] < 0.75]
    assert reached and full.steps_to_goal == reached[0] < 60

    stopped = run_trial(spec(workload=easy_workload, steps=60, evaluation_steps=every, stop_at_goal=True), store=store)
    assert stopped.status == "COMPLETE"
    assert stopped.steps == stopped.steps_to_goal == full.steps_to_goal
    assert stopped.measurements == full.measurements[: len(stopped.measurements)]
    assert stopped.measurements[-1]["step"] == stopped.steps_to_goal
    con = store.connect()
    assert con.execute("select status, steps from trials").fetchone() == ("COMPLETE", stopped.steps)
    assert con.execute("select early_stopping from studies").fetchone() == (True,)
    assert con.execute("select max(step) from measurements").fetchone() == (stopped.steps_to_goal,)


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
    full = run_trial(spec(steps=60, evaluation_steps=None, batch_size=16))
    budgeted = run_trial(spec(steps=60, evaluation_steps=None, batch_size=16, eval_budget=0.5), store=store)
    default_steps = [m["step"] for m in full.measurements]
    steps = [m["step"] for m in budgeted.measurements]
    assert steps[-1] == 60 and set(steps) < set(default_steps)
    assert [set(m) for m in budgeted.measurements] == [set(full.measurements[0])] * len(steps)
    assert budgeted.steps == full.steps and budgeted.status == full.status
    # the shared steps measure the same model; only the evaluation subsets differ
    assert store.table("measurements").num_rows == 4 * len(steps)


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
