"""batchlab.optim: optimizers by name, learning-rate schedules, weight EMA.

``build_training_algorithm(name, model, loss_fn, hyperparameters=..., total_steps=...)`` returns a
:class:`TrainingAlgorithm`; ``optimizer_names()`` and ``optimizer_defaults(name)`` list what exists.
"""

from batchlab.optim.algorithm import TrainingAlgorithm, build_training_algorithm
from batchlab.optim.hyperparameters import optimizer_defaults, optimizer_names

__all__ = ["TrainingAlgorithm", "build_training_algorithm", "optimizer_defaults", "optimizer_names"]
