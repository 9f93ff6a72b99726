"""A workload's data: splits that turn example indices into batches.

Training draws example *indices* (:func:`batchlab.train.sampling.batch_indices`, a pure function of
``(num_train, batch_size, seed, step)``) and asks the training split for those examples; evaluation
walks a split in consecutive batches. Anything that can do both is a :class:`DataSplit`, so the same
seeded sampling gives the same batches whether the data are in-memory tensors or a map-style
``torch.utils.data.Dataset``:

* :class:`TensorSplit` ``(x, y)``: ``batch(idx)`` is ``(x.index_select(0, idx), y.index_select(0, idx))``.
* :class:`DatasetSplit` ``(dataset, collate_fn)``: ``batch(idx)`` is ``collate_fn([dataset[i] for i in
  idx])``; each item is an ``(input, target)`` pair. Use it for data that do not fit in memory (the
  dataset reads examples when asked).

:class:`WorkloadData` holds a workload's ``train``, ``val`` and (optional) ``test`` splits.
:func:`as_workload_data` turns what a user's data function returns into one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from batchlab.errors import BatchlabError

__all__ = ["DataSplit", "TensorSplit", "DatasetSplit", "WorkloadData", "as_split", "as_workload_data", "SPLITS"]

SPLITS = ("train", "val", "test")


def _as_indices(indices: Any) -> torch.Tensor:
    if isinstance(indices, torch.Tensor):
        return indices.to(torch.int64)
    return torch.as_tensor(np.asarray(indices, dtype=np.int64))


class DataSplit(ABC):
    """One split of a workload's data: ``len(split)`` examples, each an ``(input, target)`` pair.

    Contract: :meth:`batch` returns CPU tensors ``(inputs, targets)`` whose first dimension runs over
    ``indices`` in their order; :meth:`batches` yields consecutive batches in order (evaluation);
    :meth:`subset` is the split restricted to ``indices`` (in their order). Implementations must be
    deterministic: the same indices give the same tensors.
    """

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The examples at ``indices`` (a LongTensor) as ``(inputs, targets)``."""

    def subset(self, indices: torch.Tensor) -> "DataSplit":
        """This split restricted to ``indices`` (kept in their order)."""
        return _IndexedSplit(self, _as_indices(indices))

    def batches(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Consecutive batches of at most ``batch_size`` examples, in order (the last may be smaller)."""
        n = len(self)
        for start in range(0, n, batch_size):
            yield self.batch(torch.arange(start, min(n, start + batch_size)))


class _IndexedSplit(DataSplit):
    """A view of another split through an index array (the generic :meth:`DataSplit.subset`)."""

    def __init__(self, base: DataSplit, indices: torch.Tensor) -> None:
        self.base, self.indices = base, indices

    def __len__(self) -> int:
        return len(self.indices)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.base.batch(self.indices.index_select(0, _as_indices(indices)))


class TensorSplit(DataSplit):
    """In-memory tensors ``x`` (inputs) and ``y`` (targets), row ``i`` of each belonging together.

    ``batch(idx)`` is exactly ``(x.index_select(0, idx), y.index_select(0, idx))``; ``batches`` are
    slices ``x[start:start + batch_size]``. The tensors may share memory with a per-process cache of
    the data set: do not modify them in place.
    """

    def __init__(self, x: Any, y: Any) -> None:
        x, y = _as_tensor(x, "inputs"), _as_tensor(y, "targets")
        if x.ndim == 0 or y.ndim == 0 or len(x) != len(y):
            raise BatchlabError(f"a tensor split needs as many inputs as targets (first dimension), got shapes {tuple(x.shape)} and {tuple(y.shape)}")
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x.index_select(0, indices), self.y.index_select(0, indices)

    def subset(self, indices: torch.Tensor) -> "TensorSplit":
        indices = _as_indices(indices)
        return TensorSplit(self.x[indices], self.y[indices])

    def batches(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for start in range(0, len(self.x), batch_size):
            yield self.x[start : start + batch_size], self.y[start : start + batch_size]

    def __repr__(self) -> str:
        return f"TensorSplit(x={tuple(self.x.shape)} {self.x.dtype}, y={tuple(self.y.shape)} {self.y.dtype})"


def _default_collate(items):
    return torch.utils.data.default_collate(items)


class DatasetSplit(DataSplit):
    """A map-style ``torch.utils.data.Dataset`` (``__len__`` and ``__getitem__``) whose items are
    ``(input, target)`` pairs; ``batch(idx)`` is ``collate_fn([dataset[i] for i in idx])`` (default:
    ``torch.utils.data.default_collate``, which stacks tensors and turns numbers into tensors).

    The sampler draws the indices exactly as for tensors, so a dataset holding the same examples as a
    :class:`TensorSplit` gives the same batches. Examples are read one by one in the training
    process; keep ``__getitem__`` cheap (or cache in the dataset).
    """

    def __init__(self, dataset: Any, collate_fn: Callable | None = None) -> None:
        if isinstance(dataset, torch.utils.data.IterableDataset) or not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise BatchlabError(f"a dataset split needs a map-style dataset (with __len__ and __getitem__), got {type(dataset).__name__}")
        self.dataset = dataset
        self.collate_fn = _default_collate if collate_fn is None else collate_fn

    def __len__(self) -> int:
        return len(self.dataset)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.collate_fn([self.dataset[i] for i in _as_indices(indices).tolist()])
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            got = f"{type(batch).__name__} of {len(batch)}" if isinstance(batch, (tuple, list, Mapping)) else type(batch).__name__
            raise BatchlabError(f"dataset items must be (input, target) pairs; collating {type(self.dataset).__name__} items gave "
                                f"{got} (give DatasetSplit(dataset, collate_fn=...) returning (inputs, targets) tensors)")
        inputs, targets = batch
        if not isinstance(inputs, torch.Tensor) or not isinstance(targets, torch.Tensor):
            raise BatchlabError(f"collating {type(self.dataset).__name__} items gave (inputs, targets) of types "
                                f"({type(inputs).__name__}, {type(targets).__name__}), not tensors (give "
                                "DatasetSplit(dataset, collate_fn=...) returning (inputs, targets) tensors)")
        return inputs, targets

    def subset(self, indices: torch.Tensor) -> "DatasetSplit":
        return DatasetSplit(torch.utils.data.Subset(self.dataset, _as_indices(indices).tolist()), self.collate_fn)

    def __repr__(self) -> str:
        return f"DatasetSplit({type(self.dataset).__name__}, {len(self)} examples)"


def _as_tensor(value: Any, what: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    raise BatchlabError(f"{what} must be a torch tensor or numpy array, got {type(value).__name__}")


def as_split(value: Any, name: str = "split") -> DataSplit:
    """A :class:`DataSplit` from a DataSplit, an ``(x, y)`` pair of tensors/arrays, or a map-style Dataset."""
    if isinstance(value, DataSplit):
        return value
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, (torch.Tensor, np.ndarray)) for v in value):
        return TensorSplit(*value)
    if isinstance(value, torch.utils.data.Dataset) or (hasattr(value, "__len__") and hasattr(value, "__getitem__") and not isinstance(value, (tuple, list, str, Mapping))):
        return DatasetSplit(value)
    raise BatchlabError(f"the {name} split must be an (inputs, targets) pair of tensors, a torch Dataset or a DataSplit, got {type(value).__name__}")


@dataclass(frozen=True)
class WorkloadData:
    """A workload's splits: ``train`` and ``val`` (:class:`DataSplit`), ``test`` (or ``None``).

    ``num_classes`` is the number of classes (vocabulary size) where it applies, else ``None``.
    ``train_x``, ``train_y``, ``val_x``, ... are the tensors of a :class:`TensorSplit` (an error for a
    dataset split).
    """

    train: DataSplit
    val: DataSplit
    test: DataSplit | None = None
    num_classes: int | None = None

    def __post_init__(self) -> None:
        for name in SPLITS:
            value = getattr(self, name)
            if value is None and name == "test":
                continue
            object.__setattr__(self, name, as_split(value, name))
            if len(getattr(self, name)) == 0 and name != "test":
                raise BatchlabError(f"the {name} split is empty; it needs at least 1 example")

    @classmethod
    def from_tensors(cls, train_x, train_y, val_x, val_y, test_x=None, test_y=None, num_classes: int | None = None) -> "WorkloadData":
        """Build from tensors (or numpy arrays); the test split is optional."""
        test = None if test_x is None else TensorSplit(test_x, test_y)
        return cls(TensorSplit(train_x, train_y), TensorSplit(val_x, val_y), test, num_classes)

    @property
    def num_train(self) -> int:
        return len(self.train)

    def split(self, name: str) -> DataSplit:
        """The split called ``name`` (train/val/test)."""
        from batchlab.workloads.metrics import check_split

        value = getattr(self, check_split(name))
        if value is None:
            raise BatchlabError(f"this workload has no {name} split")
        return value

    def sizes(self) -> dict[str, int]:
        """Examples per split (``test`` only when present)."""
        return {name: len(getattr(self, name)) for name in SPLITS if getattr(self, name) is not None}

    def with_train(self, train: DataSplit) -> "WorkloadData":
        """The same data with another training split."""
        return WorkloadData(train, self.val, self.test, self.num_classes)

    def _tensor(self, name: str, part: str) -> torch.Tensor:
        split = self.split(name)
        if not isinstance(split, TensorSplit):
            raise BatchlabError(f"{name}_{part} exists only for tensor data; the {name} split is a {type(split).__name__}: use data.{name}.batch(indices)")
        return getattr(split, part)

    train_x = property(lambda self: self._tensor("train", "x"))
    train_y = property(lambda self: self._tensor("train", "y"))
    val_x = property(lambda self: self._tensor("val", "x"))
    val_y = property(lambda self: self._tensor("val", "y"))
    test_x = property(lambda self: self._tensor("test", "x"))
    test_y = property(lambda self: self._tensor("test", "y"))


def as_workload_data(value: Any, source: str = "the data function") -> WorkloadData:
    """A :class:`WorkloadData` from what a workload's data function returned.

    Accepted: a :class:`WorkloadData`; a :class:`batchlab.data.splits.SplitArrays`; a mapping with keys
    ``train``, ``val`` and optionally ``test`` (and ``num_classes``); a tuple ``(train, val)`` or
    ``(train, val, test)``. Each split is an ``(x, y)`` pair of tensors or numpy arrays, a map-style
    ``torch.utils.data.Dataset`` of ``(input, target)`` items, or a :class:`DataSplit`.
    """
    from batchlab.data.splits import SplitArrays

    if isinstance(value, WorkloadData):
        return value
    if isinstance(value, SplitArrays):
        return WorkloadData.from_tensors(value.train_x, value.train_y, value.val_x, value.val_y,
                                         value.test_x, value.test_y, num_classes=value.num_classes)
    if isinstance(value, Mapping):
        unknown = set(value) - {*SPLITS, "num_classes"}
        if unknown or "train" not in value or "val" not in value:
            raise BatchlabError(f"{source} returned a mapping with keys {sorted(map(str, value))}; expected train, val and optionally test, num_classes")
        return WorkloadData(value["train"], value["val"], value.get("test"), value.get("num_classes"))
    if isinstance(value, tuple) and len(value) in (2, 3) and not all(isinstance(v, (torch.Tensor, np.ndarray)) for v in value):
        return WorkloadData(*value)
    raise BatchlabError(f"{source} returned {type(value).__name__}; expected WorkloadData, a mapping {{'train': ..., 'val': ..., 'test': ...}} or a tuple (train, val[, test])")
