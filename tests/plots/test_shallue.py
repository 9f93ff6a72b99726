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
from batchlab.plots.shallue import (  # noqa: E402
    best_measurement_figure,
    compare_workloads_figure,
    goals_figure,
    lr_momentum_scatter_figure,
    metaparameters_figure,
    save_figure,
    steps_to_result_figure,
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


def test_steps_figure_log2_axes_perfect_scaling_fit_and_censored_marks():
    fit = fit_steps_curve(CURVE)
    fig = steps_to_result_figure([CURVE], fits=[fit])
    (ax,) = fig.axes
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    assert ax.yaxis.get_transform().base == 2
    data, perfect, fitted, censored = ax.lines[:4]
    np.testing.assert_array_equal(data.get_xdata(), [2, 4, 8, 16, 32])
    np.testing.assert_allclose(perfect.get_ydata(), 8000 * 2 / np.asarray(perfect.get_xdata()))
    np.testing.assert_allclose(fitted.get_ydata(), fit.predicted_steps(fitted.get_xdata()))
    assert list(censored.get_xdata()) == [64]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["w", "perfect scaling", r"fit $S_{min} + E_{min}/B$", "goal not reached"]


def test_steps_figure_draws_interval_error_bars():
    bounds = [(7000, 9000), (4100, 4100), (2000, None), (1200, 1500), (800, 1000), (None, None)]
    fig = steps_to_result_figure([CURVE], intervals=[bounds])
    (bars,) = [c for c in fig.axes[0].collections if c.get_segments()]
    segments = [seg[:, 1].tolist() for seg in bars.get_segments()]
    assert segments == [[7000, 9000], [4100, 4100], [1200, 1500], [800, 1000]]  # open-ended rows skipped
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


def test_lr_momentum_scatter_marks_outcomes(con):
    outcomes = trial_outcomes(con, Selection(W, M, 0.01))
    fig = lr_momentum_scatter_figure(outcomes, batch_sizes=[2, 32])
    visible = [ax for ax in fig.axes if ax.get_visible()]
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
