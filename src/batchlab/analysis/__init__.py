"""batchlab.analysis."""
