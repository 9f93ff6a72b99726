"""batchlab.report."""
