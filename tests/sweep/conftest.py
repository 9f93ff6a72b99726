"""Fixtures of the sweep tests (helpers live in sweep_helpers.py)."""

from __future__ import annotations

import pytest

from sweep_helpers import store_contents, tiny_config


@pytest.fixture(scope="module")
def tiny_baseline(tmp_path_factory):
    """The TINY sweep run uninterrupted, in this process: (store path, summary, store contents)."""
    from batchlab.sweep.executors import InlineExecutor
    from batchlab.sweep.runner import prepare_sweep, run_sweep

    path = tmp_path_factory.mktemp("baseline") / "store"
    summary = run_sweep(prepare_sweep(tiny_config(), str(path)),
                        executor_factory=lambda fn, **kw: InlineExecutor(fn))
    return path, summary, store_contents(path)
