"""Hyperparameters: the shared names with their allowed values, and validation of user-given values.

Each optimizer declares its own hyperparameters and defaults in its registry entry
(:mod:`batchlab.optim.registry`); the rules for the names shared by several optimizers are here
(:data:`RULES`), an entry adds rules for names of its own. Names follow the Shallue et al. release
where it has one. Every optimizer also takes the common hyperparameters (:data:`COMMON_DEFAULTS`):
``weight_decay`` (coupled or decoupled as the optimizer implements it; docs/methods.md),
``learning_rate_decay_steps`` and ``end_learning_rate_factor`` (linear decay; both absent = constant),
``warmup_steps``, ``label_smoothing`` (applied by the trainer through the workload's loss; accepted
and checked here) and ``ema_decay`` (absent = no weight averaging).
A default of ``None`` means "off".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from batchlab.errors import BatchlabError, unknown_name_error
from batchlab.finite import finite_real


@dataclass(frozen=True)
class Rule:
    """The allowed values of one hyperparameter: a number within bounds (``integer`` for counts)."""

    low: float
    high: float
    low_open: bool = False  # exclude ``low``
    high_open: bool = False  # exclude ``high``
    integer: bool = False

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.high == math.inf:
            return f"{kind} {'>' if self.low_open else '>='} {self.low:g}"
        left = "(" if self.low_open else "["
        right = ")" if self.high_open else "]"
        return f"{kind} in {left}{self.low:g}, {self.high:g}{right}"

    def admits(self, value: float) -> bool:
        if self.integer and value != math.floor(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below


_POSITIVE = Rule(0.0, math.inf, low_open=True)
_NON_NEGATIVE = Rule(0.0, math.inf)
_UNIT_OPEN = Rule(0.0, 1.0, high_open=True)  # [0, 1)
_COUNT = Rule(1.0, math.inf, integer=True)

#: The allowed values of the hyperparameter names several optimizers share (an entry's own ``rules``
#: add names, or narrow one of these for that optimizer).
RULES: dict[str, Rule] = {
    "learning_rate": _POSITIVE,
    "momentum": _UNIT_OPEN,
    "beta1": _UNIT_OPEN,
    "beta2": _UNIT_OPEN,
    "epsilon": _POSITIVE,
    "weight_decay": _NON_NEGATIVE,
    "damping": _POSITIVE,
    "factor_decay": _UNIT_OPEN,
    "inverse_update_period": _COUNT,
    "trust_coefficient": _POSITIVE,
    "learning_rate_decay_steps": _COUNT,
    "end_learning_rate_factor": Rule(0.0, 1.0),
    "warmup_steps": Rule(0.0, math.inf, integer=True),
    "label_smoothing": _UNIT_OPEN,
    "ema_decay": _UNIT_OPEN,
}

COMMON_DEFAULTS: dict[str, float | int | None] = {
    "weight_decay": 0.0,
    "learning_rate_decay_steps": None,
    "end_learning_rate_factor": None,
    "warmup_steps": 0,
    "label_smoothing": 0.0,
    "ema_decay": None,
}

#: The largest float32 (``torch.finfo(torch.float32).max``): larger hyperparameters overflow in torch.
FLOAT32_MAX = 3.4028234663852886e38


def optimizer_defaults(name: str) -> dict:
    """Every hyperparameter optimizer ``name`` accepts, with its default (``None`` = off). JSON-ready.

    Its own hyperparameters (in the order its :class:`batchlab.optim.OptimizerEntry` declares them),
    then :data:`COMMON_DEFAULTS`. Unknown ``name``: one-line BatchlabError suggesting the closest.
    """
    from batchlab.optim.registry import get_optimizer

    return get_optimizer(name).all_defaults()


def resolve_hyperparameters(name: str, hyperparameters: dict | None) -> dict:
    """Defaults of optimizer ``name`` overridden by ``hyperparameters``, every value checked.

    Each value is checked against the optimizer's rule for that name (its entry's ``rules``, else
    :data:`RULES`). Integer-valued hyperparameters come back as ``int`` (``1000.0`` is accepted as
    1000). A value of ``None`` means "off" only for hyperparameters whose common default is ``None``.
    BatchlabError (one line, naming the allowed values) for an unknown optimizer, an unknown
    hyperparameter or a bad value.
    """
    from batchlab.optim.registry import get_optimizer

    entry = get_optimizer(name)
    resolved = entry.all_defaults()
    for key, value in (hyperparameters or {}).items():
        if key not in resolved:
            raise unknown_name_error(f"hyperparameter for {name}", str(key), resolved)
        resolved[key] = _checked_value(key, value, entry.rule(key), may_be_off=COMMON_DEFAULTS.get(key, 0) is None)
    if resolved["end_learning_rate_factor"] is not None or resolved["learning_rate_decay_steps"] is not None:
        if resolved["end_learning_rate_factor"] is None:
            resolved["end_learning_rate_factor"] = 0.0
    return resolved


def _checked_value(key: str, value: object, rule: Rule, may_be_off: bool) -> float | int | None:
    if value is None and may_be_off:
        return None
    if not finite_real(value):
        allowed = rule.describe() + (" or null (off)" if may_be_off else "")
        raise BatchlabError(f"hyperparameter {key} must be {allowed}, got {value!r}")
    number = float(value)
    if abs(number) > FLOAT32_MAX:  # torch's float32 optimizers cannot even represent it
        raise BatchlabError(f"hyperparameter {key} must be {rule.describe()} and at most {FLOAT32_MAX:.4g} "
                            f"(the float32 range), got {value!r}")
    if not rule.admits(number):
        raise BatchlabError(f"hyperparameter {key} must be {rule.describe()}, got {value!r}")
    return int(number) if rule.integer else number
