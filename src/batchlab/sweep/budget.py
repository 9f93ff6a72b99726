"""The budget-growth rule: give a study more steps when every trial ran out of steps before the goal.

A study (one batch size) whose trials all ended without reaching the goal, and not all by
diverging, says nothing about its steps to result except "more than the budget": its point is
censored. With ``grow_budget`` the sweep re-runs the same search-space points with the budget
multiplied by ``grow_factor``, at most ``max_budget_growths`` times; the grown trials get new keys
and ids (``trial_id = round * MAX_TRIALS_PER_STUDY + point``), and the output says so.
"""

from __future__ import annotations

from collections.abc import Iterable


def ran_out_of_steps(statuses_and_goals: Iterable[tuple[str, int | None]]) -> bool:
    """True when no trial reached the goal and at least one trial finished its budget.

    ``statuses_and_goals``: ``(status, steps_to_goal)`` per trial of the study. Trials that all
    diverged (INFEASIBLE) do not count as running out of steps: more steps would not help them.
    """
    outcomes = list(statuses_and_goals)
    if not outcomes or any(goal is not None for _, goal in outcomes):
        return False
    return any(status == "COMPLETE" for status, _ in outcomes)
