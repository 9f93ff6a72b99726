"""batchlab.nqm: the exact noisy quadratic model (Zhang et al. 2019), in numpy/scipy (never torch).

Modules: :mod:`~batchlab.nqm.problem` (spectra, presets, bounds), :mod:`~batchlab.nqm.dynamics` (exact
moment recurrences), :mod:`~batchlab.nqm.steps` (first passage), :mod:`~batchlab.nqm.tuning` (per-batch-size
tuning, official grids), :mod:`~batchlab.nqm.schedules` (LR and batch-size schedules, optimised PWC),
:mod:`~batchlab.nqm.montecarlo` (sampled check), :mod:`~batchlab.nqm.figures` (data of the figure set).
"""

from batchlab.nqm.dynamics import OPTIMIZERS, Algorithm, dense_losses, losses_at_steps, moment_recurrence
from batchlab.nqm.problem import (
    PRESETS,
    Problem,
    from_eigenvalues,
    information_lower_bound,
    power_law,
    preset,
    spectrum_from_file,
)
from batchlab.nqm.steps import StepsResult, steps_to_target
from batchlab.nqm.tuning import TunedPoint, steps_curve, tune

__all__ = [
    "OPTIMIZERS",
    "PRESETS",
    "Algorithm",
    "Problem",
    "StepsResult",
    "TunedPoint",
    "dense_losses",
    "from_eigenvalues",
    "information_lower_bound",
    "losses_at_steps",
    "moment_recurrence",
    "power_law",
    "preset",
    "spectrum_from_file",
    "steps_curve",
    "steps_to_target",
    "tune",
]
