"""``batchlab report``: the printed summary, --json, --nqm, --steps-table and one-line errors."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
from report_fixtures import publish, unit_trials  # noqa: E402

from cli_runner import run  # noqa: E402

SGD, MOM = "mnist/fc_64_64_64/sgd", "mnist/fc_64_64_64/momentum"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_report")
    return publish(root / "store", unit_trials(SGD, (8, 32, 128), 16, trials=4) + unit_trials(MOM, (8, 32, 128), 64, trials=4))


def test_report_prints_paths_and_three_summary_lines(capsys, store, tmp_path):
    out = tmp_path / "report.html"
    code, stdout, err = run(capsys, "report", "--store", store, "--out", out, "--bootstrap", "10")
    assert code == 0, err
    lines = stdout.splitlines()
    assert lines[:2] == [f"report: {out}", f"table: {out.with_suffix('.csv')}"]
    assert len(lines) == 5
    assert lines[2].startswith("mnist/fc_64_64_64 momentum: B_crit ") and "(90%, fit of 3 batch sizes" in lines[2]
    assert lines[3].startswith("mnist/fc_64_64_64 sgd: B_crit ")
    assert lines[4].startswith("mnist/fc_64_64_64: momentum/sgd B_crit ratio ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.csv", "report.html"]
    assert '<a href="report.csv">' in out.read_text()


def test_json_with_nqm_and_a_steps_table(capsys, store, tmp_path):
    table = tmp_path / "published.csv"
    table.write_text("optimizer,batch_size,steps\n" + "".join(
        f"{name},{b},{int(s * (1 + c / b))}\n" for name, s, c in (("sgd", 100, 64), ("adam", 60, 512))
        for b in (16, 64, 256, 1024)))
    out = tmp_path / "r.html"
    code, stdout, err = run(capsys, "report", "--store", store, "--out", out, "--bootstrap", "5", "--nqm",
                            "--steps-table", table, "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["report"] == str(out) and summary["table"] == str(out.with_suffix(".csv"))
    assert [u["optimizer"] for u in summary["units"]] == ["momentum", "sgd"]
    assert all(u["b_crit"]["value"] > 0 for u in summary["units"])
    assert summary["comparisons"][0]["ratios"][0]["name"] == "momentum/sgd"
    assert set(summary["nqm"]["predictions"]) == {"momentum", "sgd"}
    assert summary["steps_tables"] == [{"name": "steps table published.csv", "path": str(table), "group_by": "optimizer"}]
    html = out.read_text()
    assert 'data-figure="mnist-fc-64-64-64-sgd-sweep-abcdef012345-nqm"' in html and "shape only" in html
    assert 'data-figure="steps-table-published-csv"' in html and "optimizer=adam" in html
    rows = out.with_suffix(".csv").read_text()
    assert "nqm_b_crit" in rows and "steps_table" in rows
    # the report fits a steps table as `analyze critical-batch-size --steps-table` does: the same values
    # and 90% intervals (one code path, so equal to rounding of the CSV's text)
    import csv as csv_module

    from batchlab.analysis.steps_table import fit_steps_frame, read_steps_table

    written = {r["quantity"]: r for r in csv_module.DictReader(out.with_suffix(".csv").open())
               if r["section"] == "steps_table" and r["quantity"].endswith(": mccandlish_b_crit")}
    fitted = fit_steps_frame(read_steps_table(table), "optimizer", label="published")
    assert len(written) == len(fitted) == 2
    for entry in fitted:
        (row,) = [r for q, r in written.items() if f"optimizer={entry['group']}" in q]
        interval = entry["intervals"]["mccandlish_b_crit"]
        assert float(row["value"]) == pytest.approx(entry["mccandlish_b_crit"], rel=1e-9)
        assert float(row["lower"]) == pytest.approx(interval["low"], rel=1e-9)
        assert float(row["upper"]) == pytest.approx(interval["high"], rel=1e-9)


@pytest.mark.parametrize("args, message", [
    (["--out", "{tmp}/r.txt"], "must end in .html"),
    (["--out", "{tmp}/no/r.html"], "does not exist"),
    (["--out", "{tmp}/r.html", "--steps-table", "{tmp}/missing.csv"], "does not exist or is not a file"),
    (["--out", "{tmp}/r.html", "--level", "1.5"], "--level must lie in (0, 1)"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(capsys, store, tmp_path, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code, stdout, err = run(capsys, "report", "--store", store, *args)
    assert (code, stdout) == (2, "")
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_store_without_a_reached_goal_is_refused(capsys, tmp_path):
    store = publish(tmp_path / "s", unit_trials(SGD, (8, 32), 16, trials=2, budget=50, reach=False))
    code, stdout, err = run(capsys, "report", "--store", store, "--out", tmp_path / "r.html")
    assert (code, stdout) == (2, "") and "reached its goal" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_predictions_section_line_and_warning(capsys, store, tmp_path):
    settings = {"workload": "mnist/fc_64_64_64", "optimizer": "sgd", "batch_size": 128,
                "hyperparameters": {"learning_rate": 0.1}, "steps_at": 100}
    records = [{"workload": w, "optimizer": "sgd", "predictor": p, "critical_batch_size": v, "low": None, "high": None,
                "interval_method": "", "examples": 1000, "note": "", "unit": None, "measured": None, "settings": settings}
               for w, p, v in (("mnist/fc_64_64_64", "b_simple", 8.0), ("mnist/fc_64_64_64", "branched", 32.0),
                               ("cifar10/resnet", "b_simple", 4.0))]
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    out = tmp_path / "r.html"
    code, stdout, err = run(capsys, "report", "--store", store, "--out", out, "--bootstrap", "5",
                            "--predictions", predictions)
    assert code == 0, err
    lines = stdout.splitlines()
    # the unit's predictions line, then the scores of each predictor across units (beside the naive baselines)
    assert len(lines) == 7 and lines[5].startswith("predictions mnist/fc_64_64_64 sgd: b_simple 8 (")
    assert ", branched 32 (" in lines[5] and " against B_crit " in lines[5] and "; within 2x: " in lines[5]
    assert err == "warning: predictions for cifar10/resnet/sgd: the store has no unit of that workload\n"
    html = out.read_text()
    assert 'id="predictions"' in html and 'data-figure="predictions-mnist-fc-64-64-64-sgd-sweep-abcdef012345"' in html
    assert "b_simple: ratio" in out.with_suffix(".csv").read_text()


def test_bad_predictions_file_is_one_line_exit_2_and_writes_nothing(capsys, store, tmp_path):
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text('{"workload": "mnist/fc_64_64_64", "optimizer": "sgd"}\n\nnot json\n')
    out = tmp_path / "out"
    out.mkdir()
    code, stdout, err = run(capsys, "report", "--store", store, "--out", out / "r.html", "--predictions", predictions)
    assert (code, stdout) == (2, "") and err.count("\n") == 1
    assert err.startswith(f"error: --predictions {str(predictions)!r} line 1: neither a prediction")
    assert list(out.iterdir()) == []


def test_predict_json_feeds_the_report(capsys, tmp_path):
    """End to end on the tiny linear workload of tests/probes/test_predict.py: predict --json, then report."""
    from tests.probes.test_predict import WORKLOAD, _store

    linear_store = _store(tmp_path)
    code, stdout, err = run(capsys, "predict", WORKLOAD, "--steps-at", "5", "--examples", "64", "--batch-size", "32",
                            "--learning-rate", "0.05", "--device", "cpu", "--optimizer", "sgd", "--store", linear_store,
                            "--no-branched", "--json")
    assert code == 0, err
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text(stdout)
    recorded = [json.loads(line) for line in stdout.splitlines()]
    out = tmp_path / "r.html"
    code, stdout, err = run(capsys, "report", "--store", linear_store, "--out", out, "--bootstrap", "20",
                            "--predictions", predictions, "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    (unit,) = summary["predictions"]
    assert [r["predictor"] for r in unit["rows"]] == [r["predictor"] for r in recorded]
    for row, record in zip(unit["rows"], recorded):
        # predict measured the same unit with the same bootstrap settings: the same B_crit, ratio and sweep
        assert row["measured"] == pytest.approx(record["measured"], rel=1e-9)
        assert row["sweep_examples"] == record["sweep_examples"]
        if record["ratio"] is not None:
            assert row["ratio"] == pytest.approx(record["ratio"], rel=1e-9)
