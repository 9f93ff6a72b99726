"""The report's predictions section (``build_report(..., predictions=[FILE])``): records written by hand
as ``batchlab predict --json`` and ``batchlab probe noise-scale --json`` write them, matched to the
units of a small real store (tests/report/report_fixtures.py)."""

import base64
import csv
import json
import re
import sys
from html import unescape
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report_fixtures import SWEEP, publish, unit_trials  # noqa: E402

from batchlab.errors import BatchlabError  # noqa: E402

SGD, MOM = "mnist/fc_64_64_64/sgd", "mnist/fc_64_64_64/momentum"
SGD_UNIT, MOM_UNIT = f"{SGD} [sweep {SWEEP}]", f"{MOM} [sweep {SWEEP}]"
SIZES = (8, 32, 128)
SETTINGS = {"workload": "mnist/fc_64_64_64", "optimizer": "sgd", "batch_size": 128,
            "hyperparameters": {"learning_rate": 0.1}, "steps_at": 100, "seed": 0}


def prediction(predictor, value, low=None, high=None, examples=None, unit=None, measured=None, optimizer="sgd",
               workload="mnist/fc_64_64_64", **settings):
    """One line of ``batchlab predict --json`` (the documented schema)."""
    return {"workload": workload, "optimizer": optimizer, "predictor": predictor, "critical_batch_size": value,
            "low": low, "high": high, "interval_method": "fieller" if low is not None else "", "examples": examples,
            "note": f"note of {predictor}", "unit": unit, "measured": measured, "measured_low": None,
            "measured_high": None, "ratio": None, "ratio_low": None, "ratio_high": None, "sweep_examples": None,
            "compute_fraction": None, "settings": {**SETTINGS, "optimizer": optimizer, **settings}}


def noise_step(step, value, low, high, learning_rate=0.1, optimizer="sgd"):
    """One line of ``batchlab probe noise-scale --json``."""
    return {"step": step, "workload": "mnist/fc_64_64_64", "optimizer": optimizer, "b_simple": value,
            "b_simple_interval": {"low": low, "high": high, "level": 0.9, "method": "fieller"}, "trace_sigma": 1.0,
            "grad_norm_sq": 0.1, "b_noise": None, "batch_loss": 0.5, "learning_rate": learning_rate,
            "settings": {"workload": "mnist/fc_64_64_64", "optimizer": optimizer, "batch_size": 128,
                         "learning_rate": learning_rate, "seed": 0, "level": 0.9}}


def write_lines(path, objects, blank=True):
    path.write_text("".join(json.dumps(o) + "\n" + ("\n" if blank else "") for o in objects))
    return path


@pytest.fixture(scope="module")
def trials():
    return unit_trials(SGD, SIZES, 16, trials=4) + unit_trials(MOM, SIZES, 64, trials=4)


@pytest.fixture(scope="module")
def built(tmp_path_factory, trials):
    from batchlab.report.build import build_report

    root = tmp_path_factory.mktemp("predictions")
    store = publish(root / "store", trials)
    records = [
        # the same three predictions compared with two units (predict writes one line per unit): one row each
        *[prediction(p, v, lo, hi, ex, unit=u, measured=m)
          for p, v, lo, hi, ex in (("b_simple", 6.0, 4.0, 9.0, 10_000), ("b_noise", 30.0, 12.0, None, 40_000),
                                   ("branched", 64.0, 64.0, 128.0, 25_000))
          for u, m in ((SGD_UNIT, 999.0), (None, 5.0))],
        prediction("calibrated_nqm", None),
        prediction("b_simple", 7.0, examples=5, unit=f"{SGD} [sweep 000000000000]"),  # no such unit
        prediction("b_simple", 3.0, workload="cifar10/resnet", examples=5),  # no such workload
        prediction("b_simple", 20.0, 15.0, 30.0, 1000, optimizer="momentum", unit=MOM_UNIT),
        noise_step(0, 2.0, 1.5, 3.0), noise_step(50, 8.0, 6.0, 11.0), noise_step(100, 12.0, 9.0, None),
        noise_step(50, 16.0, 12.0, 20.0, learning_rate=0.2), noise_step(100, None, None, None, learning_rate=0.2),
    ]
    path = write_lines(root / "predictions.jsonl", records)
    summary = build_report(store, root / "r.html", n_boot=10, predictions=[path])
    html = (root / "r.html").read_text()
    rows = list(csv.DictReader((root / "r.csv").open()))
    return summary, html, rows


def _unit(summary, name):
    return next(u for u in summary["predictions"] if u["unit"] == name)


def _b_crit(summary, name):
    return next(u for u in summary["units"] if u["unit"] == name)["b_crit"]


def test_records_are_matched_to_units_and_deduplicated(built):
    summary, _, _ = built
    assert [u["unit"] for u in summary["predictions"]] == [MOM_UNIT, SGD_UNIT]
    sgd = _unit(summary, SGD_UNIT)
    # six b_simple/b_noise/branched lines (two units' worth) are three rows, the calibrated NQM a fourth;
    # the record naming another unit and the other workload's record are not rows
    assert [r["predictor"] for r in sgd["rows"]] == ["b_simple", "b_noise", "branched", "calibrated_nqm"]
    assert [r["predicted"] for r in sgd["rows"]] == [6.0, 30.0, 64.0, None]
    assert all(r["steps_at"] == 100 and r["batch_size"] == 128 and r["learning_rate"] == 0.1 for r in sgd["rows"])
    assert [r["predictor"] for r in _unit(summary, MOM_UNIT)["rows"]] == ["b_simple"]
    assert _unit(summary, MOM_UNIT)["b_simple_across_training"] == []


def test_ratio_and_range_use_the_reports_own_b_crit(built):
    summary, html, _ = built
    bc = _b_crit(summary, SGD_UNIT)
    assert bc["low"] is not None and bc["high"] is not None
    rows = {r["predictor"]: r for r in _unit(summary, SGD_UNIT)["rows"]}
    for name, value, low, high in (("b_simple", 6.0, 4.0, 9.0), ("b_noise", 30.0, 12.0, None),
                                   ("branched", 64.0, 64.0, 128.0)):
        r = rows[name]
        assert r["measured"] == pytest.approx(bc["value"], rel=1e-12)  # never the record's 999 or 5
        assert r["ratio_low"] == pytest.approx(low / bc["high"], rel=1e-12)
        # an interval end of 0 (a fit whose interval reaches 0) gives no ratio-range end
        assert r["ratio_high"] == (None if high is None or not bc["low"] else pytest.approx(high / bc["low"], rel=1e-12))
        if high is None:  # an interval open above: a lower bound at its low end, never a point
            assert (r["kind"], r["bound"], r["ratio"], r["within_2x"]) == ("lower_bound", low, None, None)
            assert r["bound_consistent"] is (low <= 2 * bc["value"])
            continue
        assert r["kind"] == "point" and r["bound"] is None and r["bound_consistent"] is None
        assert r["ratio"] == pytest.approx(value / bc["value"], rel=1e-12)
        assert r["within_2x"] is (0.5 <= value / bc["value"] <= 2)
    assert rows["calibrated_nqm"]["ratio"] is None and rows["calibrated_nqm"]["within_2x"] is None
    assert rows["calibrated_nqm"]["kind"] == "none"
    assert "not a confidence interval" in unescape(html)


def test_compute_fraction_against_a_hand_count(built, trials):
    summary, _, rows = built
    by_hand = {w: sum(max(s for s, _ in t["rows"]) * t["batch_size"] for t in trials if t["workload"] == w)
               for w in (SGD, MOM)}
    sgd = _unit(summary, SGD_UNIT)
    assert sgd["sweep_examples"] == by_hand[SGD] and sgd["sweep_trials"] == 12
    assert _unit(summary, MOM_UNIT)["sweep_examples"] == by_hand[MOM]
    fractions = {r["predictor"]: r["compute_fraction"] for r in sgd["rows"]}
    assert fractions["b_simple"] == pytest.approx(10_000 / by_hand[SGD], rel=1e-12)
    assert fractions["branched"] == pytest.approx(25_000 / by_hand[SGD], rel=1e-12)
    assert fractions["calibrated_nqm"] is None
    csv_row = next(r for r in rows if r["unit"] == SGD_UNIT and r["quantity"] == "b_noise: compute_fraction")
    assert float(csv_row["value"]) == pytest.approx(40_000 / by_hand[SGD], rel=1e-12)


def test_predict_uses_the_same_sweep_examples(built, trials, tmp_path):
    from batchlab.probes.predict import measured_units

    store = publish(tmp_path / "store", [t for t in trials if t["workload"] == SGD])
    (entry,) = measured_units(store, SGD, None, n_boot=5, level=0.9, seed=0)
    assert entry["sweep_examples"] == _unit(built[0], SGD_UNIT)["sweep_examples"] and entry["trials"] == 12


def test_unmatched_records_are_warnings_not_errors(built):
    summary, html, _ = built
    assert summary["predictions_warnings"] == [
        f"predictions for {SGD} unit '{SGD} [sweep 000000000000]': the store has no unit of that name (its units: "
        f"{SGD_UNIT})",
        "predictions for cifar10/resnet/sgd: the store has no unit of that workload",
    ]
    assert "predictions for cifar10/resnet/sgd: the store has no unit of that workload" in unescape(html)


def _png(html, figure_id):
    match = re.search(rf'<img data-figure="{re.escape(figure_id)}" alt="[^"]+" src="data:image/png;base64,([^"]+)">'
                      r"<figcaption>([^<]*)</figcaption>", html)
    assert match, figure_id
    return base64.b64decode(match.group(1)), unescape(match.group(2))


def test_section_with_figure_table_and_contents_link(built):
    _, html, _ = built
    assert '<h2 id="predictions">Predictions before sweeping</h2>' in html
    assert '<a href="#predictions">predictions</a>' in html
    png, caption = _png(html, f"predictions-mnist-fc-64-64-64-sgd-sweep-{SWEEP}")
    assert png.startswith(b"\x89PNG") and len(png) > 2000
    assert "Not drawn (no value): calibrated_nqm." in caption
    png, caption = _png(html, f"predictions-mnist-fc-64-64-64-momentum-sweep-{SWEEP}")
    assert png.startswith(b"\x89PNG") and "Not drawn" not in caption
    ids = re.findall(r'<img data-figure="([^"]+)"', html)
    assert len(ids) == len(set(ids))
    assert "Predicted critical batch sizes against this unit&#x27;s measured mccandlish_b_crit" in html
    assert "<th>prediction ratio</th>" in html and "<th>within 2x</th>" in html  # the definitions


def test_b_simple_across_training_figure_and_table(built):
    summary, html, rows = built
    png, caption = _png(html, f"b-simple-across-training-mnist-fc-64-64-64-sgd-sweep-{SWEEP}")
    assert png.startswith(b"\x89PNG") and len(png) > 2000
    assert "Not drawn (no value): sgd B=128 lr=0.2 step 100." in caption
    bc = _b_crit(summary, SGD_UNIT)["value"]
    series = _unit(summary, SGD_UNIT)["b_simple_across_training"]
    assert [(s["run"], s["step"], s["b_simple"]) for s in series] == [
        ("sgd B=128 lr=0.1", 0, 2.0), ("sgd B=128 lr=0.1", 50, 8.0), ("sgd B=128 lr=0.1", 100, 12.0),
        ("sgd B=128 lr=0.2", 50, 16.0), ("sgd B=128 lr=0.2", 100, None)]
    assert series[1]["ratio"] == pytest.approx(8.0 / bc, rel=1e-12) and series[4]["ratio"] is None
    table = html[html.index("B_simple across training against"):]
    assert "<td>sgd B=128 lr=0.1</td><td>50</td><td>8</td><td>[6, 11]</td>" in table
    csv_row = next(r for r in rows if r["quantity"] == "b_simple at step 100 (sgd B=128 lr=0.1)")
    assert (csv_row["value"], csv_row["lower"], csv_row["upper"]) == ("12", "9", "")
    # 12 [9, inf) is open above: a lower bound 9, never a point: no ratio, said so in the table and the CSV
    assert [s["kind"] for s in series] == ["point", "point", "lower_bound", "point", "none"]
    assert (series[2]["bound"], series[2]["ratio"]) == (9.0, None) and series[1]["bound"] is None
    assert csv_row["note"].startswith("lower bound 9, never a point")
    ratio_row = next(r for r in rows if r["quantity"] == "b_simple/measured at step 100 (sgd B=128 lr=0.1)")
    assert (ratio_row["value"], ratio_row["note"]) == ("", "lower bound 9: no ratio")
    assert ("<td>sgd B=128 lr=0.1</td><td>100</td><td>&gt;= 9</td><td>[9, inf]</td><td>lower bound 9</td>"
            "<td>- (a bound: no ratio)</td>") in table
    assert "a bound (an interval open on one side) is a bar from the bound" in caption


def test_b_simple_figure_draws_a_bound_as_a_bound_not_a_point_of_the_line():
    from batchlab.plots.predictions import Measured, Series, b_simple_figure

    series = Series("run", [0, 50, 100], [2.0, 8.0, 9.0], [1.5, 6.0, 9.0], [3.0, 11.0, None],
                    ["point", "point", "lower_bound"])
    ax = b_simple_figure([series], Measured(10.0, 8.0, 12.0), "t").axes[0]
    (line,) = [c for c in ax.containers]  # the errorbar of the points only
    assert list(line.lines[0].get_xdata()) == [0, 50]
    bound = [a for a in ax.get_children() if a.get_gid() == "b_simple_bound"]
    bar, arrow, mark = bound
    top = ax.get_ylim()[1]
    assert list(bar.get_xdata()) == [100, 100] and list(bar.get_ydata()) == [9.0, top]
    assert arrow.get_marker() == "^" and list(arrow.get_ydata()) == [top] and list(mark.get_ydata()) == [9.0]
    # without kinds every step is a point (the old form)
    ax = b_simple_figure([Series("run", [0, 50], [2.0, 8.0], [1.5, 6.0], [3.0, 11.0])], Measured(None), "t").axes[0]
    assert list(ax.containers[0].lines[0].get_xdata()) == [0, 50]
    assert not [a for a in ax.get_children() if a.get_gid() == "b_simple_bound"]


def test_summary_line_names_ratios_and_those_within_2x(built):
    from batchlab.report.content import num

    summary, html, _ = built
    bc = _b_crit(summary, SGD_UNIT)["value"]
    parts = [f"{p} {num(v)} ({v / bc:.2f}x)" for p, v in (("b_simple", 6.0), ("branched", 64.0))]
    # b_noise 30 [12, inf) is a lower bound: written as one, never with a ratio or among those within 2x; all
    # four are at step 100, off the workload's protocol checkpoint (750): not scored, never listed as within 2x
    expected = (f"predictions mnist/fc_64_64_64 sgd: {parts[0]}, b_noise >= 12 (bound), {parts[1]}, calibrated_nqm - "
                f"against B_crit {num(bc)}; within 2x: none (at the protocol checkpoint, step 750); off protocol, not "
                "scored: b_simple, b_noise, branched, calibrated_nqm")
    assert expected in summary["lines"]
    # the scores line comes last, after the units' prediction lines
    assert summary["lines"][-1].startswith("prediction scores (0 units, protocol checkpoint): ")
    assert summary["lines"][-2] == expected and _unit(summary, SGD_UNIT)["line"] == expected
    assert summary["lines"][-3].startswith("predictions mnist/fc_64_64_64 momentum: b_simple 20 (")
    assert expected in unescape(html)


def test_several_checkpoint_steps_name_the_step(tmp_path, trials):
    from batchlab.report.build import build_report

    store = publish(tmp_path / "store", [t for t in trials if t["workload"] == SGD])
    path = write_lines(tmp_path / "p.jsonl", [prediction("b_simple", 6.0, steps_at=250, protocol_steps_at=500),
                                               prediction("b_simple", 9.0, steps_at=500, protocol_steps_at=500)],
                       blank=False)
    summary = build_report(store, tmp_path / "r.html", n_boot=5, predictions=[path])
    line = next(x for x in summary["lines"] if x.startswith("predictions "))
    assert line.startswith("predictions mnist/fc_64_64_64 sgd: b_simple@250 6 (")
    assert ", b_simple@500 9 (" in line
    # both are within 2x of the measured B_crit, but only the protocol checkpoint's is listed (never a union)
    bc = _b_crit(summary, SGD_UNIT)["value"]
    assert all(0.5 <= v / bc <= 2 for v in (6.0, 9.0))
    assert line.endswith("; within 2x: b_simple@500 (at the protocol checkpoint, step 500); "
                         "off protocol, not scored: b_simple@250")
    assert [r["label"] for r in summary["predictions"][0]["rows"]] == ["b_simple@250", "b_simple@500"]


def test_figures_draw_intervals_on_the_documented_axes():
    from batchlab.plots.predictions import Measured, Point, Series, b_simple_figure, predictions_figure

    fig = predictions_figure([Point("a", 10.0, 5.0, None), Point("b", None)], Measured(20.0, 10.0, 40.0), "t")
    (ax,) = fig.axes
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a"]
    assert ax.get_xlabel() and ax.get_legend() is not None
    fig = predictions_figure([Point("lower", 10.0, 10.0, None, bound=True)], Measured(20.0, 10.0, 40.0), "t")
    markers = [line.get_marker() for line in fig.axes[0].get_lines()]
    assert "|" in markers and ">" in markers and "o" not in markers  # a bound: its end and the open side, no dot
    fig = b_simple_figure([Series("r", [0, 10], [1.0, 2.0], [0.5, None], [2.0, None])], Measured(3.0), "t")
    (ax,) = fig.axes
    assert ax.get_xscale() == "symlog" and ax.get_yscale() == "log"
    fig = b_simple_figure([Series("r", [5, 10], [1.0, 2.0], [0.5, 1.0], [2.0, 3.0])], Measured(None), "t")
    assert fig.axes[0].get_xscale() == "linear"


GOOD = json.dumps(prediction("b_simple", 6.0, examples=5))


@pytest.mark.parametrize("text, message", [
    (None, "does not exist or is not a file"),
    ("\n\n", "holds no records"),
    (GOOD + "\n{oops\n", "line 2 is not JSON"),
    (GOOD + "\n\n[1, 2]\n", "line 3 is not a JSON object"),
    ('{"workload": "mnist/fc_64_64_64", "optimizer": "sgd"}\n', "line 1: neither a prediction of batchlab predict "
                                                                 "--json (keys workload, optimizer, predictor"),
    ('{"predictor": "b_simple", "workload": "w", "optimizer": "sgd"}\n',
     "line 1: a prediction (batchlab predict --json) needs the keys workload, optimizer, predictor, "
     "critical_batch_size, low, high, examples, settings; missing critical_batch_size, low, high, examples, settings"),
    (GOOD.replace('"critical_batch_size": 6.0', '"critical_batch_size": "big"'),
     "line 1: critical_batch_size must be a number or null, got 'big'"),
    (GOOD.replace('"examples": 5', '"examples": true'), "line 1: examples must be a number or null, got True"),
    (json.dumps(noise_step(1.5, 2.0, 1.0, 3.0)), "line 1: step must be a whole number >= 0, got 1.5"),
    (json.dumps({**noise_step(1, 2.0, 1.0, 3.0), "b_simple_interval": [1, 3]}), "b_simple_interval must be a JSON"),
    (GOOD.replace('"steps_at": 100', '"steps_at": "late"'), "settings.steps_at must be a whole number >= 0"),
])
def test_bad_input_is_one_line_naming_file_and_line_and_writes_nothing(tmp_path, trials, text, message):
    from batchlab.report.build import build_report

    store = publish(tmp_path / "store", [t for t in trials if t["workload"] == SGD])
    out = tmp_path / "out"
    out.mkdir()
    path = tmp_path / "bad.jsonl"
    if text is not None:
        path.write_text(text)
    with pytest.raises(BatchlabError) as caught:
        build_report(store, out / "r.html", n_boot=5, predictions=[path])
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert f"--predictions {str(path)!r}" in str(caught.value)
    assert list(out.iterdir()) == []


def test_without_predictions_the_page_has_no_section(tmp_path, trials):
    from batchlab.report.build import build_report

    store = publish(tmp_path / "store", [t for t in trials if t["workload"] == SGD])
    summary = build_report(store, tmp_path / "r.html", n_boot=5)
    assert summary["predictions"] is None and summary["predictions_warnings"] is None
    html = (tmp_path / "r.html").read_text()
    assert 'id="predictions"' not in html and "#predictions" not in html
    assert summary["units"][0]["sweep_examples"] > 0


def test_within_2x_and_ratio_edges():
    import math

    from batchlab.report.predictions import ratios, within

    assert [within(x) for x in (0.5, 2.0, 0.49, 2.01, 2.5, None)] == [True, True, False, False, False, None]
    assert ratios(10.0, 5.0, 20.0, 4.0, 2.0, 8.0) == (2.5, 0.625, 10.0)
    assert ratios(10.0, None, None, 4.0, None, None) == (2.5, None, None)  # unbounded sides: no range end
    assert ratios(10.0, 5.0, 20.0, math.inf, 2.0, None) == (None, None, 10.0)  # an infinite B_crit: no ratio
    assert ratios(None, 5.0, None, 4.0, 2.0, 8.0) == (None, 0.625, None)


def test_a_prediction_without_an_interval_is_not_read_as_unbounded(tmp_path):
    """The calibrated NQM has no interval (empty interval_method, null low and high): the record says so,
    while a Fieller interval with an unbounded side stays an interval."""
    from batchlab.report.predictions import read_predictions

    no_interval = prediction("calibrated_nqm", 700.0)
    unbounded = prediction("b_noise", 300.0, 60.0, None)
    records = read_predictions([write_lines(tmp_path / "p.jsonl", [no_interval, unbounded])])
    assert [r.has_interval for r in records] == [False, True]
    assert records[1].high is None


def test_scores_each_predictor_on_its_own_beside_the_baselines(tmp_path, trials):
    """The section's scores (docs/methods.md, "Scoring predictors"): only the protocol checkpoint (here
    recorded as step 100) is scored, a bound is counted apart, and the two baselines are the workload's
    default batch size (128) and sqrt(8 * 128) = 32, all against the report's own B_crit."""
    import math

    from batchlab.report.build import build_report

    store = publish(tmp_path / "store", [t for t in trials if t["workload"] == SGD])
    path = write_lines(tmp_path / "p.jsonl", [
        prediction("b_simple", 6.0, 4.0, 9.0, protocol_steps_at=100),
        prediction("b_simple", 16.0, 12.0, 20.0, protocol_steps_at=100, steps_at=30),  # off the checkpoint
        prediction("b_noise", 30.0, 12.0, None, protocol_steps_at=100)], blank=False)
    summary = build_report(store, tmp_path / "r.html", n_boot=5, predictions=[path])
    bc = _b_crit(summary, SGD_UNIT)["value"]
    rows = {r["quantity"]: r for r in csv.DictReader((tmp_path / "r.csv").open()) if r["unit"] == "predictor scores"}
    assert float(rows["b_simple: n_points"]["value"]) == 1
    assert float(rows["b_simple: geometric_error"]["value"]) == pytest.approx(math.exp(abs(math.log(6.0 / bc))))
    assert float(rows["b_simple: within_2x_share"]["value"]) == (1.0 if 0.5 <= 6.0 / bc <= 2 else 0.0)
    assert (rows["b_noise: n_points"]["value"], rows["b_noise: n_bounds"]["value"]) == ("0", "1")
    assert rows["b_noise: geometric_error"]["value"] == ""
    for name, value in (("baseline: default batch size", 128.0), ("baseline: swept geometric mean", 32.0)):
        assert float(rows[f"{name}: geometric_error"]["value"]) == pytest.approx(math.exp(abs(math.log(value / bc))))


def test_scores_part_table_and_line_on_hand_made_units(tmp_path):
    from types import SimpleNamespace

    from batchlab.report.predictions import read_predictions, scores_part

    sizes = [SimpleNamespace(batch_size=b, n_trials=4) for b in (8, 32, 128)]
    unit = SimpleNamespace(key=SGD_UNIT, b_crit={"value": 40.0, "low": 20.0, "high": 80.0}, results=sizes)
    path = write_lines(tmp_path / "p.jsonl", [prediction("b_simple", 60.0, 40.0, 90.0, protocol_steps_at=100),
                                               prediction("b_noise", 30.0, 100.0, None, protocol_steps_at=100)])
    part = scores_part([unit], read_predictions([path]))
    assert part["line"] == ("prediction scores (1 units, protocol checkpoint): b_simple 1/1 within 2x, geometric "
                            "error 1.50x (on its points: default B 0/1 within 2x, error 3.20x, swept range 1/1 "
                            "within 2x, error 1.25x); b_noise 0/0 within 2x, geometric error -, 1 bounds "
                            "(0 consistent); "
                            "baseline: default batch size 0/1 within 2x, geometric error 3.20x; baseline: swept "
                            "geometric mean 1/1 within 2x, geometric error 1.25x")
    by = {row[0]: row for row in part["table"].rows}
    assert by["b_noise"][-1] == ">= 100 no" and by["b_simple"][-1] == "1.5x"
    assert part["json"]["units"] == [SGD_UNIT]


def test_each_predictor_is_compared_with_the_baselines_on_its_own_point_units(tmp_path):
    """Two units (B_crit 40 and 400; swept 8..128, default B 128): b_simple has a point only on the first,
    b_noise only a bound there and a point on the second. Each predictor's row gives the baselines on its
    point units; the baseline rows still count both units."""
    from types import SimpleNamespace

    from batchlab.report.predictions import read_predictions, scores_part

    sizes = [SimpleNamespace(batch_size=b, n_trials=4) for b in (8, 32, 128)]
    other = f"{SGD} [sweep bbbbbbbbbbbb]"
    units = [SimpleNamespace(key=SGD_UNIT, b_crit={"value": 40.0, "low": 20.0, "high": 80.0}, results=sizes),
             SimpleNamespace(key=other, b_crit={"value": 400.0, "low": 200.0, "high": 800.0}, results=sizes)]
    path = write_lines(tmp_path / "p.jsonl", [
        prediction("b_simple", 60.0, 40.0, 90.0, protocol_steps_at=100, unit=SGD_UNIT),
        prediction("b_noise", 30.0, 100.0, None, protocol_steps_at=100, unit=SGD_UNIT),
        prediction("b_noise", 300.0, 200.0, 450.0, protocol_steps_at=100, unit=other)])
    part = scores_part(units, read_predictions([path]))
    board = part["board"]
    simple, noise = board.predictors
    # default B 128: 3.2x on the first unit, 0.32x on the second; sqrt(8 * 128) = 32: 0.8x and 0.08x
    default_b, swept = board.baselines_on_points_of(simple)
    assert (default_b.n_points, default_b.n_within, swept.n_within) == (1, 0, 1)
    assert default_b.geometric_error == pytest.approx(3.2) and swept.geometric_error == pytest.approx(1.25)
    default_b, swept = board.baselines_on_points_of(noise)
    assert [u.unit for u in default_b.units] == [other]
    assert default_b.geometric_error == pytest.approx(400 / 128) and swept.geometric_error == pytest.approx(12.5)
    assert [b.n_points for b in board.baselines] == [2, 2]  # the all-units rows are kept
    by = {row[0]: row for row in part["table"].rows}
    columns = part["table"].columns
    cell = by["b_noise"][columns.index("baseline (swept range) on these units")]
    assert cell == "0/1 within 2x, error 12.50x"
    assert by["baseline: default batch size"][columns.index("baseline (default B) on these units")] == "-"
    rows = {r.quantity: r for r in part["csv"]}
    assert rows["b_noise: swept_range_on_these_units_geometric_error"].value == pytest.approx(12.5)
    assert rows["b_simple: default_b_on_these_units_within_2x_share"].value == 0.0
    (entry,) = part["json"]["predictors"][1]["baselines_on_these_units"][1:]
    assert (entry["n_points"], entry["geometric_error"]) == (1, pytest.approx(12.5))
