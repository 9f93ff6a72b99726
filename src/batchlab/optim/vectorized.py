"""Vectorized updates: torch.optim's SGD, heavy-ball, Nesterov and Adam steps on K stacked trials.

:mod:`batchlab.sweep.vectorized` trains K trials as one computation, their parameters stacked along a
leading trial axis; torch.optim cannot hold a per-trial learning rate on such tensors, so the update
formulas are written out here, one function per optimizer, each the ``update`` of that optimizer's
:class:`batchlab.optim.entry.VectorizedUpdate` (the contract of the arguments is documented there).

Formulas: ``torch.optim.SGD`` (dampening 0; the momentum buffer starts at the first gradient, i.e.
at zero before it; weight decay L2 style, ``g + weight_decay * theta``) and ``torch.optim.Adam``
(non-fused). ``tests/optim/test_vectorized_updates.py`` checks each against the entry's own torch optimizer.

Bit for bit: each operation is the one torch.optim's single-tensor step runs on CPU, with the
per-trial Python scalar replaced by a per-trial column, where the two round alike: ``add(x,
alpha=a)`` (one fused multiply-add) is ``addcmul(.., column, x)``, ``mul_(m).add_(g)`` stays two
operations, ``addcmul_(g, g, value=c)`` is ``addcmul_(g, g * c)``, ``addcdiv_(m, d, value=-s)`` is
``(-s * m) / d`` added. Scalars torch.optim derives in double precision (``1 - beta``, the bias
corrections, the step size) are derived here in double from the columns and rounded to float32
where torch rounds them: given float64 columns and learning rates (as
:mod:`batchlab.sweep.vectorized` passes them) a stacked trial's parameters equal those of its own
torch optimizer exactly on CPU (given equal gradients); float32 ones (the documented minimum) agree
up to rounding of the hyperparameters.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from batchlab.optim.entry import VectorizedUpdate

Column = Callable[[str], torch.Tensor]


def _per_trial(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The (K,) ``values`` in ``like``'s dtype, shaped to broadcast over the stacked tensor ``like`` (K, ...)."""
    return values.to(like.dtype).reshape(values.shape[0], *([1] * (like.dim() - 1)))


def _gradient(grads: dict, name: str, p: torch.Tensor, wd: torch.Tensor | None) -> torch.Tensor:
    """The gradient of stacked parameter ``name`` with L2 weight decay ``wd`` (per trial) added:
    ``grad.add(param, alpha=wd)`` (one fused multiply-add, as ``addcmul``)."""
    g = grads[name]
    if wd is not None:
        g = torch.addcmul(g, _per_trial(wd, p), p)
    return g


# addcmul fuses "multiply by a per-trial factor, then add" into one pass over the parameters (and
# rounds like torch's ``add(..., alpha=)``): the update is memory-bound for small models, so fewer
# passes is what makes it fast.


def sgd_update(params: dict, grads: dict, state: dict, lr: torch.Tensor, column: Column, step: int,
               weight_decay: bool) -> None:
    """``theta <- theta - lr g`` (``torch.optim.SGD``)."""
    wd = column("weight_decay") if weight_decay else None
    for name, p in params.items():
        g = _gradient(grads, name, p, wd)
        p.addcmul_(_per_trial(lr, p), g, value=-1.0)


def _momentum(nesterov: bool) -> Callable[..., None]:
    def update(params: dict, grads: dict, state: dict, lr: torch.Tensor, column: Column, step: int,
               weight_decay: bool) -> None:
        wd = column("weight_decay") if weight_decay else None
        mom = column("momentum")
        for name, p in params.items():
            g = _gradient(grads, name, p, wd)
            buf = state["buf"][name]
            buf.mul_(_per_trial(mom, p)).add_(g)  # torch: buf.mul_(momentum).add_(grad)
            direction = torch.addcmul(g, _per_trial(mom, p), buf) if nesterov else buf  # grad.add(buf, alpha=momentum)
            p.addcmul_(_per_trial(lr, p), direction, value=-1.0)

    return update


momentum_update = _momentum(nesterov=False)
momentum_update.__doc__ = "``v <- momentum v + g``, ``theta <- theta - lr v`` (``torch.optim.SGD``, dampening 0)."
nesterov_update = _momentum(nesterov=True)
nesterov_update.__doc__ = ("``v <- momentum v + g``, ``theta <- theta - lr (g + momentum v)`` "
                           "(``torch.optim.SGD``, ``nesterov=True``).")


def adam_update(params: dict, grads: dict, state: dict, lr: torch.Tensor, column: Column, step: int,
                weight_decay: bool) -> None:
    """``torch.optim.Adam`` (non-fused) with ``betas=(beta1, beta2)``, ``eps=epsilon``; ``step`` is 1-based."""
    wd = column("weight_decay") if weight_decay else None
    beta1, beta2 = column("beta1").double(), column("beta2").double()
    eps = column("epsilon")
    bias1 = 1.0 - beta1**step
    bias2_sqrt = torch.sqrt(1.0 - beta2**step)
    step_size = lr.double() / bias1
    for name, p in params.items():
        g = _gradient(grads, name, p, wd)
        m, v = state["exp_avg"][name], state["exp_avg_sq"][name]
        m.lerp_(g, _per_trial(1.0 - beta1, p))
        v.mul_(_per_trial(beta2, p)).addcmul_(g, g * _per_trial(1.0 - beta2, p))
        denom = (v.sqrt() / _per_trial(bias2_sqrt, p)).add_(_per_trial(eps, p))
        p.add_((_per_trial(-step_size, p) * m) / denom)


SGD = VectorizedUpdate(state_names=(), update=sgd_update)
MOMENTUM = VectorizedUpdate(state_names=("buf",), update=momentum_update)
NESTEROV = VectorizedUpdate(state_names=("buf",), update=nesterov_update)
ADAM = VectorizedUpdate(state_names=("exp_avg", "exp_avg_sq"), update=adam_update)
