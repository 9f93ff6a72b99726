"""batchlab.nqm: the exact noisy quadratic model (Zhang et al. 2019), in numpy/scipy (never torch).

Modules: :mod:`~batchlab.nqm.algorithms` (the registry of NQM algorithms), :mod:`~batchlab.nqm.problem`
(spectra, presets, bounds), :mod:`~batchlab.nqm.dynamics` (exact moment recurrences),
:mod:`~batchlab.nqm.steps` (first passage), :mod:`~batchlab.nqm.tuning` (per-batch-size tuning, official
grids, tuned schedules), :mod:`~batchlab.nqm.schedules` (LR and batch-size schedules, optimised PWC),
:mod:`~batchlab.nqm.sweep` (the rows and S(B) summary of a tuned sweep), :mod:`~batchlab.nqm.curve` (the
loss curve of one configuration, divergence reported), :mod:`~batchlab.nqm.montecarlo` (sampled check),
:mod:`~batchlab.nqm.figures` (data of the figure set).
"""

from batchlab.nqm.algorithms import Algorithm, NQMAlgorithm, get_nqm_algorithm, nqm_algorithm_names
from batchlab.nqm.curve import LossCurve, loss_curve
from batchlab.nqm.dynamics import dense_losses, losses_at_steps, moment_recurrence
from batchlab.nqm.problem import (
    PRESETS,
    Problem,
    from_eigenvalues,
    information_lower_bound,
    power_law,
    preset,
    select_problem,
    spectrum_from_file,
)
from batchlab.nqm.steps import StepsResult, steps_to_target
from batchlab.nqm.sweep import fit_summary, sweep_rows
from batchlab.nqm.tuning import TunedPoint, steps_curve, tune, tune_pwc

__all__ = [
    "PRESETS",
    "Algorithm",
    "LossCurve",
    "NQMAlgorithm",
    "Problem",
    "StepsResult",
    "TunedPoint",
    "dense_losses",
    "fit_summary",
    "from_eigenvalues",
    "get_nqm_algorithm",
    "information_lower_bound",
    "loss_curve",
    "losses_at_steps",
    "moment_recurrence",
    "nqm_algorithm_names",
    "power_law",
    "preset",
    "select_problem",
    "spectrum_from_file",
    "steps_curve",
    "steps_to_target",
    "sweep_rows",
    "tune",
    "tune_pwc",
]
