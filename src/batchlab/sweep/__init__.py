"""batchlab.sweep."""
