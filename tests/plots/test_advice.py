"""The trade-off figure of an advice record (batchlab.plots.advice): steps and time against batch size,
intervals as error bars, censored batch sizes as bounds, the recommendation marked, B_crit's interval
shaded, and a record with fields missing drawn without raising."""

import copy
import math

import numpy as np
import pytest

from batchlab.errors import BatchlabError
from batchlab.plots.advice import tradeoff_figure
from batchlab.report.content import render


def cell(value, low, high):
    return {"value": value, "low": low, "high": high}


def record():
    """A hand-made advice record (the format of docs/methods.md, "The report's Recommendation section")."""
    table = [
        {"batch_size": 8, "reached": True, "n_trials": 4, "steps": cell(800, 700, 950),
         "examples": cell(6400, 5600, 7600), "seconds": cell(8.0, 7.0, 9.5), "doubling": None, "recommended": False},
        {"batch_size": 32, "reached": True, "n_trials": 4, "steps": cell(260, 220, 310),
         "examples": cell(8320, 7040, 9920), "seconds": cell(3.1, 2.6, 3.7), "doubling": None, "recommended": True},
        {"batch_size": 128, "reached": True, "n_trials": 4, "steps": cell(150, 120, math.inf),
         "examples": cell(19200, 15360, math.inf), "seconds": cell(2.9, 2.3, math.inf), "doubling": None,
         "recommended": False},
        {"batch_size": 512, "reached": False, "n_trials": 4, "steps": cell(None, 400, None),
         "examples": cell(None, 204800, None), "seconds": cell(None, 9.0, None), "doubling": None,
         "recommended": False},
    ]
    return {"format": "batchlab-advice", "version": 1, "advice_id": "0123456789ab", "status": "done",
            "unit": "mnist/fc_64_64_64/sgd [sweep abcdef012345]", "settings": {"objective": "time", "level": 0.9},
            "rounds": [{"round": 1, "b_crit": {"value": 40.0, "low": 20.0, "high": 90.0}, "ratio": 4.5}],
            "recommendation": {"batch_size": 32, "objective": "time", "table": table}}


def span_ends(span) -> tuple[float, float]:
    """The x ends of an axvspan (a Rectangle, or a Polygon in older matplotlib)."""
    if hasattr(span, "get_width"):
        return float(span.get_x()), float(span.get_x() + span.get_width())
    xs = np.asarray(span.get_xy())[:, 0]
    return float(xs.min()), float(xs.max())


def spans_of(fig):
    return [a for a in by_gid(fig, "b_crit_interval") if hasattr(a, "get_xy")]


def by_gid(fig, gid):
    return [a for ax in fig.axes for a in ax.get_children() if a.get_gid() == gid]


def test_two_log_panels_with_the_recommendation_marked_and_b_crit_shaded():
    fig = tradeoff_figure(record())
    steps_ax, time_ax = fig.axes[:2]
    for ax in (steps_ax, time_ax):
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        assert ax.xaxis.get_transform().base == 2
    assert "steps" in steps_ax.get_ylabel() and "time" in time_ax.get_ylabel()
    # the reached points only: the censored B = 512 is not drawn as a point
    data = [a for a in steps_ax.get_children() if a.get_gid() == "data"]
    assert len(data) == 1 and list(data[0].get_xdata()) == [8, 32, 128]
    assert list(data[0].get_ydata()) == [800, 260, 150]
    time_data = [a for a in time_ax.get_children() if a.get_gid() == "data"][0]
    assert list(time_data.get_ydata()) == [8.0, 3.1, 2.9]
    # the recommended batch size: a vertical line at 32 in both panels and a star at its point
    lines = [a for a in by_gid(fig, "recommended") if len(a.get_xdata()) == 2]
    assert len(lines) == 2 and all(list(a.get_xdata()) == [32, 32] for a in lines)
    stars = [a for a in by_gid(fig, "recommended") if a.get_marker() == "*"]
    assert len(stars) == 2 and [list(s.get_ydata()) for s in stars] == [[260], [3.1]]
    # B_crit's interval [20, 90] shaded in both panels
    spans = spans_of(fig)
    assert len(spans) == 2
    for span in spans:
        assert span_ends(span) == pytest.approx((20.0, 90.0))
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "recommended batch size" in legend and any(t.startswith("B_crit (line) and its interval") for t in legend)


def test_intervals_bounds_and_unbounded_ends_are_drawn_as_such():
    fig = tradeoff_figure(record())
    steps_ax = fig.axes[0]
    # two-sided intervals at 8 and 32; 128's interval is unbounded above (a dotted stem, an open triangle)
    bars = [a for a in steps_ax.get_children() if a.get_gid() == "interval" and hasattr(a, "get_segments")]
    segments = [s for bar in bars for s in bar.get_segments()]
    assert sorted((float(s[0][0]), float(s[0][1]), float(s[1][1])) for s in segments) == [(8, 700, 950), (32, 220, 310)]
    assert any(a.get_gid() == "interval_unbounded" for a in steps_ax.get_children())
    # the censored B = 512 at its bound (400 steps; 9 s) with an upward arrow
    censored = [a for a in steps_ax.get_children() if a.get_gid() == "censored" and hasattr(a, "get_xdata")]
    assert any(list(a.get_xdata()) == [512] and list(a.get_ydata()) == [400] for a in censored)
    low, high = steps_ax.get_ylim()
    assert low < 150 and high > 950  # every point and interval end in view
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any("censored" in t for t in legend) and "interval unbounded above" in legend


def test_censored_only_record_and_unbounded_b_crit():
    rec = record()
    table = rec["recommendation"]["table"]
    for row in table:
        row["reached"] = False
        row["steps"] = cell(None, 1000, None)
        row["seconds"] = {"value": None}  # no bound known for the time
        row["recommended"] = False
    rec["recommendation"]["batch_size"] = None  # bounded: nothing recommended
    rec["rounds"][-1]["b_crit"] = {"value": None, "low": 100.0, "high": None}
    fig = tradeoff_figure(rec)
    assert render(fig)[:8] == b"\x89PNG\r\n\x1a\n"
    steps_ax, time_ax = fig.axes[:2]
    assert not [a for a in steps_ax.get_children() if a.get_gid() == "data"]
    assert [a for a in steps_ax.get_children() if a.get_gid() == "censored"]
    assert [a for a in time_ax.get_children() if a.get_gid() == "not_reached"]  # an x along the top edge
    assert not by_gid(fig, "recommended")
    spans = spans_of(fig)
    assert len(spans) == 2
    assert span_ends(spans[0]) == pytest.approx((100.0, steps_ax.get_xlim()[1]))


def test_missing_fields_are_left_out_and_no_table_is_one_line():
    rec = record()
    for row in rec["recommendation"]["table"]:
        del row["seconds"]
    del rec["rounds"]
    fig = tradeoff_figure(rec)  # no time, no B_crit: drawn without them
    render(fig)
    assert [a for a in fig.axes[1].get_children() if a.get_gid() == "no_values"]
    assert not by_gid(fig, "b_crit_interval")
    empty = copy.deepcopy(record())
    empty["recommendation"]["table"] = [{"batch_size": 64}]  # a row with no value at all still draws
    render(tradeoff_figure(empty))
    bare = copy.deepcopy(record())
    bare["recommendation"] = None
    with pytest.raises(BatchlabError, match="no trade-off table"):
        tradeoff_figure(bare)
    bare["recommendation"] = {"table": [{"batch_size": "a lot"}, "not a row"]}
    with pytest.raises(BatchlabError, match="no trade-off table"):
        tradeoff_figure(bare)


def test_rows_as_advise_writes_them_null_ends_and_censored_at():
    """advise writes a non-finite end as null and an unreached row as ``censored_at`` with null cells."""
    rec = record()
    table = rec["recommendation"]["table"]
    table[2]["steps"]["high"] = None  # unbounded above
    table[3].update(steps=None, examples=None, seconds=None, censored_at=400,
                    seconds_per_step={"value": 0.0225, "low": 0.02, "high": 0.025})
    fig = tradeoff_figure(rec)
    render(fig)
    steps_ax, time_ax = fig.axes[:2]
    stems = [a for a in steps_ax.get_children() if a.get_gid() == "interval_unbounded" and hasattr(a, "get_xdata")]
    assert [list(a.get_xdata()) for a in stems] == [[128]]
    for ax, bound in ((steps_ax, 400), (time_ax, 400 * 0.0225)):
        marks = [a for a in ax.get_children() if a.get_gid() == "censored" and hasattr(a, "get_xdata")]
        assert any(list(a.get_xdata()) == [512] and a.get_ydata()[0] == pytest.approx(bound) for a in marks)
