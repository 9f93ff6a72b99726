"""batchlab.optim: the optimizer registry, training algorithms, learning-rate schedules, weight EMA.

Every optimizer is one :class:`OptimizerEntry` (name, summary, hyperparameter defaults and rules,
default search space, builder, optional vectorized update and preconditioner) in the registry
(:mod:`batchlab.optim.registry`): ``get_optimizer(name)``, ``optimizer_names()``,
``optimizer_defaults(name)``, ``resolve_hyperparameters(name, values)``, ``default_search_space(name, train_steps, schedule)``; ``register_optimizer(entry)``
adds one. ``build_training_algorithm(name, model, loss_fn, hyperparameters=..., total_steps=...)``
returns a :class:`TrainingAlgorithm`.
"""

from batchlab.optim.algorithm import TrainingAlgorithm, build_training_algorithm
from batchlab.optim.entry import OptimizerEntry, Preconditioner, VectorizedUpdate
from batchlab.optim.hyperparameters import COMMON_DEFAULTS, RULES, Rule, optimizer_defaults, resolve_hyperparameters
from batchlab.optim.registry import (
    ENTRY_POINT_GROUP,
    default_search_space,
    get_optimizer,
    optimizer_names,
    register_optimizer,
    vectorized_optimizer_names,
)

__all__ = [
    "COMMON_DEFAULTS", "ENTRY_POINT_GROUP", "RULES", "OptimizerEntry", "Preconditioner", "Rule", "TrainingAlgorithm",
    "VectorizedUpdate", "build_training_algorithm", "default_search_space", "get_optimizer", "optimizer_defaults", "optimizer_names",
    "register_optimizer", "resolve_hyperparameters", "vectorized_optimizer_names",
]
