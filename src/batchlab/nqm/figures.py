"""The data behind the NQM figure set (the official notebook's figures plus S(B) fits), official grids.

:func:`figure_data` computes every curve of the set as plain dicts and lists (JSON-ready); drawing is in
:mod:`batchlab.plots.nqm`. The independent jobs run in up to ``workers`` processes.

Steps are first-passage counts (updates needed); the official ``low`` convention is one less.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from batchlab.nqm.dynamics import Algorithm, losses_at_steps, moment_recurrence
from batchlab.nqm.problem import information_lower_bound, power_law, zhang2019_binned
from batchlab.nqm.tuning import tune, tune_pwc

TARGETS = (0.1, 0.03, 0.01, 0.003, 0.001)
PRECONDITIONS = (0.0, 0.25, 0.5, 0.75)
TARGET = 0.01
ALL_BATCH_SIZES = tuple(2**k for k in range(2, 22))  # target sweep and optimal-LR figure
COMPARE_BATCH_SIZES = tuple(2**k for k in range(2, 21, 2))  # optimizer comparisons
PWC50_BATCH_SIZES = tuple(2**k for k in range(4, 13))
CURVE_LEARNING_RATES = (0.01, 0.03, 0.1, 0.3, 1.0, 1.9)


def _tuned(algorithm: str, p: float, batch_sizes, target: float, grid: str = "official") -> dict:
    problem = zhang2019_binned()
    points = tune(problem, Algorithm(algorithm, p), batch_sizes, target, grid=grid)
    return {
        "optimizer": algorithm,
        "precondition": p,
        "target": target,
        "points": [pt.to_dict() for pt in points],
    }


CURVE_DIMENSION = 5000


def _training_curves() -> dict:
    """Training curves of SGD at B = 1 on the problem the notebook uses for them: the unbinned power law
    h_i = 1/i with D = 5000 directions (neither preset: ``zhang2019`` has D = 10^4). ``problem`` names
    it and ``dimension`` gives D, for the figure's title."""
    problem = power_law(1.0, 1.0, CURVE_DIMENSION, name=f"power law h_i = 1/i, D={CURVE_DIMENSION}")
    steps = np.unique(np.round(np.geomspace(1, 1e5, 120)).astype(np.int64))
    steps = np.concatenate([[0], steps])
    rec = moment_recurrence(problem, Algorithm("sgd"), np.asarray(CURVE_LEARNING_RATES))
    losses = losses_at_steps(rec, 1.0, steps)
    return {
        "batch_size": 1,
        "problem": problem.name,
        "dimension": problem.dimension,
        "steps": steps.tolist(),
        "curves": [{"learning_rate": lr, "loss": row.tolist()} for lr, row in zip(CURVE_LEARNING_RATES, losses)],
    }


def _pwc(batch_sizes, pieces: int, p: float = 0.0) -> dict:
    """The optimised ``pieces``-piece schedules per batch size (:func:`batchlab.nqm.tuning.tune_pwc`)."""
    rows = tune_pwc(zhang2019_binned(), Algorithm("sgd", p), batch_sizes, TARGET, pieces)
    keep = ("batch_size", "steps", "piece_length", "learning_rates", "constant_steps")
    return {"pieces": pieces, "precondition": p, "target": TARGET, "points": [{k: row[k] for k in keep} for row in rows]}


def _jobs() -> dict:
    jobs = {"training_curves": (_training_curves, ())}
    for target in TARGETS:
        jobs[f"sgd_target_{target}"] = (_tuned, ("sgd", 0.0, ALL_BATCH_SIZES, target))
    for p in PRECONDITIONS:
        if p != 0.0:
            jobs[f"sgd_lr_p{p}"] = (_tuned, ("sgd", p, ALL_BATCH_SIZES, TARGET))
        jobs[f"momentum_p{p}"] = (_tuned, ("momentum", p, COMPARE_BATCH_SIZES, TARGET))
    jobs["ema_p0.0"] = (_tuned, ("ema", 0.0, COMPARE_BATCH_SIZES, TARGET))
    jobs["pwc50"] = (_pwc, (PWC50_BATCH_SIZES, 50))
    jobs["pwc10"] = (_pwc, (COMPARE_BATCH_SIZES, 10))
    return jobs


def _subset(entry: dict, batch_sizes) -> dict:
    """``entry`` restricted to ``batch_sizes``. Exact: tuning treats every batch size independently (each
    has its own pruned search and certification), so a sub-sweep equals the same rows of a larger sweep."""
    keep = {int(b) for b in batch_sizes}
    return {**entry, "points": [pt for pt in entry["points"] if pt["batch_size"] in keep]}


def _run(item):
    name, (function, args) = item
    return name, function(*args)


def _ordered_jobs() -> list:
    # Expensive jobs first so that the workers finish together.
    return sorted(_jobs().items(), key=lambda kv: -_COST.get(kv[0].split("_p")[0].split("_target")[0], 1))


def fork_context():
    """The ``fork`` multiprocessing context where available (workers inherit the imported modules, so
    they start in milliseconds), else the platform default."""
    import multiprocessing

    return multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)


def submit_figure_jobs(pool) -> list:
    """Submit every figure job to ``pool``; pass the returned futures to :func:`collect_figure_data`."""
    return [pool.submit(_run, item) for item in _ordered_jobs()]


def collect_figure_data(futures) -> dict:
    """Wait for the jobs of :func:`submit_figure_jobs` and assemble the figure data."""
    return _assemble(dict(future.result() for future in futures))


def figure_data(workers: int | None = None, pool: ProcessPoolExecutor | None = None) -> dict:
    """Compute every figure's data in ``workers`` processes (default: up to 2) or in ``pool``."""
    workers = min(2, os.cpu_count() or 1) if workers is None else int(workers)
    if pool is not None:
        return collect_figure_data(submit_figure_jobs(pool))
    if workers <= 1:
        return _assemble(dict(_run(item) for item in _ordered_jobs()))
    with ProcessPoolExecutor(max_workers=workers, mp_context=fork_context()) as own_pool:
        return collect_figure_data(submit_figure_jobs(own_pool))


def _assemble(results: dict) -> dict:
    # The SGD curves of the optimizer comparisons are sub-sweeps of the full-range SGD sweeps.
    for p in PRECONDITIONS:
        source = results[f"sgd_target_{TARGET}"] if p == 0.0 else results[f"sgd_lr_p{p}"]
        results[f"sgd_p{p}"] = _subset(source, COMPARE_BATCH_SIZES)
    problem = zhang2019_binned()
    results["lower_bound"] = {
        "problem": problem.name,
        "dimension": problem.dimension,
        "target": TARGET,
        "batch_sizes": list(COMPARE_BATCH_SIZES),
        "steps": information_lower_bound(problem, TARGET, COMPARE_BATCH_SIZES).tolist(),
    }
    return results


_COST = {"momentum": 30, "pwc50": 25, "pwc10": 20, "ema": 25, "sgd": 1, "training_curves": 2}
