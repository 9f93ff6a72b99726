"""A user workload: a small MLP regressing a known teacher function on synthetic data.

Everything batchlab needs is in :func:`workload`, which returns a
:class:`batchlab.workloads.Workload`; batchlab finds it by reference, so nothing is installed or
registered::

    batchlab train examples/regression_mlp.py:workload --optimizer sgd --batch-size 64 --learning-rate 0.05 --steps 200
    batchlab sweep examples/regression_mlp.py:workload --optimizer sgd --batch-sizes 16,64 --trials 2 --steps 200 --workers 2 --store runs

The data: 4,000 training and 1,000 validation inputs ``x ~ N(0, I_8)``, generated from a fixed seed
inside the data function (so every process, including pool and Dask workers, builds the same
examples), and targets ``y = teacher(x) + noise`` with a fixed random two-layer tanh teacher and
Gaussian noise of standard deviation 0.1 (so the best possible ``val/mse`` is about 0.01; the
targets have variance about 1). The
goal, ``val/mse < 0.09``, is reached at step 136 of SGD at batch size 64 and learning rate 0.05
(seed 0; step 176 at batch size 16). A sweep searches SGD's learning rate in [0.02, 0.5] (the
workload's ``search_spaces``), where its first two points, 0.19 and 0.039, put the goal within 200
steps at every batch size from 16 to 256.

Run this file to train it once from Python (``python examples/regression_mlp.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from batchlab.workloads import Workload, regression

INPUT_DIM = 8
HIDDEN = 64
TRAIN, VAL = 4000, 1000
NOISE = 0.1
DATA_SEED = 20240917
# SGD's learning rates searched by a sweep of this workload (the batch_science parameter_configs form):
# every rate in [0.02, 0.5] trains stably at batch sizes 16 to 256 (0.8 diverges at 16), and 0.19, the
# first point a sweep draws, reaches val/mse < 0.09 within 150 steps at 16, 64 and 256 (seed 0); the
# optimizer's generic default, [0.001, 10], would spend 2-trial sweeps on 0.0067 and 0.67
SEARCH_SPACES = {"sgd": {"learning_rate": {"type": "DOUBLE", "min_value": 0.02, "max_value": 0.5, "scale": "LOG_SCALE"}}}


def make_data() -> dict:
    """Train and validation splits as ``(x, y)`` tensor pairs (float32 inputs ``(N, 8)``, targets ``(N,)``)."""
    generator = torch.Generator().manual_seed(DATA_SEED)
    teacher_in = torch.randn(INPUT_DIM, 16, generator=generator) / INPUT_DIM**0.5
    teacher_out = torch.randn(16, generator=generator) / 16**0.5
    x = torch.randn(TRAIN + VAL, INPUT_DIM, generator=generator)
    y = torch.tanh(x @ teacher_in) @ teacher_out * 2.0 + NOISE * torch.randn(TRAIN + VAL, generator=generator)
    return {"train": (x[:TRAIN], y[:TRAIN]), "val": (x[TRAIN:], y[TRAIN:])}


def make_model() -> nn.Module:
    """An 8 > 64 > 64 > 1 ReLU MLP whose output is flattened to ``(N,)`` like the targets."""
    return nn.Sequential(
        nn.Linear(INPUT_DIM, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, 1), nn.Flatten(0),
    )


def workload() -> Workload:
    """The workload ``synthetic/regression_mlp``: MSE loss, goal ``val/mse < 0.09``."""
    return Workload(
        name="synthetic/regression_mlp",
        summary="Synthetic regression: 8 > 64 > 64 > 1 ReLU MLP fitting a random tanh teacher (noise sd 0.1)",
        make_model=make_model,
        data=make_data,
        task=regression(),
        metric="val/mse",
        goal=0.09,
        default_steps=400,
        default_batch_size=64,
        search_spaces=SEARCH_SPACES,
        data_notes=f"generated with seed {DATA_SEED}: x ~ N(0, I_8), y = teacher(x) + N(0, {NOISE}^2); {TRAIN} train / {VAL} val",
    )


if __name__ == "__main__":
    from batchlab.train import TrialSpec, run_trial

    result = run_trial(TrialSpec(workload=workload(), optimizer="sgd", batch_size=64,
                                 hyperparameters={"learning_rate": 0.05}, steps=200))
    print(f"{result.status}: steps to goal {result.steps_to_goal}, final val/mse {result.final_metric():.4f}")
