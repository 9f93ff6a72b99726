"""The tutorial's workload (docs/tutorial.md): a tiny MLP classifying noisy synthetic data.

Everything batchlab needs is in :func:`workload`, which returns a :class:`batchlab.workloads.Workload`;
batchlab finds it by reference, so nothing is installed or registered::

    batchlab train examples/my_model.py:workload --optimizer sgd --batch-size 64 --learning-rate 0.5 --steps 200
    batchlab advise examples/my_model.py:workload --optimizer sgd --store runs/mine --budget-examples 1500000

The data: 2,000 training and 1,000 validation inputs ``x ~ N(0, I_16)``, generated from a fixed seed
inside the data function (so every process, pool and Dask workers included, builds the same
examples), labelled by sampling one of 4 classes from the softmax of a fixed random linear teacher,
``y ~ softmax(x @ teacher)``. The labels are noisy by construction: the teacher itself scores 0.40 nats
of validation cross entropy, so the goal, ``val/cross_entropy_error < 0.5``, lies close to
the floor, where the gradient noise is large and the critical batch size is in the hundreds (about 200
by ``batchlab advise``, docs/tutorial.md) rather than tiny. The model is a 16 > 32 > 4 ReLU MLP (676 parameters): one SGD
step took 0.5 to 1.3 ms at every batch size from 1 to 1,024 on 2 shared CPU cores (advise's throughput probe).

SGD's learning rate is searched in [0.06, 2] (log scale; the workload's ``search_spaces``): the tuned
rate grows with the batch size (about 0.1 at B = 8, 1.4 at B = 256), and this range holds the rates
that reach the goal from B = 8 to 1,024 within the default budget (``default_steps`` 200 at
``default_batch_size`` 64: 12,800 examples, docs/methods.md, "Step budget per batch size").

Run this file to train it once from Python (``python examples/my_model.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from batchlab.workloads import Workload, classification

INPUT_DIM, CLASSES, HIDDEN = 16, 4, 32
TRAIN, VAL = 2000, 1000
DATA_SEED = 7
SEARCH_SPACES = {"sgd": {"learning_rate": {"type": "DOUBLE", "min_value": 0.06, "max_value": 2.0, "scale": "LOG_SCALE"}}}


def make_data() -> dict:
    """Train and validation splits as ``(x, y)`` tensor pairs (float32 inputs ``(N, 16)``, int64 labels ``(N,)``)."""
    generator = torch.Generator().manual_seed(DATA_SEED)
    teacher = torch.randn(INPUT_DIM, CLASSES, generator=generator)
    x = torch.randn(TRAIN + VAL, INPUT_DIM, generator=generator)
    y = torch.multinomial(torch.softmax(x @ teacher, dim=1), 1, generator=generator).squeeze(1)
    return {"train": (x[:TRAIN], y[:TRAIN]), "val": (x[TRAIN:], y[TRAIN:])}


def make_model() -> nn.Module:
    """A 16 > 32 > 4 ReLU MLP returning logits ``(N, 4)``."""
    return nn.Sequential(nn.Linear(INPUT_DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def workload() -> Workload:
    """The workload ``synthetic/my_mlp``: cross entropy, goal ``val/cross_entropy_error < 0.5``."""
    return Workload(
        name="synthetic/my_mlp",
        summary="Synthetic 4-class data from a noisy linear teacher: 16 > 32 > 4 ReLU MLP",
        make_model=make_model,
        data=make_data,
        task=classification(),
        metric="val/cross_entropy_error",
        goal=0.5,
        default_steps=200,
        default_batch_size=64,
        search_spaces=SEARCH_SPACES,
        data_notes=f"generated with seed {DATA_SEED}: x ~ N(0, I_16), y ~ softmax(x @ teacher); {TRAIN} train / {VAL} val",
    )


if __name__ == "__main__":
    from batchlab.train import TrialSpec, run_trial

    result = run_trial(TrialSpec(workload=workload(), optimizer="sgd", batch_size=64,
                                 hyperparameters={"learning_rate": 0.5}, steps=200))
    print(f"{result.status}: steps to goal {result.steps_to_goal}, final val/cross_entropy_error {result.final_metric():.4f}")
