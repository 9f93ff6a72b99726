"""Command ``report``: one self-contained HTML page of a store's batch-size science, with a CSV beside it.

``batchlab report --store DIR --out FILE.html [--nqm] [--steps-table FILE ...] [--predictions FILE ...]
[--bootstrap N] [--seed S] [--level L] [--json]``: for every unit (one workload under one study group;
docs/methods.md, "The report") the steps-to-result curve with its fit, intervals and regimes, the named
critical batch sizes, the optimal metaparameters with the scaling-rule verdict, the
learning-rate/momentum scatter, the best measurement under a few budgets; the optimizers of one
workload compared; optionally the NQM prediction, external steps tables and the critical batch sizes
predicted before sweeping (``--predictions``: JSON lines of ``batchlab predict --json`` and/or
``batchlab probe noise-scale --json``). Prints ``report: PATH``, ``table: PATH.csv``, one line per unit
and per compared workload and one per unit with predictions (``--json``: one JSON object instead); a
prediction that matches no unit of the store is a warning on stderr. The work is
:func:`batchlab.report.build.build_report`.
"""

from pathlib import Path
from typing import Annotated, Optional

import typer

from batchlab.cli import options as opt
from batchlab.cli.output import emit_json, line, note


def report(
    store: opt.Store,
    out: Annotated[Path, typer.Option("--out", help="The page to write (.html); the CSV goes beside it (.csv).")],
    nqm: Annotated[bool, typer.Option(
        "--nqm", help="Draw the exact NQM prediction for the same optimizers beside the measured curves (shape only).")] = False,
    steps_tables: Annotated[Optional[list[Path]], typer.Option(
        "--steps-table", help="An external steps table (CSV or Parquet; docs/methods.md, \"Steps tables\"), fitted "
                              "and drawn in its own section; repeat for several.")] = None,
    predictions: Annotated[Optional[list[Path]], typer.Option(
        "--predictions", help="JSON lines of batchlab predict --json and/or batchlab probe noise-scale --json: set "
                              "beside the measured B_crit of the matching units in their own section; repeat for "
                              "several.")] = None,
    n_boot: Annotated[int, typer.Option(
        "--bootstrap", min=1, help="Trial-resampling replicates behind the regime shares (an integer >= 1).")] = 200,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Resampling seed (an integer >= 0).")] = 0,
    level: opt.Level = 0.9,
    json: opt.Json = False,
) -> None:
    """Write one self-contained HTML report of the store (and its numbers as CSV beside it)."""
    from batchlab.report.build import build_report

    summary = build_report(store, out, nqm=nqm, steps_tables=steps_tables or (), predictions=predictions or (),
                           n_boot=n_boot, seed=seed, level=level)
    for warning in summary["predictions_warnings"] or ():
        note(f"warning: {warning}")
    for warning in summary.get("advice_warnings") or ():  # damaged advice records (store/advice/)
        note(f"warning: {warning}")
    if json:
        emit_json(summary)
        return
    line(f"report: {summary['report']}")
    line(f"table: {summary['table']}")
    for text in summary["lines"]:
        line(text)


def register(app: typer.Typer) -> None:
    """Add the ``report`` command to the main app."""
    app.command("report")(report)
