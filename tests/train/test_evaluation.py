"""Evaluation schedules, evaluation budgets and evaluation subsets."""

import pytest
import torch

from batchlab.errors import BatchlabError
from batchlab.train.evaluation import (
    MIN_BUDGET_EVALUATIONS,
    MIN_BUDGET_EXAMPLES,
    EvaluationPlan,
    budgeted_plan,
    measure,
    subset_splits,
    thin_schedule,
)
from batchlab.workloads import get_workload

FC_SCHEDULE = get_workload("mnist/fc_128_128_128").full_evaluation_steps(3000)
FULL = {"train": 2000, "val": 5000}


def test_thinning_keeps_the_last_step_and_the_shape():
    thinned = thin_schedule(FC_SCHEDULE, 3)
    assert thinned[-1] == 3000 and set(thinned) <= set(FC_SCHEDULE)
    assert len(thinned) == -(-len(FC_SCHEDULE) // 3)
    gaps = [b - a for a, b in zip(thinned, thinned[1:])]
    assert gaps[0] < gaps[-1] and len(set(gaps[-4:])) == 1  # dense early, regular later
    assert thin_schedule(FC_SCHEDULE, 1) == FC_SCHEDULE
    with pytest.raises(BatchlabError, match="keep_every must be >= 1"):
        thin_schedule(FC_SCHEDULE, 0)


def test_a_generous_budget_changes_nothing():
    plan = EvaluationPlan(FC_SCHEDULE, dict(FULL))
    assert budgeted_plan(plan, 0.1, 4096, 3000) == plan


@pytest.mark.parametrize("batch_size", [64, 128, 256])
def test_budget_is_met_by_shrinking_train_then_schedule_then_val(batch_size):
    plan = EvaluationPlan(FC_SCHEDULE, dict(FULL))
    budgeted = budgeted_plan(plan, 0.1, batch_size, 3000)
    allowed = 0.1 * batch_size * 3000
    assert plan.evaluated_examples() > allowed >= budgeted.evaluated_examples()
    assert budgeted.steps[-1] == 3000 and set(budgeted.steps) <= set(plan.steps)
    assert len(budgeted.steps) >= MIN_BUDGET_EVALUATIONS
    # the validation subset only shrinks once the train subset and the schedule are at their floors
    if budgeted.examples["val"] < FULL["val"]:
        assert budgeted.examples["train"] == MIN_BUDGET_EXAMPLES["train"]
        fewest = min(n for k in range(1, 40) if (n := len(thin_schedule(plan.steps, k))) >= MIN_BUDGET_EVALUATIONS)
        assert len(budgeted.steps) == fewest
    if len(budgeted.steps) < len(plan.steps):
        assert budgeted.examples["train"] == MIN_BUDGET_EXAMPLES["train"]


def test_floors_win_over_a_tiny_budget():
    plan = EvaluationPlan(FC_SCHEDULE, dict(FULL))
    budgeted = budgeted_plan(plan, 0.1, 16, 3000)
    assert budgeted.examples == MIN_BUDGET_EXAMPLES
    assert MIN_BUDGET_EVALUATIONS <= len(budgeted.steps) < len(plan.steps)
    assert budgeted.evaluated_examples() > 0.1 * 16 * 3000  # documented: the floors are kept
    small = EvaluationPlan([5, 10], {"train": 100, "val": 300})  # below the floors: kept as they are
    assert budgeted_plan(small, 0.001, 1, 10) == small


@pytest.mark.parametrize("budget", [0, -0.1, float("nan"), float("inf"), "0.1", True])
def test_bad_budget_is_one_line(budget):
    with pytest.raises(BatchlabError, match="evaluation budget must be a number > 0") as err:
        budgeted_plan(EvaluationPlan([1], dict(FULL)), budget, 16, 10)
    assert "\n" not in str(err.value)


def test_cutting_splits_first_gives_the_workloads_own_measurements():
    workload = get_workload("mnist/fc_64_64_64")
    data = workload.load_data(train_examples=3000, seed=0)
    model = workload.build_model(seed=1)
    splits = {"train": data.train, "val": data.val}
    cut = subset_splits(splits, {"train": 2000, "val": 5000})
    assert len(cut["train"]) == 2000 and cut["val"] is data.val
    assert measure(workload, model, cut) == measure(workload, model, splits)
    smaller = subset_splits(splits, {"train": 250, "val": 1000})
    assert len(smaller["train"]) == 250 and len(smaller["val"]) == 1000
    # a smaller subset is part of every larger one (one seed-0 permutation)
    rows = {tuple(r.tolist()) for r in cut["train"].x.flatten(1)[:, ::7]}
    assert all(tuple(r.tolist()) in rows for r in smaller["train"].x.flatten(1)[:, ::7])
    assert subset_splits(splits, {})["val"] is data.val
    # (x, y) pairs are accepted too, and cut to the same examples
    pairs = subset_splits({"train": (data.train_x, data.train_y)}, {"train": 250})
    assert torch.equal(pairs["train"].x, smaller["train"].x) and torch.equal(pairs["train"].y, smaller["train"].y)
