"""The four tables of a store: their Arrow schemas on disk and the DuckDB views over them.

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

import pyarrow as pa

#: Trial statuses. COMPLETE: ran its step budget; INCOMPLETE: stopped early for another reason (or
#: unknown); INFEASIBLE: diverged (non-finite loss); STOPPED_AT_GOAL: stopped before its budget
#: because an evaluation met its study's stop rule (``steps`` = updates actually run).
STATUSES = ("COMPLETE", "INCOMPLETE", "INFEASIBLE", "STOPPED_AT_GOAL")
#: The statuses of the batch_science release (metadata.json ``status``).
RELEASE_STATUSES = ("COMPLETE", "INCOMPLETE", "INFEASIBLE")
TABLES = ("workloads", "studies", "trials", "measurements")

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


# Trials and studies files with the study columns are named "<claim>-<uuid>.s2.parquet", so a view
# knows from the names alone whether every file has them (the fast path: no per-file schema read).
CURRENT_SUFFIX = ".s2.parquet"


def data_suffix(name: str) -> str:
    """The file name ending of a new data file of table ``name``."""
    return CURRENT_SUFFIX if name in _LEGACY_COLUMNS else ".parquet"


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


def conform(table: pa.Table, name: str) -> pa.Table:
    """``table`` (rows of table ``name`` read from one file) with the on-disk schema: columns a file
    written before study definitions lacks are added as nulls (the views fill them in), then cast."""
    schema = SCHEMAS[name]
    for i, field in enumerate(schema):
        if field.name not in table.column_names:
            table = table.add_column(min(i, table.num_columns), field.name,
                                     pa.nulls(table.num_rows, field.type))
    return table.select(schema.names).cast(schema)
