"""The figure-set job layout: shared computations must give exactly what separate sweeps give; and the
figures drawn from the data are readable: labelled panels, a legend per panel, enough tick labels, a
title naming the problem actually computed."""

import numpy as np
import pytest

from batchlab.nqm import figures
from batchlab.nqm.dynamics import Algorithm
from batchlab.nqm.problem import zhang2019_binned
from batchlab.nqm.tuning import tune
from batchlab.plots import nqm as plots_nqm


def test_comparison_sgd_curves_are_exact_sub_sweeps_of_the_full_range():
    problem = zhang2019_binned()
    for p in (0.0, 0.75):
        full = figures._tuned("sgd", p, figures.ALL_BATCH_SIZES, figures.TARGET)
        direct = tune(problem, Algorithm("sgd", p), figures.COMPARE_BATCH_SIZES, figures.TARGET, grid="official")
        assert figures._subset(full, figures.COMPARE_BATCH_SIZES)["points"] == [pt.to_dict() for pt in direct]


def test_jobs_do_not_repeat_the_comparison_sgd_sweeps():
    names = set(figures._jobs())
    assert not any(name.startswith("sgd_p") for name in names)
    assert {f"sgd_lr_p{p}" for p in (0.25, 0.5, 0.75)} <= names and f"sgd_target_{figures.TARGET}" in names


# --- the figures drawn from the data: readable by a new user ------------------------------------------

B = [4, 16, 64, 256, 1024, 4096, 16384, 65536]


def _entry(s_min, b_crit, narrow=False):
    # narrow: a curve that is almost flat (EMA-like), whose steps span less than a decade
    steps = [int(s_min * (1 + (b_crit / 50 if narrow else b_crit) / b)) for b in B]
    return {"points": [{"batch_size": b, "steps": s, "learning_rate": 0.01 * b ** 0.5, "effective_learning_rate":
                        0.02 * b ** 0.5} for b, s in zip(B, steps)]}


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """Synthetic figure data (the shapes of :func:`figures.figure_data`'s) drawn by write_nqm_figures; the
    figure objects are kept for inspection."""
    curve = {"learning_rate": 0.1, "loss": [4.0, 3.0, 1.0, 0.5]}
    data = {"training_curves": {"batch_size": 1, "problem": "power law h_i = 1/i, D=1234", "dimension": 1234,
                                "steps": [0, 1, 10, 100], "curves": [curve]},
            "lower_bound": {"problem": "zhang2019-binned", "dimension": 10000, "target": 0.01, "batch_sizes": B,
                            "steps": [10000 / (2 * 0.01 * b) for b in B]}}
    for i, p in enumerate(figures.PRECONDITIONS):
        data[f"sgd_p{p}"] = _entry(1000 / (i + 1), 300 * (i + 1))
        data[f"momentum_p{p}"] = _entry(500 / (i + 1), 3000 * (i + 1))
    data["ema_p0.0"] = _entry(8000, 600, narrow=True)
    for target in figures.TARGETS:
        data[f"sgd_target_{target}"] = _entry(10 / target, 300)
    kept = {}
    monkey = pytest.MonkeyPatch()
    monkey.setattr(plots_nqm, "_save", lambda fig, path: kept.setdefault(path.stem, fig) and path)
    try:
        plots_nqm.write_nqm_figures(data, tmp_path_factory.mktemp("nqm"),
                                    only=["critical_batch_size_fits", "training_curves"])
    finally:
        monkey.undo()
    return kept


def _labelled(axis):
    lo, hi = sorted(axis.get_view_interval())
    labelled = set()
    for locator, formatter in ((axis.get_major_locator(), axis.get_major_formatter()),
                               (axis.get_minor_locator(), axis.get_minor_formatter())):
        locs = [float(t) for t in locator() if lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9)]
        formatter.set_locs(locs)
        labelled |= {t for t in locs if formatter(t).strip()}
    return labelled


def test_fits_grid_labels_every_panel_and_gives_each_its_legend(drawn):
    fig = drawn["nqm_critical_batch_size_fits"]
    panels = [ax for ax in fig.axes if ax.axison]
    assert len(panels) == 9
    for ax in panels:
        assert ax.get_xlabel() == "batch size" and ax.get_ylabel() == "steps to target"
        legend = ax.get_legend()
        assert legend is not None, ax.get_title()
        texts = [t.get_text() for t in legend.get_texts()]
        assert texts[:2] == ["exact NQM", "fit S_min (1 + B_crit/B)"]
        assert any(t.startswith("B_crit ") and t.endswith("(fit)") for t in texts)
        assert min(t.get_fontsize() for t in legend.get_texts()) >= 7
        # the legend sits above the data: every point lies in the lower part of the panel
        steps = ax.lines[0].get_ydata()
        low, top = np.log(ax.get_ylim())
        assert (np.log(steps.max()) - low) / (top - low) < 0.7
        assert all(label.get_visible() for label in ax.get_xticklabels())  # every panel shows its batch sizes
    assert "D=10000" in fig.get_suptitle() and "preconditioning power" in fig.get_suptitle()


def test_fits_grid_narrow_panel_has_three_labelled_ticks(drawn):
    fig = drawn["nqm_critical_batch_size_fits"]
    for ax in (a for a in fig.axes if a.axison):
        assert len(_labelled(ax.yaxis)) >= 3, (ax.get_title(), ax.get_ylim())
        assert len(_labelled(ax.xaxis)) >= 3


def test_training_curves_title_names_the_problem_computed():
    data = {"batch_size": 1, "problem": "power law h_i = 1/i, D=1234", "dimension": 1234}
    assert plots_nqm.training_curves_title(data) == "SGD training curves, B=1 (power law h_i = 1/i, D=1234)"
    assert plots_nqm.training_curves_title({"batch_size": 2, "problem": "zhang2019", "dimension": 10000}) == (
        "SGD training curves, B=2 (zhang2019, D=10000)")
    assert plots_nqm.training_curves_title({"batch_size": 1}) == "SGD training curves, B=1"


def test_training_curves_figure_title_has_the_actual_dimension(drawn):
    (ax,) = drawn["nqm_training_curves"].axes
    assert "D=1234" in ax.get_title() and "5000" not in ax.get_title()


def test_training_curves_data_record_their_problem():
    from batchlab.nqm.problem import power_law

    problem = power_law(1.0, 1.0, figures.CURVE_DIMENSION)
    entry = figures._training_curves()
    assert entry["dimension"] == problem.dimension == figures.CURVE_DIMENSION
    assert f"D={problem.dimension}" in plots_nqm.training_curves_title(entry)
