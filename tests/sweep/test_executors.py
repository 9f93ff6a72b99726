"""Executors: device checks and the pinning of pool workers to GPUs (arithmetic only: no GPU needed)."""

import multiprocessing
import os

import pytest
import torch

from batchlab.errors import BatchlabError
from batchlab.sweep import executors
from batchlab.sweep.executors import LocalPoolExecutor, gpus_to_pin, make_executor, pinned_device
from batchlab.train.device import DEVICE_ENV


def _fake_cuda(monkeypatch, count):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_worker_i_gets_gpu_i_in_turn():
    assert [pinned_device(i, 4) for i in range(6)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3", "cuda:0", "cuda:1"]
    assert pinned_device(0, 1) == "cuda:0"
    with pytest.raises(ValueError):
        pinned_device(0, 0)


def test_only_several_gpus_and_an_unindexed_cuda_device_pin(monkeypatch):
    _fake_cuda(monkeypatch, 4)
    assert gpus_to_pin("auto") == gpus_to_pin("cuda") == 4
    assert gpus_to_pin("cuda:1") == 0 and gpus_to_pin("cpu") == 0  # every worker shares that device
    _fake_cuda(monkeypatch, 1)
    assert gpus_to_pin("auto") == 0  # one GPU: nothing to spread over
    _fake_cuda(monkeypatch, 0)
    assert gpus_to_pin("auto") == 0


def test_pool_size_is_one_worker_per_gpu(monkeypatch):
    _fake_cuda(monkeypatch, 4)
    assert LocalPoolExecutor(os.getenv, workers=16, gpus=4).workers == 4
    assert LocalPoolExecutor(os.getenv, workers=2, gpus=4).workers == 2
    assert LocalPoolExecutor(os.getenv, workers=3).workers == 3
    executor = make_executor(os.getenv, workers=8, device="auto")
    assert (executor.gpus, executor.workers) == (4, 4)
    assert make_executor(os.getenv, workers=8, device="cpu").workers == 8


def test_each_started_worker_takes_the_next_gpu(monkeypatch):
    counter = multiprocessing.get_context("spawn").Value("i", 0)
    seen = []
    for _ in range(5):
        monkeypatch.delenv(DEVICE_ENV, raising=False)
        seen.append(executors._pin_worker(counter, 3))
        assert os.environ[DEVICE_ENV] == seen[-1]
    assert seen == ["cuda:0", "cuda:1", "cuda:2", "cuda:0", "cuda:1"]


def test_spawned_workers_are_pinned_through_the_environment():
    # No GPU is needed: the workers only read the variable that resolve_device would read.
    with LocalPoolExecutor(os.getenv, workers=2, gpus=2) as executor:
        for _ in range(4):
            executor.submit(DEVICE_ENV)
        devices = [outcome.result for outcome in executor.outcomes()]
    assert len(devices) == 4 and set(devices) <= {"cuda:0", "cuda:1"}


@pytest.mark.parametrize("device", ["gpu", "cuda:x"])
def test_a_bad_device_is_one_line(device):
    with pytest.raises(BatchlabError, match="allowed: auto, cpu, cuda, cuda:N, mps") as err:
        make_executor(os.getenv, workers=1, device=device)
    assert "\n" not in str(err.value)
