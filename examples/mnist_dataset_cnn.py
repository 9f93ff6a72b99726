"""A user workload on a real offline data set, served through a ``torch.utils.data.Dataset``.

A small convolutional network on MNIST digits (the copy batchlab ships with, read by
:func:`batchlab.data.mnist.load_mnist`; no download). The examples reach the trainer through a
map-style Dataset that keeps the pixels as uint8 and converts one image at a time, the way a data
set too big for memory would be read from disk: batchlab's sampler draws example indices and asks
the Dataset for them (:class:`batchlab.workloads.DatasetSplit`), with the same seeded batches as
in-memory tensors. Training uses the first 10,000 training images, validation the 5,000 validation
images::

    batchlab train examples/mnist_dataset_cnn.py:workload --optimizer momentum --batch-size 64 --learning-rate 0.05 --steps 300
    batchlab sweep examples/mnist_dataset_cnn.py:workload --optimizer momentum --batch-sizes 64,256 --trials 2 --steps 300 --workers 2 --store runs

The goal, ``val/classification_error < 0.06``, is reached at step 180 of momentum (0.9) at batch
size 64 and learning rate 0.05 (seed 0).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from batchlab.workloads import Workload, classification

TRAIN = 10_000
# momentum's search space for sweeps of this workload (the batch_science parameter_configs form): the
# first point a sweep draws, learning rate 0.11 and momentum 0.90, reaches the goal at step 145 at batch
# size 64 and 132 at 256 (300-step budget, seed 0); the optimizer's generic default ([1e-4, 1] and
# [0.5, 0.999]) starts at momentum 0.98 and learning rate 0.0007
SEARCH_SPACES = {"momentum": {
    "learning_rate": {"type": "DOUBLE", "min_value": 0.01, "max_value": 0.3, "scale": "LOG_SCALE"},
    "momentum": {"type": "DOUBLE", "min_value": 0.8, "max_value": 0.95, "scale": "REVERSE_LOG_SCALE"},
}}


class Digits(torch.utils.data.Dataset):
    """MNIST images as ``(float32 (1, 28, 28) in [0, 1), int64 label)`` pairs, converted per item."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images = (images * 256).round().astype(np.uint8)  # the pickle's k/256 values, 1 byte each
        self.labels = labels.astype(np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = torch.from_numpy(self.images[index].astype(np.float32) / np.float32(256.0))
        return image, torch.tensor(self.labels[index])


def make_data() -> dict:
    """Train (the first 10,000 training images) and validation (5,000) Datasets."""
    from batchlab.data.mnist import load_mnist

    arrays = load_mnist()
    return {
        "train": Digits(arrays.train_x[:TRAIN], arrays.train_y[:TRAIN]),
        "val": Digits(arrays.val_x, arrays.val_y),
        "num_classes": 10,
    }


def make_model() -> nn.Module:
    """conv3x3(8, stride 2) > ReLU > conv3x3(16, stride 2) > ReLU > FC 10."""
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(16 * 7 * 7, 10),
    )


def workload() -> Workload:
    """The workload ``mnist_subset/small_cnn``: classification, goal ``val/classification_error < 0.06``."""
    return Workload(
        name="mnist_subset/small_cnn",
        summary="MNIST (10,000 training images, read through a torch Dataset), two stride-2 3x3 convolutions and a linear layer",
        make_model=make_model,
        data=make_data,
        task=classification(),
        metric="val/classification_error",
        goal=0.06,
        default_steps=600,
        default_batch_size=64,
        input_shape=(1, 28, 28),
        num_classes=10,
        split_sizes={"train": TRAIN, "val": 5000},
        eval_examples={"train": 1000, "val": 2000, "test": None},
        eval_batch_size=500,
        search_spaces=SEARCH_SPACES,
        data_notes="batchlab.data.mnist.load_mnist: train = its first 10,000 training images; val = its 5,000 validation images",
    )


if __name__ == "__main__":
    from batchlab.train import TrialSpec, run_trial

    result = run_trial(TrialSpec(workload=workload(), optimizer="momentum", batch_size=64,
                                 hyperparameters={"learning_rate": 0.05, "momentum": 0.9}, steps=300))
    print(f"{result.status}: steps to goal {result.steps_to_goal}, final val/classification_error {result.final_metric():.4f}")
