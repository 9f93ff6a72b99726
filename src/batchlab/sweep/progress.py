"""How a sweep reports: progress on stderr and tables on stdout, or JSON lines.

:class:`RichReporter` shows, on a terminal, one progress row per study (trials done / diverged /
remaining, ETA) and an overall row on stderr; when stderr is not a terminal (a file, a pipe, a CI
log) it prints a plain progress line instead, after every :attr:`RichReporter.every_trials`-th trial
and at least every :attr:`RichReporter.every_seconds` seconds when a trial finishes. At the end it
prints on stdout the steps-to-result table (one row per workload and batch size: budget, the bracket
``(steps_lower, steps]``, or ``> censored_at`` when not reached, best trial, trials that reached the
goal, the regime read from the data, the study id) and the S(B) fit with the critical batch sizes
(every named definition of :data:`batchlab.analysis.critical_batch_size.REGISTRY`; data-read regimes
with their reasons). Tables never cut a cell (:func:`batchlab.cli.output.print_table`). Counts on a
resumed sweep include the trials finished before, once. Every number comes from this sweep's own
trials only (:func:`batchlab.sweep.summary.summarize`).

:class:`JsonReporter` prints one JSON object per line on stdout instead (non-finite numbers as
``null``): ``plan``, ``trial`` (a trial this driver ran), ``trials_by_others`` (trials of the sweep
that another driver ran and published meanwhile, :mod:`batchlab.sweep.claims`), ``worker_lost``,
``budget_grown``, ``steps_to_result`` (one per workload and batch size, with ``steps_lower``,
``censored_at``, ``budget``, ``budget_round``, ``study_id`` and ``sweep``), ``critical_batch_size``
(one per workload: :func:`batchlab.analysis.critical_batch_size.summarize_curve`) and ``done`` (with
``trials_run``, ``trials_skipped`` and ``trials_by_others``). docs/methods.md, "Sweeps", defines each
quantity. Both say on stderr when the sweep created its store, and print the plan's warnings there
(``warning: ...``, one line each: :attr:`batchlab.sweep.runner.SweepPlan.warnings`; the ``plan`` event
also lists them, as ``warnings``, when there are any).
"""

from __future__ import annotations

import math
import time
from typing import Any, TextIO

from batchlab.analysis.curve import bracket_text
from batchlab.sweep.runner import Reporter, StudyProgress, SweepPlan, SweepSummary
from batchlab.sweep.worker import TrialOutcome


def _start_notes(plan: SweepPlan, info: dict) -> None:
    """On stderr: that the sweep created its store, and each of the plan's warnings (one line each)."""
    from batchlab.cli.output import note

    if info.get("created_store"):
        note(f"created a new store at {info.get('store')}")
    for warning in plan.warnings:
        note(f"warning: {warning}")


class JsonReporter(Reporter):
    """One JSON object per line on ``stream`` (stdout by default)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream

    def _line(self, obj: dict[str, Any]) -> None:
        from batchlab.cli.output import emit_json

        emit_json(obj, self.stream)

    def start(self, plan: SweepPlan, progress: list[StudyProgress], info: dict) -> None:
        _start_notes(plan, info)
        self._line({
            "event": "plan", "studies": len(progress), "trials": sum(p.total for p in progress), **info,
            "sweep": plan.sweep_id, "batch_sizes": plan.config.batch_sizes, "workloads": plan.config.workloads,
            "optimizers": plan.config.optimizers,
            "budgets": [{"workload": p.study.store_workload, "batch_size": p.study.batch_size,
                         "steps": p.study.steps, "study_id": p.study.digest} for p in progress],
            "budget_rule": {p.study.workload: p.study.budget_rule for p in progress},
            **({"warnings": list(plan.warnings)} if plan.warnings else {}),
        })

    def trial(self, progress: StudyProgress, outcome: TrialOutcome, totals: dict) -> None:
        # the budget round the trial ran in (a grown round has its own budget and study id)
        study = totals.get("study") or progress.study
        self._line({
            "event": "trial", "workload": study.store_workload, "batch_size": study.batch_size,
            "trial_id": outcome.trial_id, "trial_key": outcome.key, "status": outcome.status,
            "steps": outcome.steps, "steps_to_goal": outcome.steps_to_goal, "steps_lower": outcome.steps_lower,
            "budget": study.steps, "budget_round": study.budget_round, "study_id": study.digest,
            "vectorized": outcome.vectorized, "wall_time_s": round(outcome.wall_time_s, 4),
            "study_done": progress.done, "study_diverged": progress.diverged, "study_remaining": progress.remaining,
        })

    def trials_by_others(self, progress: StudyProgress, keys: list[str], totals: dict) -> None:
        study = totals.get("study") or progress.study
        self._line({
            "event": "trials_by_others", "workload": study.store_workload, "batch_size": study.batch_size,
            "trial_keys": keys, "budget_round": study.budget_round, "study_id": study.digest,
            "study_done": progress.done, "study_diverged": progress.diverged, "study_remaining": progress.remaining,
        })

    def worker_lost(self, keys: list[str]) -> None:
        self._line({"event": "worker_lost", "trial_keys": keys, "rerun": True})

    def budget_grown(self, old, new) -> None:
        self._line({"event": "budget_grown", "workload": old.store_workload, "batch_size": old.batch_size,
                    "from_steps": old.steps, "to_steps": new.steps, "round": new.budget_round,
                    "schedule_stretch": new.stretch, "study_id": new.digest})

    def search_refined(self, new) -> None:
        self._line({"event": "search_refined", "workload": new.store_workload, "batch_size": new.batch_size,
                    "search_round": new.search_round, "trials": new.trials, "flags": new.refine["flags"],
                    "around": new.refine["around"], "study_id": new.digest})

    def finish(self, summary: SweepSummary) -> None:
        for workload, rows in summary.results.items():
            for row in rows:
                self._line({"event": "steps_to_result", **summary.goals.get(workload, {}),
                            **result_fields(summary, workload, row)})
        for workload, fit in summary.fits.items():
            if fit is None:
                self._line({"event": "critical_batch_size", "workload": workload, "fit": None,
                            "reason": summary.fit_errors.get(workload)})
            else:
                self._line({"event": "critical_batch_size", "workload": workload, **fit})
        self._line({
            "event": "done", "sweep": summary.sweep_id, "store": summary.store_path,
            "wall_time_s": round(summary.wall_time_s, 3),
            "trials_run": summary.trials_run, "trials_skipped": summary.trials_skipped,
            "trials_by_others": summary.trials_by_others, "workers_lost": summary.workers_lost,
            "budgets_grown": summary.grown, "tuning_flags": summary.tuning_flags, "searches_refined": summary.refined,
            "executor": summary.executor, "workers": summary.workers,
        })


class RichReporter(Reporter):
    """Progress on stderr while running (bars on a terminal, periodic lines otherwise); tables on
    stdout at the end. ``terminal``: force (True) or forbid (False) the bars; default: whether stderr
    is a terminal."""

    #: Off a terminal: a progress line after every this many trials ...
    every_trials_fraction = 0.05
    #: ... and at the first trial finishing at least this many seconds after the last line.
    every_seconds = 10.0

    def __init__(self, terminal: bool | None = None) -> None:
        from rich.console import Console

        self.err = Console(stderr=True)
        self.terminal = self.err.is_terminal if terminal is None else terminal
        self._progress = None
        self._tasks: dict[tuple[str, int], int] = {}
        self._entries: dict[tuple[str, int], StudyProgress] = {}
        self._overall = None
        self._notes: list[str] = []
        self._last_line = 0.0
        self._lines_at = 0
        self._started = time.monotonic()
        self.every_trials = 1

    # --- counts -----------------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        """Trials done (finished before this run included, once), diverged, total and left, over all studies."""
        done = sum(e.done for e in self._entries.values())
        total = sum(e.total for e in self._entries.values())
        diverged = sum(e.diverged for e in self._entries.values())
        return {"done": done, "total": total, "diverged": diverged, "left": total - done}

    def _say(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            from batchlab.cli.output import note

            note(text)

    def _progress_line(self) -> None:
        c = self.counts()
        elapsed = time.monotonic() - self._started
        self._say(f"progress: {c['done']}/{c['total']} trials done, {c['diverged']} diverged, {c['left']} left; "
                  f"{elapsed:.0f} s")
        self._last_line = time.monotonic()
        self._lines_at = c["done"]

    # --- events -----------------------------------------------------------------------------------
    def start(self, plan: SweepPlan, progress: list[StudyProgress], info: dict) -> None:
        _start_notes(plan, info)
        total = sum(p.total for p in progress)
        self._started = self._last_line = time.monotonic()
        self.every_trials = max(1, math.ceil(self.every_trials_fraction * total))
        device = f", device {info['device']}" if info.get("device") not in (None, "auto", "cpu") else ""
        self._say(
            f"sweep: {len(progress)} studies, {total} trials "
            f"({info['finished_before']} already in the store), executor {info['executor']} "
            f"with {info['workers']} workers{device}, store {info['store']}"
        )
        for entry in progress:
            self._entries[(entry.study.store_workload, entry.study.batch_size)] = entry
        if not self.terminal:
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(),
            TextColumn("{task.completed:>4.0f}/{task.total:<4.0f} done  {task.fields[diverged]:>3} diverged  "
                       "{task.fields[remaining]:>4} left"),
            TextColumn("ETA"), TimeRemainingColumn(), TimeElapsedColumn(),
            console=self.err, transient=False, refresh_per_second=4,
        )
        self._progress.start()
        self._overall = self._progress.add_task("all studies", total=total, completed=0, diverged=0, remaining=total)
        for entry in progress:
            self.study_added(entry)
        self._sync()

    def study_added(self, entry: StudyProgress) -> None:
        key = (entry.study.store_workload, entry.study.batch_size)
        self._entries[key] = entry
        if self._progress is not None:
            self._tasks[key] = self._progress.add_task(
                f"{entry.study.store_workload} b={entry.study.batch_size}", total=entry.total, completed=entry.done,
                diverged=entry.diverged, remaining=entry.remaining,
            )

    def _sync(self) -> None:
        """Bring every bar up to its study's counts (which include trials finished before this run)."""
        if self._progress is None:
            return
        for key, entry in self._entries.items():
            if key in self._tasks:
                self._progress.update(self._tasks[key], completed=entry.done, total=entry.total,
                                      diverged=entry.diverged, remaining=entry.remaining)
        c = self.counts()
        self._progress.update(self._overall, completed=c["done"], total=c["total"], diverged=c["diverged"],
                              remaining=c["left"])

    def trial(self, entry: StudyProgress, outcome: TrialOutcome, totals: dict) -> None:
        if self._progress is not None:
            self._sync()
            return
        done = self.counts()["done"]
        if done - self._lines_at >= self.every_trials or time.monotonic() - self._last_line >= self.every_seconds:
            self._progress_line()

    def trials_by_others(self, entry: StudyProgress, keys: list[str], totals: dict) -> None:
        self.trial(entry, None, totals)  # the counts moved as for trials of this driver

    def worker_lost(self, keys: list[str]) -> None:
        self._say(f"a worker died; re-running {len(keys)} trial(s) it held")

    def budget_grown(self, old, new) -> None:
        note = (f"budget grown: {old.store_workload} b={old.batch_size}: every trial ran out of steps before the "
                f"goal at {old.steps} steps (no trial reached it; diverged and stopped-at-goal trials ignored); "
                f"re-running its points with {new.steps} steps, decay and warmup steps stretched x{new.stretch:g}")
        self._notes.append(note)
        self._say(note)
        self._sync()

    def search_refined(self, new) -> None:
        note = (f"search refined: {new.store_workload} b={new.batch_size}: {', '.join(new.refine['flags'])}; "
                f"{new.trials} more trial(s) around its best trial (search round {new.search_round}, analysed with "
                "the study's other trials)")
        self._notes.append(note)
        self._say(note)
        self._sync()

    def close(self) -> None:
        """Stop the progress display (at the end, or when the sweep is interrupted)."""
        if self._progress is not None:
            self._sync()
            self._progress.stop()
            self._progress = None
        elif self._entries and self._lines_at != self.counts()["done"]:
            self._progress_line()

    def finish(self, summary: SweepSummary) -> None:
        from batchlab.analysis.definitions import REGISTRY
        from batchlab.store.schema import DEFAULT_ANALYSIS_STATUSES
        from batchlab.cli.output import line, print_table

        self.close()
        goals = "; ".join(sorted({f"{g['metric']} {'>' if g['maximize'] else '<'} {g['goal']:g}"
                                  for g in summary.goals.values()}))
        rows = []
        for w, results in summary.results.items():
            for r in results:
                fields = result_fields(summary, w, r)
                budget = "-" if fields["budget"] is None else str(fields["budget"])
                if fields["budget_round"]:
                    budget += f" (round {fields['budget_round']})"
                searched = [x for x in fields["budget_rounds"] if x.get("search_round") and x.get("analysed")]
                if searched:  # the trials analysed include search rounds (--refine-search)
                    budget += f" (+ search round {', '.join(str(x['search_round']) for x in searched)})"
                upper = (fields.get("steps_interval") or [None, None])[1]
                reached = f"{r.n_reached}/{r.n_trials}"
                if r.n_raced:
                    reached += f" ({r.n_raced} raced)"
                others = {k: v for k, v in fields["statuses"].items() if k not in DEFAULT_ANALYSIS_STATUSES}
                if others:
                    reached += " (" + ", ".join(f"{v} {k.lower()}" for k, v in sorted(others.items())) + ")"
                bracket = bracket_text(fields.get("steps"), fields.get("steps_lower"), fields.get("censored_at"))
                rows.append([w, str(r.batch_size), budget, bracket, _fmt(upper, "-"),
                             "-" if r.trial_id is None else f"#{r.trial_id}", reached, fields.get("regime") or "-",
                             fields["study_id"] or "-"])
        print_table(
            f"steps to result ({goals}), sweep {summary.sweep_id}: this sweep's trials only",
            ["workload", *((c, "right") for c in ("batch size", "budget", "steps to result", "upper bound",
                                                 "best trial", "reached")), ("regime", "left"), ("study", "left")],
            rows,
            caption="(lower, upper]: the goal was first met after more than lower and at most upper updates "
                    "(evaluation resolution); > N: not reached by any trial within N evaluated steps (censored); "
                    "upper bound: one-sided upper bound on the median best-of-K-trials steps (K = trials analysed; "
                    "no distribution-free lower bound exists); reached: trials known to reach the goal / trials "
                    "analysed (COMPLETE, STOPPED_AT_GOAL, RACED: stopped by racing once it could not be among the two "
                    "best, before it could reach the goal), other trials in parentheses (infeasible: diverged); "
                    "regime: read from the measured points")
        fit_rows, named_rows = [], []
        methods: dict[str, str] = {}
        definitions: dict[str, str] = {}
        for w, fit in summary.fits.items():
            if fit is None:
                fit_rows.append([w, *(["-"] * 8)])
                self._notes.append(f"no fit for {w}: {summary.fit_errors.get(w, 'no fit')}")
                continue
            f = fit.get("fit", {})
            s_min = fit.get("s_min", {})
            measured = s_min.get("measured") if isinstance(s_min, dict) else None
            if isinstance(measured, dict):
                text = _fmt(measured.get("value"), "-")
                if measured.get("value") is not None and measured.get("plateau_seen") is False:
                    text += " (upper bound: no plateau)"
                measured = text
            else:
                measured = _fmt(measured, "-")
            span = fit.get("batch_size_range") or [None, None]
            intervals = fit.get("fit_intervals") or {}

            def with_interval(name: str) -> str:
                entry = intervals.get(name)
                text = _fmt(f.get(name))
                return text if not isinstance(entry, dict) else f"{text} {_interval_text(entry, fit)}"

            fit_rows.append([w, with_interval("s_min"), measured, with_interval("e_min"),
                             _fmt(f.get("rms_log_residual"), "-"),
                             "-" if span[0] is None else f"{_fmt(span[0])}-{_fmt(span[1])}",
                             _fmt(fit.get("points_used"), "-"), _fmt(fit.get("censored_batch_sizes") or None, "-"),
                             _fmt(fit.get("b0"), "-")])
            named = fit.get("critical_batch_sizes", {})
            for d in REGISTRY:  # every named definition, in the registry's order
                entry = named.get(d.name)
                definitions.setdefault(d.name, d.definition)
                if entry is None:
                    named_rows.append([w, d.name, "null", "-", d.source, "not computed for this fit"])
                    continue
                note = entry.get("reason") or entry.get("note") or ""
                described = entry.get("interval") or {}
                if (isinstance(described, dict) and described.get("note") and entry.get("source") != "data"
                        and entry.get("low") is None and entry.get("high") is None):
                    text = str(described["note"])
                    text = text if text.startswith("no interval") else f"no interval: {text}"
                    note = (note + "; " if note else "") + text
                if entry.get("interpolated"):
                    note = ((note + "; " if note else "") + f"the ratio crosses 1 + tolerance near "
                            f"B = {_fmt(entry['interpolated'])} (log-log interpolation between measured batch sizes)")
                named_rows.append([w, d.name, _fmt(entry.get("value"), "null"), _interval_text(entry, fit),
                                   str(entry.get("source", d.source)), note])
                if isinstance(described, dict) and described.get("target"):
                    methods.setdefault(f"{described['target']}: {described.get('method', '')}", d.name)
            if fit.get("extrapolated") and not any("extrapolated" in str(x) for x in fit.get("warnings", [])):
                self._notes.append(f"{w}: B_crit of the fit lies outside the measured batch sizes (extrapolated)")
            shown = [str(e.get("reason")) for e in named.values() if isinstance(e, dict) and e.get("reason")]
            for warning in fit.get("warnings", []):
                if not any(reason in str(warning) for reason in shown):  # null values' reasons are in the table
                    self._notes.append(f"{w}: warning: {warning}")
        print_table("fitted S(B) = S_min + E_min / B (censored batch sizes as lower bounds)",
                    ["workload", *((c, "right") for c in ("S_min fit", "S_min measured", "E_min", "rms log resid",
                                                         "batch sizes", "points", "censored", "B0"))], fit_rows)
        if named_rows:  # none when no workload could be fitted (the notes say why)
            print_table("critical batch sizes (data: read from the measured points; fit: from the fit)",
                        ["workload", ("name", "left"), ("value", "right"), ("interval", "right"),
                         ("source", "left"), ("note", "left")], named_rows,
                        caption="interval: nominal level in parentheses, - : no bound on that side, none: no "
                                "interval (data-read values are measured batch sizes; see the note for fitted "
                                "ones); targets and methods below")
        for name, text in definitions.items():
            line(f"  {name}: {text}")
        for text in methods:
            line(f"  interval target and method: {text}")
        for note in self._notes:
            line(note)
        line(
            f"{summary.trials_run} trials run, {summary.trials_skipped} already finished, "
            + (f"{summary.trials_by_others} run by other drivers, " if summary.trials_by_others else "")
            + f"{summary.workers_lost} lost to dead workers and re-run; {summary.wall_time_s:.1f} s; "
            f"store {summary.store_path}; sweep {summary.sweep_id}"
        )


def result_fields(summary: SweepSummary, workload: str, row) -> dict[str, Any]:
    """The JSON fields of one steps-to-result row: the analysis' own (``to_dict``), the bracket
    (``steps_lower``, ``censored_at``), and the study it comes from (``budget``, ``budget_round``,
    ``study_id``, ``sweep``, and ``budget_rounds``: every round run at that batch size)."""
    fields = dict(row.to_dict())
    rounds = summary.studies.get(workload, {}).get(row.batch_size, [])
    used = next((r for r in rounds if r.get("reported")), rounds[-1] if rounds else {})
    fields.update({"budget": used.get("steps"), "budget_round": used.get("budget_round", 0),
                   "study_id": used.get("study_id"), "sweep": summary.sweep_id, "budget_rounds": rounds,
                   "statuses": dict(summary.statuses.get(workload, {}).get(row.batch_size, {}))})
    fit = summary.fits.get(workload) or {}
    for point in fit.get("regimes", []):
        if isinstance(point, dict) and point.get("batch_size") == row.batch_size:
            fields.update({k: v for k, v in point.items() if k.startswith("steps_interval") or k in
                           ("regime", "fit_regime", "regime_fractions", "regime_fractions_undetermined")})
    return fields


def _interval_text(entry: dict, fit: dict) -> str:
    """``[low, high] (90%)`` of a named value, ``-`` for a missing side; ``-`` when it has no interval."""
    if "low" not in entry and "high" not in entry:
        return "-"
    if entry.get("low") is None and entry.get("high") is None:
        return "none"
    level = fit.get("level")
    suffix = f" ({100 * level:.0f}%)" if isinstance(level, (int, float)) else ""
    return f"[{_fmt(entry.get('low'), '-')}, {_fmt(entry.get('high'), '-')}]{suffix}"


def _fmt(value: Any, none: str = "inf") -> str:
    if value is None:
        return none
    if isinstance(value, float):
        return f"{value:.0f}" if value.is_integer() and abs(value) < 1e15 else f"{value:.4g}"
    if isinstance(value, list):
        return ", ".join(_fmt(v, none) for v in value)
    return str(value)
