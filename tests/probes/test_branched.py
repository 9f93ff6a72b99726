"""The branched critical batch size: exact on the NQM, the measurement's structure and resumability on MNIST."""

import json
import math

import numpy as np
import pytest

from batchlab.errors import BatchlabError
from batchlab.nqm.problem import Problem, power_law
from batchlab.probes import branched
from batchlab.probes.branched import (
    BranchedResult,
    branched_critical_batch_size,
    branched_on_nqm,
    learning_rate_factors,
    warmup_schedule,
)
from batchlab.probes.reference import probe_batches, reference_checkpoints

# ------------------------------------------------------------------------------------------------ exact NQM


def sgd_second_moments(s, h, c, lr, batch, steps, p=0.0):
    """Closed form of preconditioned SGD's per-direction second moment: x' = (1 - z) x - g eps with
    z = lr h^(1-p), g = lr h^-p, Var eps = c / batch, so s' = a s + g^2 c / batch, a = (1 - z)^2 and
    s_n = a^n s + (g^2 c / batch) (1 - a^n) / (1 - a)."""
    z, g = lr * h ** (1 - p), lr * h ** (-p)
    a = (1 - z) ** 2
    an = a**steps
    with np.errstate(divide="ignore", invalid="ignore"):
        geometric = np.where(a == 1, steps, (1 - an) / (1 - a))
    return an * s + g**2 * c / batch * geometric


def true_local_answer(problem, lr, batch, t, multipliers, factors, window, tolerance, p=0.0):
    """The loss after each branch and the local critical batch size, computed from the closed form."""
    h, c, n = problem.curvature, problem.noise, problem.counts
    s_t = sgd_second_moments(problem.initial_second_moment, h, c, lr, batch, t, p)
    losses = {}
    for k in multipliers:
        best = min(
            0.5 * float(n @ (h * sgd_second_moments(s_t, h, c, lr * f, k * batch, window // (k * batch), p)))
            for f in factors(k)
        )
        losses[k] = best
    critical, high = batch, None
    for k in multipliers:
        if losses[k] <= (1 + tolerance) * losses[1]:
            critical = k * batch
        else:
            high = k * batch
            break
    return losses, critical, high


@pytest.mark.parametrize("rule, p", [("linear", 0.0), ("sqrt", 0.0), ("tuned", 0.0), ("linear", 0.5)])
def test_nqm_branches_match_the_closed_form(rule, p):
    problem = power_law(1.0, 1.0, 200)
    lr, batch, window, tol = 0.04, 2, 64 * 2 * 2, 0.01
    ks = [1, 2, 4, 8, 16, 32, 64]
    result = branched_on_nqm(problem, lr, batch, [0, 30, 300, 3000], multipliers=ks, rule=rule, window=window,
                             tolerance=tol, precondition=p)
    assert [c.step for c in result.checkpoints] == [0, 30, 300, 3000]
    criticals = []
    for point in result.checkpoints:
        losses, critical, high = true_local_answer(problem, lr, batch, point.step, ks,
                                                   lambda k: learning_rate_factors(k, rule), window, tol, p)
        got = {b.multiplier: b.loss for b in point.branches}
        assert got == pytest.approx(losses, rel=1e-10)
        assert point.reference_loss == pytest.approx(losses[1], rel=1e-12)
        assert (point.critical_batch_size, point.low, point.high) == (critical, critical, high)
        for b in point.branches:
            assert b.steps == window // (b.multiplier * batch) and b.examples == window  # equal data for every k
            assert b.passed == (b.loss <= (1 + tol) * point.reference_loss)
        criticals.append(point.critical_batch_size)
    # the measurement resolves something: not every checkpoint at the smallest or beyond the largest
    assert any(batch < c for c in criticals) and any(p_.high is not None for p_ in result.checkpoints)


def test_nqm_noise_free_directions_take_large_batches_noisy_ones_do_not():
    # One direction, no noise: linear scaling is as good as the reference until k·lr·h nears instability.
    quiet = Problem(curvature=[1.0], noise=[0.0], counts=[1.0], initial_second_moment=[1.0])
    res = branched_on_nqm(quiet, 0.01, 1, [0], multipliers=[1, 2, 4, 8, 16, 32], window=64)
    assert res.checkpoints[0].critical_batch_size == 32 and res.checkpoints[0].high is None
    # At the noise floor with lots of noise, doubling the batch and the learning rate is not enough
    # to keep up in equal examples once lr·k·h is large: the answer comes out finite.
    noisy = Problem(curvature=[1.0], noise=[100.0], counts=[1.0], initial_second_moment=[1.0])
    res = branched_on_nqm(noisy, 0.1, 1, [0, 2000], multipliers=[1, 2, 4, 8, 16], window=16)
    assert res.checkpoints[1].high is not None


def test_warmup_schedule_is_the_running_maximum():
    def point(step, critical):
        return branched.BranchedCheckpoint(step, 0.1, 1.0, [], critical, critical, None)

    result = BranchedResult([point(0, 8), point(10, 32), point(20, 16), point(40, 32), point(80, 64)], {}, 0)
    assert warmup_schedule(result) == [(0, 8), (10, 32), (80, 64)]


@pytest.mark.parametrize("kwargs, message", [
    ({"multipliers": [1, 4, 2]}, "strictly increasing"),
    ({"multipliers": [2, 2]}, "strictly increasing"),
    ({"multipliers": [0, 1]}, "integers >= 1"),
    ({"multipliers": []}, "at least one"),
    ({"window": 0}, "window must be an integer >= 1"),
    ({"window": 8}, "less than one update at the largest batch size 64"),
    ({"rule": "cubic"}, "unknown learning-rate rule 'cubic'"),
    ({"tolerance": -0.1}, "tolerance must be a number >= 0"),
])
def test_bad_input_is_one_line(kwargs, message):
    problem = power_law(1.0, 1.0, 10)
    args = {"multipliers": [1, 2, 4, 8, 16, 32]} | kwargs
    with pytest.raises(BatchlabError, match=message) as info:
        branched_on_nqm(problem, 0.1, 2, [0], **args)
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------------------------------------ real model

WORKLOAD = "mnist/fc_64_64_64"
SETUP = dict(train_examples=256, probe_examples=64, device="cpu")


def measure(**kwargs):
    args = dict(workload=WORKLOAD, optimizer="sgd", batch_size=16, hyperparameters={"learning_rate": 0.1},
                checkpoints_at=[0, 3], multipliers=[1, 2, 4], window=64) | SETUP | kwargs
    return branched_critical_batch_size(**args)


def test_real_model_structure_and_json():
    result = measure(rule="sqrt")
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert [c["step"] for c in data["checkpoints"]] == [0, 3]
    for point in data["checkpoints"]:
        assert [b["batch_size"] for b in point["branches"]] == [16, 32, 64]
        assert [b["steps"] for b in point["branches"]] == [4, 2, 1]
        assert [b["factor"] for b in point["branches"]] == [1.0, math.sqrt(2), 2.0]
        assert point["branches"][0]["ratio"] == 1.0 and point["branches"][0]["loss"] == point["reference_loss"]
        assert point["interval"]["method"] == "bracket" and point["interval"]["low"] == point["critical_batch_size"]
        assert point["reference_loss"] > 0 and point["learning_rate"] == 0.1
    assert data["settings"]["window"] == 64 and data["settings"]["rule"] == "sqrt"
    assert data["examples_processed"] == 16 * 3 + 2 * 3 * 64 and data["computed"] == 6
    assert data["warmup_schedule"][0][0] == 0


@pytest.mark.parametrize("optimizer, hyper", [("sgd", {"learning_rate": 0.1}),
                                              ("adam", {"learning_rate": 1e-3, "ema_decay": 0.9})])
def test_the_k1_branch_is_the_reference_run_continued(optimizer, hyper):
    result = measure(optimizer=optimizer, hyperparameters=hyper, checkpoints_at=[3], multipliers=[1, 2])
    checkpoints = list(reference_checkpoints(WORKLOAD, optimizer, 16, hyper, [3 + 64 // 16], seed=0,
                                             train_examples=256, device="cpu"))
    probes = probe_batches(WORKLOAD, 64, 16, 0, train_examples=256, data_seed=0)
    assert branched.probe_loss(checkpoints[0].model, probes) == result.checkpoints[0].reference_loss  # bitwise


def test_branches_follow_a_decaying_schedule_in_examples():
    hyper = {"learning_rate": 0.1, "end_learning_rate_factor": 0.1, "learning_rate_decay_steps": 20}
    result = measure(hyperparameters=hyper, checkpoints_at=[5], multipliers=[1, 2], steps=20)
    checkpoints = list(reference_checkpoints(WORKLOAD, "sgd", 16, hyper, [9], seed=0, train_examples=256, steps=20,
                                             device="cpu"))
    probes = probe_batches(WORKLOAD, 64, 16, 0, train_examples=256, data_seed=0)
    assert branched.probe_loss(checkpoints[0].model, probes) == result.checkpoints[0].reference_loss


def test_resume_from_the_cache_recomputes_nothing(tmp_path, monkeypatch):
    calls = []
    original = branched._run_branch

    def counted(task):
        calls.append((task.step, task.multiplier, task.factor))
        return original(task)

    monkeypatch.setattr(branched, "_run_branch", counted)

    class Killed(Exception):
        pass

    def kill_after_two(step, k, factor, loss):
        if len(calls) == 2:
            raise Killed

    with pytest.raises(Killed):
        measure(out=tmp_path, progress=kill_after_two)
    assert len(calls) == 2 and (tmp_path / "branched.json").exists()
    calls.clear()
    resumed = measure(out=tmp_path)
    assert len(calls) == 4 and resumed.computed == 4  # 6 branches, 2 were finished
    calls.clear()
    again = measure(out=tmp_path)
    assert calls == [] and again.computed == 0
    fresh = measure()
    assert again.to_dict()["checkpoints"] == fresh.to_dict()["checkpoints"] == resumed.to_dict()["checkpoints"]
    with pytest.raises(BatchlabError, match="different measurement") as info:
        measure(out=tmp_path, window=128)
    assert "\n" not in str(info.value)


def test_real_model_bad_input():
    for kwargs, message in [({"multipliers": [4, 2]}, "strictly increasing"), ({"window": 0}, "window must be"),
                            ({"rule": "square"}, "unknown learning-rate rule"), ({"workers": 0}, "workers must be"),
                            ({"multipliers": [1, 32], "window": 512}, "exceeds the 256 training examples")]:
        with pytest.raises(BatchlabError, match=message) as info:
            measure(**kwargs)
        assert "\n" not in str(info.value)


def test_seed_spread_interval_arithmetic():
    losses = {(1, 1.0): 1.0, (2, 2.0): 1.005, (4, 4.0): 1.02, (8, 8.0): 1.05}
    bracket = branched._summarize(0, 0.1, 10, [1, 2, 4, 8], 80, 0.01, losses)
    assert (bracket.critical_batch_size, bracket.low, bracket.high, bracket.method) == (20, 20, 40, "bracket")
    spread = branched._summarize(0, 0.1, 10, [1, 2, 4, 8], 80, 0.01, losses, [1.0 + 0.006, 1.0 - 0.006])
    sigma = np.std([1.0, 1.006, 0.994], ddof=1)  # 0.006: thresholds 1.01 -/+ 0.012
    assert spread.reference_sigma == pytest.approx(sigma) and spread.method == "seed_spread"
    assert (spread.critical_batch_size, spread.low, spread.high) == (20, 10, 80)  # 1.005 > 0.998; 1.02 <= 1.022
    quiet = branched._summarize(0, 0.1, 10, [1, 2, 4, 8], 80, 0.01, losses, [1.0])
    assert (quiet.low, quiet.high, quiet.reference_sigma) == (20, 40, 0.0)  # no spread: the bracket


def test_a_diverged_reference_branch_is_one_line_not_a_critical_batch_size():
    # before: critical = B with bracket [B, B] while every finite k > 1 branch "passed" with ratio 0
    losses = {(1, 1.0): math.inf, (2, 2.0): 0.5, (4, 4.0): 0.6}
    with pytest.raises(BatchlabError, match=r"reference branch \(k = 1, B = 10\) at step 3 .*\(diverged\)"):
        branched._summarize(3, 0.1, 10, [1, 2, 4], 40, 0.01, losses)


def test_real_model_noise_repeats(tmp_path):
    result = measure(checkpoints_at=[3], multipliers=[1, 2], noise_repeats=2, out=tmp_path)
    point = result.checkpoints[0]
    assert point.method == "seed_spread" and len(point.reference_repeats) == 2 and point.reference_sigma > 0
    assert point.reference_loss not in point.reference_repeats  # other batch orders
    assert point.low <= point.critical_batch_size and result.computed == 4
    assert result.examples_processed == 16 * 3 + 4 * 64
    again = measure(checkpoints_at=[3], multipliers=[1, 2], noise_repeats=2, out=tmp_path)
    assert again.computed == 0 and again.to_dict()["checkpoints"] == result.to_dict()["checkpoints"]


@pytest.mark.slow
def test_workers_give_the_same_result():
    one = measure(checkpoints_at=[2], multipliers=[1, 2])
    two = measure(checkpoints_at=[2], multipliers=[1, 2], workers=2)
    assert one.to_dict()["checkpoints"] == two.to_dict()["checkpoints"]
