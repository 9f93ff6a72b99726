"""A workload: data + model + loss + metric + goal + default step budget + evaluation schedule.

Modelled on AlgoPerf's workload spec: a small declared object, kept apart from the training
algorithm (the optimizer is chosen separately; in the store a workload is ``dataset/model/optimizer``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from batchlab.data.splits import SplitArrays
from batchlab.errors import BatchlabError
from batchlab.workloads.data import SPLITS, TensorSplit, WorkloadData, as_split, as_workload_data
from batchlab.workloads.metrics import check_split, evaluate_split
from batchlab.workloads.schedule import EvaluationSchedule
from batchlab.workloads.tasks import Task, classification

NAME_PATTERN = re.compile(r"^[^/:\s]+/[^/:\s]+$")

# One loaded copy of each data set per process, keyed by the identity of its loader (kept alive here,
# so an id is never reused): built-in and user workloads alike, and dataclasses.replace copies share it.
_DATA: dict[int, tuple[Any, WorkloadData]] = {}


def _load_cached(loader: Any, name: str) -> WorkloadData:
    key = id(loader)
    if key not in _DATA:
        if callable(loader):
            try:
                raw = loader()
            except BatchlabError:
                raise
            except Exception as exc:  # the user's data function: one line, the cause kept for the API
                raise BatchlabError(f"workload {name}: its data function raised {type(exc).__name__}: {_one_line(exc)}") from exc
        else:
            raw = loader
        _DATA[key] = (loader, as_workload_data(raw, f"the data of workload {name}"))
    return _DATA[key][1]


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or "(no message)"


class _CountedSizes(Mapping):
    """``split_sizes`` of a workload that did not declare them: counted from its data when first read
    (which loads the data once per process)."""

    def __init__(self, owner: "Workload") -> None:
        self.owner = owner
        self._sizes: dict[str, int] | None = None

    def _counted(self) -> dict[str, int]:
        if self._sizes is None:
            self._sizes = self.owner.load_data().sizes()
        return self._sizes

    def __getitem__(self, key: str) -> int:
        return self._counted()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._counted())

    def __len__(self) -> int:
        return len(self._counted())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _CountedSizes):
            return self.owner._loader() is other.owner._loader()
        return isinstance(other, Mapping) and dict(self) == dict(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "<counted from the data when first read>"


def _check_int(name: str, what: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BatchlabError(f"workload {name}: {what} must be an integer >= {minimum}, got {value!r}")
    return value


def _declared_search_spaces(name: str, spaces: Any) -> dict[str, dict[str, Any]]:
    """A workload's ``search_spaces`` checked (optimizer names, spaces, parameters each optimizer takes)
    and in the canonical batch_science form; one-line BatchlabError naming the workload and optimizer."""
    if not isinstance(spaces, Mapping):
        raise BatchlabError(f"workload {name}: search_spaces must map optimizer names to parameter_configs "
                            f"objects, got {type(spaces).__name__}")
    if not spaces:
        return {}
    from batchlab.optim import optimizer_defaults
    from batchlab.search import SearchSpace

    out = {}
    for optimizer, configs in spaces.items():
        where = f"workload {name}: search_spaces[{optimizer!r}]"
        if not isinstance(optimizer, str):
            raise BatchlabError(f"{where}: optimizer names must be strings")
        try:
            allowed = optimizer_defaults(optimizer)
            space = SearchSpace.from_batch_science(configs)
        except BatchlabError as exc:
            raise BatchlabError(f"{where}: {exc}") from None
        unknown = [p for p in space.names if p not in allowed]
        if unknown:
            raise BatchlabError(f"{where}: {optimizer} takes no hyperparameter {unknown[0]!r}; allowed: "
                                + ", ".join(allowed))
        out[optimizer] = space.to_batch_science()
    return out


@dataclass(frozen=True, kw_only=True)
class Workload:
    """A workload: model factory, data, task (loss and metrics), goal and default budget.

    Required: ``name`` (``"<dataset>/<model>"``: two non-empty parts, no ``:`` or spaces),
    ``make_model`` (no arguments; returns an ``nn.Module``; seeded by :meth:`build_model`), ``goal``
    (finite), and the data: ``data`` (a function of no arguments returning a :class:`WorkloadData`, a
    mapping ``{"train": ..., "val": ..., "test": ...}`` or a tuple ``(train, val[, test])``, each split
    an ``(x, y)`` pair of tensors, a map-style ``torch.utils.data.Dataset`` or a :class:`DataSplit`:
    :func:`batchlab.workloads.data.as_workload_data`), or, for the built-ins, ``load_arrays`` (returns
    a :class:`batchlab.data.splits.SplitArrays`). The data function runs once per process (cached).

    ``task`` (:mod:`batchlab.workloads.tasks`; default :func:`classification`) gives the loss and the
    metrics; ``metric`` is ``"<split>/<metric name>"`` (default ``"val/<the task's default metric>"``).
    The goal is met when ``metric < goal`` (``metric > goal`` if ``maximize``) at an evaluation step.
    ``default_steps`` is the step budget a trial gets unless told otherwise; ``default_batch_size`` a
    batch size that works for demos. ``eval_examples`` caps the number of examples :meth:`evaluate`
    uses per split (``None`` = all), through a fixed subset; ``eval_batch_size`` is the evaluation
    batch (``None``, the default: :func:`batchlab.workloads.metrics.default_eval_batch_size`, the
    largest batch up to 1000 whose activations fit in 48 MiB on the CPU; 1000 on other devices);
    ``schedule`` sets :meth:`evaluation_steps` (goal metric at a bounded relative resolution,
    every metric more sparsely: :mod:`batchlab.workloads.schedule`).

    Descriptive (optional for user workloads): ``summary``, ``data_notes``, ``split_sizes`` (counted
    from the data when not given), ``input_shape`` and ``num_classes`` (one example's input shape and
    the number of classes, or vocabulary size; read from the data by :meth:`describe` when not
    given), ``token_inputs`` (inputs are int64 token ids).

    ``search_spaces`` (optional) maps optimizer names to the search space this workload's studies of
    that optimizer search by default, each in the batch_science ``parameter_configs`` form
    (``{"sgd": {"learning_rate": {"type": "DOUBLE", "min_value": 0.01, "max_value": 1.0, "scale":
    "LOG_SCALE"}}}``); it replaces the optimizer's generic default and gives way to a sweep config's
    ``search_spaces`` and ``--search-space`` (:func:`batchlab.search.study_search_space`). It is checked
    when the workload is built (known optimizers, valid spaces, parameters the optimizer takes) and
    kept in the canonical form (scales with ``_SCALE``).

    ``reference`` is set by :func:`batchlab.workloads.resolve_workload` when the workload came from a
    reference (``package.module:function`` or ``/abs/path/file.py:function``); such a workload pickles
    as its reference, so worker processes re-import it. A modified copy
    (``dataclasses.replace``) keeps the field but is not what the reference gives: it pickles by value
    and :func:`batchlab.workloads.workload_key` names it by its name.
    """

    name: str
    make_model: Callable[[], nn.Module]
    goal: float
    data: Any = None
    load_arrays: Callable[[], SplitArrays] | None = None
    task: Task = field(default_factory=classification)
    metric: str | None = None
    maximize: bool = False
    default_steps: int = 1000
    default_batch_size: int = 64
    summary: str = ""
    data_notes: str = ""
    split_sizes: Mapping[str, int] | None = None
    input_shape: tuple[int, ...] | None = None
    num_classes: int | None = None
    token_inputs: bool = False
    eval_examples: dict[str, int | None] = field(default_factory=lambda: {"train": 2000, "val": None, "test": None})
    eval_batch_size: int | None = None
    schedule: EvaluationSchedule = field(default_factory=EvaluationSchedule)
    search_spaces: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    reference: str | None = None

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise BatchlabError(f"workload name must be 'dataset/model' (two non-empty parts, no ':' or spaces), got {name!r}")
        if not callable(self.make_model):
            raise BatchlabError(f"workload {name}: make_model must be a function returning a torch module, got {type(self.make_model).__name__}")
        if (self.data is None) == (self.load_arrays is None):
            raise BatchlabError(f"workload {name}: give its data as data=<function returning the splits> (exactly one of data, load_arrays)")
        if not isinstance(self.task, Task):
            raise BatchlabError(f"workload {name}: task must be a batchlab.workloads.Task (classification(), regression(), language_model(), custom_task(...)), got {type(self.task).__name__}")
        metric = self.metric
        if metric is None:
            if self.task.default_metric is None:
                raise BatchlabError(f"workload {name}: give metric='val/<name>' (task {self.task.name!r} declares no default metric)")
            metric = f"val/{self.task.default_metric}"
            object.__setattr__(self, "metric", metric)
        parts = metric.split("/", 1) if isinstance(metric, str) else []
        if len(parts) != 2 or parts[0] not in SPLITS or not parts[1]:
            raise BatchlabError(f"workload {name}: metric must be '<split>/<name>' with split one of {', '.join(SPLITS)}, got {metric!r}")
        if self.task.metric_names and parts[1] not in self.task.metric_names:
            raise BatchlabError(f"workload {name}: metric {metric!r} is not one of task {self.task.name!r}'s metrics; allowed: "
                                + ", ".join(f"{parts[0]}/{m}" for m in self.task.metric_names))
        goal = self.goal
        if isinstance(goal, bool) or not isinstance(goal, (int, float)) or not math.isfinite(goal):
            raise BatchlabError(f"workload {name}: goal must be a finite number, got {goal!r}")
        object.__setattr__(self, "goal", float(goal))
        if not isinstance(self.maximize, bool):
            raise BatchlabError(f"workload {name}: maximize must be True or False, got {self.maximize!r}")
        _check_int(name, "default_steps", self.default_steps, 1)
        _check_int(name, "default_batch_size", self.default_batch_size, 1)
        if self.eval_batch_size is not None:
            _check_int(name, "eval_batch_size", self.eval_batch_size, 1)
        if not isinstance(self.eval_examples, Mapping) or not set(self.eval_examples) <= set(SPLITS):
            raise BatchlabError(f"workload {name}: eval_examples must map splits ({', '.join(SPLITS)}) to a number of "
                                f"examples or None (all), got {self.eval_examples!r}")
        for split, cap in self.eval_examples.items():
            if cap is not None:
                _check_int(name, f"eval_examples[{split!r}]", cap, 1)
        if not isinstance(self.schedule, EvaluationSchedule):
            raise BatchlabError(f"workload {name}: schedule must be a batchlab.workloads.schedule.EvaluationSchedule, got {type(self.schedule).__name__}")
        if self.input_shape is not None:
            object.__setattr__(self, "input_shape", tuple(self.input_shape))
        if self.split_sizes is None or (isinstance(self.split_sizes, _CountedSizes) and self.split_sizes.owner is not self):
            object.__setattr__(self, "split_sizes", _CountedSizes(self))
        object.__setattr__(self, "search_spaces", _declared_search_spaces(name, self.search_spaces))
        if self.reference is not None and not isinstance(self.reference, str):
            raise BatchlabError(f"workload {name}: reference must be a string or None, got {type(self.reference).__name__}")

    def __reduce_ex__(self, protocol: int):
        """A workload that came from a reference pickles as that reference (workers re-import it), a
        built-in (the declared object) as its name; any other workload, a modified copy of a built-in
        included, by value."""
        from batchlab.workloads import references, registry

        if self.reference is not None and references.cached(self.reference) is self:
            return (references.resolve_workload, (self.reference,))
        if registry.builtin_workload(self.name) is self:
            return (registry.builtin_workload, (self.name,))
        return super().__reduce_ex__(protocol)

    @property
    def dataset(self) -> str:
        return self.name.split("/", 1)[0]

    @property
    def model(self) -> str:
        return self.name.split("/", 1)[1]

    def _loader(self) -> Any:
        return self.load_arrays if self.load_arrays is not None else self.data

    def load_data(self, train_examples: int | None = None, seed: int = 0) -> WorkloadData:
        """Return the workload's data (:class:`WorkloadData`: tensor or dataset splits).

        ``train_examples=N`` keeps a random subset of N training examples (drawn with ``seed``, kept
        in their original order); validation and test sets are always whole. ``None`` keeps all.
        The full data are loaded once per process (shared: do not modify tensors in place).
        """
        data = _load_cached(self._loader(), self.name)
        available = data.num_train
        if train_examples is not None:
            if isinstance(train_examples, bool) or not isinstance(train_examples, int) or not 1 <= train_examples <= available:
                raise BatchlabError(f"train_examples must be an integer in [1, {available}] for {self.name}, got {train_examples!r}")
            if train_examples < available:
                generator = torch.Generator().manual_seed(int(seed))
                keep = torch.randperm(available, generator=generator)[:train_examples].sort().values
                data = data.with_train(data.train.subset(keep))
        return data

    def build_model(self, seed: int = 0) -> nn.Module:
        """Return a freshly initialised model; the same seed gives identical weights.

        The global torch random state is left untouched.
        """
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            model = self.make_model()
        if not isinstance(model, nn.Module):
            raise BatchlabError(f"workload {self.name}: make_model returned {type(model).__name__}, not a torch.nn.Module")
        return model

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
        """The batch's mean training loss (the task's; for classification the cross entropy in nats,
        per token for language models, with Shallue label smoothing). ``label_smoothing`` other than 0
        is an error for tasks without it (regression)."""
        return self.task.compute_loss(outputs, targets, label_smoothing)

    def evaluate(self, model: nn.Module, data: Any, y: Any = None, split: str = "val") -> dict[str, float]:
        """Return ``{"<split>/<metric>": value}`` for each of the task's metrics (classification:
        ``cross_entropy_error`` and ``classification_error``).

        ``data`` is a :class:`DataSplit`, an ``(x, y)`` pair, a map-style Dataset, or inputs ``x``
        with their targets ``y``. Batched (``eval_batch_size``, or the default rule when it is
        ``None``), under ``torch.inference_mode``, in eval mode (the model's mode is restored), on
        the model's device, on at most ``eval_examples[split]`` examples (a fixed subset, the same at
        every call): :func:`batchlab.workloads.metrics.evaluate_split`.
        """
        if isinstance(y, str):  # evaluate(model, data, "train")
            split, y = y, None
        check_split(split)
        if y is not None:
            data = TensorSplit(data, y)
        elif isinstance(data, torch.Tensor):
            raise BatchlabError("evaluate needs the targets: pass a DataSplit, an (x, y) pair, or x and y")
        split_data = as_split(data, split)
        return evaluate_split(model, split_data, self.task.batch_sums, split=split, batch_size=self.eval_batch_size,
                              max_examples=self.eval_examples.get(split))

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
        """Return ``(x, y)`` of the workload's shapes and dtypes: random values without loading any
        data for a classifier with a declared ``input_shape`` and ``num_classes``, else ``batch_size``
        random training examples (loads the data)."""
        generator = torch.Generator().manual_seed(int(seed))
        if self.task.classes and self.input_shape is not None and self.num_classes is not None:
            if self.token_inputs:
                x = torch.randint(0, self.num_classes, (batch_size, *self.input_shape), generator=generator)
                y = torch.randint(0, self.num_classes, (batch_size, *self.input_shape), generator=generator)
            else:
                x = torch.rand((batch_size, *self.input_shape), generator=generator)
                y = torch.randint(0, self.num_classes, (batch_size,), generator=generator)
            return x, y
        train = self.load_data().train
        return train.batch(torch.randint(0, len(train), (batch_size,), generator=generator))

    def num_parameters(self) -> int:
        """Return the number of trainable parameters of the model."""
        try:
            with torch.device("meta"):  # shapes only: no memory, no initialisation cost
                model = self.make_model()
        except Exception:  # a model factory that cannot run on the meta device: build it for real
            model = self.build_model(0)
        return sum(p.numel() for p in model.parameters() if p.requires_grad)

    def describe(self) -> dict[str, Any]:
        """Return a JSON-ready description (built-ins load no data; a user workload that does not
        declare ``split_sizes``/``input_shape`` has them read from its data)."""
        input_shape, input_dtype, num_classes = self.input_shape, ("int64" if self.token_inputs else "float32"), self.num_classes
        if input_shape is None:
            data = self.load_data()
            x, _ = data.train.batch(torch.zeros(1, dtype=torch.int64))
            input_shape, input_dtype = tuple(x.shape[1:]), str(x.dtype).removeprefix("torch.")
            num_classes = data.num_classes if num_classes is None else num_classes
        return {
            "name": self.name,
            "dataset": self.dataset,
            "model": self.model,
            "summary": self.summary,
            "task": self.task.name,
            "metric": self.metric,
            "goal": self.goal,
            "maximize": self.maximize,
            "default_steps": self.default_steps,
            "default_batch_size": self.default_batch_size,
            "num_parameters": self.num_parameters(),
            "splits": dict(self.split_sizes),
            "input_shape": list(input_shape),
            "input_dtype": input_dtype,
            "num_classes": num_classes,
            "data": self.data_notes,
            "eval_examples": dict(self.eval_examples),
            "evaluation_schedule": self.schedule.describe(),
            "search_spaces": dict(self.search_spaces),
            "reference": self.reference,
        }
