import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from analysis_fixtures import tables_from_trials, trial  # noqa: E402

from batchlab.analysis.budgets import best_measurement_by_budget  # noqa: E402
from batchlab.analysis.critical_batch_size import fit_steps_curve  # noqa: E402
from batchlab.analysis.curve import StepsCurve  # noqa: E402
from batchlab.analysis.metaparameters import optimal_metaparameters, trial_outcomes  # noqa: E402
from batchlab.analysis.selection import Selection  # noqa: E402
from batchlab.analysis.steps_to_result import steps_to_result  # noqa: E402
from batchlab.analysis.tables import connect_tables  # noqa: E402
from batchlab.errors import BatchlabError  # noqa: E402
from batchlab.plots.axes import save_figure  # noqa: E402
from batchlab.plots.shallue import compare_workloads_figure, goals_figure, steps_to_result_figure  # noqa: E402
from batchlab.plots.tuning import (  # noqa: E402
    best_measurement_figure,
    lr_momentum_scatter_figure,
    metaparameters_figure,
)

W = "mnist/simple_cnn_base/nesterov_momentum"
M = "val/classification_error"
CURVE = StepsCurve.from_points([(2, 8000), (4, 4100), (8, 2200), (16, 1300), (32, 900), (64, None)], label="w")


@pytest.fixture(scope="module")
def con():
    trials = []
    for b in (2, 8, 32):
        for t, (lr, mom) in enumerate([(0.01 * b, 0.9), (0.001, 0.99), (5.0, 0.999), (0.1, 0.5)], start=1):
            status = "INFEASIBLE" if lr == 5.0 else "COMPLETE"
            hit = int(1000 / b * (1 + t))
            rows = [(hit // 2, {M: 0.5}), (hit, {M: 0.005 if t != 2 else 0.5})]
            trials.append(trial(W, b, t, rows, status=status, learning_rate=lr, momentum=mom))
    connection = connect_tables(**tables_from_trials(trials))
    yield connection
    connection.close()


def bracketed(points, steps_lower=None, censored_at=None, label="w"):
    """A StepsCurve with resolution brackets and censoring bounds (aligned with ``points``)."""
    return StepsCurve.from_points(points, label=label, steps_lower=steps_lower, censored_at=censored_at)


def by_gid(ax, gid):
    return [a for a in ax.get_children() if a.get_gid() == gid]


def containers(ax, label):
    return [c for c in ax.containers if c.get_label() == label]


def test_steps_figure_log2_axes_perfect_scaling_fit_and_censored_marks():
    fit = fit_steps_curve(CURVE)
    fig = steps_to_result_figure([CURVE], fits=[fit], regimes=False)
    (ax,) = fig.axes
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    assert ax.yaxis.get_transform().base == 2
    gids = ("data", "perfect_scaling", "fit", "not_reached")
    (data,), (perfect,), (fitted,), (censored,) = (by_gid(ax, g) for g in gids)
    np.testing.assert_array_equal(data.get_xdata(), [2, 4, 8, 16, 32])
    np.testing.assert_allclose(perfect.get_ydata(), 8000 * 2 / np.asarray(perfect.get_xdata()))
    assert list(perfect.get_xdata()) == [2, 64]  # over the whole measured range
    np.testing.assert_allclose(fitted.get_ydata(), fit.predicted_steps(fitted.get_xdata()))
    assert fitted.get_xdata()[0] == 2 and fitted.get_xdata()[-1] == pytest.approx(64)
    assert list(censored.get_xdata()) == [64]  # no bound known: an x along the top edge
    assert containers(ax, "_bracket") == []  # exact first passage: no brackets to draw
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["w", "perfect scaling from B0 = 2", r"fit $S_{min} + E_{min}/B$ (fitted, not measured)",
                      "not reached (no bound known)"]


def test_steps_figure_draws_brackets_and_censored_bounds_with_up_arrows():
    curve = bracketed(
        [(2, 8000), (4, 4100), (8, 2200), (16, 1300), (32, None), (64, None)],
        steps_lower=(7600, 3900, 2000, 0, None, None),
        censored_at=(None, None, None, None, 3000, 2500),
    )
    fig = steps_to_result_figure([curve], fits=[fit_steps_curve(curve)])
    ax = fig.axes[0]
    (brackets,) = containers(ax, "_bracket")
    data_line, caplines, (bars,) = brackets
    segments = [seg[:, 1].tolist() for seg in bars.get_segments()]
    assert segments == [[7600, 8000], [3900, 4100], [2000, 2200], [0, 1300]]  # (steps_lower, steps]
    assert [seg[0, 0] for seg in bars.get_segments()] == [2, 4, 8, 16]
    (censored,) = containers(ax, "_censored")
    marker_line, (arrow,), (stem,) = censored
    # drawn at the censoring bound (never as a reached point), with an upward arrow head above it
    np.testing.assert_array_equal(marker_line.get_xdata(), [32, 64])
    np.testing.assert_array_equal(marker_line.get_ydata(), [3000, 2500])
    assert arrow.get_marker() == 10  # CARETUPBASE: an upward arrow
    assert len(arrow.get_ydata()) == 2
    assert all(y > bound for y, bound in zip(arrow.get_ydata(), [3000, 2500]))
    (data,) = by_gid(ax, "data")
    np.testing.assert_array_equal(data.get_xdata(), [2, 4, 8, 16])
    assert by_gid(ax, "not_reached") == []
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "resolution bracket (previous, reaching evaluation]" in labels
    assert "not reached: steps > bound (censored)" in labels
    # a censoring bound far below the reached steps stays in view
    low = bracketed([(2, 8000), (4, 4100), (8, None)], steps_lower=(7600, 3900, None), censored_at=(None, None, 50))
    ax = steps_to_result_figure([low]).axes[0]
    assert ax.get_ylim()[0] <= 50


def test_steps_figure_shades_regimes_read_from_the_data(monkeypatch):
    from batchlab.plots import shallue

    curve = StepsCurve.from_points([(2, 8000), (4, 4000), (8, 2000), (16, 1150), (32, 700), (64, 650), (128, 640)])
    # read from the data: S*B within 10% of B0's up to B=8; every S from B=32 on within 10% of the minimum
    assert shallue.data_regimes(curve, 0.1) == {"b0": 2, "perfect_scaling_end": 8, "maximal_parallelism_start": 32,
                                                "perfect_scaling_beyond": None}
    ax = steps_to_result_figure([curve]).axes[0]
    (ps,) = by_gid(ax, "perfect_scaling_regime")
    (mp,) = by_gid(ax, "maximal_parallelism_regime")
    assert (ps.get_x(), ps.get_x() + ps.get_width()) == (2, 8)
    assert (mp.get_x(), mp.get_x() + mp.get_width()) == (32, 128)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"perfect scaling (read from data)", "maximal data parallelism (read from data)"} <= set(labels)
    # the tolerance is the regimes' own: at 30% perfect scaling lasts to B=16
    (ps,) = by_gid(steps_to_result_figure([curve], tolerance=0.3).axes[0], "perfect_scaling_regime")
    assert ps.get_x() + ps.get_width() == 16
    # still in perfect scaling at the largest batch size: shaded, and the legend says the end is beyond
    scaling = StepsCurve.from_points([(4, 8000), (8, 4000), (16, 2000), (32, 1000)])
    ax = steps_to_result_figure([scaling]).axes[0]
    assert by_gid(ax, "maximal_parallelism_regime") == [] and len(by_gid(ax, "perfect_scaling_regime")) == 1
    assert "perfect scaling (read from data; its end lies beyond the measured range)" in [
        t.get_text() for t in ax.get_legend().get_texts()]
    # a regime the data do not show (null) is not shaded
    monkeypatch.setattr(shallue, "data_regimes", lambda curve, tolerance: {
        "b0": 2, "perfect_scaling_end": 8, "maximal_parallelism_start": None, "perfect_scaling_beyond": None})
    ax = steps_to_result_figure([curve]).axes[0]
    assert by_gid(ax, "maximal_parallelism_regime") == [] and len(by_gid(ax, "perfect_scaling_regime")) == 1
    # nor are regimes shaded with several curves, unless asked
    ax = steps_to_result_figure([curve, CURVE]).axes[0]
    assert by_gid(ax, "perfect_scaling_regime") == []
    with pytest.raises(BatchlabError, match=r"tolerance must be in \(0, 1\)"):
        steps_to_result_figure([curve], tolerance=1.5)


def test_figures_say_which_trials_they_rest_on(con):
    caption = "trials: first 100 trials per batch size by trial id; statuses COMPLETE; study abc"
    ax = steps_to_result_figure([CURVE], caption=caption).axes[0]
    assert ax.get_legend().get_title().get_text() == caption
    assert steps_to_result_figure([CURVE]).axes[0].get_legend().get_title().get_text() == ""
    opt = optimal_metaparameters(steps_to_result(con, W, M, 0.01))
    assert caption in metaparameters_figure(opt, title="t", caption=caption).get_suptitle().replace("\n", " ")
    outcomes = trial_outcomes(con, Selection(W, M, 0.01))
    assert caption in lr_momentum_scatter_figure(outcomes, caption=caption).get_suptitle().replace("\n", " ")


def test_steps_figure_draws_interval_error_bars():
    bounds = [(7000, 9000), (4100, 4100), (2000, None), (None, 1500), (800, 1000), (None, None)]
    fig = steps_to_result_figure([CURVE], intervals=[bounds], interval_label="90% interval of the median")
    (intervals,) = containers(fig.axes[0], "_interval")
    segments = [seg[:, 1].tolist() for seg in intervals[2][0].get_segments()]
    # (None, high) is one-sided, from the point up to high; open-ended above: a dotted stem instead
    assert segments == [[7000, 9000], [4100, 4100], [1300, 1500], [800, 1000]]
    (stem,) = [a for a in by_gid(fig.axes[0], "interval_unbounded") if hasattr(a, "get_segments")]
    assert [seg[0].tolist() for seg in stem.get_segments()] == [[8, 2200]]
    texts = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "90% interval of the median (a bar starting at its point is one-sided: an upper bound only)" in texts
    assert "interval unbounded above (too few trials reached the goal)" in texts
    with pytest.raises(BatchlabError, match="2 intervals for 6 batch sizes"):
        steps_to_result_figure([CURVE], intervals=[bounds[:2]])


def test_normalised_comparison_and_goals():
    other = StepsCurve.from_points([(4, 1000), (8, 600), (16, 500)], label="other")
    fig = compare_workloads_figure([CURVE, other])
    ax = fig.axes[0]
    data = [line for line in ax.lines if line.get_label() in ("w", "other")]
    assert [line.get_ydata()[0] for line in data] == [1.0, 1.0]
    fig = compare_workloads_figure([CURVE, other], reference_batch_size=8)
    data = [line for line in fig.axes[0].lines if line.get_label() in ("w", "other")]
    np.testing.assert_allclose(data[0].get_ydata()[2], 1.0)
    np.testing.assert_allclose(data[1].get_ydata(), [1000 / 600, 1.0, 500 / 600])
    with pytest.raises(BatchlabError, match="did not reach the goal at reference batch size 2"):
        compare_workloads_figure([CURVE, other], reference_batch_size=2)
    assert len(goals_figure([CURVE, other]).axes) == 1
    with pytest.raises(BatchlabError, match="no batch size reached"):
        steps_to_result_figure([StepsCurve.from_points([(1, None)], label="none")])


def test_metaparameters_figure_has_heuristic_lines(con):
    opt = optimal_metaparameters(steps_to_result(con, W, M, 0.01))
    fig = metaparameters_figure(opt)
    assert [ax.get_ylabel() for ax in fig.axes] == ["learning rate", "1 - momentum", "effective learning rate"]
    best, linear, root = fig.axes[0].lines
    np.testing.assert_allclose(best.get_ydata(), [0.02, 0.08, 0.32])
    np.testing.assert_allclose(linear.get_ydata(), [0.02, 0.08, 0.32])
    np.testing.assert_allclose(root.get_ydata(), [0.02, 0.04, 0.08])
    sgd = type(opt)(batch_sizes=opt.batch_sizes, values={**opt.values, "momentum": np.full(3, np.nan)})
    assert len(metaparameters_figure(sgd).axes) == 1
    assert all(by_gid(ax, "search_edge") == [] for ax in fig.axes)  # no warnings: no edge marks


def test_metaparameters_figure_marks_search_edge_limited_points(con):
    results = steps_to_result(con, W, M, 0.01)
    edges = [
        {"batch_size": 8, "parameter": "learning_rate", "edge": "high", "value": 0.08, "min_value": 1e-4,
         "max_value": 0.1, "scale": "LOG"},
        {"batch_size": 32, "parameter": "momentum", "edge": "low", "value": 0.9, "min_value": 0.9,
         "max_value": 0.999, "scale": "REVERSE_LOG"},
    ]
    fig = metaparameters_figure(optimal_metaparameters(results, search_edges=edges))
    lr_ax, momentum_ax, effective_ax = fig.axes
    marked = {ax.get_ylabel(): by_gid(ax, "search_edge")[0].get_offsets()[:, 0].tolist() for ax in fig.axes}
    assert marked == {"learning rate": [8.0], "1 - momentum": [32.0], "effective learning rate": [8.0, 32.0]}
    (ring,) = by_gid(lr_ax, "search_edge")
    np.testing.assert_allclose(ring.get_offsets()[:, 1], [0.08])  # on the point itself
    assert (ring.get_facecolor().size == 0 or ring.get_facecolor()[0][3] == 0)  # hollow
    assert "best trial at search-space edge" in [t.get_text() for t in lr_ax.get_legend().get_texts()]
    assert [t.get_text() for t in momentum_ax.texts] == ["momentum: low"]


def test_lr_momentum_scatter_marks_outcomes(con):
    outcomes = trial_outcomes(con, Selection(W, M, 0.01))
    fig = lr_momentum_scatter_figure(outcomes, batch_sizes=[2, 32])
    visible = [ax for ax in fig.axes if ax.get_visible() and ax.get_gid() != "contour_colorbar"]
    assert [ax.get_title() for ax in visible] == ["batch size 2", "batch size 32"]
    counts = {c.get_label(): len(c.get_offsets()) for c in visible[0].collections if c.get_label() in
              ("goal reached", "goal not reached", "diverged", "best trial")}
    assert counts == {"goal reached": 2, "goal not reached": 1, "diverged": 1, "best trial": 1}
    from matplotlib.contour import ContourSet

    contours = [c for c in visible[0].collections if isinstance(c, ContourSet)]
    assert len(contours) == 1 and len(contours[0].levels) >= 3  # log10 effective-learning-rate contours
    with pytest.raises(BatchlabError, match=r"batch sizes \[3\] have no trials"):
        lr_momentum_scatter_figure(outcomes, batch_sizes=[3])
    no_momentum = outcomes.assign(momentum=np.nan)
    with pytest.raises(BatchlabError, match="momentum optimizers only"):
        lr_momentum_scatter_figure(no_momentum)


def test_lr_momentum_scatter_draws_searched_ranges_and_edge_rings(con):
    outcomes = trial_outcomes(con, Selection(W, M, 0.01))
    ranges = {2: {"learning_rate": (1e-3, 10.0, "LOG"), "momentum": (0.5, 0.999, "REVERSE_LOG")}}
    edges = [{"batch_size": 2, "parameter": "learning_rate", "edge": "low"},
             {"batch_size": 32, "parameter": "end_learning_rate_factor", "edge": "high"}]  # not in this plane
    fig = lr_momentum_scatter_figure(outcomes, batch_sizes=[2, 32], search_ranges=ranges, search_edges=edges)
    first, second = [ax for ax in fig.axes if ax.get_visible() and ax.get_gid() != "contour_colorbar"]
    (box,) = by_gid(first, "searched_range")
    np.testing.assert_allclose(box.get_xdata(), [1e-3, 10, 10, 1e-3, 1e-3])
    np.testing.assert_allclose(box.get_ydata(), [1e-3, 1e-3, 0.5, 0.5, 1e-3])  # 1 - momentum
    (ring,) = by_gid(first, "search_edge")
    best = outcomes[(outcomes.batch_size == 2) & outcomes.best].iloc[0]
    np.testing.assert_allclose(ring.get_offsets(), [[best.learning_rate, 1 - best.momentum]])
    assert by_gid(second, "searched_range") == [] and by_gid(second, "search_edge") == []
    assert first.get_xlim()[0] <= 1e-3 and first.get_xlim()[1] >= 10  # the box is in view
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"searched range", "best trial at search-space edge", "best trial"} <= set(labels)


def test_best_measurement_figure_one_line_per_budget(con):
    sweep = best_measurement_by_budget(con, W, M, [100, 1000], kind="step")
    fig = best_measurement_figure(sweep, M)
    lines = fig.axes[0].lines
    assert [line.get_label() for line in lines] == ["step budget 100", "step budget 1,000"]
    np.testing.assert_array_equal(lines[1].get_ydata(), sweep.best[1])
    per_batch = fig.axes[1].lines
    assert [line.get_label() for line in per_batch] == ["batch size 2", "batch size 8", "batch size 32"]
    np.testing.assert_array_equal(per_batch[0].get_xdata(), [100, 1000])
    np.testing.assert_array_equal(per_batch[2].get_ydata(), sweep.best[:, 2])
    empty = type(sweep)(kind="step", budgets=(1,), batch_sizes=(2,), best=np.full((1, 1), np.nan))
    with pytest.raises(BatchlabError, match="no measurement lies within"):
        best_measurement_figure(empty, M)


def test_save_figure_is_atomic_and_checks_the_suffix(tmp_path):
    fig = steps_to_result_figure([CURVE])
    path = save_figure(fig, tmp_path / "steps.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps.png"]
    with pytest.raises(BatchlabError, match=r"must end in one of: \.png, \.pdf, \.svg"):
        save_figure(fig, tmp_path / "steps.jpg")
    with pytest.raises(BatchlabError, match="does not exist"):
        save_figure(fig, tmp_path / "missing" / "steps.png")
    (tmp_path / "folder.png").mkdir()
    with pytest.raises(BatchlabError, match="is an existing directory"):
        save_figure(fig, tmp_path / "folder.png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.png", "steps.png"]
    assert list((tmp_path / "folder.png").iterdir()) == []


def test_steps_figure_uses_the_same_b0_as_analyze():
    """Review fix: a smallest batch size whose bracket starts at 0 is only an upper bound, so
    analyze critical-batch-size measures perfect scaling from the next one (B0 = 32, ends at 128);
    the figure drew the perfect-scaling line and the green band from B = 16 (ending at 64)."""
    from batchlab.plots import shallue

    curve = StepsCurve.from_points([(16, 1000), (32, 520), (64, 260), (128, 140), (256, 100)],
                                   steps_lower=[0, 500, 250, 130, 95])
    assert shallue.data_regimes(curve, 0.1)["b0"] == 32
    assert shallue.data_regimes(curve, 0.1)["perfect_scaling_end"] == 128
    ax = steps_to_result_figure([curve]).axes[0]
    (ps,) = by_gid(ax, "perfect_scaling_regime")
    assert (ps.get_x(), ps.get_x() + ps.get_width()) == (32, 128)
    assert "perfect scaling from B0 = 32" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_steps_figure_rings_flagged_batch_sizes():
    curve = bracketed([(2, 8000), (4, 4100), (8, 2200), (16, None)], steps_lower=(7600, 3900, 2000, None),
                      censored_at=(None, None, None, 3000))
    ax = steps_to_result_figure([curve], flagged=[[2, 16, 1024]]).axes[0]  # 1024: not on the curve
    (rings,) = by_gid(ax, "tuning_flag")
    np.testing.assert_array_equal(rings.get_xdata(), [2, 16])
    np.testing.assert_array_equal(rings.get_ydata(), [8000, 3000])  # the point; the censoring bound
    assert "tuning flag" in [t.get_text() for t in ax.get_legend().get_texts()]
    plain = steps_to_result_figure([curve], flagged=[[]]).axes[0]
    assert by_gid(plain, "tuning_flag") == []
    assert "tuning flag" not in [t.get_text() for t in plain.get_legend().get_texts()]
    with pytest.raises(BatchlabError, match="flagged: 2 entries for 1 curves"):
        steps_to_result_figure([curve], flagged=[[2], [4]])
