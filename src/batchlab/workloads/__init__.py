"""Workloads: model + data + task (loss and metrics) + goal + default step budget + evaluation schedule.

>>> from batchlab.workloads import get_workload, workload_names
>>> w = get_workload("mnist/fc_128_128_128")
>>> data = w.load_data(train_examples=1000, seed=0)
>>> model = w.build_model(seed=0)
>>> w.evaluate(model, data.val, split="val")  # {"val/cross_entropy_error": ..., ...}

Your own workload (no subclassing; docs/workloads.md has the whole protocol, examples/ two files)::

    from batchlab.workloads import Workload, regression

    def workload():
        return Workload(name="toy/mlp", make_model=make_model, data=make_data, task=regression(), goal=0.1)

``get_workload``/``resolve_workload`` also take references ``package.module:function`` and
``path/to/file.py:function`` and entry points (group ``batchlab.workloads``);
:mod:`batchlab.workloads.registry` lists the built-ins.
"""

from batchlab.workloads.base import Workload
from batchlab.workloads.data import DatasetSplit, DataSplit, TensorSplit, WorkloadData
from batchlab.workloads.references import (
    ENTRY_POINT_GROUP,
    register_workload,
    resolve_workload,
    worker_resolvable,
    workload_key,
)
from batchlab.workloads.registry import get_workload, workload_names
from batchlab.workloads.schedule import EvaluationSchedule
from batchlab.workloads.tasks import Task, classification, custom_task, language_model, regression

__all__ = [
    "Workload", "WorkloadData", "DataSplit", "TensorSplit", "DatasetSplit", "Task", "classification", "regression",
    "language_model", "custom_task", "EvaluationSchedule", "get_workload", "resolve_workload", "register_workload",
    "workload_key", "worker_resolvable", "workload_names", "ENTRY_POINT_GROUP",
]
