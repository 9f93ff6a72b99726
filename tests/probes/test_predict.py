"""batchlab.probes.predict on a tiny linear-regression workload (defined here, referenced as
``tests/probes/test_predict.py:linear_workload``) beside a tiny synthetic store."""

import math
from pathlib import Path

import pytest
import torch

from batchlab.errors import BatchlabError

HERE = Path(__file__).resolve()
WORKLOAD = f"{HERE}:linear_workload"
STORE_WORKLOAD = "synthetic/linear"


def _loss(outputs, targets):
    return 0.5 * (outputs.reshape(-1) - targets).square().mean()


def linear_workload():
    """8 -> 1 linear regression on 512 Gaussian examples (a loss torch.func can differentiate twice)."""
    from batchlab.workloads import Workload
    from batchlab.workloads.tasks import custom_task, regression_sums

    def data():
        g = torch.Generator().manual_seed(7)
        x = torch.randn(640, 8, generator=g)
        y = x @ torch.linspace(-1, 1, 8) + 0.3 * torch.randn(640, generator=g)
        return {"train": (x[:512], y[:512]), "val": (x[512:], y[512:])}

    return Workload(name=STORE_WORKLOAD, summary="linear regression", make_model=lambda: torch.nn.Linear(8, 1),
                    data=data, task=custom_task(_loss, regression_sums, "regression", ("mse", "mae"), "mse"),
                    metric="val/mse", goal=0.1, default_steps=40, default_batch_size=32)


def _store(tmp_path, optimizer="sgd"):
    from tests.report.report_fixtures import publish, unit_trials

    return publish(tmp_path / "store", unit_trials(f"{STORE_WORKLOAD}/{optimizer}", [8, 16, 32, 64, 128], b_crit=32,
                                                   trials=4))


FAST = {"steps_at": 5, "examples": 64, "batch_size": 32, "learning_rate": 0.05, "k": 3, "lanczos_steps": 5,
        "probes": 1, "device": "cpu"}


def test_predict_beside_a_store_gives_ratios_and_compute(tmp_path):
    from batchlab.probes.predict import PREDICTORS, predict

    store = _store(tmp_path)
    result = predict(WORKLOAD, "sgd", store=store, n_boot=20, **FAST)
    (measured,) = result["measured"]
    assert measured["b_crit"] is not None and (measured["low"] is None or measured["low"] <= measured["b_crit"])
    assert measured["trials"] == 20 and measured["sweep_examples"] > 0
    names = [r["predictor"] for r in result["rows"]]
    assert names == [p for p in PREDICTORS if p != "b_simple_adam"]
    for row in result["rows"]:
        assert {"critical_batch_size", "low", "high", "measured", "ratio", "ratio_low", "ratio_high", "examples",
                "sweep_examples", "compute_fraction", "unit", "note"} <= set(row)
        assert row["measured"] == measured["b_crit"]
        if row["kind"] == "point":  # a bound (an interval open on one side) is never a point: no ratio
            assert row["ratio"] == pytest.approx(row["critical_batch_size"] / measured["b_crit"])
        else:
            assert row["ratio"] is None
        if row["examples"] is not None:
            assert row["compute_fraction"] == pytest.approx(row["examples"] / measured["sweep_examples"])
    by = {r["predictor"]: r for r in result["rows"]}
    assert by["b_simple"]["critical_batch_size"] > 0 and by["b_simple"]["examples"] == 32 * 5 + 64
    assert by["b_noise"]["examples"] > by["b_simple"]["examples"]
    assert by["calibrated_nqm"]["critical_batch_size"] is not None, by["calibrated_nqm"]["note"]
    assert by["calibrated_nqm"]["examples"] > by["b_simple"]["examples"]
    assert "problem" in result["calibrated"] and result["calibrated"]["curve"]["nqm_algorithm"] == "sgd"
    assert by["branched"]["critical_batch_size"] is not None or "absent" in by["branched"]["note"]


def test_store_without_the_workload_fails_before_training(tmp_path):
    from batchlab.probes.predict import predict

    store = _store(tmp_path, optimizer="adam")
    with pytest.raises(BatchlabError, match="no trials of workload 'synthetic/linear/sgd'.*synthetic/linear/adam"):
        predict(WORKLOAD, "sgd", store=store, **FAST)


def test_unknown_optimizer_is_one_line():
    from batchlab.probes.predict import predict

    with pytest.raises(BatchlabError) as info:
        predict(WORKLOAD, "sgdd", **FAST)
    assert "\n" not in str(info.value)


def test_without_store_only_predictions(tmp_path):
    from batchlab.probes.predict import predict

    result = predict(WORKLOAD, "sgd", branched=False, **FAST)
    assert result["measured"] == []
    assert all(r["ratio"] is None and r["measured"] is None for r in result["rows"])
    by = {r["predictor"]: r for r in result["rows"]}
    assert "skipped" in by["branched"]["note"] and math.isfinite(by["b_simple"]["critical_batch_size"])


def test_several_units_are_each_measured_or_chosen_by_study(tmp_path):
    from batchlab.probes.predict import measured_units
    from tests.report.report_fixtures import publish, unit_trials

    store = tmp_path / "store"
    for offset, sweep in ((0, "aaaaaaaaaaaa"), (10, "bbbbbbbbbbbb")):
        trials = unit_trials(f"{STORE_WORKLOAD}/sgd", [8, 32, 128], b_crit=32, trials=3)
        publish(store, [{**t, "trial_id": t["trial_id"] + offset} for t in trials], sweep=sweep)
    both = measured_units(store, f"{STORE_WORKLOAD}/sgd", n_boot=10)
    assert [m["group"] for m in both] == ["sweep aaaaaaaaaaaa", "sweep bbbbbbbbbbbb"]
    assert all(m["trials"] == 9 and m["sweep_examples"] > 0 for m in both)
    (one,) = measured_units(store, f"{STORE_WORKLOAD}/sgd", "bbbbbbbbbbbb", n_boot=10)
    assert one["group"] == "sweep bbbbbbbbbbbb" and one["sweep_examples"] == both[1]["sweep_examples"]
    with pytest.raises(BatchlabError, match="matches --unit 'zzz'"):
        measured_units(store, f"{STORE_WORKLOAD}/sgd", "zzz")


def _with_train_loss(trials, loss):
    """``trials`` with ``train/cross_entropy_error`` recorded at every row: ``loss`` at the last row of a
    trial that stopped at the goal, 10x that before."""
    out = []
    for t in trials:
        last = len(t["rows"]) - 1
        rows = [(s, {**v, "train/cross_entropy_error": loss * (1 if i == last and t["status"] == "STOPPED_AT_GOAL"
                                                                 else 10)}) for i, (s, v) in enumerate(t["rows"])]
        out.append({**t, "rows": rows})
    return out


def test_goal_training_loss_is_the_median_at_the_goal_of_trials_that_met_it(tmp_path):
    from batchlab.probes.predict import goal_training_loss, matched_target, measured_units
    from batchlab.store import Store
    from tests.report.report_fixtures import publish, unit_trials

    trials = unit_trials(f"{STORE_WORKLOAD}/sgd", [8, 16, 32, 64, 128], b_crit=32, trials=4)
    reached = sum(t["status"] == "STOPPED_AT_GOAL" for t in trials)
    store = publish(tmp_path / "store", _with_train_loss(trials, 0.04))
    con = Store.open(store, create=False).connect()
    try:
        assert goal_training_loss(con, f"{STORE_WORKLOAD}/sgd") == (pytest.approx(0.04), reached)
        assert goal_training_loss(con, f"{STORE_WORKLOAD}/adam") == (None, 0)
    finally:
        con.close()
    (unit,) = measured_units(store, f"{STORE_WORKLOAD}/sgd", n_boot=5)
    assert unit["goal_train_loss"] == pytest.approx(0.04) and unit["goal_train_trials"] == reached
    fraction, words = matched_target(0.5, [unit])
    assert fraction == pytest.approx(0.04 / 0.5) and "matched" in words
    assert matched_target(0.03, [unit])[0] is None  # the checkpoint is already below the goal's loss
    assert matched_target(0.5, [{"goal_train_loss": None}])[0] is None


def test_predict_matches_the_calibrated_target_to_the_store_unless_given(tmp_path):
    from batchlab.probes.predict import predict
    from tests.report.report_fixtures import publish, unit_trials

    trials = unit_trials(f"{STORE_WORKLOAD}/sgd", [8, 16, 32, 64, 128], b_crit=32, trials=4)
    store = publish(tmp_path / "store", _with_train_loss(trials, 0.01))
    matched = predict(WORKLOAD, "sgd", store=store, n_boot=5, branched=False, **FAST)["settings"]
    assert matched["target_rule"] == "matched"
    assert matched["target_fraction"] == pytest.approx(0.01 / matched["probe_loss"])
    given = predict(WORKLOAD, "sgd", store=store, n_boot=5, branched=False, target_fraction=0.2, **FAST)
    assert given["settings"]["target_rule"] == "given" and given["settings"]["target_fraction"] == 0.2
    plain = predict(WORKLOAD, "sgd", store=_store(tmp_path / "plain"), n_boot=5, branched=False, **FAST)
    assert plain["settings"]["target_rule"] == "default" and plain["settings"]["target_fraction"] == 0.01
    note = next(r["note"] for r in plain["rows"] if r["predictor"] == "calibrated_nqm")
    assert "not matched" in note and "train/cross_entropy_error" in note


def test_reference_run_uses_the_tuned_hyperparameters_of_the_nearest_measured_batch_size(tmp_path):
    """The scoring protocol's reference run: with a store and no --learning-rate, the best trial's
    hyperparameters at the measured batch size nearest the reference one in log B (here B=32 itself;
    B=24 lies nearer 32 than 16 in log B), recorded with where they came from."""
    from batchlab.probes.predict import measured_units, predict, tuned_reference

    store = _store(tmp_path)
    (unit,) = measured_units(store, f"{STORE_WORKLOAD}/sgd", n_boot=5)
    assert [t["batch_size"] for t in unit["tuned"]] == [8, 16, 32, 64, 128]
    assert all(set(t["hyperparameters"]) == {"learning_rate"} for t in unit["tuned"])
    at_32 = next(t for t in unit["tuned"] if t["batch_size"] == 32)
    # the fixture's fastest trial at B=32: learning rate 10^-0.5 * 1.04, the nearest of its grid to its optimum 0.2
    assert at_32["hyperparameters"]["learning_rate"] == pytest.approx(10 ** -0.5 * 1.04)
    assert tuned_reference([unit], 24)["from_batch_size"] == 32 and tuned_reference([unit], 20)["from_batch_size"] == 16
    assert tuned_reference([{"tuned": []}], 32) is None
    fast = {k: v for k, v in FAST.items() if k != "learning_rate"}
    settings = predict(WORKLOAD, "sgd", store=store, n_boot=5, branched=False, **fast)["settings"]
    reference = settings["reference"]
    assert reference["rule"] == "tuned" and reference["from_batch_size"] == 32
    assert reference["from_trial"] == at_32["trial_id"] and reference["unit"] == unit["unit"]
    assert settings["hyperparameters"] == at_32["hyperparameters"]
    assert reference["learning_rate"] == at_32["hyperparameters"]["learning_rate"] != 0.1  # not SGD's default
    assert settings["protocol_steps_at"] == 10 and settings["checkpoint_rule"] == "given"
    assert settings["default_batch_size"] == 32
    plain = predict(WORKLOAD, "sgd", branched=False, **fast)["settings"]
    assert plain["reference"] == {"rule": "default", "learning_rate": 0.1, "reason": "no store"}
    given = predict(WORKLOAD, "sgd", branched=False, **FAST)["settings"]["reference"]
    assert given["rule"] == "given" and given["learning_rate"] == 0.05
