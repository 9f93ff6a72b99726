"""Where a workload can run and how fast: step times and the largest batch that fits, on one device.

:func:`measure_throughput` is the first step of ``batchlab advise`` (docs/methods.md, "Step times and
the memory probe"). For each candidate batch size, in ascending order, it builds the trial exactly as
a trial of a sweep is built (:func:`batchlab.train.trial.prepare_trial`: the workload's data, model,
loss and the optimizer's training algorithm, on the trial's device) and runs updates as the trial's
hot loop runs them (:func:`batchlab.train.core.batch_source` on the batches of
:class:`batchlab.train.sampling.BatchSampler`, then ``algorithm.step``):

* ``warmup_steps`` updates, untimed, to reach the steady state (lazy allocations, caches, kernels
  chosen on first use), then ``timed_steps`` updates, each timed alone (``time.perf_counter`` around
  the update, with ``torch.cuda.synchronize`` before and after it on a CUDA device, so the time is
  the update's, not the queue's). Nothing is evaluated.
* :class:`StepTime`: ``seconds_per_step`` is the median of the timed updates, ``low`` and ``high``
  their minimum and maximum: the spread of this one measurement, not a confidence interval.
* Counting: steps are optimizer updates; ``examples`` = updates x batch size (every update of the
  probe, warm-up included; evaluation is never run, so never counted).

The memory probe (as PyTorch Lightning's batch-size finder does: by trying): a batch size *fits*
when its warm-up and timed updates (and building its model and optimizer) run without an
out-of-memory error (:func:`is_out_of_memory`). The first batch size that does not fit stops the
probe; the larger ones are recorded as not tried (memory grows with the batch size). After a
failure the memory is freed (``gc.collect``, ``torch.cuda.empty_cache``). The limit a try runs under:

* CPU (Linux): the soft ``RLIMIT_AS`` (address space) of the process is set, for the duration of each
  try and restored in ``finally``, to its address-space size before the try (``VmSize`` of
  ``/proc/self/status``) plus an allowance: ``memory_limit_bytes`` when given (an artificially low
  limit, for tests and for users who share the machine), else ``MemAvailable`` of ``/proc/meminfo``
  read when the probe starts (so the probe never pushes the machine into swap). Where ``RLIMIT_AS``
  cannot be used (no ``resource`` module, no ``/proc``), each try runs without a limit and
  :attr:`MemoryProbe.limit_source` says so.
* CUDA: with ``memory_limit_bytes``, ``torch.cuda.set_per_process_memory_fraction(limit / total)``
  for each try (restored to 1.0 after it); this caps everything the process holds on the device
  (data and model included), not an allowance on top; without it, the device's own memory.
* MPS: no limit is set (stated in ``limit_source``).

Before the first try, one update at the smallest batch size runs outside any limit: it loads the
data (kept for the tries: :func:`batchlab.train.trial.prepare_trial`'s cache), starts torch's threads
and checks every setting, so bad input fails before anything is measured. It is counted in
:attr:`Throughput.examples`.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from batchlab.errors import BatchlabError, checked_int

__all__ = ["MemoryProbe", "StepTime", "Throughput", "is_out_of_memory", "measure_throughput"]

OUT_OF_MEMORY_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "defaultcpuallocator",
                         "bad_alloc")
"""Lower-case fragments of an error message that mark a ``RuntimeError`` as out of memory."""


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` says the device ran out of memory: ``torch.OutOfMemoryError`` (CUDA),
    ``MemoryError`` (Python, numpy), an ``OSError`` with ``ENOMEM``, or a ``RuntimeError`` whose message
    holds one of :data:`OUT_OF_MEMORY_MARKERS` (torch's CPU allocator: ``DefaultCPUAllocator: can't
    allocate memory``; CUDA and MPS: ``out of memory``)."""
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if isinstance(error, MemoryError) or (oom is not None and isinstance(error, oom)):
        return True
    if isinstance(error, OSError) and error.errno == errno.ENOMEM:
        return True
    if isinstance(error, RuntimeError):
        message = str(error).lower()
        return any(marker in message for marker in OUT_OF_MEMORY_MARKERS)
    return False


@dataclass(frozen=True)
class StepTime:
    """The measured time of one update at ``batch_size`` on the probe's device.

    ``seconds_per_step``: median over the ``timed_steps`` timed updates (seconds of wall clock per
    optimizer update: sampling the batch, moving it to the device, forward, backward, optimizer
    step); ``low``/``high``: the fastest and slowest of them (the spread of this one measurement, not
    a confidence interval); ``warmup_steps``: untimed updates before them; ``examples``:
    ``(warmup_steps + timed_steps) * batch_size``, the examples this measurement processed."""

    batch_size: int
    seconds_per_step: float
    low: float
    high: float
    timed_steps: int
    warmup_steps: int
    examples: int

    @property
    def examples_per_second(self) -> float:
        """``batch_size / seconds_per_step``: training examples per second at the median step time."""
        return self.batch_size / self.seconds_per_step if self.seconds_per_step > 0 else math.inf

    def to_dict(self) -> dict:
        return {"batch_size": self.batch_size, "seconds_per_step": self.seconds_per_step, "low": self.low,
                "high": self.high, "timed_steps": self.timed_steps, "warmup_steps": self.warmup_steps,
                "examples": self.examples}

    @classmethod
    def from_dict(cls, data: dict) -> "StepTime":
        return cls(batch_size=int(data["batch_size"]), seconds_per_step=float(data["seconds_per_step"]),
                   low=float(data["low"]), high=float(data["high"]), timed_steps=int(data["timed_steps"]),
                   warmup_steps=int(data["warmup_steps"]), examples=int(data["examples"]))


@dataclass
class MemoryProbe:
    """Which batch sizes fit in memory, found by trying them in ascending order.

    ``largest_fitting``: the largest batch size tried that fit (``None``: none did); ``tried``: one
    ``{"batch_size", "fits", "error"}`` per batch size tried, in order (``error``: the one-line
    out-of-memory message of a batch size that did not fit, else ``None``); ``not_tried``: the batch
    sizes above the first that did not fit; ``limit_bytes``: the limit the tries ran under (the
    allowance above the process's address space on the CPU, the per-process cap on CUDA; ``None``:
    none); ``limit_source``: where that limit comes from, in words; ``device``: the device described
    (:func:`batchlab.train.device.describe_device`)."""

    largest_fitting: int | None
    tried: list[dict] = field(default_factory=list)
    not_tried: list[int] = field(default_factory=list)
    limit_bytes: int | None = None
    limit_source: str = ""
    device: str = "cpu"

    def to_dict(self) -> dict:
        return {"largest_fitting": self.largest_fitting, "tried": [dict(t) for t in self.tried],
                "not_tried": list(self.not_tried), "limit_bytes": self.limit_bytes,
                "limit_source": self.limit_source, "device": self.device}

    @classmethod
    def from_dict(cls, data: dict) -> "MemoryProbe":
        largest, limit = data.get("largest_fitting"), data.get("limit_bytes")
        return cls(largest_fitting=None if largest is None else int(largest),
                   tried=[{"batch_size": int(t["batch_size"]), "fits": bool(t["fits"]),
                           "error": None if t.get("error") is None else str(t["error"])} for t in data.get("tried", [])],
                   not_tried=[int(b) for b in data.get("not_tried", [])],
                   limit_bytes=None if limit is None else int(limit), limit_source=str(data.get("limit_source", "")),
                   device=str(data.get("device", "cpu")))

    @property
    def first_failing(self) -> int | None:
        """The smallest batch size tried that did not fit (``None``: every one tried fit)."""
        return next((t["batch_size"] for t in self.tried if not t["fits"]), None)


@dataclass
class Throughput:
    """Step times and the memory probe of one workload and optimizer on one device.

    ``device``: the device described (``"cpu"``, ``"cuda:0 (NVIDIA H200)"``); ``step_times``: one
    :class:`StepTime` per batch size that fit, ascending; ``memory``: the :class:`MemoryProbe`;
    ``examples``: training examples the whole probe processed (updates x batch size, summed over
    every update it ran: the preflight update, the warm-up and timed updates, and the updates of a
    try that ran out of memory before it failed)."""

    device: str
    step_times: tuple[StepTime, ...]
    memory: MemoryProbe
    examples: int

    def seconds_per_step(self, batch_size: int) -> float | None:
        """The median seconds per update measured at ``batch_size`` (``None``: not measured)."""
        for entry in self.step_times:
            if entry.batch_size == batch_size:
                return entry.seconds_per_step
        return None

    def fits(self, batch_size: int) -> bool | None:
        """Whether ``batch_size`` fits: ``True`` up to the largest that fit, ``False`` from the first that
        did not (memory grows with the batch size), ``None`` above every batch size tried."""
        failing = self.memory.first_failing
        if failing is not None and batch_size >= failing:
            return False
        largest = self.memory.largest_fitting
        if largest is not None and batch_size <= largest:
            return True
        return None

    def to_dict(self) -> dict:
        return {"device": self.device, "step_times": [s.to_dict() for s in self.step_times],
                "memory": self.memory.to_dict(), "examples": self.examples}

    @classmethod
    def from_dict(cls, data: dict) -> "Throughput":
        return cls(device=str(data["device"]), step_times=tuple(StepTime.from_dict(s) for s in data.get("step_times", [])),
                   memory=MemoryProbe.from_dict(data["memory"]), examples=int(data.get("examples", 0)))


# ---------------------------------------------------------------------------------------------- input


def _checked_batch_sizes(batch_sizes: Any, num_train: int) -> list[int]:
    """``batch_sizes`` as a sorted list of distinct ints in ``1..num_train``; else a one-line error."""
    allowed = f"integers from 1 to {num_train} (the training set size)"
    if isinstance(batch_sizes, (str, bytes)) or not hasattr(batch_sizes, "__iter__"):
        raise BatchlabError(f"batch sizes must be a list of {allowed}, got {batch_sizes!r}")
    values = []
    for value in batch_sizes:
        values.append(checked_int("batch size", value, 1, num_train))
    if not values:
        raise BatchlabError(f"give at least one batch size ({allowed})")
    return sorted(set(values))


def _training_set_size(workload: Any, train_examples: int | None) -> int:
    """Examples the trials train on: ``train_examples`` (capped at the training split) or the split."""
    size = (workload.split_sizes or {}).get("train")
    if train_examples is None:
        if size is None:
            raise BatchlabError(f"workload {workload.name} declares no training split size")
        return int(size)
    train_examples = checked_int("train examples", train_examples, 1)
    return train_examples if size is None else min(int(size), train_examples)


# ---------------------------------------------------------------------------------------------- limits


def _proc_kib(path: str, key: str) -> int | None:
    """The ``key: N kB`` entry of a ``/proc`` file in bytes (``None`` where unreadable)."""
    try:
        with open(path, encoding="ascii") as handle:
            for line in handle:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _rlimit_module() -> Any:
    """The ``resource`` module where ``RLIMIT_AS`` and ``/proc/self/status`` can be used, else ``None``."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import resource
    except ImportError:
        return None
    if not hasattr(resource, "RLIMIT_AS") or _proc_kib("/proc/self/status", "VmSize") is None:
        return None
    return resource


@dataclass
class _Limit:
    """How every try of one probe is limited: ``kind`` ``"rlimit"`` (CPU), ``"cuda"`` or ``None``."""

    kind: str | None
    bytes: int | None
    source: str
    total: int | None = None  # the CUDA device's memory

    @contextlib.contextmanager
    def applied(self, device: torch.device) -> Iterator[None]:
        """Apply the limit for one try; restore the previous state however the try ends."""
        if self.kind == "rlimit":
            import resource

            before = resource.getrlimit(resource.RLIMIT_AS)
            current = _proc_kib("/proc/self/status", "VmSize") or 0
            soft = current + int(self.bytes)
            hard = before[1]
            if hard != resource.RLIM_INFINITY:
                soft = min(soft, hard)
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
            try:
                yield
            finally:
                resource.setrlimit(resource.RLIMIT_AS, before)
        elif self.kind == "cuda":
            torch.cuda.set_per_process_memory_fraction(min(1.0, self.bytes / self.total), device)
            try:
                yield
            finally:
                torch.cuda.set_per_process_memory_fraction(1.0, device)
        else:
            yield


def _limit(device: torch.device, memory_limit_bytes: int | None) -> _Limit:
    if device.type == "cpu":
        resource = _rlimit_module()
        if resource is None:
            return _Limit(None, memory_limit_bytes, f"none: RLIMIT_AS cannot be used on this platform ({sys.platform}); "
                          "each batch size was tried without a limit")
        if memory_limit_bytes is not None:
            return _Limit("rlimit", memory_limit_bytes, "memory_limit_bytes: RLIMIT_AS set to the process's address space "
                          "(VmSize) before each try plus this allowance")
        available = _proc_kib("/proc/meminfo", "MemAvailable")
        if available is None:
            return _Limit(None, None, "none: /proc/meminfo has no MemAvailable; each batch size was tried without a limit")
        return _Limit("rlimit", available, "MemAvailable (/proc/meminfo) at the probe's start: RLIMIT_AS set to the "
                      "process's address space (VmSize) before each try plus this allowance")
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        total = int(torch.cuda.get_device_properties(index).total_memory)
        if memory_limit_bytes is not None:
            return _Limit("cuda", memory_limit_bytes, "memory_limit_bytes: torch.cuda.set_per_process_memory_fraction"
                          "(limit / device memory) for each try (everything the process holds on the device)", total)
        return _Limit(None, total, "the device's memory (torch.cuda total_memory)", total)
    return _Limit(None, memory_limit_bytes, f"none: no memory limit can be set on {device.type}; each batch size was "
                  "tried against the device's own memory")


def _free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------- timing


def _run_updates(prepared: Any, warmup_steps: int, timed_steps: int, done: list[int]) -> list[float]:
    """Run ``warmup_steps`` untimed and ``timed_steps`` timed updates of ``prepared`` (a
    :class:`batchlab.train.trial.PreparedTrial`), as the trial's hot loop runs them; return the timed
    updates' seconds. ``done[0]`` counts the updates run (kept current if an update fails)."""
    from batchlab.train.core import batch_source
    from batchlab.train.device import fork_rng
    from batchlab.train.sampling import BatchSampler
    from batchlab.train.trial import order_seed

    spec, device = prepared.spec, prepared.device
    sampler = BatchSampler(prepared.num_train, int(spec.batch_size), order_seed(spec))
    batch, indices, update = batch_source(prepared.train, device), sampler.indices, prepared.algorithm.step
    synchronize: Callable[[], None] = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    seconds = []
    with fork_rng(device):
        torch.manual_seed(int(spec.seed))
        for step in range(warmup_steps):
            update(*batch(indices(step)))  # the loss's value is not used: a diverging loss times the same
            done[0] += 1
        for step in range(warmup_steps, warmup_steps + timed_steps):
            synchronize()
            started = time.perf_counter()
            update(*batch(indices(step)))
            synchronize()
            seconds.append(time.perf_counter() - started)
            done[0] += 1
    return seconds


def _one_line_error(error: BaseException) -> str:
    from batchlab.errors import one_line

    return one_line(f"{type(error).__name__}: {error}", limit=200)


def measure_throughput(
    workload: Any,
    optimizer: str,
    batch_sizes: Sequence[int],
    *,
    device: str = "auto",
    hyperparameters: dict | None = None,
    warmup_steps: int = 3,
    timed_steps: int = 10,
    memory_limit_bytes: int | None = None,
    train_examples: int | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> Throughput:
    """Step times and the largest batch size that fits, for ``workload`` trained by ``optimizer``.

    Args:
        workload: a :class:`batchlab.workloads.Workload` or what
            :func:`batchlab.workloads.resolve_workload` accepts.
        optimizer: optimizer name (``batchlab.optim.optimizer_names()``).
        batch_sizes: candidate batch sizes, each in ``1..N`` (``N``: the training set size,
            ``train_examples`` when given); measured in ascending order, repeats dropped.
        device: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps`` (:mod:`batchlab.train.device`).
        hyperparameters: the optimizer's hyperparameters (``None``: its registered defaults,
            :func:`batchlab.optim.optimizer_defaults`). The time of an update does not depend on them
            beyond which computations they switch on; a loss that diverges does not stop the probe.
        warmup_steps: untimed updates per batch size before the timed ones (>= 0).
        timed_steps: timed updates per batch size (>= 1).
        memory_limit_bytes: an artificially low memory limit (see the module docstring: on the CPU an
            allowance above the process's address space before each try, on CUDA a per-process cap);
            ``None``: the machine's available memory (CPU) or the device's memory (CUDA).
        train_examples: train on the first-chosen ``N`` training examples (``None``: all).
        seed: model initialisation and batch order (as a trial's seed).
        progress: ``progress(message)`` called before each batch size is tried.

    Returns:
        :class:`Throughput` (step times of the batch sizes that fit, the memory probe, the examples
        processed).

    Raises:
        BatchlabError: no batch sizes, a batch size that is not an integer in ``1..N``, bad step
            counts or limit, or anything :func:`batchlab.train.trial.prepare_trial` rejects (unknown
            workload, optimizer or device, hyperparameters the optimizer rejects); all before any
            batch size is measured.
    """
    from batchlab.optim import optimizer_defaults
    from batchlab.train.device import describe_device, resolve_device
    from batchlab.train.trial import TrialSpec, prepare_trial
    from batchlab.workloads import resolve_workload

    workload = resolve_workload(workload)
    sizes = _checked_batch_sizes(batch_sizes, _training_set_size(workload, train_examples))
    warmup_steps = checked_int("warmup steps", warmup_steps, 0)
    timed_steps = checked_int("timed steps", timed_steps, 1)
    if memory_limit_bytes is not None:
        memory_limit_bytes = checked_int("memory limit (bytes)", memory_limit_bytes, 1)
    torch_device = resolve_device(device)
    described = describe_device(torch_device)
    parameters = dict(optimizer_defaults(optimizer) if hyperparameters is None else hyperparameters)
    say = progress or (lambda message: None)
    steps = warmup_steps + timed_steps

    def spec(batch_size: int) -> TrialSpec:
        return TrialSpec(workload=workload, optimizer=optimizer, batch_size=batch_size, hyperparameters=parameters,
                         steps=steps, train_examples=train_examples, seed=seed, stop_at_goal=False, device=str(torch_device))

    # Preflight, outside any limit: validates everything, loads the data, starts torch's threads.
    preflight, done = prepare_trial(spec(sizes[0])), [0]
    _run_updates(preflight, 0, 1, done)
    examples = done[0] * sizes[0]
    del preflight
    _free_memory(torch_device)

    limit = _limit(torch_device, memory_limit_bytes)
    step_times: list[StepTime] = []
    tried: list[dict] = []
    not_tried: list[int] = []
    largest: int | None = None
    for position, batch_size in enumerate(sizes):
        say(f"throughput: batch size {batch_size}: {warmup_steps} warm-up + {timed_steps} timed updates on {described}")
        done, error, seconds = [0], None, None
        try:
            with limit.applied(torch_device):
                prepared = prepare_trial(spec(batch_size))
                seconds = _run_updates(prepared, warmup_steps, timed_steps, done)
        except Exception as caught:  # only out-of-memory errors are an answer; anything else is raised
            if not is_out_of_memory(caught):
                raise
            error = _one_line_error(caught)
        finally:
            prepared = None
            _free_memory(torch_device)
        examples += done[0] * batch_size
        if error is not None:
            tried.append({"batch_size": batch_size, "fits": False, "error": error})
            not_tried = sizes[position + 1:]
            say(f"throughput: batch size {batch_size} does not fit ({error})")
            break
        tried.append({"batch_size": batch_size, "fits": True, "error": None})
        largest = batch_size
        step_times.append(StepTime(batch_size=batch_size, seconds_per_step=float(statistics.median(seconds)),
                                   low=float(min(seconds)), high=float(max(seconds)), timed_steps=timed_steps,
                                   warmup_steps=warmup_steps, examples=steps * batch_size))
    memory = MemoryProbe(largest_fitting=largest, tried=tried, not_tried=list(not_tried), limit_bytes=limit.bytes,
                         limit_source=limit.source, device=described)
    return Throughput(device=described, step_times=tuple(step_times), memory=memory, examples=int(examples))
