"""ResNet-8 for CIFAR-10 without batch normalisation (He et al.'s CIFAR ResNet with one block per stage)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class BasicBlock(nn.Module):
    """``relu(shortcut(x) + conv3x3(relu(conv3x3(x))))``; the shortcut is a strided 1x1 conv when the
    shape changes. The second conv starts at zero, so each block starts as its shortcut: this is
    what lets the network train without batch normalisation (as in Fixup, Zhang et al. 2019)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        nn.init.zeros_(self.conv2.weight)
        nn.init.zeros_(self.conv2.bias)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Conv2d(in_channels, out_channels, 1, stride=stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.shortcut(x) + self.conv2(F.relu(self.conv1(x))))


def resnet8(num_classes: int = 10, widths: tuple[int, int, int] = (16, 32, 64), in_channels: int = 3) -> nn.Sequential:
    """Return conv3x3(16) -> 3 stages of one BasicBlock (16, 32, 64 channels; stride 1, 2, 2) ->
    global average pool -> FC: 8 weight layers on the main path (1 + 3 * 2 + 1).

    Input: float ``(N, 3, 32, 32)``; output: logits ``(N, num_classes)``. No batch norm.
    """
    layers: list[nn.Module] = [nn.Conv2d(in_channels, widths[0], 3, padding=1), nn.ReLU()]
    previous = widths[0]
    for i, width in enumerate(widths):
        layers.append(BasicBlock(previous, width, stride=1 if i == 0 else 2))
        previous = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(previous, num_classes)]
    return nn.Sequential(*layers)
