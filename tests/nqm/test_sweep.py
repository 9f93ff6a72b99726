"""The tuned sweep rows of ``batchlab nqm sweep``/``fit``, now in the library (batchlab.nqm.sweep)."""

import pytest

from batchlab.errors import BatchlabError
from batchlab.nqm import figures
from batchlab.nqm.algorithms import Algorithm
from batchlab.nqm.problem import power_law, zhang2019_binned
from batchlab.nqm.sweep import TUNERS, fit_summary, learning_rate_grid_used, sweep_label, sweep_rows
from batchlab.nqm.tuning import tune_pwc


def test_pwc_rows_are_the_numbers_the_cli_gave_before_the_move():
    # captured from `batchlab nqm sweep --batch-sizes 16,256 --schedule pwc:3 --json` before the PWC tuning
    # moved from cli/nqm.py (and its near-copy in nqm/figures.py) into batchlab.nqm.tuning.tune_pwc
    rows = sweep_rows(zhang2019_binned(), Algorithm("sgd"), [16, 256], 0.01, schedule="pwc:3")
    assert [(r["batch_size"], r["steps"], r["official_low"], r["piece_length"], r["constant_steps"]) for r in rows] == [
        (16, 77091, 77090, 25697, 379888), (256, 11388, 11387, 3796, 25881)]
    # The optimised learning rates and loss within 1e-9 (relative), not bitwise: numpy dispatches the
    # sums and exp/log kernels of the schedule's loss to the CPU's SIMD extensions (AVX-512 on one
    # machine, AVX2 on another; NPY_DISABLE_CPU_FEATURES reproduces both), which round differently and
    # move L-BFGS-B's local optimum in the 13th digit (seen: 3e-14 in a rate, 2e-13 in the loss). The
    # integers above, read from that optimum, are the same under every SIMD level we ran.
    assert rows[1]["learning_rates"] == pytest.approx([1.9996000799840032, 1.9996000799840032, 0.3158332843716609],
                                                      rel=1e-9)
    assert rows[0]["final_loss"] == pytest.approx(0.00999991458268755, rel=1e-9)
    assert rows[0]["learning_rate"] == rows[0]["learning_rates"][0]  # the same number, reported twice


def test_figures_pwc_is_the_same_tuning():
    rows = tune_pwc(zhang2019_binned(), Algorithm("sgd"), [16, 256], figures.TARGET, 3)
    points = figures._pwc((16, 256), 3)["points"]
    assert points == [{k: r[k] for k in ("batch_size", "steps", "piece_length", "learning_rates", "constant_steps")}
                      for r in rows]


def test_pwc_max_steps_bounds_the_whole_schedule():
    problem = power_law(1.0, 1.0, 50)
    free = sweep_rows(problem, Algorithm("sgd"), [8], 0.05, schedule="pwc:4")[0]
    assert free["reached"] and free["steps"] == 4 * free["piece_length"]
    capped = sweep_rows(problem, Algorithm("sgd"), [8], 0.05, schedule="pwc:4", max_steps=free["steps"] - 1)[0]
    assert capped["reached"] is False and capped["steps"] is None


def test_every_schedule_kind_has_a_tuner_and_rows_say_their_schedule():
    assert set(TUNERS) == {"constant", "pwc", "linear", "cosine"}
    problem = power_law(1.0, 1.0, 50)
    for schedule in ("constant", "pwc:2", "linear", "cosine"):
        (row,) = sweep_rows(problem, Algorithm("sgd"), [8], 0.05, grid="official", schedule=schedule)
        assert row["schedule"] == schedule and row["reached"] and row["final_loss"] < 0.05
    assert learning_rate_grid_used("auto", "constant") == "auto" and learning_rate_grid_used("auto", "linear") == "official"


def test_errors_name_the_registry():
    problem = power_law(1.0, 1.0, 50)
    with pytest.raises(BatchlabError, match="pwc:K is implemented for --optimizer sgd only, got 'momentum'"):
        sweep_rows(problem, Algorithm("momentum"), [8], 0.05, schedule="pwc:2")
    with pytest.raises(BatchlabError, match="--notebook-fudge applies to --optimizer sgd with --schedule constant"):
        sweep_rows(problem, Algorithm("sgd"), [8], 0.05, schedule="linear", notebook_fudge=True)
    with pytest.raises(BatchlabError, match="unknown schedule"):
        sweep_rows(problem, Algorithm("sgd"), [8], 0.05, schedule="step")


def test_fit_summary_adds_the_batch_grid():
    rows = [{"batch_size": b, "steps": s} for b, s in ((4, 1000), (16, 260), (64, 80), (256, 40), (1024, 35))]
    summary = fit_summary(rows, sweep_label(Algorithm("sgd", 0.5), 0.01), grid="official")
    assert summary["label"] == "sgd p=0.5 target=0.01"
    assert summary["batch_grid"] == {"batch_sizes": [4, 16, 64, 256, 1024], "n": 5, "n_reached": 5, "smallest": 4,
                                     "largest": 1024, "b0": 4, "learning_rate_grid": "official"}
