"""Build a report: check the inputs, analyse every unit, write the page and its CSV (atomically).

:func:`build_report` is what ``batchlab report`` runs. Every input is checked before anything is
computed or written (the output path, the steps tables, the prediction files, the store: it must hold
trials, and some unit must reach its goal); a problem is one :class:`BatchlabError` line and nothing is
written. The CSV is written first and the page second, each atomically; if the page cannot be written
the CSV is removed.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from batchlab.atomic import temporary_path
from batchlab.errors import BatchlabError


@dataclass
class ReportData:
    """What the page shows (:func:`batchlab.report.html.page`)."""

    store_name: str
    csv_name: str
    header: list[tuple[str, str]]
    settings_table: object
    units: list
    comparisons: list
    lines: list[str]
    level: float
    nqm: dict | None = None
    steps_tables: list = field(default_factory=list)
    predictions: dict | None = None  # batchlab.report.predictions.predictions_section, with --predictions
    recommendation: dict | None = None  # batchlab.report.recommendation.recommendation_section: advice records


def check_out_path(out: str | Path) -> tuple[Path, Path]:
    """``(page, csv)`` paths for ``--out``: it must end in ``.html``, its directory must exist and be
    writable, and neither path may be a directory."""
    out = Path(out).expanduser()
    if out.suffix.lower() != ".html":
        raise BatchlabError(f"--out {str(out)!r} must end in .html (the CSV is written beside it as .csv)")
    parent = out.parent
    if parent.exists() and not parent.is_dir():
        raise BatchlabError(f"--out {str(out)!r}: {str(parent)!r} is not a directory")
    if not parent.is_dir():
        raise BatchlabError(f"--out {str(out)!r}: the directory {str(parent)!r} does not exist (create it first)")
    # os.access says yes to root everywhere (and knows nothing of read-only or virtual file systems):
    # create and remove a temporary file there, before any analysis runs
    probe = temporary_path(out)
    try:
        probe.touch(exist_ok=False)
        probe.unlink()
    except OSError as exc:
        raise BatchlabError(f"--out {str(out)!r}: cannot write in {str(parent)!r} ({exc.strerror or exc})") from None
    table = out.with_suffix(".csv")
    for path in (out, table):
        if path.is_dir():
            raise BatchlabError(f"--out {str(out)!r}: {str(path)!r} is an existing directory; give a file name")
        if path.exists() and not os.access(path, os.W_OK):
            raise BatchlabError(f"--out {str(out)!r}: {str(path)!r} exists and is not writable")
    return out, table


def _write_both(page_path: Path, page_text: str, csv_path: Path, csv_body: str) -> None:
    """Write the page and its CSV together: both under temporary names beside them, then both renamed
    (the CSV first), so an error while writing leaves the previous page and CSV (or none) as they were.
    An error that cannot be written is one line (:class:`BatchlabError`)."""
    temporaries = []
    try:
        for path, body in ((csv_path, csv_body), (page_path, page_text)):
            tmp = temporary_path(path)
            temporaries.append((tmp, path))
            tmp.write_bytes(body.encode("utf-8"))
        for tmp, path in temporaries:
            os.replace(tmp, path)
    except OSError as exc:
        raise BatchlabError(f"cannot write the report {str(page_path)!r}: {exc.strerror or exc}") from None
    finally:
        for tmp, _ in temporaries:
            tmp.unlink(missing_ok=True)


def _commit_times(store: Path) -> tuple[float | None, float | None]:
    """The times of the store's first and last commits (its log), or None."""
    times = []
    log = store / "log"
    try:
        names = sorted(p for p in os.listdir(log) if p.endswith(".json"))
    except OSError:
        return None, None
    for name in (names[:1] + names[-1:]) if names else []:
        try:
            times.append(float(json.loads((log / name).read_text()).get("time")))
        except (OSError, ValueError, TypeError):
            pass
    return (min(times), max(times)) if times else (None, None)


#: Commits read for the publication times of the studies (a longer log is not read, and the page says so).
MAX_LOG_ENTRIES = 5000


def study_times(store: Path) -> dict[str, tuple[float, float]] | None:
    """``{study_id: (first, last)}``: the times of the store commits that published each study's trials
    (from the commit log: every commit but a compaction adds its trials files at its time). Studies whose
    trials were rewritten by ``store compact`` are left out (their publication times are gone). None when
    the log is longer than :data:`MAX_LOG_ENTRIES` or cannot be read."""
    import pyarrow.parquet as pq

    log = store / "log"
    try:
        names = sorted(p for p in os.listdir(log) if p.endswith(".json"))
    except OSError:
        return None
    if len(names) > MAX_LOG_ENTRIES:
        return None
    out: dict[str, tuple[float, float]] = {}
    for name in names:
        try:
            entry = json.loads((log / name).read_text())
        except (OSError, ValueError):
            continue
        if entry.get("operation") == "compact" or entry.get("checkpoint"):
            continue
        when = entry.get("time")
        for rel in (entry.get("add") or {}).get("trials", []):
            try:
                ids = pq.read_table(store / rel, columns=["study_id"]).column("study_id").to_pylist()
            except Exception:  # noqa: BLE001 - a file compacted away or unreadable: no time for it
                continue
            for sid in set(ids):
                if sid is not None and isinstance(when, (int, float)):
                    first, last = out.get(sid, (when, when))
                    out[sid] = (min(first, when), max(last, when))
    return out


def _utc(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def _describe(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, dict):
        if "rule" in value:
            rest = ", ".join(f"{k} {v}" if not isinstance(v, (dict, list)) else f"{k} per batch size"
                             for k, v in value.items() if k != "rule" and v is not None)
            return value["rule"] + (f" ({rest})" if rest else "")
        if "metric" in value and "goal" in value:
            return f"{value['metric']} {'>' if value.get('maximize') else '<'} {value['goal']}"
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return str(value)


def _settings(units) -> object:
    from batchlab.report.content import Table

    rows = []
    for u in units:
        budgets = sorted({d.get("train_steps") for d in u.definitions.values() if d.get("train_steps") is not None})
        budget = "" if not budgets else (str(budgets[0]) if len(budgets) == 1 else f"{budgets[0]} to {budgets[-1]}")
        rows.append([
            u.name, "; ".join(str(s) for s in u.setting("source")) if u.definitions else "",
            budget, "; ".join(_describe(v) for v in u.setting("train_examples")) if u.definitions else "",
            "; ".join(_describe(v) for v in u.setting("evaluation")) if u.definitions else "",
            "; ".join(_describe(v) for v in u.setting("stop_rule")) if u.definitions else "",
            "; ".join(_describe(v) for v in u.setting("race")) if u.definitions else "",
            "; ".join(_describe(v) for v in u.setting("batch_order")) if u.definitions else "",
            "; ".join(_describe(v) for v in u.setting("budget_rule")) if u.definitions else "",
        ])
    return Table("Study settings per unit (read from the study definitions)",
                 ["unit", "source", "step budgets", "train examples", "evaluation", "stop rule", "race",
                  "batch order", "budget rule"], rows)


def build_report(store: str | Path, out: str | Path, *, nqm: bool = False, steps_tables=(), predictions=(),
                 n_boot: int = 200, seed: int = 0, level: float = 0.9) -> dict:
    """Write the report of ``store`` to ``out`` (``.html``) and its CSV beside it; return the summary
    ``{"report", "table", "lines", "units", "comparisons", ...}`` (what ``batchlab report`` prints).

    ``predictions``: JSON-lines files of ``batchlab predict --json`` / ``batchlab probe noise-scale
    --json`` records (:mod:`batchlab.report.predictions`), checked before anything is analysed; with
    any, the page gains the predictions section, the CSV its rows, ``lines`` one line per unit with
    predictions, and the summary ``"predictions"`` (one dict per unit) and ``"predictions_warnings"``
    (both None without files)."""
    from batchlab import __version__
    from batchlab.report import content
    from batchlab.report.comparisons import compare_units
    from batchlab.report.csv import csv_text
    from batchlab.report.html import page
    from batchlab.report.predictions import predictions_section, read_predictions
    from batchlab.report.recommendation import recommendation_section
    from batchlab.report.steps_tables import read_steps_tables, steps_table_section
    from batchlab.report.units import find_units
    from batchlab.store import Store

    page_path, csv_path = check_out_path(out)
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 1:
        raise BatchlabError(f"--bootstrap must be an integer >= 1 (trial-resampling replicates), got {n_boot!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise BatchlabError(f"--seed must be an integer >= 0, got {seed!r}")
    if not 0 < float(level) < 1:
        raise BatchlabError(f"--level must lie in (0, 1), got {level!r}")
    tables_in = read_steps_tables(steps_tables)
    prediction_records = read_predictions(predictions) if predictions else None
    store = Path(store)
    con = Store.open(store, create=False).connect()
    try:
        units = find_units(con)
        if not units:
            raise BatchlabError(f"store {str(store)!r} holds no trials: nothing to report (run a sweep or import trials first)")
        results = [content.analyse_unit(con, u, n_boot=n_boot, level=level, seed=seed) for u in units]
    finally:
        con.close()
    if not any(r.status == "analysed" for r in results):
        why = "; ".join(f"{r.unit.name}: {r.reason}" for r in results)
        raise BatchlabError(f"no unit of store {str(store)!r} reached its goal, so there is nothing to report ({why})")
    comparisons = compare_units(results)
    nqm_info = content.nqm_section(results, comparisons) if nqm else None
    table_sections = [steps_table_section(path, frame, group, level) for path, frame, group in tables_in]
    predicted = predictions_section(results, prediction_records) if prediction_records is not None else None

    per_workload: dict[str, int] = {}
    for r in results:
        per_workload[r.unit.workload] = per_workload.get(r.unit.workload, 0) + 1
    lines = [content.summary_line(r, with_group=per_workload[r.unit.workload] > 1) for r in results]
    per_base: dict[str, int] = {}
    for c in comparisons:
        per_base[c.base] = per_base.get(c.base, 0) + 1
    lines += [line for line in (c.summary_line(with_group=per_base[c.base] > 1) for c in comparisons) if line]

    rows = [row for r in results for row in r.rows]
    for comp in comparisons:
        for ratio in comp.ratios:
            span = (f"range from the two {level:.0%} intervals: covers at least "
                    f"{max(0.0, 1 - 2 * (1 - level)):.0%} (Bonferroni)")
            rows.append(content.Row(f"{comp.base} [{comp.group}]", "comparison", None,
                                    f"b_crit_ratio {ratio['name']}", ratio["ratio"], ratio["low"], ratio["high"],
                                    span + f"; difference {ratio['difference']} by the intervals"
                                    + ("; extrapolated" if ratio["extrapolated"] else "")))
            if ratio.get("nqm") is not None:
                rows.append(content.Row(f"{comp.base} [{comp.group}]", "comparison", None,
                                        f"nqm_b_crit_ratio {ratio['name']}", ratio["nqm"], None, None,
                                        "NQM problem's own units: only the ordering is a prediction"
                                        + ("; extrapolated" if ratio.get("nqm_extrapolated") else "")))
    for section in table_sections:
        rows.extend(section["rows"])
    if predicted is not None:
        lines += predicted["lines"] + ([predicted["scores"]["line"]] if predicted["scores"] else [])
        rows.extend(predicted["rows"])
    advice = recommendation_section(store, [r.unit.name for r in results])  # None: no advice directory
    if advice is not None:
        lines = advice["lines"] + lines
        rows = advice["rows"] + rows

    first, last = _commit_times(store)
    times = study_times(store)
    for r in results:
        spans = [times[sid] for sid in (r.unit.study_ids or ()) if times and sid in times]
        if spans:
            r.published = f"{_utc(min(a for a, _ in spans))} to {_utc(max(b for _, b in spans))}"
        else:
            r.published = "unknown (not recorded, compacted, or a long log)"
    statuses: dict[str, int] = {}
    for r in results:
        for by_status in r.counts.values():
            for k, v in by_status.items():
                statuses[k] = statuses.get(k, 0) + v
    sweeps = sorted({str(d["sweep"]) for u in units for d in u.definitions.values() if d.get("sweep") is not None})
    seeds = sorted({d.get("seed") for u in units for d in u.definitions.values()}, key=str)
    devices = sorted({d.get("device") or "cpu" for u in units for d in u.definitions.values()}) or ["unknown"]
    n_studies = sum(len(u.study_ids or ()) for u in units)
    header = [
        ("store", str(store)),
        ("report written", _utc(time.time())),
        ("batchlab version", __version__),
        ("store commits", f"first {_utc(first)}, last {_utc(last)} (each unit gives when its trials were published)"),
        ("units", f"{len(results)} ({sum(r.status == 'analysed' for r in results)} analysed, "
                  f"{sum(r.status == 'unreached' for r in results)} without a reached goal, "
                  f"{sum(r.status == 'skipped' for r in results)} not analysed)"),
        ("workloads", ", ".join(sorted(per_workload))),
        ("studies analysed", str(n_studies)),
        ("sweep ids", ", ".join(sweeps) or "none"),
        ("trials of the analysed studies, by status", ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()))),
        ("study seeds", ", ".join("none" if s is None else str(s) for s in seeds) or "unknown"),
        ("devices", ", ".join(devices)),
        ("intervals", f"{level:.0%}; {n_boot} trial-resampling replicates (regime shares), seed {seed}"),
    ]
    report = ReportData(store_name=store.name or str(store), csv_name=csv_path.name, header=header,
                        settings_table=_settings(units), units=results, comparisons=comparisons, lines=lines,
                        level=level, nqm=nqm_info, steps_tables=table_sections, predictions=predicted,
                        recommendation=advice)
    _write_both(page_path, page(report), csv_path, csv_text(rows))
    return {
        "report": str(page_path),
        "table": str(csv_path),
        "lines": lines,
        "units": [_unit_json(r) for r in results],
        "comparisons": [{"base": c.base, "group": c.group,
                         "ratios": [{k: v for k, v in ratio.items() if k not in ("numerator", "denominator")}
                                    for ratio in c.ratios]} for c in comparisons],
        "nqm": nqm_info,
        "steps_tables": [{"name": s["name"], "path": s["path"], "group_by": s["group"]} for s in table_sections],
        "predictions": None if predicted is None else predicted["json"],
        "predictions_warnings": None if predicted is None else predicted["warnings"],
        "predictions_scores": None if predicted is None or predicted["scores"] is None else predicted["scores"]["json"],
        "advice": None if advice is None else advice["json"],
        "advice_warnings": None if advice is None else advice["warnings"],
    }


def _unit_json(r) -> dict:
    return {
        "unit": r.unit.name, "workload": r.unit.workload, "base": r.unit.base, "optimizer": r.unit.optimizer,
        "group": r.unit.group, "status": r.status, "reason": r.reason, "goal": r.goal,
        "study_ids": None if r.unit.study_ids is None else list(r.unit.study_ids),
        "trials_by_batch_size": {str(b): v for b, v in r.counts.items()},
        "published": r.published,
        "sweep_trials": r.sweep_trials,
        "sweep_examples": r.sweep_examples,
        "b_crit": r.b_crit,
        "verdict": None if r.verdict is None else r.verdict.text,
        "critical_batch_sizes": None if r.estimate is None else r.estimate["critical_batch_sizes"],
        "tuning_flags": [f.to_dict() for f in r.tuning_flags],
        "steps_to_result": [x.to_dict() for x in r.results],
        "warnings": list(dict.fromkeys(r.warnings)),
        "notes": r.notes,
    }
