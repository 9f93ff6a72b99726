"""The train / validation / test arrays every data loader returns."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SplitArrays:
    """Numpy arrays of one data set, split three ways.

    ``*_x`` holds inputs (float32 images ``(N, C, H, W)`` in [0, 1], or int64 token ids ``(N, L)``),
    ``*_y`` holds targets (int64 class labels ``(N,)``, or next-token ids ``(N, L)``). Row ``i`` of
    ``x`` and ``y`` belong together. ``num_classes`` is the number of classes (the vocabulary size for
    language models).
    """

    train_x: np.ndarray
    train_y: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int

    def __post_init__(self) -> None:
        for split in ("train", "val", "test"):
            x, y = getattr(self, f"{split}_x"), getattr(self, f"{split}_y")
            if len(x) != len(y):
                raise ValueError(f"{split}: {len(x)} inputs but {len(y)} targets")

    def sizes(self) -> dict[str, int]:
        """Return the number of examples per split, e.g. ``{"train": 55000, "val": 5000, ...}``."""
        return {"train": len(self.train_x), "val": len(self.val_x), "test": len(self.test_x)}
