"""What the store measured of one unit, read once the way ``batchlab analyze`` reads it (docs/methods.md,
"The recommendation").

:func:`unit_points` is the one place ``batchlab advise`` reads its unit after every round: the unit's
goal, each measured batch size's steps to result with its resolution bracket and best trial, the
censored S(B) fit with its intervals (:func:`batchlab.analysis.bootstrap.bootstrap_critical_batch_size`
on :func:`batchlab.analysis.bootstrap.store_fit_inputs`, exactly what
:func:`~batchlab.analysis.bootstrap.critical_batch_size_with_intervals` fits), the trials' own scatter
(:func:`batchlab.analysis.scatter.scatter_from_trials` on the same inputs, so the same estimate the
fit used) and the compute the unit's trials spent. Nothing is written to the store.

Units: steps count optimizer updates; examples are updates x batch size; a trial's compute is the
store's ``trials.steps`` (the updates it trained, whatever its status) times its batch size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchlab.errors import BatchlabError

__all__ = ["MeasuredPoint", "UnitPoints", "find_unit", "unit_points"]


def plain(value: Any) -> Any:
    """``value`` as plain JSON: numpy scalars as Python numbers, tuples as lists, non-finite floats as
    ``None``, mapping keys as strings."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (TypeError, ValueError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


@dataclass(frozen=True)
class MeasuredPoint:
    """One measured batch size of the unit.

    Attributes:
        batch_size: examples per update.
        reached: whether any selected trial met the goal.
        steps: the steps to result: the best of the K selected trials' first evaluation step meeting
            the goal (updates; ``None`` when not reached).
        steps_lower: the resolution bracket's lower end: the goal was first met after more than
            ``steps_lower`` and at most ``steps`` updates (``None`` when not reached).
        censored_at: not reached: the steps to result exceeds this (the smallest last evaluated step).
        n_trials: K, the selected trials (statuses COMPLETE, STOPPED_AT_GOAL, RACED).
        n_reached: how many of them met the goal.
        best_hyperparameters: the best trial's hyperparameters (``{}`` when not reached).
        best_trial_id: the best trial (ties to the lower id; ``None`` when not reached).
        budget_steps: the study's step budget (its definition's ``train_steps``; ``None``: unknown).
        examples_spent: sum of ``steps x batch_size`` over every trial of the study, whatever its status.
        trials_run: every stored trial of the study at this batch size, whatever its status.
        study_id: the analysed study at this batch size (``None`` when the store records none).
    """

    batch_size: int
    reached: bool
    steps: int | None
    steps_lower: int | None
    censored_at: int | None
    n_trials: int
    n_reached: int
    best_hyperparameters: dict = field(default_factory=dict)
    best_trial_id: int | None = None
    budget_steps: int | None = None
    examples_spent: int = 0
    trials_run: int = 0
    study_id: str | None = None

    def __getitem__(self, key: str) -> Any:
        """Dict-style read of a field (``point["batch_size"]``), as the point's :meth:`to_dict` has it."""
        if key not in self.__dataclass_fields__:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default) if key in self.__dataclass_fields__ else default

    def to_dict(self) -> dict:
        return plain({"batch_size": self.batch_size, "reached": self.reached, "steps": self.steps,
                      "steps_lower": self.steps_lower, "censored_at": self.censored_at, "n_trials": self.n_trials,
                      "n_reached": self.n_reached, "best_hyperparameters": dict(self.best_hyperparameters),
                      "best_trial_id": self.best_trial_id, "budget_steps": self.budget_steps,
                      "examples_spent": self.examples_spent, "trials_run": self.trials_run,
                      "study_id": self.study_id})

    @classmethod
    def from_dict(cls, data: dict) -> "MeasuredPoint":
        return cls(batch_size=int(data["batch_size"]), reached=bool(data["reached"]), steps=data.get("steps"),
                   steps_lower=data.get("steps_lower"), censored_at=data.get("censored_at"),
                   n_trials=int(data.get("n_trials") or 0), n_reached=int(data.get("n_reached") or 0),
                   best_hyperparameters=dict(data.get("best_hyperparameters") or {}),
                   best_trial_id=data.get("best_trial_id"), budget_steps=data.get("budget_steps"),
                   examples_spent=int(data.get("examples_spent") or 0), trials_run=int(data.get("trials_run") or 0),
                   study_id=data.get("study_id"))


@dataclass
class UnitPoints:
    """What the store measured of one unit (module docstring).

    Attributes:
        unit: the unit's name, ``dataset/model/optimizer [group]`` (:attr:`batchlab.analysis.units.Unit.name`).
        goal: ``{"metric", "goal", "maximize", "source"}`` (:func:`batchlab.analysis.units.unit_goal`).
        points: one :class:`MeasuredPoint` per measured batch size, increasing.
        estimate: :meth:`CriticalBatchSizeEstimate.to_dict` of the unit's fit, or ``None`` (then
            ``estimate_reason`` says why: fewer than two reached batch sizes, ...).
        b_crit: ``{"value", "low", "high"}`` of ``mccandlish_b_crit`` at ``level`` (``None`` entries:
            no fit, infinite or unbounded).
        scatter: :meth:`ScatterEstimate.to_dict` of the trials' scatter the fit used, or ``None`` (no
            study with two reached trials).
        best_of_k_sd: ``{batch_size: theta / K}``, each batch size's best-of-K sd in log steps under the
            scatter model (``None`` without a scatter).
        trials, examples_spent: the unit's analysed trials and the sum of their ``steps x batch_size``
            (:func:`batchlab.analysis.units.unit_examples`).
        level, tolerance: the fit's interval level and regime tolerance.
        max_trials: the trial-count rule used (``"auto"``, else ``None`` = every trial).
        fit_inputs: the keyword inputs of the fit (:func:`~batchlab.analysis.bootstrap.store_fit_inputs`),
            for a caller that refits with changes; not part of :meth:`to_dict`.
    """

    unit: str
    goal: dict
    points: list[MeasuredPoint]
    estimate: dict | None = None
    estimate_reason: str = ""
    b_crit: dict = field(default_factory=lambda: {"value": None, "low": None, "high": None})
    scatter: dict | None = None
    best_of_k_sd: dict[int, float] | None = None
    trials: int = 0
    examples_spent: int = 0
    level: float = 0.9
    tolerance: float = 0.1
    max_trials: str | None = "auto"
    fit_inputs: dict | None = field(default=None, repr=False, compare=False)

    def point(self, batch_size: int) -> MeasuredPoint | None:
        """The measured point at ``batch_size`` (``None``: not measured)."""
        return next((p for p in self.points if p.batch_size == int(batch_size)), None)

    @property
    def batch_sizes(self) -> list[int]:
        return [p.batch_size for p in self.points]

    @property
    def reached(self) -> list[MeasuredPoint]:
        """The measured points whose trials met the goal, increasing in batch size."""
        return [p for p in self.points if p.reached and p.steps is not None]

    def sd_at(self, batch_size: int) -> float | None:
        """The best-of-K sd (log steps) at ``batch_size``; ``None`` without a scatter or trials there."""
        if self.best_of_k_sd is None:
            return None
        value = self.best_of_k_sd.get(int(batch_size))
        return None if value is None else float(value)

    @property
    def tail_scale(self) -> float | None:
        """The scatter model's tail scale theta of one trial's log steps (``None`` without a scatter)."""
        return None if self.scatter is None else self.scatter.get("tail_scale")

    def to_dict(self) -> dict:
        return plain({"unit": self.unit, "goal": self.goal, "points": [p.to_dict() for p in self.points],
                      "estimate": self.estimate, "estimate_reason": self.estimate_reason, "b_crit": self.b_crit,
                      "scatter": self.scatter,
                      "best_of_k_sd": None if self.best_of_k_sd is None else
                      {str(b): s for b, s in sorted(self.best_of_k_sd.items())},
                      "trials": self.trials, "examples_spent": self.examples_spent, "level": self.level,
                      "tolerance": self.tolerance, "max_trials": self.max_trials})

    @classmethod
    def from_dict(cls, data: dict) -> "UnitPoints":
        sd = data.get("best_of_k_sd")
        return cls(unit=data["unit"], goal=dict(data.get("goal") or {}),
                   points=[MeasuredPoint.from_dict(p) for p in data.get("points") or []],
                   estimate=data.get("estimate"), estimate_reason=data.get("estimate_reason") or "",
                   b_crit=dict(data.get("b_crit") or {"value": None, "low": None, "high": None}),
                   scatter=data.get("scatter"),
                   best_of_k_sd=None if sd is None else {int(b): float(s) for b, s in sd.items()},
                   trials=int(data.get("trials") or 0), examples_spent=int(data.get("examples_spent") or 0),
                   level=float(data.get("level", 0.9)), tolerance=float(data.get("tolerance", 0.1)),
                   max_trials=data.get("max_trials"))


def find_unit(units, unit_name: str | None = None, *, workload: str | None = None, sweep: str | None = None,
              device: str | None = None):
    """The unit called ``unit_name`` (:attr:`Unit.name`), or the one of store workload ``workload``
    whose group is ``sweep <sweep>`` (with ``device``, a device type: exactly that device's group, ``sweep <id>``
    on the CPU and ``sweep <id> <type>`` elsewhere; without it any device's, when only one matches).

    Raises:
        BatchlabError: neither a name nor workload and sweep given, or no (or more than one) unit
            matches; the message lists the store's units.
    """
    units = list(units)
    names = ", ".join(u.name for u in units) or "none"
    if unit_name is not None:
        found = [u for u in units if u.name == unit_name]
        if not found:
            raise BatchlabError(f"no unit {unit_name!r} in the store; allowed: {names}")
        return found[0]
    if workload is None or sweep is None:
        raise BatchlabError("unit_points needs a unit name, or a store workload and a sweep id")
    if device is not None:  # the group of that device type only (batchlab.analysis.units: "sweep <id> <type>")
        group = f"sweep {sweep}" if device == "cpu" else f"sweep {sweep} {device}"
        found = [u for u in units if u.workload == workload and u.group == group]
    else:
        found = [u for u in units if u.workload == workload and (u.group == f"sweep {sweep}"
                                                                or u.group.startswith(f"sweep {sweep} "))]
    if len(found) != 1:
        what = "no unit" if not found else f"{len(found)} units"
        raise BatchlabError(f"{what} of workload {workload!r} with sweep {sweep!r} in the store; allowed: {names}")
    return found[0]


def unit_points(store_path: str | Path, unit_name: str | None = None, *, workload: str | None = None,
                sweep: str | None = None, device: str | None = None, level: float = 0.9, n_boot: int = 200,
                seed: int = 0, tolerance: float = 0.1) -> UnitPoints:
    """Read one unit of the store at ``store_path`` as ``batchlab analyze`` does (module docstring).

    The unit: ``unit_name``, or ``workload`` (``dataset/model/optimizer``) with ``sweep`` (a sweep id)
    (:func:`find_unit`). Its goal is :func:`batchlab.analysis.units.unit_goal`; the trials are selected
    with the trial-count rule ``"auto"``, else every trial (as ``batchlab predict`` does). The fit
    (``n_boot`` resampling replicates for the regime shares, ``seed``, intervals at ``level``,
    regime ``tolerance``) is left out, with its reason in ``estimate_reason``, when it cannot be made
    (fewer than two batch sizes reached the goal).

    Raises:
        BatchlabError: not a store, no such unit, a unit without a goal, or a selection the analysis
            refuses (e.g. raced trials that leave a steps to result undetermined).
    """
    from batchlab.analysis.bootstrap import bootstrap_critical_batch_size, check_resampling, store_fit_inputs
    from batchlab.analysis.scatter import scatter_from_trials
    from batchlab.analysis.steps_to_result import steps_to_result_many
    from batchlab.analysis.units import find_units, restricted, unit_examples, unit_goal, unit_selection
    from batchlab.store import Store

    check_resampling(n_boot, level, seed)
    con = Store.open(store_path, create=False).connect()
    try:
        unit = find_unit(find_units(con), unit_name, workload=workload, sweep=sweep, device=device)
        with restricted(con, unit):
            goal, why = unit_goal(unit, con)
            if goal is None:
                raise BatchlabError(f"{unit.name}: no goal ({why})")
            results = inputs = None
            used: str | None = None
            for max_trials in ("auto", None):
                selection = unit_selection(con, unit, max_trials=max_trials)
                try:
                    results = steps_to_result_many(con, [selection])[0]
                    inputs = store_fit_inputs(con, selection)
                    used = max_trials
                    break
                except BatchlabError as exc:
                    if max_trials == "auto" and "the paper's first" in str(exc):
                        continue
                    raise
            trials, examples = unit_examples(con, unit)
            spent = {int(b): (int(n), int(e or 0)) for b, n, e in con.execute(
                "SELECT batch_size, count(*), sum(steps * batch_size) FROM trials WHERE workload = ? GROUP BY ALL",
                [unit.workload]).fetchall()}
        estimate, reason = None, ""
        try:
            estimate = bootstrap_critical_batch_size(n_boot=n_boot, level=level, seed=seed, tolerance=tolerance,
                                                     **inputs).to_dict()
        except BatchlabError as exc:
            reason = f"no S(B) fit: {exc}"
        scatter = scatter_from_trials(inputs["trial_steps"], inputs["unknown_from"], inputs["budget"])
        points = []
        for r in results:
            sid = unit.batch_study.get(int(r.batch_size))
            budget = (unit.definitions.get(sid) or {}).get("train_steps") if sid else None
            n_run, e_run = spent.get(int(r.batch_size), (0, 0))
            points.append(MeasuredPoint(
                batch_size=int(r.batch_size), reached=r.reached, steps=r.steps, steps_lower=r.steps_lower,
                censored_at=r.censored_at, n_trials=int(r.n_trials), n_reached=int(r.n_reached),
                best_hyperparameters=dict(r.parameters), best_trial_id=r.trial_id,
                budget_steps=None if budget is None else int(budget), examples_spent=e_run, trials_run=n_run,
                study_id=sid))
        b_crit = {"value": None, "low": None, "high": None}
        if estimate is not None:
            named = estimate["critical_batch_sizes"]["mccandlish_b_crit"]
            b_crit = {"value": named["value"], "low": named["low"], "high": named["high"]}
        sd = None
        if scatter is not None:
            sd = {int(b): float(s) for b, s in scatter.by_batch_size}
        return UnitPoints(unit=unit.name, goal=goal, points=points, estimate=None if estimate is None else plain(estimate),
                          estimate_reason=reason, b_crit=plain(b_crit),
                          scatter=None if scatter is None else plain(scatter.to_dict()), best_of_k_sd=sd,
                          trials=trials, examples_spent=examples, level=level, tolerance=tolerance,
                          max_trials=used, fit_inputs=inputs)
    finally:
        con.close()


# ------------------------------------------------------------------ a measured point's intervals


def value_interval(value: float | None, low: float | None, high: float | None, **extra: Any) -> dict:
    """``{"value", "low", "high", **extra}`` with non-finite numbers as ``None``."""
    return plain({"value": value, "low": low, "high": high, **extra})




def steps_interval(points: UnitPoints, batch_size: int, level: float = 0.9) -> dict | None:
    """``{"value", "low", "high", "method"}``: the steps to result at a measured, reached ``batch_size``
    with its interval (module docstring); ``None`` when not reached. ``method``: ``"scatter"`` or
    ``"bracket"`` (no scatter: the resolution bracket only)."""
    p = points.point(batch_size)
    if p is None or not p.reached or p.steps is None:
        return None
    lower = float(p.steps_lower or 0)
    sd = points.sd_at(batch_size)
    if sd is None:
        return value_interval(float(p.steps), lower, float(p.steps), method="bracket")
    c = sd * math.log(1.0 / (1.0 - level))
    return value_interval(float(p.steps), lower * math.exp(-c), p.steps * math.exp(c), method="scatter")


def step_time(throughput: Any, batch_size: int) -> dict | None:
    """``{"value", "low", "high"}`` seconds per update at ``batch_size`` from ``throughput``
    (``.seconds_per_step(B)``; the spread ``low``/``high`` of its ``step_times`` entry when it has one,
    else the value on both ends); ``None`` when not measured there."""
    if throughput is None:
        return None
    value = throughput.seconds_per_step(int(batch_size))
    if value is None or not math.isfinite(float(value)):
        return None
    low = high = float(value)
    for entry in getattr(throughput, "step_times", None) or ():
        get = entry.get if isinstance(entry, dict) else lambda k, e=entry: getattr(e, k, None)
        if get("batch_size") is not None and int(get("batch_size")) == int(batch_size):
            low = float(get("low") if get("low") is not None else value)
            high = float(get("high") if get("high") is not None else value)
    return value_interval(float(value), min(low, float(value)), max(high, float(value)))
