"""Every fact about a store's schema, in one module: statuses, table and column names, the Arrow
schemas on disk and the DuckDB views over them, the directory layout and file names, the Parquet
layout of every table, and the names of workloads (:func:`store_workload_name`, :func:`split_workload`).
Every other module (the store, its writers, the analysis) takes these names from here; this module
imports nothing else of the store.

On disk every table is a set of immutable Parquet files. The views that readers see
(``docs/internals.md``) have exactly these columns:

- ``workloads(workload, dataset, model, optimizer, tags)``; ``tags`` is JSON text (an object).
- ``studies(workload, batch_size, study_id, search_space, train_steps, early_stopping, definition)``:
  one row per (workload, batch_size, study_id); ``definition`` is the JSON text of the study
  definition (:mod:`batchlab.store.studies`), ``study_id`` its id; ``search_space`` is JSON text in
  the batch_science ``parameter_configs`` form (``null`` when unknown); ``early_stopping`` is true
  when trials may stop before ``train_steps`` (a stop rule, or the release's flag).
- ``trials(workload, batch_size, trial_id, trial_key, study_id, parameters, status, steps, seed,
  source)``; ``parameters`` is JSON text, ``status`` one of :data:`STATUSES`, ``trial_key`` unique,
  ``study_id`` the study the trial belongs to.
- ``measurements(workload, batch_size, trial_id, step, metric, value)``: one row per
  (trial, step, metric); ``step`` counts optimizer updates.

Studies files carry one extra column on disk, ``extra`` (JSON text: the fields of a release
``study.json`` that have no column, kept so an export reproduces them); the view does not show it.

Files written before study definitions existed lack ``study_id`` (studies and trials) and
``definition`` (studies); files written since are named ``*.s2.parquet`` (:func:`data_suffix`). When
a table has an older file, its view reads every file by column name (DuckDB's ``union_by_name``, which
reads every file's footer when the view is created), and gives such rows the legacy id
:func:`batchlab.store.studies.legacy_study_id` (one study per workload and batch size) and a
definition built from the row's own columns with source ``legacy``; compaction copies them as they are.
"""

from __future__ import annotations

import re

import pyarrow as pa

from batchlab.errors import BatchlabError, unknown_name_error

#: Trial statuses. COMPLETE: ran its step budget; INCOMPLETE: stopped early for another reason (or
#: unknown); INFEASIBLE: diverged (non-finite loss); STOPPED_AT_GOAL: stopped before its budget
#: because an evaluation met its study's stop rule (``steps`` = updates actually run); RACED: stopped
#: by racing (``--race``) at an evaluation after which it could no longer be among its study's
#: ``keep`` best trials (its measurements are exactly the full protocol's up to ``steps``; it did
#: not meet the goal within them, and its first step meeting it, if any, is later than ``steps``).
STATUSES = ("COMPLETE", "INCOMPLETE", "INFEASIBLE", "STOPPED_AT_GOAL", "RACED")
#: The statuses of the batch_science release (metadata.json ``status``).
RELEASE_STATUSES = ("COMPLETE", "INCOMPLETE", "INFEASIBLE")
#: The statuses the analysis reads by default: trials that ran their step budget, and trials stopped
#: early because an evaluation met their study's stop rule (their steps are the updates actually run).
#: RACED trials take part too: their first step meeting the goal is unknown beyond their last
#: measurement (docs/methods.md, "Racing"), which the analysis honours instead of dropping them.
DEFAULT_ANALYSIS_STATUSES = ("COMPLETE", "STOPPED_AT_GOAL", "RACED")
TABLES = ("workloads", "studies", "trials", "measurements")
#: The suffix of a bound flag's metric name: a measurement row ``<metric>:bound`` at the same step as
#: ``<metric>`` says that value is a bound, ``+1.0`` a lower bound (true value >= it), ``-1.0`` an upper
#: bound (true value <= it): a goal check stopped once its outcome was decided (docs/methods.md,
#: "Evaluation schedule and resolution"). Flags are not metrics.
BOUND_SUFFIX = ":bound"


def store_workload_name(workload: str, optimizer: str) -> str:
    """The store's (and the release's) workload name ``dataset/model/optimizer`` of the registry
    workload ``dataset/model`` trained with ``optimizer``."""
    return f"{workload}/{optimizer}"


#: One part of a workload name (:func:`validate_workload_name`).
WORKLOAD_PART = re.compile(r"\w[\w.+-]{0,99}")
WORKLOAD_FORM = ("dataset/model/optimizer: three or more parts separated by '/', each 1 to 100 letters, digits, "
                 "'_', '.', '-' or '+', starting with a letter, digit or '_'")


def validate_workload_name(workload) -> str:
    """``workload`` if it is a store workload name, else a one-line BatchlabError naming the allowed form
    (:data:`WORKLOAD_FORM`). Every workload name that enters a store (trials, study definitions, the
    table and release imports) passes here, so a name is always a relative directory path that an
    export can write: no ``..``, ``.`` or empty part, no absolute path, backslash, space, control
    character or NUL."""
    if not isinstance(workload, str):
        raise BatchlabError(f"workload must be a string ({WORKLOAD_FORM}), got {workload!r}")
    parts = workload.split("/")
    if len(parts) < 3 or not all(WORKLOAD_PART.fullmatch(p) for p in parts):
        raise BatchlabError(f"workload {workload!r} is not of the form {WORKLOAD_FORM}")
    return workload


def split_workload(workload: str) -> tuple[str, str, str]:
    """``dataset/model/optimizer`` -> its three parts; extra leading levels stay in the dataset.

    ``mnist_subsets/mnist_6875/simple_cnn_base/nesterov_momentum`` gives dataset
    ``mnist_subsets/mnist_6875``. Raises BatchlabError unless the name passes
    :func:`validate_workload_name`.
    """
    parts = validate_workload_name(workload).split("/")
    return "/".join(parts[:-2]), parts[-2], parts[-1]


def validate_status(status: str) -> str:
    """Return ``status`` if it is one of :data:`STATUSES`, else BatchlabError."""
    if status not in STATUSES:
        raise unknown_name_error("trial status", str(status), STATUSES)
    return status

WORKLOADS_SCHEMA = pa.schema(
    [
        ("workload", pa.string()),
        ("dataset", pa.string()),
        ("model", pa.string()),
        ("optimizer", pa.string()),
        ("tags", pa.string()),
    ]
)
STUDIES_SCHEMA = pa.schema(
    [
        ("workload", pa.string()),
        ("batch_size", pa.int64()),
        ("study_id", pa.string()),
        ("search_space", pa.string()),
        ("train_steps", pa.int64()),
        ("early_stopping", pa.bool_()),
        ("definition", pa.string()),
        ("extra", pa.string()),
    ]
)
TRIALS_SCHEMA = pa.schema(
    [
        ("workload", pa.string()),
        ("batch_size", pa.int64()),
        ("trial_id", pa.int64()),
        ("trial_key", pa.string()),
        ("study_id", pa.string()),
        ("parameters", pa.string()),
        ("status", pa.string()),
        ("steps", pa.int64()),
        ("seed", pa.int64()),
        ("source", pa.string()),
    ]
)
MEASUREMENTS_SCHEMA = pa.schema(
    [
        ("workload", pa.dictionary(pa.int32(), pa.string())),
        ("batch_size", pa.int64()),
        ("trial_id", pa.int64()),
        ("step", pa.int64()),
        ("metric", pa.dictionary(pa.int32(), pa.string())),
        ("value", pa.float64()),
    ]
)
SCHEMAS = {
    "workloads": WORKLOADS_SCHEMA,
    "studies": STUDIES_SCHEMA,
    "trials": TRIALS_SCHEMA,
    "measurements": MEASUREMENTS_SCHEMA,
}

# Columns each view exposes (the studies view hides the on-disk ``extra`` column).
VIEW_COLUMNS = {
    "workloads": ("workload", "dataset", "model", "optimizer", "tags"),
    "studies": (
        "workload", "batch_size", "study_id", "search_space", "train_steps", "early_stopping",
        "definition",
    ),
    "trials": (
        "workload", "batch_size", "trial_id", "trial_key", "study_id", "parameters", "status", "steps",
        "seed", "source",
    ),
    "measurements": ("workload", "batch_size", "trial_id", "step", "metric", "value"),
}

_DUCKDB_TYPES = {
    pa.string(): "VARCHAR",
    pa.int64(): "BIGINT",
    pa.float64(): "DOUBLE",
    pa.bool_(): "BOOLEAN",
}


def duckdb_type(arrow_type: pa.DataType) -> str:
    """The DuckDB type a view column of ``arrow_type`` has (dictionaries read as their values)."""
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    return _DUCKDB_TYPES[arrow_type]


def empty_table(name: str) -> pa.Table:
    """An empty Arrow table with the on-disk schema of table ``name``."""
    return pa.Table.from_batches([], SCHEMAS[name])


# ---------------------------------------------------------------------------- directory layout
# A store directory (see batchlab.store.store and batchlab.store.log for what each part does):
#
#     batchlab-store.json                   MARKER: {"format": "batchlab-store", "version": FORMAT_VERSION}
#     _lock                                 LOCK_FILE: commit lock (flock)
#     log/<seq>.json                        LOG_DIR: commit log
#     data/<table>/<claim>-<uuid><suffix>   DATA_DIR: immutable Parquet files (data_file_name)
#     pending/<uuid>.jsonl, <claim>.claim   PENDING_DIR: journals of trials being written; claims
#     pending/trials/<sha>.claim, <owner>.owner   trial claims of sweep drivers (batchlab.sweep.claims)
#     advice/<advice_id>.json               ADVICE_DIR: batchlab advise's records (not a table)
MARKER = "batchlab-store.json"
FORMAT_VERSION = 1
LOCK_FILE = "_lock"
LOG_DIR = "log"
DATA_DIR = "data"
PENDING_DIR = "pending"
ADVICE_DIR = "advice"  # advise's records, one JSON file per advised unit, beside the tables; not a table
STORE_DIRS = (LOG_DIR, PENDING_DIR, *(f"{DATA_DIR}/{t}" for t in TABLES))

# Trials and studies files with the study columns are named "<claim>-<uuid>.s2.parquet", so a view
# knows from the names alone whether every file has them (the fast path: no per-file schema read).
CURRENT_SUFFIX = ".s2.parquet"


def data_suffix(name: str) -> str:
    """The file name ending of a new data file of table ``name``."""
    return CURRENT_SUFFIX if name in _LEGACY_COLUMNS else ".parquet"


def data_file_name(name: str, claim_id: str, unique: str) -> str:
    """The path, relative to the store, of a new data file of table ``name`` written under claim
    ``claim_id`` (``unique``: a fresh hex id): ``data/<table>/<claim>-<unique><suffix>``. The claim
    prefix tells compaction whose uncommitted file it is (``batchlab.store.maintenance``)."""
    return f"{DATA_DIR}/{name}/{claim_id}-{unique}{data_suffix(name)}"


# ---------------------------------------------------------------------------- Parquet layout
# One layout per table, used by every writer (trial writer, table and release imports, compaction).
# Measurements: rows sorted by MEASUREMENT_ORDER, row groups of MEASUREMENT_ROW_GROUP_ROWS rows, so each
# row group spans few (workload, metric) pairs and a query filtering on them skips the rest through
# the row groups' min/max statistics. Dictionary encoding of the sorted key columns turns their long
# runs into RLE runs that are nearly free to decode; step (increasing within a trial) is
# delta-encoded; value stays plain. The other tables are small: zstd, default encodings.
MEASUREMENT_ORDER = ("workload", "metric", "batch_size", "trial_id", "step")
MEASUREMENT_ROW_GROUP_ROWS = 1 << 16
_PARQUET_OPTIONS = {
    "measurements": {
        "compression": "snappy",
        "use_dictionary": ["workload", "metric", "batch_size", "trial_id"],
        "column_encoding": {"step": "DELTA_BINARY_PACKED"},
    },
}
_DEFAULT_PARQUET_OPTIONS = {"compression": "zstd"}
_DEFAULT_ROW_GROUP_ROWS = 1 << 20


def parquet_options(name: str) -> dict:
    """Keyword arguments of ``pyarrow.parquet.ParquetWriter`` (and ``write_table``) for data files of
    table ``name``: the one Parquet layout of that table."""
    return dict(_PARQUET_OPTIONS.get(name, _DEFAULT_PARQUET_OPTIONS))


def row_group_rows(name: str) -> int:
    """Rows per row group in data files of table ``name``."""
    return MEASUREMENT_ROW_GROUP_ROWS if name == "measurements" else _DEFAULT_ROW_GROUP_ROWS


def sort_measurements(table: pa.Table) -> pa.Table:
    """Measurement rows in the layout's order (:data:`MEASUREMENT_ORDER`, stable), with the
    measurements schema (dictionary columns)."""
    plain = table.select(list(MEASUREMENTS_SCHEMA.names))
    for i, f in enumerate(plain.schema):
        if pa.types.is_dictionary(f.type):  # Arrow does not sort dictionary columns
            plain = plain.set_column(i, f.name, plain[f.name].cast(f.type.value_type))
    if plain.num_rows > 1:
        plain = plain.sort_by([(c, "ascending") for c in MEASUREMENT_ORDER])
    return plain.cast(MEASUREMENTS_SCHEMA)


def view_sql(name: str, files: list[str]) -> str:
    """The SELECT that defines view ``name`` over the Parquet ``files`` (typed and empty if none)."""
    columns = VIEW_COLUMNS[name]
    if not files:
        typed = ", ".join(
            f"CAST(NULL AS {duckdb_type(SCHEMAS[name].field(c).type)}) AS {c}" for c in columns
        )
        return f"SELECT {typed} WHERE false"
    quoted = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
    if name not in _LEGACY_COLUMNS:
        return f"SELECT {', '.join(columns)} FROM read_parquet([{quoted}])"
    exprs = [_LEGACY_COLUMNS[name].get(c, c) for c in columns]
    if all(f.endswith(CURRENT_SUFFIX) for f in files):  # every file has every column
        return f"SELECT {', '.join(exprs)} FROM read_parquet([{quoted}])"
    # Read by column name, so files written before study definitions (no study_id/definition)
    # mix with new ones; the empty typed SELECT makes the columns exist even if no file has them.
    typed = ", ".join(
        f"CAST(NULL AS {duckdb_type(f.type)}) AS {f.name}" for f in SCHEMAS[name]
    )
    source = (f"(SELECT * FROM read_parquet([{quoted}], union_by_name = true) "
              f"UNION ALL BY NAME SELECT {typed} WHERE false)")
    return f"SELECT {', '.join(exprs)} FROM {source}"


# sha256("legacy:<workload>/<batch_size>")[:12], as batchlab.store.studies.legacy_study_id
_LEGACY_ID = ("coalesce(study_id, substr(sha256('legacy:' || workload || '/' || "
              "CAST(batch_size AS VARCHAR)), 1, 12)) AS study_id")
_LEGACY_COLUMNS = {
    "trials": {"study_id": _LEGACY_ID},
    "studies": {
        "study_id": _LEGACY_ID,
        "definition": (
            "coalesce(definition, CAST(json_object('workload', workload, 'batch_size', batch_size, "
            "'train_steps', train_steps, 'train_examples', NULL, 'search_space', json(search_space), "
            "'evaluation', NULL, 'stop_rule', NULL, 'seed', NULL, 'source', 'legacy', "
            "'early_stopping', early_stopping) AS VARCHAR)) AS definition"
        ),
    },
}


#: Columns that tables written before study definitions lack, per table (the views read them as
#: the legacy id and definition; an in-memory table given to the analysis may lack them too).
LEGACY_MISSING_COLUMNS: dict[str, tuple[str, ...]] = {
    name: tuple(columns) for name, columns in _LEGACY_COLUMNS.items()
}


def conform(table: pa.Table, name: str) -> pa.Table:
    """``table`` (rows of table ``name`` read from one file) with the on-disk schema: columns a file
    written before study definitions lacks are added as nulls (the views fill them in), then cast."""
    schema = SCHEMAS[name]
    for i, field in enumerate(schema):
        if field.name not in table.column_names:
            table = table.add_column(min(i, table.num_columns), field.name,
                                     pa.nulls(table.num_rows, field.type))
    return table.select(schema.names).cast(schema)
