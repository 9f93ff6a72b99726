"""The report's "Recommendation" section: what ``batchlab advise`` answered for each advised unit.

``batchlab advise`` writes one *advice record* per advised unit into the store, ``<store>/advice/
<advice_id>.json`` (:data:`batchlab.store.schema.ADVICE_DIR`; written atomically after every round
with status ``running`` and at the end with status ``done``; the format is batchlab.advise.record's).
This module reads them and builds the section the page shows first (docs/methods.md, "The report's
Recommendation section"):

* :func:`read_advice_records`: every record of a store, each checked against the format; a damaged
  one (not JSON, not UTF-8, a wrong type, a missing key) becomes one problem line naming the file,
  never an exception;
* :func:`recommendation_section`: per record the answer lines, the trade-off table and figure
  (:func:`batchlab.plots.advice.tradeoff_figure`), the learning-rate rule, the warmup schedule, the
  rounds, why advise stopped, the check run, and the compute advise spent against the full protocol's,
  with CSV rows and one printed line per record; None when the store has no ``advice`` directory;
* its HTML is :func:`batchlab.report.html.recommendation_html` (the page's conventions: escaped text,
  figures as ``<figure>`` with an embedded PNG, ids by :func:`batchlab.report.content.slug`).

Units: steps count optimizer updates; examples are updates x batch size (training examples
processed; evaluations are not counted); time is seconds of wall clock on the measuring device. Every
number is the record's own: the section computes nothing new except the spent fraction (advise's total
examples / the full protocol's examples).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from batchlab.atomic import TMP_PREFIX
from batchlab.plots.advice import censored_bounds
from batchlab.store.schema import ADVICE_DIR

FORMAT = "batchlab-advice"
VERSION = 1
#: Keys every record has, with the JSON types allowed for their values (``unit`` may also be null in a
#: ``running`` record: advise knows its unit after its first round).
REQUIRED = {"format": (str,), "version": (int,), "advice_id": (str,), "status": (str,), "settings": (dict,),
            "unit": (str,), "rounds": (list,)}
#: Keys a record may carry (null allowed), with the types allowed when not null. A ``done`` record
#: must carry every one of :data:`DONE_KEYS`.
OPTIONAL = {"throughput": (dict,), "bracket": (dict,), "spent": (dict,), "full_protocol": (dict,), "stop": (dict,),
            "recommendation": (dict,), "check": (dict,)}
DONE_KEYS = ("spent", "full_protocol", "stop", "recommendation")
STATUSES = ("running", "done")
#: A record file larger than this is not read (a record is a few kilobytes).
MAX_BYTES = 16 * 2**20
SECTION_ID = "recommendation"


# ----------------------------------------------------------------------------------- reading


def read_advice_records(store_path) -> tuple[list[dict], list[str]]:
    """``(records, problems)`` of the store at ``store_path``: every ``advice/*.json`` file, in file-name
    order, that is a valid advice record (each dict gains ``"_file"``: its file name), and one line
    per file that is not (naming the file and what is wrong with it). Temporary files of atomic writes
    (names starting with :data:`batchlab.atomic.TMP_PREFIX`) are ignored. No ``advice`` directory:
    ``([], [])``. Never raises for what the directory holds."""
    directory = Path(store_path) / ADVICE_DIR
    if not directory.exists():
        return [], []
    if not directory.is_dir():
        return [], [f"{ADVICE_DIR}: not a directory; no advice record read"]
    try:
        names = sorted(p.name for p in directory.iterdir())
    except OSError as exc:
        return [], [f"{ADVICE_DIR}: cannot be listed ({exc.strerror or exc}); no advice record read"]
    records, problems = [], []
    for name in names:
        if name.startswith(TMP_PREFIX) or not name.endswith(".json"):
            continue
        record, problem = _read_one(directory / name)
        if problem is not None:
            problems.append(f"{ADVICE_DIR}/{name}: {problem}; not shown")
        else:
            record["_file"] = name
            records.append(record)
    return records, problems


def _read_one(path: Path) -> tuple[dict | None, str | None]:
    try:
        if not path.is_file():
            return None, "not a file"
        size = path.stat().st_size
        if size > MAX_BYTES:
            return None, f"{size} bytes, more than an advice record's limit of {MAX_BYTES}"
        raw = path.read_bytes()
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})"
    try:
        record = json.loads(text)
    except ValueError as exc:  # json.JSONDecodeError, RecursionError-free for records this size
        return None, f"not JSON ({exc})"
    except RecursionError:
        return None, "not JSON (nested too deeply)"
    problem = check_record(record)
    return (None, problem) if problem else (record, None)


def check_record(record) -> str | None:
    """What is wrong with ``record`` as an advice record (the first problem, one phrase), else None."""
    if not isinstance(record, dict):
        return f"{_json_type(record)} in JSON, not an object"
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        return "missing key" + ("s " if len(missing) > 1 else " ") + ", ".join(missing)
    if record["format"] != FORMAT:
        return f"format {record['format']!r}, not {FORMAT!r}"
    if isinstance(record["version"], bool) or record["version"] != VERSION:
        return f"version {record['version']!r}; this batchlab reads version {VERSION}"
    for key, types in REQUIRED.items():
        if key == "unit" and record[key] is None and record.get("status") == "running":
            continue  # advise names its unit after its first round
        if isinstance(record[key], bool) or not isinstance(record[key], types):
            return f"{key} is {_json_type(record[key])}, not {_json_type_names(types)}"
    if record["status"] not in STATUSES:
        return f"status {record['status']!r}, not one of {', '.join(STATUSES)}"
    if not record["advice_id"]:
        return "advice_id is empty"
    for key, types in OPTIONAL.items():
        value = record.get(key)
        if value is not None and not isinstance(value, types):
            return f"{key} is {_json_type(value)}, not {_json_type_names(types)} or null"
    if record["status"] == "done":
        absent = [k for k in DONE_KEYS if k not in record]
        if absent:
            return "a done record missing key" + ("s " if len(absent) > 1 else " ") + ", ".join(absent)
    for i, entry in enumerate(record["rounds"]):
        if not isinstance(entry, dict):
            return f"rounds[{i}] is {_json_type(entry)}, not an object"
    rec = record.get("recommendation")
    if isinstance(rec, dict):
        for key, types in (("table", (list,)), ("lines", (list,)), ("learning_rate_rule", (dict,)),
                           ("warmup", (dict,))):
            if rec.get(key) is not None and not isinstance(rec[key], types):
                return f"recommendation.{key} is {_json_type(rec[key])}, not {_json_type_names(types)} or null"
        for i, row in enumerate(rec.get("table") or []):
            if not isinstance(row, dict):
                return f"recommendation.table[{i}] is {_json_type(row)}, not an object"
    return None


def _json_type(value) -> str:
    """The JSON type of ``value`` with its article: ``null``, ``a boolean``, ``a number``, ``a string``, ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {str: "a string", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _json_type_names(types) -> str:
    return " or ".join({str: "a string", int: "an integer", list: "a list", dict: "an object"}[t] for t in types)


# --------------------------------------------------------------------------------- formatting


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(float(value)) else float(value)


def _num(value, digits: int = 3) -> str:
    """A number as the page writes it (:func:`batchlab.report.content.num`); anything else ``-``."""
    from batchlab.report.content import num

    value = _number(value)
    return "-" if value is None else num(value, digits)


def _count(value) -> str:
    """A count (steps, examples, trials) as a whole number; ``-`` when not a number."""
    value = _number(value)
    if value is None:
        return "-"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return str(round(value)) if abs(value - round(value)) < 1e-9 or abs(value) >= 1000 else _num(value)


def _seconds(value) -> str:
    """Seconds as ``12.3 s``, ``4.5 min`` or ``1.2 h`` (the unit chosen by the value)."""
    value = _number(value)
    if value is None:
        return "-"
    if not math.isfinite(value):
        return "inf" if value > 0 else "-"
    if abs(value) < 120:
        return f"{_num(value)} s"
    if abs(value) < 7200:
        return f"{_num(value / 60)} min"
    return f"{_num(value / 3600)} h"


def interval_text(cell, kind: str = "number") -> str:
    """``V [LOW, HIGH]`` of an interval dict ``{"value", "low", "high"}`` (``kind``: ``count``,
    ``seconds`` or ``number``). A null end is unbounded (advise writes non-finite numbers as null):
    ``0`` below, ``inf`` above; a missing end is ``-``; no value and no end at all is ``-``; a bare
    number is written alone, anything else is ``-``."""
    fmt = {"count": _count, "seconds": _seconds}.get(kind, _num)
    if isinstance(cell, dict):
        value = fmt(cell.get("value"))
        if "low" not in cell and "high" not in cell:
            return value
        if all(_number(cell.get(k)) is None for k in ("value", "low", "high")):
            return "-"
        low = "-" if "low" not in cell else ("0" if cell["low"] is None else fmt(cell["low"]))
        high = "-" if "high" not in cell else ("inf" if cell["high"] is None else fmt(cell["high"]))
        return f"{value} [{low}, {high}]"
    return fmt(cell)


def bound_text(bound, kind: str = "number") -> str:
    """``> BOUND`` of an unreached batch size's bound (:func:`batchlab.plots.advice.censored_bounds`);
    ``-`` when there is none."""
    fmt = {"count": _count, "seconds": _seconds}.get(kind, _num)
    return "-" if _number(bound) is None else f"> {fmt(bound)}"


def _value_text(value) -> str:
    """Any JSON value in a cell: an interval dict as :func:`interval_text`, a dict with ``text`` as
    its text, a number as the page writes it, a list joined; None ``-``."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return _num(value)
    if isinstance(value, dict):
        if isinstance(value.get("text"), str):
            return value["text"]
        if "value" in value:
            return interval_text(value)
        return ", ".join(f"{k} {_value_text(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(_value_text(v) for v in value) or "-"
    return str(value)


def _params_text(params) -> str:
    if not isinstance(params, dict) or not params:
        return "-"
    return ", ".join(f"{k} {_num(v, 4) if _number(v) is not None else v}" for k, v in params.items())


def _b_crit_text(bc) -> str:
    if not isinstance(bc, dict):
        return "-"
    return f"{_num(bc.get('value'))} [{_num(bc.get('low'))}, {_num(bc.get('high'))}]"


def _last_round(record: dict):
    rounds = record.get("rounds") or []
    return rounds[-1] if rounds else None


# ----------------------------------------------------------------------------------- content


def answer_lines(record: dict) -> list[str]:
    """The recommendation in words: ``recommendation.lines`` when the record carries them (advise's own
    lines), else lines made from its fields (batch size and objective, metaparameters and the trial
    they come from, steps, examples and time to the goal with intervals, the batch sizes as good within
    the intervals, what bounds the answer, what it rests on). ``[]`` without a recommendation."""
    rec = record.get("recommendation")
    if not isinstance(rec, dict):
        return []
    lines = rec.get("lines")
    if isinstance(lines, list) and lines and all(isinstance(x, str) for x in lines):
        return list(lines)
    objective = rec.get("objective") or (record.get("settings") or {}).get("objective")
    out = [f"batch size {_count(rec.get('batch_size'))} (objective: {objective or '-'}), metaparameters "
           f"{_params_text(rec.get('hyperparameters'))} (trial {rec.get('trial_id', '-')})",
           f"to the goal: steps {interval_text(rec.get('steps'), 'count')}, examples "
           f"{interval_text(rec.get('examples'), 'count')}, time {interval_text(rec.get('seconds'), 'seconds')}"]
    same = rec.get("indistinguishable")
    if isinstance(same, list) and same:
        out.append("as good within the intervals: B = " + ", ".join(_count(b) for b in same))
    bounded = rec.get("bounded_by")
    for line in (bounded if isinstance(bounded, list) else [bounded] if bounded else []):
        out.append(f"bounded by: {_value_text(line)}")
    if rec.get("rests_on"):
        out.append(f"rests on: {rests_on_text(rec['rests_on'])}")
    return out


def rests_on_text(rests) -> str:
    """What the recommendation rests on: the record's text, or its counts (``rests_on`` of
    batchlab.advise.recommend: trials at the batch size and in all, batch sizes, examples spent)."""
    if not isinstance(rests, dict):
        return _value_text(rests)
    parts = []
    if rests.get("trials_at_batch_size") is not None:
        parts.append(f"{_count(rests.get('trials_at_batch_size'))} trials at the batch size "
                     f"({_count(rests.get('reached_at_batch_size'))} reached the goal)")
    if rests.get("trials") is not None:
        parts.append(f"{_count(rests.get('trials'))} trials in all")
    if rests.get("batch_sizes_measured") is not None:
        parts.append("over B = " + _value_text(rests.get("batch_sizes_measured")))
    if rests.get("examples_spent") is not None:
        parts.append(f"{_count(rests.get('examples_spent'))} examples spent")
    return ", ".join(parts) or _value_text(rests)


def tradeoff_table(record: dict):
    """The trade-off table (:class:`batchlab.report.content.Table`) of ``recommendation.table``: per
    measured batch size the steps, examples and time to the goal with intervals, what doubling the
    batch buys, the trials, and the recommended row marked; None when the record has no table."""
    from batchlab.report.content import Table

    rec = record.get("recommendation")
    table = rec.get("table") if isinstance(rec, dict) else None
    if not isinstance(table, list) or not table:
        return None
    rows = []
    for row in table:
        if not isinstance(row, dict):
            continue
        reached = row.get("reached")
        if reached is False:
            bounds = censored_bounds(row)
            cells = [bound_text(bounds[key], kind) for key, kind in (("steps", "count"), ("examples", "count"),
                                                                     ("seconds", "seconds"))]
        else:
            cells = [interval_text(row.get("steps"), "count"), interval_text(row.get("examples"), "count"),
                     interval_text(row.get("seconds"), "seconds")]
        trials = _count(row.get("n_trials"))
        if row.get("n_reached") is not None:
            trials = f"{_count(row.get('n_reached'))}/{trials} reached"
        mark = "recommended" if row.get("recommended") is True else (
            "as good within the intervals" if row.get("indistinguishable") is True else "")
        rows.append([_count(row.get("batch_size")),
                     "-" if reached is None else ("yes" if reached else "no (censored)"),
                     trials, *cells, _value_text(row.get("doubling")), mark])
    level = (record.get("settings") or {}).get("level")
    level_text = f"{level:.0%} intervals" if _number(level) is not None and 0 < level < 1 else "intervals"
    return Table(f"Trade-off around the recommendation ({level_text}; steps: optimizer updates, examples: updates "
                 "x batch size, time: seconds on the measuring device)",
                 ["batch size", "goal reached", "trials", "steps", "examples", "time",
                  "doubling: steps(B) / steps(2B)", ""], rows,
                 note="An unreached (censored) batch size gives the bound its quantity exceeds (> bound: the "
                      "censoring step, times B for examples, times the step time for time). Doubling: how many "
                      "times fewer steps the measured batch size twice as large needs, with its interval.")


def _dict_table(title: str, entries, note: str = ""):
    """A table of a list of JSON objects: the union of their keys as columns (first-seen order)."""
    from batchlab.report.content import Table

    entries = [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
    if not entries:
        return None
    columns = list(dict.fromkeys(k for e in entries for k in e))
    return Table(title, columns, [[_value_text(e.get(c)) for c in columns] for e in entries], note=note)


def learning_rate_text(record: dict) -> list[str]:
    """The learning-rate rule, one line per rate it rules (the learning rate and, with momentum, the
    effective rate lr / (1 - momentum)); ``["learning-rate rule: -"]`` when the record has none."""
    rec = record.get("recommendation")
    rule = rec.get("learning_rate_rule") if isinstance(rec, dict) else None
    if not isinstance(rule, dict):
        return ["learning-rate rule: -"]
    if isinstance(rule.get("text"), str):
        return [f"learning-rate rule: {rule['text']}"]
    slopes = [(name, rule[key]) for key, name in (("learning_rate", "learning rate"),
                                                 ("effective_learning_rate", "effective rate lr/(1-momentum)"))
              if isinstance(rule.get(key), dict)]
    if not slopes:  # one slope at the top level
        slopes = [("learning rate", rule)]
    return [f"learning-rate rule ({name}): {s.get('rule') or '-'} (measured log-log slope on batch size "
            f"{_num(s.get('slope'))} [{_num(s.get('low'))}, {_num(s.get('high'))}] over {_count(s.get('n'))} "
            f"reached batch sizes" + (f"; {s['reason']}" if s.get("reason") else "") + ")" for name, s in slopes]


def warmup_text(record: dict) -> str:
    """The batch-size warmup schedule in one line (``none`` when the record has none)."""
    rec = record.get("recommendation")
    if not isinstance(rec, dict) or "warmup" not in rec:
        return "batch-size warmup: -"
    warm = rec.get("warmup")
    if not isinstance(warm, dict):
        return "batch-size warmup: none" + (f" ({rec['warmup_reason']})" if rec.get("warmup_reason") else "")
    schedule = warm.get("schedule")
    steps = []
    for entry in schedule if isinstance(schedule, list) else []:
        if isinstance(entry, (list, tuple)) and len(entry) == 2:
            steps.append(f"B = {_count(entry[1])} from {_count(entry[0])} examples")
    saving = warm.get("saving")
    predicted = warm.get("predicted")
    if saving is None and isinstance(predicted, dict):  # batchlab.advise.recommend's form
        saving = {"value": predicted.get("saved_fraction"), "low": predicted.get("saved_fraction_low"),
                  "high": predicted.get("saved_fraction_high")}
    parts = ["; ".join(steps) or "-", f"predicted saving {_value_text(saving)}"
             + (" of the examples" if saving is not None and saving is not warm.get("saving") else "")]
    if warm.get("reason") or rec.get("warmup_reason"):
        parts.append(str(warm.get("reason") or rec.get("warmup_reason")))
    return "batch-size warmup: " + "; ".join(parts)


def stop_text(record: dict) -> str:
    stop = record.get("stop")
    if not isinstance(stop, dict):
        return "stopped: -"
    return f"stopped: {stop.get('text') or stop.get('reason') or '-'}"


def check_text(record: dict) -> str:
    """The check run (one fresh-seed training of the recommendation) in one line."""
    check = record.get("check")
    if "check" not in record:
        return "check: -"
    if not isinstance(check, dict):
        return "check: not run"
    if isinstance(check.get("text"), str):  # advise's own line (it starts with "check:")
        text = check["text"]
        return text if text.startswith("check:") else f"check: {text}"
    reached = check.get("reached")
    within = check.get("within")
    return (f"check: B = {_count(check.get('batch_size'))}, seed {check.get('seed', '-')}: "
            + ("goal reached at step " + _count(check.get("steps"))
               + f" (bracket ({_count(check.get('steps_lower'))}, {_count(check.get('steps'))}])"
               if reached else "goal not reached" if reached is False else "-")
            + f"; predicted [{_count(check.get('predicted_low'))}, "
              f"{'inf' if check.get('predicted_high') is None and 'predicted_high' in check else _count(check.get('predicted_high'))}] steps: "
            + ("within" if within is True else "outside" if within is False else "-"))


def compute_text(record: dict) -> str:
    """``compute: advise spent N examples (studies X, throughput Y, predictors Z, check W) = f of the
    full protocol's M examples (rule)``; the fraction is ``-`` when either total is unknown."""
    spent = record.get("spent") if isinstance(record.get("spent"), dict) else {}
    full = record.get("full_protocol") if isinstance(record.get("full_protocol"), dict) else {}
    total, whole = _number(spent.get("total")), _number(full.get("examples"))
    fraction = "-"
    if total is not None and whole is not None and whole > 0:
        ratio = total / whole
        fraction = _num(ratio) + (f" ({_num(1 / ratio)}x less)" if 0 < ratio < 1 else "")
    parts = ", ".join(f"{k} {_count(spent.get(k))}" for k in ("studies", "throughput", "predictors", "check"))
    seconds = f", {_seconds(spent.get('seconds'))} of wall clock" if _number(spent.get("seconds")) is not None else ""
    return (f"compute: advise spent {_count(total)} examples ({parts}{seconds}) = {fraction} of the full protocol's "
            f"{_count(whole)} examples ({full.get('rule') or '-'})")


def settings_text(record: dict) -> str:
    s = record.get("settings") or {}
    budget = s.get("budget") if isinstance(s.get("budget"), dict) else {}
    budget_text = ", ".join(f"{k} {_value_text(v)}" for k, v in budget.items() if v is not None) or "none"
    return (f"settings: workload {s.get('workload', '-')}, optimizer {s.get('optimizer', '-')}, objective "
            f"{s.get('objective', '-')}, target ratio {_num(s.get('target_ratio'))}, budget {budget_text}, device "
            f"{s.get('device', '-')}, trials {_count(s.get('trials'))} per study, level {_num(s.get('level'))}, "
            f"seed {s.get('seed', '-')}, sweep {s.get('sweep', '-')}, candidates "
            f"{_value_text(s.get('candidates'))}, bracket {s.get('bracket_rule', '-')}")


def rounds_table(record: dict):
    from batchlab.report.content import Table

    rows = []
    for entry in record.get("rounds") or []:
        rows.append([entry.get("round", "-"), entry.get("action", "-"), _value_text(entry.get("batch_sizes")),
                     _count(entry.get("trials")), _count(entry.get("examples_bound")),
                     _count(entry.get("examples_after")), _b_crit_text(entry.get("b_crit")),
                     _num(entry.get("ratio")), entry.get("reason", "-")])
    if not rows:
        return None
    return Table("Rounds: the studies advise ran (examples bound: the round's most examples; after: the unit's "
                 "trials' examples after it)",
                 ["round", "action", "batch sizes", "trials", "examples bound", "examples after", "B_crit [interval]",
                  "high/low", "why"], rows)


def unit_label(record: dict) -> str:
    """The record's unit, or ``WORKLOAD (unit not known yet)`` for a running record before its first round."""
    if record.get("unit"):
        return str(record["unit"])
    settings = record.get("settings") if isinstance(record.get("settings"), dict) else {}
    return f"{settings.get('store_workload') or settings.get('workload') or '-'} (unit not known yet)"


def headline(record: dict) -> str:
    """One printed line per record (``batchlab report``'s lines)."""
    unit = unit_label(record)
    if record.get("status") == "running":
        return f"advice {unit}: {running_text(record)}"
    lines = answer_lines(record)
    return f"advice {unit}: " + (lines[0] if lines else "no recommendation (" + stop_text(record) + ")")


def running_text(record: dict) -> str:
    last = _last_round(record)
    where = f"round {last.get('round', '-')}" if isinstance(last, dict) else "no round recorded yet"
    return f"advise has not finished ({where})"


def _rows(record: dict) -> list:
    """CSV rows (section ``advice``) of one record: the trade-off table, the recommended batch size,
    the check and the compute."""
    from batchlab.report.content import Row

    unit = unit_label(record)
    rows = []
    rec = record.get("recommendation") if isinstance(record.get("recommendation"), dict) else {}
    note = f"advice {record.get('advice_id')}"
    for row in rec.get("table") or []:
        if not isinstance(row, dict):
            continue
        b = _number(row.get("batch_size"))
        mark = note + ("; recommended" if row.get("recommended") is True else "")
        if row.get("reached") is False:  # censored: the bound it exceeds, as the lower end
            for key, bound in censored_bounds(row).items():
                rows.append(Row(unit, "advice", b, f"{key}_more_than", None, bound, None, mark + "; not reached"))
            continue
        for key in ("steps", "examples", "seconds"):
            cell = row.get(key)
            cell = cell if isinstance(cell, dict) else {"value": cell}
            high = _number(cell.get("high"))  # the CSV's upper is empty where none or unbounded
            high = None if high is not None and math.isinf(high) else high
            rows.append(Row(unit, "advice", b, f"{key}_to_goal", _number(cell.get("value")), _number(cell.get("low")),
                            high, mark))
    if _number(rec.get("batch_size")) is not None:
        rows.append(Row(unit, "advice", _number(rec["batch_size"]), "recommended_batch_size", _number(rec["batch_size"]),
                        None, None, f"{note}; objective {rec.get('objective', '-')}"))
    check = record.get("check")
    if isinstance(check, dict):
        rows.append(Row(unit, "advice", _number(check.get("batch_size")), "check_steps", _number(check.get("steps")),
                        _number(check.get("predicted_low")), _number(check.get("predicted_high")),
                        f"{note}; lower/upper: the predicted interval; within {check.get('within')}"))
    spent = record.get("spent") if isinstance(record.get("spent"), dict) else {}
    full = record.get("full_protocol") if isinstance(record.get("full_protocol"), dict) else {}
    rows.append(Row(unit, "advice", None, "examples_spent", _number(spent.get("total")), None, None, note))
    rows.append(Row(unit, "advice", None, "examples_full_protocol", _number(full.get("examples")), None, None,
                    f"{note}; {full.get('rule') or ''}"))
    return rows


def recommendation_section(store_path, unit_names=()) -> dict | None:
    """The Recommendation section of the store at ``store_path``; None when it has no ``advice``
    directory. ``unit_names``: the report's units (a record's unit not among them is a warning, and
    the ones that are get a link to their section).

    Returns ``{"entries": [{"record", "unit", "lines", "figure", "tables", "text", "compute", "running", "anchor",
    "unit_anchor"}], "warnings": [...], "rows": [Row], "lines": [str], "json": [dict]}``; a figure that
    cannot be drawn is a warning, never an exception."""
    from batchlab.errors import BatchlabError
    from batchlab.plots.advice import tradeoff_figure
    from batchlab.report.content import FigureOut, render, slug

    directory = Path(store_path) / ADVICE_DIR
    if not directory.exists():
        return None
    records, warnings = read_advice_records(store_path)
    names = set(unit_names)
    entries, rows, lines, summary = [], [], [], []
    seen: dict[str, int] = {}
    for record in records:
        advice_id = record["advice_id"]
        unit = unit_label(record)
        if record["unit"] is not None:
            seen[unit] = seen.get(unit, 0) + 1
        anchor = slug(f"recommendation {unit} {advice_id}")
        figure = None
        if isinstance(record.get("recommendation"), dict) and record["recommendation"].get("table"):
            try:
                fig = tradeoff_figure(record, title=f"{unit}: trade-off ({record['status']})",
                                      caption=_rests_on(record))
                figure = FigureOut(
                    slug(f"{unit} advice {advice_id} tradeoff"),
                    "Steps and time to the goal against batch size (log axes) for each batch size advise measured: "
                    "intervals as error bars, unreached batch sizes at the bound they exceed (arrow up), the "
                    "recommended batch size starred and marked by a dashed line, the interval of B_crit "
                    "(mccandlish_b_crit of advise's last fit) shaded.",
                    f"trade-off of steps and time against batch size, {unit}", render(fig))
            except (BatchlabError, ValueError, TypeError, OverflowError) as exc:
                warnings.append(f"{ADVICE_DIR}/{record['_file']}: no trade-off figure ({exc})")
        if names and record["unit"] is not None and unit not in names:
            warnings.append(f"{ADVICE_DIR}/{record['_file']}: its unit {unit!r} is not a unit of this store's "
                            "trials (shown anyway)")
        running = record["status"] == "running"
        text = [settings_text(record), *learning_rate_text(record), warmup_text(record), stop_text(record),
                check_text(record)]
        if isinstance(record.get("bracket"), dict):
            text.insert(1, "first bracket of B_crit: " + _value_text(record["bracket"]))
        tables = [t for t in (tradeoff_table(record), _lr_table(record), rounds_table(record)) if t is not None]
        entries.append({"record": record, "unit": unit, "lines": answer_lines(record), "figure": figure, "tables": tables,
                        "text": text, "compute": compute_text(record),
                        "running": running_text(record) if running else None, "anchor": anchor,
                        "unit_anchor": slug(unit) if unit in names else None})
        rows.extend(_rows(record))
        lines.append(headline(record))
        summary.append({"advice_id": advice_id, "file": record["_file"], "unit": unit, "status": record["status"],
                        "lines": answer_lines(record), "compute": compute_text(record), "check": check_text(record)})
    for unit, n in seen.items():
        if n > 1:
            warnings.append(f"{n} advice records name the unit {unit!r}; each is shown")
    return {"entries": entries, "warnings": warnings, "rows": rows, "lines": lines, "json": summary}


def _lr_table(record: dict):
    rec = record.get("recommendation")
    rule = rec.get("learning_rate_rule") if isinstance(rec, dict) else None
    if not isinstance(rule, dict):
        return None
    return _dict_table("Tuned learning rate per measured batch size (the learning-rate rule's points)",
                       rule.get("table"))


def _rests_on(record: dict) -> str:
    rec = record.get("recommendation") if isinstance(record.get("recommendation"), dict) else {}
    if rec.get("rests_on"):
        return "rests on: " + rests_on_text(rec["rests_on"])
    return f"trials: the studies of {record.get('unit', '-')} (advice record {record.get('advice_id', '-')})"
