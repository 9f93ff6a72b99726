"""Commands ``workloads``, ``optimizers``, ``train`` and ``study``: what exists, one trial, one study.

With ``--json`` each command prints one JSON object per line on stdout (non-finite numbers as
``null``); without it, tables (and a progress bar on stderr while training on a terminal). WORKLOAD
is a registered name, ``package.module:function`` or ``path/to/file.py:function``
(:func:`batchlab.workloads.resolve_workload`); ``--device`` is checked before anything runs.
Options shared with other commands come from :mod:`batchlab.cli.options`, output goes through
:mod:`batchlab.cli.output`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from batchlab.cli import options as opt
from batchlab.cli.output import emit_json, fmt, line, print_table
from batchlab.errors import BatchlabError

#: ``--json`` with what this module\'s commands print.
WorkloadsJson = opt.json_option("One JSON object per workload.")
OptimizersJson = opt.json_option("One JSON object per optimizer.")
StudyJson = opt.json_option("One JSON object per trial, then the best trial.")
TrainJson = opt.json_option(
    "One JSON object per evaluation, then a summary object (status, steps_to_goal and steps_lower: the goal was "
    "first met in (steps_lower, steps_to_goal]).")


def _number(text: str) -> int | float:
    """An int if ``text`` is an integer literal, else a float; ValueError for neither, or for a value
    that is not finite (:func:`batchlab.finite.finite_real`: an integer beyond the float range too)."""
    from batchlab.finite import finite_real

    try:
        value = int(text)
    except ValueError:
        value = float(text)
    if not finite_real(value):
        raise ValueError(text)
    return value


def parse_hparams(items: list[str] | None) -> dict[str, int | float]:
    """``["name=value", ...]`` -> ``{name: number}``; BatchlabError for a malformed item or a name given twice."""
    parsed: dict[str, int | float] = {}
    for item in items or []:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise BatchlabError(f"--hparam expects NAME=VALUE (e.g. --hparam label_smoothing=0.1), got {item!r}")
        if name in parsed:  # never let the last one win silently
            raise BatchlabError(f"--hparam {name} is given twice; allowed: each name once")
        try:
            parsed[name] = _number(text.strip())
        except ValueError:
            raise BatchlabError(f"--hparam {name}: value must be a finite number, got {text!r:.40}") from None
    return parsed


def _format(value: Any) -> str:
    return "-" if value is None else fmt(value)


def _progress():
    """A progress bar on stderr on a terminal; ``None`` otherwise (no bar in files and pipes)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not console.is_terminal:
        return None
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True)


class _Bar:
    """``with _Bar(description, total) as advance: advance(completed=...)``: a progress bar on a
    terminal, nothing elsewhere."""

    def __init__(self, description: str, total: int) -> None:
        self.progress = _progress()
        self.description, self.total = description, total

    def __enter__(self):
        if self.progress is None:
            return lambda **_: None
        self.progress.__enter__()
        task = self.progress.add_task(self.description, total=self.total)
        return lambda **kw: self.progress.update(task, **kw) if kw else self.progress.advance(task)

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)


def register(app: typer.Typer) -> None:
    """Add ``workloads``, ``optimizers``, ``train`` and ``study`` to the main app."""

    @app.command("workloads")
    def workloads(
        names: Annotated[Optional[list[str]], typer.Argument(
            help="Workloads to show (names or references; default: every registered one).",
            metavar="WORKLOAD_OR_REF")] = None,
        json_output: WorkloadsJson = False,
    ) -> None:
        """List the registered workloads (or the given ones, references included) with their goal,
        default budget and data splits."""
        from batchlab.workloads import get_workload, workload_names

        described = [get_workload(name).describe() for name in (names or workload_names())]
        if json_output:
            for item in described:
                emit_json(item)
            return
        rows = []
        for d in described:
            goal = f"{d['metric']} {'>' if d['maximize'] else '<'} {d['goal']:g}"
            splits = " / ".join(f"{k} {v}" for k, v in d["splits"].items())
            rows.append([d["name"], goal, str(d["default_steps"]), str(d["default_batch_size"]),
                         f"{d['num_parameters']:,}", splits])
        print_table("workloads", ["name", ("goal", "left"), "default steps", "default batch", "parameters",
                                  ("splits", "left")], rows)

    @app.command("optimizers")
    def optimizers(
        json_output: OptimizersJson = False,
    ) -> None:
        """List the optimizers with every hyperparameter's default and the default search space."""
        from batchlab.optim import get_optimizer, optimizer_defaults, optimizer_names
        from batchlab.search import default_search_space

        described = [
            {"name": name, "summary": get_optimizer(name).summary, "defaults": optimizer_defaults(name),
             "search_space": default_search_space(name).to_batch_science()}
            for name in optimizer_names()
        ]
        if json_output:
            for item in described:
                emit_json(item)
            return
        rows = []
        for d in described:
            defaults = ", ".join(f"{k}={_format(v)}" for k, v in d["defaults"].items())
            searched = ", ".join(
                f"{k} {c.get('scale', '')} [{_format(c.get('min_value'))}, {_format(c.get('max_value'))}]"
                for k, c in d["search_space"].items()
            )
            rows.append([d["name"], d["summary"], defaults, searched])
        print_table("optimizers (None = off)", ["name", ("summary", "left"), ("defaults", "left"),
                                                ("searched (constant learning rate)", "left")], rows)

    @app.command("train")
    def train(
        workload: opt.Workload,
        optimizer: opt.Optimizer,
        batch_size: opt.BatchSize,
        learning_rate: Annotated[float, typer.Option("--learning-rate", help="Base learning rate (> 0).")],
        momentum: Annotated[Optional[float], typer.Option(
            "--momentum", help="Momentum, for the optimizers that take one (see batchlab optimizers).")] = None,
        steps: opt.Steps = None,
        train_examples: opt.TrainExamples = None,
        seed: Annotated[int, typer.Option("--seed", help="Model initialisation, data order and training subset.")] = 0,
        store: Annotated[Optional[Path], typer.Option(
            "--store", help="Record the trial into this store (created if missing; its parent directory must "
                            "exist).")] = None,
        stop_at_goal: opt.StopAtGoal = True,
        hparam: Annotated[Optional[list[str]], typer.Option(
            "--hparam", help="Another hyperparameter, NAME=VALUE (repeatable).")] = None,
        eval_every: Annotated[Optional[int], typer.Option(
            "--eval-every", help="Evaluate every N steps instead of the workload's schedule.")] = None,
        eval_budget: opt.EvalBudget = None,
        train_eval_examples: opt.TrainEvalExamples = None,
        resolution: opt.Resolution = 0.05,
        refine: opt.Refine = "replay",
        device: opt.Device = "auto",
        json_output: TrainJson = False,
    ) -> None:
        """Run one trial: print each evaluation, then the status and steps to the goal."""
        from batchlab.train import TrialSpec, prepare_trial, run_prepared
        from batchlab.train.device import check_device
        from batchlab.train.evaluation import every_n_steps
        from batchlab.workloads import get_workload

        device = check_device(device)
        hyperparameters: dict[str, Any] = {"learning_rate": learning_rate}
        if momentum is not None:
            hyperparameters["momentum"] = momentum
        extra = parse_hparams(hparam)
        for name in ("learning_rate", "momentum"):
            if name in extra:
                raise BatchlabError(f"set {name} with --{name.replace('_', '-')}, not --hparam")
        hyperparameters.update(extra)
        w = get_workload(workload)
        budget = w.default_steps if steps is None else steps
        spec = TrialSpec(
            workload=workload, optimizer=optimizer, batch_size=batch_size, hyperparameters=hyperparameters,
            steps=budget, train_examples=train_examples, seed=seed, data_seed=seed, stop_at_goal=stop_at_goal,
            evaluation_steps=None if eval_every is None else every_n_steps(budget, eval_every),
            eval_budget=eval_budget, train_eval_examples=train_eval_examples, resolution=resolution, refine=refine,
            device=device,
        )
        prepared = prepare_trial(spec)  # validates everything before the store is touched
        opened = None if store is None else opt.open_store(store)

        if json_output:
            result = run_prepared(prepared, store=opened, on_measurement=emit_json)
        else:
            rows: list[dict] = []
            with _Bar(f"{w.name} {optimizer} B={batch_size}", budget) as advance:

                def show(row: dict) -> None:
                    rows.append(row)
                    advance(completed=row["step"])

                result = run_prepared(prepared, store=opened, on_measurement=show)
            _print_measurements(rows, title=f"{result.workload}, batch size {batch_size}")
        summary = {
            "status": result.status, "steps_to_goal": result.steps_to_goal, "steps_lower": result.steps_lower,
            "resolution": result.resolution, "steps": result.steps,
            "wall_time_s": round(result.wall_time_s, 3), "workload": result.workload,
            "batch_size": result.batch_size, "trial_id": result.trial_id, "parameters": result.parameters,
            "seed": result.seed, "metric": result.metric, "goal": result.goal,
            "device": result.device,
        }
        if json_output:
            emit_json(summary)
        else:
            reached = "not reached" if result.steps_to_goal is None else (
                "met before any update (step 0)" if result.steps_to_goal == 0 else
                f"reached at step {result.steps_to_goal} (first met in ({result.steps_lower}, {result.steps_to_goal}])")
            params = ", ".join(f"{k}={_format(v)}" for k, v in result.parameters.items())
            line(f"{result.status}: {result.steps} steps in {result.wall_time_s:.1f} s; goal "
                 f"{result.metric} {'>' if result.maximize else '<'} {result.goal:g} {reached}; {params}"
                 + ("" if opened is None else f"; recorded as trial {result.trial_id} in {store}"))

    @app.command("study")
    def study(
        workload: opt.Workload,
        optimizer: opt.Optimizer,
        batch_size: opt.BatchSize,
        trials: Annotated[int, typer.Option("--trials", help="Number of trials (quasi-random points).")],
        store: Annotated[Path, typer.Option(
            "--store", help="Record the trials into this store (created if missing; its parent directory must "
                            "exist).")],
        steps: opt.Steps = None,
        train_examples: opt.TrainExamples = None,
        seed: Annotated[int, typer.Option("--seed", help="Seed of the quasi-random points and of the trials.")] = 0,
        stop_at_goal: opt.StopAtGoal = True,
        eval_budget: opt.EvalBudget = None,
        train_eval_examples: opt.TrainEvalExamples = None,
        resolution: opt.Resolution = 0.05,
        refine: opt.Refine = "replay",
        device: opt.Device = "auto",
        race: opt.Race = False,
        search_space: opt.SearchSpaceFile = None,
        refine_search: Annotated[Optional[str], typer.Option(
            "--refine-search", metavar="BUDGET",
            help="When a tuning flag fires for the study's trials (one reaching trial, best trial at a search "
                 "edge), up to BUDGET (a positive integer) more trials around its best trial, as a recorded search "
                 "round 1 of the study (docs/methods.md, \"Refined search\").")] = None,
        json_output: StudyJson = False,
    ) -> None:
        """Run one study (one workload at one batch size) and print its best trial."""
        from batchlab.optim import get_optimizer
        from batchlab.search import search_spaces_from_file
        from batchlab.train.device import check_device
        from batchlab.train.study import best_final_summary, check_study, run_study

        device = check_device(device)
        if refine_search is not None:
            from batchlab.sweep.refine import refine_budget

            refine_search = refine_budget(refine_search)  # one line naming the flag, exit 2
        given = None
        if search_space is not None:
            get_optimizer(optimizer)  # a misspelt optimizer is named as such, not as one the file leaves out
            given = search_spaces_from_file(search_space, [optimizer]).get(optimizer)
        common = dict(train_examples=train_examples, seed=seed, stop_at_goal=stop_at_goal, eval_budget=eval_budget,
                      train_eval_examples=train_eval_examples, resolution=resolution, refine=refine,
                      device=device, race=race, search_space=given)
        budget = check_study(workload, optimizer, batch_size, trials, steps=steps, **common)
        common["refine_search"] = refine_search
        opened = opt.open_store(store)

        def trial_row(t, index: int) -> dict:
            """One trial's row; ``index``: its place in this run (from ``trials`` on: the search round)."""
            return {
                "trial_id": t.trial_id, "status": t.status, "steps": t.steps, "steps_to_goal": t.steps_to_goal,
                "steps_lower": t.steps_lower,
                "final_metric": t.final_metric(), "parameters": t.parameters, "seed": t.seed,
                "wall_time_s": round(t.wall_time_s, 3),
                **({"search_round": int(index >= trials)} if refine_search is not None else {}),
            }

        emitted: list = []

        def emit_trial(t) -> None:
            emit_json(trial_row(t, len(emitted)))
            emitted.append(t)

        if json_output:
            result = run_study(workload, optimizer, batch_size, trials, opened, steps=budget, on_trial=emit_trial,
                               **common)
        else:
            with _Bar(f"study {workload} {optimizer} B={batch_size}", trials + (refine_search or 0)) as advance:
                result = run_study(workload, optimizer, batch_size, trials, opened, steps=budget,
                                   on_trial=lambda t: advance(), **common)
        best, final = result.best, best_final_summary(result.trials)
        first = result.trials[0]
        raced = sum(t.status == "RACED" for t in result.trials)
        # trials raced by trials of this study run before (a continued study): this run's best is not the study's
        beaten = best is None and raced > 0
        summary = {
            "workload": result.workload, "batch_size": result.batch_size, "trials": len(result.trials),
            "n_raced": raced, "metric": first.metric, "goal": first.goal,
            "reached_goal": None if beaten else best is not None,
            "best_trial": None if best is None else best.trial_id,
            "steps_to_goal": None if best is None else best.steps_to_goal,
            "steps_lower": None if best is None else best.steps_lower,
            "parameters": None if best is None else best.parameters,
            **final,  # best final metric over the COMPLETE trials, only when none reached nor was raced
            **({"tuning_flags": [f.to_dict() for f in result.flags], "refined_trials": len(result.refined)}
               if refine_search is not None else {}),
        }
        if json_output:
            emit_json(summary)
            return
        _print_trials([trial_row(t, i) for i, t in enumerate(result.trials)], first.metric,
                      title=f"{result.workload}, batch size {result.batch_size}")
        for flag in result.flags:
            line(f"tuning flag {flag.kind}: {flag.message}")
        if refine_search is not None:
            line(f"refined search: {len(result.refined)} more trial(s) around the best trial of the first "
                 f"{trials} (search round 1; the best trial below is over all {len(result.trials)})"
                 if result.refined else "refined search: no tuning flag with a best trial, no more trials")
        if best is not None:
            params = ", ".join(f"{k}={_format(v)}" for k, v in best.parameters.items())
            line(f"best trial: {best.trial_id}, {best.steps_to_goal} steps (first met in "
                 f"({best.steps_lower}, {best.steps_to_goal}]) to "
                 f"{first.metric} {'>' if first.maximize else '<'} {first.goal:g} ({params})")
        elif beaten:
            line(f"no trial of this run beat the study's two best trials run before ({raced} raced); the study's "
                 f"steps to result: batchlab analyze steps-to-result --store {store}")
        else:
            text = f"no trial reached {first.metric} {'>' if first.maximize else '<'} {first.goal:g}"
            if final["best_final_trial"] is not None:
                text += (f"; best final {first.metric} = {final['best_final_metric']:.4g} (trial "
                         f"{final['best_final_trial']}, best of the {final['best_final_over']} trials that ran their "
                         "whole budget)")
            line(text)


def _print_measurements(rows: list[dict], title: str) -> None:
    """One row per evaluation; a bounded goal check's value prints as ``<= v`` or ``>= v``
    (docs/methods.md, "Bounded measurements"), its flag row is not a column."""
    from batchlab.store.schema import BOUND_SUFFIX

    names = ["step"] + sorted({k for row in rows for k in row if k != "step" and not k.endswith(BOUND_SUFFIX)})

    def cell(row: dict, name: str) -> str:
        flag = row.get(name + BOUND_SUFFIX)
        return {-1.0: "<= ", 1.0: ">= "}.get(flag, "") + _format(row.get(name)) if name in row else _format(None)

    print_table(title, [(name, "right") for name in names], [[cell(row, n) for n in names] for row in rows])


def _print_trials(rows: list[dict], metric: str, title: str) -> None:
    table_rows = []
    for row in rows:
        params = ", ".join(f"{k}={_format(v)}" for k, v in row["parameters"].items())
        label = f"{row['trial_id']} (search round 1)" if row.get("search_round") else str(row["trial_id"])
        table_rows.append([label, row["status"], _format(row["steps_to_goal"]),
                           _format(row["final_metric"]), params])
    print_table(title, ["trial", ("status", "left"), "steps to goal", f"final {metric}", ("parameters", "left")],
                table_rows)


__all__ = ["register", "parse_hparams"]
