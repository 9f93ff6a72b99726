"""Shared fixtures: a real MNIST workload with a goal loose enough for a few dozen steps."""

import dataclasses

import pytest

from batchlab.workloads import get_workload, registry

EASY = "mnist/fc_64_64_64_easygoal"


@pytest.fixture
def easy_workload(monkeypatch):
    """``mnist/fc_64_64_64`` (real data, model and metrics) registered under another name with the
    goal val/classification_error < 0.75, which momentum 0.9 at learning rate 0.1 beats within ~30
    steps of batch size 64 on 512 examples."""
    base = get_workload("mnist/fc_64_64_64")
    monkeypatch.setitem(registry.WORKLOADS, EASY, dataclasses.replace(base, name=EASY, goal=0.75))
    return EASY
