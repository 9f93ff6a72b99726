import torch

from batchlab.workloads.models.fc import fully_connected


def test_layers_and_shapes():
    model = fully_connected((5, 7), input_shape=(1, 4, 4), num_classes=3)
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    assert [(l.in_features, l.out_features) for l in linears] == [(16, 5), (5, 7), (7, 3)]
    assert model(torch.rand(2, 1, 4, 4)).shape == (2, 3)
