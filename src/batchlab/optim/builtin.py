"""The built-in optimizers: one :class:`batchlab.optim.entry.OptimizerEntry` each, in :data:`BUILTIN_OPTIMIZERS`.

Update rules (docs/methods.md, "Optimizers, schedules and search spaces", the release's TF1
``MomentumOptimizer`` convention); ``g`` is the minibatch gradient (plus ``weight_decay * theta`` when
set, L2 style, for the torch.optim SGD/Adam family and LARS):

* ``sgd``: ``theta <- theta - eta g`` (``torch.optim.SGD``).
* ``momentum`` (heavy ball): ``v <- gamma v + g``, ``theta <- theta - eta v``: ``torch.optim.SGD``
  with ``dampening=0`` implements exactly this (its buffer starts at ``v = g``, the same as
  ``v = 0`` followed by one update). The effective learning rate is ``eta / (1 - gamma)``.
* ``nesterov``: ``v <- gamma v + g``, ``theta <- theta - eta (g + gamma v)``
  (``torch.optim.SGD(nesterov=True, dampening=0)``).
* ``adam``: ``torch.optim.Adam`` with ``betas=(beta1, beta2)``, ``eps=epsilon``.
* ``kfac``: the heavy-ball update above on the K-FAC preconditioned gradient
  (:mod:`batchlab.optim.kfac`, factors from curvlinops), through the entry's ``preconditioner``.
* ``lars``: ``pytorch_optimizer.LARS`` (heavy-ball momentum, per-layer rate
  ``trust_coefficient |w| / |g|``; scalars and vectors take plain SGD steps).
* ``lamb``: ``pytorch_optimizer.Lamb`` (Adam direction, per-layer trust ratio ``|w| / |update|``,
  decoupled weight decay).
* ``adamw``: ``torch.optim.AdamW``: Adam with decoupled weight decay
  ``theta <- theta (1 - eta weight_decay)`` before the Adam step (the decay is scaled by the scheduled
  learning rate, as torch does); its ``weight_decay`` defaults to torch's 0.01 and is searched.
* ``soap``: ``pytorch_optimizer.SOAP`` (Vyas et al. 2024): Adam run in the eigenbasis of Shampoo's
  Kronecker factors, refreshed every ``precondition_frequency`` updates; its first update only
  initialises the preconditioner (the parameters move from the second update on).
* ``muon``: ``pytorch_optimizer.Muon`` (Jordan et al. 2024): momentum (Nesterov) whose update of each
  weight matrix is orthogonalised by Newton-Schulz iterations. Only parameters with two or more
  dimensions (Linear weights, convolution kernels as flattened matrices) take Muon steps
  (``use_muon=True``, rate ``learning_rate``); biases and other vectors or scalars take AdamW steps
  (``use_muon=False``, rate ``adam_learning_rate``, ``betas=(beta1, beta2)``, ``eps=epsilon``), the
  split the library documents. Embeddings and the output layer are matrices and so take Muon steps
  here (the entry sees parameters, not layers).

Decoupled decay (``adamw``, ``lamb``, ``soap``, ``muon``) shrinks the weights by ``eta weight_decay``
per update; coupled decay (``sgd`` ... ``lars``) adds ``weight_decay * theta`` to the gradient. Either
way ``weight_decay`` is the one common hyperparameter (0 = off; the default except for ``adamw``).

Search spaces are for the small workloads batchlab trains on a CPU (budgets of hundreds to a few
thousand steps), so they are wider at the low-momentum end than the release's ImageNet example
(momentum REVERSE_LOG [0.9, 0.9999]): here momentum is REVERSE_LOG over [0.5, 0.999], i.e. 1 - momentum
is log-uniform in [1e-3, 0.5]. The linear-decay parameters are added by
:func:`batchlab.search.default_search_space`.

To add an optimizer, append one entry to :data:`BUILTIN_OPTIMIZERS` (or, outside the package, call
:func:`batchlab.optim.register_optimizer`; docs/internals.md, "How to change X").
"""

from __future__ import annotations

import torch
from torch import nn

from batchlab.optim import vectorized
from batchlab.optim.entry import OptimizerEntry
from batchlab.optim.hyperparameters import Rule
from batchlab.search.space import Parameter


def _log(name: str, lo: float, hi: float) -> Parameter:
    return Parameter(name=name, type="DOUBLE", scale="LOG", min_value=lo, max_value=hi)


def _reverse_log(name: str, lo: float, hi: float) -> Parameter:
    return Parameter(name=name, type="DOUBLE", scale="REVERSE_LOG", min_value=lo, max_value=hi)


_MOMENTUM = _reverse_log("momentum", 0.5, 0.999)
_BETA1 = _reverse_log("beta1", 0.5, 0.99)
_BETA2 = _reverse_log("beta2", 0.9, 0.9999)


# --- builders: (trainable parameters in model order, resolved hyperparameters) -> optimizer ---------


def _sgd(params: list[nn.Parameter], h: dict) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=h["learning_rate"], weight_decay=h["weight_decay"])


def _heavy_ball(params: list[nn.Parameter], h: dict) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        params, lr=h["learning_rate"], momentum=h["momentum"], dampening=0.0, weight_decay=h["weight_decay"]
    )


def _nesterov(params: list[nn.Parameter], h: dict) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        params, lr=h["learning_rate"], momentum=h["momentum"], dampening=0.0, nesterov=True,
        weight_decay=h["weight_decay"],
    )


def _adam(params: list[nn.Parameter], h: dict) -> torch.optim.Optimizer:
    return torch.optim.Adam(
        params, lr=h["learning_rate"], betas=(h["beta1"], h["beta2"]), eps=h["epsilon"],
        weight_decay=h["weight_decay"],
    )


def _adamw(params: list[nn.Parameter], h: dict) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        params, lr=h["learning_rate"], betas=(h["beta1"], h["beta2"]), eps=h["epsilon"],
        weight_decay=h["weight_decay"],
    )


def _lars(params: list[nn.Parameter], h: dict) -> torch.optim.Optimizer:
    from pytorch_optimizer import LARS

    return LARS(
        params, lr=h["learning_rate"], momentum=h["momentum"], dampening=0.0,
        trust_coefficient=h["trust_coefficient"], weight_decay=h["weight_decay"],
    )


def _lamb(params: list[nn.Parameter], h: dict) -> torch.optim.Optimizer:
    from pytorch_optimizer import Lamb

    return Lamb(
        params, lr=h["learning_rate"], betas=(h["beta1"], h["beta2"]), eps=h["epsilon"],
        weight_decay=h["weight_decay"],
    )


def _soap(params: list[nn.Parameter], h: dict) -> torch.optim.Optimizer:
    from pytorch_optimizer import SOAP

    return SOAP(
        params, lr=h["learning_rate"], betas=(h["beta1"], h["beta2"]), eps=h["epsilon"],
        weight_decay=h["weight_decay"], precondition_frequency=h["precondition_frequency"],
    )


def _muon(params: list[nn.Parameter], h: dict) -> torch.optim.Optimizer:
    from pytorch_optimizer import Muon

    matrices = [p for p in params if p.ndim >= 2]
    others = [p for p in params if p.ndim < 2]
    groups = []
    if matrices:  # first, so param_groups[0]["lr"] is the (scheduled) learning_rate
        groups.append({"params": matrices, "use_muon": True, "lr": h["learning_rate"],
                       "momentum": h["momentum"], "weight_decay": h["weight_decay"]})
    if others:
        groups.append({"params": others, "use_muon": False, "lr": h["adam_learning_rate"],
                       "betas": (h["beta1"], h["beta2"]), "eps": h["epsilon"], "weight_decay": h["weight_decay"]})
    return Muon(groups, nesterov=True)


def _kfac_preconditioner(model: nn.Module, h: dict, seed: int, fisher_type: str = "mc"):
    from batchlab.optim.kfac import KfacPreconditioner

    return KfacPreconditioner(
        model, damping=h["damping"], factor_decay=h["factor_decay"],
        inverse_update_period=h["inverse_update_period"], fisher_type=fisher_type, seed=seed,
    )


_ADAM_DEFAULTS = {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}

#: The built-in optimizers, in the order ``optimizer_names()`` lists them.
BUILTIN_OPTIMIZERS: tuple[OptimizerEntry, ...] = (
    OptimizerEntry(
        name="sgd", summary="plain SGD (torch.optim.SGD)",
        defaults={"learning_rate": 0.1},
        search_space=(_log("learning_rate", 1e-3, 10.0),),
        build=_sgd, vectorized=vectorized.SGD,
    ),
    OptimizerEntry(
        name="momentum", summary="heavy-ball momentum, TF1 convention (torch.optim.SGD, dampening 0)",
        defaults={"learning_rate": 0.01, "momentum": 0.9},
        search_space=(_log("learning_rate", 1e-4, 1.0), _MOMENTUM),
        build=_heavy_ball, vectorized=vectorized.MOMENTUM,
    ),
    OptimizerEntry(
        name="nesterov", summary="Nesterov momentum (torch.optim.SGD, nesterov=True)",
        defaults={"learning_rate": 0.01, "momentum": 0.9},
        search_space=(_log("learning_rate", 1e-4, 1.0), _MOMENTUM),
        build=_nesterov, vectorized=vectorized.NESTEROV,
    ),
    OptimizerEntry(
        name="adam", summary="Adam with L2 weight decay (torch.optim.Adam)",
        defaults=_ADAM_DEFAULTS,
        search_space=(_log("learning_rate", 1e-5, 1e-1), _BETA1, _BETA2, _log("epsilon", 1e-10, 1e-3)),
        build=_adam, vectorized=vectorized.ADAM,
    ),
    OptimizerEntry(
        name="kfac", summary="heavy-ball momentum on the K-FAC preconditioned gradient (curvlinops factors)",
        defaults={"learning_rate": 0.1, "momentum": 0.9, "damping": 0.1,
                  "factor_decay": 0.95, "inverse_update_period": 10},
        # learning rate from 1e-4: on mnist/fc_64_64_64 the best K-FAC trial at B = 32 sat at 0.0018, at the
        # low edge of [1e-3, 1], and the best rate falls with batch size below the critical batch size
        search_space=(_log("learning_rate", 1e-4, 1.0), _MOMENTUM, _log("damping", 1e-3, 1.0)),
        build=_heavy_ball, preconditioner=_kfac_preconditioner,
    ),
    OptimizerEntry(
        name="lars", summary="LARS, layer-wise trust ratio on heavy-ball momentum (pytorch_optimizer.LARS)",
        defaults={"learning_rate": 1.0, "momentum": 0.9, "trust_coefficient": 1e-3},
        # LARS scales each layer's step by trust_coefficient * |w| / |g| (trust 1e-3), so its raw rate is large.
        search_space=(_log("learning_rate", 1e-2, 100.0), _MOMENTUM),
        build=_lars,
    ),
    OptimizerEntry(
        name="lamb", summary="LAMB, layer-wise trust ratio on Adam (pytorch_optimizer.Lamb)",
        defaults={"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-6},
        # LAMB's step is learning_rate * |w| / |adam update| per layer.
        search_space=(_log("learning_rate", 1e-4, 1e-1), _BETA1, _BETA2),
        build=_lamb,
    ),
    OptimizerEntry(
        name="adamw", summary="Adam with decoupled weight decay (torch.optim.AdamW; weight_decay default 0.01)",
        defaults={**_ADAM_DEFAULTS, "weight_decay": 0.01},
        # Adam's ranges; weight_decay instead of epsilon: the decay is what AdamW adds. The decay per update
        # is learning_rate * weight_decay: 1e-4 is next to none over a few thousand steps, 1.0 is strong.
        search_space=(_log("learning_rate", 1e-5, 1e-1), _BETA1, _BETA2, _log("weight_decay", 1e-4, 1.0)),
        build=_adamw,
    ),
    OptimizerEntry(
        name="soap", summary="SOAP, Adam in Shampoo's eigenbasis (pytorch_optimizer.SOAP; first update only "
                             "initialises the preconditioner)",
        defaults={"learning_rate": 3e-3, "beta1": 0.95, "beta2": 0.95, "epsilon": 1e-8, "precondition_frequency": 10},
        rules={"precondition_frequency": Rule(1.0, float("inf"), integer=True)},
        # An Adam-like rate (library default 3e-3 in the middle, in log); beta2 also drives the factor
        # averages (shampoo_beta = beta2), so its range reaches down to the library's 0.95 and below.
        search_space=(_log("learning_rate", 1e-4, 1e-1), _reverse_log("beta1", 0.5, 0.99),
                      _reverse_log("beta2", 0.8, 0.999)),
        build=_soap,
    ),
    OptimizerEntry(
        name="muon", summary="Muon: orthogonalised Nesterov momentum on >=2-D weights, AdamW on biases and "
                             "other 1-D parameters (pytorch_optimizer.Muon)",
        defaults={"learning_rate": 0.02, "momentum": 0.95, "adam_learning_rate": 3e-4,
                  "beta1": 0.9, "beta2": 0.95, "epsilon": 1e-10},
        rules={"adam_learning_rate": Rule(0.0, float("inf"), low_open=True)},
        # Orthogonalised updates have unit singular values, so the useful rate hardly depends on the
        # gradient scale: a decade around the library's 0.02 each way plus headroom for tiny models; the
        # AdamW rate of the biases is searched over Adam's useful range, since biases matter on small nets.
        search_space=(_log("learning_rate", 1e-3, 1.0), _reverse_log("momentum", 0.5, 0.99),
                      _log("adam_learning_rate", 1e-4, 1e-1)),
        build=_muon,
    ),
)
