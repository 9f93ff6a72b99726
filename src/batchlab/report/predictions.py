"""The report's predictions section: critical batch sizes predicted before sweeping, beside the
report's own measured ones (docs/methods.md, "Predictions in the report").

``batchlab report --predictions FILE`` reads JSON lines written by ``batchlab predict ... --json``
(one *prediction* per predictor and measured unit) and/or ``batchlab probe noise-scale ... --json``
(one *noise-scale step* per checkpoint). :func:`read_predictions` checks every file before anything is
analysed (a problem is one :class:`BatchlabError` line naming the file and line);
:func:`predictions_section` matches the records to the report's units and computes what the page, the
CSV and the printed summary show. Nothing here writes a file.

Matching: a record belongs to every report unit whose store workload (``dataset/model/optimizer``)
equals ``f"{workload}/{optimizer}"`` of the record and, for a prediction whose ``unit`` is not null,
whose name equals it. Predictions that differ only in their unit and measured fields are one row
(key: predictor and the settings). The measured B_crit is always the report's own (``UnitResult.b_crit``),
never the number stored in the record, and the compute fraction divides the record's ``examples`` by
the unit's sweep examples (``UnitResult.sweep_examples``, :func:`batchlab.report.units.unit_examples`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from batchlab.errors import BatchlabError, decode_utf8, one_line
from batchlab.finite import finite_or_none
from batchlab.probes import scoring

#: Keys a ``batchlab predict --json`` record must have (recognised by ``predictor``).
PREDICTION_KEYS = ("workload", "optimizer", "predictor", "critical_batch_size", "low", "high", "examples", "settings")
#: Keys a ``batchlab probe noise-scale --json`` record must have (recognised by ``step`` and ``b_simple``).
NOISE_KEYS = ("step", "workload", "optimizer", "b_simple", "settings")
#: A prediction is "within 2x" when predicted / measured lies in [1/WITHIN, WITHIN] (the scoring protocol's).
WITHIN = scoring.WITHIN


@dataclass(frozen=True)
class Record:
    """One checked input line. ``kind``: ``prediction`` or ``noise_scale``; ``where``: ``FILE line N``.

    ``value``/``low``/``high``: the predicted critical batch size (or B_simple) and its interval (None:
    missing, unbounded or not finite); ``step``: the checkpoint (``settings.steps_at`` of a prediction,
    ``step`` of a noise-scale record; None when absent); ``batch_size``/``learning_rate``: the reference
    run's; ``key``: the settings as sorted JSON (the dedupe key with ``predictor``; a noise-scale
    record's reference run).
    """

    kind: str
    where: str
    workload: str
    optimizer: str
    value: float | None
    low: float | None
    high: float | None
    step: int | None
    batch_size: float | None
    learning_rate: float | None
    key: str
    predictor: str = ""
    unit: str | None = None
    examples: float | None = None
    note: str = ""
    #: Whether the value comes with an interval (a prediction's ``interval_method``; a noise-scale
    #: record's ``b_simple_interval``): without one, ``low``/``high`` None mean "no interval", not "unbounded".
    has_interval: bool = True
    #: The protocol checkpoint (``settings.protocol_steps_at``), the workload's default batch size
    #: (``settings.default_batch_size``) and the reference run's rule (``settings.reference.rule``), as
    #: recorded by ``batchlab predict``; None in files written before they were recorded.
    protocol_step: int | None = None
    default_batch_size: float | None = None
    reference_rule: str | None = None

    @property
    def store_workload(self) -> str:
        """``dataset/model/optimizer``: the store workload the record predicts."""
        return f"{self.workload}/{self.optimizer}"


def _number(value, name: str, where: str) -> float | None:
    """``value`` as a float; None for null and for non-finite numbers; anything else is an error."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BatchlabError(f"{where}: {name} must be a number or null, got {value!r}")
    value = float(value)
    return value if math.isfinite(value) else None


def _step(value, name: str, where: str, optional: bool = True) -> int | None:
    """``value`` as a step (a whole number >= 0); null is None where ``optional``; anything else is an error."""
    if value is None and optional:
        return None
    if (value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value < 0 or not float(value).is_integer()):
        raise BatchlabError(f"{where}: {name} must be a whole number >= 0{' or null' if optional else ''}, "
                            f"got {'null' if value is None else repr(value)}")
    return int(value)


def _text(obj: dict, name: str, where: str, optional: bool = False) -> str | None:
    value = obj.get(name)
    if optional and value is None:
        return None
    if not isinstance(value, str) or not value:
        raise BatchlabError(f"{where}: {name} must be a non-empty string, got {value!r}")
    return value


def _record(obj: dict, where: str) -> Record:
    """Check one JSON object and return its :class:`Record` (module docstring for the two kinds)."""
    if "predictor" in obj:
        kind, keys, what = "prediction", PREDICTION_KEYS, "a prediction (batchlab predict --json)"
    elif "step" in obj and "b_simple" in obj:
        kind, keys, what = "noise_scale", NOISE_KEYS, "a noise-scale step (batchlab probe noise-scale --json)"
    else:
        raise BatchlabError(
            f"{where}: neither a prediction of batchlab predict --json (keys {', '.join(PREDICTION_KEYS)}) nor a "
            f"step of batchlab probe noise-scale --json (keys {', '.join(NOISE_KEYS)})")
    missing = [k for k in keys if k not in obj]
    if missing:
        raise BatchlabError(f"{where}: {what} needs the keys {', '.join(keys)}; missing {', '.join(missing)}")
    settings = obj["settings"]
    if not isinstance(settings, dict):
        raise BatchlabError(f"{where}: settings must be a JSON object, got {settings!r}")
    hyperparameters = settings.get("hyperparameters")
    if hyperparameters is not None and not isinstance(hyperparameters, dict):
        raise BatchlabError(f"{where}: settings.hyperparameters must be a JSON object, got {hyperparameters!r}")
    rate = settings.get("learning_rate", (hyperparameters or {}).get("learning_rate"))
    reference = settings.get("reference")
    if reference is not None and not isinstance(reference, dict):
        raise BatchlabError(f"{where}: settings.reference must be a JSON object, got {reference!r}")
    rule = (reference or {}).get("rule")
    common = {
        "where": where, "workload": _text(obj, "workload", where), "optimizer": _text(obj, "optimizer", where),
        "batch_size": _number(settings.get("batch_size"), "settings.batch_size", where),
        "learning_rate": _number(rate, "the learning rate in settings", where),
        "key": json.dumps(settings, sort_keys=True, default=str),
        "protocol_step": _step(settings.get("protocol_steps_at"), "settings.protocol_steps_at", where),
        "default_batch_size": _number(settings.get("default_batch_size"), "settings.default_batch_size", where),
        "reference_rule": None if rule is None else str(rule),
    }
    if kind == "prediction":
        note = obj.get("note")
        return Record(
            kind, value=_number(obj["critical_batch_size"], "critical_batch_size", where),
            low=_number(obj["low"], "low", where), high=_number(obj["high"], "high", where),
            step=_step(settings.get("steps_at"), "settings.steps_at", where),
            predictor=_text(obj, "predictor", where), unit=_text(obj, "unit", where, optional=True),
            examples=_number(obj["examples"], "examples", where), note="" if note is None else str(note),
            has_interval=bool(obj.get("interval_method")) or obj["low"] is not None or obj["high"] is not None, **common)
    interval = obj.get("b_simple_interval")
    if interval is not None and not isinstance(interval, dict):
        raise BatchlabError(f"{where}: b_simple_interval must be a JSON object or null, got {interval!r}")
    interval = interval or {}
    step = _step(obj["step"], "step", where, optional=False)
    return Record(kind, value=_number(obj["b_simple"], "b_simple", where),
                  low=_number(interval.get("low"), "b_simple_interval.low", where),
                  high=_number(interval.get("high"), "b_simple_interval.high", where), step=step,
                  has_interval=bool(interval), **common)


def read_predictions(paths, label: str = "--predictions") -> list[Record]:
    """Read and check every ``--predictions`` file (JSON lines; blank lines allowed), in order; ``label``
    names the files in messages (``batchlab predict --score`` passes ``"prediction FILE"``).

    Raises:
        BatchlabError (one line naming the file and, where it applies, the line number): a missing or
            unreadable file, a file without records, a line that is not a JSON object, an object that is
            neither kind (the required keys named), a key of the wrong type or a non-numeric number.
    """
    records: list[Record] = []
    for path in paths:
        path = Path(path).expanduser()
        if not path.is_file():
            raise BatchlabError(f"{label} {str(path)!r} does not exist or is not a file")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise BatchlabError(f"cannot read {label} {str(path)!r}: {exc.strerror or exc}") from None
        text = decode_utf8(data, f"{label} {str(path)!r}")
        found = 0
        for number, raw in enumerate(text.splitlines(), 1):
            if not raw.strip():
                continue
            where = f"{label} {str(path)!r} line {number}"
            try:
                obj = json.loads(raw)
            except ValueError as exc:
                raise BatchlabError(f"{where} is not JSON ({one_line(exc.args[0] if exc.args else exc)})") from None
            except RecursionError:
                raise BatchlabError(f"{where} is not a record: its JSON nests too deeply") from None
            if not isinstance(obj, dict):
                raise BatchlabError(f"{where} is not a JSON object (one object per line, as --json writes)")
            records.append(_record(obj, where))
            found += 1
        if not found:
            raise BatchlabError(f"{label} {str(path)!r} holds no records (one JSON object per line, as "
                                "batchlab predict --json or batchlab probe noise-scale --json write)")
    return records


# --- the section ----------------------------------------------------------------------------------


def _measured(result) -> tuple[float | None, float | None, float | None]:
    """The unit's own mccandlish_b_crit ``(value, low, high)``: value None where it has none."""
    bc = result.b_crit
    if bc is None:
        return None, None, None
    return bc["value"], bc["low"], bc["high"]


def _usable(x) -> bool:
    return x is not None and math.isfinite(float(x)) and float(x) > 0


def ratios(value, low, high, measured, m_low, m_high) -> tuple[float | None, float | None, float | None]:
    """``(ratio, ratio_low, ratio_high)``: value / measured, low / m_high and high / m_low; None where
    either side is missing, unbounded (None) or the measured side is not a positive finite number."""
    ratio = value / measured if value is not None and _usable(measured) else None
    ratio_low = low / m_high if low is not None and _usable(m_high) else None
    ratio_high = high / m_low if high is not None and _usable(m_low) else None
    return ratio, ratio_low, ratio_high


def within(ratio) -> bool | None:
    """Whether ``ratio`` lies in [1/2, 2] (None without a ratio)."""
    return None if ratio is None else 1 / WITHIN <= ratio <= WITHIN


def _interval(low, high) -> str:
    if low is None and high is None:
        return ""
    from batchlab.report.content import num

    return f"[{num(low) if low is not None else '-'}, {num(high) if high is not None else 'inf'}]"


def _measured_interval(measured, low, high) -> str:
    """The measured B_crit's interval as the page's summary writes it (unbounded ends as 0 and inf)."""
    from batchlab.report.content import num

    if measured is None:
        return ""
    return f"[{num(low) if low is not None else '0'}, {num(high) if high is not None else 'inf'}]"


def _reading(estimate: scoring.Estimate) -> str:
    """How the protocol reads a prediction: ``point``, ``lower bound 380``, ``upper bound 90``, ``no value``."""
    from batchlab.report.content import num

    if estimate.kind == "point":
        return "point"
    if estimate.kind == "none":
        return "no value"
    return f"{estimate.kind.replace('_', ' ')} {num(estimate.value)}"


def _within_text(near: bool | None, consistent: bool | None) -> str:
    if near is not None:
        return "yes" if near else "no"
    if consistent is not None:
        return "bound, consistent" if consistent else "bound, not consistent"
    return "-"


def _ratio_text(ratio) -> str:
    from batchlab.report.content import num

    if ratio is None:
        return "-"
    return f"{ratio:.2f}" if 0.1 <= abs(ratio) < 1000 else num(ratio, 2)


def _labels(records: list[Record]) -> list[str]:
    """Row labels: the predictor, ``@step`` when the rows have several checkpoint steps, ``#n`` for
    rows that would still share a label (other reference settings)."""
    steps = {r.step for r in records}
    base = [r.predictor + (f"@{r.step}" if len(steps) > 1 and r.step is not None else "") for r in records]
    seen: dict[str, int] = {}
    out = []
    for label in base:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label}#{seen[label]}")
    return out


def _series_label(r: Record) -> str:
    from batchlab.report.content import num

    return f"{r.optimizer} B={num(r.batch_size)} lr={num(r.learning_rate)}"


def predictions_section(results, records: list[Record]) -> dict:
    """Match ``records`` to the report's units (``UnitResult`` list) and compute the section.

    Returns ``{"units": [...], "warnings": [...], "rows": [Row, ...], "lines": [...], "json": [...],
    "scores": ...}`` (``scores``: :func:`scores_part` when any prediction record is given, its CSV rows
    added to ``rows``; else None):
    per unit with any record a dict with ``result``, ``table``, ``figure``, ``noise_table`` and
    ``noise_figure`` (None without noise-scale records), ``line`` and ``json``; warnings for records
    that match no unit; the CSV rows (section ``predictions``); the printed summary lines; one JSON
    dict per unit (``unit``, ``workload``, ``measured``, ``sweep_examples``, ``line``, ``rows``,
    ``b_simple_across_training``).
    """
    by_workload: dict[str, list] = {}
    for r in results:
        by_workload.setdefault(r.unit.workload, []).append(r)
    warnings: list[str] = []
    matched: dict[str, dict[str, list[Record]]] = {r.key: {"prediction": [], "noise_scale": []} for r in results}
    for rec in records:
        units = by_workload.get(rec.store_workload, [])
        if not units:
            warnings.append(f"predictions for {rec.store_workload}: the store has no unit of that workload")
            continue
        if rec.kind == "prediction" and rec.unit is not None:
            units = [u for u in units if u.unit.name == rec.unit]
            if not units:
                names = ", ".join(u.unit.name for u in by_workload[rec.store_workload])
                warnings.append(f"predictions for {rec.store_workload} unit {rec.unit!r}: the store has no unit of "
                                f"that name (its units: {names})")
                continue
        for u in units:
            matched[u.key][rec.kind].append(rec)
    out = {"units": [], "warnings": list(dict.fromkeys(warnings)), "rows": [], "lines": [], "json": [], "scores": None}
    for r in results:
        mine = matched[r.key]
        if not mine["prediction"] and not mine["noise_scale"]:
            continue
        entry = _unit_part(r, mine["prediction"], mine["noise_scale"], with_group=len(by_workload[r.unit.workload]) > 1)
        out["units"].append(entry)
        out["rows"].extend(entry.pop("csv"))
        out["json"].append(entry["json"])
        if entry["line"]:
            out["lines"].append(entry["line"])
    if any(rec.kind == "prediction" for rec in records):
        out["scores"] = scores_part(results, records)
        out["warnings"] = list(dict.fromkeys(out["warnings"] + out["scores"]["warnings"]))
        out["rows"].extend(out["scores"].pop("csv"))
    return out


def measured_of(result) -> scoring.MeasuredUnit:
    """A report unit as the scorer's :class:`batchlab.probes.scoring.MeasuredUnit`: its own
    mccandlish_b_crit and interval and its swept batch sizes (every batch size with trials)."""
    value, low, high = _measured(result)
    sizes = tuple(sorted({float(b.batch_size) for b in result.results if getattr(b, "n_trials", 1)}))
    return scoring.MeasuredUnit(result.key, finite_or_none(value), finite_or_none(low), finite_or_none(high), sizes, "this report")


SCORES_UNIT = "predictor scores"


def scores_part(results, records: list[Record]) -> dict:
    """Every predictor scored on its own across the report's units, beside the naive baselines, by the
    protocol of :mod:`batchlab.probes.scoring` (never strict: a record whose protocol checkpoint is
    unknown is a warning). Returns ``{"board": Scoreboard, "table": Table, "line": str, "json": dict,
    "warnings": [...], "csv": [Row, ...]}``."""
    from batchlab.report.content import Row, Table

    measured = {r.key: measured_of(r) for r in results}
    board = scoring.score_records(records, measured, strict=False)
    table = Table(f"Predictor scores across {len(board.units)} units (each predictor on its own)",
                  list(scoring.SCORE_COLUMNS), scoring.score_table_rows(board),
                  note=scoring.SCORE_NOTE + " Units, in the per-unit order: " + "; ".join(board.units) + "."
                  + "".join(f" Not scored (off the protocol checkpoint): {p}: " + ", ".join(
                      f"{u} step {st}" for u, st in pairs) + "." for p, pairs in board.off_checkpoint.items()))
    parts = []
    rows = []
    for s in board.rows:
        ci = s.within_interval
        error = "-" if s.geometric_error is None else f"{s.geometric_error:.2f}x"
        paired = [] if s.baseline else board.baselines_on_points_of(s)
        parts.append(f"{s.predictor} {s.n_within}/{s.n_points} within 2x, geometric error {error}"
                     + (f", {s.n_bounds} bounds ({s.n_bounds_consistent} consistent)" if s.n_bounds else "")
                     + (f" (on its points: default B {scoring.same_units_text(paired[0])}, swept range "
                        f"{scoring.same_units_text(paired[1])})" if paired and s.n_points else ""))
        note = f"over {s.n_points} points of {s.n_units} units" + (" (baseline)" if s.baseline else "")
        for short, b in zip(("default_b", "swept_range"), paired):
            same = f"the baseline {b.predictor!r} on the {b.n_points} units where {s.predictor} has a point"
            rows.extend([
                Row(SCORES_UNIT, "predictions", None, f"{s.predictor}: {short}_on_these_units_within_2x_share",
                    b.within_share, None, None, same),
                Row(SCORES_UNIT, "predictions", None, f"{s.predictor}: {short}_on_these_units_geometric_error",
                    b.geometric_error, None, None, f"exp(mean |ln(predicted/measured)|) of {same}"),
            ])
        rows.extend([
            Row(SCORES_UNIT, "predictions", None, f"{s.predictor}: within_2x_share", s.within_share,
                None if ci is None else ci[0], None if ci is None else ci[1],
                f"{note}; lower/upper: exact {s.level:.0%} interval of the share"),
            Row(SCORES_UNIT, "predictions", None, f"{s.predictor}: geometric_error", s.geometric_error, None, None,
                f"exp(mean |ln(predicted/measured)|), {note}"),
            Row(SCORES_UNIT, "predictions", None, f"{s.predictor}: n_points", s.n_points, None, None, note),
            Row(SCORES_UNIT, "predictions", None, f"{s.predictor}: n_bounds", s.n_bounds, None, None,
                f"{s.n_bounds_consistent} consistent (allow a value within 2x)"),
            Row(SCORES_UNIT, "predictions", None, f"{s.predictor}: n_none", s.n_none, None, None, "no value"),
        ])
    line = f"prediction scores ({len(board.units)} units, protocol checkpoint): " + "; ".join(parts)
    # records matching no unit are already the section's own warnings
    warnings = [w for w in board.warnings if not w.startswith("predictions for ")]
    return {"board": board, "table": table, "line": line, "json": board.to_dict(), "warnings": warnings, "csv": rows}


def _unit_part(result, predictions: list[Record], noise: list[Record], with_group: bool) -> dict:
    from batchlab.report.content import Row

    name = result.key
    measured, m_low, m_high = _measured(result)
    rows = [Row(name, "predictions", None, "measured_b_crit", finite_or_none(measured), finite_or_none(m_low), finite_or_none(m_high),
                "the report's own mccandlish_b_crit of this unit"),
            Row(name, "predictions", None, "sweep_examples", result.sweep_examples, None, None,
                f"sum of steps x batch size over the {result.sweep_trials} trials of the analysed studies")]
    entry = {"result": result, "table": None, "figure": None, "noise_table": None, "noise_figure": None, "line": "",
             "json": {"unit": name, "workload": result.unit.workload, "measured": {"value": finite_or_none(measured),
                      "low": finite_or_none(m_low), "high": finite_or_none(m_high)}, "sweep_trials": result.sweep_trials,
                      "sweep_examples": result.sweep_examples, "line": "", "rows": [], "b_simple_across_training": []}}
    if predictions:
        _prediction_part(result, predictions, with_group, entry, rows)
    if noise:
        _noise_part(result, noise, entry, rows)
    entry["csv"] = rows
    return entry


def _prediction_part(result, predictions: list[Record], with_group: bool, entry: dict, rows: list) -> None:
    from batchlab.plots.predictions import Measured, Point, predictions_figure
    from batchlab.report.content import FigureOut, Row, Table, slug, num, render

    name = result.key
    measured, m_low, m_high = _measured(result)
    unique: dict[tuple[str, str], Record] = {}
    for rec in predictions:
        unique.setdefault((rec.predictor, rec.key), rec)
    chosen = list(unique.values())
    labels = _labels(chosen)
    table_rows, json_rows, parts, close, off = [], [], [], [], []
    protocol_cache: dict = {}
    protocol_steps: set = set()
    for label, rec in zip(labels, chosen):
        estimate = scoring.classify(rec.value, rec.low, rec.high, rec.has_interval)
        ratio, ratio_low, ratio_high = ratios(rec.value, rec.low, rec.high, measured, m_low, m_high)
        consistent = None
        if estimate.kind != "point":  # a bound (or nothing) is never a point: no ratio, no within 2x
            ratio = None
            if estimate.kind != "none" and _usable(measured):
                consistent = scoring.score_unit(scoring.MeasuredUnit(name, measured, m_low, m_high),
                                                estimate).consistent
        near = within(ratio)
        reading = _reading(estimate)
        fraction = rec.examples / result.sweep_examples if rec.examples is not None and result.sweep_examples else None
        table_rows.append([
            rec.predictor, "-" if rec.step is None else rec.step, num(rec.batch_size), num(rec.learning_rate),
            num(rec.value), _interval(rec.low, rec.high), reading, num(measured),
            _measured_interval(measured, m_low, m_high), num(ratio, 3), f"{num(ratio_low, 3)} to {num(ratio_high, 3)}",
            _within_text(near, consistent), num(fraction, 3), rec.note])
        json_rows.append({"label": label, "predictor": rec.predictor, "steps_at": rec.step, "batch_size": rec.batch_size,
                          "learning_rate": rec.learning_rate, "predicted": rec.value, "low": rec.low, "high": rec.high,
                          "measured": finite_or_none(measured), "measured_low": finite_or_none(m_low), "measured_high": finite_or_none(m_high),
                          "kind": estimate.kind, "bound": estimate.value if estimate.kind.endswith("bound") else None,
                          "bound_consistent": consistent,
                          "ratio": ratio, "ratio_low": ratio_low, "ratio_high": ratio_high, "within_2x": near,
                          "examples": rec.examples, "sweep_examples": result.sweep_examples, "compute_fraction": fraction,
                          "note": rec.note, "source": rec.where})
        ref = (f"checkpoint step {'-' if rec.step is None else rec.step}, reference B={num(rec.batch_size)}, "
               f"lr={num(rec.learning_rate)}; {rec.where}")
        rows.extend([
            Row(name, "predictions", None, f"{label}: checkpoint_step", rec.step, None, None, ref),
            Row(name, "predictions", None, f"{label}: reference_batch_size", rec.batch_size, None, None, ref),
            Row(name, "predictions", None, f"{label}: reference_learning_rate", rec.learning_rate, None, None, ref),
            Row(name, "predictions", None, f"{label}: predicted_b_crit", rec.value, rec.low, rec.high, rec.note),
            Row(name, "predictions", None, f"{label}: ratio", ratio, ratio_low, ratio_high,
                "predicted / measured; lower/upper: the ratio range from the two intervals, not a confidence interval"),
            Row(name, "predictions", None, f"{label}: within_2x", near, None, None,
                "0.5 <= ratio <= 2" if estimate.kind == "point" else f"{reading}: no ratio, never a point"),
            *([Row(name, "predictions", None, f"{label}: bound", estimate.value, None, None,
                   f"{reading}; consistent (allows a value within 2x): {consistent}")]
              if estimate.kind.endswith("bound") else []),
            Row(name, "predictions", None, f"{label}: examples", rec.examples, None, None,
                "the predictor's compute as recorded (reference run included)"),
            Row(name, "predictions", None, f"{label}: compute_fraction", fraction, None, None,
                "examples / the unit's sweep_examples"),
        ])
        if estimate.kind.endswith("bound"):
            parts.append(f"{label} {'>=' if estimate.kind == 'lower_bound' else '<='} {num(estimate.value)} (bound)")
        else:
            parts.append(f"{label} {num(rec.value)}" + (f" ({_ratio_text(ratio)}x)" if ratio is not None else ""))
        protocol = scoring.protocol_step(rec, cache=protocol_cache)
        if protocol is not None:
            protocol_steps.add(protocol)
        if protocol is None or rec.step != protocol:
            off.append(label)
        elif near:
            close.append(label)
    head = f"predictions {result.unit.base} {result.unit.optimizer}" + (f" [{result.unit.group}]" if with_group else "")
    against = (f"against B_crit {num(measured)}" if measured is not None
               else f"against no measured B_crit ({result.reason or 'no S(B) fit'})")
    # within 2x: only the records at the protocol checkpoint (those the scores count), never a union of steps
    tail = ""
    if _usable(measured):
        steps = f", step {', '.join(map(str, sorted(protocol_steps)))}" if protocol_steps else ""
        tail = f"; within 2x: {', '.join(close) if close else 'none'} (at the protocol checkpoint{steps})"
        tail += f"; off protocol, not scored: {', '.join(off)}" if off else ""
    line = f"{head}: {', '.join(parts)} {against}{tail}"
    level = result.b_crit["level"] if result.b_crit else None
    entry["table"] = Table(
        "Predicted critical batch sizes against this unit's measured mccandlish_b_crit",
        ["predictor", "checkpoint step", "reference batch size", "reference learning rate", "predicted B_crit",
         "predicted interval", "reading", "measured B_crit", f"measured interval{f' ({level:.0%})' if level else ''}", "ratio",
         "ratio range", "within 2x", "compute fraction", "note"], table_rows,
        note="ratio = predicted / measured (the report's own mccandlish_b_crit of this unit, not the number stored "
             "with the prediction). The ratio range runs from predicted low / measured high to predicted high / "
             "measured low: the ratios consistent with both intervals, not a confidence interval of the ratio "
             "('-' where a side is unbounded or missing). Reading: a prediction whose interval is open on one "
             "side is a bound (a lower bound: its low end), never a point: it has no ratio and no within 2x, only "
             "whether it allows a value within 2x of the measured one (consistent). Within 2x: 0.5 <= ratio <= 2. "
             "Compute fraction = the "
             "predictor's examples as recorded (reference run included) / the unit's sweep examples "
             f"({result.sweep_examples}: steps x batch size summed over the {result.sweep_trials} trials of its "
             "analysed studies, any status). Predictions differing only in the unit they were compared with are one row.")
    points = []
    for label, rec in zip(labels, chosen):
        estimate = scoring.classify(rec.value, rec.low, rec.high, rec.has_interval)
        if estimate.kind == "lower_bound":
            points.append(Point(label, estimate.value, estimate.value, None, True, bound=True))
        elif estimate.kind == "upper_bound":
            points.append(Point(label, estimate.value, None, estimate.value, True, bound=True))
        else:
            points.append(Point(label, rec.value, rec.low, rec.high, rec.has_interval))
    missing = [p.label for p in points if not _usable(p.value)]
    figure = predictions_figure(points, Measured(measured, m_low, m_high),
                                f"{result.unit.name}: predicted vs measured B_crit")
    entry["figure"] = FigureOut(
        slug(f"predictions-{result.unit.name}"),
        "Predicted critical batch sizes (dots) with their intervals (bars; an arrow: unbounded; a dot alone: no "
        "interval, such as the calibrated NQM's; a bar mark without a dot: a bound, from an interval open on one "
        "side, never a point) on a log2 axis, one row "
        "per prediction (label@step when several checkpoint steps), against this unit's measured mccandlish_b_crit "
        + (f"{num(measured)} (vertical line, its interval shaded) and the band from half to twice it (lightly shaded)."
           if _usable(measured) else "(none: not drawn).")
        + (f" Not drawn (no value): {', '.join(missing)}." if missing else ""),
        f"predicted critical batch sizes vs measured, {result.unit.name}", render(figure))
    entry["line"] = line
    entry["json"]["line"] = line
    entry["json"]["rows"] = json_rows


def _noise_part(result, noise: list[Record], entry: dict, rows: list) -> None:
    from batchlab.plots.predictions import Measured, Series, b_simple_figure
    from batchlab.report.content import FigureOut, Row, Table, slug, num, render

    name = result.key
    measured, m_low, m_high = _measured(result)
    runs: dict[str, dict[int, Record]] = {}
    for rec in noise:
        runs.setdefault(rec.key, {}).setdefault(rec.step, rec)
    labels: dict[str, str] = {}
    used: dict[str, int] = {}
    for key, steps in runs.items():
        label = _series_label(next(iter(steps.values())))
        used[label] = used.get(label, 0) + 1
        labels[key] = label if used[label] == 1 else f"{label} (run {used[label]})"
    series, table_rows, missing = [], [], []
    for key, steps in runs.items():
        ordered = [steps[s] for s in sorted(steps)]
        label = labels[key]
        # each step read as scoring reads a prediction: an interval open on one side is a bound, never a point
        readings = [scoring.classify(r.value, r.low, r.high, r.has_interval) for r in ordered]
        series.append(Series(label, [r.step for r in ordered],
                             [e.value if e.kind.endswith("bound") else r.value for r, e in zip(ordered, readings)],
                             [r.low for r in ordered], [r.high for r in ordered], [e.kind for e in readings]))
        for rec, estimate in zip(ordered, readings):
            bound = estimate.kind.endswith("bound")
            reading = _reading(estimate)
            ratio = rec.value / measured if estimate.kind == "point" and _usable(measured) else None
            shown = (f"{'>=' if estimate.kind == 'lower_bound' else '<='} {num(estimate.value)}" if bound
                     else num(rec.value))
            table_rows.append([label, rec.step, shown, _interval(rec.low, rec.high), reading,
                               "- (a bound: no ratio)" if bound else num(ratio, 3)])
            entry["json"]["b_simple_across_training"].append(
                {"run": label, "step": rec.step, "b_simple": rec.value, "low": rec.low, "high": rec.high,
                 "kind": estimate.kind, "bound": estimate.value if bound else None, "ratio": ratio,
                 "source": rec.where})
            rows.append(Row(name, "predictions", None, f"b_simple at step {rec.step} ({label})", rec.value, rec.low,
                            rec.high, f"{reading}, never a point; {rec.where}" if bound
                            else rec.where))
            rows.append(Row(name, "predictions", None, f"b_simple/measured at step {rec.step} ({label})", ratio,
                            None, None, f"{reading}: no ratio" if bound else ""))
            if estimate.kind == "none" or not _usable(estimate.value if bound else rec.value):
                missing.append(f"{label} step {rec.step}")
    entry["noise_table"] = Table(
        "B_simple across training against this unit's measured mccandlish_b_crit",
        ["reference run", "step", "B_simple", "interval", "reading", "B_simple / measured"], table_rows,
        note="B_simple = tr(Sigma) / |G|^2 at each checkpoint of a reference run (batchlab probe noise-scale), with "
             "its recorded interval; each reference run (its settings) is its own series, never pooled. Reading: a "
             "step whose interval is open on one side (|G|^2's interval includes 0) is a bound (a lower bound: its "
             "low end), never a point: it has no ratio and is drawn as a bound, not joined into the series. B_simple "
             f"/ measured divides a point by this unit's mccandlish_b_crit ({num(measured)}).")
    figure = b_simple_figure(series, Measured(measured, m_low, m_high), f"{result.unit.name}: B_simple across training")
    entry["noise_figure"] = FigureOut(
        slug(f"b-simple-across-training-{result.unit.name}"),
        "B_simple across training: B_simple (dots, its interval as bars; log axis) against the reference run's step "
        "(symlog axis when step 0 is drawn), one series per reference run (optimizer, batch size, learning rate); "
        "a bound (an interval open on one side) is a bar from the bound to the axis edge ending in an arrow, with a "
        "bar mark at the bound, never a dot nor part of the line; "
        + (f"this unit's measured mccandlish_b_crit {num(measured)} as a dashed line with its interval shaded."
           if _usable(measured) else "no measured B_crit for this unit.")
        + (f" Not drawn (no value): {', '.join(missing)}." if missing else ""),
        f"B_simple across training, {result.unit.name}", render(figure))


def score_files(paths: Sequence, measured_paths: Sequence, *, workload_refs: Sequence[str] = (),
                level: float = 0.9) -> scoring.Scoreboard:
    """:func:`batchlab.probes.scoring.score_records` (``strict=True``) of prediction files (``batchlab
    predict --json`` lines, read and checked by :func:`read_predictions`) against ``--measured`` files
    (:func:`batchlab.probes.scoring.read_measured`: report CSVs or steps-table refit ``.jsonl``): what
    ``batchlab predict --score`` prints.

    Raises:
        BatchlabError: no ``measured_paths``; what the readers raise; no unit scored (the reasons named).
    """
    if not measured_paths:
        raise BatchlabError("--score needs --measured FILE (a report.csv or a steps-table refit .jsonl): the "
                            "measured values stored in prediction files may be stale and are never scored")
    records = read_predictions(paths, label="prediction FILE")
    measured = scoring.read_measured(measured_paths)
    board = scoring.score_records(records, measured, workload_refs=scoring.resolve_workload_refs(workload_refs),
                                  level=level)
    if not board.units:
        why = "; ".join(board.warnings) or "no prediction at the protocol checkpoint of a measured unit"
        raise BatchlabError(f"--score scored no unit: {why}")
    return board
