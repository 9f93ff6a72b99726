"""batchlab.data."""
