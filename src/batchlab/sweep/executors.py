"""Where tasks run: a local process pool (default) or Dask distributed.

Both executors share one small interface (:class:`Executor`): ``submit(task)`` and ``outcomes()``,
which yields an :class:`Outcome` per task as it finishes (tasks submitted while iterating included).
Workers only compute; the driver alone writes to the store, so a trial is published once, by one
process, and a task whose worker died (``Outcome.lost``) simply runs again.

Worker processes run one torch thread each with passive OpenMP waits (set before torch is imported):
spinning OpenMP threads make torch 10-60x slower on a loaded machine. Local workers are started with
the ``spawn`` method and die with the driver (Linux ``PR_SET_PDEATHSIG`` plus a parent watchdog), so
a killed driver leaves no orphan that could finish a trial behind a resumed sweep's back.

GPUs: when the sweep's device resolves to CUDA without an index (``auto`` or ``cuda``) and several
CUDA GPUs are present, the local pool runs one worker per GPU (``min(workers, GPUs)`` workers) and
pins worker ``i`` (in start order) to ``cuda:i`` (:func:`pinned_device`), through the environment
variable :data:`batchlab.train.device.DEVICE_ENV` that :func:`batchlab.train.device.resolve_device`
reads. Dask workers are not pinned (each uses its current CUDA device; a cluster that gives each
worker its own GPU, such as dask-cuda's ``LocalCUDACluster``, pins them through
``CUDA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

import abc
import contextlib
import concurrent.futures as cf
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

WORKER_ENV = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "MKL_NUM_THREADS": "1",
              "OPENBLAS_NUM_THREADS": "1"}


@dataclass
class Outcome:
    """What became of one submitted task: its ``result``, or ``lost`` (worker died), or ``error``; or
    ``elsewhere``: another sweep driver published the task's trials (:mod:`batchlab.sweep.claims`)."""

    task: Any
    result: Any = None
    lost: bool = False
    error: BaseException | None = None
    elsewhere: bool = False


class Executor(abc.ABC):
    """Runs ``fn(task)`` for submitted tasks on workers and yields outcomes as they complete."""

    workers: int = 1
    kind: str = "executor"

    @abc.abstractmethod
    def submit(self, task: Any) -> None:
        """Queue ``task``; its outcome appears in :meth:`outcomes`."""

    @abc.abstractmethod
    def outcomes(self) -> Iterator[Outcome]:
        """Yield one outcome per submitted task as tasks finish, until none is pending."""

    def close(self) -> None:
        """Release workers (idempotent)."""

    def abort(self) -> None:
        """Stop at once, abandoning running tasks (Ctrl-C, an error in the driver)."""
        self.close()

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def set_worker_threads() -> None:
    """Pin this process to one torch/OpenMP thread with passive waits (call before importing torch)."""
    for name, value in WORKER_ENV.items():
        os.environ[name] = value
    if "torch" in sys.modules:  # already imported (Dask worker reuse, in-process runs)
        import torch

        if torch.get_num_threads() != 1:
            torch.set_num_threads(1)


def _die_with_parent(parent_pid: int) -> None:
    """Make this worker exit when the driver dies (PDEATHSIG on Linux, plus a polling watchdog)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
        except OSError:  # pragma: no cover - unusual libc
            pass

    def watchdog() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(1)
            time.sleep(0.5)

    threading.Thread(target=watchdog, name="batchlab-parent-watchdog", daemon=True).start()
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def pinned_device(index: int, gpus: int) -> str:
    """The device of the ``index``-th started pool worker (0-based) on a machine with ``gpus`` GPUs:
    ``cuda:{index % gpus}``. A pool has at most ``gpus`` workers, so each gets its own GPU; a pool
    broken by a dead worker is replaced by a fresh one that counts from 0 again."""
    if gpus < 1:
        raise ValueError(f"pinning needs at least one GPU, got {gpus}")
    return f"cuda:{int(index) % int(gpus)}"


def gpus_to_pin(device: str = "auto") -> int:
    """How many CUDA GPUs a local pool pins its workers to for ``device``: the number of GPUs when
    ``device`` is ``auto`` or ``cuda`` and CUDA sees two or more, else 0 (no pinning: one device, the
    CPU, MPS, or an explicit ``cuda:N`` that every worker shares)."""
    from batchlab.train.device import check_device

    name = check_device(device)
    if name not in ("auto", "cuda"):
        return 0
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return count if count >= 2 else 0


def _pin_worker(counter: Any, gpus: int) -> str:
    """Take the next worker index from the shared ``counter`` and pin this process to its GPU."""
    from batchlab.train.device import DEVICE_ENV

    with counter.get_lock():
        index = counter.value
        counter.value += 1
    device = pinned_device(index, gpus)
    os.environ[DEVICE_ENV] = device
    return device


@contextlib.contextmanager
def _workers_ignore_sigint() -> Iterator[None]:
    """Within the block, processes started from this thread ignore SIGINT (the disposition survives
    ``exec``, and Python keeps an ignored SIGINT ignored), so Ctrl-C reaches only the driver, which
    then stops its workers, instead of printing a KeyboardInterrupt traceback from every worker that
    is still importing. The driver's own handler is restored on exit. Does nothing off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _local_worker_init(parent_pid: int, counter: Any = None, gpus: int = 0) -> None:
    set_worker_threads()
    if gpus:
        _pin_worker(counter, gpus)
    _die_with_parent(parent_pid)


class LocalPoolExecutor(Executor):
    """A ``spawn`` process pool of ``workers`` processes that survives the death of a worker.

    When a worker dies (SIGKILL, out of memory), Python breaks the whole pool; this executor reports
    every task that was in the pool as ``lost``, starts a fresh pool, and carries on with the tasks
    submitted afterwards.
    """

    kind = "local"

    def __init__(self, fn: Callable[[Any], Any], workers: int, gpus: int = 0) -> None:
        self.fn = fn
        self.gpus = int(gpus)
        self.workers = min(int(workers), self.gpus) if self.gpus else int(workers)
        self._pool: cf.ProcessPoolExecutor | None = None
        self._futures: dict[cf.Future, tuple[Any, cf.ProcessPoolExecutor]] = {}
        for name, value in WORKER_ENV.items():  # inherited by spawned workers before any import
            os.environ.setdefault(name, value)

    def _ensure_pool(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            context = multiprocessing.get_context("spawn")
            counter = context.Value("i", 0) if self.gpus else None  # a fresh pool pins from cuda:0 again
            self._pool = cf.ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=context,
                initializer=_local_worker_init,
                initargs=(os.getpid(), counter, self.gpus),
            )
        return self._pool

    def submit(self, task: Any) -> None:
        try:
            with _workers_ignore_sigint():  # the pool starts its worker processes on submit
                future = self._ensure_pool().submit(self.fn, task)
        except cf.process.BrokenProcessPool:
            self._restart()
            with _workers_ignore_sigint():
                future = self._ensure_pool().submit(self.fn, task)
        self._futures[future] = (task, self._pool)

    def _restart(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None

    def outcomes(self) -> Iterator[Outcome]:
        while self._futures:
            done, _ = cf.wait(list(self._futures), return_when=cf.FIRST_COMPLETED)
            ready: list[Outcome] = []
            broken_pool = None
            for future in done:
                task, pool = self._futures.pop(future)
                exc = future.exception()
                if isinstance(exc, cf.process.BrokenProcessPool):
                    broken_pool = pool
                    ready.append(Outcome(task, lost=True))
                elif exc is not None:
                    ready.append(Outcome(task, error=exc))
                else:
                    ready.append(Outcome(task, result=future.result()))
            if broken_pool is not None:
                # Every other task of the broken pool is lost too; collect them, then start afresh
                # before the driver resubmits anything.
                for future, (task, pool) in list(self._futures.items()):
                    if pool is broken_pool:
                        del self._futures[future]
                        if future.done() and future.exception() is None:
                            ready.append(Outcome(task, result=future.result()))
                        else:
                            ready.append(Outcome(task, lost=True))
                if self._pool is broken_pool:
                    self._restart()
            yield from ready

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers (for tests and diagnostics)."""
        if self._pool is None:
            return []
        return [p.pid for p in (self._pool._processes or {}).values()]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def abort(self) -> None:
        if self._pool is not None:
            for pid in self.worker_pids():  # our own workers only: their trials are simply lost
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


class InlineExecutor(Executor):
    """Runs tasks one by one in the driver's own process (no parallelism; for debugging and tests)."""

    kind = "inline"

    def __init__(self, fn: Callable[[Any], Any], workers: int = 1, **ignored: Any) -> None:
        """``ignored``: the other keywords of :func:`make_executor` (``dask``, ``scheduler``, ``device``),
        so ``run_sweep(..., executor_factory=InlineExecutor)`` works; the trials run in this process
        on the device their specs name."""
        self.fn = fn
        self.workers = 1
        self._queue: list[Any] = []

    def submit(self, task: Any) -> None:
        self._queue.append(task)

    def outcomes(self) -> Iterator[Outcome]:
        while self._queue:
            task = self._queue.pop(0)
            try:
                result = self.fn(task)
            except Exception as exc:  # reported to the driver like a worker's failure
                yield Outcome(task, error=exc)
            else:
                yield Outcome(task, result=result)


class DaskExecutor(Executor):
    """Tasks on Dask distributed: an existing scheduler, or a loopback ``LocalCluster``.

    ``scheduler=None`` starts ``LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
    host="127.0.0.1")``: nothing listens beyond loopback. Dask re-runs the tasks of a worker that dies;
    the driver still writes each trial once. :attr:`workers` is the cluster's thread count *now* (an
    adaptive cluster may start with none and grow), so a driver asks it each time it fills workers.
    """

    kind = "dask"

    def __init__(self, fn: Callable[[Any], Any], workers: int | None = None, scheduler: str | None = None,
                 connect_timeout: str = "20s") -> None:
        from dask.distributed import Client, LocalCluster

        self.fn = fn
        self._cluster = None
        for name, value in WORKER_ENV.items():  # inherited by LocalCluster worker processes
            os.environ.setdefault(name, value)
        if scheduler is None:
            with _workers_ignore_sigint():
                self._cluster = LocalCluster(
                    n_workers=int(workers or 1), threads_per_worker=1, processes=True, host="127.0.0.1",
                    dashboard_address=None, silence_logs=40,
                )
            self._client = Client(self._cluster)
        else:
            try:
                self._client = Client(scheduler, timeout=connect_timeout)
            except (OSError, TimeoutError) as exc:  # refused, unreachable, timed out
                from batchlab.errors import BatchlabError

                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise BatchlabError(f"cannot reach the Dask scheduler {scheduler} ({reason}); "
                                    "allowed: the address of a running scheduler, or --dask for a local cluster") from None
        self._workers_cache: tuple[float, int] | None = None  # (monotonic time, threads) of the last look
        self._futures: dict[Any, Any] = {}
        self._as_completed = None

    #: Seconds a look at the scheduler's thread count stays current.
    WORKERS_CACHE_S = 1.0

    @property
    def workers(self) -> int:
        """The cluster's worker threads now (at least 1): an adaptive cluster grows and shrinks, so
        this is asked of the scheduler (at most once per :attr:`WORKERS_CACHE_S` seconds) each time."""
        now = time.monotonic()
        cached = self._workers_cache
        if cached is not None and now - cached[0] < self.WORKERS_CACHE_S:
            return cached[1]
        try:
            threads = max(1, sum(int(n) for n in self._client.nthreads().values()))
        except Exception:  # the scheduler is briefly unreachable: keep the last count
            threads = cached[1] if cached is not None else 1
        self._workers_cache = (now, threads)
        return threads

    def submit(self, task: Any) -> None:
        future = self._client.submit(_dask_call, self.fn, task, key=f"batchlab-{getattr(task, 'key', type(task).__name__)}-{time.monotonic_ns()}",
                                     pure=False)
        self._futures[future] = task
        if self._as_completed is not None:
            self._as_completed.add(future)

    def outcomes(self) -> Iterator[Outcome]:
        from dask.distributed import as_completed

        self._as_completed = as_completed(list(self._futures))
        try:
            for future in self._as_completed:
                task = self._futures.pop(future)
                if future.status == "error":
                    exc = future.exception()
                    if type(exc).__name__ == "KilledWorker":
                        yield Outcome(task, lost=True)
                    else:
                        yield Outcome(task, error=exc)
                else:
                    yield Outcome(task, result=future.result())
                future.release()
        finally:
            self._as_completed = None

    def close(self) -> None:
        try:
            self._client.close()
        finally:
            if self._cluster is not None:
                self._cluster.close()
                self._cluster = None


def _dask_call(fn: Callable[[Any], Any], task: Any) -> Any:
    set_worker_threads()
    return fn(task)


def make_executor(fn: Callable[[Any], Any], *, workers: int, dask: bool = False,
                  scheduler: str | None = None, device: str = "auto") -> Executor:
    """The executor for a sweep: Dask when ``dask`` or ``scheduler`` is given, else a local pool.

    ``device`` is the sweep's device (:mod:`batchlab.train.device`; checked here, a bad or unavailable
    one is a one-line BatchlabError). With several CUDA GPUs and ``device`` ``auto`` or ``cuda``, the
    local pool runs ``min(workers, GPUs)`` workers, worker ``i`` pinned to ``cuda:i`` (module
    docstring).

    Reproducibility: a trial's measurements do not depend on the executor, the worker or the number
    of workers (each trial is a pure function of its spec and of its computation path). They are bitwise
    reproducible on the same machine with the same torch build: on CPU with the same CPU capability and
    thread count (docs/methods.md, "Devices and reproducibility"); on CUDA only with deterministic algorithms
    (``torch.use_deterministic_algorithms(True)``, ``CUBLAS_WORKSPACE_CONFIG=:4096:8``), and then also
    across GPUs of one model. Across device types (CPU, CUDA, MPS) they differ: the batches and initial
    weights are the same, the floating-point arithmetic is not (docs/internals.md, "Devices").
    """
    gpus = gpus_to_pin(device)
    if dask or scheduler is not None:
        return DaskExecutor(fn, workers=workers, scheduler=scheduler)
    return LocalPoolExecutor(fn, workers=workers, gpus=gpus)
