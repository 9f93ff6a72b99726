"""The report's Recommendation section (batchlab.report.recommendation): advice records read from
``<store>/advice/``, checked, and shown first on the page; damaged records are warnings, the rest of the
report stands; no advice directory, no section. The store is a small real one (synthetic trials
published through the store API; tests/report/report_fixtures.py), the records hand-made in the
format of docs/methods.md, "The report's Recommendation section"."""

import csv
import json
import re
import sys
from html import unescape
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report_fixtures import SWEEP, publish, unit_trials  # noqa: E402

from batchlab.report.content import slug  # noqa: E402
from batchlab.report.recommendation import (  # noqa: E402
    check_record,
    compute_text,
    read_advice_records,
    recommendation_section,
)

SGD = "mnist/fc_64_64_64/sgd"
UNIT = f"{SGD} [sweep {SWEEP}]"


def cell(value, low, high):
    return {"value": value, "low": low, "high": high}


def advice_record(advice_id="0123456789ab", status="done", lines=None):
    """A done record in the form batchlab.advise writes (recommendation: Recommendation.to_dict without
    its lines, unless ``lines`` are given; non-finite ends written as null)."""
    def row(b, steps, seconds_per_step, doubling=None, recommended=False, same=False):
        reached = steps is not None
        return {"batch_size": b, "reached": reached, "n_trials": 6, "n_reached": 5 if reached else 0,
                "censored_at": None if reached else 400,
                "steps": None if not reached else cell(*steps) | {"method": "scatter"},
                "examples": None if not reached else cell(*[None if v is None else v * b for v in steps]),
                "seconds_per_step": cell(*seconds_per_step),
                "seconds": None if not reached else cell(*[None if v is None else v * seconds_per_step[0]
                                                           for v in steps]),
                "doubling": doubling, "recommended": recommended, "indistinguishable": same}

    table = [row(8, (800, 700, 950), (0.01, 0.009, 0.011), cell(3.08, 2.26, 4.3)),
             row(32, (260, 220, 310), (0.0119, 0.011, 0.013), cell(1.73, 1.47, None), recommended=True, same=True),
             row(128, (150, 120, None), (0.0193, 0.018, 0.02), same=True),
             row(512, None, (0.0225, 0.02, 0.025))]
    recommendation = {
        "unit": UNIT, "goal": {"metric": "val/classification_error", "goal": 0.03, "maximize": False},
        "objective": "time", "level": 0.9, "batch_size": 32, "trial_id": 3,
        "hyperparameters": {"learning_rate": 0.0123, "momentum": 0.9},
        "steps": cell(260, 220, 310) | {"method": "scatter"}, "examples": cell(8320, 7040, 9920),
        "seconds": cell(3.1, 2.6, 3.7), "indistinguishable": [32, 128], "table": table,
        "learning_rate_rule": {
            "learning_rate": {"slope": 0.48, "low": 0.31, "high": 0.66, "n": 3, "rule": "square root",
                              "reason": "slope 0.5 is inside the interval and 1 is not"},
            "effective_learning_rate": None, "level": 0.9,
            "table": [{"batch_size": 8, "learning_rate": 0.006, "momentum": 0.9, "effective_learning_rate": 0.06,
                       "trial_id": 2},
                      {"batch_size": 32, "learning_rate": 0.0123, "momentum": 0.9, "effective_learning_rate": 0.123,
                       "trial_id": 3}]},
        "warmup": {"schedule": [[0, 8], [20000, 32]],
                   "predicted": {"label": "predicted", "model": "stationary curve", "saved_fraction": 0.12,
                                 "saved_fraction_low": 0.02, "saved_fraction_high": 0.2, "steps_added": 150,
                                 "seconds_added": None}},
        "warmup_reason": "",
        "check": {"low": 220, "high": 310, "method": "scatter", "level": 0.9},
        "bounded_by": [], "stop": {"reason": "target", "text": "target met"},
        "rests_on": {"trials_at_batch_size": 6, "reached_at_batch_size": 5, "trials": 24, "examples_spent": 100000,
                     "batch_sizes_measured": [8, 32, 128, 512], "batch_sizes_reached": [8, 32, 128]},
        "b_crit": {"value": 40.0, "low": 30.0, "high": 44.0}, "notes": [],
    }
    if lines is not None:
        recommendation["lines"] = lines
    return {
        "format": "batchlab-advice", "version": 1, "advice_id": advice_id, "status": status,
        "settings": {"workload": "mnist/fc_64_64_64", "store_workload": SGD, "optimizer": "sgd", "objective": "time",
                     "target_ratio": 1.5, "budget": {"examples": 2_000_000, "hours": None}, "device": "cpu",
                     "trials": 6, "level": 0.9, "seed": 0, "sweep": SWEEP, "candidates": [8, 32, 128, 512],
                     "bracket_rule": "predictors"},
        "unit": UNIT, "throughput": {"largest_fitting": 4096}, "bracket": {"text": "[16, 256] from b_simple"},
        "rounds": [{"round": 0, "action": "reference", "batch_sizes": [32], "trials": 6, "reason": "tune B0",
                    "examples_bound": 50000, "examples_after": 40000,
                    "b_crit": {"value": None, "low": None, "high": None}, "ratio": None},
                   {"round": 1, "action": "span bracket", "batch_sizes": [8, 128, 512], "trials": 6,
                    "reason": "span the bracket", "examples_bound": 90000, "examples_after": 100000,
                    "b_crit": {"value": 40.0, "low": 30.0, "high": 44.0}, "ratio": 1.47}],
        "spent": {"studies": 100000, "throughput": 5000, "predictors": 10000, "check": 5000, "total": 120000,
                  "seconds": 95.0},
        "full_protocol": {"examples": 1200000, "batch_sizes": [8, 16, 32, 64, 128, 256, 512], "trials": 6,
                          "rule": "every power of two from 8 to 512, 6 trials, full budgets"},
        "stop": {"reason": "target", "text": "target met: B_crit's interval high/low 1.47 <= 1.5"},
        "recommendation": recommendation,
        "check": {"batch_size": 32, "seed": 1000, "reached": True, "steps": 270, "steps_lower": 258,
                  "predicted_low": 220, "predicted_high": 310, "within": True, "examples": 8640, "seconds": 3.2,
                  "text": "B = 32, fresh seed 1000: goal reached at step 270, within the predicted [220, 310]"},
    }


def write(path: Path, record) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def section_of(html: str) -> str:
    """The Recommendation section's HTML: from its h2 to the next h2."""
    start = html.index('<h2 id="recommendation">')
    return html[start:html.index("<h2", start + 1)]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One store, reported without an advice directory, then with good, running and damaged records."""
    from batchlab.report.build import build_report

    root = tmp_path_factory.mktemp("advice_report")
    store = publish(root / "store", unit_trials(SGD, (8, 32, 128), 16))
    plain = build_report(store, root / "plain.html", n_boot=20)
    plain_html = (root / "plain.html").read_text()
    advice = store / "advice"
    write(advice / "0123456789ab.json", advice_record())
    write(advice / "1111aaaa2222.json", advice_record("1111aaaa2222", status="running")
          | {"recommendation": None, "check": None, "stop": None})
    (advice / "bad.json").write_text('{"format": "batchlab-advice", "version": 1,')  # cut short
    (advice / "latin1.json").write_bytes(json.dumps({"unit": "caf\u00e9"}, ensure_ascii=False).encode("latin-1"))
    write(advice / "missing.json", {"format": "batchlab-advice", "version": 1, "advice_id": "feedfeedfeed"})
    write(advice / ".tmp-0a1b2c3d-0123456789ab.json", {"half": "written"})  # an atomic write cut short: ignored
    (advice / "notes.txt").write_text("not a record")
    summary = build_report(store, root / "r.html", n_boot=20)
    html = (root / "r.html").read_text()
    rows = list(csv.DictReader((root / "r.csv").open()))
    return {"plain": plain, "plain_html": plain_html, "summary": summary, "html": html, "rows": rows}


def test_the_section_comes_first_with_the_answer_table_figure_and_compute(built):
    html = built["html"]
    headings = re.findall(r'<h2 id="([^"]+)"', html)
    assert headings[0] == "recommendation" and "run" in headings
    unit_at = html.index(f'<h2 id="{slug(UNIT)}">')
    assert html.index('<h2 id="recommendation">') < html.index('<h2 id="run">') < unit_at
    assert '<a href="#recommendation">recommendation</a>' in html  # the Contents line
    text = unescape(section_of(html))
    # the answer, made from the record's fields (it carries no lines of its own)
    assert "batch size 32 (objective: time), metaparameters learning_rate 0.0123, momentum 0.9 (trial 3)" in text
    assert "to the goal: steps 260 [220, 310], examples 8320 [7040, 9920], time 3.1 s [2.6 s, 3.7 s]" in text
    assert "as good within the intervals: B = 32, 128" in text
    assert ("rests on: 6 trials at the batch size (5 reached the goal), 24 trials in all, over B = 8, 32, 128, 512, "
            "100000 examples spent") in text
    # the trade-off table: every measured batch size, the recommended row marked, the censored one a bound
    table = re.search(r"<caption>Trade-off around the recommendation.*?</table>", section_of(html), re.S).group(0)
    body = re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>")[1])
    assert [re.findall(r"<td>(.*?)</td>", r)[0] for r in body] == ["8", "32", "128", "512"]
    cells = [re.findall(r"<td>(.*?)</td>", unescape(r)) for r in body]
    assert [c[-1] for c in cells] == ["", "recommended", "as good within the intervals", ""]
    assert cells[3][1:6] == ["no (censored)", "0/6 reached", "> 400", "> 204800", "> 9 s"]  # 400 steps x 0.0225 s
    assert cells[2][3] == "150 [120, inf]" and cells[2][5] == "2.9 s [2.32 s, inf]"  # null high: unbounded
    assert cells[1][1:7] == ["yes", "5/6 reached", "260 [220, 310]", "8320 [7040, 9920]", "3.09 s [2.62 s, 3.69 s]",
                             "1.73 [1.47, inf]"]
    # the figure, embedded in the section
    fig_id = slug(f"{UNIT} advice 0123456789ab tradeoff")
    assert fig_id == "mnist-fc-64-64-64-sgd-sweep-abcdef012345-advice-0123456789ab-tradeoff"
    assert f'<img data-figure="{fig_id}"' in section_of(html)
    assert section_of(html).count("<figure>") == 1  # the running record has no table, so no figure
    # the rule, the warmup, the stop, the check and the compute line
    assert ("learning-rate rule (learning rate): square root (measured log-log slope on batch size 0.48 [0.31, 0.66] "
            "over 3 reached batch sizes; slope 0.5 is inside the interval and 1 is not)") in text
    assert ("batch-size warmup: B = 8 from 0 examples; B = 32 from 20000 examples; predicted saving 0.12 [0.02, 0.2] "
            "of the examples") in text
    assert "<td>0.123</td>" in section_of(html)  # the rule's points: the effective learning rate at B = 32
    assert "stopped: target met: B_crit's interval high/low 1.47 <= 1.5" in text
    assert "check: B = 32, fresh seed 1000: goal reached at step 270, within the predicted [220, 310]" in text
    assert ("compute: advise spent 120000 examples (studies 100000, throughput 5000, predictors 10000, check 5000, "
            "95 s of wall clock) = 0.1 (10x less) of the full protocol's 1200000 examples (every power of two from "
            "8 to 512, 6 trials, full budgets)") in text
    assert "<script" not in html.lower()


def test_running_and_damaged_records_are_lines_and_the_rest_stands(built):
    html, summary = built["html"], built["summary"]
    text = unescape(section_of(html))
    assert "advise has not finished (round 1)" in text
    warnings = summary["advice_warnings"]
    assert len(warnings) == 4, warnings
    assert warnings[-1] == f"2 advice records name the unit {UNIT!r}; each is shown"
    assert any(w.startswith("advice/bad.json: not JSON") for w in warnings)
    assert any(w.startswith("advice/latin1.json: not UTF-8 text") for w in warnings)
    assert any(w.startswith("advice/missing.json: missing keys status, settings, unit, rounds") for w in warnings)
    for w in warnings:
        assert unescape(w) in text or w in text
    assert ".tmp-" not in text and "notes.txt" not in text
    # the rest of the report as without advice: the same figures after the section, the same unit lines
    after = html[html.index('<h2 id="run">'):]
    plain = built["plain_html"]
    assert re.findall(r'data-figure="([^"]+)"', after) == re.findall(r'data-figure="([^"]+)"', plain)
    assert summary["lines"][2:] == built["plain"]["lines"]
    assert summary["lines"][0].startswith(f"advice {UNIT}: batch size 32 (objective: time)")
    assert summary["lines"][1] == f"advice {UNIT}: advise has not finished (round 1)"
    assert [a["advice_id"] for a in summary["advice"]] == ["0123456789ab", "1111aaaa2222"]
    # the CSV: the trade-off table's numbers, the recommendation and the compute
    mine = [r for r in built["rows"] if r["section"] == "advice"]
    steps = {r["batch_size"]: r for r in mine if r["quantity"] == "steps_to_goal"}
    assert (steps["32"]["value"], steps["32"]["lower"], steps["32"]["upper"]) == ("260", "220", "310")
    assert any(r["quantity"] == "steps_more_than" and r["batch_size"] == "512" and r["lower"] == "400" for r in mine)
    assert any(r["quantity"] == "recommended_batch_size" and r["value"] == "32" for r in mine)
    assert any(r["quantity"] == "examples_full_protocol" and r["value"] == "1200000" for r in mine)


def test_no_advice_directory_no_section(built):
    plain, html = built["plain"], built["plain_html"]
    assert 'id="recommendation"' not in html and "#recommendation" not in html
    assert plain["advice"] is None and plain["advice_warnings"] is None
    assert not any(line.startswith("advice ") for line in plain["lines"])


def test_records_are_checked_and_never_raise(tmp_path):
    assert read_advice_records(tmp_path) == ([], [])
    assert recommendation_section(tmp_path) is None
    advice = tmp_path / "advice"
    good = advice_record()
    cases = {
        "a.json": good,
        "b.json": [1, 2],
        "c.json": good | {"version": "1"},
        "d.json": good | {"version": 2},
        "e.json": good | {"status": "finished"},
        "f.json": good | {"rounds": {"round": 0}},
        "g.json": good | {"recommendation": [32]},
        "h.json": good | {"format": "something-else"},
        "i.json": {k: v for k, v in good.items() if k != "stop"},
        "j.json": good | {"recommendation": good["recommendation"] | {"table": "a table"}},
        "k.json": good | {"version": True},
        "l.json": good | {"unit": 7},
    }
    for name, record in cases.items():
        write(advice / name, record)
    (advice / "m.json").write_bytes(b"")
    (advice / "n.json").write_bytes(b"\xff\xfe{\x00}\x00")
    (advice / "o.json").mkdir()
    records, problems = read_advice_records(tmp_path)
    assert [r["_file"] for r in records] == ["a.json"]
    assert records[0]["recommendation"]["batch_size"] == 32
    expected = {"b.json": "a list in JSON, not an object", "c.json": "version '1'", "d.json": "version 2",
                "e.json": "status 'finished'", "f.json": "rounds is an object, not a list",
                "g.json": "recommendation is a list, not an object or null", "h.json": "format 'something-else'",
                "i.json": "a done record missing key stop", "j.json": "recommendation.table is a string",
                "k.json": "version True", "l.json": "unit is a number, not a string", "m.json": "not JSON",
                "n.json": "not UTF-8 text", "o.json": "not a file"}
    assert len(problems) == len(expected), problems
    for problem, (name, what) in zip(problems, sorted(expected.items())):
        assert problem.startswith(f"advice/{name}: ") and what in problem and problem.endswith("; not shown"), problem
    # a running record may lack what only the end writes
    running = {k: v for k, v in good.items() if k not in ("stop", "spent", "full_protocol", "recommendation", "check")}
    assert check_record(running | {"status": "running"}) is None
    # "advice" that is not a directory: one problem line
    other = tmp_path / "other"
    other.mkdir()
    (other / "advice").write_text("x")
    assert read_advice_records(other) == ([], ["advice: not a directory; no advice record read"])


def test_missing_optional_fields_render_as_dashes_and_lines_are_used(tmp_path):
    from batchlab.report.html import recommendation_html

    advice = tmp_path / "advice"
    bare = {k: advice_record()[k] for k in ("format", "version", "advice_id", "status", "settings", "unit", "rounds")}
    write(advice / "a.json", bare | {"status": "done", "spent": None, "full_protocol": None, "stop": None,
                                     "recommendation": {"batch_size": 64, "table": [{"batch_size": 64}]}})
    lines = ["use B = 32 at learning rate 0.0123 (momentum 0.9)", "steps 260 [220, 310] to the goal"]
    write(advice / "b.json", advice_record("bbbbbbbbbbbb", lines=lines))
    section = recommendation_section(tmp_path, [UNIT])
    assert section["warnings"] == [f"2 advice records name the unit {UNIT!r}; each is shown"]
    html = unescape(recommendation_html(section))
    assert "batch size 64 (objective: time), metaparameters - (trial -)" in html
    assert "to the goal: steps -, examples -, time -" in html
    assert "compute: advise spent - examples (studies -, throughput -, predictors -, check -) = - of the full " \
           "protocol's - examples (-)" in html
    assert "check: -" in html and "stopped: -" in html and "learning-rate rule: -" in html
    assert "use B = 32 at learning rate 0.0123 (momentum 0.9)<br>steps 260 [220, 310] to the goal" in html
    assert html.count("<figure>") == 2  # the one-row table still draws
    assert f'href="#{slug(UNIT)}"' in html
    assert section["lines"][1] == f"advice {UNIT}: use B = 32 at learning rate 0.0123 (momentum 0.9)"
    assert compute_text({}).startswith("compute: advise spent - examples")
    # a record naming a unit the store does not have is shown, with a warning
    section = recommendation_section(tmp_path, ["another/unit [sweep 000000000000]"])
    assert len(section["entries"]) == 2
    assert [w for w in section["warnings"] if "is not a unit of this store's trials" in w] == [
        f"advice/{name}: its unit {UNIT!r} is not a unit of this store's trials (shown anyway)"
        for name in ("a.json", "b.json")]
    assert all(e["unit_anchor"] is None for e in section["entries"])  # no link to a section that is not there


def test_a_directory_holding_only_advice_can_become_a_store(tmp_path):
    from batchlab.store import Store

    (tmp_path / "s" / "advice").mkdir(parents=True)
    Store.open(tmp_path / "s", create=True)
    assert (tmp_path / "s" / "batchlab-store.json").is_file()


def test_a_record_as_advise_writes_it_shows_advises_own_lines(tmp_path):
    """The recommendation as batchlab.advise.recommend.Recommendation writes it (its own ``lines``, the
    table, the rule), in a record whose check is a CheckResult's dict; a running record without a unit yet."""
    from batchlab.advise.recommend import Recommendation
    from batchlab.report.html import recommendation_html

    record = advice_record()
    rec = Recommendation.from_dict(record["recommendation"])
    record["recommendation"] = json.loads(json.dumps(rec.to_dict()))
    assert record["recommendation"]["lines"] == rec.lines()
    record["check"] = {"batch_size": 32, "seed": 1000003, "hyperparameters": {"learning_rate": 0.0123},
                       "steps_budget": 4000, "reached": True, "steps": 270, "steps_lower": 258, "predicted_low": 220.0,
                       "predicted_high": None, "within": True, "examples": 8640, "seconds": 3.2, "text": "check: ok"}
    write(tmp_path / "advice" / "a.json", record)
    running = advice_record("cccccccccccc", status="running") | {"unit": None, "recommendation": None, "check": None,
                                                                  "stop": None, "rounds": []}
    write(tmp_path / "advice" / "b.json", running)
    section = recommendation_section(tmp_path, [UNIT])
    assert section["warnings"] == []
    html = unescape(recommendation_html(section))
    for line in rec.lines():
        assert line in html, line
    assert "check: ok" in html and "check: check:" not in html and html.count("<figure>") == 1
    assert f"{SGD} (unit not known yet)" in html and "advise has not finished (no round recorded yet)" in html
    assert section["lines"] == [f"advice {UNIT}: {rec.lines()[0]}", f"advice {SGD} (unit not known yet): advise has not finished (no round recorded yet)"]
