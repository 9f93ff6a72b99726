"""Several processes append at once; readers only ever see whole trials; SIGKILL leaves a
readable store."""

import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time

from batchlab.store import Store
from batchlab.store.batch_science_import import import_batch_science
from batchlab.store.maintenance import compact
from batchlab.store.synthetic_release import write_study

W = "mnist/fc_64_64_64/sgd"


def _write_trials(root, process, n):
    store = Store.open(root)
    for i in range(n):
        tid = process * 100 + i
        w = store.trial_writer(workload=W, batch_size=32, trial_id=tid, trial_key=f"p{process}-{i}",
                               parameters={"learning_rate": 0.1})
        k = 1 + (tid % 7)
        for step in range(k):
            w.record(step, {"val/classification_error": 1.0 / (step + 1), "train/loss": 2.0})
        w.finish(status="COMPLETE", steps=k)  # steps == number of evaluations: checkable whole


def _whole(con):
    rows = con.execute(
        "SELECT t.trial_key, t.steps, count(m.step) FROM trials t LEFT JOIN measurements m "
        "USING (workload, batch_size, trial_id) GROUP BY ALL").fetchall()
    return all(count == 2 * steps for _, steps, count in rows), len(rows)


def test_concurrent_writers_and_readers_see_only_whole_trials(tmp_path):
    store = Store.open(tmp_path / "s", create=True)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_write_trials, args=(store.root, p, 12)) for p in range(3)]
    for p in procs:
        p.start()
    seen = set()
    while any(p.is_alive() for p in procs):
        ok, n = _whole(store.connect())
        assert ok
        seen.add(n)
    for p in procs:
        p.join()
        assert p.exitcode == 0
    ok, n = _whole(store.connect())
    assert ok and n == 36
    assert len(store.finished_trial_keys()) == 36
    assert store.state().seq == 36  # one commit per trial, none lost
    before = store.connect().execute("SELECT * FROM measurements ORDER BY ALL").fetchall()
    compact(store, grace_seconds=0)
    assert store.connect().execute("SELECT * FROM measurements ORDER BY ALL").fetchall() == before


def test_killed_trial_writer_leaves_nothing_visible(tmp_path):
    store = Store.open(tmp_path / "s", create=True)
    code = (
        "import os, signal\n"
        "from batchlab.store import Store\n"
        f"s = Store.open({str(store.root)!r})\n"
        f"w = s.trial_writer(workload={W!r}, batch_size=8, trial_id=1, trial_key='dead', parameters={{}})\n"
        "w.record(0, {'a': 1.0}); w.record(5, {'a': 0.5})\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    result = subprocess.run([sys.executable, "-c", code])
    assert result.returncode == -signal.SIGKILL
    assert store.finished_trial_keys() == set()
    assert store.table("measurements").num_rows == 0
    journal = list((store.root / "pending").glob("*.jsonl"))
    assert len(journal) == 1 and len(journal[0].read_text().splitlines()) == 3


def _release(root, studies=12, trials=25):
    for b in range(studies):
        write_study(root, "cifar_10/resnet_8/sgd", 2 ** b, [
            {"trial_id": t, "status": "COMPLETE", "steps": 100, "parameters": {"learning_rate": t},
             "measurements": [{"step": s * 3 + t % 2, "val/classification_error": 1 / (s + t),
                               "train/cross_entropy_error": 2 / (s + 1)} for s in range(40)]}
            for t in range(1, trials + 1)])


def test_sigkill_during_import_leaves_a_readable_store_and_a_rerun_completes(tmp_path):
    root = tmp_path / "rel"
    _release(root)
    reference = Store.open(tmp_path / "ref", create=True)
    import_batch_science(reference, root)
    expected = reference.connect().execute("SELECT * FROM measurements ORDER BY ALL").fetchall()
    rng = random.Random(os.getpid() ^ int(time.time()))
    for attempt in range(3):
        store_dir = tmp_path / f"s{attempt}"
        proc = subprocess.Popen([sys.executable, "-m", "batchlab", "import", "batch-science",
                                 str(root), "--store", str(store_dir)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        start = time.monotonic()
        if attempt == 0:  # the moment data files exist but are not committed yet
            measurements = store_dir / "data" / "measurements"
            while proc.poll() is None and not (measurements.is_dir() and any(measurements.iterdir())):
                time.sleep(0.001)
        else:  # a random moment
            time.sleep(rng.uniform(0.2, 2.5))
        delay = time.monotonic() - start
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if not (store_dir / "batchlab-store.json").exists():
            continue  # killed before the store existed: nothing to check
        store = Store.open(store_dir)
        con = store.connect()
        n = con.execute("SELECT count(*) FROM trials").fetchone()[0]
        assert n in (0, 12 * 25), f"killed after {delay:.2f} s: {n} trials visible"
        assert con.execute("SELECT count(*) FROM measurements").fetchone()[0] in (0, len(expected))
        import_batch_science(store, root)  # the re-run completes
        con = store.connect()
        assert con.execute("SELECT * FROM measurements ORDER BY ALL").fetchall() == expected
        assert con.execute("SELECT count(DISTINCT trial_key), count(*) FROM trials").fetchone() == (300, 300)
        compact(store, grace_seconds=0)  # the killed import's orphan files are collected
        live = {str(store.root / f) for f in store.state().all_files()}
        assert {str(p) for p in (store.root / "data").rglob("*.parquet")} == live
