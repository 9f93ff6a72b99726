"""The measurement store: immutable Parquet files, a commit log, DuckDB views.

>>> store = Store.open(path, create=True)
>>> con = store.connect()            # views: workloads, studies, trials, measurements
>>> store.table("trials")             # pyarrow.Table
>>> w = store.trial_writer(workload=..., batch_size=..., trial_id=..., trial_key=..., parameters=...)
>>> w.record(step, {"val/classification_error": 0.1}); w.finish(status="COMPLETE", steps=1000)
"""

from batchlab.store.schema import STATUSES, TABLES
from batchlab.store.store import Store
from batchlab.store.writer import TrialRecord, TrialWriter, publish_trials

__all__ = ["STATUSES", "TABLES", "Store", "TrialRecord", "TrialWriter", "publish_trials"]
