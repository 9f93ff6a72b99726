"""Command groups for the measurement store: ``store`` (info, compact, repair), ``import`` and ``export``
(the batch_science release format)."""

from __future__ import annotations

from pathlib import Path

import typer

from batchlab.cli import options as opt
from batchlab.cli.output import check_output_path, emit_json, line, note, print_table

store_app = typer.Typer(help="Inspect and maintain a measurement store.", no_args_is_help=True)
import_app = typer.Typer(help="Import measurements into a store.", no_args_is_help=True)
export_app = typer.Typer(help="Export a store to another format.", no_args_is_help=True)

STORE_OPTION = typer.Option(..., "--store", help="Store directory.")
NEW_STORE_OPTION = typer.Option(
    ..., "--store", help="Store directory (created if missing; its parent directory must exist).")


def _fmt_stop(rule) -> str:
    if not rule:
        return "none"
    # a trial stops when the metric strictly beats the goal (batchlab.train.evaluation.goal_reached)
    return f"{rule['metric']} {'>' if rule['maximize'] else '<'} {rule['goal']:g}"


def _fmt_evaluation(evaluation) -> str:
    if not evaluation:
        return "unknown"
    rule = evaluation.get("rule", "?")
    if rule == "geometric" and "resolution" in evaluation:
        return f"geometric r={evaluation['resolution']:g}"
    if rule == "steps" and isinstance(evaluation.get("steps"), list):
        return f"steps ({len(evaluation['steps'])})"
    return str(rule)


def _print_studies(studies: list[dict]) -> None:
    """The study definitions, one row per study, sorted by workload and batch size."""
    rows = []
    for s in studies:
        n_defs = s["definitions_at_batch_size"]
        counts = ", ".join(f"{k} {v}" for k, v in s["statuses"].items() if v) or "none"
        if s["stop_rule"] is None and s["early_stopping"]:
            stop = "early stopping (rule not recorded)"
        else:
            stop = _fmt_stop(s["stop_rule"])
        rows.append([
            s["workload"], str(s["batch_size"]), s["study_id"], str(s["source"]),
            "?" if s["train_steps"] is None else str(s["train_steps"]),
            "all" if s["train_examples"] is None else str(s["train_examples"]),
            stop, _fmt_evaluation(s["evaluation"]), s["device"], f"{s['n_trials']} ({counts})",
            f"{n_defs} definitions at this batch size" if n_defs > 1 else "",
        ])
    print_table(f"study definitions ({len(studies)})",
                ["workload", "batch size", ("study id", "left"), ("source", "left"), "budget (steps)", "train examples",
                 ("stop rule", "left"), ("evaluation", "left"), ("device", "left"), ("trials (by status)", "left"),
                 ("note", "left")], rows)


@store_app.command("info")
def info(
    store: Path = STORE_OPTION,
    workload: opt.WorkloadFilter = None,
    optimizer: opt.StoreOptimizer = None,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Counts of workloads, studies, trials by status and measurements, and every study definition
    per workload and batch size (id, source, budget, train examples, stop rule, evaluation, device,
    trials by status). Trials run under different definitions at one workload and batch size are separate
    studies (docs/methods.md, "Study definitions and ids"). ``--workload`` (as in ``analyze``) lists only
    its study definitions; a workload the store does not hold is one line naming those it holds."""
    from batchlab.analysis.selection import store_workloads
    from batchlab.errors import BatchlabError
    from batchlab.store import Store
    from batchlab.store.maintenance import store_info

    target = Store.open(store)
    names = None
    if workload is not None:
        con = target.connect()
        try:
            names = store_workloads(con, workload, opt.parse_csv(optimizer, "--optimizer"))
        finally:
            con.close()
    elif optimizer is not None:
        raise BatchlabError("--optimizer needs --workload DATASET/MODEL")
    result = store_info(target, workload=names[0] if names and len(names) == 1 else None)
    if names is not None:
        result["study_definitions"] = [s for s in result["study_definitions"] if s["workload"] in names]
    if as_json:
        emit_json(result)
        return
    trials = result["trials"]
    line(f"store         {result['store']}")
    line(f"workloads     {result['workloads']}")
    line(f"studies       {result['studies']}")
    line("trials        " + ", ".join(f"{k} {v}" for k, v in trials.items()))
    line(f"measurements  {result['measurements']}")
    line("files         " + ", ".join(f"{k} {v}" for k, v in result["files"].items()))
    line(f"pending       {result['pending_trials']} trial(s) being written or abandoned")
    _print_studies(result["study_definitions"])


@store_app.command("compact")
def compact(
    store: Path = STORE_OPTION,
    grace_seconds: float = typer.Option(
        600.0, "--grace-seconds", min=0,
        help="Keep replaced files this long for readers that opened the store before.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Merge small files and remove garbage, without changing any answer."""
    from batchlab.store import Store
    from batchlab.store.maintenance import compact as run_compact

    report = run_compact(Store.open(store), grace_seconds=grace_seconds).as_dict()
    if as_json:
        emit_json(report)
    else:
        merged = sum(report["merged"].values())
        written = sum(report["written"].values())
        line(f"merged {merged} files into {written}; deleted {report['deleted_files']} "
              f"unreferenced files and {report['deleted_log_entries']} old log entries")


@store_app.command("repair")
def repair(
    store: Path = STORE_OPTION,
    dry_run: bool = typer.Option(False, "--dry-run", help="Only say what would be done; write nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Check every commit and every data file (existence, size, sha256) and repair what is damaged: a
    missing log entry is restored from its copy once its files verify; what cannot be verified is moved
    to quarantine/ and recorded; nothing is ever deleted (docs/methods.md, "How the store keeps
    measurements")."""
    from batchlab.store import Store
    from batchlab.store.integrity import repair as run_repair

    root = Store.open(store).root
    actions = run_repair(root, dry_run=dry_run)
    if as_json:
        emit_json({"store": str(root), "dry_run": dry_run, "actions": [a.as_dict() for a in actions]})
        return
    for action in actions:
        line(action.describe(done=not dry_run))
    if not actions:
        line(f"store {root} is intact: every commit present, every data file matches its size and sha256")


def _created(store: Path, created: bool) -> None:
    if created:
        note(f"created a new store at {store}")


@import_app.command("batch-science")
def import_batch_science(
    path: Path = typer.Argument(..., help="Root of the batch_science release tree."),
    store: Path = NEW_STORE_OPTION,
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Skip malformed studies and trials, list them."),
    jobs: int = typer.Option(2, "--jobs", min=1, help="Worker processes reading studies (large trees)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Import a batch_science release tree into a store (created if needed; a failed import leaves no
    new store behind)."""
    from batchlab.errors import BatchlabError
    from batchlab.store import store_for_import
    from batchlab.store.batch_science_import import find_studies
    from batchlab.store.batch_science_import import import_batch_science as run_import

    studies = find_studies(path)  # check the release before creating the store
    if not studies:
        raise BatchlabError(f"no studies (batch size directories with study.json) under {path}")
    with store_for_import(store) as (target, created):
        report = run_import(target, path, skip_bad=skip_bad, jobs=jobs, studies=studies)
    for skipped_path, problem in report.skipped:
        note(f"skipped: {skipped_path}: {problem}")
    _created(store, created)
    if as_json:
        emit_json(report.as_dict())
    else:
        line(f"imported {report.trials_added} trials ({report.measurements_added} measurements) "
              f"from {report.studies} studies in {report.seconds:.1f} s; "
              f"{report.trials_already_present} already present; {len(report.skipped)} skipped")


@import_app.command("table")
def import_table(
    path: Path = typer.Argument(..., help="CSV (.csv, .csv.gz) or Parquet (.parquet, .pq) file, long format."),
    store: Path = NEW_STORE_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Import long-format measurements from any trainer: one row per trial and evaluation step.

    Columns: workload (dataset/model/optimizer), batch_size (>= 1), trial_id (>= 0, unique per
    workload and batch size), step (updates before the evaluation); one column per metric, named
    split/metric (e.g. val/classification_error; an empty cell = not evaluated). Optional, constant
    within a trial: status (COMPLETE, INCOMPLETE, INFEASIBLE, STOPPED_AT_GOAL; default COMPLETE),
    steps (updates run; default the last step), seed; parameters as param:<name> columns (e.g.
    param:learning_rate). Optional, constant within a workload and batch size: train_steps (the
    budget), train_examples. Any other column is an error. Atomic: a malformed file prints one
    error line and writes nothing. Each workload and batch size becomes a study with source
    "table import:<file name>"; importing the same file again adds nothing (docs/methods.md,
    "Table import")."""
    from batchlab.store import store_for_import
    from batchlab.store.table_import import import_table as run_import

    with store_for_import(store) as (target, created):
        report = run_import(target, path).as_dict()
    _created(store, created)
    if as_json:
        emit_json(report)
    else:
        line(f"imported {report['trials_added']} trials ({report['measurements_added']} measurements, "
              f"metrics {', '.join(report['metrics'])}) in {report['studies']} studies from {path}; "
              f"{report['trials_already_present']} already present")


@export_app.command("batch-science")
def export_batch_science(
    store: Path = STORE_OPTION,
    out: Path = typer.Option(..., "--out", help="Directory to write (must not exist or be empty; its parent "
                                                "directory must exist)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Write the store in the batch_science release layout.

    The release knows only COMPLETE, INCOMPLETE and INFEASIBLE: a STOPPED_AT_GOAL trial is written
    as COMPLETE with steps = the updates it ran and batchlab_status STOPPED_AT_GOAL in its
    metadata.json, in a study.json with early_stopping true (the release's own convention for
    early-stopped studies). Several study definitions at one batch size share its directory and are
    listed under batchlab_studies in study.json (docs/methods.md, "Trial statuses")."""
    from batchlab.store import Store
    from batchlab.store.batch_science_export import export_batch_science as run_export

    check_output_path(out, "--out")  # a mistyped parent directory is an error, never created
    report = run_export(Store.open(store), out).as_dict()
    if as_json:
        emit_json(report)
    else:
        line(f"exported {report['studies']} studies, {report['trials']} trials, "
             f"{report['measurements']} measurements to {out}")
        if report["stopped_at_goal"]:
            line(f"{report['stopped_at_goal']} STOPPED_AT_GOAL trial(s) written as status COMPLETE with "
                 "steps = updates run (metadata.json batchlab_status STOPPED_AT_GOAL; study.json "
                 "early_stopping true), the release's convention for early-stopped trials")
        if report["raced"]:
            line(f"{report['raced']} RACED trial(s) written as status INCOMPLETE (metadata.json batchlab_status "
                 "RACED): the release has no status for trials stopped by racing")
        if report["bounded"]:
            line(f"{report['bounded']} value(s) are bounds of goal checks stopped once decided: each is flagged in "
                 "the column <metric>:bound of its row (1: lower bound, -1: upper bound); a reader that ignores "
                 "that column reads them as values")
        if report["merged_batch_sizes"]:
            line(f"{report['merged_batch_sizes']} batch size(s) hold several study definitions: their "
                 "trials share one directory and study.json lists them under batchlab_studies")


def register(app: typer.Typer) -> None:
    """Add the ``store``, ``import`` and ``export`` groups to the main app."""
    app.add_typer(store_app, name="store")
    app.add_typer(import_app, name="import")
    app.add_typer(export_app, name="export")
