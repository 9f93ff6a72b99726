"""The budget-growth rule: give a study more steps when its trials ran out of steps before the goal.

A study (one batch size) where no trial reached the goal, and some trial ran its whole budget
(status COMPLETE), says nothing about its steps to result except "more than the budget": its point
is censored. With ``grow_budget`` the sweep re-runs the same search-space points with the budget
multiplied by ``grow_factor``, at most ``max_budget_growths`` times (docs/methods.md, "Sweeps").

What counts as evidence: only COMPLETE trials that did not reach the goal. A trial that diverged
(INFEASIBLE) would not be helped by more steps; a trial that stopped at the goal (STOPPED_AT_GOAL)
stopped *before* its budget, so it is no evidence that the budget was too small; both are ignored.
A study where any trial reached the goal is not grown.

What a grown round stretches: the step budget, and with it every step-counted hyperparameter of the
points, ``learning_rate_decay_steps`` and ``warmup_steps`` (and their search-space ranges), by the
same factor (:func:`batchlab.sweep.plan.stretch_point`), so a linear decay ends at the same fraction
of the grown budget as of the first one, not inside the old budget. A grown round is a study of its
own: its definition records ``budget_round`` and ``schedule_stretch``, and its trials get their own
keys and id block.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Statuses that show a trial ran its whole step budget.
RAN_ITS_BUDGET = ("COMPLETE",)


def ran_out_of_steps(statuses_and_goals: Iterable[tuple[str, int | None]]) -> bool:
    """True when no trial reached the goal and at least one trial ran its whole budget (COMPLETE).

    ``statuses_and_goals``: ``(status, steps_to_goal)`` per trial of the study. INFEASIBLE and
    STOPPED_AT_GOAL trials are never evidence for growth (see the module docstring).
    """
    outcomes = list(statuses_and_goals)
    if not outcomes or any(goal is not None for _, goal in outcomes):
        return False
    return any(status in RAN_ITS_BUDGET for status, _ in outcomes)
