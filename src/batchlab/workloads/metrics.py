"""The classification loss and metrics, and the streaming evaluation every workload uses.

Conventions:

- Logits are ``(N, K)`` for classifiers and ``(N, L, K)`` for language models (K = vocabulary size);
  targets are ``(N,)`` or ``(N, L)`` int64. Language-model losses and metrics are per token.
- Cross entropy is in nats (per example, or per token for language models).
- **Label smoothing follows Shallue et al.** (docs/methods.md, "Optimizers, schedules and search spaces"): a smoothing ``ls`` removes mass ``ls``
  from the true class and gives ``ls / (K - 1)`` to each other class. This equals the common
  ``(1 - eps) * onehot + eps / K`` used by :func:`torch.nn.functional.cross_entropy` with
  ``eps = ls * K / (K - 1)``, which is how it is computed here.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from batchlab.errors import BatchlabError
from batchlab.workloads.data import SPLITS


def torch_label_smoothing(label_smoothing: float, num_classes: int) -> float:
    """Return torch's ``eps`` for a Shallue-convention smoothing ``label_smoothing`` over ``num_classes``.

    Allowed: ``0 <= label_smoothing <= (K - 1) / K`` (the upper end gives the uniform distribution).
    """
    limit = (num_classes - 1) / num_classes
    ls = float(label_smoothing)
    if not 0.0 <= ls <= limit:
        raise BatchlabError(f"label_smoothing must be in [0, {limit:.4g}] for {num_classes} classes, got {label_smoothing!r}")
    return min(1.0, ls * num_classes / (num_classes - 1))


def flatten_logits(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(logits (M, K), targets (M,))`` with every position of a sequence as one row."""
    return logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)


def cross_entropy_loss(logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Return the mean cross entropy (nats; per token for sequences) with Shallue label smoothing."""
    flat_logits, flat_targets = flatten_logits(logits, targets)
    eps = torch_label_smoothing(label_smoothing, flat_logits.shape[-1])
    return F.cross_entropy(flat_logits, flat_targets, label_smoothing=eps)


def check_split(split: str) -> str:
    """Return ``split`` if it is one of train/val/test, else raise BatchlabError."""
    if split not in SPLITS:
        raise BatchlabError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
    return split


def fixed_subset(num_examples: int, max_examples: int | None) -> torch.Tensor | None:
    """Return the sorted indices of a fixed evaluation subset, or None to use every example.

    The subset is the first ``max_examples`` entries of a permutation drawn with seed 0, so the same
    examples are evaluated at every step of every trial.
    """
    if max_examples is None or num_examples <= max_examples:
        return None
    generator = torch.Generator().manual_seed(0)
    return torch.randperm(num_examples, generator=generator)[:max_examples].sort().values


@torch.no_grad()
def evaluate_classifier(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    split: str = "val",
    batch_size: int = 1000,
    max_examples: int | None = None,
) -> dict[str, float]:
    """Return ``{"<split>/cross_entropy_error": nats, "<split>/classification_error": fraction}``.

    Both are means over examples (over tokens for sequence targets), without label smoothing, with
    the model in eval mode (its mode is restored afterwards), in batches of ``batch_size``, on at most
    ``max_examples`` examples (a :func:`fixed_subset`).
    """
    check_split(split)
    if len(x) != len(y) or len(x) == 0:
        raise BatchlabError(f"evaluation needs as many inputs as targets and at least one, got {len(x)} and {len(y)}")
    subset = fixed_subset(len(x), max_examples)
    if subset is not None:
        x, y = x[subset], y[subset]
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total_loss = torch.zeros((), dtype=torch.float64)
    total_errors = 0
    total_count = 0
    try:
        for start in range(0, len(x), batch_size):
            xb = x[start : start + batch_size].to(device)
            yb = y[start : start + batch_size].to(device)
            logits, targets = flatten_logits(model(xb), yb)
            total_loss += F.cross_entropy(logits.float(), targets, reduction="sum").double().cpu()
            total_errors += int((logits.argmax(dim=-1) != targets).sum())
            total_count += targets.numel()
    finally:
        model.train(was_training)
    return {
        f"{split}/cross_entropy_error": float(total_loss) / total_count,
        f"{split}/classification_error": total_errors / total_count,
    }


def classification_sums(logits: torch.Tensor, targets: torch.Tensor) -> dict[str, tuple]:
    """One batch's ``cross_entropy_error`` (float64 sum of nats, no smoothing) and
    ``classification_error`` (number of wrong argmax predictions), each with the number of targets
    (tokens for sequences): the arithmetic of :func:`evaluate_classifier`."""
    flat_logits, flat_targets = flatten_logits(logits, targets)
    count = flat_targets.numel()
    return {
        "cross_entropy_error": (F.cross_entropy(flat_logits.float(), flat_targets, reduction="sum").double().cpu(), count),
        "classification_error": (int((flat_logits.argmax(dim=-1) != flat_targets).sum()), count),
    }


def _model_device(model: torch.nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return torch.device("cpu")


@torch.no_grad()
def evaluate_split(model: torch.nn.Module, data, sums, split: str = "val", batch_size: int = 1000,
                   max_examples: int | None = None) -> dict[str, float]:
    """Return ``{"<split>/<metric>": total / count}`` over the batches of ``data`` (a
    :class:`batchlab.workloads.data.DataSplit`), where ``sums(outputs, targets)`` gives each batch's
    ``{metric: (sum, count)}`` (:meth:`batchlab.workloads.tasks.Task.batch_sums`).

    In eval mode (restored afterwards), without gradients, on the model's device, in consecutive
    batches of ``batch_size``, on at most ``max_examples`` examples (a :func:`fixed_subset`). For a
    classification task this is :func:`evaluate_classifier`, operation for operation.
    """
    check_split(split)
    if len(data) == 0:
        raise BatchlabError(f"evaluation needs at least one example; the {split} split is empty")
    subset = fixed_subset(len(data), max_examples)
    if subset is not None:
        data = data.subset(subset)
    was_training = model.training
    model.eval()
    device = _model_device(model)
    totals: dict[str, object] = {}
    counts: dict[str, object] = {}
    try:
        for xb, yb in data.batches(batch_size):
            xb, yb = xb.to(device), yb.to(device)
            for name, (total, count) in sums(model(xb), yb).items():
                totals[name] = totals.get(name, 0) + total
                counts[name] = counts.get(name, 0) + count
    finally:
        model.train(was_training)
    return {f"{split}/{name}": float(totals[name]) / counts[name] if counts[name] else math.nan for name in totals}
