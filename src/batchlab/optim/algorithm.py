"""A training algorithm: optimizer + learning-rate schedule + optional weight EMA, one ``step`` per update.

The optimizer comes from its registry entry (:mod:`batchlab.optim.registry`; the update rules of the
built-ins are in :mod:`batchlab.optim.builtin`): ``entry.build(params, hyperparameters)`` over the
model's trainable parameters, and, when the entry has one, its ``preconditioner`` (K-FAC), which
rewrites the gradients before each optimizer step.

Steps count updates; ``steps_taken`` is the number of updates so far, and the learning rate of the
next update is ``learning_rate * multiplier(steps_taken)`` (:mod:`batchlab.optim.schedules`), applied
to every parameter group's own base rate.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch
from torch import nn

from batchlab.errors import BatchlabError
from batchlab.optim.hyperparameters import resolve_hyperparameters
from batchlab.optim.registry import get_optimizer
from batchlab.optim.schedules import multiplier_function

LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class TrainingAlgorithm:
    """One optimizer, schedule and optional EMA bound to one model. See the module docstring.

    ``hyperparameters`` must be resolved (:func:`batchlab.optim.resolve_hyperparameters`: every name
    with its value); ``total_steps`` is the decay length when ``end_learning_rate_factor`` comes
    without ``learning_rate_decay_steps``. ``seed`` and ``preconditioner_options`` (keyword arguments)
    go to the entry's ``preconditioner`` when it has one (K-FAC: the seed of the sampled Fisher labels,
    ``{"fisher_type": "empirical"}``); other optimizers ignore them.

    ``step(x, y)`` runs one update and returns the batch loss before it; ``evaluation_weights()``
    swaps in the weight EMA (when ``ema_decay`` is set) for the duration of a ``with`` block.
    """

    def __init__(
        self,
        name: str,
        model: nn.Module,
        loss_fn: LossFunction,
        hyperparameters: dict,
        total_steps: int | None = None,
        seed: int = 0,
        preconditioner_options: dict | None = None,
    ):
        self.name = name
        self.model = model
        self.loss_fn = loss_fn
        self.hyperparameters = hyperparameters  # resolved: every name with its value
        self.total_steps = total_steps
        self.steps_taken = 0
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise BatchlabError("the model has no trainable parameters")
        h = hyperparameters
        entry = get_optimizer(name)
        self.optimizer = entry.build(params, h)
        self._preconditioner = None
        if entry.preconditioner is not None:
            self._preconditioner = entry.preconditioner(model, h, seed, **(preconditioner_options or {}))
        decay_steps = h["learning_rate_decay_steps"]
        if decay_steps is None and h["end_learning_rate_factor"] is not None:
            if total_steps is None:
                raise BatchlabError(
                    "end_learning_rate_factor without learning_rate_decay_steps needs total_steps (the decay length)"
                )
            decay_steps = total_steps
        multiplier = multiplier_function(decay_steps, h["end_learning_rate_factor"] or 0.0, h["warmup_steps"])
        self._scheduler = None
        if multiplier is not None:
            self._scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, multiplier)
        # Weight EMA: theta_ema <- d theta_ema + (1 - d) theta after every update (the first update
        # copies), parameters only (the workloads have no batch-norm buffers). Written with one
        # torch._foreach_lerp_ call, the kernel torch.optim.swa_utils.get_ema_multi_avg_fn uses,
        # because AveragedModel.update_parameters adds ~0.3 ms of Python per step on fc_128_128_128
        # (5x the averaging itself), which would break the trial-throughput budget at small batches.
        self._ema_decay = h["ema_decay"]
        self._live_weights = [p.detach() for p in model.parameters()]
        self._ema_weights: list[torch.Tensor] | None = None

    @property
    def learning_rate(self) -> float:
        """The learning rate of the next update (schedule applied)."""
        return float(self.optimizer.param_groups[0]["lr"])

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One update on the batch ``(x, y)``; returns the batch loss (float) before the update."""
        self.optimizer.zero_grad(set_to_none=True)
        logits = self.model(x)
        loss = self.loss_fn(logits, y)
        loss.backward()
        if self._preconditioner is not None:
            value = loss.item()
            # A diverged model (non-finite loss) gets no curvature update: the Fisher's sampled
            # labels and the factor inverses are undefined there. The trainer sees the loss.
            if math.isfinite(value):
                self._preconditioner.update(x, y, logits.shape)
                self._preconditioner.precondition()
        self.optimizer.step()
        if self._scheduler is not None:
            self._scheduler.step()
        if self._ema_decay is not None:
            self._update_ema()
        self.steps_taken += 1
        return loss.item()

    @torch.no_grad()
    def _update_ema(self) -> None:
        if self._ema_weights is None:
            self._ema_weights = [w.clone() for w in self._live_weights]
        else:
            torch._foreach_lerp_(self._ema_weights, self._live_weights, 1.0 - self._ema_decay)

    @contextlib.contextmanager
    def evaluation_weights(self) -> Iterator[nn.Module]:
        """Within the block the model holds the EMA of its weights (if ``ema_decay`` is set and at
        least one update was taken; otherwise its own weights). Yields the model; restores after,
        also when the block raises."""
        if self._ema_weights is None:
            yield self.model
            return
        saved = [w.clone() for w in self._live_weights]
        with torch.no_grad():
            torch._foreach_copy_(self._live_weights, self._ema_weights)
        try:
            yield self.model
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self._live_weights, saved)

def build_training_algorithm(
    name: str,
    model: nn.Module,
    loss_fn: LossFunction,
    hyperparameters: dict | None = None,
    total_steps: int | None = None,
) -> TrainingAlgorithm:
    """The :class:`TrainingAlgorithm` for optimizer ``name`` on ``model``.

    ``hyperparameters`` override :func:`optimizer_defaults`; an unknown optimizer (not in the
    registry), unknown hyperparameter names or bad values raise a one-line BatchlabError. ``total_steps`` (the trial's budget) is the decay length when
    ``end_learning_rate_factor`` is given without ``learning_rate_decay_steps``.
    """
    get_optimizer(name)  # unknown name: one-line error before anything else
    if total_steps is not None and (isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1):
        raise BatchlabError(f"total_steps must be an integer >= 1, got {total_steps!r}")
    resolved = resolve_hyperparameters(name, hyperparameters)
    return TrainingAlgorithm(name, model, loss_fn, resolved, total_steps=total_steps)
