"""advise's step times and memory probe (batchlab.advise.throughput), on the CPU: real timed updates of a
tiny MNIST network, the memory probe under an artificially low RLIMIT_AS (computed from the bytes a batch
must allocate, so it holds on any machine), the limit restored afterwards, and bad input in one line."""

import json
from pathlib import Path
import math

import pytest

from batchlab.advise.throughput import (
    MemoryProbe,
    StepTime,
    Throughput,
    is_out_of_memory,
    measure_throughput,
)
from batchlab.errors import BatchlabError

resource = pytest.importorskip("resource")
WORKLOAD = "mnist/fc_64_64_64"


def example_bytes(workload: str) -> int:
    """Bytes of one training example's input, read from the workload's data (float32 28x28 for MNIST)."""
    import torch

    from batchlab.workloads import get_workload

    data = get_workload(workload).load_data(train_examples=8, seed=0)
    x, _ = data.train.batch(torch.arange(1))
    return x.element_size() * x.nelement()


def test_step_times_are_positive_and_round_trip():
    result = measure_throughput(WORKLOAD, "sgd", [512, 8, 64], device="cpu", train_examples=4096,
                                warmup_steps=2, timed_steps=5)
    assert result.device == "cpu"
    assert [s.batch_size for s in result.step_times] == [8, 64, 512]  # ascending, whatever the order given
    for entry in result.step_times:
        assert math.isfinite(entry.seconds_per_step) and entry.seconds_per_step > 0
        assert 0 < entry.low <= entry.seconds_per_step <= entry.high
        assert (entry.warmup_steps, entry.timed_steps) == (2, 5)
        assert entry.examples == 7 * entry.batch_size
        assert result.seconds_per_step(entry.batch_size) == entry.seconds_per_step
    assert result.seconds_per_step(128) is None
    # every update counted: one preflight update at the smallest batch size, then 7 per batch size
    assert result.examples == 8 + 7 * (8 + 64 + 512)
    memory = result.memory
    assert memory.largest_fitting == 512 and memory.not_tried == []
    assert [t["fits"] for t in memory.tried] == [True, True, True]
    assert "MemAvailable" in memory.limit_source and memory.limit_bytes > 0
    assert (result.fits(64), result.fits(512), result.fits(1024)) == (True, True, None)

    data = json.loads(json.dumps(result.to_dict()))
    assert Throughput.from_dict(data) == result
    assert StepTime.from_dict(result.step_times[0].to_dict()) == result.step_times[0]


def test_memory_probe_under_a_low_limit_stops_at_the_first_batch_that_does_not_fit():
    """Run in a fresh process: the CPU limit is on address space, and memory an earlier test freed but
    the C allocator kept (docs/methods.md, "Step times and the memory probe") would count as available."""
    import subprocess
    import sys

    code = ("import sys; sys.path.insert(0, %r); import test_throughput as t; "
            "t.memory_probe_under_a_low_limit()" % str(Path(__file__).parent))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


def memory_probe_under_a_low_limit():
    # A try at batch size B must gather its batch: one allocation of B * example bytes. Half of that at
    # B = 16384 is the allowance, so that batch cannot fit, while B = 8 and 64 need far less (their
    # largest allocation is the fixed 2,000-example train-metric subset, an eighth of the allowance).
    big = 16384
    limit = big * example_bytes(WORKLOAD) // 2
    before = resource.getrlimit(resource.RLIMIT_AS)
    said = []
    result = measure_throughput(WORKLOAD, "sgd", [8, 64, big, 32768], device="cpu", train_examples=32768,
                                memory_limit_bytes=limit, warmup_steps=1, timed_steps=2, progress=said.append)
    assert resource.getrlimit(resource.RLIMIT_AS) == before  # restored after every try
    memory = result.memory
    assert memory.largest_fitting == 64
    assert [(t["batch_size"], t["fits"]) for t in memory.tried] == [(8, True), (64, True), (big, False)]
    assert memory.tried[0]["error"] is None and "memory" in memory.tried[2]["error"].lower()
    assert "\n" not in memory.tried[2]["error"]
    assert memory.not_tried == [32768]
    assert memory.limit_bytes == limit and "memory_limit_bytes" in memory.limit_source
    assert [s.batch_size for s in result.step_times] == [8, 64]  # only the ones that fit are timed
    assert result.fits(64) is True and result.fits(big) is False and result.fits(32768) is False
    assert any("does not fit" in line for line in said)
    assert MemoryProbe.from_dict(json.loads(json.dumps(memory.to_dict()))) == memory

    # the same machine without the artificial limit fits the large batch (the limit made the difference)
    free = measure_throughput(WORKLOAD, "sgd", [big], device="cpu", train_examples=32768, warmup_steps=0,
                              timed_steps=1)
    assert free.memory.largest_fitting == big
    assert resource.getrlimit(resource.RLIMIT_AS) == before


def test_out_of_memory_errors_are_recognised():
    import torch

    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"))
    assert is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_out_of_memory(ValueError("out of memory"))


@pytest.mark.parametrize("sizes, fragment", [
    ([], "at least one batch size"),
    ([8, 0], "batch size 0 is out of range; allowed: integers from 1 to 4096"),
    ([8, 8192], "batch size 8192 is out of range; allowed: integers from 1 to 4096"),
    ([8, 2.5], "got 2.5"),
    ([True], "got True"),
    ("64", "must be a list"),
])
def test_bad_batch_sizes_are_one_line_errors(sizes, fragment):
    with pytest.raises(BatchlabError) as info:
        measure_throughput(WORKLOAD, "sgd", sizes, device="cpu", train_examples=4096)
    message = str(info.value)
    assert fragment in message and "\n" not in message


def test_bad_settings_fail_before_anything_runs():
    with pytest.raises(BatchlabError, match="timed steps must be >= 1"):
        measure_throughput(WORKLOAD, "sgd", [8], device="cpu", train_examples=4096, timed_steps=0)
    with pytest.raises(BatchlabError, match="memory limit"):
        measure_throughput(WORKLOAD, "sgd", [8], device="cpu", train_examples=4096, memory_limit_bytes=-1)
    with pytest.raises(BatchlabError, match="learning rate must be > 0"):
        measure_throughput(WORKLOAD, "sgd", [8], device="cpu", train_examples=4096, hyperparameters={"learning_rate": -1.0})
    # the training set is the whole split without train_examples: 55,000 MNIST images
    with pytest.raises(BatchlabError, match="allowed: integers from 1 to 55000"):
        measure_throughput(WORKLOAD, "sgd", [60000], device="cpu")


def test_a_diverging_loss_does_not_stop_the_probe():
    result = measure_throughput(WORKLOAD, "sgd", [64], device="cpu", train_examples=4096, warmup_steps=1,
                                timed_steps=3, hyperparameters={"learning_rate": 1e6})
    assert result.memory.largest_fitting == 64 and result.seconds_per_step(64) > 0
