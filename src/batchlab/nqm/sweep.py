"""Tuned steps to target per batch size, for one problem, algorithm and learning-rate schedule.

The library behind ``batchlab nqm sweep`` and ``batchlab nqm fit`` (the CLI only parses, calls these and
prints):

* :func:`sweep_rows`: one JSON-ready row per batch size, tuned as the schedule requires: ``constant``
  (:func:`batchlab.nqm.tuning.tune` on the ``official`` or ``auto`` grid), ``pwc:K``
  (:func:`batchlab.nqm.tuning.tune_pwc`), ``linear`` and ``cosine``
  (:func:`batchlab.nqm.tuning.tune_scheduled`); the schedule kinds are the keys of :data:`TUNERS`.
* :func:`learning_rate_grid_used`: the learning-rate grid the rows rest on (schedules search the
  official grid).
* :func:`fit_summary`: :func:`batchlab.analysis.critical_batch_size.summarize_curve` of the rows plus
  the batch grid it rests on (docs/methods.md, "Critical batch size").

Steps are first-passage counts (updates needed); ``official_low`` is the notebook's ``steps - 1``.
"""

from __future__ import annotations

from batchlab.errors import BatchlabError
from batchlab.nqm.algorithms import Algorithm, get_nqm_algorithm, nqm_algorithm_names
from batchlab.nqm.problem import Problem, fits_in_memory
from batchlab.nqm.steps import check_target
from batchlab.nqm.tuning import check_grid, tune, tune_pwc, tune_scheduled


def _constant(problem, algorithm, batch_sizes, target, grid, pieces, max_steps, notebook_fudge):
    tuned = tune(problem, algorithm, batch_sizes, target, grid=grid, max_steps=max_steps, notebook_fudge=notebook_fudge)
    rows = [p.to_dict() for p in tuned]
    for row in rows:
        row["schedule"] = "constant"
    return rows


def _pwc(problem, algorithm, batch_sizes, target, grid, pieces, max_steps, notebook_fudge):
    return tune_pwc(problem, algorithm, batch_sizes, target, pieces, max_steps=max_steps)


def _decaying(kind):
    def tuner(problem, algorithm, batch_sizes, target, grid, pieces, max_steps, notebook_fudge):
        return tune_scheduled(problem, algorithm, batch_sizes, target, kind, max_steps=max_steps)

    return tuner


TUNERS = {"constant": _constant, "pwc": _pwc, "linear": _decaying("linear"), "cosine": _decaying("cosine")}
"""Schedule kind (as :func:`batchlab.nqm.schedules.parse_schedule` returns it) -> its tuner
``(problem, algorithm, batch_sizes, target, grid, pieces, max_steps, notebook_fudge) -> rows``."""


def sweep_rows(
    problem: Problem,
    algorithm: Algorithm,
    batch_sizes,
    target: float,
    grid: str = "auto",
    schedule: str = "constant",
    max_steps: int | None = None,
    notebook_fudge: bool = False,
) -> list[dict]:
    """Tuned steps to ``target`` per batch size: one JSON-ready dict per batch size (input order).

    Every row has ``batch_size``, ``steps`` (first passage, None if not reached), ``reached``,
    ``official_low``, ``learning_rate``, ``momentum``, ``ema_decay``, ``final_loss``, ``schedule`` and
    ``certified``; constant-LR rows add ``effective_learning_rate``, scheduled rows ``constant_steps``
    and their schedule's parameters (``learning_rates``/``piece_length`` for ``pwc:K``,
    ``decay_steps``/``end_factor`` for ``linear``/``cosine``). ``grid`` (``official`` or ``auto``) applies
    to the constant schedule; the others search the official learning-rate grid. ``notebook_fudge``
    (constant schedule, algorithms whose entry allows it: SGD) reproduces the notebook's numbers exactly.
    Running out of memory is a one-line error (:func:`batchlab.nqm.problem.fits_in_memory`).
    """
    if notebook_fudge and (not algorithm.entry.notebook_fudge or schedule != "constant"):
        allowed = ", ".join(n for n in nqm_algorithm_names() if get_nqm_algorithm(n).notebook_fudge)
        raise BatchlabError(f"--notebook-fudge applies to --optimizer {allowed} with --schedule constant only")
    with fits_in_memory(problem):
        check_grid(grid)
        if schedule == "constant":  # the common case without loading the schedules module (start-up)
            kind, pieces = "constant", None
        else:
            from batchlab.nqm.schedules import parse_schedule

            kind, pieces = parse_schedule(schedule)
        check_target(target, problem.initial_loss())
        return TUNERS[kind](problem, algorithm, batch_sizes, target, grid, pieces, max_steps, notebook_fudge)


def learning_rate_grid_used(grid: str, schedule: str) -> str:
    """The learning-rate grid the rows of :func:`sweep_rows` rest on: ``grid`` for the constant schedule,
    ``official`` for the others (schedules search the official learning-rate grid)."""
    return grid if schedule == "constant" else "official"


def sweep_label(algorithm: Algorithm, target: float) -> str:
    """The label of a sweep's curve: ``"<name> p=<p> target=<target>"``."""
    return f"{algorithm.name} p={algorithm.precondition:g} target={target:g}"


def fit_summary(rows: list[dict], label: str, grid: str = "auto", tolerance: float = 0.1, b0: int | None = None) -> dict:
    """``summarize_curve`` of the rows of :func:`sweep_rows` plus ``batch_grid``, the batch grid it rests on
    (``batch_sizes``, ``n``, ``n_reached``, ``smallest``, ``largest``, ``b0``, ``learning_rate_grid`` =
    ``grid``); docs/methods.md, "Critical batch size"."""
    from batchlab.analysis.critical_batch_size import summarize_curve
    from batchlab.analysis.curve import StepsCurve

    curve = StepsCurve.from_points([(r["batch_size"], r["steps"]) for r in rows], label=label)
    summary = summarize_curve(curve, tolerance=tolerance, b0=b0)
    sizes = [int(b) for b in curve.batch_sizes]
    reached = [int(b) for b, s in zip(curve.batch_sizes, curve.steps) if s is not None]
    summary["batch_grid"] = {
        "batch_sizes": sizes,
        "n": len(sizes),
        "n_reached": len(reached),
        "smallest": sizes[0],
        "largest": sizes[-1],
        "b0": summary["b0"],
        "learning_rate_grid": grid,
    }
    return summary


__all__ = ["TUNERS", "fit_summary", "learning_rate_grid_used", "sweep_label", "sweep_rows"]
