"""batchlab.plots."""
