"""The four tables of a store: their Arrow schemas on disk and the DuckDB views over them.

On disk every table is a set of immutable Parquet files. The views that readers see
(``docs/internals.md``) have exactly these columns:

- ``workloads(workload, dataset, model, optimizer, tags)``; ``tags`` is JSON text (an object).
- ``studies(workload, batch_size, search_space, train_steps, early_stopping)``; ``search_space`` is
  JSON text in the batch_science ``parameter_configs`` form (``null`` when unknown).
- ``trials(workload, batch_size, trial_id, trial_key, parameters, status, steps, seed, source)``;
  ``parameters`` is JSON text, ``status`` one of :data:`STATUSES`, ``trial_key`` unique.
- ``measurements(workload, batch_size, trial_id, step, metric, value)``: one row per
  (trial, step, metric); ``step`` counts optimizer updates.

Studies files carry one extra column on disk, ``extra`` (JSON text: the fields of a release
``study.json`` that have no column, kept so an export reproduces them); the view does not show it.
"""

from __future__ import annotations

import pyarrow as pa

STATUSES = ("COMPLETE", "INCOMPLETE", "INFEASIBLE")
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
        ("search_space", pa.string()),
        ("train_steps", pa.int64()),
        ("early_stopping", pa.bool_()),
        ("extra", pa.string()),
    ]
)
TRIALS_SCHEMA = pa.schema(
    [
        ("workload", pa.string()),
        ("batch_size", pa.int64()),
        ("trial_id", pa.int64()),
        ("trial_key", pa.string()),
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
    "studies": ("workload", "batch_size", "search_space", "train_steps", "early_stopping"),
    "trials": (
        "workload", "batch_size", "trial_id", "trial_key", "parameters", "status", "steps", "seed",
        "source",
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


def view_sql(name: str, files: list[str]) -> str:
    """The SELECT that defines view ``name`` over the Parquet ``files`` (typed and empty if none)."""
    columns = VIEW_COLUMNS[name]
    if not files:
        typed = ", ".join(
            f"CAST(NULL AS {duckdb_type(SCHEMAS[name].field(c).type)}) AS {c}" for c in columns
        )
        return f"SELECT {typed} WHERE false"
    quoted = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
    return f"SELECT {', '.join(columns)} FROM read_parquet([{quoted}])"
