"""The figure-set job layout: shared computations must give exactly what separate sweeps give."""

from batchlab.nqm import figures
from batchlab.nqm.dynamics import Algorithm
from batchlab.nqm.problem import zhang2019_binned
from batchlab.nqm.tuning import tune


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
