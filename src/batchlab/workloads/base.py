"""A workload: data + model + loss + metric + goal + default step budget + evaluation schedule.

Modelled on AlgoPerf's workload spec: a small declared object, kept apart from the training
algorithm (the optimizer is chosen separately; in the store a workload is ``dataset/model/optimizer``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from batchlab.data.splits import SplitArrays
from batchlab.errors import BatchlabError
from batchlab.workloads.metrics import check_split, cross_entropy_loss, evaluate_classifier
from batchlab.workloads.schedule import EvaluationSchedule

_ARRAYS: dict[Callable[[], SplitArrays], SplitArrays] = {}  # one decoded copy per data set per process


def _arrays_of(loader: Callable[[], SplitArrays]) -> SplitArrays:
    if loader not in _ARRAYS:
        _ARRAYS[loader] = loader()
    return _ARRAYS[loader]


@dataclass(frozen=True)
class WorkloadData:
    """Torch tensors of one workload's data (inputs float32 or int64 tokens, targets int64).

    The full-size tensors share memory with a per-process copy of the data set: do not modify them
    in place. ``num_train = len(train_x)``.
    """

    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int

    @property
    def num_train(self) -> int:
        return len(self.train_x)


@dataclass(frozen=True)
class Workload:
    """One registered workload (see :mod:`batchlab.workloads.registry` for the list).

    ``name`` is ``"<dataset>/<model>"``. One example's input has shape ``input_shape`` (float32, or
    int64 token ids in ``[0, num_classes)`` when ``token_inputs``); targets are class ids (one per
    example, or one per position of ``input_shape`` for language models).

    The goal is met when ``metric < goal`` (``metric > goal`` if ``maximize``) at an evaluation step.
    ``default_steps`` is the step budget a trial gets unless told otherwise; ``default_batch_size`` a
    batch size that works for demos. ``eval_examples`` caps the number of examples :meth:`evaluate`
    uses per split (``None`` = all), through a fixed subset; ``eval_batch_size`` is the evaluation
    batch; ``schedule`` sets :meth:`evaluation_steps` (goal metric at a bounded relative resolution,
    every metric more sparsely: :mod:`batchlab.workloads.schedule`).
    """

    name: str
    summary: str
    load_arrays: Callable[[], SplitArrays]
    make_model: Callable[[], nn.Module]
    metric: str
    goal: float
    default_steps: int
    default_batch_size: int
    split_sizes: dict[str, int]
    data_notes: str
    input_shape: tuple[int, ...]
    num_classes: int
    token_inputs: bool = False
    maximize: bool = False
    eval_examples: dict[str, int | None] = field(default_factory=lambda: {"train": 2000, "val": None, "test": None})
    eval_batch_size: int = 1000
    schedule: EvaluationSchedule = field(default_factory=EvaluationSchedule)

    @property
    def dataset(self) -> str:
        return self.name.split("/", 1)[0]

    @property
    def model(self) -> str:
        return self.name.split("/", 1)[1]

    def load_data(self, train_examples: int | None = None, seed: int = 0) -> WorkloadData:
        """Return the workload's data as torch tensors.

        ``train_examples=N`` keeps a random subset of N training examples (drawn with ``seed``, kept
        in their original order); validation and test sets are always whole. ``None`` keeps all.
        """
        arrays = _arrays_of(self.load_arrays)
        train_x, train_y = torch.from_numpy(arrays.train_x), torch.from_numpy(arrays.train_y)
        available = len(train_x)
        if train_examples is not None:
            if isinstance(train_examples, bool) or not isinstance(train_examples, int) or not 1 <= train_examples <= available:
                raise BatchlabError(f"train_examples must be an integer in [1, {available}] for {self.name}, got {train_examples!r}")
            if train_examples < available:
                generator = torch.Generator().manual_seed(int(seed))
                keep = torch.randperm(available, generator=generator)[:train_examples].sort().values
                train_x, train_y = train_x[keep], train_y[keep]
        return WorkloadData(
            train_x=train_x,
            train_y=train_y,
            val_x=torch.from_numpy(arrays.val_x),
            val_y=torch.from_numpy(arrays.val_y),
            test_x=torch.from_numpy(arrays.test_x),
            test_y=torch.from_numpy(arrays.test_y),
            num_classes=arrays.num_classes,
        )

    def build_model(self, seed: int = 0) -> nn.Module:
        """Return a freshly initialised model; the same seed gives identical weights.

        The global torch random state is left untouched.
        """
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            return self.make_model()

    def loss(self, logits: torch.Tensor, y: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
        """Return the mean cross entropy (nats, per token for language models), Shallue label smoothing."""
        return cross_entropy_loss(logits, y, label_smoothing)

    def evaluate(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, split: str = "val") -> dict[str, float]:
        """Return ``{"<split>/cross_entropy_error": ..., "<split>/classification_error": ...}``.

        Batched, without gradients, in eval mode, on at most ``eval_examples[split]`` examples of
        ``x`` (a fixed subset, the same at every call).
        """
        check_split(split)
        return evaluate_classifier(
            model, x, y, split=split, batch_size=self.eval_batch_size, max_examples=self.eval_examples.get(split)
        )

    @property
    def goal_split(self) -> str:
        """The split the goal metric is measured on (``"val"`` for ``val/classification_error``)."""
        return self.metric.split("/", 1)[0]

    def evaluation_schedule(self, **overrides: Any) -> EvaluationSchedule:
        """The workload's :class:`EvaluationSchedule` with ``overrides`` (``num_regular``, ``early_ratio``,
        ``resolution``; ``None`` values keep the workload's setting, except ``resolution=None`` which
        means no resolution steps)."""
        allowed = {"num_regular", "early_ratio", "resolution"}
        unknown = set(overrides) - allowed
        if unknown:
            raise BatchlabError(f"unknown evaluation schedule setting(s) {sorted(unknown)}; allowed: {', '.join(sorted(allowed))}")
        settings = self.schedule.describe()
        settings.update({k: v for k, v in overrides.items() if v is not None or k == "resolution"})
        return EvaluationSchedule(**settings)

    def evaluation_steps(self, total_steps: int, **overrides: Any) -> list[int]:
        """Every evaluation step for ``total_steps`` updates: the resolution steps (goal metric, relative
        spacing at most ``resolution``) and the full steps (every metric: dense early, regular later).

        ``overrides`` as in :meth:`evaluation_schedule` (see :mod:`batchlab.workloads.schedule`).
        """
        return self.evaluation_schedule(**overrides).steps(total_steps)

    def full_evaluation_steps(self, total_steps: int, **overrides: Any) -> list[int]:
        """The steps at which every metric is measured (a subset of :meth:`evaluation_steps`)."""
        return self.evaluation_schedule(**overrides).full_steps(total_steps)

    def example_batch(self, batch_size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Return random ``(x, y)`` of the workload's shapes and dtypes, without loading any data."""
        generator = torch.Generator().manual_seed(int(seed))
        if self.token_inputs:
            x = torch.randint(0, self.num_classes, (batch_size, *self.input_shape), generator=generator)
            y = torch.randint(0, self.num_classes, (batch_size, *self.input_shape), generator=generator)
        else:
            x = torch.rand((batch_size, *self.input_shape), generator=generator)
            y = torch.randint(0, self.num_classes, (batch_size,), generator=generator)
        return x, y

    def num_parameters(self) -> int:
        """Return the number of trainable parameters of the model."""
        with torch.device("meta"):  # shapes only: no memory, no initialisation cost
            model = self.make_model()
        return sum(p.numel() for p in model.parameters() if p.requires_grad)

    def describe(self) -> dict[str, Any]:
        """Return a JSON-ready description (no data is loaded)."""
        return {
            "name": self.name,
            "dataset": self.dataset,
            "model": self.model,
            "summary": self.summary,
            "metric": self.metric,
            "goal": self.goal,
            "maximize": self.maximize,
            "default_steps": self.default_steps,
            "default_batch_size": self.default_batch_size,
            "num_parameters": self.num_parameters(),
            "splits": dict(self.split_sizes),
            "input_shape": list(self.input_shape),
            "input_dtype": "int64" if self.token_inputs else "float32",
            "num_classes": self.num_classes,
            "data": self.data_notes,
            "eval_examples": dict(self.eval_examples),
            "evaluation_schedule": self.schedule.describe(),
        }
