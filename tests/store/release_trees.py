"""Small release-format trees for the store tests (imported by the tests as ``release_trees``)."""

from __future__ import annotations

from batchlab.store.synthetic_release import write_study


def curve(trial_id: int, n: int = 5, *, offset: float = 0.0) -> list[dict]:
    """A decreasing error curve evaluated at irregular steps, with two metrics."""
    steps = [0, 3, 10, 25, 60, 130, 400, 1000][:n]
    return [
        {"step": s, "val/classification_error": 0.9 / (1 + i) + offset + trial_id * 1e-3,
         "train/cross_entropy_error": 2.3 / (1 + 0.5 * i) + 0.1 * trial_id}
        for i, s in enumerate(steps)
    ]


def trials(n: int, *, statuses=("COMPLETE", "INCOMPLETE", "INFEASIBLE")) -> list[dict]:
    return [
        {"trial_id": i, "status": statuses[(i - 1) % len(statuses)], "steps": 1000,
         "parameters": {"learning_rate": 0.01 * i, "momentum": 0.9}, "measurements": curve(i)}
        for i in range(1, n + 1)
    ]


def make_release(root, *, n_trials: int = 4) -> dict:
    """A small release: two ordinary workloads (two batch sizes each) and one subset group."""
    studies = {}
    for workload in ("mnist/simple_cnn_base/sgd", "cifar_10/resnet_8/nesterov_momentum",
                     "mnist_subsets/mnist_6875/simple_cnn_base/nesterov_momentum"):
        for batch_size in (8, 64):
            studies[(workload, batch_size)] = write_study(root, workload, batch_size, trials(n_trials))
    return studies
