"""Import long-format measurements from any trainer (``batchlab import table FILE --store DIR``).

The file is CSV (``.csv``, ``.csv.gz``) or Parquet (``.parquet``, ``.pq``), one row per trial and
evaluation step (docs/methods.md, "Table import"):

- required columns ``workload`` (``dataset/model/optimizer``), ``batch_size`` (integer >= 1),
  ``trial_id`` (integer >= 0, unique per workload and batch size) and ``step`` (integer >= 0,
  optimizer updates before the evaluation; at most one row per trial and step);
- metric columns: every column whose name contains ``/`` (``val/classification_error``,
  ``train/cross_entropy_error``, ...); numbers, an empty cell meaning "not evaluated at this step";
- optional, constant within a trial: ``status`` (one of :data:`batchlab.store.schema.STATUSES`,
  default COMPLETE), ``steps`` (updates the trial ran; default its last step), ``seed`` (integer);
  optional, constant within a workload and batch size: ``train_steps`` (the step budget; default
  unknown), ``train_examples``;
- parameter columns ``param:<name>`` (e.g. ``param:learning_rate``), constant within a trial; an
  empty cell leaves the parameter out of that trial.

Integer columns (``batch_size``, ``trial_id``, ``step``, ``steps``, ``seed``, ``train_steps``,
``train_examples``) hold whole numbers from their minimum up to 2^63 - 1 (the store's int64), compared
exactly: in a CSV, decimal integers (``42``, ``+42``) and number notations whose value is a whole
number (``42.0``, ``4.2e1``); in Parquet, integer columns and float columns of whole numbers. Anything
else (``1.5``, ``nan``, ``inf``, ``0x10``, ``true``, a boolean column) is an error naming the value. A
CSV is UTF-8 text (a byte-order mark allowed); UTF-16/32, Latin-1 and binary files are refused with
one line saying so.

Any other column is an error (so a typo never silently drops data). The import is atomic: the
whole file is checked first and any problem (a missing column, a non-numeric step, a batch size
< 1, two statuses within one trial, a step twice within a trial, a trial id already used in the
store under another key) raises BatchlabError with one line and writes nothing; otherwise every
trial is published in one commit. Each trial's key is ``table:<file name>:<workload>/<batch
size>/<trial id>``, so importing the same file again adds nothing. Each workload and batch size
gets a study definition with source ``table import:<file name>`` (its ``train_steps`` and
``train_examples`` when given, evaluation ``{"rule": "recorded"}``).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchlab.errors import BatchlabError, not_utf8_reason, one_line, printable
from batchlab.finite import INT64_MAX
from batchlab.store.schema import SCHEMAS, STATUSES, split_workload

if TYPE_CHECKING:  # annotations only: pandas is imported where a table is converted
    import pandas as pd
from batchlab.store.store import Store
from batchlab.store.studies import make_study_definition, study_id
from batchlab.store.writer import study_row

REQUIRED = ("workload", "batch_size", "trial_id", "step")
PER_TRIAL = ("status", "steps", "seed")
PER_STUDY = ("train_steps", "train_examples")
PARAM_PREFIX = "param:"
SUFFIXES = (".csv", ".csv.gz", ".parquet", ".pq")
#: The integer columns and the least value each may hold.
INTEGER_MINIMUM = {"batch_size": 1, "trial_id": 0, "step": 0, "steps": 0, "seed": 0, "train_steps": 0,
                   "train_examples": 1}
_HEAD_BYTES = 1 << 20  # how much of a CSV is checked for its encoding before parsing
_DECIMAL_INT = re.compile(r"[+-]?[0-9]+")
_DECIMAL_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


@dataclass
class TableImportReport:
    """What a table import did."""

    file: str
    studies: int = 0
    trials: int = 0
    trials_added: int = 0
    trials_already_present: int = 0
    measurements_added: int = 0
    metrics: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return {"file": self.file, "studies": self.studies, "trials": self.trials,
                "trials_added": self.trials_added, "trials_already_present": self.trials_already_present,
                "measurements_added": self.measurements_added, "metrics": list(self.metrics)}


def source_name(path: Path) -> str:
    """The source (trials and study definitions) of an import of ``path``."""
    return f"table import:{Path(path).name}"


def _read(path: Path) -> pa.Table:
    """The file as an Arrow table; BatchlabError if unreadable, not UTF-8 (CSV) or of an unknown kind.
    CSV cells are null only when empty (``nan`` and ``inf`` are numbers, as in the release import);
    the integer columns and ``workload`` are read as text (:func:`_integer_column` parses them)."""
    name, shown, file = path.name.lower(), printable(path), printable(path.name)
    if not any(name.endswith(s) for s in SUFFIXES):
        raise BatchlabError(f"table file {shown} must end in one of {', '.join(SUFFIXES)}")
    if not path.exists():
        raise BatchlabError(f"table file {shown} does not exist")
    if not path.is_file():
        raise BatchlabError(f"table file {shown} is not a file")
    try:
        if name.endswith((".parquet", ".pq")):
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        else:
            import pyarrow.csv as pacsv

            _check_duplicates(_csv_header(path, file), file)
            text = {c: pa.string() for c in ("workload", "status", *INTEGER_MINIMUM)}
            table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(
                column_types=text, strings_can_be_null=True, null_values=[""]))
            _check_utf8_columns(table, file)
    except (pa.ArrowInvalid, OSError) as exc:
        if "UTF8" in str(exc):  # a text column (workload, status, integers) past the checked head
            raise BatchlabError(f"{file} is not UTF-8 text ({one_line(exc)}); batchlab reads UTF-8: convert it "
                                "(e.g. iconv -f LATIN1 -t UTF-8)") from None
        raise BatchlabError(f"cannot read {shown}: {one_line(exc)}") from None
    except UnicodeDecodeError:  # a header name past the checked head
        raise BatchlabError(f"{file}: its header is not UTF-8 text; batchlab reads UTF-8: convert it "
                            "(e.g. iconv -f LATIN1 -t UTF-8)") from None
    _check_duplicates(table.column_names, file)
    return table


def _check_duplicates(names: list[str], file: str) -> None:
    dup = sorted({c for c in names if names.count(c) > 1})
    if dup:
        raise BatchlabError(f"{file}: column {dup[0]!r} occurs twice")


def _csv_header(path: Path, file: str) -> list[str]:
    """The column names of a CSV, read from its first bytes (decompressed); BatchlabError (naming
    ``file``) unless those bytes are UTF-8 text."""
    with pa.input_stream(str(path), compression="detect") as stream:
        head = stream.read(_HEAD_BYTES)
    reason = not_utf8_reason(head, complete=len(head) < _HEAD_BYTES)
    if reason is not None:
        raise BatchlabError(f"{file} {reason}")
    text = head.decode("utf-8-sig", errors="ignore")  # "ignore": a character cut at the end
    return next(csv.reader(io.StringIO(text)), [])


def _check_utf8_columns(table: pa.Table, file: str) -> None:
    """BatchlabError naming the first CSV cell that is not UTF-8 (pyarrow reads such a column as
    binary), for files whose first :data:`_HEAD_BYTES` were UTF-8."""
    for column in table.column_names:
        col = table.column(column)
        if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
            for row, value in enumerate(col.to_pylist(), 1):
                reason = value is not None and not_utf8_reason(value)
                if reason:
                    raise BatchlabError(f"{file}: column {column!r}, data row {row}, {reason}")


def _metric_values(table: pa.Table, column: str, file: str) -> pa.Array:
    """A metric column as float64 (null = not evaluated, NaN kept); BatchlabError if non-numeric."""
    col = table.column(column).combine_chunks()
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if pa.types.is_null(col.type):
        return pa.nulls(len(col), pa.float64())
    if pa.types.is_boolean(col.type) or not (
        pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_string(col.type)
        or pa.types.is_large_string(col.type) or pa.types.is_decimal(col.type)
    ):
        raise BatchlabError(f"{file}: metric column {column!r} must hold numbers, not {col.type}")
    try:
        return col.cast(pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        for value in col.to_pylist():
            if value is None:
                continue
            try:
                float(value)
            except ValueError:
                raise BatchlabError(f"{file}: metric column {column!r} must hold numbers, got {value!r}") from None
        raise BatchlabError(f"{file}: metric column {column!r} must hold numbers") from None


def _integer_column(table: pa.Table, column: str, file: str, *, allow_null: bool = False) -> pd.Series:
    """Column ``column`` as whole numbers from :data:`INTEGER_MINIMUM` up to :data:`INT64_MAX`, compared
    exactly (module docstring: what is accepted), as an int64 Series (nullable ``Int64`` when
    ``allow_null``); else a BatchlabError naming the first bad value."""
    import pandas as pd

    col = table.column(column).combine_chunks()
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    present = np.asarray(col.is_valid(), dtype=bool)
    if not allow_null and not present.all():
        raise BatchlabError(f"{file}: column {column!r} has an empty cell (row {int(np.argmin(present)) + 1})")
    minimum = INTEGER_MINIMUM[column]
    if pa.types.is_null(col.type):
        values = np.zeros(len(col), np.int64)
    elif pa.types.is_boolean(col.type):
        raise BatchlabError(f"{file}: column {column!r} must hold integers, got {col.drop_null()[0].as_py()!r}")
    else:
        try:  # the fast path, exact: integers, whole floats, plain decimal text (not pyarrow's 0x..)
            if (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)) and not pc.all(
                    pc.match_substring_regex(col, r"^-?[0-9]+$")).as_py():
                raise pa.ArrowInvalid("not plain decimal integers")
            values = col.cast(pa.int64()).fill_null(0).to_numpy()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            values = np.array([0 if v is None else _exact_int(v, column, file) for v in col.to_pylist()],
                              np.int64)
        small = present & (values < minimum)
        if small.any():
            raise BatchlabError(f"{file}: column {column!r} must be >= {minimum}, got {values[small][0]}")
    if allow_null:
        return pd.Series(pd.arrays.IntegerArray(values, ~present))
    return pd.Series(values)


def _exact_int(value, column: str, file: str) -> int:
    """One cell (text, int, float or Decimal) as the integer it denotes exactly, within
    [:data:`INTEGER_MINIMUM`, :data:`INT64_MAX`]; else BatchlabError."""
    number = None
    if isinstance(value, str):
        text = value.strip()
        if _DECIMAL_INT.fullmatch(text):
            number = int(text)
        elif _DECIMAL_NUMBER.fullmatch(text):
            number = Decimal(text)
    elif isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
        number = value if isinstance(value, int) else Decimal(value)
    if number is None or (isinstance(number, Decimal) and (not number.is_finite()
                                                          or number != number.to_integral_value())):
        raise BatchlabError(f"{file}: column {column!r} must hold integers, got {value!r}")
    minimum = INTEGER_MINIMUM[column]
    if number < minimum:
        raise BatchlabError(f"{file}: column {column!r} must be >= {minimum}, got {_plain_text(value)}")
    if number > INT64_MAX:  # compared before int(): 1e999999999 must not become a billion digits
        raise BatchlabError(f"{file}: column {column!r} must be <= {INT64_MAX}, got {_plain_text(value)}")
    return int(number)


def _plain_text(value) -> str:
    """A cell as written (text stripped; numbers as Python prints them)."""
    return value.strip() if isinstance(value, str) else str(value)


def _check_text_or_scalar(table: pa.Table, column: str, file: str, *, text_only: bool) -> None:
    """BatchlabError unless ``column`` holds text (``text_only``: the workload) or, for a parameter
    column, text, numbers or booleans (values a JSON object of parameters can hold)."""
    kind = table.schema.field(column).type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    text = pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)
    scalar = pa.types.is_boolean(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind)
    if not (text or (scalar and not text_only)):
        allowed = "text (dataset/model/optimizer)" if text_only else "text, numbers or booleans"
        raise BatchlabError(f"{file}: column {column!r} must hold {allowed}, not {kind}")


def _as_ints(values: dict) -> dict:
    return {k: None if v is None else int(v) for k, v in values.items()}


def _first_bad(series, ok) -> object:
    return _py(series[~ok].iloc[0])  # plain Python in messages, not np.int64(..)


def _constant(df, keys: list[str], column: str, file: str, what: str) -> dict:
    """{key tuple: the one value of ``column``} per group; BatchlabError if a group has two."""
    values = {}
    for key, series in df.groupby(keys, sort=True)[column]:
        distinct = series.dropna().unique()
        if len(distinct) > 1:
            label = "/".join(str(k) for k in key)
            raise BatchlabError(
                f"{file}: {what} {label} has conflicting {column!r} values {_py(distinct[0])!r} and "
                f"{_py(distinct[1])!r}"
            )
        values[tuple(key)] = distinct[0] if len(distinct) else None
    return values


def _py(value):
    """A numpy scalar as the plain Python value (for messages)."""
    return value.item() if hasattr(value, "item") else value


def _plain(value, where: str):
    """A parameter value as plain JSON (numpy scalars -> Python; integral floats stay floats);
    BatchlabError starting with ``where`` if it is not finite."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        raise BatchlabError(f"{where} values must be finite, got {value!r}")
    return value


def import_table(store: Store, path: str | Path) -> TableImportReport:
    """Check the table file at ``path`` and publish its trials into ``store`` in one commit.

    BatchlabError (one line, nothing written) for any problem listed in the module docstring."""

    path = Path(path)
    file = printable(path.name)  # in messages
    table = _read(path)
    columns = list(table.column_names)
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise BatchlabError(f"{file}: missing column(s) {', '.join(missing)}; required: {', '.join(REQUIRED)}, "
                            "plus metric columns named split/metric")
    metrics = [c for c in columns if "/" in c and not c.startswith(PARAM_PREFIX)]
    params = [c for c in columns if c.startswith(PARAM_PREFIX)]
    known = set(REQUIRED) | set(PER_TRIAL) | set(PER_STUDY) | set(metrics) | set(params)
    other = [c for c in columns if c not in known]
    if other:
        raise BatchlabError(
            f"{file}: unknown column {other[0]!r}; columns are {', '.join(REQUIRED)}, metrics named "
            f"split/metric (e.g. val/classification_error), parameters named {PARAM_PREFIX}<name>, and "
            f"optional {', '.join(PER_TRIAL + PER_STUDY)}"
        )
    if not metrics:
        raise BatchlabError(f"{file}: no metric column (metric columns are named split/metric, "
                            "e.g. val/classification_error)")
    if any(p == PARAM_PREFIX for p in params):
        raise BatchlabError(f"{file}: a parameter column needs a name after {PARAM_PREFIX!r}")
    if table.num_rows == 0:
        raise BatchlabError(f"{file}: the table has no rows")
    metric_arrays = {m: _metric_values(table, m, file) for m in metrics}
    for c in ["workload", *params]:
        _check_text_or_scalar(table, c, file, text_only=c == "workload")
    integers = [c for c in columns if c in INTEGER_MINIMUM]
    df = table.drop_columns(metrics + integers).to_pandas()

    # ---- per-row checks
    if not df["workload"].notna().all():
        raise BatchlabError(f"{file}: column 'workload' has an empty cell")
    for w in df["workload"].unique():
        split_workload(w)
    for c in integers:
        df[c] = _integer_column(table, c, file, allow_null=c not in REQUIRED)
    trial = ["workload", "batch_size", "trial_id"]
    dup = df.duplicated(trial + ["step"])
    if dup.any():
        row = df[dup].iloc[0]
        raise BatchlabError(f"{file}: trial {row['workload']}/{row['batch_size']}/{row['trial_id']} has "
                            f"step {row['step']} twice")

    # ---- per-trial and per-study values
    if "status" in columns:
        bad = df["status"].notna() & ~df["status"].isin(STATUSES)
        if bad.any():
            raise BatchlabError(f"{file}: unknown status {_first_bad(df['status'], ~bad)!r}; "
                                f"known: {', '.join(STATUSES)}")
        statuses = _constant(df, trial, "status", file, "trial")
    else:
        statuses = {}
    per_trial = {}
    for c in ("steps", "seed"):
        if c in columns:
            per_trial[c] = _as_ints(_constant(df, trial, c, file, "trial"))
    per_study = {}
    for c in PER_STUDY:
        if c in columns:
            per_study[c] = _as_ints(_constant(df, ["workload", "batch_size"], c, file, "workload and batch size"))
    param_values = {p: _constant(df, trial, p, file, "trial") for p in params}
    last_step = df.groupby(trial, sort=True)["step"].max().to_dict()

    # ---- rows
    source = source_name(path)
    definitions = {}
    for (w, b) in sorted(set(zip(df["workload"], df["batch_size"]))):
        key = (w, int(b))
        definitions[key] = make_study_definition(
            workload=w, batch_size=int(b),
            train_steps=per_study.get("train_steps", {}).get(key),
            train_examples=per_study.get("train_examples", {}).get(key),
            evaluation={"rule": "recorded"}, source=source,
        )
    trial_rows = []
    for key in sorted(last_step):
        w, b, t = key[0], int(key[1]), int(key[2])
        parameters = {}
        for p in params:
            value = param_values[p][key]
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                parameters[p[len(PARAM_PREFIX):]] = _plain(value, f"{file}: parameter column {p!r}")
        steps = per_trial.get("steps", {}).get(key)
        if steps is not None and steps < int(last_step[key]):
            raise BatchlabError(f"{file}: trial {w}/{b}/{t} has steps {steps}, fewer than its last evaluation step "
                                f"{int(last_step[key])}; steps counts the updates the trial ran")
        trial_rows.append({
            "workload": w, "batch_size": b, "trial_id": t,
            "trial_key": f"table:{path.name}:{w}/{b}/{t}", "study_id": study_id(definitions[(w, b)]),
            "parameters": json.dumps(parameters, sort_keys=True),
            "status": statuses.get(key) or "COMPLETE",
            "steps": int(last_step[key]) if steps is None else steps,
            "seed": per_trial.get("seed", {}).get(key), "source": source,
        })
    trials = pa.Table.from_pylist(trial_rows, schema=SCHEMAS["trials"])
    # long rows: one per non-empty metric cell (null = not evaluated; NaN and inf are values)
    parts = []
    base = {"workload": pa.array(df["workload"].to_numpy(), pa.string()),
            "batch_size": pa.array(df["batch_size"].to_numpy(np.int64)),
            "trial_id": pa.array(df["trial_id"].to_numpy(np.int64)),
            "step": pa.array(df["step"].to_numpy(np.int64))}
    for m in metrics:
        values = metric_arrays[m]
        part = pa.table({**base, "metric": pa.array([m] * len(values), pa.string()), "value": values})
        parts.append(part.filter(values.is_valid()))
    measurements = pa.concat_tables(parts).sort_by(
        [("workload", "ascending"), ("metric", "ascending"), ("batch_size", "ascending"),
         ("trial_id", "ascending"), ("step", "ascending")]).cast(SCHEMAS["measurements"])
    workloads = {}
    for w in definitions:
        dataset, model, optimizer = split_workload(w[0])
        workloads.setdefault(w[0], {"workload": w[0], "dataset": dataset, "model": model,
                                    "optimizer": optimizer, "tags": json.dumps({"source": source})})
    studies = pa.Table.from_pylist([study_row(d) for d in definitions.values()], schema=SCHEMAS["studies"])

    report = TableImportReport(file=str(path), studies=len(definitions), trials=trials.num_rows,
                               metrics=tuple(metrics))
    before = store.finished_trial_keys() & {r["trial_key"] for r in trial_rows}
    files = [store.write_data_file("measurements", measurements)] if measurements.num_rows else []
    try:
        report.trials_added = store.publish(
            trials, files, pa.Table.from_pylist(list(workloads.values()), schema=SCHEMAS["workloads"]),
            studies, operation=f"import table {file}")
    except BaseException:
        for rel in files:
            (store.root / rel).unlink(missing_ok=True)
        raise
    report.trials_already_present = report.trials - report.trials_added
    if not before:
        report.measurements_added = measurements.num_rows
    else:  # trials already published were skipped, with their measurements
        skipped = {(r["workload"], r["batch_size"], r["trial_id"]) for r in trial_rows if r["trial_key"] in before}
        keys = zip(df["workload"], df["batch_size"], df["trial_id"])
        rows_skipped = np.array([k in skipped for k in keys])
        report.measurements_added = measurements.num_rows - int(sum(
            np.sum(rows_skipped & np.asarray(metric_arrays[m].is_valid())) for m in metrics))
    return report
