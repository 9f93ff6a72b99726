"""batchlab advise end to end on the noisy quadratic (nqm/quadratic): the known answer, resume after
SIGKILL, the budget, an unreachable goal and bad input.

The quadratic's steps are tens of updates, so a whole advice takes seconds. Candidates come from a
sweep config (B = 1..256) so the throughput probe stays small.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

QUADRATIC = "nqm/quadratic"
CONFIG = """workloads = ["nqm/quadratic"]
optimizers = ["sgd"]
batch_sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
trials = 4
race = true
batch_order = "shared"
stop_at_goal = true
steps = 400
"""


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")


def _config(tmp_path) -> str:
    path = tmp_path / "advise.toml"
    path.write_text(CONFIG)
    return str(path)


def _inline(fn, **kw):
    from batchlab.sweep.executors import InlineExecutor

    return InlineExecutor(fn)


def _advise(store, config, **kw):
    from batchlab.advise import advise

    return advise(QUADRATIC, "sgd", store=str(store), config=config, executor_factory=_inline, **kw)


def _cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "batchlab", "advise", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env())


def _decisions(record: dict) -> list:
    return [(r["round"], r["action"], r["batch_sizes"], r["trials"]) for r in record["rounds"]]


def test_known_answer_b_crit_and_recommendation_match_the_exact_nqm(tmp_path):
    """On the noisy quadratic the exact NQM gives the truth of the curve's shape: its tuned expected-loss
    steps per batch size, fitted on the batch sizes advise measured, give the true B_crit, which must lie
    in advise's interval; and the exact curve's answer to the same objective (the largest B within 1.2x
    of the least examples) must be advise's recommendation or one it cannot tell from it.

    The NQM's steps themselves are not compared with the measured ones: a trial's steps are the first
    passage of its *realised* loss below the goal, which fluctuations make earlier than the crossing of
    the expected loss, and the best of K trials takes the earliest (measured 35 steps at B = 8 against
    the NQM's 43). That offset is nearly the same at every batch size, so B_crit (a ratio of the curve's
    two parameters) is still the NQM's."""
    from batchlab.advise.recommend import EXAMPLES_TOLERANCE
    from batchlab.workloads.quadratic import nqm_truth

    advice = _advise(tmp_path / "store", _config(tmp_path), objective="examples", target_ratio=2.0, check=False)
    record = advice.record
    rec = record["recommendation"]
    measured = [row["batch_size"] for row in rec["table"] if row["reached"]]
    truth = nqm_truth(measured)
    b_crit = record["rounds"][-1]["b_crit"]
    assert b_crit["low"] is not None and b_crit["high"] is not None
    assert b_crit["low"] <= truth["b_crit"] <= b_crit["high"], (b_crit, truth["b_crit"])
    examples = dict(zip(truth["batch_sizes"], truth["examples"]))
    least = min(examples.values())
    true_answer = max(b for b, e in examples.items() if e <= EXAMPLES_TOLERANCE * least)
    assert true_answer == rec["batch_size"] or true_answer in rec["indistinguishable"], (true_answer, rec)
    assert record["status"] == "done" and record["stop"]["reason"] in ("target", "candidates", "rounds")
    # every round is a study of one unit of the store: batchlab analyze sees them as one sweep
    assert record["unit"].startswith("nqm/quadratic/sgd [sweep ")


def test_resume_after_sigkill_mid_round_gives_the_same_answer(tmp_path):
    config = _config(tmp_path)
    args = ["nqm/quadratic", "--optimizer", "sgd", "--config", config, "--bracket", "2:64", "--objective", "examples",
            "--target-ratio", "4", "--study-trials", "8", "--no-check", "--workers", "1", "--json"]
    whole = _cli(*args, "--store", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    expected = json.loads(whole.stdout)

    killed_store = str(tmp_path / "killed")
    proc = subprocess.Popen([sys.executable, "-m", "batchlab", "advise", *args[:-1], "--store", killed_store],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(),
                            start_new_session=True)
    try:
        for line in proc.stderr:  # the progress notes
            if line.startswith("round 1"):
                break
        before = _stored_trials(killed_store)
        deadline = time.monotonic() + 300
        while _stored_trials(killed_store) == before and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its workers, mid round 1: some of its trials stored
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert _stored_trials(killed_store) > before
    resumed = _cli(*args, "--store", killed_store)
    assert resumed.returncode == 0, resumed.stderr
    got = json.loads(resumed.stdout)
    assert _decisions(got) == _decisions(expected)
    assert got["stop"] == expected["stop"]
    assert got["rounds"][-1]["b_crit"] == expected["rounds"][-1]["b_crit"]
    assert got["recommendation"]["batch_size"] == expected["recommendation"]["batch_size"]
    assert got["recommendation"]["steps"] == expected["recommendation"]["steps"]
    assert got["spent"]["studies"] == expected["spent"]["studies"]  # no trial lost or duplicated
    again = _cli(*args, "--store", killed_store)  # a finished advice re-run: the same record, nothing trained
    assert again.returncode == 0, again.stderr
    rerun = json.loads(again.stdout)
    assert _decisions(rerun) == _decisions(expected) and rerun["spent"]["studies"] == got["spent"]["studies"]
    assert rerun["recommendation"]["batch_size"] == expected["recommendation"]["batch_size"]


def _stored_trials(store) -> int:
    """Trials published in the store at ``store`` (0 before it exists)."""
    from batchlab.store import Store
    from batchlab.errors import BatchlabError

    try:
        return Store.open(store).table("trials").num_rows
    except BatchlabError:
        return 0


def test_the_budget_is_never_exceeded_by_more_than_one_study(tmp_path):
    budget = 60_000
    advice = _advise(tmp_path / "store", _config(tmp_path), bracket="2:64", budget_examples=budget, target_ratio=1.01)
    record = advice.record
    assert record["stop"]["reason"] == "budget", record["stop"]
    # the config's fixed budget of 400 steps: a study of K trials at B is bounded by K x 400 x B
    largest_study = max(r["trials"] * 400 * max(r["batch_sizes"]) for r in record["rounds"] if r["batch_sizes"])
    assert record["spent"]["total"] <= budget + largest_study
    assert record["spent"]["total"] == sum(record["spent"][k] for k in ("studies", "throughput", "predictors", "check"))


def test_a_goal_no_batch_size_reaches_gives_a_bounded_answer(tmp_path):
    advice = _advise(tmp_path / "store", _config(tmp_path), bracket="4:16", goal=1e-9, check=False)
    record = advice.record
    assert record["stop"]["reason"] == "unreached"
    assert record["recommendation"] is None
    assert any("bounded" in line for line in advice.lines())


@pytest.mark.parametrize("flags, words", [
    (["--budget-examples", "0"], "--budget-examples must be an integer >= 1"),
    (["--objective", "speed"], "unknown objective 'speed'; allowed: time, examples"),
    (["--target-ratio", "1"], "--target-ratio must be a finite number > 1"),
    (["--target-ratio", "0.5"], "--target-ratio must be a finite number > 1"),
    (["--bracket", "64:8"], "--bracket must be LO:HI"),
    (["--budget-examples", "10", "--budget-hours", "1"], "give one budget"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, flags, words):
    store = tmp_path / "store"
    result = _cli("nqm/quadratic", "--optimizer", "sgd", "--store", str(store), "--config", _config(tmp_path), *flags)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], result.stderr
    assert not store.exists()
