"""Which training examples each update sees.

The data order is a pure function of ``(num_train, batch_size, seed, step)``, so a trial run by
:func:`batchlab.train.run_trial` and a vectorized trial in ``batchlab.sweep`` see exactly the same
batches, and a trial can be resumed or replayed at any step without replaying the ones before it.

Convention: an *epoch* is ``num_train // batch_size`` updates. Each epoch draws a fresh random
permutation of the training set; update ``k`` of the epoch takes the permutation's positions
``[k*batch_size, (k+1)*batch_size)``. The ``num_train % batch_size`` examples left at the end of a
permutation are skipped for that epoch only (a different remainder each epoch), so every batch holds
distinct examples and has exactly ``batch_size`` of them. ``batch_size == num_train`` is full-batch
training (every update sees the whole training set, reordered).

:class:`BatchSampler` is the sampler of one trial (what the training loop calls every update);
:func:`batch_indices` is the same order as a pure function. Indices are CPU tensors on every device:
a data split turns them into a batch (``DataSplit.batch``) and the trainer moves the batch, so the
batch order does not depend on the device.
"""

from __future__ import annotations

import functools
import operator

import numpy as np
import torch

from batchlab.errors import BatchlabError

__all__ = ["BatchSampler", "batch_indices", "updates_per_epoch"]


def _as_int(name: str, value: object) -> int:
    try:
        return operator.index(value)  # ints and numpy integers; rejects floats and bools' cousins
    except TypeError:
        raise BatchlabError(f"{name} must be an integer, got {value!r}") from None


def updates_per_epoch(num_train: int, batch_size: int) -> int:
    """Updates per pass over the training set: ``num_train // batch_size`` (validated, >= 1)."""
    num_train = _as_int("num_train", num_train)
    batch_size = _as_int("batch size", batch_size)
    if num_train < 1:
        raise BatchlabError(f"the training set is empty (num_train={num_train}); it needs at least 1 example")
    if not 1 <= batch_size <= num_train:
        raise BatchlabError(
            f"batch size {batch_size} is out of range; allowed: 1 to {num_train} (the training set size)"
        )
    return num_train // batch_size


@functools.lru_cache(maxsize=32)
def _epoch_permutation(num_train: int, seed: int, epoch: int) -> torch.Tensor:
    """The permutation of ``range(num_train)`` used in ``epoch`` (int64; cached, never mutated).

    One ``torch.randperm`` per epoch; the per-epoch generator seed comes from numpy's SeedSequence
    so that nearby ``(seed, epoch)`` pairs give unrelated streams.
    """
    state = np.random.SeedSequence([seed, epoch]).generate_state(1, dtype=np.uint64)[0]
    generator = torch.Generator().manual_seed(int(state))
    return torch.randperm(num_train, generator=generator)


class BatchSampler:
    """The batch order of one trial: ``indices(step)`` is ``batch_indices(num_train, batch_size, seed, step)``.

    Validated once (the errors of :func:`batch_indices`); each call then costs a slice of the current
    epoch's permutation, which the sampler keeps (one cached ``torch.randperm`` per epoch, copied once
    so that the sampler never exposes the shared cache). ``indices`` returns a view of that copy:
    read it, do not modify it in place (:func:`batch_indices` returns an owned copy).
    """

    __slots__ = ("num_train", "batch_size", "seed", "per_epoch", "_epoch", "_permutation")

    def __init__(self, num_train: int, batch_size: int, seed: int) -> None:
        self.per_epoch = updates_per_epoch(num_train, batch_size)
        self.num_train, self.batch_size = _as_int("num_train", num_train), _as_int("batch size", batch_size)
        self.seed = _as_int("seed", seed)
        if self.seed < 0:
            raise BatchlabError(f"seed must be >= 0, got {self.seed}")
        self._epoch: int | None = None
        self._permutation: torch.Tensor | None = None

    def indices(self, step: int) -> torch.Tensor:
        """The example indices (int64, CPU, shape ``(batch_size,)``) of update ``step`` (0-based, >= 0)."""
        epoch, position = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            if step < 0:
                raise BatchlabError(f"step must be >= 0, got {step}")
            self._permutation, self._epoch = _epoch_permutation(self.num_train, self.seed, epoch).clone(), epoch
        return self._permutation[position * self.batch_size : (position + 1) * self.batch_size]

    def __repr__(self) -> str:
        return f"BatchSampler(num_train={self.num_train}, batch_size={self.batch_size}, seed={self.seed})"


def batch_indices(num_train: int, batch_size: int, seed: int, step: int) -> torch.Tensor:
    """Return the training-example indices of update ``step`` (0-based), as a LongTensor of shape (batch_size,).

    Deterministic given ``(num_train, batch_size, seed, step)``; reshuffled every epoch (see the
    module docstring). Costs one ``torch.randperm(num_train)`` per epoch (cached), then a slice.

    Raises:
        BatchlabError: ``batch_size`` outside ``1..num_train``, ``step < 0`` or ``seed < 0``.
    """
    per_epoch = updates_per_epoch(num_train, batch_size)
    step = _as_int("step", step)
    seed = _as_int("seed", seed)
    if step < 0:
        raise BatchlabError(f"step must be >= 0, got {step}")
    if seed < 0:
        raise BatchlabError(f"seed must be >= 0, got {seed}")
    epoch, position = divmod(step, per_epoch)
    start = position * batch_size
    # clone: callers own the result and may modify it without touching the cached permutation
    return _epoch_permutation(num_train, seed, epoch)[start : start + batch_size].clone()
