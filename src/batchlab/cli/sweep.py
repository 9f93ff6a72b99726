"""``batchlab sweep``: whole batch-size studies in parallel, resumable, with progress.

``batchlab sweep WORKLOAD --optimizer sgd,momentum --batch-sizes 16,64,256 --trials 8 --store DIR`` or
``batchlab sweep --config sweep.toml`` (options given on the command line override the file).
Everything is validated before any trial runs; a bad value is one ``error: ...`` line, exit 2.
Each batch size gets its own step budget (``--steps`` for a fixed one; by default an example budget
with a floor of steps, ``--budget-epochs``/``--min-steps``/``--max-steps``), and the table reports
only this sweep's own trials (docs/methods.md, "Sweeps").
"""

from __future__ import annotations

from typing import Optional

import typer


def _csv(value: str | None, kind: str, cast=str) -> list | None:
    from batchlab.errors import BatchlabError

    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise BatchlabError(f"--{kind} needs a comma-separated list, got {value!r}")
    try:
        return [cast(v) for v in items]
    except ValueError:
        raise BatchlabError(f"--{kind} must be a comma-separated list of integers, got {value!r}") from None


def register(app: typer.Typer) -> None:
    """Add ``sweep`` to the main app."""

    @app.command("sweep")
    def sweep(
        workload: Optional[str] = typer.Argument(None, help="Workload (dataset/model), e.g. mnist/fc_128_128_128."),
        config: Optional[str] = typer.Option(None, "--config", help="TOML sweep file (see batchlab.sweep.config)."),
        optimizer: Optional[str] = typer.Option(None, "--optimizer", help="Optimizer name(s), comma-separated."),
        batch_sizes: Optional[str] = typer.Option(None, "--batch-sizes", help="Comma-separated batch sizes."),
        trials: Optional[int] = typer.Option(None, "--trials", help="Trials (search-space points) per study."),
        store: Optional[str] = typer.Option(None, "--store", help="Store directory (created if missing)."),
        steps: Optional[int] = typer.Option(None, "--steps", help="A fixed step budget at every batch size. Default: "
                                            "each batch size B gets max(default_steps, ceil(default_steps x "
                                            "default_batch_size / B)) of the workload (docs/methods.md, \"Sweeps\")."),
        budget_epochs: Optional[float] = typer.Option(
            None, "--budget-epochs", help="An epoch budget: steps(B) = max(--min-steps, ceil(E x training examples / "
            "B)), capped by --max-steps."),
        min_steps: Optional[int] = typer.Option(None, "--min-steps", help="Floor of the budget rule at large batch "
                                                "sizes (default: the workload's default_steps)."),
        max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Cap of the budget rule (default: none)."),
        resolution: Optional[float] = typer.Option(None, "--resolution", help="Relative spacing of the goal "
                                                   "metric's evaluations, in (0, 1) (default 0.05)."),
        evaluations: Optional[int] = typer.Option(None, "--evaluations", help="Regular evaluations of every metric "
                                                  "per trial (default: the workload's)."),
        schedule: Optional[str] = typer.Option(None, "--schedule", help="Learning-rate schedule of the default search "
                                               "spaces: constant or linear (decay over [T/2, T] of each budget T)."),
        train_examples: Optional[int] = typer.Option(None, "--train-examples", help="Train on N examples."),
        workers: Optional[int] = typer.Option(None, "--workers", help="Worker processes (default: cores)."),
        scheduler: Optional[str] = typer.Option(None, "--scheduler", help="Existing Dask scheduler tcp://HOST:PORT."),
        dask: bool = typer.Option(False, "--dask", help="Run on a Dask LocalCluster on 127.0.0.1."),
        seed: Optional[int] = typer.Option(None, "--seed", help="Sweep seed (points, trial seeds, data subset)."),
        stop_at_goal: Optional[bool] = typer.Option(None, "--stop-at-goal/--no-stop-at-goal",
                                                    help="Stop a trial at its first evaluation beating the goal."),
        vectorize: Optional[bool] = typer.Option(None, "--vectorize/--no-vectorize",
                                                 help="Force or forbid vectorized trials (default: automatic)."),
        grow_budget: Optional[bool] = typer.Option(None, "--grow-budget/--no-grow-budget",
                                                   help="Grow the budget (and stretch decay and warmup steps) of "
                                                   "studies whose trials all ran out of steps."),
        goal: Optional[float] = typer.Option(None, "--goal", help="Goal on the workload's metric (default: the "
                                             "workload's): trials stop at it and resolve its bracket; the table "
                                             "and budget growth use it."),
        json_lines: bool = typer.Option(False, "--json", help="JSON lines on stdout instead of progress and tables."),
    ) -> None:
        """Run every (workload, optimizer, batch size) study of a sweep; resume where a previous run stopped."""
        from batchlab.errors import BatchlabError
        from batchlab.sweep.config import load_sweep_config, parse_sweep_config
        from batchlab.sweep.runner import prepare_sweep, run_sweep

        overrides = {
            "optimizers": _csv(optimizer, "optimizer"),
            "batch_sizes": _csv(batch_sizes, "batch-sizes", int),
            "trials": trials, "store": store, "steps": steps, "train_examples": train_examples,
            "budget_epochs": budget_epochs, "min_steps": min_steps, "max_steps": max_steps,
            "resolution": resolution, "evaluations": evaluations, "schedule": schedule,
            "workers": workers, "scheduler": scheduler, "seed": seed, "stop_at_goal": stop_at_goal,
            "grow_budget": grow_budget, "goal": goal,
            "executor": "dask" if dask else None,
            "vectorize": None if vectorize is None else ("always" if vectorize else "never"),
        }
        if config is not None:
            if workload is not None:
                raise BatchlabError("give either WORKLOAD or --config, not both (the config file lists workloads)")
            settings = load_sweep_config(config, overrides)
        else:
            if workload is None:
                raise BatchlabError("missing WORKLOAD (e.g. mnist/fc_128_128_128) or --config FILE")
            data = {k: v for k, v in overrides.items() if v is not None}
            data["workloads"] = [workload]
            data.setdefault("optimizers", ["sgd"])
            missing = [flag for flag, key in (("--batch-sizes", "batch_sizes"), ("--trials", "trials"),
                                              ("--store", "store")) if key not in data]
            if missing:
                raise BatchlabError(f"missing {', '.join(missing)} (required without --config)")
            settings = parse_sweep_config(data, source="sweep options")
        plan = prepare_sweep(settings)
        if json_lines:
            from batchlab.sweep.progress import JsonReporter

            reporter = JsonReporter()
        else:
            from batchlab.sweep.progress import RichReporter

            reporter = RichReporter()
        run_sweep(plan, reporter)
