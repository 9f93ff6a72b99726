"""Test-wide settings: one torch thread and passive OpenMP waits (spinning threads are 10-60x slower
on few cores), and a non-interactive matplotlib backend."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
