"""``batchlab advise``: measure just enough of one workload to recommend a batch size and learning rate.

Orchestration, not new statistics (docs/methods.md, "Advise"): every round is a sweep of the store
(:mod:`batchlab.sweep.runner`) with one set of settings, so all of advise's studies form one analysed
unit; the fit, its intervals and the regimes are :mod:`batchlab.analysis`'s. Modules: ``throughput``
(step times, memory probe), ``bracket`` (where to look, from the predictors), ``rounds`` (which study
next), ``recommend`` (the answer), ``check`` (one fresh run of it), ``record`` (the advice record in
the store), ``run`` (:func:`advise`, the whole flow).
"""

from __future__ import annotations

__all__ = ["advise"]


def __getattr__(name: str):
    if name == "advise":  # lazy: importing the package does not import torch
        from batchlab.advise.run import advise

        return advise
    raise AttributeError(name)
