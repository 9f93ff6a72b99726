"""Probes: measurements at one model's parameters that predict how training scales with batch size.

* :mod:`batchlab.probes.noise_scale`: the gradient noise scale, B_simple = tr(Sigma)/|G|^2 and
  B_noise = tr(H Sigma)/(G^T H G) (examples), by per-example gradients or the two-batch-size
  estimator, in the plain or an Adam-preconditioned metric, per layer, with intervals
  (:func:`noise_scale`, :class:`NoiseScale`).
* :mod:`batchlab.probes.tracker`: :class:`NoiseScaleTracker`, running B_simple inside a user's own
  training loop from the gradients it already has (micro-batches, or local vs all-reduced under
  DistributedDataParallel).
* :mod:`batchlab.probes.spectrum`: top Hessian / Gauss-Newton eigenvalues and a spectral density by
  Lanczos on Hessian-vector products.
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
}


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(f"{__name__}.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
