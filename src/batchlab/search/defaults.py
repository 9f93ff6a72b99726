"""Default search spaces per optimizer, in the batch_science form.

The ranges are for the small workloads batchlab trains on a CPU (budgets of hundreds to a few thousand
steps), so they are wider at the low-momentum end than the release's ImageNet example (momentum
REVERSE_LOG [0.9, 0.9999]): here momentum is REVERSE_LOG over [0.5, 0.999], i.e. 1 - momentum is
log-uniform in [1e-3, 0.5]. With ``schedule="linear"`` the Shallue linear-decay parameters are added:
``learning_rate_decay_steps`` INTEGER over [train_steps / 2, train_steps] and
``end_learning_rate_factor`` LOG over [1e-4, 0.1] (docs/methods.md, "Optimizers, schedules and search spaces").
"""

from __future__ import annotations

import numbers

from batchlab.errors import BatchlabError, unknown_name_error
from batchlab.search.space import Parameter, SearchSpace

SCHEDULES = ("constant", "linear")


def _log(name: str, lo: float, hi: float) -> Parameter:
    return Parameter(name=name, type="DOUBLE", scale="LOG", min_value=lo, max_value=hi)


def _reverse_log(name: str, lo: float, hi: float) -> Parameter:
    return Parameter(name=name, type="DOUBLE", scale="REVERSE_LOG", min_value=lo, max_value=hi)


_MOMENTUM = _reverse_log("momentum", 0.5, 0.999)
_BETA1 = _reverse_log("beta1", 0.5, 0.99)
_BETA2 = _reverse_log("beta2", 0.9, 0.9999)

# Per optimizer: the searched parameters of a constant-learning-rate study.
_BASE_SPACES: dict[str, tuple[Parameter, ...]] = {
    "sgd": (_log("learning_rate", 1e-3, 10.0),),
    "momentum": (_log("learning_rate", 1e-4, 1.0), _MOMENTUM),
    "nesterov": (_log("learning_rate", 1e-4, 1.0), _MOMENTUM),
    "adam": (_log("learning_rate", 1e-5, 1e-1), _BETA1, _BETA2, _log("epsilon", 1e-10, 1e-3)),
    "kfac": (_log("learning_rate", 1e-3, 1.0), _MOMENTUM, _log("damping", 1e-3, 1.0)),
    # LARS scales each layer's step by trust_coefficient * |w| / |g| (trust 1e-3), so its raw rate is large.
    "lars": (_log("learning_rate", 1e-2, 100.0), _MOMENTUM),
    # LAMB's step is learning_rate * |w| / |adam update| per layer.
    "lamb": (_log("learning_rate", 1e-4, 1e-1), _BETA1, _BETA2),
}


def default_search_space(name: str, train_steps: int | None = None, schedule: str = "constant") -> SearchSpace:
    """The default :class:`SearchSpace` for optimizer ``name``.

    ``schedule="linear"`` adds ``learning_rate_decay_steps`` (INTEGER, LINEAR over
    [ceil(train_steps / 2), train_steps]) and ``end_learning_rate_factor`` (LOG over [1e-4, 0.1]);
    it needs ``train_steps`` >= 1.
    """
    if name not in _BASE_SPACES:
        raise unknown_name_error("optimizer", name, _BASE_SPACES)
    if schedule not in SCHEDULES:
        raise BatchlabError(f"unknown schedule {schedule!r}; allowed: {', '.join(SCHEDULES)}")
    parameters = list(_BASE_SPACES[name])
    if schedule == "linear":
        if isinstance(train_steps, bool) or not isinstance(train_steps, numbers.Integral) or train_steps < 1:
            raise BatchlabError(f"the linear schedule needs train_steps, an integer >= 1, got {train_steps!r}")
        half = (int(train_steps) + 1) // 2
        parameters.append(
            Parameter(
                name="learning_rate_decay_steps", type="INTEGER", scale="LINEAR",
                min_value=max(1, half), max_value=int(train_steps),
            )
        )
        parameters.append(_log("end_learning_rate_factor", 1e-4, 0.1))
    return SearchSpace(parameters)

