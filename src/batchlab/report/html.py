"""The report page: one self-contained HTML file (docs/methods.md, "The report").

Structure (what the browser test and readers rely on): every figure is an ``<img data-figure="ID"
alt="...">`` with a base64 PNG ``src`` inside a ``<figure>`` with a ``<figcaption>``; every table is a
``<table>``; one ``<a href="NAME.csv">`` links the numbers. A small inline style sheet, no JavaScript,
no external URL: the page opens from a file.
"""

from __future__ import annotations

import base64
from html import escape

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;
color:#222;line-height:1.4}
h1{font-size:1.6em}h2{font-size:1.3em;border-bottom:1px solid #ccc;padding-top:.6em}h3{font-size:1.05em}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:.85em}
th,td{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}th{background:#f2f2f2}
figure{margin:1em 0;display:inline-block;max-width:100%}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.85em;color:#444;max-width:900px}
.note{color:#444;font-size:.9em}.warn{color:#8a4b00;font-size:.9em}.bad{color:#a00;font-weight:bold}
.verdict{background:#f6f8fa;border-left:4px solid #4a7;padding:.4em .8em}
code{background:#f4f4f4;padding:0 2px}
pre{white-space:pre-wrap;overflow-wrap:anywhere;font-size:.85em}
"""


def figure_html(fig) -> str:
    """One ``<figure>`` with the embedded PNG (:class:`batchlab.report.content.FigureOut`)."""
    data = base64.b64encode(fig.png).decode("ascii")
    return (f'<figure><img data-figure="{escape(fig.id)}" alt="{escape(fig.alt)}" '
            f'src="data:image/png;base64,{data}"><figcaption>{escape(fig.caption)}</figcaption></figure>')


def table_html(table) -> str:
    """One ``<table>`` with its title as caption (:class:`batchlab.report.content.Table`)."""
    head = "".join(f"<th>{escape(str(c))}</th>" for c in table.columns)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(v))}</td>" for v in row) + "</tr>" for row in table.rows)
    note = f'<p class="note">{escape(table.note)}</p>' if table.note else ""
    return f"<table><caption>{escape(table.title)}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}"


def _list(items, css: str = "note") -> str:
    items = [i for i in items if i]
    if not items:
        return ""
    return f'<ul class="{css}">' + "".join(f"<li>{escape(str(i))}</li>" for i in items) + "</ul>"


def _kv(rows) -> str:
    body = "".join(f"<tr><th>{escape(str(k))}</th><td>{escape(str(v))}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _anchor(text: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def page(report) -> str:
    """The whole page of a :class:`batchlab.report.build.ReportData`."""
    from batchlab.report.content import num, summary_line

    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>batchlab report: {escape(report.store_name)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>Batch-size report: {escape(report.store_name)}</h1>",
        f'<p>The numbers behind every figure: <a href="{escape(report.csv_name)}">{escape(report.csv_name)}</a> '
        "(CSV, long format: unit, section, batch_size, quantity, value, lower, upper, note).</p>",
        *_recommendation(report),
        "<h2 id=\"run\">What was run</h2>",
        _kv(report.header),
        table_html(report.settings_table),
        '<p class="note">How units are formed: sweep studies form one unit per (workload, sweep id, device), '
        "analysed as the sweep's own table is (at each batch size the study of the last budget round, all its "
        "trials); other studies (train, study, imports) form one unit per workload and settings group (source, "
        "training examples, evaluation rule, stop rule, device, race, batch order) when that group has at most one "
        "study per batch size, else one unit per study id. Different settings are never pooled. A unit's goal is its "
        "studies' stop rule, else its workload's registered goal. Statuses analysed: COMPLETE, STOPPED_AT_GOAL and "
        "RACED; INFEASIBLE trials appear as diverged in the scatter.</p>",
        "<h2 id=\"summary\">Summary</h2>",
    ]
    rows = []
    for r in report.units:
        bc = r.b_crit
        rows.append([r.unit.name, r.status, r.goal_text or "-",
                     "-" if bc is None else num(bc["value"]),
                     "-" if bc is None else f"[{num(bc['low']) if bc['low'] is not None else '0'}, "
                                            f"{num(bc['high']) if bc['high'] is not None else 'inf'}]",
                     "" if bc is None else ("extrapolated" if bc["extrapolated"] else "inside measured range"),
                     "" if r.verdict is None else r.verdict.text])
    from batchlab.report.content import Table

    parts.append(table_html(Table(f"Units ({report.level:.0%} intervals)",
                                  ["unit", "status", "goal", "B_crit", "interval", "B_crit vs measured range", "learning-rate scaling verdict"],
                                  rows)))
    parts.append("<pre>" + escape("\n".join(report.lines)) + "</pre>")
    parts.append("<p>Contents: " + ('<a href="#recommendation">recommendation</a>, '
                                    if getattr(report, "recommendation", None) is not None else "") + ", ".join(f'<a href="#{_anchor(r.unit.name)}">{escape(r.unit.name)}</a>'
                                             for r in report.units)
                 + (', <a href="#comparisons">comparisons</a>' if report.comparisons else "")
                 + (', <a href="#predictions">predictions</a>' if report.predictions is not None else "")
                 + (', <a href="#steps-tables">steps tables</a>' if report.steps_tables else "")
                 + ', <a href="#definitions">definitions</a></p>')
    for r in report.units:
        parts.append(_unit_html(r, summary_line))
    if report.comparisons:
        parts.append('<h2 id="comparisons">Optimizers compared</h2>')
        for comp in report.comparisons:
            parts.append(f"<h3>{escape(comp.base)} [{escape(comp.group)}]</h3>")
            if comp.figure is not None:
                parts.append(figure_html(comp.figure))
            rows = []
            for ratio in comp.ratios:
                rows.append([ratio["name"], num(ratio["ratio"], 3),
                             f"[{num(ratio['low'], 3) if ratio['low'] is not None else '0'}, "
                             f"{num(ratio['high'], 3) if ratio['high'] is not None else 'inf'}]",
                             ratio.get("difference", ""),
                             "yes" if ratio["extrapolated"] else "", (num(ratio.get("nqm"), 3) + (" (extrapolated)" if ratio.get("nqm_extrapolated") else ""))
                             if "nqm" in ratio else ""])
            parts.append(table_html(Table(
                "Ratio of critical batch sizes (mccandlish_b_crit)",
                ["optimizers", "B_crit ratio", "range from the two intervals", "difference", "extrapolated", "NQM ratio"],
                rows,
                note="A ratio r > 1 means the first optimizer keeps gaining from larger batches up to a batch size r "
                     "times larger than the second (B_crit: where steps are twice their minimum). The range divides "
                     "the ends of the two intervals (low/high, high/low): it covers the true ratio at least when both "
                     f"intervals do, so with two {report.level:.0%} intervals at least {max(0.0, 1 - 2 * (1 - report.level)):.0%} "
                     "of the time (Bonferroni), not a confidence interval at the stated level. Difference: held when the "
                     "two B_crit intervals are disjoint, suggestive when they overlap but neither estimate lies in the "
                     "other's interval, not shown otherwise; an NQM ordering is tested only where the difference is "
                     "held. With --nqm the NQM column "
                     "gives the same ratio of the NQM predictions; they are in the NQM problem's own units, so only "
                     "whether it is above or below 1 (the ordering) is a prediction, not its size.")))
    if report.nqm is not None:
        parts.append('<h2 id="nqm">Noisy quadratic model</h2>')
        parts.append('<p class="note">The NQM prediction (batchlab.report.nqm: exact moment recurrences, tuned per '
                     "batch size; a point whose tuned optimum lies at the grid's edge is an upper bound) is drawn in "
                     "each unit\'s section beside the measured curve, scaled so that it equals the measured steps at B0. "
                     "Its batch sizes are the NQM problem's own units, so neither the position of its bend nor the size "
                     "of its critical batch sizes is a prediction for the workload; the ordering of the optimizers is.</p>")
        rows = [[k, "not modelled" if v is None else v.get("algorithm", ""),
                 "" if v is None else v.get("problem", ""),
                 "" if v is None else num(v.get("b_crit")) + (" (extrapolated)" if v.get("b_crit_extrapolated") else "")]
                for k, v in report.nqm["predictions"].items()]
        parts.append(table_html(Table("NQM predictions", ["optimizer", "algorithm", "problem", "NQM B_crit"], rows)))
    if report.predictions is not None:
        parts.append(_predictions_html(report.predictions))
    if report.steps_tables:
        parts.append('<h2 id="steps-tables">External steps tables</h2>')
        for section in report.steps_tables:
            parts.append(f"<h3>{escape(section['name'])}</h3>")
            if section["figure"] is not None:
                parts.append(figure_html(section["figure"]))
            parts.append(table_html(section["table"]))
            parts.append(_list(section["warnings"], "warn"))
    parts.append(_definitions_html())
    parts.append("</body></html>")
    return "\n".join(parts)


def _recommendation(report) -> list[str]:
    """The Recommendation section (:mod:`batchlab.report.recommendation`), first on the page; none without advice."""
    if getattr(report, "recommendation", None) is None:
        return []
    return [recommendation_html(report.recommendation)]


def _unit_html(r, summary_line) -> str:
    from batchlab.report.content import Table

    u = r.unit
    parts = [f'<h2 id="{_anchor(u.name)}">{escape(u.name)}</h2>']
    counts = {}
    for by_status in r.counts.values():
        for k, v in by_status.items():
            counts[k] = counts.get(k, 0) + v
    rests = [f"group: {u.rule}",
             "studies: " + ("all trials (no study ids)" if u.study_ids is None else ", ".join(u.study_ids)),
             "trials of these studies by status: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
             "goal: " + (f"{r.goal_text} ({r.goal['source']})" if r.goal else "none"),
             f"trials published: {r.published}" if r.published else ""]
    if u.skipped_studies:
        rests.append("not analysed (earlier budget rounds): " + "; ".join(f"{k} {v}" for k, v in u.skipped_studies.items()))
    parts.append(_list(rests))
    if r.status != "analysed":
        parts.append(f'<p class="bad">{escape(r.reason)}</p>')
    if r.verdict is not None:
        parts.append(f'<p class="verdict"><b>Learning-rate scaling verdict</b> (optimal effective learning rate; '
                     f"definition below): {escape(r.verdict.text)}</p>")
    for fig in r.figures:
        parts.append(figure_html(fig))
    for table in r.tables:
        parts.append(table_html(table))
    if r.counts:
        statuses = sorted({k for v in r.counts.values() for k in v})
        rows = [[b, u.batch_study.get(b, ""), *[v.get(s, 0) for s in statuses]] for b, v in sorted(r.counts.items())]
        parts.append(table_html(Table("Trials of the analysed studies per batch size, by status (INFEASIBLE: "
                                      "diverged, not in steps to result)", ["batch size", "study", *statuses], rows)))
    parts.append(_list(r.notes))
    if r.warnings:
        parts.append("<h3>Warnings</h3>" + _list(dict.fromkeys(r.warnings), "warn"))
    return "\n".join(parts)


def _predictions_html(section: dict) -> str:
    """The section "Predictions before sweeping" (:func:`batchlab.report.predictions.predictions_section`)."""
    parts = ['<h2 id="predictions">Predictions before sweeping</h2>',
             '<p class="note">Critical batch sizes predicted from a short reference run (batchlab predict: noise '
             "scales, the calibrated NQM, the branched estimate; batchlab probe noise-scale: B_simple across "
             "training), read from the --predictions files and set beside each matching unit's own measured "
             "mccandlish_b_crit (the number of this report, not the one stored with the prediction). A record "
             "matches the units of its store workload (dataset/model/optimizer) and, when it names a unit, that "
             "unit only.</p>"]
    parts.append(_list(section["warnings"], "warn"))
    if section.get("scores") is not None:  # each predictor scored on its own, beside the naive baselines
        parts.append(table_html(section["scores"]["table"]))
    if not section["units"]:
        parts.append('<p class="note">No prediction matches a unit of this store.</p>')
    for entry in section["units"]:
        parts.append(f"<h3>{escape(entry['result'].unit.name)}</h3>")
        if entry["line"]:
            parts.append(f"<pre>{escape(entry['line'])}</pre>")
        for key in ("figure", "table", "noise_figure", "noise_table"):
            item = entry[key]
            if item is not None:
                parts.append(figure_html(item) if key.endswith("figure") else table_html(item))
    return "\n".join(parts)


DEFINITIONS = [
    ("steps to result S(B)", "the fewest updates after which any analysed trial's goal metric, read at an "
     "evaluation, strictly beats the goal; drawn with its resolution bracket (previous, reaching evaluation]."),
    ("censored", "no analysed trial reached the goal: the steps exceed the smallest last evaluated step (arrow up)."),
    ("upper bound", "one-sided upper bound on the median best-of-K steps at that batch size (an order statistic "
     "of the trials' first steps; exact coverage)."),
    ("S(B) fit", "S(B) = S_min + E_min / B, censored and bracket-weighted least squares on log S."),
    ("B_crit (mccandlish_b_crit)", "E_min / S_min: where training takes twice the minimum steps and twice the "
     "minimum examples; interval by profile likelihood. Extrapolated: outside the measured batch-size range."),
    ("perfect scaling end / maximal parallelism start", "read from the measured points with tolerance 0.1 "
     "(see the named table for all registry entries)."),
    ("effective learning rate", "learning rate / (1 - momentum) of the best trial (the learning rate without momentum)."),
    ("scaling verdict", "anchor: the smallest reached batch size whose best trial is not at a search edge; a rule "
     "(linear: exponent 1, square root: 1/2) fits at B when the rule line through the anchor lies within "
     "delta_anchor + delta_B of the tuned log effective learning rate, delta being the log distance from the best "
     "trial to the nearest other trial of its batch size (the search's resolution, shown as a factor). A range ends "
     "at the first departure or search-edge optimum (undetermined there)."),
    ("best measurement", "the best goal-metric value at any evaluation within a step budget (budgets read from "
     "the data); raced studies refuse budgets beyond a raced trial's stop, and the page says so."),
    ("B_crit ratio", "ratio of two optimizers' B_crit in one study group; the range divides the interval ends."),
    ("prediction ratio", "a predicted critical batch size divided by the unit's measured mccandlish_b_crit (this "
     "report's); its range, predicted low / measured high to predicted high / measured low, holds the ratios "
     "consistent with both intervals and is not a confidence interval."),
    ("within 2x", "a prediction whose ratio to the measured B_crit lies between 0.5 and 2."),
]


def _definitions_html() -> str:
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in DEFINITIONS)
    return ('<h2 id="definitions">Definitions</h2><p class="note">Full definitions: docs/methods.md of batchlab, '
            f'sections "Steps to result", "Critical batch size", "Intervals" and "The report".</p><table>{rows}</table>')


def recommendation_html(section: dict) -> str:
    """The section's HTML: ``<h2 id="recommendation">``, then per record an ``<h3>`` (the unit), the
    answer, the figure, the tables and the lines; the warnings as a list."""
    from batchlab.report.recommendation import SECTION_ID

    parts = [f'<h2 id="{SECTION_ID}">Recommendation</h2>',
             '<p class="note">What batchlab advise recommends for each advised unit (read from the store\'s '
             "advice records): the batch size and its tuned metaparameters for the record's objective, the steps, "
             "examples (updates x batch size) and time (seconds on the measuring device) to the goal with their "
             "intervals, and the trade-off around it. Definitions: docs/methods.md, \"The report's Recommendation "
             "section\".</p>"]
    if section["warnings"]:
        parts.append(_list(section["warnings"], "warn"))
    if not section["entries"]:
        parts.append('<p class="note">No advice record could be read.</p>')
    for entry in section["entries"]:
        record = entry["record"]
        parts.append(f'<h3 id="{escape(entry["anchor"])}">{escape(entry["unit"])} '
                     f'<span class="note">(advice {escape(record["advice_id"])}, {escape(record["status"])})</span></h3>')
        if entry["running"]:
            parts.append(f'<p class="warn">{escape(entry["running"])}</p>')
        if entry["lines"]:
            parts.append('<p class="verdict">' + "<br>".join(escape(x) for x in entry["lines"]) + "</p>")
        elif not entry["running"]:
            parts.append('<p class="bad">no recommendation in this record</p>')
        parts.append(f'<p><b>{escape(entry["compute"])}</b></p>')
        if entry["figure"] is not None:
            parts.append(figure_html(entry["figure"]))
        for table in entry["tables"]:
            parts.append(table_html(table))
        parts.append(_list(entry["text"]))
        if entry["unit_anchor"]:
            parts.append(f'<p class="note">The unit\'s own section: <a href="#{escape(entry["unit_anchor"])}">'
                         f'{escape(entry["unit"])}</a>.</p>')
    return "\n".join(parts)
