"""The measurement store: immutable Parquet files, a commit log, DuckDB views.

>>> store, created = Store.open_or_create(path)   # or Store.open(path) for an existing store
>>> con = store.connect()            # views: workloads, studies, trials, measurements
>>> store.table("trials")             # pyarrow.Table
>>> w = store.trial_writer(workload=..., batch_size=..., trial_id=..., trial_key=..., parameters=...)
>>> w.record(step, {"val/classification_error": 0.1}); w.finish(status="COMPLETE", steps=1000)

The names of the store (statuses, tables, view columns, file layout) are in
:mod:`batchlab.store.schema`.
"""

from batchlab.store.schema import STATUSES, TABLES, store_workload_name
from batchlab.store.store import Store, store_for_import
from batchlab.store.writer import TrialRecord, TrialWriter, publish_trials

__all__ = [
    "STATUSES", "TABLES", "Store", "TrialRecord", "TrialWriter", "publish_trials", "store_for_import",
    "store_workload_name",
]
