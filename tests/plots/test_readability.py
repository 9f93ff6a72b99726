"""Figures a new user can read: enough labelled ticks on narrow log axes, one-sided and missing
intervals drawn and named, not-reached marks that never hide each other, and a learning-rate/momentum
grid instead of a long strip with a colour bar for its contours."""

import numpy as np
import pandas as pd
import pytest

from batchlab.analysis.curve import StepsCurve
from batchlab.plots.axes import readable_log_ticks
from batchlab.plots.shallue import steps_to_result_figure
from batchlab.plots.tuning import lr_momentum_scatter_figure, scatter_columns


def labelled_ticks(axis) -> list[float]:
    """The tick positions inside the view limits whose label (major or minor) is not empty, as the
    axis would draw them."""
    lo, hi = sorted(axis.get_view_interval())
    labelled = set()
    for locator, formatter in ((axis.get_major_locator(), axis.get_major_formatter()),
                               (axis.get_minor_locator(), axis.get_minor_formatter())):
        locs = [float(t) for t in locator() if lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9)]
        formatter.set_locs(locs)
        labelled |= {t for t in locs if formatter(t).strip()}
    return sorted(labelled)


def by_gid(ax, gid):
    return [a for a in ax.get_children() if a.get_gid() == gid]


def legend_texts(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_narrow_log2_steps_axis_gets_at_least_three_labels():
    # steps between 300 and 700: a log2 axis would label 2^9 alone
    curve = StepsCurve.from_points([(64, 700), (128, 420), (256, 330), (512, 300)], label="plateau")
    ax = steps_to_result_figure([curve], perfect_scaling=False, regimes=False).axes[0]
    labels = labelled_ticks(ax.yaxis)
    assert len(labels) >= 3, labels
    assert all(300 / 2 <= t <= 700 * 2 for t in labels)


@pytest.mark.parametrize("base, lo, hi", [(10, 7000, 2.1e4), (10, 0.02, 0.5), (10, 0.061, 0.072),
                                          (2, 300, 700), (2, 1000, 1100), (10, 1e-3, 1e3)])
def test_readable_log_ticks_on_any_range(base, lo, hi):
    from matplotlib.figure import Figure

    ax = Figure().add_subplot()
    ax.plot([1, 2], [lo, hi])
    ax.set_yscale("log", base=base)
    ax.set_ylim(lo, hi)
    readable_log_ticks(ax)
    labels = labelled_ticks(ax.yaxis)
    assert len(labels) >= 3, (base, lo, hi, labels)
    texts = [ax.yaxis.get_major_formatter()(t) for t in labels]
    assert len(set(texts)) == len(texts)  # distinct labels


def test_one_sided_and_missing_intervals_are_drawn_and_named():
    curve = StepsCurve.from_points([(2, 8000), (4, 4100), (8, 2200), (16, 1300), (32, None)], label="w")
    bounds = [(None, 9000), (None, None), (None, 2600), (None, None), (None, None)]
    ax = steps_to_result_figure([curve], intervals=[bounds], interval_label="90% bound").axes[0]
    (bars,) = [c for c in ax.containers if c.get_label() == "_interval"]
    segments = [seg[:, 1].tolist() for seg in bars[2][0].get_segments()]
    assert segments == [[8000, 9000], [2200, 2600]]  # from the point up to the upper bound
    stems = [a for a in by_gid(ax, "interval_unbounded") if hasattr(a, "get_segments")]
    (stem,) = stems  # the reached points without an upper bound: B = 4 and 16 (B = 32 is not reached)
    assert [seg[0, 1] for seg in stem.get_segments()] == [4100, 1300]
    texts = legend_texts(ax)
    assert "90% bound (one-sided: an upper bound only; no lower bound exists)" in texts
    assert "interval unbounded above (too few trials reached the goal)" in texts


def test_censored_marks_of_two_curves_at_one_point_sit_apart():
    first = StepsCurve.from_points([(2, 8000), (4, 4100), (8, None)], label="a",
                                   censored_at=(None, None, 2500))
    second = StepsCurve.from_points([(2, 9000), (4, 5000), (8, None)], label="b",
                                    censored_at=(None, None, 2500))
    ax = steps_to_result_figure([first, second]).axes[0]
    marks = [c for c in ax.containers if c.get_label() == "_censored"]
    positions = [(float(c[0].get_xdata()[0]), float(c[0].get_ydata()[0])) for c in marks]
    assert len(positions) == 2 and positions[0] != positions[1]
    assert positions[0][1] == positions[1][1] == 2500  # still at the bound: only moved sideways
    assert all(abs(np.log2(x / 8)) < 0.5 for x, _ in positions)  # and near their batch size
    # without a bound: the x marks along the top edge sit apart too
    first = StepsCurve.from_points([(2, 8000), (4, None)], label="a")
    second = StepsCurve.from_points([(2, 9000), (4, None)], label="b")
    ax = steps_to_result_figure([first, second]).axes[0]
    xs = [float(line.get_xdata()[0]) for line in by_gid(ax, "not_reached")]
    assert len(xs) == 2 and xs[0] != xs[1]


def outcomes_frame(batch_sizes, coincident=False):
    rows = []
    for b in batch_sizes:
        for t, (lr, momentum, outcome) in enumerate([(0.01, 0.9, "reached"), (0.1, 0.99, "not_reached"),
                                                    (0.1, 0.99, "not_reached"), (1.0, 0.5, "diverged")]):
            if not coincident and t == 2:
                lr = 0.03
            rows.append({"batch_size": b, "trial_id": t, "learning_rate": lr, "momentum": momentum,
                         "outcome": outcome, "best": t == 0})
    return pd.DataFrame(rows)


def test_lr_momentum_scatter_is_a_grid_with_a_colour_bar():
    fig = lr_momentum_scatter_figure(outcomes_frame([1, 4, 16, 64]))
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_title()]
    assert len(panels) == 4
    columns = {round(ax.get_position().x0, 3) for ax in panels}
    assert len(columns) == 2  # 2 x 2, not a strip of 4
    width, height = fig.get_size_inches()
    assert 0.6 <= width / height <= 2.0
    assert all(ax.xaxis.label.get_size() >= 9 and ax.title.get_size() >= 10 for ax in panels)
    assert all(label.get_size() >= 8 for ax in panels for label in ax.get_xticklabels())
    assert all(len(labelled_ticks(ax.xaxis)) >= 3 and len(labelled_ticks(ax.yaxis)) >= 3 for ax in panels)
    (bar,) = [ax for ax in fig.axes if ax.get_gid() == "contour_colorbar"]
    assert "log10" in bar.get_ylabel()
    # at most four columns whatever the count, and the requested maximum is honoured
    assert [scatter_columns(n) for n in (1, 2, 3, 4, 5, 9, 10, 15, 30)] == [1, 2, 2, 2, 3, 3, 4, 4, 4]
    assert scatter_columns(15, most=3) == 3
    fig = lr_momentum_scatter_figure(outcomes_frame([1, 2, 4, 8, 16]), ncols=2)
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_title()]
    assert len({round(ax.get_position().x0, 3) for ax in panels}) == 2  # ncols: the most columns


def test_lr_momentum_scatter_trials_on_one_point_stay_visible_and_are_counted():
    fig = lr_momentum_scatter_figure(outcomes_frame([8], coincident=True))
    ax = fig.axes[0]
    (not_reached,) = [c for c in ax.collections if c.get_gid() == "outcome_not_reached"]
    first, second = (tuple(p) for p in not_reached.get_offsets())
    assert first != second  # both markers visible
    assert all(abs(np.log10(x / 0.1)) < 0.2 and abs(np.log10(y / 0.01)) < 0.2 for x, y in (first, second))
    assert [t.get_text() for t in by_gid(ax, "coincident_count")] == ["2 trials"]
    # trials on distinct points are drawn where they are, with no count
    ax = lr_momentum_scatter_figure(outcomes_frame([8])).axes[0]
    (reached,) = [c for c in ax.collections if c.get_gid() == "outcome_reached"]
    np.testing.assert_allclose(reached.get_offsets(), [[0.01, 0.1]])
    assert by_gid(ax, "coincident_count") == []
