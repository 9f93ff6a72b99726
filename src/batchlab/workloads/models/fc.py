"""Fully connected networks (the MNIST ``fc_*`` workloads of Shallue et al.)."""

from __future__ import annotations

import math

from torch import nn


def fully_connected(hidden: tuple[int, ...], input_shape: tuple[int, ...] = (1, 28, 28), num_classes: int = 10) -> nn.Sequential:
    """Return ``Flatten -> [Linear -> ReLU] * len(hidden) -> Linear``.

    Input: float ``(N, *input_shape)``; output: logits ``(N, num_classes)``. PyTorch's default
    initialisation.
    """
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for units in hidden:
        layers += [nn.Linear(width, units), nn.ReLU()]
        width = units
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)
