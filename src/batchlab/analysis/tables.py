"""The four store views the analysis reads, and a way to build them from in-memory tables.

The analysis is written against the DuckDB views a :class:`batchlab.store.Store` connection provides
(docs/internals.md)::

    workloads(workload, dataset, model, optimizer, tags)
    studies(workload, batch_size, search_space, train_steps, early_stopping)
    trials(workload, batch_size, trial_id, trial_key, parameters, status, steps, seed, source)
    measurements(workload, batch_size, trial_id, step, metric, value)

:func:`connect_tables` builds the same views from pandas DataFrames or Arrow tables, so the analysis
also runs on data that never went through a store (a notebook, a test, another tool's export).
"""

from __future__ import annotations

import duckdb

from batchlab.errors import BatchlabError

VIEW_COLUMNS: dict[str, tuple[str, ...]] = {
    "workloads": ("workload", "dataset", "model", "optimizer", "tags"),
    "studies": ("workload", "batch_size", "search_space", "train_steps", "early_stopping"),
    "trials": ("workload", "batch_size", "trial_id", "trial_key", "parameters", "status", "steps", "seed", "source"),
    "measurements": ("workload", "batch_size", "trial_id", "step", "metric", "value"),
}

TRIAL_STATUSES = ("COMPLETE", "INCOMPLETE", "INFEASIBLE")


def connect_tables(*, workloads, studies, trials, measurements) -> duckdb.DuckDBPyConnection:
    """Return a fresh in-memory DuckDB connection with the four store views over the given tables.

    Each argument is a pandas DataFrame or a pyarrow Table holding (at least) the view's columns
    (:data:`VIEW_COLUMNS`); extra columns are dropped.

    Raises:
        BatchlabError: a table lacks one of its view's columns.
    """
    con = duckdb.connect(":memory:")
    for name, table in (("workloads", workloads), ("studies", studies), ("trials", trials), ("measurements", measurements)):
        columns = list(table.column_names) if hasattr(table, "column_names") else list(table.columns)
        missing = [c for c in VIEW_COLUMNS[name] if c not in columns]
        if missing:
            raise BatchlabError(f"table {name!r} lacks columns {missing}; required: {', '.join(VIEW_COLUMNS[name])}")
        con.register(f"_batchlab_source_{name}", table)
        con.execute(f"CREATE VIEW {name} AS SELECT {', '.join(VIEW_COLUMNS[name])} FROM _batchlab_source_{name}")
    return con
