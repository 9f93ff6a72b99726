"""``batchlab predict`` on the tiny linear workload of tests/probes/test_predict.py beside a synthetic store."""

import json

from tests.cli.cli_runner import run
from tests.probes.test_predict import WORKLOAD, _store

FAST = [WORKLOAD, "--steps-at", "5", "--examples", "64", "--batch-size", "32", "--learning-rate", "0.05", "--device",
        "cpu"]


def test_predict_json_has_the_ratio_fields(capsys, tmp_path):
    store = _store(tmp_path)
    code, out, err = run(capsys, "predict", *FAST, "--optimizer", "sgd", "--store", store, "--no-branched", "--json")
    assert code == 0, err
    rows = [json.loads(line) for line in out.strip().splitlines()]
    assert [r["predictor"] for r in rows] == ["b_simple", "b_noise", "calibrated_nqm", "branched"]
    for row in rows:
        assert {"critical_batch_size", "low", "high", "measured", "measured_low", "measured_high", "ratio", "ratio_low",
                "ratio_high", "examples", "sweep_examples", "compute_fraction", "unit", "settings"} <= set(row)
        assert row["workload"] == "synthetic/linear" and row["optimizer"] == "sgd" and row["measured"] > 0
        assert row["settings"]["steps_at"] == 5 and row["settings"]["batch_size"] == 32
    assert rows[0]["ratio"] > 0 and rows[0]["compute_fraction"] > 0


def test_predict_text_table(capsys):
    code, out, err = run(capsys, "predict", *FAST, "--optimizer", "sgd", "--no-branched")
    assert code == 0, err
    assert "critical batch size" in out and "b_simple" in out and "calibrated_nqm" in out and "compute fraction" in out
    assert "training the reference run" in err


def test_bad_input_is_one_line_exit_2(capsys, tmp_path):
    code, out, err = run(capsys, "predict", *FAST, "--optimizer", "sgdd")
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1
    store = _store(tmp_path, optimizer="adam")
    code, out, err = run(capsys, "predict", *FAST, "--optimizer", "sgd", "--store", store)
    assert code == 2 and "no trials of workload 'synthetic/linear/sgd'" in err and len(err.strip().splitlines()) == 1
    assert out == ""
