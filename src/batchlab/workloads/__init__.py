"""Workloads: data + model + loss + metric + goal + default step budget + evaluation schedule.

>>> from batchlab.workloads import get_workload, workload_names
>>> w = get_workload("mnist/fc_128_128_128")
>>> data = w.load_data(train_examples=1000, seed=0)
>>> model = w.build_model(seed=0)
>>> w.evaluate(model, data.val_x, data.val_y, split="val")  # {"val/cross_entropy_error": ..., ...}

See docs/internals.md for the contract and :mod:`batchlab.workloads.registry` for the list.
"""

from batchlab.workloads.base import Workload, WorkloadData
from batchlab.workloads.registry import get_workload, workload_names

__all__ = ["Workload", "WorkloadData", "get_workload", "workload_names"]
