"""batchlab.probes."""
