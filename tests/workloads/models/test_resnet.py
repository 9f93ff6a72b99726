import torch
from torch.nn import functional as F

from batchlab.workloads.models.resnet import BasicBlock, resnet8


def test_shape_depth_and_no_batch_norm():
    model = resnet8()
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 10)
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    convs_3x3 = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3)]
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(convs_3x3) + len(linears) == 8  # 7 3x3 convs + the classifier; 1x1 shortcuts not counted


def test_blocks_start_as_their_shortcut():
    torch.manual_seed(0)
    block = BasicBlock(4, 8, stride=2)
    x = torch.randn(2, 4, 8, 8)
    assert torch.allclose(block(x), F.relu(block.shortcut(x)))
