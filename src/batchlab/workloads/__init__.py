"""batchlab.workloads."""
