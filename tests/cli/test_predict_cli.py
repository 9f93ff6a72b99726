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
    assert rows[0]["compute_fraction"] > 0
    points = [r for r in rows if r["kind"] == "point"]  # only points have a ratio (bounds: docs "Scoring predictors")
    assert points and all(r["ratio"] > 0 for r in points)
    assert all(r["ratio"] is None for r in rows if r["kind"] != "point")


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


def _score_inputs(tmp_path):
    from tests.probes.test_scoring import CSV_HEADER, UNIT_A, _line

    csv_path = tmp_path / "report.csv"
    csv_path.write_text(CSV_HEADER + f"{UNIT_A},steps_to_result,8,n_trials,4,,,\n"
                        f"{UNIT_A},steps_to_result,128,n_trials,4,,,\n"
                        f"{UNIT_A},critical_batch_size,,mccandlish_b_crit,100,70,140,\n")
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(_line("b_simple", 150.0, 90.0, None) + "\n")  # open above: a lower bound 90
    second.write_text(_line("branched", 128.0, 128.0, 256.0, method="bracket") + "\n")
    return csv_path, first, second


def test_predict_score_prints_one_row_per_predictor_and_baseline(capsys, tmp_path):
    csv_path, first, second = _score_inputs(tmp_path)
    code, out, err = run(capsys, "predict", "--score", str(first), str(second), "--measured", str(csv_path))
    assert code == 0, err
    for text in ("b_simple", "branched", "baseline: default batch size", "baseline: swept geometric mean",
                 ">= 90 ok", "1.28x", "within 2x", "geometric error"):
        assert text in out
    code, out, err = run(capsys, "predict", "--score", str(first), str(second), "--measured", str(csv_path), "--json")
    assert code == 0, err
    rows = [json.loads(line) for line in out.strip().splitlines()]
    assert [r["predictor"] for r in rows] == ["b_simple", "branched", "baseline: default batch size",
                                              "baseline: swept geometric mean"]
    assert rows[0]["n_points"] == 0 and rows[0]["n_bounds"] == 1 and rows[0]["n_bounds_consistent"] == 1
    assert rows[1]["n_within_2x"] == 1 and abs(rows[1]["geometric_error"] - 1.28) < 1e-9
    assert abs(rows[3]["units"][0]["ratio"] - 0.32) < 1e-9 and rows[2]["baseline"]


def test_predict_score_bad_input_is_one_line_exit_2(capsys, tmp_path):
    csv_path, first, _ = _score_inputs(tmp_path)
    other = tmp_path / "other.jsonl"  # a refit of a unit no prediction names
    other.write_text('{"group": "other/net/sgd [sweep ffffffffffff]", "mccandlish_b_crit": 50}\n')
    for args, message in ((["--score", str(first)], "needs --measured"),
                          (["--score", str(first), "--measured", str(other)], "--score scored no unit"),
                          (["--score", "--measured", str(csv_path)], "needs prediction FILEs"),
                          (["--score", str(first), "--measured", str(tmp_path / "none.csv")], "does not exist"),
                          ([WORKLOAD, "--optimizer", "sgd", "--measured", str(csv_path)], "belong to --score"),
                          ([WORKLOAD], "needs one WORKLOAD and --optimizer"),
                          (["--score", str(tmp_path / "gone.jsonl"), "--measured", str(csv_path)],
                           "prediction FILE '"),
                          (["--score", str(first), "--measured", str(csv_path), "--store", str(tmp_path)],
                           "--store belongs to predicting, not to --score FILE..."),
                          (["--score", str(first), "--measured", str(csv_path), "--steps-at", "10", "--batch-size",
                            "8", "--no-branched"], "--steps-at, --batch-size, --no-branched belong to predicting")):
        code, _, err = run(capsys, "predict", *args)
        assert code == 2 and err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1, err
