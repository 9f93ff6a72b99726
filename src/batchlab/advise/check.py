"""The check run: the last step of ``batchlab advise`` trains the recommendation once more.

:func:`check_recommendation` runs ONE trial (:func:`batchlab.train.trial.prepare_trial` and
:func:`batchlab.train.trial.run_prepared`, as ``run_trial`` does) at the recommended batch size and
hyperparameters, with a seed no study used, stopping at the goal (``stop_at_goal``), without a store:
its measurements go to the advice record only, so the unit's statistics never see it. It reports
whether that trial reached the goal and whether its steps to the goal fall in the interval the
recommendation predicted (docs/methods.md, "The check run").

Counting (as a trial counts them, :mod:`batchlab.train.trial`):

* ``steps`` is the trial's steps to the goal: the first evaluation step whose goal metric beats the
  goal; ``steps_lower`` the evaluation before it. The goal was first met in the bracket
  ``(steps_lower, steps]``, whose width is at most ``resolution * steps_lower`` (or one step).
* ``within`` compares that bracket with the prediction ``[predicted_low, predicted_high]``: True when
  they overlap (``steps >= predicted_low`` and ``steps_lower < predicted_high``; a bracket of one
  point, ``steps_lower == steps``, must lie inside), False when they do not, ``None`` when the goal was
  not reached within the budget or there is no prediction (``predicted_low`` and ``predicted_high``
  both ``None``): nothing to compare.
* ``examples`` = optimizer updates actually run x batch size: the live run's updates up to the
  evaluation that stopped it, plus the updates of the replay that refined the goal's bracket
  (:mod:`batchlab.train.trial`, ``refine="replay"``). Evaluations are not counted.
* ``seconds``: wall clock of the whole check, building the trial (data, model) included.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from batchlab.errors import BatchlabError

__all__ = ["CheckResult", "check_recommendation", "updates_run"]


def _fmt(value: float) -> str:
    """A predicted step count for a line of text: ``inf``, whole steps from 100 up, else 3 digits."""
    if math.isinf(value):
        return "inf"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


@dataclass
class CheckResult:
    """What the check run did (see the module docstring for every field's counting).

    ``batch_size``, ``seed``, ``hyperparameters``: the trial's; ``steps_budget``: its step budget;
    ``reached``: whether it met the goal within the budget; ``steps``/``steps_lower``: the first
    evaluation step meeting the goal and the evaluation before it (``None`` when not reached);
    ``predicted_low``/``predicted_high``: the predicted interval of steps to the goal
    (``predicted_high`` may be ``inf``: unbounded above; both ``None``: there was no prediction);
    ``within``: the bracket overlaps the prediction (``None`` when not reached or not predicted); ``examples``: updates run x batch size; ``seconds``: wall
    clock; ``measurements``: ``[step, value]`` of the goal metric at every evaluation that measured its
    value (a goal check that stopped once the outcome was decided holds a bound, not a value, and is
    left out); ``metric``/``goal``/``maximize``: the goal; ``status``: the trial's status
    (``STOPPED_AT_GOAL``, ``COMPLETE``, ``INFEASIBLE``); ``device``: where it trained."""

    batch_size: int
    seed: int
    hyperparameters: dict[str, Any]
    steps_budget: int
    reached: bool
    steps: int | None
    steps_lower: int | None
    predicted_low: float | None
    predicted_high: float | None
    within: bool | None
    examples: int
    seconds: float
    measurements: list[list] = field(default_factory=list)
    metric: str = ""
    goal: float = math.nan
    maximize: bool = False
    status: str = ""
    device: str = "cpu"

    def text(self) -> str:
        """One line for the command line, e.g. ``check: B=128, seed 1000003: reached the goal at step
        1450 (bracket (1380, 1450]), inside the predicted [1200, 1900]``."""
        head = f"check: B={self.batch_size}, seed {self.seed}: "
        if self.predicted_low is None:
            predicted = "none"
        else:
            predicted = f"[{_fmt(self.predicted_low)}, {_fmt(self.predicted_high)}]"
        if not self.reached:
            why = "diverged (INFEASIBLE) at step {}; ".format(self.examples // self.batch_size) if self.status == "INFEASIBLE" else ""
            return f"{head}{why}not reached within the budget of {self.steps_budget} steps (predicted {predicted})"
        reached = f"{head}reached the goal at step {self.steps} (bracket ({self.steps_lower}, {self.steps}])"
        if self.predicted_low is None:
            return f"{reached}; no predicted interval to compare with"
        return f"{reached}, {'inside' if self.within else 'outside'} the predicted {predicted}"

    def to_dict(self) -> dict:
        """JSON-ready (an unbounded ``predicted_high`` is written as ``None``; with no prediction both
        ends are ``None``), with :meth:`text` as ``"text"``
        (read by nothing: :meth:`from_dict` ignores it)."""
        return {
            "batch_size": self.batch_size, "seed": self.seed, "hyperparameters": dict(self.hyperparameters),
            "steps_budget": self.steps_budget, "reached": self.reached, "steps": self.steps,
            "steps_lower": self.steps_lower, "predicted_low": self.predicted_low,
            "predicted_high": None if self.predicted_high is None or math.isinf(self.predicted_high) else self.predicted_high,
            "within": self.within, "examples": self.examples, "seconds": self.seconds,
            "measurements": [[int(s), float(v)] for s, v in self.measurements], "metric": self.metric,
            "goal": None if math.isnan(self.goal) else self.goal, "maximize": self.maximize, "status": self.status,
            "device": self.device, "text": self.text(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "CheckResult":
        def optional_int(value: Any) -> int | None:
            return None if value is None else int(value)

        low, high, goal = data.get("predicted_low"), data.get("predicted_high"), data.get("goal")
        within = data.get("within")
        return cls(
            batch_size=int(data["batch_size"]), seed=int(data["seed"]), hyperparameters=dict(data.get("hyperparameters") or {}),
            steps_budget=int(data["steps_budget"]), reached=bool(data["reached"]), steps=optional_int(data.get("steps")),
            steps_lower=optional_int(data.get("steps_lower")), predicted_low=None if low is None else float(low),
            predicted_high=(None if low is None else math.inf) if high is None else float(high), within=None if within is None else bool(within),
            examples=int(data["examples"]), seconds=float(data["seconds"]),
            measurements=[[int(s), float(v)] for s, v in data.get("measurements", [])], metric=str(data.get("metric", "")),
            goal=math.nan if goal is None else float(goal), maximize=bool(data.get("maximize", False)),
            status=str(data.get("status", "")), device=str(data.get("device", "cpu")),
        )


def _prediction(low: Any, high: Any) -> tuple[float | None, float | None]:
    """``(low, high)`` as floats, ``0 <= low <= high`` (``high`` may be ``inf``; ``high`` ``None``:
    unbounded above, ``low`` ``None``: 0); ``(None, None)``: no prediction."""
    from batchlab.finite import finite_real

    if low is None and high is None:
        return None, None
    low = 0.0 if low is None else low
    high = math.inf if high is None else high
    if not finite_real(low) or low < 0:
        raise BatchlabError(f"predicted low must be a finite number of steps >= 0, got {low!r}")
    if isinstance(high, bool) or not (finite_real(high) or high == math.inf) or high < low:
        raise BatchlabError(f"predicted high must be a number of steps >= predicted low ({low}) or inf, got {high!r}")
    return float(low), float(high)


def within_prediction(steps: int, steps_lower: int, low: float, high: float) -> bool:
    """Whether the bracket ``(steps_lower, steps]`` of the first step meeting the goal overlaps
    ``[low, high]`` (a bracket of one point, ``steps_lower == steps``, must lie inside it)."""
    if steps_lower >= steps:
        return low <= steps <= high
    return steps >= low and steps_lower < high


def updates_run(prepared: Any, result: Any) -> int:
    """Optimizer updates a trial of ``prepared`` (run with ``refine="replay"``) actually ran to give
    ``result``: the live run's (up to the evaluation that stopped it or the budget) plus the replay's
    (from the full evaluation before the one that first met the goal, through the last resolution step
    it measured). ``result.steps`` counts only the updates up to the first step meeting the goal."""
    if result.steps_to_goal is None:
        return int(result.steps)
    schedule = sorted(int(s) for s in prepared.schedule)
    evaluated = set(schedule)
    found = int(result.steps_to_goal)
    # the live evaluation that first met the goal: ``found`` itself, or the next one after a replayed step
    live = found if found in evaluated else min((s for s in schedule if s > found), default=found)
    begin = max((s for s in schedule if s < live), default=0)
    replayed = [int(row["step"]) for row in result.measurements
                if int(row["step"]) not in evaluated and (begin < int(row["step"]) < live or int(row["step"]) == begin == 0)]
    return live + (max(replayed) - begin if replayed else 0)


def check_recommendation(
    workload: Any,
    optimizer: str,
    batch_size: int,
    hyperparameters: dict[str, Any],
    *,
    steps: int,
    predicted_low: float,
    predicted_high: float,
    seed: int,
    device: str = "auto",
    train_examples: int | None = None,
    goal: float | None = None,
    evaluations: int | None = None,
    resolution: float = 0.05,
    data_seed: int = 0,
) -> CheckResult:
    """Train ``batch_size`` with ``hyperparameters`` once, with ``seed``, and compare its steps to the goal
    with the predicted ``[predicted_low, predicted_high]``.

    Args:
        workload, optimizer, batch_size, hyperparameters: the recommendation (as a trial's
            :class:`batchlab.train.trial.TrialSpec`).
        steps: the trial's step budget (updates); it stops at the first evaluation meeting the goal.
        predicted_low, predicted_high: the predicted interval of steps to the goal (``predicted_high``
            may be ``inf`` or ``None``: unbounded above; both ``None``: no prediction, ``within`` is then
            ``None``).
        seed: model initialisation and batch order; give one no study of the unit used.
        device, train_examples, goal, evaluations, resolution, data_seed: as the studies' trials
            (``goal``: ``None`` = the workload's goal; ``data_seed``: which examples form the training
            subset, the studies' own).

    Returns:
        :class:`CheckResult` (nothing is written anywhere).

    Raises:
        BatchlabError: a predicted interval that is not ``0 <= low <= high``, or anything
            :func:`batchlab.train.trial.prepare_trial` rejects; before anything runs.
    """
    from batchlab.train.trial import TrialSpec, prepare_trial, run_prepared

    low, high = _prediction(predicted_low, predicted_high)
    started = time.perf_counter()
    spec = TrialSpec(workload=workload, optimizer=optimizer, batch_size=batch_size, hyperparameters=hyperparameters,
                     steps=steps, train_examples=train_examples, seed=seed, stop_at_goal=True, data_seed=data_seed,
                     resolution=resolution, evaluations=evaluations, goal=goal, device=device, refine="replay")
    prepared = prepare_trial(spec)
    result = run_prepared(prepared)
    seconds = time.perf_counter() - started
    from batchlab.store.schema import BOUND_SUFFIX

    metric = result.metric
    measurements = sorted([int(row["step"]), float(row[metric])] for row in result.measurements
                          if metric in row and metric + BOUND_SUFFIX not in row)
    reached = result.steps_to_goal is not None
    predicted = reached and low is not None
    within = within_prediction(result.steps_to_goal, result.steps_lower, low, high) if predicted else None
    return CheckResult(
        batch_size=int(batch_size), seed=int(seed), hyperparameters=dict(hyperparameters), steps_budget=int(prepared.steps),
        reached=reached, steps=result.steps_to_goal, steps_lower=result.steps_lower if reached else None,
        predicted_low=low, predicted_high=high, within=within,
        examples=updates_run(prepared, result) * int(batch_size), seconds=seconds, measurements=measurements,
        metric=metric, goal=float(result.goal), maximize=bool(result.maximize), status=result.status,
        device=str(result.device),
    )
