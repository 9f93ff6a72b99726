"""Command ``advise``: a batch size and learning rate for one workload, measured just enough, at a stated cost.

``batchlab advise WORKLOAD --optimizer NAME --store DIR [--budget-examples N | --budget-hours H]
[--objective time|examples] [--target-ratio R] [--device ...] [--workers K | --dask | --scheduler ADDR]
[--config FILE] [--search-space FILE] [--trials K] [--study-trials K] [--bracket LO:HI] [--no-check]
[--json]``: the work is :func:`batchlab.advise.run.advise` (docs/methods.md, "Advise"; docs/tutorial.md
walks through it). Re-running the same command resumes. No ``from __future__ import annotations``
(typer reads the annotations).
"""

from typing import Annotated, Optional

import typer

from batchlab.cli import options as opt
from batchlab.cli.output import emit_json, line, note

ADVISE_JSON = opt.json_option(
    "Print the advice record as one JSON object (docs/methods.md, \"The advice record\"): settings, throughput, "
    "bracket, rounds, spent, full_protocol, stop, recommendation, check.")


def advise(
    workload: opt.Workload,
    optimizer: opt.Optimizer,
    store: Annotated[str, typer.Option("--store", help="Store directory (created when absent); advise's studies and "
                                                       "its record (advice/) are kept there.")],
    budget_examples: Annotated[Optional[int], typer.Option(
        "--budget-examples", help="Stop once this many training examples (updates x batch size, all of advise's "
                                  "training counted) are spent; never exceeded by more than one study.")] = None,
    budget_hours: Annotated[Optional[float], typer.Option(
        "--budget-hours", help="Stop once advise's runs have taken this many hours of wall clock.")] = None,
    objective: Annotated[str, typer.Option(
        "--objective", metavar="time|examples",
        help="time: least wall clock to the goal on this device (measured step times); examples: least data and "
             "compute (the largest batch size within 1.2x of the least examples).")] = "time",
    target_ratio: Annotated[float, typer.Option(
        "--target-ratio", help="Stop when the upper end of B_crit's interval is within this factor of its lower end.")] = 1.5,
    device: opt.Device = "auto",
    workers: opt.Workers = None,
    dask: opt.Dask = False,
    scheduler: opt.Scheduler = None,
    config: Annotated[Optional[str], typer.Option(
        "--config", metavar="FILE", help="A sweep TOML whose settings the studies use (budgets, search spaces, "
                                         "evaluations, goal, trials) and whose batch_sizes are the candidates.")] = None,
    search_space: opt.SearchSpaceFile = None,
    trials: Annotated[Optional[int], typer.Option(
        "--trials", help="Trials (search-space points) of a new study (default: the config's, else 4).")] = None,
    max_trials: Annotated[Optional[int], typer.Option(
        "--study-trials", help="The most trials a study may be grown to (default: 4x --trials).")] = None,
    bracket: Annotated[Optional[str], typer.Option(
        "--bracket", metavar="LO:HI", help="Start from this bracket of B_crit instead of the predictors'.")] = None,
    train_examples: opt.TrainExamples = None,
    goal: Annotated[Optional[float], typer.Option(
        "--goal", help="The goal on the workload's metric (default: the workload's).")] = None,
    check: Annotated[bool, typer.Option(
        "--check/--no-check", help="Train the recommendation once more with a fresh seed and say whether it reaches "
                                   "the goal within the predicted interval.")] = True,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the studies' points and trials (with --config: the file's seed).")] = 0,
    level: opt.Level = 0.9,
    json_output: ADVISE_JSON = False,
) -> None:
    """Recommend a batch size and learning rate for WORKLOAD, measuring just enough (docs/tutorial.md)."""
    from batchlab.advise.run import advise as run_advise
    from batchlab.cli.options import check_seed

    check_seed(seed)
    result = run_advise(workload, optimizer, store=store, budget_examples=budget_examples, budget_hours=budget_hours,
                        objective=objective, target_ratio=target_ratio, device=device, workers=workers, dask=dask,
                        scheduler=scheduler, config=config, search_space=search_space, trials=trials,
                        max_trials=max_trials, bracket=bracket, check=check, seed=seed, level=level,
                        train_examples=train_examples, goal=goal, progress=None if json_output else note)
    if json_output:
        emit_json(result.record)
        return
    for text in result.lines():
        line(text)


def register(app: typer.Typer) -> None:
    """Add the ``advise`` command to the main app."""
    app.command("advise")(advise)
