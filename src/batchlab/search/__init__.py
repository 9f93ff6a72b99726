"""batchlab.search."""
