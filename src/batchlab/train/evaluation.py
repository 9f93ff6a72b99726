"""When a trial evaluates, and what one evaluation measures.

A *measurement* is one evaluation at one step: ``{"step": t, "<split>/<metric>": value, ...}`` with
the release's metric names (``train/cross_entropy_error``, ``val/classification_error``, ...), taken
after ``t`` updates, by ``workload.evaluate`` on each split (the workload caps the training split to
a fixed subset).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from batchlab.errors import BatchlabError

__all__ = [
    "EvaluationPlan", "budgeted_plan", "check_eval_budget", "evaluation_schedule", "every_n_steps", "goal_reached", "measure",
    "subset_splits", "thin_schedule",
]

# Floors of an evaluation budget (see :func:`budgeted_plan`): below these, steps to result and the
# metrics themselves stop being worth measuring, so a budget too small for them is exceeded instead.
MIN_BUDGET_EVALUATIONS = 10
MIN_BUDGET_EXAMPLES = {"train": 250, "val": 1000}


def every_n_steps(total_steps: int, every: int) -> list[int]:
    """A regular schedule: steps ``every, 2*every, ...`` plus ``total_steps`` itself."""
    if every < 1:
        raise BatchlabError(f"evaluation interval must be >= 1 step, got {every}")
    steps = list(range(every, total_steps + 1, every))
    if not steps or steps[-1] != total_steps:
        steps.append(total_steps)
    return steps


def evaluation_schedule(default: Iterable[int], total_steps: int, override: Sequence[int] | None = None) -> list[int]:
    """The sorted, distinct steps at which a trial of ``total_steps`` updates evaluates.

    ``default`` is the workload's schedule (``workload.evaluation_steps(total_steps)``: dense early,
    regular later); ``override`` replaces it. Either way ``total_steps`` is included, so every trial
    that runs its full budget ends with a measurement. Step 0 (before any update) is allowed.

    Raises:
        BatchlabError: a step outside ``0..total_steps`` or not an integer.
    """
    chosen = list(default if override is None else override)
    steps = set()
    for step in chosen:
        try:
            step = operator.index(step)
        except TypeError:
            raise BatchlabError(f"evaluation steps must be integers, got {step!r}") from None
        if not 0 <= step <= total_steps:
            raise BatchlabError(f"evaluation step {step} is out of range; allowed: 0 to {total_steps} (the step budget)")
        steps.add(step)
    steps.add(total_steps)
    return sorted(steps)


def measure(workload, model: torch.nn.Module, splits: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """Evaluate ``model`` on each split, returning ``{"<split>/<metric>": value}`` as Python floats.

    ``splits`` maps a split name (``"train"``, ``"val"``) to its ``(x, y)``. The model is put in eval
    mode under ``torch.no_grad`` and returned to its previous mode afterwards.
    """
    was_training = model.training
    model.eval()
    metrics: dict[str, float] = {}
    try:
        with torch.no_grad():
            for split, (x, y) in splits.items():
                for name, value in workload.evaluate(model, x, y, split=split).items():
                    metrics[name] = float(value)
    finally:
        model.train(was_training)
    return metrics


def goal_reached(value: float, goal: float, maximize: bool) -> bool:
    """Whether a metric value strictly beats the goal (``value < goal``, or ``>`` when maximizing)."""
    if not math.isfinite(value):
        return False
    return value > goal if maximize else value < goal


def thin_schedule(steps: Sequence[int], keep_every: int) -> list[int]:
    """Every ``keep_every``-th step of the sorted schedule ``steps``, counted back from its last step.

    The last step is always kept; a geometric early part with ratio ``r`` becomes one with ratio
    about ``r ** keep_every`` and a regular interval ``I`` becomes ``keep_every * I``, so the
    dense-early / regular-later shape survives.
    """
    if keep_every < 1:
        raise BatchlabError(f"keep_every must be >= 1, got {keep_every}")
    return sorted(steps)[::-1][::keep_every][::-1]


@dataclass(frozen=True)
class EvaluationPlan:
    """When a trial evaluates and on how many examples of each split.

    ``steps``: sorted evaluation steps. ``examples``: ``{split: n}``, each evaluation measures the
    split on its fixed subset of ``n`` examples (:func:`batchlab.workloads.metrics.fixed_subset`: the
    first ``n`` of one seed-0 permutation, so a smaller subset is part of every larger one).
    """

    steps: list[int]
    examples: dict[str, int]

    def evaluated_examples(self) -> int:
        """Examples run through the model over the whole trial (evaluations x examples per evaluation)."""
        return len(self.steps) * sum(self.examples.values())


def check_eval_budget(budget: float) -> float:
    """``budget`` as a float if it is a finite number > 0; BatchlabError otherwise."""
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget) or budget <= 0:
        raise BatchlabError(f"evaluation budget must be a number > 0 (a fraction of the training examples, e.g. 0.1), got {budget!r}")
    return float(budget)


def budgeted_plan(plan: EvaluationPlan, budget: float, batch_size: int, total_steps: int) -> EvaluationPlan:
    """Shrink ``plan`` so that evaluation stays within ``budget`` of training, if it can.

    The budget counts examples: over the trial, evaluations x examples per evaluation must stay at
    most ``budget * batch_size * total_steps`` (the training examples). A training example costs a
    forward and a backward pass (about 3 forward passes), so the evaluation *compute* is then at
    most about ``budget / 3`` of the training compute; measured on CPU, where a training example
    costs 1.5-7 evaluation examples of time (more at small batch sizes), the evaluation *time*
    stays below ``budget`` too.

    The plan is shrunk in this order, each step only as far as needed:

    1. the training-split subset (``train/*`` metrics only describe the fit), down to
       ``MIN_BUDGET_EXAMPLES["train"]``;
    2. the schedule, thinned with :func:`thin_schedule` (same shape, last step kept), down to
       ``MIN_BUDGET_EVALUATIONS`` evaluations. Steps to a result are then resolved to the thinned
       interval: thinning by ``k`` makes a late goal crossing up to ``k`` regular intervals late;
    3. the validation subset, last, because it measures the goal metric: down to
       ``MIN_BUDGET_EXAMPLES["val"]`` (the standard error of an error rate ``p`` measured on ``n``
       examples is ``sqrt(p (1 - p) / n)``: 0.0054 at ``p = 0.03``, ``n = 1000``, against 0.0024 on
       5,000 examples; noise makes the first crossing of a goal early, so smaller subsets bias
       steps to result down).

    Other splits are left whole. When the budget is smaller than these floors allow, the floors
    win and the budget is exceeded. The plan depends only on its arguments (never on timing), so
    the same spec gives the same measurements. At a fixed ``budget`` the plan depends on the batch
    size (small batches train on fewer examples): when step 3 shrank the validation subset, batch
    sizes are compared on goal metrics measured on different subsets; give small batch sizes the
    larger step budgets they need anyway (steps to result grow like 1/B), or a larger budget.
    """
    budget = check_eval_budget(budget)
    allowed = budget * batch_size * total_steps
    steps, examples = list(plan.steps), dict(plan.examples)

    def cost() -> int:
        return len(steps) * sum(examples.values())

    def shrink(split: str) -> None:
        if split not in examples:
            return
        others = sum(n for s, n in examples.items() if s != split)
        target = math.floor(allowed / max(len(steps), 1)) - others
        floor = min(examples[split], MIN_BUDGET_EXAMPLES[split])
        examples[split] = max(floor, min(examples[split], target))

    if cost() <= allowed:
        return EvaluationPlan(steps, examples)
    shrink("train")
    if cost() > allowed:
        fewest = min(len(plan.steps), MIN_BUDGET_EVALUATIONS)
        for keep_every in range(2, len(plan.steps) + 1):
            thinner = thin_schedule(plan.steps, keep_every)
            if len(thinner) < fewest:
                break
            steps = thinner
            if cost() <= allowed:
                break
    if cost() > allowed:
        shrink("val")
    return EvaluationPlan(steps, examples)


def subset_splits(splits: dict[str, tuple[torch.Tensor, torch.Tensor]], examples: dict[str, int]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each split cut once to its fixed evaluation subset of ``examples[split]`` examples (if fewer).

    Uses :func:`batchlab.workloads.metrics.fixed_subset`, the subset the workload's ``evaluate``
    itself takes, so cutting here first gives the same examples in the same order (hence identical
    measurements) while sparing each evaluation the permutation and the gather.
    """
    from batchlab.workloads.metrics import fixed_subset

    cut = {}
    for split, (x, y) in splits.items():
        subset = fixed_subset(len(x), examples.get(split))
        cut[split] = (x, y) if subset is None else (x.index_select(0, subset), y.index_select(0, subset))
    return cut
