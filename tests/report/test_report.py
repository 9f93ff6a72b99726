"""``batchlab.report``: the page, the CSV and the summary from small real stores (synthetic trials
published through the store API; tests/report/report_fixtures.py)."""

import csv
from html import unescape
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report_fixtures import E, GOAL, SWEEP, publish, unit_trials  # noqa: E402

from batchlab.errors import BatchlabError  # noqa: E402

def same(cell: str, value, rel: float) -> bool:
    """Whether a CSV cell holds ``value`` (an empty cell: None) to within ``rel``."""
    return (cell == "" and value is None) or (cell != "" and value is not None and float(cell) == pytest.approx(value, rel=rel))


SGD, MOM, ADAM = "mnist/fc_64_64_64/sgd", "mnist/fc_64_64_64/momentum", "mnist/fc_64_64_64/adam"
SIZES = (8, 32, 128)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from batchlab.report.build import build_report

    root = tmp_path_factory.mktemp("report")
    trials = (unit_trials(SGD, SIZES, 16) + unit_trials(MOM, SIZES, 64)
              + unit_trials(ADAM, SIZES, 64, trials=2, budget=200, reach=False))
    store = publish(root / "store", trials)
    summary = build_report(store, root / "r.html", n_boot=20)
    html = (root / "r.html").read_text()
    rows = list(csv.DictReader((root / "r.csv").open()))
    return store, summary, html, rows


def test_summary_lines_name_each_unit_and_the_ratio(built):
    _, summary, _, _ = built
    lines = summary["lines"]
    assert lines[0] == "mnist/fc_64_64_64 adam: no goal reached (val/classification_error < 0.03 at none of 3 batch sizes)"
    assert re.match(r"mnist/fc_64_64_64 momentum: B_crit \S+ \[\S+, \S+\] \(90%, fit of 3 batch sizes", lines[1])
    assert re.match(r"mnist/fc_64_64_64 sgd: B_crit \S+ \[\S+, \S+\] \(90%, fit of 3 batch sizes", lines[2])
    assert re.match(r"mnist/fc_64_64_64: momentum/sgd B_crit ratio \S+ \(difference (held|suggestive|not shown) "
                    r"by the intervals\)$", lines[3])
    assert len(lines) == 4


def test_page_is_self_contained_with_every_figure_in_a_figure_element(built):
    _, _, html, _ = built
    ids = re.findall(r'<img data-figure="([^"]+)" alt="[^"]+" src="data:image/png;base64,', html)
    for unit in ("sgd", "momentum"):
        for kind in ("steps", "metaparameters", "best-measurement"):
            assert f"mnist-fc-64-64-64-{unit}-sweep-{SWEEP}-{kind}" in ids
    assert f"mnist-fc-64-64-64-momentum-sweep-{SWEEP}-lr-momentum" in ids
    assert f"mnist-fc-64-64-64-sweep-{SWEEP}-compare" in ids
    assert len(ids) == len(set(ids)) == html.count("<figure>") == html.count("<figcaption>")
    assert '<a href="r.csv">' in html
    assert "<script" not in html.lower() and "http://" not in html and "https://" not in html
    # the unreached unit still has its section, which says so
    assert "mnist/fc_64_64_64/adam [sweep" in html and "no goal reached" in html
    assert "no learning-rate/momentum scatter: the optimizer has no momentum parameter" in html
    assert "Learning-rate scaling verdict" in html and "What was run" in html and "batchlab version" in html
    assert html.count("trials published: 20") == 3  # every unit says when its trials were published


def test_csv_numbers_are_the_analysis_numbers(built):
    from batchlab.analysis.bootstrap import critical_batch_size_with_intervals
    from batchlab.analysis.selection import Selection
    from batchlab.analysis.steps_to_result import steps_to_result
    from batchlab.store import Store

    store, summary, _, rows = built
    con = Store.open(store).connect()
    try:
        for workload in (SGD, MOM):
            unit = f"{workload} [sweep {SWEEP}]"
            mine = {(r["quantity"], r["batch_size"]): r for r in rows if r["unit"] == unit}
            estimate = critical_batch_size_with_intervals(
                con, Selection(workload, E, GOAL, studies=(SWEEP,)), n_boot=20, level=0.9, seed=0).to_dict()
            b_crit = estimate["critical_batch_sizes"]["mccandlish_b_crit"]
            row = mine[("mccandlish_b_crit", "")]
            for cell, value in ((row["value"], b_crit["value"]), (row["lower"], b_crit["low"]),
                                (row["upper"], b_crit["high"])):
                assert same(cell, value, rel=1e-12)  # an empty cell: None (an unbounded side)
            for r in steps_to_result(con, workload, E, GOAL, studies=(SWEEP,)):
                if r.reached:
                    got = mine[("steps", str(r.batch_size))]
                    assert (int(got["value"]), int(got["lower"])) == (r.steps, r.steps_lower)
                assert int(mine[("n_trials", str(r.batch_size))]["value"]) == r.n_trials
    finally:
        con.close()
    units = {u["unit"]: u for u in summary["units"]}
    assert units[f"{ADAM} [sweep {SWEEP}]"]["status"] == "unreached"
    assert {r["section"] for r in rows} >= {"steps_to_result", "critical_batch_size", "fit", "metaparameters",
                                            "verdict", "best_measurement", "comparison", "tuning_flags"}


def test_units_follow_the_sweep_rule_and_never_pool_settings(tmp_path):
    from batchlab.report.units import find_units
    from batchlab.store import Store

    # a sweep whose B=8 study grew a round: only round 1 is analysed there
    trials = unit_trials(SGD, (8, 32), 16, trials=2)
    publish(tmp_path / "s", trials)
    grown = [dict(t, trial_id=t["trial_id"] + 100000) for t in unit_trials(SGD, (8,), 16, trials=2, budget=8000)]
    from batchlab.store import TrialRecord, publish_trials
    from batchlab.store.studies import make_study_definition

    store = Store.open(tmp_path / "s")
    records = []
    for t in grown:
        d = make_study_definition(workload=SGD, batch_size=8, train_steps=8000, stop_rule={"metric": E, "goal": GOAL,
                                  "maximize": False}, seed=0, sweep=SWEEP, budget_round=1)
        records.append(TrialRecord(SGD, 8, t["trial_id"], f"g{t['trial_id']}", t["parameters"], t["status"],
                                   max(s for s, _ in t["rows"]),
                                   measurements=[(s, m, v) for s, vals in t["rows"] for m, v in vals.items()],
                                   study_definition=d))
    # and two `train`-like studies at B=64 with other budgets (no sweep): split into one unit each
    for i, budget in enumerate((300, 600)):
        d = make_study_definition(workload=SGD, batch_size=64, train_steps=budget, seed=i, source="batchlab")
        records.append(TrialRecord(SGD, 64, 200 + i, f"t{i}", {"learning_rate": 0.1}, "COMPLETE", budget,
                                   measurements=[(budget, E, 0.01)], study_definition=d))
    publish_trials(store, records)
    con = store.connect()
    try:
        units = find_units(con)
    finally:
        con.close()
    groups = sorted(u.group for u in units)
    assert groups[-1] == f"sweep {SWEEP}" and sum(g.startswith("study ") for g in groups) == 2
    sweep = next(u for u in units if u.group == f"sweep {SWEEP}")
    assert sorted(sweep.batch_study) == [8, 32]
    assert sweep.definitions[sweep.batch_study[8]]["budget_round"] == 1
    assert len(sweep.skipped_studies) == 1 and "budget round 0" in next(iter(sweep.skipped_studies.values()))


def test_raced_studies_render_and_say_what_the_analysis_refuses(tmp_path):
    from batchlab.report.build import build_report

    store = publish(tmp_path / "store", unit_trials(MOM, SIZES, 64, trials=6), race=True)
    summary = build_report(store, tmp_path / "raced.html", n_boot=10)
    html = unescape((tmp_path / "raced.html").read_text())
    unit = summary["units"][0]
    assert unit["status"] == "analysed" and unit["b_crit"] is not None
    raced = sum(v.get("RACED", 0) for v in unit["trials_by_batch_size"].values())
    assert raced > 0 and "RACED" in html
    # budgets beyond a raced trial's stop are refused in words; the largest budget within every raced
    # curve is added and drawn
    assert "refused by the analysis" in html and "the largest within every raced trial" in html
    assert f'data-figure="mnist-fc-64-64-64-momentum-sweep-{SWEEP}-best-measurement"' in html


def test_bad_inputs_are_one_line_errors_and_write_nothing(tmp_path, built):
    from batchlab.report.build import build_report
    from batchlab.store import Store

    store = built[0]
    empty = tmp_path / "empty"
    Store.open(empty, create=True)
    unreached = publish(tmp_path / "unreached", unit_trials(SGD, SIZES, 16, trials=2, budget=100, reach=False))
    cases = [
        (empty, tmp_path / "a.html", "holds no trials"),
        (unreached, tmp_path / "a.html", "no unit of store"),
        (store, tmp_path / "a.htm", "must end in .html"),
        (store, tmp_path / "missing" / "a.html", "does not exist"),
        (tmp_path / "nostore", tmp_path / "a.html", "no batchlab store"),
    ]
    with pytest.raises(BatchlabError, match="--bootstrap must be an integer >= 1"):
        build_report(store, tmp_path / "a.html", n_boot=0)
    for src, out, message in cases:
        with pytest.raises(BatchlabError, match=re.escape(message)) as info:
            build_report(src, out, n_boot=1)
        assert "\n" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "unreached"]


def test_tuning_flags_in_the_page_the_csv_the_figure_and_b_crit_without_them(tmp_path, monkeypatch):
    from batchlab.analysis.bootstrap import critical_batch_size_with_intervals
    from batchlab.analysis.selection import Selection
    from batchlab.plots import shallue
    from batchlab.report.build import build_report
    from batchlab.store import Store

    # B=8 rests on its only trial (the others removed); B=16 is then better than perfect scaling; B=64
    # and B=512 search the same learning rates (b % 7 == 1) and the same one wins at both
    trials = [t for t in unit_trials(SGD, (8, 16, 32, 64, 128, 512), 64, trials=4)
              if t["batch_size"] != 8 or t["trial_id"] == 2]
    drawn = []
    original = shallue.steps_to_result_figure

    def recording(curves, **kwargs):
        fig = original(curves, **kwargs)
        drawn.append((kwargs.get("flagged"), [a for a in fig.axes[0].get_children() if a.get_gid() == "tuning_flag"]))
        return fig

    monkeypatch.setattr(shallue, "steps_to_result_figure", recording)
    summary = build_report(publish(tmp_path / "store", trials), tmp_path / "r.html", n_boot=20)
    html = unescape((tmp_path / "r.html").read_text())
    table = list(csv.DictReader((tmp_path / "r.csv").open()))
    rows = [r for r in table if r["section"] == "tuning_flags"]
    flags = [(r["batch_size"], r["quantity"]) for r in rows if r["batch_size"]]
    assert flags == [("8", "one_reaching_trial"), ("16", "better_than_perfect_scaling"), ("64", "shared_grid_point"),
                     ("512", "shared_grid_point")]
    messages = [r["note"] for r in rows if r["batch_size"]]
    assert messages[0] == "batch size 8: steps to result 596 rests on its only trial; its scatter is unknown"
    assert messages[1].startswith("batch size 16: S(32) x 32 = 6208 examples < S(16) x 16 = 7120 / (1 + 0.1)")
    assert messages[2].startswith("batch size 64: the best trial's learning_rate = 0.3194 (also at B = 512)")
    # the page: the flags table with each message, and the fits with and without them
    assert "Tuning flags" in html and all(m in html for m in messages)
    assert "with and without the flagged batch sizes" in html and "left out: B = 8 (one_reaching_trial), 16" in html
    # the figure: the flagged batch sizes are ringed
    (flagged, rings), = [d for d in drawn if d[0] is not None]
    assert flagged == [[8, 16, 64, 512]] and len(rings) == 1 and list(rings[0].get_xdata()) == [8, 16, 64, 512]
    assert "ringed in red (B = 8, 16, 64, 512)" in html
    # with every point: the unit's B_crit; without: the same fit on a store without those batch sizes
    by_quantity = {r["quantity"]: r for r in rows}
    headline = next(r for r in table if r["quantity"] == "mccandlish_b_crit")
    assert [by_quantity["b_crit_all_points"][k] for k in ("value", "lower", "upper")] == [
        headline[k] for k in ("value", "lower", "upper")]
    for quantity, dropped in (("b_crit_without_point_flags", (8, 16)), ("b_crit_without_flagged", (8, 16, 64, 512))):
        store = publish(tmp_path / quantity, [t for t in trials if t["batch_size"] not in dropped])
        con = Store.open(store).connect()
        try:
            kept = critical_batch_size_with_intervals(con, Selection(SGD, E, GOAL, studies=(SWEEP,)), n_boot=20,
                                                      level=0.9, seed=0).to_dict()["critical_batch_sizes"]
        finally:
            con.close()
        row, kept = by_quantity[quantity], kept["mccandlish_b_crit"]
        for cell, value in ((row["value"], kept["value"]), (row["lower"], kept["low"]), (row["upper"], kept["high"])):
            assert same(cell, value, rel=1e-9)
    (line,) = summary["lines"]
    assert "; tuning flags at B=8, 16, 64, 512; B_crit without them " in line and ", without B=8, 16 only " in line
    unit = summary["units"][0]
    assert unit["b_crit"]["flagged_batch_sizes"] == [8, 16, 64, 512]
    assert unit["b_crit"]["point_flagged_batch_sizes"] == [8, 16]
    assert same(by_quantity["b_crit_without_flagged"]["value"], unit["b_crit"]["without_flagged"]["b_crit"], rel=1e-12)


def test_a_poor_fit_line_names_what_is_wrong(tmp_path):
    """Issue 21: the summary line said "the curve is not a hyperbola within its brackets" for every
    poor fit; it now gives the fit's misfit (a rise, a bend, scatter at named batch sizes). Known truth:
    B = 64 needs 5x the hyperbola's steps, with 16 trials per batch size (a small trials' scatter)."""
    from batchlab.report.build import build_report

    trials = [t for b in (8, 16, 32, 64, 128, 256, 512)
              for t in unit_trials(SGD, (b,), 64, trials=16, s_min=60.0 * (5.0 if b == 64 else 1.0))]
    summary = build_report(publish(tmp_path / "store", trials), tmp_path / "r.html", n_boot=20)
    (unit,) = summary["units"]
    misfit = unit["b_crit"]["misfit"]
    assert unit["b_crit"]["poor_fit"] and "B = " in misfit and "64" in misfit
    (line,) = summary["lines"]
    assert f"; poor fit: {misfit}" in line and "not a hyperbola" not in line


@pytest.mark.parametrize("a, b, verdict", [
    ({"value": 100, "low": 80, "high": 120}, {"value": 300, "low": 200, "high": 400}, "held"),
    ({"value": 100, "low": 60, "high": 180}, {"value": 250, "low": 150, "high": 400}, "suggestive"),
    ({"value": 100, "low": 60, "high": 260}, {"value": 250, "low": 150, "high": 400}, "not shown"),
    ({"value": 100, "low": 80, "high": None}, {"value": 300, "low": 200, "high": None}, "not shown"),
    ({"value": 100, "low": None, "high": 120}, {"value": 300, "low": 200, "high": None}, "held"),
    ({"value": None, "low": None, "high": None}, {"value": 300, "low": 200, "high": 400}, "not shown"),
])
def test_a_difference_is_held_only_when_the_intervals_say_so(a, b, verdict):
    from batchlab.report.comparisons import difference_verdict

    assert difference_verdict(a, b) == verdict == difference_verdict(b, a)



def test_summary_says_at_least_when_the_perfect_scaling_end_is_undetermined(tmp_path):
    """An unreached B=64 (followed to 200 steps) decides nothing: the end is undetermined beyond B=32,
    not "perfect scaling beyond" (that is only for every measured batch size still scaling)."""
    from batchlab.report.build import build_report

    trials = []
    for b, hit in ((16, 1000), (32, 500), (64, None), (128, 130), (256, 120)):
        last = 200 if hit is None else hit
        for i in range(3):
            rows = [(s, {E: 0.5}) for s in range(10, last, 10)] + [(last, {E: 0.5 if hit is None else GOAL * 0.9})]
            trials.append({"workload": "toy/mlp/sgd", "batch_size": b, "trial_id": i + 1,
                           "status": "COMPLETE" if hit is None else "STOPPED_AT_GOAL",
                           "parameters": {"learning_rate": 0.01 * (i + 1)}, "rows": rows})
    (line,) = build_report(publish(tmp_path / "store", trials), tmp_path / "r.html", n_boot=20)["lines"]
    assert "perfect scaling to at least B=32 (undetermined beyond)" in line
    assert "perfect scaling beyond" not in line
