"""batchlab.train."""
