"""batchlab.optim."""
