"""Command groups for the measurement store: ``store`` (info, compact), ``import`` and ``export``
(the batch_science release format)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import typer

store_app = typer.Typer(help="Inspect and maintain a measurement store.", no_args_is_help=True)
import_app = typer.Typer(help="Import measurements into a store.", no_args_is_help=True)
export_app = typer.Typer(help="Export a store to another format.", no_args_is_help=True)

STORE_OPTION = typer.Option(..., "--store", help="Store directory.")


def _print_json(obj: dict) -> None:
    print(json.dumps(obj, sort_keys=False))


@store_app.command("info")
def info(
    store: Path = STORE_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Counts of workloads, studies, trials by status and measurements."""
    from batchlab.store import Store
    from batchlab.store.maintenance import store_info

    result = store_info(Store.open(store))
    if as_json:
        _print_json(result)
        return
    trials = result["trials"]
    print(f"store         {result['store']}")
    print(f"workloads     {result['workloads']}")
    print(f"studies       {result['studies']}")
    print("trials        " + ", ".join(f"{k} {v}" for k, v in trials.items()))
    print(f"measurements  {result['measurements']}")
    print("files         " + ", ".join(f"{k} {v}" for k, v in result["files"].items()))
    print(f"pending       {result['pending_trials']} trial(s) being written or abandoned")


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
        _print_json(report)
    else:
        merged = sum(report["merged"].values())
        written = sum(report["written"].values())
        print(f"merged {merged} files into {written}; deleted {report['deleted_files']} "
              f"unreferenced files and {report['deleted_log_entries']} old log entries")


@import_app.command("batch-science")
def import_batch_science(
    path: Path = typer.Argument(..., help="Root of the batch_science release tree."),
    store: Path = STORE_OPTION,
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Skip malformed studies and trials, list them."),
    jobs: int = typer.Option(2, "--jobs", min=1, help="Worker processes reading studies (large trees)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Import a batch_science release tree into a store (created if needed)."""
    from batchlab.errors import BatchlabError
    from batchlab.store import Store
    from batchlab.store.batch_science_import import find_studies
    from batchlab.store.batch_science_import import import_batch_science as run_import

    studies = find_studies(path)  # check the release before creating the store
    if not studies:
        raise BatchlabError(f"no studies (batch size directories with study.json) under {path}")
    existed = store.exists()
    target = Store.open(store, create=True)
    try:
        report = run_import(target, path, skip_bad=skip_bad, jobs=jobs, studies=studies)
    except BatchlabError:
        if not existed and target.state().seq == 0:
            shutil.rmtree(store, ignore_errors=True)  # a failed import leaves no new, empty store behind
        raise
    for skipped_path, problem in report.skipped:
        print(f"skipped: {skipped_path}: {problem}", file=sys.stderr)
    if as_json:
        _print_json(report.as_dict())
    else:
        print(f"imported {report.trials_added} trials ({report.measurements_added} measurements) "
              f"from {report.studies} studies in {report.seconds:.1f} s; "
              f"{report.trials_already_present} already present; {len(report.skipped)} skipped")


@export_app.command("batch-science")
def export_batch_science(
    store: Path = STORE_OPTION,
    out: Path = typer.Option(..., "--out", help="Directory to write (must not exist or be empty)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Write the store in the batch_science release layout."""
    from batchlab.store import Store
    from batchlab.store.batch_science_export import export_batch_science as run_export

    report = run_export(Store.open(store), out).as_dict()
    if as_json:
        _print_json(report)
    else:
        print(f"exported {report['studies']} studies, {report['trials']} trials, "
              f"{report['measurements']} measurements to {out}")


def register(app: typer.Typer) -> None:
    """Add the ``store``, ``import`` and ``export`` groups to the main app."""
    app.add_typer(store_app, name="store")
    app.add_typer(import_app, name="import")
    app.add_typer(export_app, name="export")
