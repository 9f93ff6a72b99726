"""A training algorithm: optimizer + learning-rate schedule + optional weight EMA, one ``step`` per update.

Update rules (docs/methods.md, "Optimizers, schedules and search spaces", the release's TF1 ``MomentumOptimizer`` convention), all from torch.optim
unless noted; ``g`` is the minibatch gradient (plus ``weight_decay * theta`` when set, L2 style):

* ``sgd``: ``theta <- theta - eta g`` (``torch.optim.SGD``).
* ``momentum`` (heavy ball): ``v <- gamma v + g``, ``theta <- theta - eta v``: ``torch.optim.SGD``
  with ``dampening=0`` implements exactly this (its buffer starts at ``v = g``, the same as
  ``v = 0`` followed by one update). The effective learning rate is ``eta / (1 - gamma)``.
* ``nesterov``: ``v <- gamma v + g``, ``theta <- theta - eta (g + gamma v)``
  (``torch.optim.SGD(nesterov=True, dampening=0)``).
* ``adam``: ``torch.optim.Adam`` with ``betas=(beta1, beta2)``, ``eps=epsilon``.
* ``kfac``: the heavy-ball update above on the K-FAC preconditioned gradient
  (:mod:`batchlab.optim.kfac`, factors from curvlinops).
* ``lars``: ``pytorch_optimizer.LARS`` (heavy-ball momentum, per-layer rate
  ``trust_coefficient |w| / |g|``; scalars and vectors take plain SGD steps).
* ``lamb``: ``pytorch_optimizer.Lamb`` (Adam direction, per-layer trust ratio ``|w| / |update|``,
  decoupled weight decay).

Steps count updates; ``steps_taken`` is the number of updates so far, and the learning rate of the
next update is ``learning_rate * multiplier(steps_taken)`` (:mod:`batchlab.optim.schedules`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch
from torch import nn

from batchlab.errors import BatchlabError, unknown_name_error
from batchlab.optim.hyperparameters import OPTIMIZER_DEFAULTS, resolve_hyperparameters
from batchlab.optim.kfac import KfacPreconditioner
from batchlab.optim.schedules import multiplier_function

LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _torch_optimizer(name: str, params: list[nn.Parameter], h: dict) -> torch.optim.Optimizer:
    """The torch optimizer for ``name`` with base learning rate ``h["learning_rate"]``."""
    lr, wd = h["learning_rate"], h["weight_decay"]
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=wd)
    if name in ("momentum", "kfac"):
        return torch.optim.SGD(params, lr=lr, momentum=h["momentum"], dampening=0.0, weight_decay=wd)
    if name == "nesterov":
        return torch.optim.SGD(
            params, lr=lr, momentum=h["momentum"], dampening=0.0, nesterov=True, weight_decay=wd
        )
    if name == "adam":
        return torch.optim.Adam(
            params, lr=lr, betas=(h["beta1"], h["beta2"]), eps=h["epsilon"], weight_decay=wd
        )
    from pytorch_optimizer import LARS, Lamb

    if name == "lars":
        return LARS(
            params, lr=lr, momentum=h["momentum"], dampening=0.0,
            trust_coefficient=h["trust_coefficient"], weight_decay=wd,
        )
    return Lamb(params, lr=lr, betas=(h["beta1"], h["beta2"]), eps=h["epsilon"], weight_decay=wd)


class TrainingAlgorithm:
    """One optimizer, schedule and optional EMA bound to one model. See the module docstring.

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
        kfac_fisher_type: str = "mc",
        seed: int = 0,
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
        self.optimizer = _torch_optimizer(name, params, h)
        self._kfac = None
        if name == "kfac":
            self._kfac = KfacPreconditioner(
                model, damping=h["damping"], factor_decay=h["factor_decay"],
                inverse_update_period=h["inverse_update_period"], fisher_type=kfac_fisher_type, seed=seed,
            )
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
        if self._kfac is not None:
            value = loss.item()
            # A diverged model (non-finite loss) gets no curvature update: the Fisher's sampled
            # labels and the factor inverses are undefined there. The trainer sees the loss.
            if math.isfinite(value):
                self._kfac.update(x, y, logits.shape)
                self._kfac.precondition()
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

    ``hyperparameters`` override :func:`optimizer_defaults`; unknown names or bad values raise a
    one-line BatchlabError. ``total_steps`` (the trial's budget) is the decay length when
    ``end_learning_rate_factor`` is given without ``learning_rate_decay_steps``.
    """
    if name not in OPTIMIZER_DEFAULTS:
        raise unknown_name_error("optimizer", name, OPTIMIZER_DEFAULTS)
    if total_steps is not None and (isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1):
        raise BatchlabError(f"total_steps must be an integer >= 1, got {total_steps!r}")
    resolved = resolve_hyperparameters(name, hyperparameters)
    return TrainingAlgorithm(name, model, loss_fn, resolved, total_steps=total_steps)
