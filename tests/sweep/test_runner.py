"""The driver end to end: resume after SIGKILL of the driver, a killed worker's trial re-run, Dask."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import psutil

from batchlab.sweep.executors import LocalPoolExecutor
from batchlab.sweep.runner import Reporter, prepare_sweep, run_sweep
from sweep_helpers import TINY, child_env, run_sweep_cli, store_contents, sweep_command, tiny_config


def _trial_keys(path) -> list[str]:
    from batchlab.store import Store

    return Store.open(path).table("trials").column("trial_key").to_pylist()


def test_uninterrupted_sweep_stores_every_trial_once(tiny_baseline):
    path, summary, (trials, measurements) = tiny_baseline
    keys = [t[3] for t in trials]
    assert len(keys) == 6 and len(set(keys)) == 6
    assert sorted((t[1], t[2]) for t in trials) == [(8, 0), (8, 1), (8, 2), (64, 0), (64, 1), (64, 2)]
    assert summary.trials_run == 6 and summary.trials_skipped == 0
    assert [r.batch_size for r in summary.results["mnist/fc_64_64_64/momentum"]] == [8, 64]
    assert {m[3] for m in measurements} == set(range(1, 9))  # evaluated after every one of the 8 updates


def test_resume_after_driver_sigkill_equals_uninterrupted(tiny_baseline, tmp_path):
    base_path, _, base_contents = tiny_baseline
    path = tmp_path / "store"
    driver = subprocess.Popen(sweep_command(*TINY, "--workers", "1", "--store", str(path), "--json"),
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=child_env())
    seen = 0
    workers = []
    for line in driver.stdout:
        if json.loads(line)["event"] == "trial":
            seen += 1
            if seen == 2:
                workers = psutil.Process(driver.pid).children(recursive=True)
                driver.send_signal(signal.SIGKILL)
                break
    driver.wait(timeout=30)
    assert seen == 2
    _, still_alive = psutil.wait_procs(workers, timeout=10)  # workers die with the driver
    assert still_alive == []
    kept = _trial_keys(path)
    assert 2 <= len(kept) < 6 and len(set(kept)) == len(kept)

    result, events = run_sweep_cli(*TINY, "--workers", "1", "--store", str(path), "--json")
    assert result.returncode == 0, result.stderr
    assert events[0]["finished_before"] == len(kept)
    rerun = {e["trial_key"] for e in events if e["event"] == "trial"}
    assert rerun.isdisjoint(kept) and len(rerun) == 6 - len(kept)
    assert store_contents(path) == base_contents


class _KillFirstWorker(Reporter):
    """Records events; SIGKILLs a pool worker when the first trial is published."""

    def __init__(self, executor_box):
        self.executor_box = executor_box
        self.trials, self.lost, self.killed = [], [], None

    def trial(self, progress, outcome, totals):
        self.trials.append(outcome.key)
        if self.killed is None:
            self.killed = self.executor_box[0].worker_pids()[0]
            os.kill(self.killed, signal.SIGKILL)

    def worker_lost(self, keys):
        self.lost.extend(keys)


def test_killed_worker_trial_is_rerun(tiny_baseline, tmp_path):
    _, _, base_contents = tiny_baseline
    box = []

    def pool(fn, workers, **_):
        box.append(LocalPoolExecutor(fn, workers=1))
        return box[0]

    reporter = _KillFirstWorker(box)
    path = tmp_path / "store"
    summary = run_sweep(prepare_sweep(tiny_config(), str(path)), reporter, executor_factory=pool)
    assert reporter.killed is not None and reporter.lost  # the killed worker's trial (and those queued) ...
    assert set(reporter.lost) <= set(reporter.trials)  # ... ran again,
    assert len(reporter.trials) == 6 == len(set(reporter.trials))  # and each trial was stored once
    assert summary.workers_lost >= 1 and summary.trials_run == 6
    assert store_contents(path) == base_contents


def test_dask_local_cluster_matches_local_pool(tiny_baseline, tmp_path):
    _, _, base_contents = tiny_baseline
    path = tmp_path / "store"
    config = tiny_config().model_copy(update={"executor": "dask", "workers": 1})
    summary = run_sweep(prepare_sweep(config, str(path)))
    assert summary.executor == "dask" and summary.trials_run == 6
    assert store_contents(path) == base_contents


def test_rerun_with_another_goal_only_re_summarizes(tiny_baseline):
    # Trials are keyed without the analysis goal: a looser goal re-reads the same trials, runs none,
    # and reaches the goal (here: any error below 0.95) at both batch sizes, so S(B) can be fitted.
    path, _, base_contents = tiny_baseline
    from batchlab.sweep.executors import InlineExecutor

    config = tiny_config().model_copy(update={"goal": 0.95})
    summary = run_sweep(prepare_sweep(config, str(path)), executor_factory=lambda fn, **kw: InlineExecutor(fn))
    assert summary.trials_run == 0 and summary.trials_skipped == 6
    rows = summary.results["mnist/fc_64_64_64/momentum"]
    assert [r.steps for r in rows] == [1, 1] and summary.goals["mnist/fc_64_64_64/momentum"]["goal"] == 0.95
    fit = summary.fits["mnist/fc_64_64_64/momentum"]
    assert set(fit["critical_batch_sizes"]) == {"mccandlish_b_crit", "overhead_20pct", "perfect_scaling_end",
                                                "maximal_parallelism_start"}
    assert store_contents(path) == base_contents


def test_search_space_values_the_optimizer_rejects_fail_before_the_store_is_created(tmp_path):
    import pytest

    from batchlab.errors import BatchlabError
    from batchlab.sweep.config import parse_sweep_config

    store = tmp_path / "store"
    config = parse_sweep_config({
        "workloads": ["mnist/fc_64_64_64"], "optimizers": ["sgd"], "batch_sizes": [8], "trials": 2,
        "steps": 3, "train_examples": 256,
        "search_spaces": {"sgd": {"weight_decay": {"type": "DOUBLE", "min_value": -0.5, "max_value": -0.1,
                                                   "scale": "LINEAR_SCALE"}}},
    })
    with pytest.raises(BatchlabError, match=r"^search space of sgd: hyperparameter weight_decay must be a number >= 0"):
        prepare_sweep(config, str(store))
    assert not store.exists()


def test_unreachable_dask_scheduler_is_one_line_error():
    import pytest

    from batchlab.errors import BatchlabError
    from batchlab.sweep.executors import DaskExecutor

    with pytest.raises(BatchlabError, match=r"^cannot reach the Dask scheduler tcp://127\.0\.0\.1:1 .*allowed:") as info:
        DaskExecutor(lambda task: task, scheduler="tcp://127.0.0.1:1", connect_timeout="1s")
    assert "\n" not in str(info.value)


def test_executor_failure_leaves_no_store(tmp_path):
    import pytest

    from batchlab.errors import BatchlabError

    def refuse(fn, **kw):
        raise BatchlabError("cannot reach the Dask scheduler")

    store = tmp_path / "store"
    plan = prepare_sweep(tiny_config(), str(store))
    with pytest.raises(BatchlabError):
        run_sweep(plan, executor_factory=refuse)
    assert not store.exists()


def test_grown_rounds_of_another_grow_factor_are_refused_before_running(tmp_path):
    import pytest

    from batchlab.errors import BatchlabError
    from batchlab.sweep.config import parse_sweep_config
    from batchlab.sweep.executors import InlineExecutor

    settings = {"workloads": ["mnist/fc_64_64_64"], "optimizers": ["sgd"], "batch_sizes": [8], "trials": 1,
                "steps": 2, "train_examples": 256, "grow_budget": True, "max_budget_growths": 1,
                "stop_at_goal": False}
    store = str(tmp_path / "store")
    summary = run_sweep(prepare_sweep(parse_sweep_config(settings), store),
                        executor_factory=lambda fn, **kw: InlineExecutor(fn))
    assert [g["to_steps"] for g in summary.grown] == [4]  # round 1 (trial id 100000) is in the store
    prepare_sweep(parse_sweep_config(settings), store)  # the same settings resume
    other = parse_sweep_config({**settings, "grow_factor": 3.0})  # same round 0, another round 1
    with pytest.raises(BatchlabError, match="already holds trial 100000 of mnist/fc_64_64_64/sgd"):
        prepare_sweep(other, store)
