"""batchlab.nqm: the exact noisy quadratic model (Zhang et al. 2019), in numpy/scipy (never torch).

Modules: :mod:`~batchlab.nqm.algorithms` (the registry of NQM algorithms), :mod:`~batchlab.nqm.problem`
(spectra, presets, bounds), :mod:`~batchlab.nqm.dynamics` (exact moment recurrences),
:mod:`~batchlab.nqm.steps` (first passage), :mod:`~batchlab.nqm.tuning` (per-batch-size tuning, official
grids, tuned schedules), :mod:`~batchlab.nqm.schedules` (LR and batch-size schedules, optimised PWC),
:mod:`~batchlab.nqm.sweep` (the rows and S(B) summary of a tuned sweep), :mod:`~batchlab.nqm.curve` (the
loss curve of one configuration, divergence reported), :mod:`~batchlab.nqm.montecarlo` (sampled check),
:mod:`~batchlab.nqm.figures` (data of the figure set).
"""

import importlib

# Each public name and the module that defines it. Loaded on first use (PEP 562), so importing one
# light module (``batchlab.nqm.algorithms`` for the command line's help texts) does not load scipy.
_HOMES = {
    "Algorithm": "algorithms", "NQMAlgorithm": "algorithms", "get_nqm_algorithm": "algorithms",
    "nqm_algorithm_names": "algorithms",
    "LossCurve": "curve", "loss_curve": "curve",
    "dense_losses": "dynamics", "losses_at_steps": "dynamics", "moment_recurrence": "dynamics",
    "PRESETS": "problem", "Problem": "problem", "from_eigenvalues": "problem",
    "information_lower_bound": "problem", "power_law": "problem", "preset": "problem",
    "select_problem": "problem", "spectrum_from_file": "problem",
    "StepsResult": "steps", "steps_to_target": "steps",
    "fit_summary": "sweep", "sweep_rows": "sweep",
    "TunedPoint": "tuning", "steps_curve": "tuning", "tune": "tuning", "tune_pwc": "tuning",
}


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(f"batchlab.nqm.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
