"""The four store views the analysis reads, and a way to build them from in-memory tables.

The analysis is written against the DuckDB views a :class:`batchlab.store.Store` connection provides
(docs/internals.md; the names are :mod:`batchlab.store.schema`'s)::

    workloads(workload, dataset, model, optimizer, tags)
    studies(workload, batch_size, study_id, search_space, train_steps, early_stopping, definition)
    trials(workload, batch_size, trial_id, trial_key, study_id, parameters, status, steps, seed, source)
    measurements(workload, batch_size, trial_id, step, metric, value)

``study_id`` names one study definition (budget, train examples, search space, evaluation
schedule, stop rule, seed, source: the JSON text in ``definition``); trials of one workload and
batch size may come from several studies.

:func:`connect_tables` builds the same views from pandas DataFrames or Arrow tables, so the analysis
also runs on data that never went through a store (a notebook, a test, another tool's export).
"""

from __future__ import annotations

import duckdb

from batchlab.errors import BatchlabError
from batchlab.store.schema import DEFAULT_ANALYSIS_STATUSES, LEGACY_MISSING_COLUMNS, STATUSES, TABLES, VIEW_COLUMNS

__all__ = [
    "DEFAULT_STATUSES", "OPTIONAL_COLUMNS", "TRIAL_STATUSES", "VIEW_COLUMNS", "connect_tables", "view_columns",
    "with_study_id",
]

# The names here are the store schema's own (batchlab.store.schema), never copies: the analysis
# reads exactly the views a store connection has (VIEW_COLUMNS: the columns of each view).

#: Columns a table given to :func:`connect_tables` may lack (they read as NULL): tables written
#: before stores kept study definitions have none (``batchlab.store.schema.LEGACY_MISSING_COLUMNS``).
OPTIONAL_COLUMNS = LEGACY_MISSING_COLUMNS
#: Every trial status (``batchlab.store.schema.STATUSES``).
TRIAL_STATUSES = STATUSES
#: The statuses analysed by default: trials that ran their step budget, and trials stopped early
#: because an evaluation met their study's stop rule (their steps are the updates actually run);
#: ``batchlab.store.schema.DEFAULT_ANALYSIS_STATUSES``.
DEFAULT_STATUSES = DEFAULT_ANALYSIS_STATUSES


def connect_tables(*, workloads, studies, trials, measurements) -> duckdb.DuckDBPyConnection:
    """Return a fresh in-memory DuckDB connection with the four store views over the given tables.

    Each argument is a pandas DataFrame or a pyarrow Table holding (at least) the view's columns
    (:data:`VIEW_COLUMNS`, except the :data:`OPTIONAL_COLUMNS`, which read as NULL when absent);
    extra columns are dropped.

    Raises:
        BatchlabError: a table lacks one of its view's columns.
    """
    con = duckdb.connect(":memory:")
    given = {"workloads": workloads, "studies": studies, "trials": trials, "measurements": measurements}
    for name in TABLES:
        table = given[name]
        columns = list(table.column_names) if hasattr(table, "column_names") else list(table.columns)
        optional = OPTIONAL_COLUMNS.get(name, ())
        missing = [c for c in VIEW_COLUMNS[name] if c not in columns and c not in optional]
        if missing:
            required = [c for c in VIEW_COLUMNS[name] if c not in optional]
            raise BatchlabError(f"table {name!r} lacks columns {missing}; required: {', '.join(required)}")
        con.register(f"_batchlab_source_{name}", table)
        select = ", ".join(
            c if c not in optional else f"CAST({c if c in columns else 'NULL'} AS VARCHAR) AS {c}"
            for c in VIEW_COLUMNS[name]
        )
        con.execute(f"CREATE VIEW {name} AS SELECT {select} FROM _batchlab_source_{name}")
    return con


def view_columns(con: duckdb.DuckDBPyConnection, view: str) -> tuple[str, ...]:
    """The columns of ``view`` on this connection (a store written before a column existed lacks it)."""
    return tuple(d[0] for d in con.execute(f"SELECT * FROM {view} LIMIT 0").description)


def with_study_id(con: duckdb.DuckDBPyConnection, view: str) -> str:
    """``view``, or a subquery adding a NULL ``study_id`` where the store's view has none."""
    if "study_id" in view_columns(con, view):
        return view
    return f"(SELECT *, CAST(NULL AS VARCHAR) AS study_id FROM {view})"
