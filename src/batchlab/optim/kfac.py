"""K-FAC preconditioning of Linear and Conv2d gradients, with Kronecker factors from curvlinops.

Library choice: ``curvlinops.KFACLinearOperator`` (curvlinops-for-pytorch 3.0.1) computes the factors
with plain forward/tensor hooks, so it works with torch 2.13 on any architecture whose curvature
layers are Linear/Conv2d (MLPs, CNNs, residual nets, Linear layers inside transformers via
KFAC-expand), and draws Monte-Carlo labels for the true Fisher. asdl 0.1a5's ``KfacGradientMaker``
fails on CPU builds of torch (it calls ``torch.cuda.nvtx`` unconditionally), and backpack's KFAC
extension needs every module of the network to be a backpack-extended one (no LSTM, attention or
custom blocks), so neither fits.

Per update (``t`` updates taken before it):

1. fresh factors on the batch: ``A = E[a a^T]`` over layer inputs ``a`` (with a trailing 1 for the
   bias; for Conv2d, ``a`` are the unfolded patches, averaged over positions) and
   ``G = E[g g^T]`` over per-example gradients ``g`` of the loss w.r.t. the layer output, with labels
   sampled from the model's predictive distribution (``fisher_type="mc"``, the Fisher of K-FAC) or
   the true labels (``"empirical"``);
2. running averages ``A <- factor_decay A + (1 - factor_decay) A_new`` (same for ``G``; the first
   update takes ``A_new``);
3. every ``inverse_update_period`` updates (at t = 0, P, 2P, ...), the damped inverses
   ``(A + sqrt(damping) I)^-1`` and ``(G + sqrt(damping) I)^-1`` (factored Tikhonov damping with
   the two factors damped equally), by Cholesky;
4. the gradient of each layer, as the matrix ``[W  b]`` (out x in+1), becomes
   ``(G + sqrt(damping) I)^-1 [W  b] (A + sqrt(damping) I)^-1``, which is
   ``((A + sqrt(damping) I) kron (G + sqrt(damping) I))^-1`` applied to the column-stacked gradient.

Parameters outside Linear/Conv2d layers (embeddings, norms, LSTM) keep their plain gradient. The
caller then takes an SGD/momentum step on the result.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from batchlab.errors import BatchlabError

FISHER_TYPES = ("mc", "empirical")


class _ClassesSecond(nn.Module):
    """Presents a model whose logits are (batch, ..., classes) as one giving (batch, classes, ...),
    the layout ``nn.CrossEntropyLoss`` (and so curvlinops) expects for sequence outputs."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).movedim(-1, 1)


class KfacPreconditioner:
    """Keeps the Kronecker-factor averages and their damped inverses; preconditions ``.grad`` in place."""

    def __init__(
        self,
        model: nn.Module,
        damping: float,
        factor_decay: float,
        inverse_update_period: int,
        fisher_type: str = "mc",
        seed: int = 0,
    ):
        if fisher_type not in FISHER_TYPES:
            raise BatchlabError(f"unknown K-FAC fisher type {fisher_type!r}; allowed: {', '.join(FISHER_TYPES)}")
        self.model = model
        self.damping = damping
        self.factor_decay = factor_decay
        self.inverse_update_period = inverse_update_period
        self.fisher_type = fisher_type
        self.seed = seed
        self.layers: dict[str, nn.Module] = {
            name: module
            for name, module in model.named_modules()
            if isinstance(module, (nn.Linear, nn.Conv2d))
            and module.weight.requires_grad
            and getattr(module, "groups", 1) == 1
        }
        if not self.layers:
            raise BatchlabError("kfac needs a model with at least one Linear or Conv2d layer (groups=1)")
        self._params = [
            p for m in self.layers.values() for p in (m.weight, m.bias) if p is not None and p.requires_grad
        ]
        self._loss = nn.CrossEntropyLoss()
        self.input_factors: dict[str, torch.Tensor] = {}  # A, running average
        self.gradient_factors: dict[str, torch.Tensor] = {}  # G, running average
        self._input_inverses: dict[str, torch.Tensor] = {}
        self._gradient_inverses: dict[str, torch.Tensor] = {}
        self.updates = 0

    def batch_factors(self, x: torch.Tensor, y: torch.Tensor, logits_shape: torch.Size) -> tuple[dict, dict]:
        """This batch's factors ``({layer: A}, {layer: G})`` from curvlinops (one extra forward and
        backward pass); ``logits_shape`` is the shape of ``model(x)``, classes last."""
        with warnings.catch_warnings():  # its import scripts a helper with the deprecated torch.jit.script
            warnings.filterwarnings("ignore", message=".*torch.jit.script.*", category=DeprecationWarning)
            from curvlinops import KFACLinearOperator

        sequence = len(logits_shape) > 2
        model_func = _ClassesSecond(self.model) if sequence else self.model
        prefix = "model." if sequence else ""
        loss_terms = math.prod(logits_shape[1:-1]) if sequence else 1
        operator = KFACLinearOperator(
            model_func,
            self._loss,
            self._params,
            [(x, y)],
            check_deterministic=False,
            seed=self.seed + self.updates,
            fisher_type=self.fisher_type,
            num_data=x.shape[0],
            num_per_example_loss_terms=loss_terms,
            separate_weight_and_bias=False,
        )
        operator.compute_kronecker_factors()
        state = operator.state_dict()
        inputs, gradients = state["input_covariances"], state["gradient_covariances"]
        key = {name: (prefix + name if name else prefix.rstrip(".")) for name in self.layers}
        return ({n: inputs[key[n]] for n in self.layers}, {n: gradients[key[n]] for n in self.layers})

    def update(self, x: torch.Tensor, y: torch.Tensor, logits_shape: torch.Size) -> None:
        """Fold this batch's factors into the running averages; refresh the inverses when due."""
        inputs, gradients = self.batch_factors(x, y, logits_shape)
        decay = self.factor_decay
        for name in self.layers:
            for averages, fresh in ((self.input_factors, inputs), (self.gradient_factors, gradients)):
                if name in averages:
                    averages[name].mul_(decay).add_(fresh[name], alpha=1.0 - decay)
                else:
                    averages[name] = fresh[name].clone()
        if self.updates % self.inverse_update_period == 0:
            shift = math.sqrt(self.damping)
            for name in self.layers:
                self._input_inverses[name] = _damped_inverse(self.input_factors[name], shift)
                self._gradient_inverses[name] = _damped_inverse(self.gradient_factors[name], shift)
        self.updates += 1

    @torch.no_grad()
    def precondition(self) -> None:
        """Replace each Linear/Conv2d layer's ``.grad`` by its K-FAC preconditioned gradient."""
        for name, module in self.layers.items():
            weight, bias = module.weight, module.bias
            if weight.grad is None:
                continue
            matrix = weight.grad.flatten(1)
            # curvlinops appends the constant input of the bias to A exactly when the bias is trained.
            bias_in_factor = bias is not None and bias.requires_grad
            if bias_in_factor:
                if bias.grad is None:
                    bias.grad = torch.zeros_like(bias)
                matrix = torch.cat([matrix, bias.grad.unsqueeze(1)], dim=1)
            result = self._gradient_inverses[name] @ matrix @ self._input_inverses[name]
            weight.grad.copy_(result[:, : weight.grad[0].numel()].view_as(weight.grad))
            if bias_in_factor:
                bias.grad.copy_(result[:, -1])


def _damped_inverse(factor: torch.Tensor, shift: float) -> torch.Tensor:
    """``(factor + shift I)^-1`` for a symmetric positive semi-definite ``factor``: by Cholesky
    (several times faster than an eigendecomposition), falling back to ``eigh`` with eigenvalues
    clamped at 0 when round-off makes the shifted factor numerically indefinite."""
    shifted = factor + shift * torch.eye(factor.shape[0], dtype=factor.dtype, device=factor.device)
    cholesky, info = torch.linalg.cholesky_ex(shifted)
    if int(info) == 0:
        return torch.cholesky_inverse(cholesky)
    eigenvalues, eigenvectors = torch.linalg.eigh(factor)
    scale = 1.0 / (eigenvalues.clamp(min=0.0) + shift)
    return (eigenvectors * scale) @ eigenvectors.T
