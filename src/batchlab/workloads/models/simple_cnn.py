"""The Simple CNN of Shallue et al. (MNIST and Fashion-MNIST)."""

from __future__ import annotations

from torch import nn


def simple_cnn(
    conv_channels: tuple[int, int] = (32, 64),
    dense_units: int = 1024,
    input_shape: tuple[int, int, int] = (1, 28, 28),
    num_classes: int = 10,
) -> nn.Sequential:
    """Return ``conv5x5(c1) -> ReLU -> maxpool2 -> conv5x5(c2) -> ReLU -> maxpool2 -> FC(dense) -> ReLU -> FC``.

    Convolutions are 'same'-padded, so a 28x28 input becomes 7x7 after the two 2x2 max-pools. The
    base model uses (32, 64) channels and 1,024 dense units; narrow halves every width, wide doubles it.
    Input: float ``(N, C, H, W)`` with H and W divisible by 4; output: logits ``(N, num_classes)``.
    """
    channels, height, width = input_shape
    c1, c2 = conv_channels
    return nn.Sequential(
        nn.Conv2d(channels, c1, kernel_size=5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, kernel_size=5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(c2 * (height // 4) * (width // 4), dense_units),
        nn.ReLU(),
        nn.Linear(dense_units, num_classes),
    )
