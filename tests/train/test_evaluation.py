"""Evaluation schedules, evaluation budgets, evaluation subsets and bounded goal checks."""

import pytest
import torch

from batchlab.errors import BatchlabError
from batchlab.train.core import TrialProgress, finite, replay_bracket
from batchlab.train.evaluation import (
    BOUND_SUFFIX,
    MIN_BUDGET_EVALUATIONS,
    MIN_BUDGET_EXAMPLES,
    EvaluationPlan,
    budgeted_plan,
    goal_reached,
    measure,
    measure_goal,
    subset_splits,
    thin_schedule,
    with_bound_flags,
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


# --- goal-only steps: the goal check stopped once decided -------------------------------------------

GOAL_METRIC = "val/classification_error"


def _val(workload, examples=5000):
    data = workload.load_data(train_examples=3000, seed=0)
    return data, {"val": subset_splits({"val": data.val}, {"val": examples})["val"]}


def _counting(model):
    seen = []
    model.register_forward_hook(lambda module, inputs, output: seen.append(len(inputs[0])))
    return seen


def test_an_untrained_model_is_refused_after_one_batch_with_a_lower_bound():
    workload = get_workload("mnist/fc_64_64_64")
    _, splits = _val(workload)
    model = workload.build_model(seed=1)
    true = measure(workload, model, splits)[GOAL_METRIC]  # about 0.9
    seen = _counting(model)
    metrics, bounds = measure_goal(workload, model, splits, goal=0.03)
    assert seen == [1000] and bounds == {GOAL_METRIC: 1.0} and list(metrics) == [GOAL_METRIC]
    assert 0.03 <= metrics[GOAL_METRIC] <= true and not goal_reached(metrics[GOAL_METRIC], 0.03, False)
    row = with_bound_flags(metrics, bounds)
    assert row == {GOAL_METRIC: metrics[GOAL_METRIC], GOAL_METRIC + BOUND_SUFFIX: 1.0} and finite(row)


def test_bounded_rows_decide_the_goal_as_the_full_measurement_does():
    workload = get_workload("mnist/fc_64_64_64")
    _, splits = _val(workload)
    model = workload.build_model(seed=1)
    full = measure(workload, model, splits)
    true = full[GOAL_METRIC]
    errors = round(true * 5000)
    stopped = 0
    for goal in (0.03, 0.5, true - 1e-9, true, true + 1e-9, (errors + 1) / 5000, 0.95, 0.999):
        progress = TrialProgress(metric=GOAL_METRIC, goal=goal, maximize=False, stop_at_goal=True, total_steps=10)
        metrics, bounds = measure_goal(workload, model, splits, goal)
        assert progress.meets_goal(with_bound_flags(metrics, bounds)) == progress.meets_goal(full)
        if bounds:
            stopped += 1
            assert (true >= metrics[GOAL_METRIC]) if bounds[GOAL_METRIC] == 1.0 else (true <= metrics[GOAL_METRIC])
        else:  # undecided until the end (a goal at or next to the true value): the full measurement itself
            assert metrics == full
    assert not goal_reached(true, true, False) and stopped >= 4


def test_tasks_without_bounded_metrics_are_measured_in_full():
    import dataclasses

    from batchlab.workloads.tasks import custom_task

    base = get_workload("mnist/fc_64_64_64")
    task = custom_task(base.task.loss, base.task.metrics, metric_names=("cross_entropy_error", "classification_error"))
    workload = dataclasses.replace(base, task=task)
    _, splits = _val(workload, 2000)
    model = workload.build_model(seed=1)
    assert measure_goal(workload, model, splits, goal=0.03) == (measure(workload, model, splits), {})
    ce = dataclasses.replace(base, metric="val/cross_entropy_error", goal=0.1)
    assert measure_goal(ce, model, splits, goal=0.1) == (measure(ce, model, splits), {})


def test_a_replayed_bracket_finds_the_same_step_with_bounded_goal_checks():
    workload = get_workload("mnist/fc_64_64_64")
    data, splits = _val(workload, 2000)
    goal = 0.3

    def replay(measure_step):
        torch.manual_seed(0)
        model = workload.build_model(seed=2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sampler = torch.Generator().manual_seed(0)

        def advance(step):
            x, y = data.train.batch(torch.randint(0, data.num_train, (64,), generator=sampler))
            optimizer.zero_grad()
            workload.loss(model(x), y).backward()
            optimizer.step()

        progress = TrialProgress(metric=GOAL_METRIC, goal=goal, maximize=False, stop_at_goal=True, total_steps=200)
        return replay_bracket({0: progress}, list(range(5, 201, 5)), 0, advance, lambda key, step: measure_step(model))[0]

    rows, found = replay(lambda model: measure(workload, model, splits))
    bounded_rows, bounded_found = replay(lambda model: with_bound_flags(*measure_goal(workload, model, splits, goal)))
    assert found is not None and bounded_found == found and len(bounded_rows) == len(rows)
    flagged = [r for r in bounded_rows if GOAL_METRIC + BOUND_SUFFIX in r]
    assert flagged and all(r[GOAL_METRIC + BOUND_SUFFIX] == 1.0 and "val/cross_entropy_error" not in r for r in flagged)
    for exact, bounded in zip(rows, bounded_rows):
        if GOAL_METRIC + BOUND_SUFFIX in bounded:
            assert bounded[GOAL_METRIC] <= exact[GOAL_METRIC]
        else:
            assert bounded == exact
