"""Probes: measurements at one model's parameters that predict how training scales with batch size.

* :mod:`batchlab.probes.noise_scale`: the gradient noise scale, B_simple = tr(Sigma)/|G|^2 and
  B_noise = tr(H Sigma)/(G^T H G) (examples), by per-example gradients or the two-batch-size
  estimator, in the plain or an Adam-preconditioned metric, per layer, with intervals
  (:func:`noise_scale`, :class:`NoiseScale`).
* :mod:`batchlab.probes.tracker`: :class:`NoiseScaleTracker`, running B_simple inside a user's own
  training loop from the gradients it already has (micro-batches, or local vs all-reduced under
  DistributedDataParallel); what it keeps between steps and how it folds them:
  :mod:`batchlab.probes.running_moments`, :mod:`batchlab.probes.recorded_steps`; its collectives:
  :mod:`batchlab.probes.step_collectives`; FSDP2 parameters: :mod:`batchlab.probes.sharded_parameters`.
* :mod:`batchlab.probes.spectrum`: top Hessian / Gauss-Newton eigenvalues and a spectral density by
  Lanczos on Hessian-vector products.
* :mod:`batchlab.probes.branched`: the branched critical batch size: short branches at k·B from
  checkpoints of a reference run, the local critical batch size with an interval, and a batch-size
  warmup built from it (:func:`branched_critical_batch_size`, :func:`warmup_schedule`).
* :mod:`batchlab.probes.calibrated`: an NQM problem for batchlab's exact engine built from a model's
  measured curvature and gradient noise, and its predicted steps and critical batch sizes
  (:func:`calibrated_problem`, :func:`predict_steps`).
* :mod:`batchlab.probes.predict`: every predictor's critical batch size for a workload beside the one
  measured in a store, with the ratio and the compute (:func:`predict`; ``batchlab predict``).
* :mod:`batchlab.probes.reference`: checkpoints of a reference run with batchlab's trial machinery,
  and fixed probe batches of a workload's training data.

Definitions, estimators, intervals and costs: docs/methods.md, "Probes". The names below are
imported lazily (the modules need torch).
"""

from __future__ import annotations

import importlib

_LAZY = {
    "Interval": "noise_scale",
    "NoiseScale": "noise_scale",
    "noise_scale": "noise_scale",
    "adam_preconditioner": "noise_scale",
    "NoiseScaleTracker": "tracker",
    "Spectrum": "spectrum",
    "SpectralDensity": "spectrum",
    "top_eigenvalues": "spectrum",
    "spectral_density": "spectrum",
    "reference_checkpoints": "reference",
    "probe_batches": "reference",
    "Checkpoint": "reference",
    "BranchedResult": "branched",
    "branched_critical_batch_size": "branched",
    "branched_on_nqm": "branched",
    "warmup_schedule": "branched",
    "calibrated_problem": "calibrated",
    "predict_steps": "calibrated",
    "CalibratedCurve": "calibrated",
    "matching_fraction": "calibrated",
    "predict": "predict",
}


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(f"{__name__}.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
