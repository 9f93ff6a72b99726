import math

import pytest
import torch

from batchlab.errors import BatchlabError
from batchlab.workloads import classification, custom_task, language_model, regression
from batchlab.workloads.data import TensorSplit
from batchlab.workloads.metrics import cross_entropy_loss, evaluate_classifier, evaluate_split


def test_regression_loss_and_metrics_on_hand_checked_values():
    task = regression()
    outputs = torch.tensor([[1.0], [2.0], [4.0]])  # (N, 1) against (N,) targets
    targets = torch.tensor([1.5, 2.0, 1.0])
    # errors -0.5, 0, 3: squared 0.25, 0, 9 (mean 3.0833...); absolute 0.5, 0, 3 (mean 7/6)
    assert task.compute_loss(outputs, targets).item() == pytest.approx(9.25 / 3)
    sums = task.batch_sums(outputs, targets)
    assert float(sums["mse"][0]) == pytest.approx(9.25) and sums["mse"][1] == 3
    assert float(sums["mae"][0]) == pytest.approx(3.5) and sums["mae"][1] == 3
    assert task.default_metric == "mse" and not task.classes


def test_regression_rejects_label_smoothing_and_mismatched_shapes():
    with pytest.raises(BatchlabError, match="label_smoothing applies to classification tasks only; this workload's task is 'regression'"):
        regression().compute_loss(torch.zeros(2), torch.zeros(2), label_smoothing=0.1)
    with pytest.raises(BatchlabError, match=r"outputs of shape \(2, 3\) do not match targets of shape \(2,\)"):
        regression().compute_loss(torch.zeros(2, 3), torch.zeros(2))


def test_language_model_is_per_token_cross_entropy_and_error():
    # two sequences of two tokens, vocabulary 2
    logits = torch.tensor([[[0.0, 0.0], [2.0, 0.0]], [[0.0, 3.0], [1.0, 0.0]]])
    targets = torch.tensor([[0, 1], [1, 1]])
    nll = [math.log(2), math.log(1 + math.exp(2)), math.log(1 + math.exp(-3)), math.log(1 + math.exp(1))]
    task = language_model()
    assert task.compute_loss(logits, targets).item() == pytest.approx(sum(nll) / 4, rel=1e-6)
    sums = task.batch_sums(logits, targets)
    assert float(sums["cross_entropy_error"][0]) == pytest.approx(sum(nll), rel=1e-6)
    # argmax: [0 (tie -> first), 0, 1, 0] against [0, 1, 1, 1]: two wrong of four tokens
    assert sums["classification_error"] == (2, 4)
    assert task.compute_loss(logits, targets, 0.2).item() == pytest.approx(cross_entropy_loss(logits, targets, 0.2).item())


def test_classification_streaming_evaluation_equals_the_classifier_evaluation_bitwise():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 5))
    x, y = torch.randn(230, 3, 4), torch.randint(0, 5, (230,))
    for cap in (None, 100):
        old = evaluate_classifier(model, x, y, split="train", batch_size=64, max_examples=cap)
        new = evaluate_split(model, TensorSplit(x, y), classification().batch_sums, split="train", batch_size=64, max_examples=cap)
        assert old == new


def test_custom_task_with_plain_means_and_sum_count_pairs():
    def loss(outputs, targets):
        return (outputs - targets).abs().mean()

    def metrics(outputs, targets):
        return {"max_error": (outputs - targets).abs().max(), "hits": ((outputs.round() == targets).sum(), len(targets))}

    task = custom_task(loss, metrics, name="robust", metric_names=("hits", "max_error"))
    assert task.default_metric == "hits"
    model = torch.nn.Identity()
    x = torch.tensor([0.0, 1.0, 2.2, 2.9])
    y = torch.tensor([0.0, 1.0, 2.0, 2.0])
    out = evaluate_split(model, TensorSplit(x, y), task.batch_sums, split="val", batch_size=2)
    # batch means of max errors: 0 and 0.9, each over 2 examples
    assert out["val/max_error"] == pytest.approx(0.45, rel=1e-6) and out["val/hits"] == 0.75  # 2.2 rounds to 2, 2.9 to 3
    with pytest.raises(BatchlabError, match="must return a non-empty dict"):
        custom_task(loss, lambda o, t: [1.0]).batch_sums(x, y)
    with pytest.raises(BatchlabError, match="loss must be a function"):
        custom_task(3, metrics)
