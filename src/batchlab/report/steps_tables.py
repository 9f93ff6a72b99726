"""External steps tables in the report (docs/methods.md, "The report", **Steps tables**): each read and
checked before anything is computed, then fitted as ``batchlab analyze critical-batch-size
--steps-table`` fits it and drawn."""

from __future__ import annotations

from batchlab.errors import BatchlabError
from batchlab.finite import finite_or_none
from batchlab.report.content import TOLERANCE, FigureOut, Row, Table, beyond_measured, num, render, slug


def read_steps_tables(paths) -> list[tuple[str, object, str | None]]:
    """Read and check every steps table before anything is computed: ``(path, frame, group column)``.
    The group column is the first of ``optimizer``, ``group``, ``label``, ``workload`` the table has."""
    from batchlab.analysis.steps_table import read_steps_table

    out = []
    for path in paths:
        frame = read_steps_table(path)
        columns = frame.attrs.get("columns", list(frame.columns))
        group = next((c for c in ("optimizer", "group", "label", "workload") if c in columns), None)
        out.append((str(path), frame, group))
    return out


def steps_table_section(path: str, frame, group: str | None, level: float = 0.9) -> dict:
    """Fit and draw one steps table as ``batchlab analyze critical-batch-size --steps-table`` fits it
    (:func:`batchlab.analysis.steps_table.table_fit_fn`: one fit with its ``level`` intervals, and the
    trials' scatter where the table has ``n_trials`` and ``second_steps``)."""
    from pathlib import Path

    from batchlab.analysis.definitions import REGISTRY
    from batchlab.analysis.steps_table import steps_table_curves, table_fit_fn, table_groups
    from batchlab.plots.shallue import steps_to_result_figure

    name = f"steps table {Path(path).name}"
    rows_of = dict(table_groups(frame, group))
    curves = steps_table_curves(frame, group_by=group, label=Path(path).stem)
    rows, csv_rows, drawn, fits, warnings = [], [], [], [], []
    for key, curve in curves:
        label = curve.label
        try:
            one = table_fit_fn(rows_of[key], level=level, tolerance=TOLERANCE)(curve)
        except BatchlabError as exc:
            rows.append([label, "-", "-", "-", "-", str(exc)])
            if curve.reached_arrays()[0].size:
                drawn.append(curve)
                fits.append(None)
            continue
        fit = one.fit
        drawn.append(curve)
        fits.append(fit)
        low, high = one.intervals["mccandlish_b_crit"]
        b_crit = f"{num(one.estimates['mccandlish_b_crit'])} [{num(low) if low is not None else '0'}, " \
                 f"{num(high) if high is not None else 'inf'}]"
        rows.append([label, b_crit + (" (extrapolated)" if fit.extrapolated else ""),
                     num(one.estimates["perfect_scaling_end"]), num(one.estimates["maximal_parallelism_start"]),
                     num(fit.s_min), "; ".join(one.warnings)])
        fit_dict = {"smallest_batch_size": fit.smallest_batch_size, "largest_batch_size": fit.largest_batch_size}
        for d in REGISTRY:
            value = one.estimates[d.name]
            entry_low, entry_high = one.intervals[d.name]
            if d.source == "fit":
                flag = beyond_measured({"value": finite_or_none(value), "low": finite_or_none(entry_low), "high": finite_or_none(entry_high)},
                                       fit_dict)
                note = f"{level:.0%} profile-likelihood interval" + (f"; {flag}" if flag else "")
            else:
                note = one.data_regimes[d.name].get("reason") or "read from the data"
            csv_rows.append(Row(name, "steps_table", None, f"{label}: {d.name}", finite_or_none(value),
                                finite_or_none(entry_low), finite_or_none(entry_high), note))
        for b, steps in zip(curve.batch_sizes, curve.steps):
            csv_rows.append(Row(name, "steps_table", b, f"{label}: steps", steps))
        warnings.extend(f"{label}: {w}" for w in one.warnings)
    figure = None
    if drawn:
        fig = steps_to_result_figure(drawn, fits=fits, regimes=len(drawn) == 1, title=name)
        figure = FigureOut(slug(f"steps-table-{Path(path).name}"),
                           f"Steps to result from {Path(path).name} (external; grouped by {group or 'nothing'}), "
                           "fitted and drawn as the measured curves are.", f"steps to result, {name}", render(fig))
    return {"name": name, "path": path, "group": group, "table": Table(
        f"Fits of {Path(path).name}", ["curve", f"B_crit [{level:.0%}]", "perfect scaling end (data)",
                                        "maximal parallelism start (data)", "S_min (fit)", "warnings"], rows),
        "figure": figure, "rows": csv_rows, "warnings": warnings}
