"""How a sweep reports: a rich progress display, or JSON lines.

:class:`RichReporter` shows one progress row per study (trials done / diverged / remaining, ETA) and
an overall row on stderr, then prints the steps-to-result table (batch size x workload) and the
fitted critical batch sizes (named definitions) on stdout. :class:`JsonReporter` prints one JSON
object per line on stdout instead: ``plan``, ``trial``, ``worker_lost``, ``budget_grown``,
``steps_to_result`` (one per workload and batch size), ``critical_batch_size`` (one per workload)
and ``done``.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any, TextIO

from batchlab.sweep.runner import Reporter, StudyProgress, SweepPlan, SweepSummary
from batchlab.sweep.worker import TrialOutcome


def _line(stream: TextIO, obj: dict[str, Any]) -> None:
    stream.write(json.dumps(_plain(obj), allow_nan=False) + "\n")
    stream.flush()


def _plain(value: Any) -> Any:
    """``value`` with non-finite floats replaced by None (JSON has no inf or NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class JsonReporter(Reporter):
    """One JSON object per line on ``stream`` (stdout by default)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout

    def start(self, plan: SweepPlan, progress: list[StudyProgress], info: dict) -> None:
        _line(self.stream, {
            "event": "plan", "studies": len(progress), "trials": sum(p.total for p in progress), **info,
            "batch_sizes": plan.config.batch_sizes, "workloads": plan.config.workloads,
            "optimizers": plan.config.optimizers,
        })

    def trial(self, progress: StudyProgress, outcome: TrialOutcome, totals: dict) -> None:
        study = progress.study
        _line(self.stream, {
            "event": "trial", "workload": study.store_workload, "batch_size": study.batch_size,
            "trial_id": outcome.trial_id, "trial_key": outcome.key, "status": outcome.status,
            "steps": outcome.steps, "steps_to_goal": outcome.steps_to_goal, "budget": study.steps,
            "vectorized": outcome.vectorized, "wall_time_s": round(outcome.wall_time_s, 4),
            "study_done": progress.done, "study_diverged": progress.diverged, "study_remaining": progress.remaining,
        })

    def worker_lost(self, keys: list[str]) -> None:
        _line(self.stream, {"event": "worker_lost", "trial_keys": keys, "rerun": True})

    def budget_grown(self, old, new) -> None:
        _line(self.stream, {"event": "budget_grown", "workload": old.store_workload, "batch_size": old.batch_size,
                            "from_steps": old.steps, "to_steps": new.steps, "round": new.budget_round})

    def finish(self, summary: SweepSummary) -> None:
        for workload, rows in summary.results.items():
            for row in rows:
                _line(self.stream, {"event": "steps_to_result", **summary.goals.get(workload, {}), **row.to_dict()})
        for workload, fit in summary.fits.items():
            if fit is None:
                _line(self.stream, {"event": "critical_batch_size", "workload": workload, "fit": None,
                                    "reason": summary.fit_errors.get(workload)})
            else:
                _line(self.stream, {"event": "critical_batch_size", "workload": workload, **fit})
        _line(self.stream, {
            "event": "done", "store": summary.store_path, "wall_time_s": round(summary.wall_time_s, 3),
            "trials_run": summary.trials_run, "trials_skipped": summary.trials_skipped,
            "workers_lost": summary.workers_lost, "budgets_grown": summary.grown,
            "executor": summary.executor, "workers": summary.workers,
        })


class RichReporter(Reporter):
    """Progress bars on stderr while running; tables on stdout at the end."""

    def __init__(self) -> None:
        from rich.console import Console

        self.err = Console(stderr=True)
        self.out = Console()
        self._progress = None
        self._tasks: dict[tuple[str, int], int] = {}
        self._overall = None
        self._notes: list[str] = []

    def start(self, plan: SweepPlan, progress: list[StudyProgress], info: dict) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.err.print(
            f"sweep: {len(progress)} studies, {sum(p.total for p in progress)} trials "
            f"({info['finished_before']} already in the store), executor {info['executor']} "
            f"with {info['workers']} workers, store {info['store']}"
        )
        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(),
            TextColumn("{task.completed:>4.0f}/{task.total:<4.0f} done  {task.fields[diverged]:>3} diverged  "
                       "{task.fields[remaining]:>4} left"),
            TextColumn("ETA"), TimeRemainingColumn(), TimeElapsedColumn(),
            console=self.err, transient=False, refresh_per_second=4,
        )
        self._progress.start()
        total = sum(p.total for p in progress)
        self._overall = self._progress.add_task("[bold]all studies", total=total, completed=0,
                                                diverged=0, remaining=total)
        for entry in progress:
            self.study_added(entry)

    def study_added(self, entry: StudyProgress) -> None:
        key = (entry.study.store_workload, entry.study.batch_size)
        self._tasks[key] = self._progress.add_task(
            f"{entry.study.store_workload} b={entry.study.batch_size}", total=entry.total, completed=entry.done,
            diverged=entry.diverged, remaining=entry.remaining,
        )

    def _refresh_overall(self) -> None:
        tasks = [t for t in self._progress.tasks if t.id != self._overall]
        done = sum(t.completed for t in tasks)
        total = sum(t.total or 0 for t in tasks)
        diverged = sum(t.fields.get("diverged", 0) for t in tasks)
        self._progress.update(self._overall, completed=done, total=total, diverged=diverged,
                              remaining=int(total - done))

    def trial(self, entry: StudyProgress, outcome: TrialOutcome, totals: dict) -> None:
        key = (entry.study.store_workload, entry.study.batch_size)
        self._progress.update(self._tasks[key], completed=entry.done, total=entry.total, diverged=entry.diverged,
                              remaining=entry.remaining)
        self._refresh_overall()

    def worker_lost(self, keys: list[str]) -> None:
        self._progress.console.print(f"[yellow]a worker died; re-running {len(keys)} trial(s) it held")

    def budget_grown(self, old, new) -> None:
        note = (f"budget grown: {old.store_workload} b={old.batch_size}: every trial ran out of steps before the "
                f"goal at {old.steps} steps; re-running its points with {new.steps} steps")
        self._notes.append(note)
        self._progress.console.print(f"[yellow]{note}")
        key = (old.store_workload, old.batch_size)
        self._progress.update(self._tasks[key], total=self._progress.tasks[self._tasks[key]].total + new.trials)

    def finish(self, summary: SweepSummary) -> None:
        from rich.table import Table

        if self._progress is not None:
            self._refresh_overall()
            self._progress.stop()
        workloads = list(summary.results)
        batch_sizes = sorted({r.batch_size for rows in summary.results.values() for r in rows})
        goals = "; ".join(sorted({f"{g['metric']} {'>' if g['maximize'] else '<'} {g['goal']:g}"
                                  for g in summary.goals.values()}))
        table = Table(title=f"steps to result ({goals})", caption="updates until the goal was beaten (best trial "
                      "id, trials that reached the goal / COMPLETE trials)")
        table.add_column("batch size", justify="right")
        for w in workloads:
            table.add_column(w, justify="right")
        by = {(w, r.batch_size): r for w, rows in summary.results.items() for r in rows}
        for b in batch_sizes:
            cells = []
            for w in workloads:
                r = by.get((w, b))
                if r is None:
                    cells.append("-")
                elif r.steps is None:
                    cells.append(f"not reached ({r.n_reached}/{r.n_trials})")
                else:
                    cells.append(f"{r.steps} (#{r.trial_id}, {r.n_reached}/{r.n_trials})")
            table.add_row(str(b), *cells)
        self.out.print(table)
        fits = Table(title="fitted S(B) = S_min + E_min / B and critical batch sizes")
        for column in ("workload", "S_min", "E_min", "mccandlish_b_crit", "overhead_20pct", "perfect_scaling_end",
                       "maximal_parallelism_start", "rms log resid"):
            fits.add_column(column, justify="right" if column != "workload" else "left")
        definitions = {}
        for w, fit in summary.fits.items():
            if fit is None:
                fits.add_row(w, "-", "-", "-", "-", "-", "-", "-")
                self._notes.append(f"no fit for {w}: {summary.fit_errors.get(w, 'no fit')}")
                continue
            named = fit["critical_batch_sizes"]
            definitions.update({k: v["definition"] for k, v in named.items()})
            f = fit["fit"]
            fits.add_row(w, _fmt(f["s_min"]), _fmt(f["e_min"]), *(_fmt(named[k]["value"]) for k in (
                "mccandlish_b_crit", "overhead_20pct", "perfect_scaling_end", "maximal_parallelism_start")),
                _fmt(f["rms_log_residual"]))
        self.out.print(fits)
        for name, text in definitions.items():
            self.out.print(f"  {name}: {text}")
        for note in self._notes:
            self.out.print(note)
        self.out.print(
            f"{summary.trials_run} trials run, {summary.trials_skipped} already finished, "
            f"{summary.workers_lost} lost to dead workers and re-run; {summary.wall_time_s:.1f} s; "
            f"store {summary.store_path}"
        )


def _fmt(value: Any) -> str:
    if value is None:
        return "inf"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
