"""Trial claims: several sweep drivers on one store share the work, and no trial runs twice.

A driver *claims* a trial (by its trial key) just before it hands the trial to a worker, and
releases the claim once the trial is published (or when it stops: Ctrl-C, an error, the end of the
sweep). A trial another live driver has claimed is not run; the driver waits until it is published
(polling the store) or until its claim is dead, and then takes it over. So two ``batchlab sweep``
commands started at once into one store (on one machine, or on several machines sharing the store
on a network file system) split the trials between them, each reports only the trials it ran, and
both end with the whole sweep in the store.

Layout, under the store's ``pending/`` directory::

    pending/trials/<owner>.lock           the owner's lock: flock-ed (exclusively) while the driver runs
    pending/trials/<owner>.owner          the owner: host, boot id, pid, start time; its mtime is a heartbeat
    pending/trials/<sha256(key)>.claim    one claimed trial: {"key", "owner", "host", "boot", "pid", "time"}
    pending/trials/_takeover.lock         serialises take-overs and the removal of dead claims (flock)

A claim's *owner* is one driver (one :class:`TrialClaims`, a fresh id each), whose ``<owner>.lock``
stays ``flock``-ed from its first claim until it closes, and is released by the kernel when the process
dies, even by SIGKILL. The lock belongs to the driver, not to the process: a sweep that ended in a
long-lived process (a notebook) leaves no live claim behind, whatever became of its claim files. A
lock is tested read-only with a shared lock (``LOCK_SH|LOCK_NB``), so the files of another user of a
shared store can be tested; one that cannot be opened counts as alive. A claim
is **live** when its owner is this driver, or the owner's lock is held, or (only for an owner
on another machine: another kernel boot id) the owner's heartbeat was refreshed within
``stale_after_s`` (:data:`STALE_AFTER_S`, 300 s) before this driver's own. Each driver refreshes its
heartbeat (the mtime of its ``.owner`` file) every ``heartbeat_s`` (:data:`HEARTBEAT_S`, 30 s) from a
background thread; ages are differences of two mtimes the file system set, so clocks of different
machines need not agree. On one machine a dead driver's claims are taken over at once; a driver on
another machine that died is taken over once its lock is gone and its heartbeat is older than
``stale_after_s`` (the heartbeat covers file systems whose locks are local to a node).

Nothing is written until the driver claims its first trial (a sweep that is already finished writes
nothing, so it can print its summary from a read-only store); a file system error while claiming is
a one-line :class:`batchlab.errors.BatchlabError` ("cannot write trial claims in STORE: ...").

Claiming is atomic: the record is written to a temporary file and hard-linked to its final name
(``link`` fails if the name exists, so exactly one driver wins a free trial). A dead claim is taken
over under an exclusive ``flock`` on ``_takeover.lock``, re-reading the record first and replacing it
(``os.replace``) only if it is unchanged; dead claims are removed under the same lock
(:func:`collect_dead_claims`, which every driver runs when it starts and ends, and which needs no claim
of its own, so store maintenance can run it too), so a claim is never leaked. A driver that claims a trial then re-reads the store: a trial published meanwhile (by the
driver that held it before) is not run again.

:class:`ClaimingExecutor` wraps a sweep executor: tasks submitted to it wait in the driver and are
claimed only when a worker is free (at most ``workers`` tasks in flight), so concurrent drivers take
tasks in turn instead of one claiming everything at the start. A task whose trials are partly held by
another driver runs the rest (``dataclasses.replace(task, trials=...)``, so a task keeps every other
field). Trials another driver published come back as outcomes with ``elsewhere=True``. While it has
nothing to do but wait for trials other drivers hold, it says so (``note``, default a log warning of
``batchlab.sweep.claims``, naming the holders' host and pid) once, then every :data:`NOTE_S` seconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import platform
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from batchlab.errors import BatchlabError
from batchlab.store.files import lock_held
from batchlab.store.schema import PENDING_DIR
from batchlab.sweep.executors import Executor, Outcome

#: The directory of trial claims under a store.
CLAIMS_DIR = f"{PENDING_DIR}/trials"
#: Seconds between two refreshes of a driver's heartbeat.
HEARTBEAT_S = 30.0
#: A claim of a driver on another machine whose lock is gone is dead once its heartbeat is this much
#: older than the checking driver's (covers attribute caching of network file systems, ~60 s).
STALE_AFTER_S = 300.0
#: Seconds between two looks at the store while trials held by other drivers are awaited.
POLL_S = 2.0
#: Seconds between two notes that this driver waits for trials other drivers hold.
NOTE_S = 30.0

_TAKEOVER_LOCK = "_takeover.lock"
_log = logging.getLogger(__name__)


def claim_name(key: str) -> str:
    """The file name of the claim of trial ``key``: ``<sha256 of the key, 32 hex>.claim``."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32] + ".claim"


def boot_id() -> str:
    """This kernel's boot id (``/proc/sys/kernel/random/boot_id``), else the host name: drivers with
    the same boot id share one kernel, whose ``flock`` says for sure whether a process lives."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or platform.node()
    except OSError:
        return platform.node()


def _lock_path(directory: Path, owner: str) -> Path | None:
    if not owner or "/" in owner or owner.startswith((".", "_")):
        return None
    return directory / f"{owner}.lock"


def driver_lock_alive(directory: Path, owner: str) -> bool:
    """Whether the driver ``owner`` runs: its ``<owner>.lock`` in the claims ``directory`` is locked.

    Tested on a read-only descriptor with ``LOCK_SH|LOCK_NB`` (which conflicts only with the owner's
    exclusive lock, and works where ``flock`` is emulated with POSIX locks); a file that cannot be
    opened (another user's, unreadable) or tested counts as alive, a missing one as dead."""
    path = _lock_path(directory, owner)
    return path is not None and lock_held(path, exclusive=False)


def _remove_dead_lock(directory: Path, owner: str) -> None:
    """Remove the lock file of the dead driver ``owner`` if it is (still) not locked: removed while
    holding a shared lock on it, so an owner that just created it notices (:meth:`TrialClaims._lock`)."""
    path = _lock_path(directory, owner)
    if path is None:
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        if os.fstat(fd).st_ino == os.stat(path).st_ino:
            path.unlink()
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def _takeover_lock(directory: Path) -> Iterator[None]:
    """Hold the exclusive take-over lock of the claims ``directory`` for the block (created if
    missing; opened read-only when another user's file cannot be opened for writing)."""
    path = directory / _TAKEOVER_LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except PermissionError:
        fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read(path: Path) -> tuple[bytes, dict] | None:
    """(raw bytes, record) of a claim or owner file; None when it does not exist; record ``{}`` if unreadable."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        record = {}
    return raw, record if isinstance(record, dict) else {}


def _file_system_now(directory: Path) -> float:
    """The file system's clock: the mtime of a probe file written into ``directory`` now."""
    probe = directory / f".probe-{uuid.uuid4().hex}"
    probe.write_bytes(b"")
    try:
        return probe.stat().st_mtime
    finally:
        probe.unlink(missing_ok=True)


def driver_alive(root: str | os.PathLike, record: dict, *, own: str = "", boot: str | None = None,
                 now: Callable[[], float] | None = None, stale_after_s: float = STALE_AFTER_S) -> bool:
    """Whether the driver named by ``record["owner"]`` (a claim or owner record) lives (module docstring):
    it is ``own`` (the asking driver), or its lock ``pending/trials/<owner>.lock`` is held, or it runs
    on another kernel than ``boot`` (default: this one's) and its heartbeat is at most ``stale_after_s``
    older than ``now()`` (default: the file system's clock, :func:`_file_system_now`)."""
    root = Path(root)
    directory = root / CLAIMS_DIR
    owner = str(record.get("owner") or "")
    if owner and owner == own:
        return True
    if driver_lock_alive(directory, owner):
        return True
    if record.get("boot") == (boot or boot_id()):
        return False  # same kernel: the lock is the truth
    try:
        beat = (directory / f"{owner}.owner").stat().st_mtime
    except (FileNotFoundError, ValueError):
        return False
    return (now() if now is not None else _file_system_now(directory)) - beat <= stale_after_s


def collect_dead_claims(root: str | os.PathLike, *, own: str = "", now: Callable[[], float] | None = None,
                        stale_after_s: float = STALE_AFTER_S) -> int:
    """Remove the trial claims, owner files, lock files and temporary files of dead drivers from the store at
    ``root`` (:func:`driver_alive`; ``own``: the calling driver, never removed); returns how many claims
    were removed. Runs under the take-over lock, so a claim being taken over is never removed. Store
    maintenance may call it too: it needs no claim of its own."""
    directory = Path(root) / CLAIMS_DIR
    if not directory.is_dir():
        return 0
    boot = boot_id()
    clock: list[float] = []

    def fs_now() -> float:  # one look at the clock per collection
        if not clock:
            clock.append(now() if now is not None else _file_system_now(directory))
        return clock[0]

    alive: dict[str, bool] = {}

    def owner_alive(owner: str, record: dict) -> bool:
        if owner not in alive:
            alive[owner] = driver_alive(root, {**record, "owner": owner}, own=own, boot=boot, now=fs_now,
                                        stale_after_s=stale_after_s)
        return alive[owner]

    removed = 0
    with _takeover_lock(directory):
        owners: dict[str, dict] = {}
        for path in directory.glob("*.owner"):
            found = _read(path)
            owners[path.stem] = found[1] if found else {}
        locks = [p.stem for p in directory.glob("*.lock") if _lock_path(directory, p.stem) is not None]
        for path in directory.glob("*.claim"):
            found = _read(path)
            if found is None:
                continue
            owner = str(found[1].get("owner") or "")
            if not owner_alive(owner, {**owners.get(owner, {}), **found[1]}):
                path.unlink(missing_ok=True)
                removed += 1
        for path in directory.glob("*.tmp"):  # <owner>.<uuid>.tmp of a write cut short
            owner = path.name.split(".", 1)[0]
            if not owner_alive(owner, owners.get(owner, {})):
                path.unlink(missing_ok=True)
        for owner, record in owners.items():
            if not owner_alive(owner, record):
                (directory / f"{owner}.owner").unlink(missing_ok=True)
        for owner in locks:  # the lock of a driver killed before it closed
            if owner != own and not owner_alive(owner, owners.get(owner, {})):
                _remove_dead_lock(directory, owner)
    return removed


class TrialClaims:
    """The trial claims of one driver on one store (see the module docstring).

    ``store``: an open :class:`batchlab.store.Store` (only its ``root`` is used). The driver's owner
    id is fresh for each object. Nothing is written until the first :meth:`claim`: it creates the
    claims directory, takes the driver's lock, writes the owner file and starts the heartbeat thread.
    :meth:`close` releases every claim still held, stops the heartbeat, removes the owner file and
    the lock file and releases the lock. File system errors are one-line BatchlabErrors.
    """

    def __init__(self, store: Any, *, stale_after_s: float = STALE_AFTER_S, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.root = Path(store.root)
        self.dir = self.root / CLAIMS_DIR
        self.owner = uuid.uuid4().hex  # this driver (not this process: a notebook runs many sweeps)
        self.stale_after_s = float(stale_after_s)
        self.heartbeat_s = float(heartbeat_s)
        self.host, self.boot = platform.node(), boot_id()
        self.held: set[str] = set()
        self._owner_file = self.dir / f"{self.owner}.owner"
        self._lock_file = self.dir / f"{self.owner}.lock"
        self._lock_fd: int | None = None
        self._started = False
        self._closed = False
        self._collect_on_start = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _error(self, exc: OSError) -> BatchlabError:
        return BatchlabError(f"cannot write trial claims in {self.root}: {exc.strerror or exc}")

    # ------------------------------------------------------------------ the owner
    def _start(self) -> None:
        """Create the claims directory, take this driver's lock, write its owner file, start the
        heartbeat (once, at the first claim)."""
        if self._started:
            return
        if self._closed:
            raise BatchlabError("these trial claims are closed")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._write_owner_file()  # first: a driver on another machine sees a fresh heartbeat
            self._lock()
            self._write_owner_file()  # again, in case a collector removed it meanwhile
        except OSError as exc:
            self._unlock()
            with contextlib.suppress(OSError):
                self._owner_file.unlink(missing_ok=True)
            raise self._error(exc) from None
        self._started = True
        self._thread = threading.Thread(target=self._heartbeat, name="batchlab-claims-heartbeat", daemon=True)
        self._thread.start()
        if self._collect_on_start:
            self.collect_dead()

    def _lock(self) -> None:
        """Create ``<owner>.lock`` and hold an exclusive ``flock`` on it; a collector that removed the
        file before it was locked (it looked unlocked) makes this start over with a new file."""
        while True:
            fd = os.open(self._lock_file, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if os.fstat(fd).st_ino == os.stat(self._lock_file).st_ino:
                    self._lock_fd = fd
                    return
            except FileNotFoundError:
                pass
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)

    def _unlock(self) -> None:
        """Remove the lock file (while still holding the lock), then release the lock."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is None:
            return
        try:
            self._lock_file.unlink(missing_ok=True)
        except OSError:
            pass
        finally:
            os.close(fd)

    def _write_owner_file(self) -> None:
        record = {"owner": self.owner, "host": self.host, "boot": self.boot, "pid": os.getpid(),
                  "started": time.time()}
        tmp = self.dir / f"{self.owner}.{uuid.uuid4().hex}.tmp"
        try:
            tmp.write_text(json.dumps(record))
            os.replace(tmp, self._owner_file)
        finally:
            tmp.unlink(missing_ok=True)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.beat()
            except OSError:  # a passing file system error: beat again next time
                pass

    def beat(self) -> float:
        """Refresh this driver's heartbeat; returns its new mtime (the file system's clock)."""
        try:
            os.utime(self._owner_file)
        except FileNotFoundError:  # removed by someone who took this driver for dead: say it lives
            self._write_owner_file()
        return self._owner_file.stat().st_mtime

    def alive(self, record: dict) -> bool:
        """Whether the claim ``record`` (or owner record) belongs to a live driver (module docstring)."""
        return driver_alive(self.root, record, own=self.owner, boot=self.boot,
                            now=self.beat if self._started else None, stale_after_s=self.stale_after_s)

    # ------------------------------------------------------------------ claims
    def _record(self, key: str) -> bytes:
        return json.dumps({"key": key, "owner": self.owner, "host": self.host, "boot": self.boot,
                           "pid": os.getpid(), "time": time.time()}).encode()

    def _temporary(self, key: str) -> Path:
        tmp = self.dir / f"{self.owner}.{uuid.uuid4().hex}.tmp"
        tmp.write_bytes(self._record(key))
        return tmp

    def holder(self, key: str) -> dict | None:
        """The record of the live claim on ``key`` (this driver's included), or None if it is free."""
        found = _read(self.dir / claim_name(key))
        if found is None or not self.alive(found[1]):
            return None
        return found[1]

    def claim(self, key: str) -> bool:
        """Claim trial ``key`` for this driver: True if it is now this driver's (free, dead or already
        held), False if another live driver holds it."""
        if key in self.held:
            return True
        self._start()
        try:
            return self._claim(key)
        except OSError as exc:
            raise self._error(exc) from None

    def _claim(self, key: str) -> bool:
        path = self.dir / claim_name(key)
        tmp = self._temporary(key)
        try:
            while True:
                # In ``held`` before the claim file exists, so an interruption (Ctrl-C) at any point
                # leaves no claim file this driver has forgotten: release() removes only its own files.
                self.held.add(key)
                try:
                    os.link(tmp, path)  # atomic: fails if the name exists
                    return True
                except FileExistsError:
                    self.held.discard(key)
                except OSError:
                    self.held.discard(key)
                    raise
                found = _read(path)
                if found is None:
                    continue  # released meanwhile: try again
                if found[1].get("owner") == self.owner:
                    self.held.add(key)
                    return True
                if self.alive(found[1]):
                    return False
                with _takeover_lock(self.dir):  # take the dead claim over
                    again = _read(path)
                    if again is not None and again[0] == found[0]:
                        self.held.add(key)
                        os.replace(tmp, path)
                        return True
                # changed meanwhile (released, or taken over by another driver): look again
        finally:
            tmp.unlink(missing_ok=True)

    def claim_many(self, keys: Iterable[str]) -> tuple[list[str], list[str]]:
        """Claim each of ``keys``: ``(claimed by this driver, held by other live drivers)``, in order."""
        mine, others = [], []
        for key in keys:
            (mine if self.claim(key) else others).append(key)
        return mine, others

    def release(self, keys: Iterable[str]) -> None:
        """Give up this driver's claims on ``keys`` (its other keys are ignored)."""
        for key in keys:
            if key not in self.held:
                continue
            path = self.dir / claim_name(key)
            found = _read(path)
            if found is not None and found[1].get("owner") == self.owner:
                path.unlink(missing_ok=True)
            self.held.discard(key)  # only once the file is gone: an interruption leaves it to release again

    def release_all(self) -> None:
        """Give up every claim this driver holds."""
        self.release(list(self.held))

    def collect_dead(self) -> int:
        """Remove the claims, owner files, lock files and temporary files of dead drivers
        (:func:`collect_dead_claims`); returns how many claims were removed. Before this driver's first
        claim it writes nothing: the collection happens at the first claim instead."""
        if not self._started:
            self._collect_on_start = True
            return 0
        try:
            return collect_dead_claims(self.root, own=self.owner, now=self.beat, stale_after_s=self.stale_after_s)
        except OSError as exc:
            raise self._error(exc) from None

    def close(self) -> None:
        """Release every claim, stop the heartbeat, remove dead claims, this driver's owner file and
        lock file, and release its lock (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if not self._started:
            return
        try:
            self.release_all()
        finally:
            self._stop.set()
            if self._thread is not None and self._thread is not threading.current_thread():
                self._thread.join()
            try:
                self.collect_dead()
            except (OSError, BatchlabError):
                pass
            finally:
                try:
                    self._owner_file.unlink(missing_ok=True)
                except OSError:
                    pass
                self._unlock()


class ClaimingExecutor(Executor):
    """An executor that runs only trials this driver claimed (see the module docstring).

    ``inner``: the executor that runs tasks; ``claims``: this driver's :class:`TrialClaims`;
    ``published``: returns the keys of every published trial (``store.finished_trial_keys``).
    :meth:`outcomes` yields the inner executor's outcomes, plus ``Outcome(task, elsewhere=True)`` for
    trials of submitted tasks that another driver published (``task.trials`` are those trials); it
    waits (polling every ``poll_s`` seconds) while trials held by other live drivers are unpublished,
    and runs those whose claim died. A task's claims are released when the driver asks for the next
    outcome after it (it has published the task by then), at once when its worker was lost, and all
    of them on :meth:`close` and :meth:`abort`. ``workers`` is the inner executor's, read each time
    (a Dask cluster's grows and shrinks). While it only waits for other drivers, it calls ``note``
    (default: a log warning) with a line naming them, at most every ``note_s`` seconds.
    """

    def __init__(self, inner: Executor, claims: TrialClaims, published: Callable[[], set[str]], *,
                 poll_s: float = POLL_S, note: Callable[[str], None] | None = None,
                 note_s: float = NOTE_S) -> None:
        self.inner, self.claims, self.published, self.poll_s = inner, claims, published, float(poll_s)
        self.kind = inner.kind
        self.note = note if note is not None else _log.warning
        self.note_s = float(note_s)
        self._queue: deque = deque()  # submitted, not yet claimed
        self._running = 0  # tasks in the inner executor
        self._waiting: dict[str, tuple[Any, Any]] = {}  # key -> (task, trial) held by another live driver
        self._holders: dict[str, dict] = {}  # key -> claim record of its holder, for the note
        self._last_poll = time.monotonic()
        self._last_note: float | None = None

    @property
    def workers(self) -> int:  # type: ignore[override]
        """The inner executor's workers now."""
        return self.inner.workers

    def _note_waiting(self) -> None:
        """Say that this driver waits for trials other drivers hold (at most every ``note_s`` s)."""
        now = time.monotonic()
        if self._last_note is not None and now - self._last_note < self.note_s:
            return
        self._last_note = now
        by: dict[tuple, int] = {}
        for key in self._waiting:
            record = self._holders.get(key)
            if record is None:
                record = self.claims.holder(key) or {}
                self._holders[key] = record
            who = (str(record.get("host") or "?"), record.get("pid", "?"))
            by[who] = by.get(who, 0) + 1
        n = len(self._waiting)
        holders = ", ".join(f"host {host} pid {pid} ({count})" for (host, pid), count in sorted(by.items(), key=str))
        self.note(f"waiting for {n} trial{'s' if n != 1 else ''} held by other sweep drivers on this store: "
                  f"{holders}; they are counted here once published")

    def submit(self, task: Any) -> None:
        self._queue.append(task)

    @staticmethod
    def _subset(task: Any, trials: list) -> Any:
        return dataclasses.replace(task, trials=tuple(trials))

    def _fill(self) -> Iterator[Outcome]:
        """Claim queued tasks and start them while fewer than ``workers`` run."""
        while self._queue and self._running < self.workers:
            task = self._queue.popleft()
            mine, held = self.claims.claim_many([t.key for t in task.trials])
            for trial in task.trials:
                if trial.key in held:
                    self._waiting[trial.key] = (task, trial)
            if not mine:
                continue
            published = self.published()  # after claiming: a trial published by its last holder is not re-run
            done = [t for t in task.trials if t.key in mine and t.key in published]
            run = [t for t in task.trials if t.key in mine and t.key not in published]
            if done:
                self.claims.release(t.key for t in done)
                yield Outcome(self._subset(task, done), elsewhere=True)
            if run:
                self.inner.submit(task if len(run) == len(task.trials) else self._subset(task, run))
                self._running += 1

    def _poll(self, force: bool = False) -> Iterator[Outcome]:
        """Trials awaited from other drivers: yield those now published; queue those whose claim died."""
        if not self._waiting or (not force and time.monotonic() - self._last_poll < self.poll_s):
            return
        self._last_poll = time.monotonic()
        published = self.published()
        done: dict[int, tuple[Any, list]] = {}
        free: dict[int, tuple[Any, list]] = {}
        for key, (task, trial) in list(self._waiting.items()):
            if key in published:
                target = done
            else:
                holder = self.claims.holder(key)
                if holder is not None:
                    self._holders[key] = holder
                    continue
                target = free
            del self._waiting[key]
            self._holders.pop(key, None)
            target.setdefault(id(task), (task, []))[1].append(trial)
        for task, trials in free.values():
            self._queue.append(self._subset(task, trials))
        for task, trials in done.values():
            yield Outcome(self._subset(task, trials), elsewhere=True)

    def outcomes(self) -> Iterator[Outcome]:
        while True:
            yield from self._fill()
            if self._running:
                for outcome in self.inner.outcomes():
                    self._running -= 1
                    keys = [t.key for t in outcome.task.trials]
                    if outcome.lost:
                        self.claims.release(keys)  # the driver submits them again (and claims them again)
                    yield from self._fill()  # keep the workers busy while the driver publishes
                    yield outcome
                    self.claims.release(keys)  # published by now
                    yield from self._poll()
                    yield from self._fill()
                self._running = 0
                continue
            if self._queue:
                continue
            if not self._waiting:
                return
            self._note_waiting()
            time.sleep(self.poll_s)
            yield from self._poll(force=True)

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self.claims.close()

    def abort(self) -> None:
        try:
            self.inner.abort()
        finally:
            self.claims.close()

