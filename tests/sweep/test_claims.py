"""Trial claims (batchlab.sweep.claims): claim, refuse while the holder lives, take over a dead holder's
claim, release; concurrent sweep drivers share the trials; a SIGKILLed driver's claims are taken over."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys

import psutil

from batchlab.store import Store
from batchlab.sweep.claims import CLAIMS_DIR, ClaimingExecutor, TrialClaims, claim_name, collect_dead_claims
from batchlab.sweep.executors import InlineExecutor
from sweep_helpers import TINY, child_env, run_sweep_cli, store_contents, sweep_command

# A driver in another process: claims the keys given, says so, and waits to be killed.
_HOLDER = """
import sys, time
from batchlab.store import Store
from batchlab.sweep.claims import TrialClaims
claims = TrialClaims(Store.open(sys.argv[1]))
assert all(claims.claim(key) for key in sys.argv[2:])
print(claims.owner, flush=True)
time.sleep(600)
"""


def _holder(path, *keys) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path), *keys], stdout=subprocess.PIPE,
                               text=True, env=child_env())
    return process, process.stdout.readline().strip()


def _kill(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)


def _claim_files(path) -> list[str]:
    return sorted(p.name for p in (path / CLAIMS_DIR).iterdir()
                  if p.suffix in (".claim", ".owner", ".tmp", ".lock") and not p.name.startswith("_"))


def test_claim_refuse_release_and_take_over_from_a_killed_driver(tmp_path):
    path = tmp_path / "store"
    mine = TrialClaims(Store.open(path, create=True))
    other = TrialClaims(Store.open(path))  # a second driver (its own store claim) in this process
    try:
        assert mine.claim("a") and mine.claim("a")  # claiming again is a no-op
        assert not other.claim("a")  # held by a live driver
        assert other.holder("a")["owner"] == mine.owner and other.holder("free") is None
        mine.release(["a"])
        assert not (path / CLAIMS_DIR / claim_name("a")).exists()
        assert other.claim("a") and not mine.claim("a")

        process, owner = _holder(path, "b", "c")
        try:
            assert mine.claim_many(["b", "c", "d"]) == (["d"], ["b", "c"])
            assert mine.holder("b")["owner"] == owner
        finally:
            _kill(process)  # its claims stay behind, dead: its lock is no longer held
        assert json.loads((path / CLAIMS_DIR / claim_name("b")).read_bytes())["owner"] == owner
        assert mine.holder("b") is None
        assert mine.claim("b")  # taken over
        assert mine.holder("b")["owner"] == mine.owner and not other.claim("b")
        assert collect_dead_claims(path) == 1  # "c": the dead driver's last claim; live ones stay
        assert f"{owner}.owner" not in _claim_files(path) and f"{owner}.lock" not in _claim_files(path)
        assert other.holder("a")["owner"] == other.owner and mine.holder("d")["owner"] == mine.owner
    finally:
        mine.close()
        other.close()
    assert _claim_files(path) == []  # closing released everything and removed the owner files


def test_a_driver_on_another_machine_lives_while_its_heartbeat_is_fresh(tmp_path):
    # A claim by a driver on another kernel (boot id): its store claim's lock is not held here (a
    # node-local lock, or a gone process), so its heartbeat decides, against this driver's own.
    path = tmp_path / "store"
    claims = TrialClaims(Store.open(path, create=True), stale_after_s=300.0)
    assert claims.claim("x")  # starts the driver
    try:
        remote = {"owner": "remote0", "host": "node7", "boot": "another-kernel", "pid": 1, "time": 0.0}
        (path / CLAIMS_DIR / claim_name("k")).write_text(json.dumps({**remote, "key": "k"}))
        heartbeat = path / CLAIMS_DIR / "remote0.owner"
        heartbeat.write_text(json.dumps(remote))
        now = claims.beat()
        os.utime(heartbeat, (now - 10, now - 10))
        assert not claims.claim("k") and claims.holder("k")["owner"] == "remote0"
        os.utime(heartbeat, (now - 1000, now - 1000))  # no heartbeat for longer than stale_after_s
        assert claims.claim("k") and claims.holder("k")["owner"] == claims.owner
        heartbeat.unlink()
        (path / CLAIMS_DIR / claim_name("j")).write_text(json.dumps({**remote, "key": "j"}))
        assert claims.claim("j")  # no heartbeat at all: dead
    finally:
        claims.close()


@dataclasses.dataclass(frozen=True)
class _Trial:
    key: str


@dataclasses.dataclass(frozen=True)
class _Task:
    trials: tuple
    tag: str = "kept"


def test_claiming_executor_runs_only_its_claims_and_waits_for_the_others(tmp_path):
    path = tmp_path / "store"
    store = Store.open(path, create=True)
    other_store = Store.open(path)
    other = TrialClaims(other_store)  # another driver
    published: set[str] = set()
    assert other.claim("b") and other.claim("d")
    ran = []

    def run(task):
        ran.append(task)
        return [t.key for t in task.trials]

    claims = TrialClaims(store)
    executor = ClaimingExecutor(InlineExecutor(run), claims, lambda: set(published), poll_s=0.01)
    executor.submit(_Task((_Trial("a"), _Trial("b"), _Trial("c"))))
    executor.submit(_Task((_Trial("d"),)))
    results, elsewhere = [], []
    for outcome in executor.outcomes():
        if outcome.elsewhere:
            elsewhere.extend(t.key for t in outcome.task.trials)
            continue
        results.extend(outcome.result)
        published.update(outcome.result)
        assert claims.holder(outcome.result[0])["owner"] == claims.owner  # held until published
        if len(results) == 2:  # the other driver publishes "b" and dies holding "d"
            published.add("b")
            other.release(["b"])
            other._stop.set()  # no more heartbeats, and its lock is released: it is dead
            os.close(other._lock_fd)
            other._lock_fd = None
    executor.close()
    assert results == ["a", "c", "d"] and elsewhere == ["b"]
    assert [t.tag for t in ran] == ["kept"] * 2  # a task's subset keeps its other fields
    assert _claim_files(path) == []  # "d" was taken over and released; the dead driver's owner file collected


def test_concurrent_sweeps_share_the_trials(tiny_baseline, tmp_path):
    _, base_summary, base_contents = tiny_baseline
    path = tmp_path / "store"
    Store.open(path, create=True)
    command = sweep_command(*TINY, "--workers", "1", "--store", str(path), "--json")
    drivers = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
               for _ in range(2)]
    outputs = [d.communicate(timeout=300) for d in drivers]
    assert [d.returncode for d in drivers] == [0, 0], [err for _, err in outputs]
    events = [[json.loads(line) for line in out.splitlines() if line.startswith("{")] for out, _ in outputs]
    ran = [{e["trial_key"] for e in ev if e["event"] == "trial"} for ev in events]
    done = [next(e for e in ev if e["event"] == "done") for ev in events]
    keys = {t[3] for t in base_contents[0]}
    assert ran[0].isdisjoint(ran[1]) and ran[0] | ran[1] == keys  # no trial ran twice, none was left out
    assert sum(d["trials_run"] for d in done) == 6 and [d["trials_run"] for d in done] == [len(r) for r in ran]
    assert all(d["trials_run"] + d["trials_skipped"] + d["trials_by_others"] == 6 for d in done)
    assert store_contents(path) == base_contents  # every trial once, as an uninterrupted sweep stores it
    expected = [(r.batch_size, r.steps, r.trial_id, r.n_trials) for r in base_summary.results["mnist/fc_64_64_64/momentum"]]
    for ev in events:  # both drivers report the whole sweep's table
        rows = [(e["batch_size"], e["steps"], e["trial_id"], e["n_trials"]) for e in ev if e["event"] == "steps_to_result"]
        assert rows == expected
    assert _claim_files(path) == []  # every claim released, no owner file left


def test_resumed_driver_takes_over_the_claims_of_a_sigkilled_driver(tiny_baseline, tmp_path):
    _, _, base_contents = tiny_baseline
    path = tmp_path / "store"
    driver = subprocess.Popen(sweep_command(*TINY, "--workers", "1", "--store", str(path), "--json"),
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=child_env())
    for line in driver.stdout:
        if json.loads(line)["event"] == "trial":  # the next task is claimed before a trial is reported
            workers = psutil.Process(driver.pid).children(recursive=True)
            driver.send_signal(signal.SIGKILL)
            break
    driver.wait(timeout=30)
    psutil.wait_procs(workers, timeout=10)
    held = [p for p in _claim_files(path) if p.endswith(".claim")]
    assert held  # the killed driver left claims behind
    kept = Store.open(path).table("trials").column("trial_key").to_pylist()

    result, events = run_sweep_cli(*TINY, "--workers", "1", "--store", str(path), "--json")
    assert result.returncode == 0, result.stderr
    done = next(e for e in events if e["event"] == "done")
    assert done["trials_run"] == 6 - len(kept) and done["trials_by_others"] == 0
    assert store_contents(path) == base_contents
    assert _claim_files(path) == []  # the dead driver's claims were taken over or collected


# ---------------------------------------------------------------------------------------- leaks, liveness
def test_an_interrupted_claim_or_release_leaves_no_forgotten_claim_file(tmp_path, monkeypatch):
    import batchlab.sweep.claims as claims_module

    path = tmp_path / "store"
    claims = TrialClaims(Store.open(path, create=True))
    class LinkThenInterrupt:  # the module's os, interrupted (Ctrl-C) right after a claim file appeared
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def link(src, dst):
            os.link(src, dst)
            raise KeyboardInterrupt

    monkeypatch.setattr(claims_module, "os", LinkThenInterrupt())
    try:
        claims.claim("a")
    except KeyboardInterrupt:
        pass
    monkeypatch.setattr(claims_module, "os", os)
    assert (path / CLAIMS_DIR / claim_name("a")).exists() and "a" in claims.held

    class InterruptedDiscard(set):  # Ctrl-C between removing the file and forgetting the key
        def discard(self, key):
            raise KeyboardInterrupt

    claims.held = InterruptedDiscard(claims.held)
    try:
        claims.release(["a"])
    except KeyboardInterrupt:
        pass
    assert not (path / CLAIMS_DIR / claim_name("a")).exists()  # the file went first
    claims.held = set(claims.held)
    claims.close()
    assert _claim_files(path) == []


def test_a_claim_leaked_by_a_closed_driver_is_dead_in_the_same_process(tmp_path):
    # A notebook: one process, one Store, a sweep that ended and left a claim file behind. The store's
    # claim is still locked (the process lives), but the driver's own lock is gone: the claim is dead.
    path = tmp_path / "store"
    store = Store.open(path, create=True)
    first = TrialClaims(store)
    assert first.claim("k")
    leaked = (path / CLAIMS_DIR / claim_name("k")).read_bytes()
    first.close()
    (path / CLAIMS_DIR / claim_name("k")).write_bytes(leaked)  # as if close() had been cut short
    second = TrialClaims(store)
    try:
        assert second.holder("k") is None and second.claim("k")
        assert second.holder("k")["owner"] == second.owner != first.owner
    finally:
        second.close()
    assert _claim_files(path) == []


def test_a_running_driver_in_the_same_process_stays_alive(tmp_path):
    path = tmp_path / "store"
    store = Store.open(path, create=True)
    one, two = TrialClaims(store), TrialClaims(store)  # two drivers sharing one Store object
    try:
        assert one.claim("k") and not two.claim("k")
        assert collect_dead_claims(path) == 0 and f"{one.owner}.lock" in _claim_files(path)
    finally:
        one.close()
        two.close()


def test_a_finished_sweep_writes_no_claims_and_errors_are_one_line(tmp_path, monkeypatch):
    from batchlab.errors import BatchlabError
    from batchlab.store.schema import PENDING_DIR

    path = tmp_path / "store"
    store = Store.open(path, create=True)
    before = sorted(p.relative_to(path) for p in path.rglob("*"))
    claims = TrialClaims(store)
    claims.collect_dead()
    executor = ClaimingExecutor(InlineExecutor(lambda task: []), claims, set)
    assert list(executor.outcomes()) == []  # nothing left to run
    executor.close()
    assert sorted(p.relative_to(path) for p in path.rglob("*")) == before  # not even pending/trials/

    def refused(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr("pathlib.Path.mkdir", refused)
    claims = TrialClaims(store)
    try:
        claims.claim("a")
    except BatchlabError as exc:
        assert str(exc) == f"cannot write trial claims in {path}: Permission denied"
    else:
        raise AssertionError("no error")
    claims.close()
    assert not (path / PENDING_DIR / "trials").exists()


def test_store_claim_liveness_needs_no_write_access(tmp_path, monkeypatch):
    # Another user's claim file (0644) cannot be opened for writing: the test opens it read-only.
    import batchlab.store.files as files  # where the lock test opens files
    import batchlab.store.maintenance as maintenance
    from batchlab.store.schema import PENDING_DIR

    path = tmp_path / "store"
    store = Store.open(path, create=True)
    claim = store.claim_id
    class ReadOnly:  # the module's os, whose open refuses to open for writing
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def open(file, flags, *args):
            if flags & (os.O_RDWR | os.O_WRONLY):
                raise PermissionError(13, "Permission denied", str(file))
            return os.open(file, flags, *args)

    monkeypatch.setattr(files, "os", ReadOnly())
    assert maintenance._claim_alive(path / PENDING_DIR, claim)
    os.close(store._claim_fd)  # the writer is gone
    assert not maintenance._claim_alive(path / PENDING_DIR, claim)

    class Unreadable(ReadOnly):
        @staticmethod
        def open(file, flags, *args):
            raise PermissionError(13, "Permission denied", str(file))

    monkeypatch.setattr(files, "os", Unreadable())
    assert maintenance._claim_alive(path / PENDING_DIR, claim)  # cannot tell: alive, no traceback


def test_a_waiting_driver_says_whom_it_waits_for(tmp_path):
    path = tmp_path / "store"
    other = TrialClaims(Store.open(path, create=True))
    assert other.claim("b")
    claims = TrialClaims(Store.open(path))
    notes: list[str] = []
    published: set[str] = set()
    polls = []

    def look() -> set[str]:
        polls.append(1)
        if len(polls) == 5:  # the other driver publishes "b" after this driver waited a while
            published.add("b")
            other.release(["b"])
        return set(published)

    executor = ClaimingExecutor(InlineExecutor(lambda task: [t.key for t in task.trials]), claims,
                                look, poll_s=0.01, note=notes.append, note_s=3600)
    executor.submit(_Task((_Trial("a"), _Trial("b"))))
    seen = list(executor.outcomes())
    executor.close()
    other.close()
    assert len(notes) == 1, notes  # at most one note per note_s
    assert "waiting for 1 trial held by other sweep drivers" in notes[0]
    assert f"host {claims.host} pid {os.getpid()}" in notes[0]
    assert [o.elsewhere for o in seen] == [False, True]


class _GrowingExecutor(InlineExecutor):
    def __init__(self):
        super().__init__(lambda task: [])
        self.started = []

    def submit(self, task):
        self.started.append(task)


def test_the_claiming_executor_follows_the_inner_executors_workers(tmp_path):
    inner = _GrowingExecutor()
    claims = TrialClaims(Store.open(tmp_path / "store", create=True))
    executor = ClaimingExecutor(inner, claims, set)
    for key in "abcd":
        executor.submit(_Task((_Trial(key),)))
    list(executor._fill())
    assert len(inner.started) == 1 and executor.workers == 1
    inner.workers = 3  # an adaptive cluster grew
    list(executor._fill())
    assert len(inner.started) == 3 and executor.workers == 3
    claims.close()


def test_dask_workers_are_the_schedulers_threads_now():
    from batchlab.sweep.executors import DaskExecutor

    class Client:
        threads: dict = {}

        def nthreads(self):
            return self.threads

    executor = DaskExecutor.__new__(DaskExecutor)  # no cluster: only the thread count is asked
    executor._client, executor._workers_cache = Client(), None
    executor.WORKERS_CACHE_S = 0.0
    assert executor.workers == 1  # an adaptive cluster that has no worker yet: at least one task
    Client.threads = {"tcp://a": 2, "tcp://b": 4}
    assert executor.workers == 6
    executor.WORKERS_CACHE_S = 3600.0
    Client.threads = {}
    assert executor.workers == 6  # cached for a while
