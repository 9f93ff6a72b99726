"""Commands ``workloads``, ``optimizers``, ``train`` and ``study``: what exists, one trial, one study.

With ``--json`` each command prints one JSON object per line on stdout (non-finite numbers as
``null``); without it, rich tables (and a progress bar on stderr while training).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from batchlab.errors import BatchlabError


def _plain(value: Any) -> Any:
    """JSON-safe: non-finite floats become None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _emit(obj: dict) -> None:
    print(json.dumps(_plain(obj)), flush=True)


def _number(text: str) -> int | float:
    """An int if ``text`` is an integer literal, else a float."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def parse_hparams(items: list[str] | None) -> dict[str, int | float]:
    """``["name=value", ...]`` -> ``{name: number}``; BatchlabError for a malformed item."""
    parsed: dict[str, int | float] = {}
    for item in items or []:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise BatchlabError(f"--hparam expects NAME=VALUE (e.g. --hparam label_smoothing=0.1), got {item!r}")
        try:
            parsed[name] = _number(text.strip())
        except ValueError:
            raise BatchlabError(f"--hparam {name}: value must be a number, got {text!r}") from None
    return parsed


def _format(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr)


def _progress():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=_console(stderr=True), transient=True,
    )


def register(app: typer.Typer) -> None:
    """Add ``workloads``, ``optimizers``, ``train`` and ``study`` to the main app."""

    @app.command("workloads")
    def workloads(
        json_output: Annotated[bool, typer.Option("--json", help="One JSON object per workload.")] = False,
    ) -> None:
        """List the registered workloads with their goal, default budget and data splits."""
        from batchlab.workloads import get_workload, workload_names

        described = [get_workload(name).describe() for name in workload_names()]
        if json_output:
            for item in described:
                _emit(item)
            return
        from rich.table import Table

        table = Table(title="workloads")
        for column in ("name", "goal", "default steps", "default batch", "parameters", "splits"):
            table.add_column(column, no_wrap=column == "name")
        for d in described:
            goal = f"{d['metric']} {'>' if d['maximize'] else '<'} {d['goal']:g}"
            splits = " / ".join(f"{k} {v}" for k, v in d["splits"].items())
            table.add_row(d["name"], goal, str(d["default_steps"]), str(d["default_batch_size"]),
                          f"{d['num_parameters']:,}", splits)
        _console().print(table)

    @app.command("optimizers")
    def optimizers(
        json_output: Annotated[bool, typer.Option("--json", help="One JSON object per optimizer.")] = False,
    ) -> None:
        """List the optimizers with every hyperparameter's default and the default search space."""
        from batchlab.optim import optimizer_defaults, optimizer_names
        from batchlab.search import default_search_space

        described = [
            {"name": name, "defaults": optimizer_defaults(name),
             "search_space": default_search_space(name).to_batch_science()}
            for name in optimizer_names()
        ]
        if json_output:
            for item in described:
                _emit(item)
            return
        from rich.table import Table

        table = Table(title="optimizers (None = off)")
        for column in ("name", "defaults", "searched (constant learning rate)"):
            table.add_column(column, no_wrap=column == "name")
        for d in described:
            defaults = ", ".join(f"{k}={_format(v)}" for k, v in d["defaults"].items())
            searched = ", ".join(
                f"{k} {c.get('scale', '')} [{_format(c.get('min_value'))}, {_format(c.get('max_value'))}]"
                for k, c in d["search_space"].items()
            )
            table.add_row(d["name"], defaults, searched)
        _console().print(table)

    @app.command("train")
    def train(
        workload: Annotated[str, typer.Argument(help="Workload name, e.g. mnist/fc_128_128_128.")],
        optimizer: Annotated[str, typer.Option("--optimizer", help="Optimizer name (batchlab optimizers).")],
        batch_size: Annotated[int, typer.Option("--batch-size", help="Examples per update.")],
        learning_rate: Annotated[float, typer.Option("--learning-rate", help="Base learning rate (> 0).")],
        momentum: Annotated[Optional[float], typer.Option("--momentum", help="Momentum (momentum, nesterov, kfac, lars).")] = None,
        steps: Annotated[Optional[int], typer.Option("--steps", help="Step budget (default: the workload's).")] = None,
        train_examples: Annotated[Optional[int], typer.Option("--train-examples", help="Train on a random subset of N examples.")] = None,
        seed: Annotated[int, typer.Option("--seed", help="Model initialisation, data order and training subset.")] = 0,
        store: Annotated[Optional[Path], typer.Option("--store", help="Record the trial into this store (created if missing).")] = None,
        stop_at_goal: Annotated[bool, typer.Option("--stop-at-goal", help="Stop at the first evaluation that beats the goal.")] = False,
        hparam: Annotated[Optional[list[str]], typer.Option("--hparam", help="Another hyperparameter, NAME=VALUE (repeatable).")] = None,
        eval_every: Annotated[Optional[int], typer.Option("--eval-every", help="Evaluate every N steps instead of the workload's schedule.")] = None,
        eval_budget: Annotated[Optional[float], typer.Option("--eval-budget", help="Keep evaluation within this fraction F of training, counted in examples (e.g. 0.1): thins the schedule and evaluation subsets (batchlab.train.evaluation.budgeted_plan).")] = None,
        train_eval_examples: Annotated[Optional[int], typer.Option("--train-eval-examples", help="Measure train/* metrics on a fixed subset of at most N training examples.")] = None,
        resolution: Annotated[float, typer.Option("--resolution", help="Relative spacing R of the goal-metric evaluations, in (0, 1): consecutive evaluation steps within a factor 1+R, every step while 1/R is larger; steps to the goal are read to within that (docs/methods.md, 'Evaluation schedule and resolution').")] = 0.05,
        refine: Annotated[str, typer.Option("--refine", help="How the goal metric is measured at the resolution steps: replay (default: only in the bracket where the goal is first met, by retraining a copy kept at the previous full evaluation) or dense (at every resolution step as the trial runs).")] = "replay",
        json_output: Annotated[bool, typer.Option("--json", help="One JSON object per evaluation, then a summary object (status, steps_to_goal and steps_lower: the goal was first met in (steps_lower, steps_to_goal]).")] = False,
    ) -> None:
        """Run one trial: print each evaluation, then the status and steps to the goal."""
        from batchlab.train import TrialSpec, prepare_trial, run_prepared
        from batchlab.train.evaluation import every_n_steps
        from batchlab.workloads import get_workload

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
        if budget < 1:
            raise BatchlabError(f"steps must be >= 1, got {budget}")
        spec = TrialSpec(
            workload=workload, optimizer=optimizer, batch_size=batch_size, hyperparameters=hyperparameters,
            steps=budget, train_examples=train_examples, seed=seed, data_seed=seed, stop_at_goal=stop_at_goal,
            evaluation_steps=None if eval_every is None else every_n_steps(budget, eval_every),
            eval_budget=eval_budget, train_eval_examples=train_eval_examples, resolution=resolution, refine=refine,
        )
        prepared = prepare_trial(spec)  # validates everything before the store is touched
        opened = None
        if store is not None:
            from batchlab.store import Store

            opened = Store.open(store, create=True)

        if json_output:
            result = run_prepared(prepared, store=opened, on_measurement=_emit)
        else:
            rows: list[dict] = []
            with _progress() as progress:
                task = progress.add_task(f"{w.name} {optimizer} B={batch_size}", total=budget)

                def show(row: dict) -> None:
                    rows.append(row)
                    progress.update(task, completed=row["step"])

                result = run_prepared(prepared, store=opened, on_measurement=show)
            _print_measurements(rows, title=f"{result.workload}, batch size {batch_size}")
        summary = {
            "status": result.status, "steps_to_goal": result.steps_to_goal, "steps_lower": result.steps_lower,
            "resolution": result.resolution, "steps": result.steps,
            "wall_time_s": round(result.wall_time_s, 3), "workload": result.workload,
            "batch_size": result.batch_size, "trial_id": result.trial_id, "parameters": result.parameters,
            "seed": result.seed, "metric": result.metric, "goal": result.goal,
        }
        if json_output:
            _emit(summary)
        else:
            reached = "not reached" if result.steps_to_goal is None else (
                f"reached at step {result.steps_to_goal} (first met in ({result.steps_lower}, {result.steps_to_goal}])")
            _console().print(
                f"{result.status}: {result.steps} steps in {result.wall_time_s:.1f} s; goal "
                f"{result.metric} {'>' if result.maximize else '<'} {result.goal:g} {reached}"
                + ("" if opened is None else f"; recorded as trial {result.trial_id} in {store}")
            )

    @app.command("study")
    def study(
        workload: Annotated[str, typer.Argument(help="Workload name, e.g. mnist/fc_128_128_128.")],
        optimizer: Annotated[str, typer.Option("--optimizer", help="Optimizer name (batchlab optimizers).")],
        batch_size: Annotated[int, typer.Option("--batch-size", help="Examples per update.")],
        trials: Annotated[int, typer.Option("--trials", help="Number of trials (quasi-random points).")],
        store: Annotated[Path, typer.Option("--store", help="Record the trials into this store (created if missing).")],
        steps: Annotated[Optional[int], typer.Option("--steps", help="Step budget per trial (default: the workload's).")] = None,
        train_examples: Annotated[Optional[int], typer.Option("--train-examples", help="Train on a random subset of N examples.")] = None,
        seed: Annotated[int, typer.Option("--seed", help="Seed of the quasi-random points and of the trials.")] = 0,
        stop_at_goal: Annotated[bool, typer.Option("--stop-at-goal", help="Stop each trial once it beats the goal.")] = False,
        eval_budget: Annotated[Optional[float], typer.Option("--eval-budget", help="Keep evaluation within this fraction F of training, counted in examples (e.g. 0.1): thins the schedule and evaluation subsets (batchlab.train.evaluation.budgeted_plan).")] = None,
        train_eval_examples: Annotated[Optional[int], typer.Option("--train-eval-examples", help="Measure train/* metrics on a fixed subset of at most N training examples.")] = None,
        resolution: Annotated[float, typer.Option("--resolution", help="Relative spacing R of the goal-metric evaluations, in (0, 1): consecutive evaluation steps within a factor 1+R, every step while 1/R is larger; steps to the goal are read to within that (docs/methods.md, 'Evaluation schedule and resolution').")] = 0.05,
        refine: Annotated[str, typer.Option("--refine", help="How the goal metric is measured at the resolution steps: replay (default: only in the bracket where the goal is first met, by retraining a copy kept at the previous full evaluation) or dense (at every resolution step as the trial runs).")] = "replay",
        json_output: Annotated[bool, typer.Option("--json", help="One JSON object per trial, then the best trial.")] = False,
    ) -> None:
        """Run one study (one workload at one batch size) and print its best trial."""
        from batchlab.store import Store
        from batchlab.train.study import check_study, run_study

        budget = check_study(workload, optimizer, batch_size, trials, steps, train_examples, seed, stop_at_goal,
                             eval_budget, train_eval_examples, resolution, refine)
        opened = Store.open(store, create=True)

        def trial_row(t) -> dict:
            return {
                "trial_id": t.trial_id, "status": t.status, "steps": t.steps, "steps_to_goal": t.steps_to_goal,
                "steps_lower": t.steps_lower,
                "final_metric": t.final_metric(), "parameters": t.parameters, "seed": t.seed,
                "wall_time_s": round(t.wall_time_s, 3),
            }

        if json_output:
            result = run_study(workload, optimizer, batch_size, trials, opened, steps=budget,
                               train_examples=train_examples, seed=seed, stop_at_goal=stop_at_goal,
                               eval_budget=eval_budget, train_eval_examples=train_eval_examples,
                               resolution=resolution, refine=refine, on_trial=lambda t: _emit(trial_row(t)))
        else:
            with _progress() as progress:
                task = progress.add_task(f"study {workload} {optimizer} B={batch_size}", total=trials)
                result = run_study(workload, optimizer, batch_size, trials, opened, steps=budget,
                                   train_examples=train_examples, seed=seed, stop_at_goal=stop_at_goal,
                                   eval_budget=eval_budget, train_eval_examples=train_eval_examples,
                                   resolution=resolution, refine=refine, on_trial=lambda t: progress.advance(task))
        best, best_final = result.best, result.best_final
        first = result.trials[0]
        summary = {
            "workload": result.workload, "batch_size": result.batch_size, "trials": len(result.trials),
            "metric": first.metric, "goal": first.goal, "reached_goal": best is not None,
            "best_trial": None if best is None else best.trial_id,
            "steps_to_goal": None if best is None else best.steps_to_goal,
            "steps_lower": None if best is None else best.steps_lower,
            "parameters": None if best is None else best.parameters,
            "best_final_trial": None if best_final is None else best_final.trial_id,
            "best_final_metric": None if best_final is None else best_final.final_metric(),
        }
        if json_output:
            _emit(summary)
            return
        _print_trials([trial_row(t) for t in result.trials], first.metric, title=f"{result.workload}, batch size {result.batch_size}")
        console = _console()
        if best is not None:
            params = ", ".join(f"{k}={_format(v)}" for k, v in best.parameters.items())
            console.print(f"best trial: {best.trial_id}, {best.steps_to_goal} steps (first met in "
                          f"({best.steps_lower}, {best.steps_to_goal}]) to "
                          f"{first.metric} {'>' if first.maximize else '<'} {first.goal:g} ({params})")
        else:
            line = f"no trial reached {first.metric} {'>' if first.maximize else '<'} {first.goal:g}"
            if best_final is not None:
                line += f"; best final {first.metric} = {best_final.final_metric():.4g} (trial {best_final.trial_id})"
            console.print(line)


def _print_measurements(rows: list[dict], title: str) -> None:
    from rich.table import Table

    table = Table(title=title)
    names = ["step"] + sorted({k for row in rows for k in row if k != "step"})
    for name in names:
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(*(_format(row.get(name)) for name in names))
    _console().print(table)


def _print_trials(rows: list[dict], metric: str, title: str) -> None:
    from rich.table import Table

    table = Table(title=title)
    for column in ("trial", "status", "steps to goal", f"final {metric}", "parameters"):
        table.add_column(column)
    for row in rows:
        params = ", ".join(f"{k}={_format(v)}" for k, v in row["parameters"].items())
        table.add_row(str(row["trial_id"]), row["status"], _format(row["steps_to_goal"]),
                      _format(row["final_metric"]), params)
    _console().print(table)


__all__ = ["register", "parse_hparams"]
