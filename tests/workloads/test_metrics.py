import math

import pytest
import torch
import torch.nn.functional as F

from batchlab.errors import BatchlabError
from batchlab.workloads import metrics
from batchlab.workloads.data import TensorSplit
from batchlab.workloads.tasks import classification, custom_task


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


# --- the evaluation batch rule, inference mode and float64 sums -----------------------------------

def test_evaluation_runs_in_inference_mode_and_sums_in_float64():
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(torch.is_inference_mode_enabled())
            return x

    def sums(outputs, targets):  # float32 batch sums: accumulated in float64
        return {"m": (outputs.float().sum(), outputs.numel())}

    x = torch.full((3,), 0.1, dtype=torch.float32)
    split = TensorSplit(x, torch.zeros(3, dtype=torch.int64))
    out = metrics.evaluate_split(Probe(), split, sums, split="val", batch_size=1)
    assert seen == [True, True, True]
    expected = (torch.tensor(0.1, dtype=torch.float32).double() * 3).item() / 3
    assert out == {"val/m": expected}


def test_default_batch_fits_the_activation_budget():
    fc = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    assert metrics.default_eval_batch_size(fc, torch.zeros(1, 1, 28, 28)) == metrics.MAX_EVAL_BATCH
    wide = torch.nn.Sequential(torch.nn.Linear(8, 1 << 16), torch.nn.ReLU(), torch.nn.Linear(1 << 16, 2))
    # input + both leaf outputs of 65,536 floats + the logits, per example
    per_example = 4 * (8 + 2 * (1 << 16) + 2)
    assert metrics.activation_bytes(wide, torch.zeros(1, 8)) == per_example
    assert metrics.default_eval_batch_size(wide, torch.zeros(1, 8)) == metrics.EVAL_ACTIVATION_BYTES // per_example == 95
    wide.train()
    assert metrics.default_eval_batch_size(wide, torch.zeros(1, 8)) == 95 and wide.training  # cached; mode kept


def test_default_batch_gives_the_old_pass_up_to_rounding():
    import dataclasses

    from batchlab.workloads import get_workload

    for name in ("mnist/fc_64_64_64", "mnist/simple_cnn_narrow"):
        workload = dataclasses.replace(get_workload(name), eval_batch_size=None)
        data = workload.load_data()
        x, y = data.val_x[:600], data.val_y[:600]
        model = workload.build_model(3)
        old = metrics.evaluate_classifier(model, x, y, split="val", batch_size=1000)
        new = workload.evaluate(model, x, y, split="val")
        assert new["val/classification_error"] == old["val/classification_error"]
        assert new["val/cross_entropy_error"] == pytest.approx(old["val/cross_entropy_error"], rel=1e-6)
        if name.startswith("mnist/fc"):
            assert new == old  # the rule gives batch 1000 here: bit for bit


# --- goal checks stopped once decided ---------------------------------------------------------------


def _predictions(wrong):
    """Logits of a 2-class model over ``len(wrong)`` examples (class 0 is the target), wrong where asked;
    the cross entropy of each example differs, so a partial sum is not the full one."""
    wrong = torch.as_tensor(wrong, dtype=torch.bool)
    margin = torch.linspace(0.5, 2.0, len(wrong))
    logits = torch.stack([torch.where(wrong, -margin, margin), torch.zeros(len(wrong))], dim=1)
    return Fixed(logits), TensorSplit(torch.arange(len(wrong)), torch.zeros(len(wrong), dtype=torch.int64))


def _check(wrong, goal, maximize=False, batch_size=2):
    model, split = _predictions(wrong)
    values, bounds = metrics.check_goal_split(model, split, classification().batch_sums, "classification_error", goal,
                                              maximize, split="val", batch_size=batch_size)
    batches = len(model.modes)
    full = metrics.evaluate_split(model, split, classification().batch_sums, split="val", batch_size=batch_size)
    return values, bounds, full, batches


def test_errors_crossing_the_goal_early_stop_with_a_lower_bound():
    # 10 examples in batches of 2; goal 0.3 allows at most 2 errors; the first 4 examples are wrong
    values, bounds, full, batches = _check([1, 1, 1, 1, 0, 0, 0, 0, 0, 0], 0.3)
    assert batches == 2 and values == {"val/classification_error": 0.4} and bounds == {"val/classification_error": 1.0}
    assert full["val/classification_error"] == 0.4 >= values["val/classification_error"]


def test_errors_late_decide_nothing_early():
    # the same 4 errors, last: the pass runs to its end and gives the exact values
    values, bounds, full, batches = _check([0, 0, 0, 0, 0, 0, 1, 1, 1, 1], 0.35)
    assert batches == 5 and bounds == {} and values == full and values["val/classification_error"] == 0.4


def test_a_goal_met_early_stops_with_an_upper_bound():
    # no error in the first 6: at most 4 of 10 can be wrong, 0.4 < 0.5 whatever the rest
    values, bounds, full, batches = _check([0, 0, 0, 0, 0, 0, 1, 1, 1, 0], 0.5)
    assert batches == 3 and values == {"val/classification_error": 0.4} and bounds == {"val/classification_error": -1.0}
    assert full["val/classification_error"] == 0.3 <= 0.4


def test_a_value_equal_to_the_goal_is_not_met():
    from batchlab.train.evaluation import goal_reached

    # 3 errors in the first 4 of 10, goal 0.3: the error is at least 0.3, which does not beat 0.3
    values, bounds, _, batches = _check([1, 1, 1, 0, 0, 0, 0, 0, 0, 0], 0.3)
    assert batches == 2 and values == {"val/classification_error": 0.3} and bounds == {"val/classification_error": 1.0}
    assert not goal_reached(0.3, 0.3, maximize=False)
    # an upper bound equal to the goal decides nothing: no error in the first 6 of 10, goal 0.4
    values, bounds, full, batches = _check([0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 0.4)
    assert batches == 4 and values == {"val/classification_error": 0.2} and bounds == {"val/classification_error": -1.0}
    # maximizing: met once the lower bound beats it (lower bound flagged), a tie is not met
    values, bounds, _, batches = _check([1, 1, 1, 1, 0, 0, 0, 0, 0, 0], 0.3, maximize=True)
    assert batches == 2 and values == {"val/classification_error": 0.4} and bounds == {"val/classification_error": 1.0}
    values, bounds, _, _ = _check([0, 0, 0, 0, 0, 0, 1, 1, 1, 0], 0.4, maximize=True)
    assert values == {"val/classification_error": 0.4} and bounds == {"val/classification_error": -1.0}
    # the decision itself, from counts: (hits, seen, total)
    assert metrics.goal_decision(3, 4, 10, 0.3, False) == (0.3, metrics.LOWER_BOUND)
    assert metrics.goal_decision(0, 6, 10, 0.4, False) is None
    assert metrics.goal_decision(0, 7, 10, 0.4, False) == (0.3, metrics.UPPER_BOUND)
    assert metrics.goal_decision(4, 4, 10, 0.4, True) is None  # a lower bound equal to the goal: not met yet
    assert metrics.goal_decision(5, 5, 10, 0.4, True) == (0.5, metrics.LOWER_BOUND)


@pytest.mark.parametrize("maximize", [False, True])
def test_the_bound_decides_the_goal_as_the_true_value_does(maximize):
    from batchlab.train.evaluation import goal_reached

    generator = torch.Generator().manual_seed(0)
    stopped = 0
    for case in range(300):
        n = int(torch.randint(1, 40, (1,), generator=generator))
        rate = float(torch.rand(1, generator=generator))
        wrong = (torch.rand(n, generator=generator) < rate).tolist()
        k = int(torch.randint(0, n + 1, (1,), generator=generator))
        goal = k / n if case % 2 else float(torch.rand(1, generator=generator))  # ties at exactly k / n too
        batch_size = int(torch.randint(1, n + 1, (1,), generator=generator))
        values, bounds, full, _ = _check(wrong, goal, maximize, batch_size)
        true = full["val/classification_error"]
        if not bounds:
            assert values == full
            continue
        stopped += 1
        (name, flag), = bounds.items()
        bound = values[name]
        assert list(values) == [name] and flag in (1.0, -1.0)
        assert (true >= bound) if flag == 1.0 else (true <= bound)
        assert goal_reached(bound, goal, maximize) == goal_reached(true, goal, maximize)
    assert stopped > 50


def test_what_cannot_be_bounded_is_measured_in_full():
    model, split = _predictions([1] * 6 + [0] * 4)
    task = classification()
    expected = metrics.evaluate_split(model, split, task.batch_sums, batch_size=2)
    # a dataset split (its total count is not known before the pass)
    from batchlab.workloads.data import DatasetSplit

    pairs = [(i, 0) for i in range(10)]
    assert metrics.check_goal_split(model, DatasetSplit(pairs), task.batch_sums, "classification_error", 0.3, False,
                                    batch_size=2) == (expected, {})
    # a metric whose batch sums are not counts
    def fractional(outputs, targets):
        return {"classification_error": (0.25 * len(targets), len(targets))}

    values, bounds = metrics.check_goal_split(model, split, fractional, "classification_error", 0.1, False, batch_size=2)
    assert bounds == {} and values == {"val/classification_error": 0.25}
    # non-finite outputs in the first batch: the full pass, with its non-finite cross entropy
    nan_model, _ = _predictions([1] * 10)
    nan_model.table[0, 0] = float("nan")
    values, bounds = metrics.check_goal_split(nan_model, split, task.batch_sums, "classification_error", 0.3, False, batch_size=2)
    assert bounds == {} and len(nan_model.modes) == 5 and math.isnan(values["val/cross_entropy_error"])
    # non-finite weights: the full pass
    broken, _ = _predictions([1] * 10)
    broken.weight.data.fill_(float("inf"))
    values, bounds = metrics.check_goal_split(broken, split, task.batch_sums, "classification_error", 0.3, False, batch_size=2)
    assert bounds == {} and len(broken.modes) == 5


def test_only_declared_metrics_are_bounded():
    assert classification().bounded_metrics == ("classification_error",)
    assert custom_task(lambda o, t: o.sum(), lambda o, t: {"m": (o.sum(), 1)}, metric_names=("m",)).bounded_metrics == ()
    from batchlab.workloads.tasks import Task, language_model, regression

    assert language_model().bounded_metrics == ("classification_error",) and regression().bounded_metrics == ()
    with pytest.raises(BatchlabError, match=r"bounded_metrics \['mse'\] must be among its metrics; allowed: m$"):
        Task("t", lambda o, t: o.sum(), lambda o, t: {}, metric_names=("m",), bounded_metrics=("mse",))
