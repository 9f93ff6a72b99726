"""The fused path of vectorized trials: K multilayer perceptrons trained as a few large matrix products.

A model qualifies (:func:`mlp_layers`) when it is an ``nn.Sequential`` of an optional ``Flatten`` then
``Linear``/``ReLU`` layers ending in a ``Linear``, with exactly those layers' parameters, no buffers
and no hooks (the built-in ``fc_*`` workloads); :func:`mlp_workload` asks it of a workload, cached.
The forward of the K stacked models (``mlp_forward``): with a shared input the first layer is one
``(B, d) x (d, K*h)`` product; the other layers are batched products whose backward uses
``torch.nn.Linear``'s own products (``_BatchedLinear``), so each trial runs the operations it runs
alone. Whether they also round the same is measured on each machine, not assumed
(:func:`batchlab.sweep.vectorize_choice.vectorized_identical`); the whole contract is in
:mod:`batchlab.sweep.vectorized`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class MLPLayers:
    """The layout of an ``nn.Sequential`` MLP: ``flatten`` (a leading ``nn.Flatten()``) and, per
    ``Linear`` layer, the names of its weight and bias (``None``: no bias) in ``named_parameters``."""

    flatten: bool
    layers: tuple[tuple[str, str | None], ...]


_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks", "_global_forward_hooks_always_called", "_global_forward_hooks_with_kwargs")


def _hooked(model: nn.Module) -> bool:
    """Whether a forward or backward hook (on any of ``model``'s modules, or a global module hook) or
    an instance's own ``forward`` would run code the fused path does not."""
    import torch.nn.modules.module as module_mod

    if any(getattr(module_mod, name, None) for name in _GLOBAL_HOOKS):
        return True
    return any(getattr(m, name, None) for m in model.modules() for name in _HOOKS) or any(
        "forward" in vars(m) for m in model.modules())


def mlp_layers(model: nn.Module) -> MLPLayers | None:
    """The :class:`MLPLayers` of ``model`` if it is exactly ``nn.Sequential([nn.Flatten()], Linear,
    ReLU, Linear, ..., ReLU, Linear)`` (the classes themselves, no subclasses; Flatten over all but the
    first dimension), else ``None``: the models whose K copies the fused path computes.

    Exactly: its parameters are the Linear layers' ``<name>.weight`` and ``<name>.bias`` and nothing
    else (``nn.utils.weight_norm`` or a parametrization renames them), it has no buffers, and no hook
    would run in its forward or backward pass (forward, forward-pre, backward and backward-pre hooks
    of any of its modules, global module hooks, an instance's own ``forward``): the fused path
    computes the layers' products itself and would skip them."""
    if type(model) is not nn.Sequential:
        return None
    children = list(model.named_children())
    flatten = bool(children) and type(children[0][1]) is nn.Flatten
    if flatten:
        if (children[0][1].start_dim, children[0][1].end_dim) != (1, -1):
            return None
        children = children[1:]
    if len(children) % 2 == 0:  # empty, or not ending in a Linear layer
        return None
    layers = []
    for position, (name, module) in enumerate(children):
        if position % 2 == 1:
            if type(module) is not nn.ReLU:
                return None
            continue
        if type(module) is not nn.Linear:
            return None
        layers.append((f"{name}.weight", f"{name}.bias" if getattr(module, "bias", None) is not None else None))
    expected = [n for layer in layers for n in layer if n is not None]
    if [n for n, _ in model.named_parameters()] != expected or next(model.buffers(), None) is not None:
        return None
    if _hooked(model):
        return None
    return MLPLayers(flatten, tuple(layers))


class _BatchedLinear(torch.autograd.Function):
    """K linear layers on K inputs: ``a (K, N, in) -> a @ w^T + b`` (``w (K, out, in)``, ``b (K, out)``
    or ``None``), whose backward computes each trial's gradients with the products
    ``torch.nn.Linear``'s own backward uses (``grad^T @ a`` for the weight, ``grad @ w`` for the
    input, ``grad`` summed over the batch for the bias), so each trial's gradient is the one its own
    model gets, to the bit on CPU."""

    @staticmethod
    def forward(a: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        weight = w.transpose(1, 2)
        return torch.bmm(a, weight) if b is None else torch.baddbmm(b.unsqueeze(1), a, weight)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        a, w, _ = inputs
        ctx.save_for_backward(a, w)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        a, w = ctx.saved_tensors
        grad_a = torch.bmm(grad, w) if ctx.needs_input_grad[0] else None
        grad_w = torch.bmm(grad.transpose(1, 2), a) if ctx.needs_input_grad[1] else None
        grad_b = grad.sum(1) if ctx.needs_input_grad[2] else None
        return grad_a, grad_w, grad_b


def mlp_forward(mlp: MLPLayers, params: dict[str, torch.Tensor], x: torch.Tensor, shared: bool = True) -> torch.Tensor:
    """The outputs ``(K, N, out)`` of the K stacked MLPs ``params`` (each ``(K, ...)``) on ONE input ``x``
    (``(N, ...)``, ``shared``): the first layer as one matrix product ``(N, d) x (d, K*h)``; or on K
    stacked inputs ``(K, N, ...)`` (not ``shared``): the first layer batched too. Later layers are
    :class:`_BatchedLinear`."""
    (weight_name, bias_name), rest = mlp.layers[0], mlp.layers[1:]
    weight, bias = params[weight_name], params[bias_name] if bias_name else None
    if shared:
        inputs = x.flatten(1) if mlp.flatten else x
        k, h, d = weight.shape
        flat = weight.reshape(k * h, d).t()
        z = torch.addmm(bias.reshape(k * h), inputs, flat) if bias is not None else inputs @ flat
        z = z.view(inputs.shape[0], k, h).transpose(0, 1)  # (K, N, h), a view: trial k's columns
    else:
        z = _BatchedLinear.apply(x.flatten(2) if mlp.flatten else x, weight, bias)
    for weight_name, bias_name in rest:
        z = _BatchedLinear.apply(z.relu(), params[weight_name], params[bias_name] if bias_name else None)
    return z




def mlp_workload(workload: Any) -> bool:
    """Whether ``workload`` (a :class:`batchlab.workloads.Workload`, a name or a reference) builds an
    MLP the fused path computes (:func:`mlp_layers` of ``build_model(seed=0)``); ``False`` when it
    cannot be resolved or built. Cached per workload key (:func:`batchlab.workloads.workload_key`)
    while the key resolves to the same workload object, so an edited workload re-registered under its
    name is built again."""
    from batchlab.workloads import resolve_workload, workload_key

    try:
        resolved = resolve_workload(workload)
        key = workload_key(resolved)
    except Exception:
        return False
    known = _MLP_WORKLOADS.get(key)
    if known is None or known[0] is not resolved:
        try:
            answer = mlp_layers(resolved.build_model(seed=0)) is not None
        except Exception:
            answer = False
        known = _MLP_WORKLOADS[key] = (resolved, answer)
    return known[1]


#: ``mlp_workload`` answers: workload key -> (the workload it resolved to, whether it builds an MLP).
_MLP_WORKLOADS: dict[str, tuple[Any, bool]] = {}
