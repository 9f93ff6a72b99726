"""batchlab.store."""
