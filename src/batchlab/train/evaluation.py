"""When a trial evaluates, and what one evaluation measures.

A *measurement* is one evaluation at one step: ``{"step": t, "<split>/<metric>": value, ...}`` with
the release's metric names (``train/cross_entropy_error``, ``val/classification_error``, ...), taken
after ``t`` updates, by ``workload.evaluate`` on each split (the workload caps the training split to
a fixed subset). At a *full* step every split is measured; at a *goal* step (the resolution steps of
:mod:`batchlab.workloads.schedule`) only the goal metric's split (``val``), which gives the goal
metric and the other metrics of that split from the same forward passes. See docs/methods.md,
"Evaluation schedule and resolution".

At a goal-only step the only question is whether the goal metric beats the goal: :func:`measure_goal`
answers it and stops the pass over the goal split as soon as the answer is decided (for bounded
metrics: classification error), returning a *bound* instead of the value. Its row
(:func:`with_bound_flags`) holds the bound under the metric's name and the flag ``+1.0`` (lower
bound) or ``-1.0`` (upper bound) under ``<metric>:bound`` (:data:`BOUND_SUFFIX`); comparing the
bound to the goal (:func:`goal_reached`) gives the true value's outcome.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from batchlab.store.schema import BOUND_SUFFIX  # "<metric>:bound": the flag row of a bounded value
from batchlab.errors import BatchlabError

__all__ = [
    "BOUND_SUFFIX", "EvaluationPlan", "budgeted_plan", "check_eval_budget", "evaluation_schedule", "every_n_steps", "goal_reached",
    "measure", "measure_goal", "bracket", "subset_splits", "thin_schedule", "with_bound_flags",
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


def measure(workload, model: torch.nn.Module, splits: dict[str, Any]) -> dict[str, float]:
    """Evaluate ``model`` on each split, returning ``{"<split>/<metric>": value}`` as Python floats.

    ``splits`` maps a split name (``"train"``, ``"val"``) to its data: a
    :class:`batchlab.workloads.data.DataSplit` or an ``(x, y)`` pair, passed to
    ``workload.evaluate(model, data, split=name)``. The model is put in eval mode under
    ``torch.inference_mode`` and returned to its previous mode afterwards.
    """
    was_training = model.training
    model.eval()
    metrics: dict[str, float] = {}
    try:
        with torch.inference_mode():
            for split, data in splits.items():
                for name, value in workload.evaluate(model, data, split=split).items():
                    metrics[name] = float(value)
    finally:
        model.train(was_training)
    return metrics


def measure_goal(workload, model: torch.nn.Module, splits: dict[str, Any], goal: float) -> tuple[dict[str, float], dict[str, float]]:
    """Measure a goal-only step: :func:`measure`, except that the goal metric's split stops as soon as
    whether ``workload.metric`` beats ``goal`` (:func:`goal_reached`, ``workload.maximize``) is decided.

    Returns ``(metrics, bounds)``. ``bounds`` is ``{}`` when nothing was stopped early; then
    ``metrics == measure(workload, model, splits)``. When the goal split's pass stopped early,
    ``metrics`` holds, for that split, only the goal metric, whose value is a bound, and
    ``bounds = {workload.metric: +1.0 or -1.0}`` (``+1.0``: the true value is >= it; ``-1.0``: <=);
    the split's other metrics are left out (not fully computed). The bound is the end of the
    interval that decided the outcome, so ``goal_reached(metrics[workload.metric], goal, maximize)``
    equals ``goal_reached`` of the true value: minimizing, an upper bound ``< goal`` (met) or a lower
    bound ``>= goal`` (not met; a value equal to the goal is not met); maximizing, the mirror image.

    Early stopping (:func:`batchlab.workloads.metrics.check_goal_split`: the same batches, in the same
    fixed order, as the full pass) applies when the goal metric is one of the task's
    ``bounded_metrics`` (built in: ``classification_error`` of the classification and language-model
    tasks), the split is held in memory (a tensor split, as prepared trials hold them) and the
    workload uses :meth:`Workload.evaluate` itself (a subclass overriding it is measured in full);
    any other split or metric is measured in full, as :func:`measure` does. Eval mode and
    ``torch.inference_mode`` as in :func:`measure`.
    """
    from batchlab.workloads.base import Workload
    from batchlab.workloads.data import as_split
    from batchlab.workloads.metrics import check_goal_split

    goal_split, goal_metric = workload.metric.split("/", 1)
    bounded = goal_metric in workload.task.bounded_metrics and type(workload).evaluate is Workload.evaluate
    was_training = model.training
    model.eval()
    metrics: dict[str, float] = {}
    bounds: dict[str, float] = {}
    try:
        with torch.inference_mode():
            for split, data in splits.items():
                if bounded and split == goal_split:
                    values, flags = check_goal_split(
                        model, as_split(data, split), workload.task.batch_sums, goal_metric, goal, workload.maximize,
                        split=split, batch_size=workload.eval_batch_size, max_examples=workload.eval_examples.get(split))
                    bounds.update(flags)
                else:
                    values = workload.evaluate(model, data, split=split)
                for name, value in values.items():
                    metrics[name] = float(value)
    finally:
        model.train(was_training)
    return metrics, bounds


def with_bound_flags(metrics: dict[str, float], bounds: dict[str, float]) -> dict[str, float]:
    """The measurement row of :func:`measure_goal`'s result: ``metrics`` plus, for each bounded
    metric, its flag under ``<metric>:bound`` (:data:`BOUND_SUFFIX`)."""
    return {**metrics, **{f"{name}{BOUND_SUFFIX}": float(flag) for name, flag in bounds.items()}}


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


def bracket(steps_evaluated: Sequence[int], reached: int | None) -> int | None:
    """The evaluation step just before ``reached`` among ``steps_evaluated`` (0 if none): the lower end
    of the bracket ``(steps_lower, steps]`` in which the goal was first met. ``None`` if not reached."""
    if reached is None:
        return None
    return max((int(s) for s in steps_evaluated if int(s) < reached), default=0)


@dataclass(frozen=True)
class EvaluationPlan:
    """When a trial evaluates and on how many examples of each split.

    ``steps``: sorted full evaluation steps (every split measured). ``examples``: ``{split: n}``, each
    evaluation measures the split on its fixed subset of ``n`` examples
    (:func:`batchlab.workloads.metrics.fixed_subset`: the first ``n`` of one seed-0 permutation, so a
    smaller subset is part of every larger one). ``goal_steps``: the resolution steps, at which only
    ``goal_split`` is measured where they are not full steps.
    """

    steps: list[int]
    examples: dict[str, int]
    goal_steps: list[int] = field(default_factory=list)
    goal_split: str = "val"

    def goal_only_steps(self) -> list[int]:
        """Resolution steps that are not full steps (only ``goal_split`` measured there)."""
        full = set(self.steps)
        return sorted(s for s in set(self.goal_steps) if s not in full)

    def all_steps(self) -> list[int]:
        """Every evaluation step, sorted."""
        return sorted(set(self.steps) | set(self.goal_steps))

    def evaluated_examples(self) -> int:
        """Examples run through the model over the whole trial (evaluations x examples per evaluation)."""
        return len(self.steps) * sum(self.examples.values()) + len(self.goal_only_steps()) * self.examples.get(self.goal_split, 0)


def check_eval_budget(budget: float) -> float:
    """``budget`` as a float if it is a finite number > 0; BatchlabError otherwise."""
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget) or budget <= 0:
        raise BatchlabError(f"evaluation budget must be a number > 0 (a fraction of the training examples, e.g. 0.1), got {budget!r}")
    return float(budget)


def budgeted_plan(plan: EvaluationPlan, budget: float, batch_size: int, total_steps: int) -> EvaluationPlan:
    """Shrink ``plan`` so that evaluation stays within ``budget`` of training, if it can.

    The budget counts examples: over the trial, evaluations x examples per evaluation (the goal
    split's examples alone at goal-only steps) must stay at most ``budget * batch_size * total_steps``
    (the training examples). A training example costs a forward and a backward pass (about 3 forward
    passes), so the evaluation *compute* is then at most about ``budget / 3`` of the training
    compute; measured on CPU, where a training example costs 1.5-7 evaluation examples of time (more
    at small batch sizes), the evaluation *time* stays below ``budget`` too.

    The plan is shrunk in this order, each step only as far as needed:

    1. the training-split subset (``train/*`` metrics only describe the fit), down to
       ``MIN_BUDGET_EXAMPLES["train"]``;
    2. the full schedule, thinned with :func:`thin_schedule` (same shape, last step kept), down to
       ``MIN_BUDGET_EVALUATIONS`` evaluations (where goal steps exist, the full steps only describe
       the curves: steps to result are read from the goal steps);
    3. the goal (resolution) steps, thinned the same way down to ``MIN_BUDGET_EVALUATIONS``: thinning
       by ``k`` turns a relative spacing ``r`` into about ``(1 + r) ** k - 1`` (and every step into
       every ``k`` steps); the resolution actually kept is
       :func:`batchlab.workloads.schedule.schedule_resolution` of the plan's steps. Without goal steps
       (explicit steps), a late goal crossing read from the thinned full steps is up to ``k`` regular
       intervals late;
    4. the validation subset, last, because it measures the goal metric: down to
       ``MIN_BUDGET_EXAMPLES["val"]`` (the standard error of an error rate ``p`` measured on ``n``
       examples is ``sqrt(p (1 - p) / n)``: 0.0054 at ``p = 0.03``, ``n = 1000``, against 0.0024 on
       5,000 examples; noise makes the first crossing of a goal early, so smaller subsets bias
       steps to result down).

    Other splits are left whole. When the budget is smaller than these floors allow, the floors
    win and the budget is exceeded. The plan depends only on its arguments (never on timing), so
    the same spec gives the same measurements. At a fixed ``budget`` the plan depends on the batch
    size (small batches train on fewer examples): when step 3 or 4 acted, batch sizes are compared at
    different resolutions or on goal metrics measured on different subsets; give small batch sizes
    the larger step budgets they need anyway (steps to result grow like 1/B), or a larger budget.
    """
    budget = check_eval_budget(budget)
    allowed = budget * batch_size * total_steps
    steps, examples, goal_steps = list(plan.steps), dict(plan.examples), list(plan.goal_steps)

    def current() -> EvaluationPlan:
        return EvaluationPlan(steps, dict(examples), list(goal_steps), plan.goal_split)

    def cost() -> int:
        return current().evaluated_examples()

    def shrink(split: str) -> None:
        if split not in examples:
            return
        per_example = len(steps) + (len(current().goal_only_steps()) if split == plan.goal_split else 0)
        kept = examples[split]
        examples[split] = 0
        others = cost()  # everything but this split
        examples[split] = kept
        target = math.floor((allowed - others) / max(per_example, 1))
        floor = min(examples[split], MIN_BUDGET_EXAMPLES.get(split, examples[split]))
        examples[split] = max(floor, min(examples[split], target))

    if cost() <= allowed:
        return current()
    shrink("train")
    for name in ("steps", "goal_steps"):
        original = list(getattr(plan, name))
        if cost() <= allowed or not original:
            continue
        fewest = min(len(original), MIN_BUDGET_EVALUATIONS)
        for keep_every in range(2, len(original) + 1):
            thinner = thin_schedule(original, keep_every)
            if len(thinner) < fewest:
                break
            if name == "steps":
                steps = thinner
            else:
                goal_steps = thinner
            if cost() <= allowed:
                break
    if cost() > allowed:
        shrink("val")
    return current()


def subset_splits(splits: dict[str, Any], examples: dict[str, int]) -> dict[str, Any]:
    """Each split (a :class:`batchlab.workloads.data.DataSplit` or an ``(x, y)`` pair) cut once to its
    fixed evaluation subset of ``examples[split]`` examples (if fewer), as a ``DataSplit``.

    Uses :func:`batchlab.workloads.metrics.fixed_subset`, the subset the workload's ``evaluate``
    itself takes, so cutting here first gives the same examples in the same order (hence identical
    measurements) while sparing each evaluation the permutation and the gather.
    """
    from batchlab.workloads.data import as_split
    from batchlab.workloads.metrics import fixed_subset

    cut = {}
    for name, data in splits.items():
        split = as_split(data, name)
        subset = fixed_subset(len(split), examples.get(name))
        cut[name] = split if subset is None else split.subset(subset)
    return cut
