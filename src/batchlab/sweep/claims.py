"""Trial claims: several sweep drivers on one store share the work, and no trial runs twice.

A driver *claims* a trial (by its trial key) just before it hands the trial to a worker, and
releases the claim once the trial is published (or when it stops: Ctrl-C, an error, the end of the
sweep). A trial another live driver has claimed is not run; the driver waits until it is published
(polling the store) or until its claim is dead, and then takes it over. So two ``batchlab sweep``
commands started at once into one store (on one machine, or on several machines sharing the store
on a network file system) split the trials between them, each reports only the trials it ran, and
both end with the whole sweep in the store.

Layout, under the store's ``pending/`` directory::

    pending/<owner>.claim                 the owner's store claim (Store.claim_id), flock-ed while it lives
    pending/trials/<owner>.owner          the owner: host, boot id, pid, start time; its mtime is a heartbeat
    pending/trials/<sha256(key)>.claim    one claimed trial: {"key", "owner", "host", "boot", "pid", "time"}
    pending/trials/_takeover.lock         serialises take-overs and the removal of dead claims (flock)

A claim's *owner* is the driver's store claim id (:attr:`batchlab.store.Store.claim_id`), whose file
stays ``flock``-ed while the driver process lives and is released by the kernel when it dies, even by
SIGKILL (the store's own test of a live writer, ``batchlab.store.maintenance._claim_alive``). A claim
is **live** when its owner is this driver, or the owner's store claim is locked, or (only for an owner
on another machine: another kernel boot id) the owner's heartbeat was refreshed within
``stale_after_s`` (:data:`STALE_AFTER_S`, 300 s) before this driver's own. Each driver refreshes its
heartbeat (the mtime of its ``.owner`` file) every ``heartbeat_s`` (:data:`HEARTBEAT_S`, 30 s) from a
background thread; ages are differences of two mtimes the file system set, so clocks of different
machines need not agree. On one machine a dead driver's claims are taken over at once; a driver on
another machine that died is taken over once its lock is gone and its heartbeat is older than
``stale_after_s`` (the heartbeat covers file systems whose locks are local to a node).

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
field). Trials another driver published come back as outcomes with ``elsewhere=True``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from batchlab.store.files import exclusive_lock
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

_TAKEOVER_LOCK = "_takeover.lock"


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


def _owner_lock_alive(pending: Path, owner: str) -> bool:
    from batchlab.store.maintenance import _claim_alive  # the store's one test of a live writer

    return bool(owner) and "/" not in owner and _claim_alive(pending, owner)


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
    it is ``own`` (the asking driver), or its store claim ``pending/<owner>.claim`` is locked, or it runs
    on another kernel than ``boot`` (default: this one's) and its heartbeat is at most ``stale_after_s``
    older than ``now()`` (default: the file system's clock, :func:`_file_system_now`)."""
    root = Path(root)
    owner = str(record.get("owner") or "")
    if owner and owner == own:
        return True
    if _owner_lock_alive(root / PENDING_DIR, owner):
        return True
    if record.get("boot") == (boot or boot_id()):
        return False  # same kernel: the lock is the truth
    directory = root / CLAIMS_DIR
    try:
        beat = (directory / f"{owner}.owner").stat().st_mtime
    except (FileNotFoundError, ValueError):
        return False
    return (now() if now is not None else _file_system_now(directory)) - beat <= stale_after_s


def collect_dead_claims(root: str | os.PathLike, *, own: str = "", now: Callable[[], float] | None = None,
                        stale_after_s: float = STALE_AFTER_S) -> int:
    """Remove the trial claims, owner files and temporary files of dead drivers from the store at
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
    with exclusive_lock(directory / _TAKEOVER_LOCK):
        owners: dict[str, dict] = {}
        for path in directory.glob("*.owner"):
            found = _read(path)
            owners[path.stem] = found[1] if found else {}
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
    return removed


class TrialClaims:
    """The trial claims of one driver on one store (see the module docstring).

    ``store``: an open :class:`batchlab.store.Store`; its ``claim_id`` is the owner id. Creating the
    object writes the owner file and starts the heartbeat thread; :meth:`close` releases every claim
    still held, stops the heartbeat and removes the owner file.
    """

    def __init__(self, store: Any, *, stale_after_s: float = STALE_AFTER_S, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.root = Path(store.root)
        self.dir = self.root / CLAIMS_DIR
        self.dir.mkdir(parents=True, exist_ok=True)
        self.owner = store.claim_id  # locks pending/<owner>.claim for this process's lifetime
        self.stale_after_s = float(stale_after_s)
        self.heartbeat_s = float(heartbeat_s)
        self.host, self.boot = platform.node(), boot_id()
        self.held: set[str] = set()
        self._owner_file = self.dir / f"{self.owner}.owner"
        self._write_owner_file()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat, name="batchlab-claims-heartbeat", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the owner
    def _write_owner_file(self) -> None:
        record = {"owner": self.owner, "host": self.host, "boot": self.boot, "pid": os.getpid(),
                  "started": time.time()}
        tmp = self.dir / f"{self.owner}.{uuid.uuid4().hex}.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self._owner_file)

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
        return driver_alive(self.root, record, own=self.owner, boot=self.boot, now=self.beat,
                            stale_after_s=self.stale_after_s)

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
        path = self.dir / claim_name(key)
        tmp = self._temporary(key)
        try:
            while True:
                try:
                    os.link(tmp, path)  # atomic: fails if the name exists
                    self.held.add(key)
                    return True
                except FileExistsError:
                    pass
                found = _read(path)
                if found is None:
                    continue  # released meanwhile: try again
                if found[1].get("owner") == self.owner:
                    self.held.add(key)
                    return True
                if self.alive(found[1]):
                    return False
                with exclusive_lock(self.dir / _TAKEOVER_LOCK):  # take the dead claim over
                    again = _read(path)
                    if again is not None and again[0] == found[0]:
                        os.replace(tmp, path)
                        self.held.add(key)
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
            self.held.discard(key)
            path = self.dir / claim_name(key)
            found = _read(path)
            if found is not None and found[1].get("owner") == self.owner:
                path.unlink(missing_ok=True)

    def release_all(self) -> None:
        """Give up every claim this driver holds."""
        self.release(list(self.held))

    def collect_dead(self) -> int:
        """Remove the claims, owner files and temporary files of dead drivers
        (:func:`collect_dead_claims`); returns how many claims were removed."""
        return collect_dead_claims(self.root, own=self.owner, now=self.beat, stale_after_s=self.stale_after_s)

    def close(self) -> None:
        """Release every claim, stop the heartbeat, remove dead claims and this driver's owner file
        (idempotent)."""
        if self._stop.is_set():
            return
        self.release_all()
        self._stop.set()
        self._thread.join()
        self.collect_dead()
        self._owner_file.unlink(missing_ok=True)


class ClaimingExecutor(Executor):
    """An executor that runs only trials this driver claimed (see the module docstring).

    ``inner``: the executor that runs tasks; ``claims``: this driver's :class:`TrialClaims`;
    ``published``: returns the keys of every published trial (``store.finished_trial_keys``).
    :meth:`outcomes` yields the inner executor's outcomes, plus ``Outcome(task, elsewhere=True)`` for
    trials of submitted tasks that another driver published (``task.trials`` are those trials); it
    waits (polling every ``poll_s`` seconds) while trials held by other live drivers are unpublished,
    and runs those whose claim died. A task's claims are released when the driver asks for the next
    outcome after it (it has published the task by then), at once when its worker was lost, and all
    of them on :meth:`close` and :meth:`abort`.
    """

    def __init__(self, inner: Executor, claims: TrialClaims, published: Callable[[], set[str]], *,
                 poll_s: float = POLL_S) -> None:
        self.inner, self.claims, self.published, self.poll_s = inner, claims, published, float(poll_s)
        self.kind, self.workers = inner.kind, inner.workers
        self._queue: deque = deque()  # submitted, not yet claimed
        self._running = 0  # tasks in the inner executor
        self._waiting: dict[str, tuple[Any, Any]] = {}  # key -> (task, trial) held by another live driver
        self._last_poll = time.monotonic()

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
            elif self.claims.holder(key) is None:
                target = free
            else:
                continue
            del self._waiting[key]
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

