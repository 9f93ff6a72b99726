"""Which device a trial trains on: names, validation, and the random state that goes with a device.

Device names: ``auto`` (default: ``cuda`` when a CUDA GPU is present, else ``mps`` when Apple's
Metal backend is, else ``cpu``), ``cpu``, ``cuda`` (the current CUDA device), ``cuda:N`` (GPU ``N``)
and ``mps``. A sweep's local pool pins worker ``i`` to ``cuda:i`` when several GPUs are present
(:func:`batchlab.sweep.executors.make_executor`): it sets :data:`DEVICE_ENV` in the worker, and
``auto``/``cuda`` then resolve to that GPU. An explicit ``cuda:N`` is never overridden.

What runs on the device: the model, its optimizer state, the training batches (in-memory tensor data
is moved there once, a ``torch.utils.data.Dataset``'s batches one by one) and evaluation. What stays
on the CPU: the batch sampler (:mod:`batchlab.train.sampling`) and the random stream that orders the
data, so every device trains on the same batches in the same order.

Reproducibility (docs/internals.md, "Devices"; docs/methods.md, "Devices and reproducibility"): with one
torch build, a trial's measurements are bitwise reproducible on one CPU machine with the same CPU
capability and thread count; on CUDA only with deterministic algorithms
(``torch.use_deterministic_algorithms(True)`` and ``CUBLAS_WORKSPACE_CONFIG=:4096:8``), since some
CUDA kernels (atomics in reductions, cuBLAS split-K) add in a varying order. Across device types
(CPU vs GPU) results differ in the last bits and, through chaotic training, more: the batches and
the initial weights are the same, the floating-point arithmetic is not.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator

import torch

from batchlab.errors import BatchlabError

__all__ = [
    "DEVICE_ENV", "DEVICE_NAMES", "check_device", "describe_device", "device_type", "fork_rng", "get_rng_state",
    "resolve_device", "set_rng_state",
]

DEVICE_NAMES = ("auto", "cpu", "cuda", "cuda:N", "mps")
"""The accepted device names (``N`` a GPU index)."""

DEVICE_ENV = "BATCHLAB_CUDA_DEVICE"
"""Environment variable naming the CUDA device (``cuda:N``) that ``auto`` and ``cuda`` mean in this
process; set by the sweep's local pool in each worker when several GPUs are present."""

_CUDA_INDEX = re.compile(r"cuda:(\d+)")


def _allowed() -> str:
    return ", ".join(DEVICE_NAMES)


def _cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def check_device(name: object) -> str:
    """Return ``name`` (stripped, lower case) if it names a device available here, else raise.

    Raises:
        BatchlabError: not one of ``auto|cpu|cuda|cuda:N|mps`` (one line naming the allowed values),
            or a device that this machine or torch build does not have (``cuda`` without a CUDA GPU,
            ``cuda:N`` past the last GPU, ``mps`` off Apple silicon).
    """
    if isinstance(name, torch.device):
        name = str(name)
    if not isinstance(name, str):
        raise BatchlabError(f"device must be a string, got {name!r}; allowed: {_allowed()}")
    text = name.strip().lower()
    if text in ("auto", "cpu"):
        return text
    match = _CUDA_INDEX.fullmatch(text)
    if text == "cuda" or match:
        count = _cuda_count()
        if count == 0:
            raise BatchlabError(f"device {name!r} is not available: torch {torch.__version__} sees no CUDA GPU; "
                                f"allowed here: auto, cpu")
        if match and int(match.group(1)) >= count:
            raise BatchlabError(f"device {name!r} is not available: this machine has {count} CUDA GPU(s), "
                                f"cuda:0 to cuda:{count - 1}")
        return text
    if text == "mps":
        if not _mps_available():
            raise BatchlabError(f"device {name!r} is not available (no Apple Metal backend in this torch build or machine); "
                                f"allowed here: auto, cpu{', cuda' if _cuda_count() else ''}")
        return text
    raise BatchlabError(f"unknown device {name!r}; allowed: {_allowed()}")


def resolve_device(name: object = "auto") -> torch.device:
    """The ``torch.device`` that ``name`` means here (validated with :func:`check_device`).

    ``auto`` is CUDA when a CUDA GPU is present, else ``mps`` when available, else ``cpu``. ``auto``
    and ``cuda`` mean the GPU named by :data:`DEVICE_ENV` when it is set (a pinned pool worker), else
    the current CUDA device; CUDA devices always carry their index (``cuda:0``), so results and store
    entries name the GPU.
    """
    text = check_device(name)
    if text == "auto":
        if _cuda_count():
            text = "cuda"
        elif _mps_available():
            text = "mps"
        else:
            text = "cpu"
    if text == "cuda":
        pinned = os.environ.get(DEVICE_ENV, "").strip()
        text = check_device(pinned) if _CUDA_INDEX.fullmatch(pinned) else f"cuda:{torch.cuda.current_device()}"
    return torch.device(text)


def device_type(name: object = "auto") -> str:
    """The type (``cpu``, ``cuda``, ``mps``) of the device ``name`` resolves to."""
    return resolve_device(name).type


def describe_device(device: object) -> str:
    """A short human description: ``"cpu"``, ``"mps"``, ``"cuda:0 (NVIDIA H200)"``."""
    device = device if isinstance(device, torch.device) else resolve_device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return str(device)


@contextlib.contextmanager
def fork_rng(device: torch.device) -> Iterator[None]:
    """Fork torch's random state for a trial on ``device`` (the CPU generator, plus the device's own
    generator for CUDA and MPS), restoring the caller's state on exit."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        with torch.random.fork_rng(devices=[index], device_type="cuda"):
            yield
    elif device.type == "mps":
        with torch.random.fork_rng(devices=[0], device_type="mps"):
            yield
    else:
        with torch.random.fork_rng(devices=[]):
            yield


def get_rng_state(device: torch.device) -> tuple:
    """The random state that in-loop randomness (dropout, sampled curvature) on ``device`` draws from:
    ``(cpu_state,)`` on the CPU, ``(cpu_state, device_state)`` on a GPU."""
    if device.type == "cuda":
        return torch.get_rng_state(), torch.cuda.get_rng_state(device)
    if device.type == "mps":
        return torch.get_rng_state(), torch.mps.get_rng_state()
    return (torch.get_rng_state(),)


def set_rng_state(state: tuple, device: torch.device) -> None:
    """Restore a state from :func:`get_rng_state` for ``device``."""
    torch.set_rng_state(state[0])
    if device.type == "cuda":
        torch.cuda.set_rng_state(state[1], device)
    elif device.type == "mps":
        torch.mps.set_rng_state(state[1])
