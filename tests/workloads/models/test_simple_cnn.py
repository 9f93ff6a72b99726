import torch

from batchlab.workloads.models.simple_cnn import simple_cnn


def count(model):
    return sum(p.numel() for p in model.parameters())


def test_base_architecture_and_parameter_count():
    model = simple_cnn((32, 64), 1024)
    convs = [m for m in model if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size) for c in convs] == [(1, 32, (5, 5)), (32, 64, (5, 5))]
    expected = (25 * 32 + 32) + (25 * 32 * 64 + 64) + (7 * 7 * 64 * 1024 + 1024) + (1024 * 10 + 10)
    assert count(model) == expected
    assert model(torch.rand(3, 1, 28, 28)).shape == (3, 10)


def test_narrow_and_wide_halve_and_double_the_widths():
    narrow, wide = simple_cnn((16, 32), 512), simple_cnn((64, 128), 2048)
    assert [m.out_channels for m in narrow if isinstance(m, torch.nn.Conv2d)] == [16, 32]
    assert [m.out_features for m in wide if isinstance(m, torch.nn.Linear)] == [2048, 10]
