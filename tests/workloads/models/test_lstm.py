import torch

from batchlab.workloads.models.lstm import CharLSTM


def test_shape_and_causality():
    torch.manual_seed(0)
    model = CharLSTM(vocab_size=9, embedding=4, hidden=6)
    tokens = torch.randint(0, 9, (3, 7))
    logits = model(tokens)
    assert logits.shape == (3, 7, 9)
    changed = tokens.clone()
    changed[:, 4] = (changed[:, 4] + 1) % 9
    assert torch.allclose(model(changed)[:, :4], logits[:, :4])
