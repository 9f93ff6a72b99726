"""A real Dask cluster: a scheduler and two workers as separate processes on 127.0.0.1.

``batchlab sweep --scheduler`` runs a small sweep on it; when the first trial is published, one whole
``dask worker`` (nanny and worker process) is SIGKILLed while it runs a trial. Dask re-runs that task on
the surviving worker, and the store must equal an uninterrupted local sweep of the same settings: the
same trial keys, ids, statuses, steps, seeds, parameters and measurements, nothing lost, nothing twice.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sweep_helpers import child_env, sweep_command

pytestmark = pytest.mark.slow


def _dask_cli() -> str | None:
    beside = Path(sys.executable).with_name("dask")  # the venv's own script, if any
    return str(beside) if beside.exists() else shutil.which("dask")


DASK = _dask_cli()

# 2 studies x 3 trials, each trial its own task (--no-vectorize), each a second or two of training:
# long enough that a worker is still busy when the first trial is published.
SETTINGS = {"workloads": ["mnist/fc_64_64_64"], "optimizers": ["momentum"], "batch_sizes": [8, 64], "trials": 3,
            "steps": 500, "train_examples": 2000, "seed": 1, "stop_at_goal": False, "vectorize": "never",
            "device": "cpu"}
ARGS = ["mnist/fc_64_64_64", "--optimizer", "momentum", "--batch-sizes", "8,64", "--trials", "3", "--steps", "500",
        "--train-examples", "2000", "--seed", "1", "--no-stop-at-goal", "--no-vectorize", "--device", "cpu"]
TRIALS = 6


def _start(command: list[str], log: Path, cwd: Path) -> subprocess.Popen:
    """Start ``command`` in its own session (so its whole process group can be killed), output to ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=cwd, env=child_env(), start_new_session=True)


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the process group of ``process`` (it leads its own session) and reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL of a group
        pass


def _contents(path) -> tuple[list, list]:
    """(trials, measurements) of the store at ``path``, as sorted rows of its DuckDB views."""
    from batchlab.store import Store

    con = Store(Path(path)).connect()
    try:
        trials = con.execute("SELECT workload, batch_size, trial_id, trial_key, study_id, status, steps, seed, "
                             "parameters FROM trials ORDER BY ALL").fetchall()
        measurements = con.execute("SELECT workload, batch_size, trial_id, step, metric, value FROM measurements "
                                   "ORDER BY ALL").fetchall()
    finally:
        con.close()
    return trials, measurements


def _duplicates(path) -> tuple[list, list]:
    """Trial keys stored more than once, and (trial, step, metric) measured more than once."""
    from batchlab.store import Store

    con = Store(Path(path)).connect()
    try:
        trials = con.execute("SELECT trial_key, count(*) FROM trials GROUP BY ALL HAVING count(*) > 1").fetchall()
        measurements = con.execute("SELECT workload, batch_size, trial_id, step, metric, count(*) FROM measurements "
                                   "GROUP BY ALL HAVING count(*) > 1").fetchall()
    finally:
        con.close()
    return trials, measurements


def _stored_trials(path) -> int:
    from batchlab.store import Store

    try:
        return len(Store(Path(path)).table("trials"))
    except Exception:  # the store is being created
        return 0


@pytest.mark.skipif(DASK is None, reason="the `dask` command line (dask[distributed]) is not installed")
def test_sweep_on_a_real_cluster_survives_a_killed_worker(tmp_path):
    from dask.distributed import Client

    from batchlab.sweep.config import parse_sweep_config
    from batchlab.sweep.executors import InlineExecutor
    from batchlab.sweep.runner import prepare_sweep, run_sweep

    scheduler_file = tmp_path / "scheduler.json"
    processes: list[subprocess.Popen] = []
    driver = None
    client = None
    watchdog = None
    try:
        scheduler = _start([DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                            "--scheduler-file", str(scheduler_file)], tmp_path / "scheduler.log", tmp_path)
        processes.append(scheduler)
        deadline = time.monotonic() + 60
        address = None
        while address is None:
            assert scheduler.poll() is None, (tmp_path / "scheduler.log").read_text()
            assert time.monotonic() < deadline, "the scheduler wrote no scheduler file in 60 s"
            try:
                address = json.loads(scheduler_file.read_text())["address"]
            except (OSError, ValueError, KeyError):
                time.sleep(0.1)
        assert address.startswith("tcp://127.0.0.1:")
        workers = []
        for i in range(2):
            worker = _start([DASK, "worker", "--scheduler-file", str(scheduler_file), "--nthreads", "1",
                             "--nworkers", "1", "--host", "127.0.0.1", "--no-dashboard", "--name", f"w{i}",
                             "--local-directory", str(tmp_path / f"w{i}"), "--death-timeout", "60"],
                            tmp_path / f"w{i}.log", tmp_path)
            processes.append(worker)
            workers.append(worker)

        # The uninterrupted local sweep, in this process, while the workers start.
        baseline = tmp_path / "baseline"
        run_sweep(prepare_sweep(parse_sweep_config(SETTINGS), str(baseline)),
                  executor_factory=lambda fn, **kw: InlineExecutor(fn))
        expected = _contents(baseline)
        assert len(expected[0]) == TRIALS and expected[1]

        client = Client(address, timeout="30s")
        client.wait_for_workers(2, timeout=60)
        # worker address -> the `dask worker` command (process group) it runs in
        groups = {address_: os.getpgid(pid) for address_, pid in client.run(os.getpid).items()}
        by_group = {w.pid: w for w in workers}
        assert sorted(groups.values()) == sorted(by_group)

        store = tmp_path / "store"
        with open(tmp_path / "driver.log", "wb") as driver_log:
            driver = subprocess.Popen(sweep_command(*ARGS, "--store", str(store), "--scheduler", address, "--json"),
                                      stdout=subprocess.PIPE, stderr=driver_log, stdin=subprocess.DEVNULL, text=True,
                                      env=child_env(), start_new_session=True)
        watchdog = threading.Timer(180, _kill_group, [driver])  # a hung sweep fails instead of hanging
        watchdog.start()
        events, victim, busy, stored_at_kill = [], None, (), None
        for line in driver.stdout:
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            events.append(event)
            if event["event"] == "trial" and victim is None:
                # Kill a worker that is running a trial right now (poll briefly: one may be between tasks).
                until = time.monotonic() + 5
                while victim is None and time.monotonic() < until:
                    processing = {a: keys for a, keys in client.processing().items() if keys}
                    if processing:
                        victim, busy = next(iter(processing.items()))
                    else:
                        time.sleep(0.02)
                assert victim is not None, "no worker was running a task after the first trial was published"
                stored_at_kill = _stored_trials(store)
                _kill_group(by_group[groups[victim]])
        driver.wait(timeout=30)
        watchdog.cancel()
        log = (tmp_path / "driver.log").read_text()
        assert driver.returncode == 0, log

        assert victim is not None and busy and all(str(k).startswith("batchlab-") for k in busy)
        assert 1 <= stored_at_kill < TRIALS  # killed mid-sweep
        assert victim not in client.scheduler_info()["workers"]  # that worker is gone for good
        trials = [e for e in events if e["event"] == "trial"]
        assert len(trials) == TRIALS == len({e["trial_key"] for e in trials})  # each trial published once
        done = events[-1]
        assert done["event"] == "done" and done["trials_run"] == TRIALS and done["executor"] == "dask"
        assert done["workers"] in (1, 2)  # the workers the scheduler counts at the end: the killed one may be gone

        assert _duplicates(store) == ([], [])  # nothing twice ...
        assert _contents(store) == expected  # ... nothing lost, the same measurements bit for bit
    finally:
        if watchdog is not None:
            watchdog.cancel()
        if client is not None:
            client.close()
        for process in ([driver] if driver is not None else []) + processes[::-1]:
            _kill_group(process)
        if driver is not None and driver.stdout is not None:
            driver.stdout.close()
