"""What a workload's model is trained for: its training loss and its evaluation metrics.

A :class:`Task` is two functions, chosen without subclassing anything:

* ``loss(outputs, targets) -> scalar tensor``: the mean training loss of one batch (differentiable).
  Tasks that support label smoothing take a third argument ``label_smoothing``.
* ``metrics(outputs, targets) -> {name: (sum, count)}``: the *sums* of each metric over one batch
  and how many terms each sum has. Evaluation streams a split batch by batch and reports
  ``total sum / total count`` per metric, so a metric is an exact mean over the whole split
  (examples, tokens or elements) whatever the evaluation batch size, for tensors and datasets alike.
  A plain number (or 0-d tensor) instead of a pair is taken as the batch *mean* over ``len(targets)``
  examples.

Built in:

* :func:`classification` (the default): cross entropy with Shallue label smoothing;
  ``cross_entropy_error`` (nats) and ``classification_error`` (fraction; bounded, see below). Outputs ``(N, K)`` logits
  and ``(N,)`` class ids; ``(N, L, K)`` and ``(N, L)`` are treated per position.
* :func:`language_model`: the same per token (outputs ``(N, L, K)``, targets ``(N, L)``).
* :func:`regression`: mean squared error loss; metrics ``mse`` and ``mae`` (means over every output
  element). Outputs of shape ``(N, 1)`` against targets ``(N,)`` are matched (same number of elements).
* :func:`custom_task` / ``Task(...)``: your own loss and metrics.

*Bounded* metrics (``Task.bounded_metrics``) are means of terms in ``{0, 1}`` whose batch sum is the
number of terms with some property (a whole number between 0 and the batch's count, which is its
number of target elements): after part of a split, the mean over the whole split is known to lie
between two bounds, so a goal check on it can stop as soon as its outcome is decided
(:func:`batchlab.workloads.metrics.check_goal_split`). Built in: ``classification_error`` of
:func:`classification` and :func:`language_model`. A task that declares none (regression, custom
tasks unless they say so) is always evaluated in full.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from batchlab.errors import BatchlabError
from batchlab.workloads.metrics import classification_sums, cross_entropy_loss

__all__ = ["Task", "classification", "language_model", "regression", "custom_task", "CLASSIFICATION_METRICS", "REGRESSION_METRICS"]

CLASSIFICATION_METRICS = ("cross_entropy_error", "classification_error")
REGRESSION_METRICS = ("mse", "mae")


@dataclass(frozen=True)
class Task:
    """A training loss and streaming evaluation metrics (see the module docstring).

    ``name`` labels the task in ``describe()``; ``metric_names`` are the names ``metrics`` returns
    (empty: not declared, then not checked); ``default_metric`` the metric a workload's goal is on
    when it names none; ``label_smoothing`` whether ``loss`` takes a third argument
    ``label_smoothing`` (a non-zero smoothing on a task without it is an error); ``classes`` whether
    the outputs are class scores (the task has a number of classes); ``bounded_metrics`` the metrics
    that are counts of terms in ``{0, 1}`` (see the module docstring; declare only metrics for which
    that always holds, since goal checks rely on it).
    """

    name: str
    loss: Callable[..., torch.Tensor]
    metrics: Callable[[torch.Tensor, torch.Tensor], Mapping]
    metric_names: tuple[str, ...] = ()
    default_metric: str | None = None
    label_smoothing: bool = False
    classes: bool = False
    bounded_metrics: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise BatchlabError(f"a task needs a non-empty name, got {self.name!r}")
        for what in ("loss", "metrics"):
            if not callable(getattr(self, what)):
                raise BatchlabError(f"task {self.name!r}: {what} must be a function, got {type(getattr(self, what)).__name__}")
        object.__setattr__(self, "metric_names", tuple(self.metric_names))
        object.__setattr__(self, "bounded_metrics", tuple(self.bounded_metrics))
        if self.metric_names and not set(self.bounded_metrics) <= set(self.metric_names):
            raise BatchlabError(f"task {self.name!r}: bounded_metrics {list(self.bounded_metrics)} must be among its metrics; "
                                f"allowed: {', '.join(self.metric_names)}")
        if self.default_metric is None and self.metric_names:
            object.__setattr__(self, "default_metric", self.metric_names[0])

    def compute_loss(self, outputs: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
        """The batch's training loss; ``label_smoothing`` only for tasks that support it."""
        if self.label_smoothing:
            return self.loss(outputs, targets, label_smoothing)
        if label_smoothing:
            raise BatchlabError(f"label_smoothing applies to classification tasks only; this workload's task is {self.name!r} (got label_smoothing={label_smoothing!r})")
        return self.loss(outputs, targets)

    def batch_sums(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, tuple]:
        """``{name: (sum, count)}`` of one batch (plain values read as means over ``len(targets)``)."""
        raw = self.metrics(outputs, targets)
        if not isinstance(raw, Mapping) or not raw:
            raise BatchlabError(f"task {self.name!r}: metrics must return a non-empty dict {{name: (sum, count)}}, got {type(raw).__name__}")
        sums = {}
        for name, value in raw.items():
            if isinstance(value, (tuple, list)) and len(value) == 2:
                total, count = value
                if isinstance(count, torch.Tensor):
                    count = count.item()
                sums[str(name)] = (total, count)
            elif isinstance(value, (int, float, torch.Tensor)) and (not isinstance(value, torch.Tensor) or value.numel() == 1):
                n = len(targets)
                sums[str(name)] = (float(value) * n, n)
            else:
                raise BatchlabError(f"task {self.name!r}: metric {name!r} must be a (sum, count) pair or a number, got {type(value).__name__}")
        return sums

    def describe(self) -> dict:
        return {"name": self.name, "metrics": list(self.metric_names), "label_smoothing": self.label_smoothing}


def classification() -> Task:
    """Cross entropy (Shallue label smoothing) with ``cross_entropy_error`` and ``classification_error``."""
    return Task("classification", cross_entropy_loss, classification_sums, CLASSIFICATION_METRICS,
                "classification_error", label_smoothing=True, classes=True, bounded_metrics=("classification_error",))


def language_model() -> Task:
    """Next-token prediction: per-token cross entropy (nats) and per-token error, outputs ``(N, L, V)``."""
    return Task("language_model", cross_entropy_loss, classification_sums, CLASSIFICATION_METRICS,
                "cross_entropy_error", label_smoothing=True, classes=True, bounded_metrics=("classification_error",))


def _matched(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if outputs.shape == targets.shape:
        return outputs
    if outputs.numel() == targets.numel() and len(outputs) == len(targets):
        return outputs.reshape(targets.shape)  # (N, 1) outputs against (N,) targets
    raise BatchlabError(f"regression outputs of shape {tuple(outputs.shape)} do not match targets of shape {tuple(targets.shape)}")


def mse_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean squared error over every element."""
    # Written out rather than F.mse_loss: forward-over-reverse differentiation (the probes' Hessian-vector
    # products) through F.mse_loss fails in torch 2.13 ("ZeroTensors are immutable"); on the CPU the two
    # give the same loss and gradient to the bit (checked at batch sizes 1 to 4096).
    outputs = _matched(outputs, targets)
    return (outputs - targets.to(outputs.dtype)).square().mean()


def regression_sums(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, tuple]:
    """``mse`` and ``mae`` sums over every element (float64) and the element count."""
    error = _matched(outputs, targets).double() - targets.double()
    return {"mse": (error.square().sum().cpu(), error.numel()), "mae": (error.abs().sum().cpu(), error.numel())}


def regression() -> Task:
    """Mean squared error loss; metrics ``mse`` (the goal's default) and ``mae``."""
    return Task("regression", mse_loss, regression_sums, REGRESSION_METRICS, "mse")


def custom_task(loss: Callable, metrics: Callable, name: str = "custom", metric_names=(), default_metric: str | None = None) -> Task:
    """A task from your own ``loss(outputs, targets)`` and ``metrics(outputs, targets) -> {name: (sum, count)}``."""
    return Task(name, loss, metrics, tuple(metric_names), default_metric)

