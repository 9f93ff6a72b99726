"""Fixtures for the store tests: small release-format trees written by the tests themselves."""

from __future__ import annotations

import pytest

from batchlab.store import Store
from release_trees import make_release


@pytest.fixture
def release(tmp_path):
    root = tmp_path / "batch_science"
    studies = make_release(root)
    return root, studies


@pytest.fixture
def store(tmp_path):
    return Store.open(tmp_path / "store", create=True)
