"""What one optimizer declares, once: :class:`OptimizerEntry` (and its :class:`VectorizedUpdate`).

An entry is everything batchlab needs to know about an optimizer; every other module reads it through
the registry (:mod:`batchlab.optim.registry`):

* ``name`` (the ``--optimizer`` value and the last part of the store's ``dataset/model/optimizer``) and
  a one-line ``summary`` (what the ``optimizers`` command shows);
* ``defaults``: its own hyperparameters with their defaults. The schedule and trainer hyperparameters
  every optimizer takes (:data:`batchlab.optim.hyperparameters.COMMON_DEFAULTS`: ``weight_decay``,
  the linear-decay and warmup parameters, ``label_smoothing``, ``ema_decay``) are added by the
  registry; an entry may list one of them to change its default (``adamw``'s ``weight_decay``).
  ``learning_rate`` is required: it is the base rate the schedules multiply;
* ``rules``: the allowed values (:class:`batchlab.optim.hyperparameters.Rule`) of hyperparameter names
  not already in :data:`batchlab.optim.hyperparameters.RULES` (an entry may also narrow a shared name);
* ``search_space``: the parameters searched in a constant-learning-rate study
  (:class:`batchlab.search.Parameter`; an integer hyperparameter needs an INTEGER or DISCRETE
  parameter). The linear-decay parameters (``learning_rate_decay_steps``, ``end_learning_rate_factor``)
  are added by :func:`batchlab.search.default_search_space` and so may not appear here;
* ``build(params, hyperparameters) -> torch.optim.Optimizer``: the optimizer over the model's trainable
  parameters (a list, in ``model.parameters()`` order) with every hyperparameter resolved;
* ``vectorized`` (optional): the same update on K stacked trials (:class:`VectorizedUpdate`), used by
  :mod:`batchlab.sweep.vectorized`; ``None`` = trials with this optimizer run one at a time;
* ``preconditioner`` (optional): ``preconditioner(model, hyperparameters, seed, **options)`` returns a
  :class:`Preconditioner`, an object with ``update(x, y, logits_shape)`` and ``precondition()``; each
  training step with a finite loss calls ``update`` on the batch and then ``precondition`` (which
  rewrites the ``.grad`` of the parameters in place) before ``optimizer.step()`` (a step whose loss is
  not finite calls neither). ``options`` are the ``preconditioner_options`` of
  :class:`batchlab.optim.TrainingAlgorithm` (K-FAC: ``fisher_type``). K-FAC uses it.

The entry checks itself when created (:meth:`OptimizerEntry.__post_init__`): a mistake in a
declaration is a one-line :class:`batchlab.errors.BatchlabError` at registration, not a failure in the
middle of a sweep.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

import torch

from batchlab.errors import BatchlabError
from batchlab.optim.hyperparameters import COMMON_DEFAULTS, RULES, Rule

if TYPE_CHECKING:
    from batchlab.search.space import Parameter

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: Hyperparameters :func:`batchlab.search.default_search_space` adds with ``schedule="linear"``.
_SCHEDULE_PARAMETERS = ("learning_rate_decay_steps", "end_learning_rate_factor")

#: ``update(params, grads, state, lr, column, step, weight_decay)`` of a :class:`VectorizedUpdate`.
StackedUpdate = Callable[..., None]


@dataclass(frozen=True)
class VectorizedUpdate:
    """One optimizer update on K trials at once, the parameters stacked along a leading trial axis.

    ``state_names`` are the per-parameter state tensors the update keeps (``("buf",)`` for momentum);
    the caller allocates each as zeros shaped like the stacked parameters and passes them as
    ``state[state_name][parameter_name]``.

    ``update(params, grads, state, lr, column, step, weight_decay)`` updates ``params`` (dict name ->
    stacked tensor, rows = trials) and ``state`` in place, under ``torch.no_grad()``: ``grads`` is
    shaped like ``params``, ``lr`` is the tensor (K,) of this update's per-trial learning
    rates (schedule applied; float32 or float64, and with float64 the built-in updates round as
    torch.optim does), ``column(name)`` returns the tensor (K,) of hyperparameter
    ``name`` over the trials, ``step`` is the 1-based update count (bias corrections) and
    ``weight_decay`` is whether any trial has a non-zero ``weight_decay``. It must reproduce the
    entry's ``build`` optimizer step for step (``tests/optim/test_vectorized_updates.py`` checks).
    """

    state_names: tuple[str, ...]
    update: StackedUpdate


class Preconditioner(Protocol):
    """What an entry's ``preconditioner`` factory returns (K-FAC: :class:`batchlab.optim.kfac.KfacPreconditioner`)."""

    def update(self, x: torch.Tensor, y: torch.Tensor, logits_shape: torch.Size) -> None: ...

    def precondition(self) -> None: ...


@dataclass(frozen=True, eq=False)
class OptimizerEntry:
    """Everything about one optimizer, declared once (see the module docstring for each field)."""

    name: str
    summary: str
    defaults: Mapping[str, float | int]
    search_space: tuple[Parameter, ...]
    build: Callable[[list[torch.nn.Parameter], dict], torch.optim.Optimizer]
    rules: Mapping[str, Rule] = field(default_factory=dict)
    vectorized: VectorizedUpdate | None = None
    preconditioner: Callable[[torch.nn.Module, dict, int], Preconditioner] | None = None

    def __post_init__(self) -> None:
        from batchlab.search.space import Parameter

        name = self.name
        if not isinstance(name, str) or not _NAME.match(name):
            raise BatchlabError(
                f"optimizer name must be letters, digits, '_', '.' or '-' (no '/' or spaces), got {name!r}"
            )
        where = f"optimizer {name!r}"
        if not isinstance(self.summary, str) or not self.summary.strip() or "\n" in self.summary:
            raise BatchlabError(f"{where}: summary must be one non-empty line, got {self.summary!r}")
        if not callable(self.build):
            raise BatchlabError(f"{where}: build must be a function (params, hyperparameters) -> torch.optim.Optimizer")
        if self.vectorized is not None and not isinstance(self.vectorized, VectorizedUpdate):
            raise BatchlabError(f"{where}: vectorized must be a VectorizedUpdate or None, got {self.vectorized!r}")
        if self.preconditioner is not None and not callable(self.preconditioner):
            raise BatchlabError(f"{where}: preconditioner must be a function (model, hyperparameters, seed) or None")
        if not isinstance(self.rules, Mapping) or not all(isinstance(r, Rule) for r in self.rules.values()):
            raise BatchlabError(f"{where}: rules must map hyperparameter names to batchlab.optim.Rule")
        if not isinstance(self.defaults, Mapping) or "learning_rate" not in self.defaults:
            raise BatchlabError(f"{where}: defaults must be a mapping that includes learning_rate")
        object.__setattr__(self, "rules", MappingProxyType(dict(self.rules)))
        object.__setattr__(self, "defaults", MappingProxyType(dict(self.defaults)))
        for key, value in self.defaults.items():
            rule = self.rule(key)
            if rule is None:
                raise BatchlabError(f"{where}: hyperparameter {key!r} has no rule; add it to the entry's rules")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not rule.admits(float(value)):
                raise BatchlabError(f"{where}: default {key}={value!r} is not {rule.describe()}")
        space = getattr(self.search_space, "parameters", self.search_space)  # a SearchSpace or Parameters
        space = tuple(space) if isinstance(space, (tuple, list)) else space
        if not isinstance(space, tuple):
            raise BatchlabError(f"{where}: search_space must be a tuple of batchlab.search.Parameter, got {space!r}")
        object.__setattr__(self, "search_space", space)
        accepted = (set(self.defaults) | set(COMMON_DEFAULTS)) - set(_SCHEDULE_PARAMETERS)
        for parameter in space:
            if not isinstance(parameter, Parameter):
                raise BatchlabError(f"{where}: search_space must hold batchlab.search.Parameter, got {parameter!r}")
            if parameter.name in _SCHEDULE_PARAMETERS:
                raise BatchlabError(f"{where}: search space parameter {parameter.name!r} is added by the linear "
                                    "schedule (batchlab.search.default_search_space); leave it out")
            if parameter.name not in accepted:
                raise BatchlabError(f"{where}: search space parameter {parameter.name!r} is not a hyperparameter "
                                    f"it accepts; accepted: {', '.join(sorted(accepted))}")
            rule = self.rule(parameter.name)
            if rule.integer and parameter.type == "DOUBLE":
                raise BatchlabError(f"{where}: search space of {parameter.name} must be INTEGER or DISCRETE "
                                    f"(it is {rule.describe()}), got DOUBLE")
            ends = parameter.feasible_points if parameter.type == "DISCRETE" else (parameter.min_value, parameter.max_value)
            if not all(not isinstance(v, bool) and isinstance(v, (int, float)) and rule.admits(float(v)) for v in ends):
                raise BatchlabError(f"{where}: search space of {parameter.name} goes outside {rule.describe()}")
        names = [p.name for p in space]
        if len(set(names)) != len(names) or "learning_rate" not in names:
            raise BatchlabError(f"{where}: search space must name learning_rate and each parameter once, got {names}")

    def rule(self, key: str) -> Rule | None:
        """The allowed values of hyperparameter ``key`` for this optimizer (``None``: not one it takes)."""
        return self.rules.get(key) or RULES.get(key)

    def all_defaults(self) -> dict[str, Any]:
        """Every hyperparameter it accepts with its default: its own first, then the common ones."""
        merged: dict[str, Any] = dict(self.defaults)
        for key, value in COMMON_DEFAULTS.items():
            merged.setdefault(key, value)
        return merged
