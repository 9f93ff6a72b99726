"""batchlab.nqm."""
