"""The driver end to end: resume after SIGKILL of the driver, a killed worker's trial re-run, Dask."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import psutil

from batchlab.sweep.executors import LocalPoolExecutor
from batchlab.sweep.runner import Reporter, SweepInterrupted, prepare_sweep, run_sweep
from sweep_helpers import TINY, child_env, run_sweep_cli, store_contents, sweep_command, tiny_config


def _trial_keys(path) -> list[str]:
    from batchlab.store import Store

    return Store.open(path).table("trials").column("trial_key").to_pylist()


def test_uninterrupted_sweep_stores_every_trial_once(tiny_baseline):
    path, summary, (trials, measurements) = tiny_baseline
    keys = [t[3] for t in trials]
    assert len(keys) == 6 and len(set(keys)) == 6
    assert sorted((t[1], t[2]) for t in trials) == [(8, 1), (8, 2), (8, 3), (64, 1), (64, 2), (64, 3)]  # ids from 1
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


def test_rerun_with_another_goal_is_another_sweep_kept_apart(tiny_baseline):
    # The goal is part of the measurement (its bracket is refined at the resolution steps, and trials
    # stop at it with stop_at_goal): another goal runs its own trials under its own study
    # definitions, beside the first sweep's, and its table reports only its own trials.
    path, _, base_contents = tiny_baseline
    from batchlab.store import Store
    from batchlab.sweep.executors import InlineExecutor

    config = tiny_config().model_copy(update={"goal": 0.95})
    summary = run_sweep(prepare_sweep(config, str(path)), executor_factory=lambda fn, **kw: InlineExecutor(fn))
    assert summary.trials_run == 6 and summary.trials_skipped == 0
    rows = summary.results["mnist/fc_64_64_64/momentum"]
    # error < 0.95 is met by the initial model (error ~0.9): steps to result 0, found by the goal check
    # of step 0 when the first evaluation meets it (it read (0, 1] before that check existed)
    assert [r.steps for r in rows] == [0, 0] and summary.goals["mnist/fc_64_64_64/momentum"]["goal"] == 0.95
    assert [getattr(r, "steps_lower", 0) for r in rows] == [0, 0]
    sweeps = {d["definition"]["sweep"] for d in Store.open(path).study_definitions("mnist/fc_64_64_64/momentum")}
    assert len(sweeps) == 2  # both sweeps' studies kept, apart
    assert len(Store.open(path).table("trials")) == 12


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


def _inline(fn, **kw):
    from batchlab.sweep.executors import InlineExecutor

    return InlineExecutor(fn)


def test_grown_rounds_stretch_the_schedule_and_another_grow_factor_is_kept_apart(tmp_path):
    from batchlab.store import Store
    from batchlab.sweep.config import MAX_TRIALS_PER_STUDY, parse_sweep_config

    space = {"learning_rate": {"type": "DOUBLE", "min_value": 0.01, "max_value": 0.02, "scale": "LOG"},
             "learning_rate_decay_steps": {"type": "INTEGER", "min_value": 2, "max_value": 2, "scale": "LINEAR"}}
    settings = {"workloads": ["mnist/fc_64_64_64"], "optimizers": ["sgd"], "batch_sizes": [8], "trials": 1,
                "steps": 2, "train_examples": 256, "grow_budget": True, "max_budget_growths": 1,
                "stop_at_goal": False, "search_spaces": {"sgd": space}}
    store = str(tmp_path / "store")
    summary = run_sweep(prepare_sweep(parse_sweep_config(settings), store), executor_factory=_inline)
    assert [g["to_steps"] for g in summary.grown] == [4]
    trials = {t["trial_id"]: t for t in Store.open(store).table("trials").to_pylist()}
    assert sorted(trials) == [1, MAX_TRIALS_PER_STUDY + 1]  # round 1 in its own block; ids from 1
    decay = {i: json.loads(t["parameters"])["learning_rate_decay_steps"] for i, t in trials.items()}
    assert decay == {1: 2, MAX_TRIALS_PER_STUDY + 1: 4}  # the decay stretched with the budget
    (row,) = summary.results["mnist/fc_64_64_64/sgd"]
    assert row.n_trials == 1 and [r["reported"] for r in summary.studies["mnist/fc_64_64_64/sgd"][8]] == [False, True]
    # each round is a study of its own in the store, named by the id in its trials' keys
    con = Store.open(store).connect()
    try:
        studies = con.execute("SELECT study_id, definition FROM studies ORDER BY train_steps").fetchall()
        keys = dict(con.execute("SELECT trial_id, study_id FROM trials").fetchall())
    finally:
        con.close()
    definitions = [json.loads(d) for _, d in studies]
    assert [(d["budget_round"], d["train_steps"], d["schedule_stretch"]) for d in definitions] == [(0, 2, 1.0), (1, 4, 2.0)]
    assert definitions[0]["sweep"] == definitions[1]["sweep"] == summary.sweep_id
    assert definitions[1]["search_space"]["learning_rate_decay_steps"]["max_value"] == 4
    assert keys == {1: studies[0][0], MAX_TRIALS_PER_STUDY + 1: studies[1][0]}
    assert all(trials[i]["trial_key"].endswith(f"study={keys[i]}") for i in trials)

    prepare_sweep(parse_sweep_config(settings), store)  # the same settings resume
    other = parse_sweep_config({**settings, "grow_factor": 3.0})  # the same round 0, another round 1
    plan = prepare_sweep(other, store)
    assert plan.first_ids[("mnist/fc_64_64_64/sgd", 8, 0)] == 1
    assert plan.first_ids[("mnist/fc_64_64_64/sgd", 8, 1)] == 2 * MAX_TRIALS_PER_STUDY + 1
    summary = run_sweep(plan, executor_factory=_inline)
    assert summary.trials_run == 1 and summary.trials_skipped == 1 and summary.grown[0]["to_steps"] == 6
    assert 2 * MAX_TRIALS_PER_STUDY + 1 in {t["trial_id"] for t in Store.open(store).table("trials").to_pylist()}


def test_sweep_table_ignores_foreign_trials(tmp_path):
    """A `batchlab train`-like trial at the same workload and batch size, reaching the goal at step 3,
    is neither pooled into the sweep's table nor refused: the sweep's trials take the next id block."""
    from batchlab.store import Store, TrialRecord, publish_trials
    from batchlab.sweep.config import MAX_TRIALS_PER_STUDY, parse_sweep_config

    store_path = tmp_path / "store"
    store = Store.open(store_path, create=True)
    publish_trials(store, [TrialRecord(
        workload="mnist/fc_64_64_64/sgd", batch_size=8, trial_id=1, trial_key="train-1", parameters={"learning_rate": 0.1},
        status="COMPLETE", steps=3000, seed=0, source="batchlab train", train_steps=3000,
        measurements=[(1, "val/classification_error", 0.9), (3, "val/classification_error", 0.0)],
    )])
    config = parse_sweep_config({"workloads": ["mnist/fc_64_64_64"], "optimizers": ["sgd"], "batch_sizes": [8],
                                 "trials": 2, "steps": 3, "train_examples": 256, "stop_at_goal": False,
                                 "goal": 0.01})
    summary = run_sweep(prepare_sweep(config, str(store_path)), executor_factory=_inline)
    (row,) = summary.results["mnist/fc_64_64_64/sgd"]
    assert row.n_trials == 2 and row.steps is None  # the foreign trial (steps 3) is not in the table
    assert getattr(row, "censored_at", 3) == 3
    ids = sorted(t["trial_id"] for t in Store.open(store_path).table("trials").to_pylist())
    assert ids == [1, MAX_TRIALS_PER_STUDY + 1, MAX_TRIALS_PER_STUDY + 2]
    # the foreign trial is still in the store, where an analysis of the whole store sees it
    from batchlab.analysis.steps_to_result import steps_to_result

    con = Store.open(store_path).connect()
    try:
        pooled = steps_to_result(con, "mnist/fc_64_64_64/sgd", "val/classification_error", 0.01,
                                 **({"mix_studies": True} if "mix_studies" in steps_to_result.__code__.co_varnames else {}))
    finally:
        con.close()
    assert pooled[0].steps == 3


class _StopAfter(Reporter):
    """Interrupts the driver (as Ctrl-C would) once ``n`` trials are published."""

    def __init__(self, n):
        self.n, self.seen = n, 0

    def trial(self, progress, outcome, totals):
        self.seen += 1
        if self.seen == self.n:
            raise KeyboardInterrupt


def test_interrupted_sweep_beside_foreign_trials_resumes_into_the_same_id_blocks(tiny_baseline, tmp_path):
    import pytest

    from batchlab.store import Store, TrialRecord, publish_trials
    from batchlab.sweep.config import MAX_TRIALS_PER_STUDY

    _, _, (base_trials, base_measurements) = tiny_baseline

    def foreign_store(name):
        path = tmp_path / name
        publish_trials(Store.open(path, create=True), [TrialRecord(
            workload="mnist/fc_64_64_64/momentum", batch_size=8, trial_id=1, trial_key="train-0",
            parameters={"learning_rate": 0.1}, status="COMPLETE", steps=5, source="batchlab train",
            measurements=[(5, "val/classification_error", 0.5)])])
        return path

    path = foreign_store("resumed")
    with pytest.raises(SweepInterrupted) as interrupted:
        run_sweep(prepare_sweep(tiny_config(), str(path)), _StopAfter(2), executor_factory=_inline)
    assert (interrupted.value.saved, interrupted.value.run, interrupted.value.total) == (2, 2, 6)
    assert isinstance(interrupted.value, KeyboardInterrupt)
    summary = run_sweep(prepare_sweep(tiny_config(), str(path)), executor_factory=_inline)
    assert summary.trials_skipped == 2 and summary.trials_run == 4
    trials, measurements = store_contents(path)
    ours = [t for t in trials if t[3] != "train-0"]
    assert len(trials) == 7 and len({t[3] for t in trials}) == 7
    # block 0 at b=8 holds the foreign trial, so the sweep's b=8 study took block 1; b=64 kept block 0
    assert sorted((t[1], t[2]) for t in ours) == sorted(
        [(8, MAX_TRIALS_PER_STUDY + 1 + i) for i in range(3)] + [(64, 1 + i) for i in range(3)])
    # the same trials (keys, seeds, points, statuses) and measurements as the uninterrupted sweep
    strip = lambda rows: sorted(tuple(r[:2]) + tuple(r[3:]) for r in rows)  # noqa: E731
    assert strip(ours) == strip(base_trials)
    assert sorted(m[:2] + m[3:] for m in measurements if not (m[1] == 8 and m[2] == 1)) == sorted(
        m[:2] + m[3:] for m in base_measurements)
    (row8, row64) = summary.results["mnist/fc_64_64_64/momentum"]
    assert row8.n_trials == 3 and row64.n_trials == 3


def test_json_trial_events_of_grown_rounds_carry_their_own_budget_round_and_study(tmp_path):
    # A trial of a grown round ran the grown budget under the grown round's study definition: its
    # JSON `trial` event says so (it used to report round 0's budget, round and study id).
    import io

    from batchlab.sweep.config import parse_sweep_config
    from batchlab.sweep.progress import JsonReporter

    settings = {"workloads": ["mnist/fc_64_64_64"], "optimizers": ["sgd"], "batch_sizes": [8], "trials": 1,
                "steps": 2, "train_examples": 256, "grow_budget": True, "max_budget_growths": 1,
                "stop_at_goal": False, "goal": 0.0,
                "search_spaces": {"sgd": {"learning_rate": {"type": "DOUBLE", "min_value": 0.01, "max_value": 0.02,
                                                            "scale": "LOG"}}}}
    stream = io.StringIO()
    plan = prepare_sweep(parse_sweep_config(settings), str(tmp_path / "store"))
    summary = run_sweep(plan, JsonReporter(stream), executor_factory=_inline)
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    trials = [e for e in events if e["event"] == "trial"]
    (grown,) = [e for e in events if e["event"] == "budget_grown"]
    rounds = summary.studies["mnist/fc_64_64_64/sgd"][8]
    assert [(t["budget"], t["budget_round"], t["steps"]) for t in trials] == [(2, 0, 2), (4, 1, 4)]
    assert [t["study_id"] for t in trials] == [r["study_id"] for r in rounds]
    assert trials[1]["study_id"] == grown["study_id"]


class _StartCounts(Reporter):
    """Records the counts every study starts with (trials finished before this run)."""

    def start(self, plan, progress, info):
        self.done = sum(p.done for p in progress)
        self.diverged = sum(p.diverged for p in progress)


def test_resumed_sweep_counts_the_diverged_trials_it_finds_in_the_store(tmp_path):
    # Progress on a resumed sweep counts the trials already in the store as done, once; those that
    # diverged count as diverged too (the progress line used to say "2/4 done, 0 diverged").
    import pytest

    from batchlab.sweep.config import parse_sweep_config

    config = parse_sweep_config({
        "workloads": ["mnist/fc_64_64_64"], "optimizers": ["sgd"], "batch_sizes": [8, 64], "trials": 2,
        "steps": 3, "train_examples": 256, "stop_at_goal": False, "vectorize": "never",
        "search_spaces": {"sgd": {"learning_rate": {"type": "DOUBLE", "min_value": 1e6, "max_value": 1e7,
                                                    "scale": "LOG_SCALE"}}}})
    path = str(tmp_path / "store")
    with pytest.raises(SweepInterrupted):
        run_sweep(prepare_sweep(config, path), _StopAfter(2), executor_factory=_inline)
    counts = _StartCounts()
    summary = run_sweep(prepare_sweep(config, path), counts, executor_factory=_inline)
    assert (counts.done, counts.diverged) == (2, 2) and summary.trials_run == 2
