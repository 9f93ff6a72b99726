"""Test-wide settings: one torch thread and passive OpenMP waits (spinning threads are 10-60x slower
on few cores), a non-interactive matplotlib backend, and a workload registry restored after each test."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _workload_registry_restored():
    """Each test sees the workload registry as the test session started it: a workload a test
    registers (directly, or through a sweep config that registers the objects it is given) is gone
    afterwards, so no other test lists it."""
    from batchlab.workloads import registry

    saved = dict(registry.WORKLOADS)
    yield
    registry.WORKLOADS.clear()
    registry.WORKLOADS.update(saved)
