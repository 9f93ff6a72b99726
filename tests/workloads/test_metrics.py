import math

import pytest
import torch
import torch.nn.functional as F

from batchlab.errors import BatchlabError
from batchlab.workloads import metrics


def test_label_smoothing_follows_shallue_convention():
    # K = 4, ls = 0.3: the true class gets 0.7 and every other class 0.1.
    logits = torch.tensor([[2.0, -1.0, 0.5, 0.0]])
    y = torch.tensor([0])
    log_p = F.log_softmax(logits, dim=-1)[0]
    expected = -(0.7 * log_p[0] + 0.1 * (log_p[1] + log_p[2] + log_p[3]))
    got = metrics.cross_entropy_loss(logits, y, label_smoothing=0.3)
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)
    assert metrics.torch_label_smoothing(0.3, 4) == pytest.approx(0.4)


def test_no_smoothing_is_plain_cross_entropy_and_sequences_are_per_token():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 7)
    y = torch.randint(0, 7, (3, 5))
    got = metrics.cross_entropy_loss(logits, y)
    assert got.item() == pytest.approx(F.cross_entropy(logits.reshape(-1, 7), y.reshape(-1)).item(), rel=1e-6)


@pytest.mark.parametrize("bad", [-0.1, 0.95, float("nan")])
def test_bad_label_smoothing_is_a_one_line_error(bad):
    with pytest.raises(BatchlabError, match="label_smoothing must be in"):
        metrics.cross_entropy_loss(torch.zeros(1, 10), torch.tensor([0]), label_smoothing=bad)


class Fixed(torch.nn.Module):
    """Returns given logits row by row; records the mode it was called in."""

    def __init__(self, table):
        super().__init__()
        self.table = table
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.modes = []

    def forward(self, idx):
        self.modes.append(self.training)
        return self.table[idx]


def test_evaluate_on_a_hand_built_case():
    # three examples, two classes; predictions: right, wrong, right.
    p = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7]])
    model = Fixed(p.log())
    y = torch.tensor([0, 1, 1])
    out = metrics.evaluate_classifier(model, torch.arange(3), y, split="val", batch_size=2)
    assert out["val/classification_error"] == pytest.approx(1 / 3)
    expected_ce = -(math.log(0.9) + math.log(0.2) + math.log(0.7)) / 3
    assert out["val/cross_entropy_error"] == pytest.approx(expected_ce, rel=1e-6)
    assert model.modes == [False, False] and model.training  # eval mode inside, mode restored


def test_evaluate_subset_is_fixed_and_capped():
    first = metrics.fixed_subset(100, 10)
    assert torch.equal(first, metrics.fixed_subset(100, 10))
    assert len(first) == 10 and len(set(first.tolist())) == 10
    assert metrics.fixed_subset(5, 10) is None and metrics.fixed_subset(5, None) is None


def test_evaluate_rejects_unknown_split():
    with pytest.raises(BatchlabError, match="unknown split 'dev'; allowed: train, val, test"):
        metrics.evaluate_classifier(Fixed(torch.zeros(1, 2)), torch.arange(1), torch.tensor([0]), split="dev")


def test_evaluate_sequences_counts_every_token():
    # two sequences of two tokens over three classes; one of the four tokens is wrong.
    p = torch.tensor([[[0.6, 0.3, 0.1], [0.2, 0.7, 0.1]], [[0.1, 0.1, 0.8], [0.5, 0.4, 0.1]]])
    model = Fixed(p.log())
    y = torch.tensor([[0, 1], [2, 1]])
    out = metrics.evaluate_classifier(model, torch.arange(2), y, split="train")
    assert out["train/classification_error"] == pytest.approx(0.25)
    expected = -(math.log(0.6) + math.log(0.7) + math.log(0.8) + math.log(0.4)) / 4
    assert out["train/cross_entropy_error"] == pytest.approx(expected, rel=1e-6)
