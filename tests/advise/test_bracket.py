"""advise's first bracket of the critical batch size (batchlab.advise.bracket): the widening arithmetic,
snapping and clipping, --bracket parsing, the measured error constants against the committed scores, and
one real measurement on a tiny MNIST setting."""

import json
import math
from pathlib import Path

import pytest

from batchlab.advise.bracket import (
    MEASURED_ERROR,
    Bracket,
    bracket_from_readings,
    given_bracket,
    predictor_bracket,
    snap_to_candidates,
    widen,
)
from batchlab.errors import BatchlabError

ROOT = Path(__file__).resolve().parents[2]
CANDIDATES = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]


def reading(name, kind, value, factor, note=""):
    return {"name": name, "kind": kind, "value": value, "low": None, "high": None, "error_factor": factor,
            "note": note}


# ------------------------------------------------------------------------------------------- constants


def test_measured_error_is_the_worst_point_ratio_of_the_committed_scores():
    rows = {}
    for line in (ROOT / "experiments/predictions/scores.jsonl").read_text().splitlines():
        row = json.loads(line)
        if not row["baseline"]:
            rows[row["predictor"]] = row
    assert set(MEASURED_ERROR) == {"b_simple", "branched"}
    for name, factor in MEASURED_ERROR.items():
        ratios = [u["ratio"] for u in rows[name]["units"] if u["kind"] == "point" and u["ratio"] is not None]
        assert ratios, name
        assert factor == pytest.approx(max(max(r, 1 / r) for r in ratios), rel=1e-12), (
            f"{name}: experiments/predictions/scores.jsonl was re-scored; update MEASURED_ERROR")
    assert 7.2 < MEASURED_ERROR["b_simple"] < 7.3 and 5.5 < MEASURED_ERROR["branched"] < 5.6


# ------------------------------------------------------------------------------------------- widening


def test_widen_points_bounds_and_none():
    assert widen("point", 200.0, 4.0) == pytest.approx((50.0, 800.0))
    assert widen("lower_bound", 300.0, 3.0) == (pytest.approx(100.0), math.inf)
    assert widen("upper_bound", 100.0, 2.0) == (0.0, pytest.approx(200.0))
    assert widen("none", None, 2.0) == (None, None)
    assert widen("point", 64.0, 1.0) == (64.0, 64.0)
    with pytest.raises(BatchlabError, match="kind"):
        widen("interval", 1.0, 2.0)
    with pytest.raises(BatchlabError, match="error factor"):
        widen("point", 1.0, 0.5)
    with pytest.raises(BatchlabError, match="value > 0"):
        widen("point", 0.0, 2.0)


def test_point_only_is_snapped_outward_without_clipping():
    b = bracket_from_readings([reading("b_simple", "point", 200.0, 2.0)], CANDIDATES, 4096)
    # [100, 400] -> the largest candidate <= 100 and the smallest >= 400
    assert (b.low, b.high, b.source, b.clipped_by) == (64, 512, "predictors", None)
    (p,) = b.predictors
    assert p["widened_low"] == pytest.approx(100.0) and p["widened_high"] == pytest.approx(400.0)


def test_hull_of_a_point_and_a_lower_bound_is_clipped_by_memory():
    readings = [reading("b_simple", "point", 200.0, 2.0), reading("branched", "lower_bound", 300.0, 3.0)]
    b = bracket_from_readings(readings, CANDIDATES, 2048)
    assert (b.low, b.high) == (64, 2048)  # hull [100, inf) within [16, 2048]
    assert b.clipped_by == "memory: largest fitting batch 2048"
    assert b.predictors[1]["widened_high"] is None and b.predictors[1]["widened_low"] == pytest.approx(100.0)
    for p in readings:
        assert b.low <= p["value"] <= b.high


def test_an_upper_bound_reaches_down_to_the_smallest_candidate():
    b = bracket_from_readings([reading("b_simple", "upper_bound", 100.0, 2.0)], CANDIDATES, 4096)
    assert (b.low, b.high, b.clipped_by) == (16, 256, "candidates")


def test_readings_without_value_give_every_fitting_candidate():
    readings = [reading("b_simple", "none", None, 7.0, "no value"), reading("branched", "none", None, 5.0, "failed: x")]
    b = bracket_from_readings(readings, CANDIDATES, 1000)
    assert (b.low, b.high, b.source) == (16, 512, "default")
    assert b.clipped_by == "memory: largest fitting batch 1000"
    assert "failed: x" in b.reason and "no predictor gave a value" in b.reason
    none = bracket_from_readings([], CANDIDATES, None)
    assert (none.low, none.high, none.source, none.clipped_by) == (16, 4096, "default", None)


def test_a_range_beyond_memory_collapses_onto_the_largest_fitting_candidate():
    b = bracket_from_readings([reading("branched", "point", 1e5, 2.0)], CANDIDATES, 1024)
    assert (b.low, b.high) == (1024, 1024)
    assert b.clipped_by.startswith("memory: largest fitting batch 1024")
    assert "above" in b.reason


def test_snap_to_candidates():
    assert snap_to_candidates(64, 512, CANDIDATES, 4096) == (64, 512, None)  # candidates stay
    assert snap_to_candidates(65, 511, CANDIDATES, None) == (64, 512, None)
    assert snap_to_candidates(1, math.inf, CANDIDATES, None) == (16, 4096, "candidates")
    assert snap_to_candidates(100, 3000, CANDIDATES, 3000) == (64, 2048, "memory: largest fitting batch 3000")
    with pytest.raises(BatchlabError, match="strictly increasing"):
        snap_to_candidates(1, 2, [32, 16], None)
    with pytest.raises(BatchlabError, match="no candidate batch size fits"):
        snap_to_candidates(1, 2, CANDIDATES, 8)


# ------------------------------------------------------------------------------------------- --bracket


def test_given_bracket_is_snapped_and_clipped():
    b = given_bracket("64:512", CANDIDATES, 4096)
    assert (b.low, b.high, b.source, b.examples, b.clipped_by) == (64, 512, "given", 0, None)
    assert given_bracket(" 100 : 300 ", CANDIDATES, 4096).to_dict()["low"] == 64
    clipped = given_bracket("100:100000", CANDIDATES, 2048)
    assert (clipped.low, clipped.high, clipped.clipped_by) == (64, 2048, "memory: largest fitting batch 2048")


@pytest.mark.parametrize("text", ["x", "0:4", "8:8", "9:4", "1.5:3", "64:", ":64", "-2:4", "4:8:16", None, 64])
def test_given_bracket_refuses_anything_but_lo_hi(text):
    with pytest.raises(BatchlabError) as info:
        given_bracket(text, CANDIDATES, 4096)
    assert str(info.value) == f"--bracket must be LO:HI with integers 1 <= LO < HI, got {text!r}"


def test_round_trip_and_one_line_text():
    readings = [reading("b_simple", "point", 200.0, 2.0), reading("branched", "lower_bound", 300.0, 3.0),
                reading("x", "none", None, 2.0)]
    b = bracket_from_readings(readings, CANDIDATES, 2048, reference={"batch_size": 64, "steps_at": 8},
                              branched_by_step=[{"step": 8, "examples": 512, "value": 300, "low": 300, "high": None}],
                              warmup_schedule=[[2, 64], [8, 300]], examples=1234, examples_parts={"reference_run": 1234})
    data = json.loads(json.dumps(b.to_dict(), allow_nan=False))
    assert Bracket.from_dict(data) == b
    line = b.text()
    assert "\n" not in line and "[64, 2048]" in line and ">= 300" in line and "1,234 examples" in line


# ------------------------------------------------------------------------------------------- predict's keywords


def test_predict_measures_only_the_named_predictors():
    from batchlab.probes.predict import predict

    workload = f"{ROOT / 'tests/probes/test_predict.py'}:linear_workload"
    fast = {"steps_at": 4, "examples": 64, "batch_size": 16, "learning_rate": 0.05, "device": "cpu"}
    result = predict(workload, "sgd", only=["b_simple"], **fast)
    assert [p["predictor"] for p in result["predictors"]] == ["b_simple"]
    with pytest.raises(BatchlabError, match="did you mean 'b_simple'"):
        predict(workload, "sgd", only=["b_simpel"], **fast)


# ------------------------------------------------------------------------------------------- a real measurement

WORKLOAD = "mnist/fc_64_64_64"
SMALL = [4, 8, 16, 32, 64, 128, 256]


def test_predictor_bracket_on_a_tiny_mnist_setting():
    messages = []
    b = predictor_bracket(WORKLOAD, "sgd", hyperparameters={"learning_rate": 0.1}, batch_size=8, candidates=SMALL,
                          largest_fitting=128, steps_at=8, device="cpu", train_examples=256, progress=messages.append)
    assert b.source in ("predictors", "default") and messages
    assert b.low in SMALL and b.high in SMALL and b.low <= b.high <= 128
    assert [p["name"] for p in b.predictors] == ["b_simple", "branched"]
    for p in b.predictors:
        assert p["error_factor"] == MEASURED_ERROR[p["name"]]
        if p["kind"] != "none" and SMALL[0] <= p["value"] <= 128:
            assert b.low <= p["value"] <= b.high, (p, b.text())
    branched = b.predictors[1]
    assert branched["kind"] != "none", branched["note"]  # the branches ran (multipliers 1..16: 16 x 8 fits)
    assert branched["value"] <= 128
    assert [s["step"] for s in b.branched_by_step] == [2, 4, 8]
    assert all(s["examples"] == s["step"] * 8 for s in b.branched_by_step)
    assert b.warmup_schedule and b.warmup_schedule[0][0] == 2
    assert b.reference["batch_size"] == 8 and b.reference["hyperparameters"]["learning_rate"] == 0.1
    assert b.reference["multipliers"] == [1, 2, 4, 8, 16]
    assert b.examples > 0 and b.examples == sum(b.examples_parts.values())
    assert b.examples_parts["reference_run"] == 8 * 8 and b.examples_parts["noise_scale_probes"] > 0
    # the branched measurement: its reference run (8 x 8) and 3 checkpoints x 5 branches x a 64 x 8 window
    assert b.examples_parts["branched"] == 8 * 8 + 3 * 5 * 64 * 8
    assert Bracket.from_dict(json.loads(json.dumps(b.to_dict()))) == b


def test_a_diverging_reference_run_gives_the_default_bracket():
    b = predictor_bracket(WORKLOAD, "sgd", hyperparameters={"learning_rate": 1e8}, batch_size=8, candidates=SMALL,
                          largest_fitting=64, steps_at=8, device="cpu", train_examples=256)
    assert (b.source, b.low, b.high) == ("default", 4, 64)
    assert "failed" in b.reason and b.examples == 8 * 8
    assert b.clipped_by == "memory: largest fitting batch 64"


def test_bad_input_is_refused_before_training():
    with pytest.raises(BatchlabError, match="does not fit"):
        predictor_bracket(WORKLOAD, "sgd", hyperparameters={}, batch_size=256, candidates=SMALL, largest_fitting=128)
    with pytest.raises(BatchlabError, match="steps_at"):
        predictor_bracket(WORKLOAD, "sgd", hyperparameters={}, batch_size=8, candidates=SMALL, largest_fitting=128,
                          steps_at=-1)
    with pytest.raises(BatchlabError, match="optimizer"):
        predictor_bracket(WORKLOAD, "sgdd", hyperparameters={}, batch_size=8, candidates=SMALL, largest_fitting=128)
