import pytest
import torch

from batchlab.workloads.models.transformer import CharTransformer


def test_shape_and_causality():
    torch.manual_seed(0)
    model = CharTransformer(vocab_size=11, context=8, width=16, layers=2, heads=4).eval()
    tokens = torch.randint(0, 11, (2, 8))
    logits = model(tokens)
    assert logits.shape == (2, 8, 11)
    changed = tokens.clone()
    changed[:, 5] = (changed[:, 5] + 1) % 11
    other = model(changed)
    assert torch.allclose(logits[:, :5], other[:, :5], atol=1e-6)  # the past does not see the future
    assert not torch.allclose(logits[:, 5:], other[:, 5:])
    assert model(tokens[:, :3]).shape == (2, 3, 11)


def test_every_matrix_weight_is_in_a_linear_or_embedding_layer():
    model = CharTransformer(vocab_size=11, context=8, width=16, layers=1, heads=2)
    owners = {type(m) for m in model.modules() if any(True for _ in m.parameters(recurse=False))}
    assert owners <= {torch.nn.Linear, torch.nn.Embedding, torch.nn.LayerNorm}


def test_too_long_input_is_rejected():
    with pytest.raises(ValueError, match="exceeds the context"):
        CharTransformer(vocab_size=5, context=4, width=8, layers=1, heads=2)(torch.zeros(1, 5, dtype=torch.long))
