"""batchlab: the science of batch size in neural-network training.

Two sources answer one question (how many steps to reach a goal, as a function of batch size):
the exact noisy quadratic model (:mod:`batchlab.nqm`) and measured training runs
(:mod:`batchlab.workloads`, :mod:`batchlab.train`, :mod:`batchlab.sweep`), which meet in one store
(:mod:`batchlab.store`) and one analysis (:mod:`batchlab.analysis`).
"""

__version__ = "0.1.0"
