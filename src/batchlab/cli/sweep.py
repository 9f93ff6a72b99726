"""``batchlab sweep``: whole batch-size studies in parallel, resumable, with progress.

``batchlab sweep WORKLOAD --optimizer sgd,momentum --batch-sizes 16,64,256 --trials 8 --store DIR``,
``batchlab sweep --config sweep.toml`` or both (WORKLOAD and options given on the command line override
the file); ``--search-space FILE`` replaces the search spaces of the optimizers it names.
The command only parses: :func:`batchlab.sweep.config.sweep_config_from_options` holds the defaults
and validates everything before any trial runs (a bad value is one ``error: ...`` line, exit 2);
:func:`batchlab.sweep.runner.prepare_sweep` and :func:`~batchlab.sweep.runner.run_sweep` run it, and
:mod:`batchlab.sweep.progress` reports. Ctrl-C exits with status 130 and one line saying how many
trials are saved (re-running the same command resumes).
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from batchlab.cli import options as opt

#: The ``--help`` epilog: where the TOML format is documented and its keys (tests check the keys
#: against ``SweepConfig``).
CONFIG_KEYS = (
    "workloads", "optimizers", "batch_sizes", "trials", "store", "steps", "budget_epochs", "min_steps",
    "max_steps", "budgets", "train_examples", "seed", "stop_at_goal", "grow_budget", "grow_factor",
    "max_budget_growths", "refine_search", "executor", "workers", "scheduler", "evaluations", "resolution",
    "schedule", "goal", "device", "vectorize", "vectorize_trials", "race", "batch_order", "search_spaces",
)
EPILOG = (
    "Sweep config files (--config FILE, TOML; WORKLOAD and options given on the command line override the file) "
    "are documented in README.md, section \"Sweep config files\", with the example "
    "src/batchlab/sweep/examples/mnist_fc128_sgd_momentum.toml. Keys: " + ", ".join(CONFIG_KEYS) + "."
)

#: ``--json`` with what this module\'s commands print.
SweepJson = opt.json_option("JSON lines on stdout instead of progress and tables.")


def register(app: typer.Typer) -> None:
    """Add ``sweep`` to the main app."""

    @app.command("sweep", epilog=EPILOG)
    def sweep(
        workload: Annotated[Optional[str], typer.Argument(help=opt.WORKLOAD_HELP, metavar="WORKLOAD")] = None,
        config: Annotated[Optional[str], typer.Option(
            "--config", metavar="FILE",
            help="TOML sweep file (README.md, \"Sweep config files\"); WORKLOAD and the options given here override "
                 "its keys.")] = None,
        optimizer: Annotated[Optional[str], typer.Option(
            "--optimizer", help="Optimizer name(s), comma-separated (default: sgd).")] = None,
        batch_sizes: Annotated[Optional[str], typer.Option("--batch-sizes", help="Comma-separated batch sizes.")] = None,
        only_batch_sizes: Annotated[Optional[str], typer.Option(
            "--only-batch-sizes", metavar="B1,B2,...",
            help="Run only the studies at these of the sweep's batch sizes, as part of the same sweep (same sweep "
                 "id, study definitions and trial keys; re-run without it for the rest).")] = None,
        only_optimizers: Annotated[Optional[str], typer.Option(
            "--only-optimizers", metavar="NAME,...",
            help="Run only the studies of these of the sweep's optimizers, as part of the same sweep (as "
                 "--only-batch-sizes).")] = None,
        trials: Annotated[Optional[int], typer.Option("--trials", help="Trials (search-space points) per study.")] = None,
        store: Annotated[Optional[str], typer.Option(
            "--store", help="Store directory (created if missing; its parent directory must exist).")] = None,
        steps: Annotated[Optional[int], typer.Option(
            "--steps", help="A fixed step budget at every batch size. Default: each batch size B gets "
                            "max(default_steps, ceil(default_steps x default_batch_size / B)) of the workload "
                            "(docs/methods.md, \"Sweeps\").")] = None,
        budget_epochs: Annotated[Optional[float], typer.Option(
            "--budget-epochs", help="An epoch budget: steps(B) = max(--min-steps, ceil(E x training examples / "
                                    "B)), capped by --max-steps.")] = None,
        min_steps: Annotated[Optional[int], typer.Option(
            "--min-steps", help="Floor of the budget rule at large batch sizes (default: the workload's "
                                "default_steps).")] = None,
        max_steps: Annotated[Optional[int], typer.Option(
            "--max-steps", help="Cap of the budget rule (default: none).")] = None,
        resolution: Annotated[Optional[float], typer.Option(
            "--resolution", help="Relative spacing of the goal metric's evaluations, in (0, 1) "
                                 "(default 0.05).")] = None,
        evaluations: Annotated[Optional[int], typer.Option(
            "--evaluations", help="Regular evaluations of every metric per trial (default: the workload's).")] = None,
        schedule: Annotated[Optional[str], typer.Option(
            "--schedule", help="Learning-rate schedule of the default search spaces: constant or linear (decay "
                               "over [T/2, T] of each budget T).")] = None,
        train_examples: opt.TrainExamples = None,
        workers: opt.Workers = None,
        scheduler: opt.Scheduler = None,
        dask: opt.Dask = False,
        device: opt.Device = None,  # None: the config file's, else auto
        seed: Annotated[Optional[int], typer.Option(
            "--seed", help="Sweep seed (points, trial seeds, data subset).")] = None,
        stop_at_goal: Annotated[Optional[bool], typer.Option(
            "--stop-at-goal/--no-stop-at-goal",
            help="Stop a trial at its first evaluation beating the goal (default: on).")] = None,
        vectorize: Annotated[Optional[bool], typer.Option(
            "--vectorize/--no-vectorize", help="Force or forbid vectorized trials (default: automatic).")] = None,
        race: Annotated[Optional[bool], typer.Option(
            "--race/--no-race",
            help="Stop each trial as soon as it can no longer be among its study's two best (status RACED): the "
                 "same steps to result, brackets, best trials and steps intervals as the full protocol, for less "
                 "compute (docs/methods.md, 'Racing'). Default: off.")] = None,
        batch_order: Annotated[Optional[str], typer.Option(
            "--batch-order",
            help="trial: each trial draws its own batch order (default); shared: the trials of a study share one "
                 "order (recorded in the study definition; lets vectorized trials share their input).")] = None,
        grow_budget: Annotated[Optional[bool], typer.Option(
            "--grow-budget/--no-grow-budget",
            help="Grow the budget (and stretch decay and warmup steps) of studies whose trials all ran out of "
                 "steps.")] = None,
        refine_search: Annotated[Optional[str], typer.Option(
            "--refine-search", metavar="BUDGET",
            help="After the sweep's trials, up to BUDGET (a positive integer) more trials per study that a tuning "
                 "flag fires for, in a box around its best trial, as a recorded search round 1 of that study; the "
                 "table analyses all rounds of a study together (docs/methods.md, \"Refined search\").")] = None,
        goal: Annotated[Optional[float], typer.Option(
            "--goal", help="Goal on the workload's metric (default: the workload's): trials stop at it and "
                           "resolve its bracket; the table and budget growth use it.")] = None,
        search_space: opt.SearchSpaceFile = None,
        json_lines: SweepJson = False,
    ) -> None:
        """Run every (workload, optimizer, batch size) study of a sweep; resume where a previous run stopped."""
        from batchlab.cli.output import note
        from batchlab.sweep.config import sweep_config_from_options
        from batchlab.sweep.runner import SweepInterrupted, prepare_sweep, run_sweep
        from batchlab.train.device import check_device

        if device is not None:
            device = check_device(device)  # here: its message without the "sweep options: field" prefix
        if refine_search is not None:
            from batchlab.sweep.refine import refine_budget

            refine_search = refine_budget(refine_search)  # one line naming the flag, exit 2
        options = {
            "optimizers": opt.parse_csv(optimizer, "--optimizer"),
            "batch_sizes": opt.parse_csv(batch_sizes, "--batch-sizes", int),
            "trials": trials, "store": store, "steps": steps, "train_examples": train_examples,
            "budget_epochs": budget_epochs, "min_steps": min_steps, "max_steps": max_steps,
            "resolution": resolution, "evaluations": evaluations, "schedule": schedule,
            "workers": workers, "scheduler": scheduler, "seed": seed, "stop_at_goal": stop_at_goal,
            "grow_budget": grow_budget, "refine_search": refine_search, "goal": goal, "device": device, "race": race,
            "batch_order": batch_order,
            "executor": "dask" if dask else None,
            "vectorize": None if vectorize is None else ("always" if vectorize else "never"),
        }
        settings = sweep_config_from_options(workload, config, options, search_space)
        plan = prepare_sweep(settings)
        if only_batch_sizes is not None or only_optimizers is not None:
            from batchlab.sweep.runner import part_of

            plan = part_of(plan, None if only_batch_sizes is None else opt.parse_csv(only_batch_sizes,
                                                                                      "--only-batch-sizes", int),
                           None if only_optimizers is None else opt.parse_csv(only_optimizers, "--only-optimizers"))
        if json_lines:
            from batchlab.sweep.progress import JsonReporter

            reporter = JsonReporter()
        else:
            from batchlab.sweep.progress import RichReporter

            reporter = RichReporter()
        try:
            run_sweep(plan, reporter)
        except KeyboardInterrupt as exc:
            import signal

            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the message short
            reporter.close()
            # SweepInterrupted says how many trials are saved; a Ctrl-C outside the run loop cannot
            note(str(exc) if isinstance(exc, SweepInterrupted) else "interrupted: re-run the same command to resume")
            raise SystemExit(130) from None  # not typer.Exit: main() would add a second line
