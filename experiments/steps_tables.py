"""Steps tables from the committed reports: one CSV per store, the input of `batchlab analyze critical-batch-size --steps-table`.

The raw stores of the experiments are not committed (runs/ is local), but every report's CSV holds,
per unit and batch size, what a refit needs: the best trial's steps and resolution bracket, the
censoring bound where no trial reached the goal, the trial counts, the second-best trial's steps
(``steps_upper_bound``: the order statistic ``k = 2`` of the K trials, docs/methods.md, "Intervals";
``k = 2`` for every K >= 2 at the reports' 90% level, which every committed report uses: a report
written at another ``--level`` may use another order, and its column is then not the second best)
and the best trial's tuned metaparameters. This script writes them as steps tables
(docs/methods.md, "Steps tables"), so the findings can be refitted with the current statistics:

    .venv/bin/python experiments/steps_tables.py            # writes experiments/reports/<store>/steps.csv
    .venv/bin/batchlab analyze critical-batch-size --steps-table experiments/reports/fc128_race/steps.csv --group-by unit

Columns: unit (the report's unit label, e.g. ``mnist/fc_128_128_128/sgd [sweep 6c992ff3e43c]``: the
name prediction records and ``batchlab predict --score`` match), optimizer, batch_size, steps (empty
where not reached), steps_lower, reached, budget (the censoring bound of an unreached batch size),
n_trials, n_reached, n_raced, second_steps (empty where fewer than two trials reached or the second
is unknown), learning_rate, momentum (the best trial's; empty where not searched).
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

REPORTS = Path(__file__).resolve().parent / "reports"
COLUMNS = ("unit", "optimizer", "batch_size", "steps", "steps_lower", "reached", "budget", "n_trials", "n_reached",
           "n_raced", "second_steps", "learning_rate", "momentum")
_SWEEP = re.compile(r"\s*\[sweep [0-9a-f]+\]$")


def steps_rows(report_csv: Path) -> list[dict]:
    """One row per (unit, batch size) of the report's ``steps_to_result`` and ``metaparameters`` sections."""
    table: dict[tuple[str, int], dict] = {}
    with open(report_csv, newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row["section"] not in ("steps_to_result", "metaparameters") or not row["batch_size"]:
                continue
            unit = row["unit"]
            if _SWEEP.sub("", unit).count("/") < 2:  # the workload's own rows (comparisons), not an optimizer's unit
                continue
            entry = table.setdefault((unit, int(row["batch_size"])), {"unit": unit, "optimizer": _SWEEP.sub("", unit).rsplit("/", 1)[1],
                                                                      "batch_size": int(row["batch_size"])})
            quantity, value = row["quantity"], row["value"]
            if quantity == "steps":
                entry.update(steps=value, steps_lower=row["lower"], reached="true")
            elif quantity == "censored_at":
                entry.update(budget=value, reached="false")
            elif quantity == "steps_upper_bound":
                entry["second_steps"] = value
            elif quantity in ("n_trials", "n_reached", "n_raced", "learning_rate", "momentum"):
                entry[quantity] = value
    rows = []
    for (_, _), entry in sorted(table.items()):
        entry.setdefault("reached", "false" if entry.get("budget") else "")
        if not entry["reached"]:
            continue  # a batch size the report lists without steps or a bound (none in the committed reports)
        rows.append({column: entry.get(column, "") for column in COLUMNS})
    return rows


def main(argv: list[str]) -> int:
    stores = argv or sorted(p.name for p in REPORTS.iterdir() if (p / "report.csv").is_file())
    for store in stores:
        rows = steps_rows(REPORTS / store / "report.csv")
        out = REPORTS / store / "steps.csv"
        tmp = out.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        tmp.replace(out)
        print(f"{out.relative_to(REPORTS.parent.parent)}: {len(rows)} rows, "
              f"{len({r['unit'] for r in rows})} units")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
