"""Tuning per batch size: minimise steps to target over the learning rate (and momentum, EMA decay).

Grids (docs/methods.md, "Tuning per batch size"):

* ``official``: exactly the notebook's grids, each declared in its algorithm's registry entry
  (:attr:`batchlab.nqm.algorithms.NQMAlgorithm.grid`). SGD: ``lr in logspace(-5, 0.5, 100)``; momentum, Nesterov
  and EMA: ``lr in logspace(-8, 1, 100)`` x ``{1 - 10^(-5 + 5 j / 19) : j = 0..19}``. Ties go to the first
  strictly better point, learning rate in the outer loop, the second hyperparameter inner (``argmin`` of
  the flattened grid). ``momentum+ema`` / ``nesterov+ema`` have no official grid; batchlab uses the momentum
  grid x ``ema_decay in {0, 0.9, 0.99, 0.999, 0.9999}``.
* ``auto`` (default): the official grid, then two rounds of refinement around each batch size's optimum
  in log space (log lr, log(1 - momentum), log(1 - decay)) between the optimum's grid neighbours. The
  official optimum stays a candidate, so ``auto`` is never worse than ``official``.

Every grid point's steps come from binary-lifting candidates (exact when the loss is monotone; upper
bounds otherwise); the winner at each batch size is then certified exactly (:mod:`batchlab.nqm.steps`).

Schedules: :func:`tune_pwc` (the optimised K-piece schedule on top of the constant-LR optimum) and
:func:`tune_scheduled` (linear and cosine decay) tune per batch size too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from batchlab.errors import BatchlabError, unknown_name_error
from batchlab.nqm.algorithms import get_nqm_algorithm, nqm_algorithm_names
from batchlab.nqm.dynamics import Algorithm, losses_at_steps, moment_recurrence
from batchlab.nqm.problem import Problem
from batchlab.nqm.steps import (
    StepsResult,
    best_candidates,
    certify,
    check_batch_sizes,
    check_max_steps,
    check_target,
    default_max_steps,
)

GRIDS = ("official", "auto")


def official_grid(algorithm: Algorithm) -> dict[str, np.ndarray]:
    """The grid axes: ``learning_rate`` and, where used, ``momentum`` and ``ema_decay`` (outer to inner),
    as the algorithm's registry entry declares them (:attr:`batchlab.nqm.algorithms.NQMAlgorithm.grid`)."""
    return algorithm.entry.grid()


@dataclass(frozen=True)
class TunedPoint:
    """The best configuration at one batch size.

    ``learning_rate``/``momentum``/``ema_decay`` are those of the winner (of the lowest loss at the budget
    when no grid point reaches the target); ``momentum``/``ema_decay`` are None when the algorithm has none.
    """

    batch_size: float
    result: StepsResult
    learning_rate: float
    momentum: float | None
    ema_decay: float | None

    @property
    def effective_learning_rate(self) -> float:
        """``lr / (1 - momentum)`` (``lr`` without momentum)."""
        return self.learning_rate / (1.0 - (self.momentum or 0.0))

    def to_dict(self) -> dict:
        return {
            "batch_size": _as_int(self.batch_size),
            "steps": self.result.steps,
            "reached": self.result.reached,
            "official_low": self.result.official_low,
            "learning_rate": self.learning_rate,
            "momentum": self.momentum,
            "ema_decay": self.ema_decay,
            "effective_learning_rate": self.effective_learning_rate,
            "final_loss": self.result.final_loss,
            "certified": self.result.certified,
        }


def _as_int(value: float):
    return int(value) if float(value).is_integer() else float(value)


def _mesh(axes: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = list(axes)
    grids = np.meshgrid(*[axes[n] for n in names], indexing="ij")  # first axis outermost
    return {n: g.ravel() for n, g in zip(names, grids)}


def _recurrence(problem, algorithm, points, notebook_fudge=False):
    return moment_recurrence(
        problem,
        algorithm,
        points["learning_rate"],
        momentum=points.get("momentum"),
        ema_decay=points.get("ema_decay"),
        notebook_fudge=notebook_fudge,
    )


def _refined_axes(axes, index_per_axis, points_per_axis=9):
    """Log-spaced points between the grid neighbours of the optimum on each axis."""
    refined = {}
    for name, values in axes.items():
        i = index_per_axis[name]
        lo, hi = values[max(i - 1, 0)], values[min(i + 1, values.size - 1)]
        if name == "learning_rate":
            refined[name] = np.geomspace(lo, hi, points_per_axis) if hi > lo else np.array([lo])
        else:  # refine 1 - x in log space; keep exact 0 reachable
            a, b = 1.0 - lo, 1.0 - hi
            if a == b:
                refined[name] = np.array([lo])
            else:
                refined[name] = 1.0 - np.geomspace(max(a, 1e-12), max(b, 1e-12), points_per_axis)
                refined[name] = np.clip(refined[name], 0.0, 1.0 - 1e-12)
    return refined


def tune(
    problem: Problem,
    algorithm: Algorithm,
    batch_sizes,
    target: float,
    grid: str = "auto",
    max_steps: int | None = None,
    notebook_fudge: bool = False,
) -> list[TunedPoint]:
    """Minimise steps to ``target`` per batch size; one :class:`TunedPoint` per batch size (input order)."""
    if grid not in GRIDS:
        raise unknown_name_error("grid", grid, GRIDS)
    batch_sizes = check_batch_sizes(batch_sizes)
    target = check_target(target, problem.initial_loss())
    max_steps = check_max_steps(default_max_steps(algorithm.name) if max_steps is None else max_steps)
    axes = official_grid(algorithm)
    points = _mesh(axes)
    rec = _recurrence(problem, algorithm, points, notebook_fudge)
    search_budget = max_steps
    if len(axes) > 1 and all(np.any(values == 0.0) for name, values in axes.items() if name != "learning_rate"):
        # The grid contains momentum = 0 and decay = 0, i.e. plain SGD on the same learning rates; SGD's
        # best candidate bounds the answer, so the search needs no larger budget (fewer power levels).
        sgd = moment_recurrence(problem, Algorithm("sgd", algorithm.precondition), axes["learning_rate"])
        _, sgd_best = best_candidates(sgd, batch_sizes, target, max_steps)
        if np.all(sgd_best > 0):  # a power of two keeps the pruning in best_candidates effective
            search_budget = min(max_steps, 1 << int(sgd_best.max() - 1).bit_length())
    winners, candidates = best_candidates(rec, batch_sizes, target, search_budget)
    never = np.iinfo(np.int64).max
    shape = [axes[n].size for n in axes]
    results = []
    def certified(point, steps):
        single = _recurrence(problem, algorithm, {n: np.array([v]) for n, v in point.items()}, notebook_fudge)
        return certify(single, float(batch_size), target, -1 if steps == never else steps, max_steps)

    for b_index, batch_size in enumerate(batch_sizes):
        best = int(winners[b_index])  # first strictly better in lr-outer order
        best_point = {n: float(points[n][best]) for n in points}
        best_steps = never if candidates[b_index] < 0 else int(candidates[b_index])
        if best_steps == never:
            # Not reached anywhere: report the configuration with the lowest loss at the budget.
            final = losses_at_steps(rec, batch_size, [max_steps])[:, 0]
            best = int(np.nanargmin(np.where(np.isfinite(final), final, np.inf)))
            best_point = {n: float(points[n][best]) for n in points}
        result = certified(best_point, best_steps)
        if grid == "auto" and best_steps != never:
            refined_point, refined_steps = dict(best_point), best_steps
            around_axes, around_index = axes, dict(zip(axes, np.unravel_index(best, shape)))
            for _round in range(2):
                local_axes = _refined_axes(around_axes, around_index)
                local_points = _mesh(local_axes)
                local_rec = _recurrence(problem, algorithm, local_points, notebook_fudge)
                picks, found = best_candidates(local_rec, [batch_size], target, max_steps)
                k = int(picks[0])
                around_axes = local_axes
                around_index = dict(zip(local_axes, np.unravel_index(k, [v.size for v in local_axes.values()])))
                if 0 <= found[0] < refined_steps:
                    refined_steps = int(found[0])
                    refined_point = {n: float(local_points[n][k]) for n in local_points}
            if refined_steps < best_steps:
                # Certify the refined winner too and keep the better certified answer, so that an
                # oscillating official winner whose true first passage is earlier is never lost.
                refined = certified(refined_point, refined_steps)
                if refined.steps < result.steps:
                    best_point, result = refined_point, refined
        results.append(
            TunedPoint(
                batch_size=float(batch_size),
                result=result,
                learning_rate=best_point["learning_rate"],
                momentum=best_point.get("momentum"),
                ema_decay=best_point.get("ema_decay"),
            )
        )
    return results


def steps_curve(points: list[TunedPoint], label: str = "", metadata: dict | None = None):
    """The tuned results as a :class:`batchlab.analysis.curve.StepsCurve` (first-passage convention)."""
    from batchlab.analysis.curve import StepsCurve

    return StepsCurve.from_points([(p.batch_size, p.result.steps) for p in points], label=label, metadata=metadata)


def check_grid(grid: str) -> str:
    if grid not in GRIDS:
        raise unknown_name_error("grid", grid, GRIDS)
    return grid


__all__ = [
    "GRIDS",
    "TunedPoint",
    "check_grid",
    "official_grid",
    "steps_curve",
    "tune",
    "tune_pwc",
    "tune_scheduled",
]


def tune_scheduled(
    problem: Problem,
    algorithm: Algorithm,
    batch_sizes,
    target: float,
    kind: str,
    max_steps: int | None = None,
    end_factor: float = 0.01,
    warmup_fraction: float = 0.05,
    decay_multipliers=(0.5, 1.0, 2.0, 4.0),
) -> list[dict]:
    """Tune a ``linear`` or ``cosine`` learning-rate schedule per batch size.

    Searched: the official learning-rate grid x decay lengths ``S_const * decay_multipliers`` (``S_const``
    = the official-grid constant-LR steps at that batch size); momentum and EMA decay are held at the
    constant-LR optimum. ``end_factor`` is the final LR factor; cosine warms up over ``warmup_fraction`` of
    the decay length. Steps are lifting candidates within each schedule segment (see
    :mod:`batchlab.nqm.schedules` for what is exact). Returns JSON-ready dicts, one per batch size.
    """
    from batchlab.nqm.schedules import (
        first_passage_scheduled,
        linear_decay_segments,
        scheduled_loss_at_step,
        warmup_cosine_segments,
    )

    if kind not in ("linear", "cosine"):
        raise unknown_name_error("schedule", kind, ("linear", "cosine"))
    batch_sizes = check_batch_sizes(batch_sizes)
    max_steps = check_max_steps(default_max_steps(algorithm.name) if max_steps is None else max_steps)
    constant = tune(problem, algorithm, batch_sizes, target, grid="official", max_steps=max_steps)
    lrs = official_grid(algorithm)["learning_rate"]
    out = []
    for point in constant:
        base = point.result.steps or max_steps
        best = None
        for multiplier in decay_multipliers:
            decay = max(int(round(base * multiplier)), 1)
            if kind == "linear":
                segments = linear_decay_segments(decay, end_factor)
            else:
                segments = warmup_cosine_segments(int(round(warmup_fraction * decay)), decay, end_factor)
            found = first_passage_scheduled(
                problem, algorithm, lrs, segments, target, max_steps, batch_size=point.batch_size,
                momentum=point.momentum, ema_decay=point.ema_decay,
            )
            ranked = np.where(found < 0, np.iinfo(np.int64).max, found)
            k = int(np.argmin(ranked))
            if found[k] >= 0 and (best is None or found[k] < best["steps"]):
                best = {"steps": int(found[k]), "learning_rate": float(lrs[k]), "decay_steps": decay, "segments": segments}
        final = None
        if best is not None:
            final = scheduled_loss_at_step(
                problem, algorithm, best["learning_rate"], best["segments"], best["steps"],
                batch_size=point.batch_size, momentum=point.momentum, ema_decay=point.ema_decay,
            )
        out.append(
            {
                "batch_size": _as_int(point.batch_size),
                "steps": None if best is None else best["steps"],
                "reached": best is not None,
                "official_low": None if best is None else best["steps"] - 1,
                "learning_rate": None if best is None else best["learning_rate"],
                "momentum": point.momentum,
                "ema_decay": point.ema_decay,
                "decay_steps": None if best is None else best["decay_steps"],
                "end_factor": end_factor,
                "schedule": kind,
                "constant_steps": point.result.steps,
                "final_loss": final,
                "certified": "lifting",
            }
        )
    return out


def tune_pwc(
    problem: Problem,
    algorithm: Algorithm,
    batch_sizes,
    target: float,
    pieces: int,
    max_steps: int | None = None,
) -> list[dict]:
    """Tune the optimised ``pieces``-piece learning-rate schedule per batch size (docs/methods.md,
    "Learning-rate schedules"); the ``pwc:K`` schedule of ``batchlab nqm sweep`` and the PWC figures.

    Per batch size: the constant-LR optimum on the official grid first (:func:`tune`), then
    :func:`batchlab.nqm.schedules.optimal_pwc_sgd` with the constant-LR steps, split over the pieces
    (rounded up), as the upper bracket on the piece length (a PWC schedule can imitate a constant one).
    ``max_steps`` bounds the whole schedule: ``pieces * piece_length <= max_steps`` (None: the
    algorithm's default budget for the constant-LR search and ``10^8`` per piece). Only algorithms whose
    registry entry has ``pwc`` (plain SGD, any p) are supported.

    Returns JSON-ready dicts, one per batch size (input order): ``batch_size``, ``steps`` (``pieces *
    piece_length``, None if not reached), ``reached``, ``official_low``, ``learning_rate`` (the first
    piece's), ``learning_rates``, ``piece_length``, ``momentum``/``ema_decay`` (None), ``final_loss``,
    ``schedule`` (``pwc:K``), ``constant_steps`` and ``certified`` (``local-optimum``: the optimiser is
    local, so steps are an upper bound on the best K-piece schedule).
    """
    from batchlab.nqm.schedules import optimal_pwc_sgd

    if not algorithm.entry.pwc:
        supported = ", ".join(n for n in nqm_algorithm_names() if get_nqm_algorithm(n).pwc)
        raise BatchlabError(f"schedule pwc:K is implemented for --optimizer {supported} only, got {algorithm.name!r}")
    constant = tune(problem, algorithm, batch_sizes, target, grid="official", max_steps=max_steps)
    # --max-steps bounds the whole schedule: pieces * piece_length <= max_steps
    limit = {} if max_steps is None else {"max_piece_length": max_steps // pieces}
    rows = []
    for point in constant:
        upper = None if point.result.steps is None else -(-point.result.steps // pieces)
        if upper is not None and limit:
            upper = min(upper, limit["max_piece_length"])
        res = optimal_pwc_sgd(problem, algorithm.precondition, point.batch_size, target, pieces, upper_k=upper, **limit)
        rows.append(
            {
                "batch_size": _as_int(point.batch_size),
                "steps": res.steps,
                "reached": res.reached,
                "official_low": None if res.steps is None else res.steps - 1,
                "learning_rate": res.learning_rates[0],
                "learning_rates": list(res.learning_rates),
                "piece_length": res.piece_length,
                "momentum": None,
                "ema_decay": None,
                "final_loss": res.final_loss,
                "schedule": f"pwc:{pieces}",
                "constant_steps": point.result.steps,
                "certified": "local-optimum",
            }
        )
    return rows
