"""The known-answer workload nqm/quadratic: its data, its exact metric, its curve against the exact NQM,
a sweep of it, and nqm_truth (the answer advise is tested against).

Tolerances. The realised excess loss of one trial scatters about its expectation with the NQM's own
sd (``excess_loss_sd``: every theta_i is Gaussian, so Var L = 1/2 sum h_i^2 E[theta_i^2]^2, a relative
sd of sqrt(2 / d_eff), 5-10% here); the mean of K seeds is compared with the exact expectation of the
finite training set (``finite_set_expected_excess_loss``) within 4.5 of its sd / sqrt(K) at every
evaluated step (the steps are correlated, so this is a loose joint bound, failing by chance about
once in 10^4 runs), plus float32 rounding (1e-4 relative).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from batchlab.errors import BatchlabError
from batchlab.workloads import get_workload
from batchlab.workloads import quadratic as q


@pytest.fixture(scope="module")
def workload():
    return get_workload(q.NAME)


@pytest.fixture(scope="module")
def data(workload):
    return workload.load_data()


def test_registered_with_its_settings(workload):
    assert workload.name == "nqm/quadratic" and workload.metric == "val/excess_loss" and not workload.maximize
    assert workload.goal == q.GOAL and workload.default_batch_size == q.DEFAULT_BATCH_SIZE
    assert workload.num_parameters() == q.DIMENSION
    assert workload.search_spaces["sgd"]["learning_rate"]["scale"] == "LOG_SCALE"
    assert q.nqm_problem().dimension == q.DIMENSION
    assert q.nqm_problem().initial_loss() == pytest.approx(0.5 * q.curvatures().sum())


def test_training_set_is_centred_and_whitened_exactly(data):
    x, y = data.train.batch(torch.arange(q.TRAIN_EXAMPLES))
    assert tuple(x.shape) == (q.TRAIN_EXAMPLES, q.DIMENSION) and x.dtype == torch.float32
    h = torch.from_numpy(q.curvatures())
    xd = x.double()
    assert xd.mean(0).abs().max() < 1e-5 * xd.std(0).max()
    # covariance against H^-1 along random directions (v^T S v = v^T H^-1 v), whitened by sqrt(h)
    v = torch.randn(q.DIMENSION, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    z = xd * h.sqrt()  # whitened: covariance I
    projected = z @ v
    assert torch.allclose(projected.T @ projected / len(z), v.T @ v, rtol=1e-5, atol=1e-5 * float((v * v).sum(0).max()))
    assert torch.allclose(y.double(), 0.5 * xd.square() @ h, rtol=1e-5)  # targets = l_j(0)
    vx, vy = data.val.batch(torch.arange(len(data.val)))
    assert len(data.val) == 1 and torch.all(vx == 0) and torch.all(vy == 0)


def test_val_metric_is_the_closed_form_and_the_training_loss_an_unbiased_estimate(workload, data):
    model = workload.build_model(seed=3)
    theta = model.theta.detach().double()
    exact = 0.5 * float((torch.from_numpy(q.curvatures()) * theta.square()).sum())
    assert workload.evaluate(model, data.val, split="val")["val/excess_loss"] == pytest.approx(exact, rel=1e-6)
    x, y = data.train.batch(torch.arange(q.TRAIN_EXAMPLES))
    whole = float(workload.loss(model(x), y).detach())  # over the whole (centred) set: exactly the excess loss
    assert whole == pytest.approx(exact, rel=1e-3)
    # the gradient of the batch loss is h (theta - mean x): the NQM's gradient plus noise
    model.zero_grad()
    workload.loss(model(x[:8]), y[:8]).backward()
    expected = torch.from_numpy(q.curvatures()).float() * (model.theta.detach() - x[:8].mean(0))
    assert torch.allclose(model.theta.grad, expected, rtol=1e-4, atol=1e-6)


def _curves(workload, lr, batch_size, steps, seeds):
    from batchlab.train import TrialSpec, run_trial

    rows = {}
    for seed in seeds:
        result = run_trial(TrialSpec(workload=workload, optimizer="sgd", batch_size=batch_size,
                                     hyperparameters={"learning_rate": lr}, steps=steps, seed=seed,
                                     stop_at_goal=False, evaluation_steps=list(range(0, steps + 1, max(steps // 10, 1)))))
        for row in result.measurements:
            if "val/excess_loss" in row:
                rows.setdefault(int(row["step"]), []).append(row["val/excess_loss"])
    at = sorted(s for s, v in rows.items() if len(v) == len(seeds))
    return np.array(at), np.array([np.mean(rows[s]) for s in at])


@pytest.mark.parametrize("lr,batch_size,steps", [(1.0, 16, 60), (0.15, 1, 300)])
def test_curve_follows_the_exact_nqm(workload, lr, batch_size, steps):
    seeds = (0, 1, 2)
    at, measured = _curves(workload, lr, batch_size, steps, seeds)
    assert at.size >= 8 and at[0] == 0
    finite = q.finite_set_expected_excess_loss(lr, batch_size, at)
    nqm = q.nqm_expected_excess_loss(lr, batch_size, at)
    # sampling without replacement lowers the noise by about examples seen / N: 1-2% by these steps
    assert np.allclose(finite, nqm, rtol=0.02) and np.all(finite <= nqm * (1 + 1e-9))
    sd = q.excess_loss_sd(lr, batch_size, at)
    assert np.all(sd / nqm < 0.3)  # high d: the realised loss concentrates
    z = (measured - finite) / np.sqrt((sd / math.sqrt(len(seeds))) ** 2 + (1e-4 * finite) ** 2)
    assert np.max(np.abs(z)) < 4.5, (at.tolist(), measured.tolist(), finite.tolist())
    # ... and the comparison can fail: twice the per-example noise is far outside these bounds
    doubled = q.nqm_expected_excess_loss(lr, batch_size / 2, at)
    z_wrong = (measured - doubled) / np.sqrt((sd / math.sqrt(len(seeds))) ** 2 + (1e-4 * finite) ** 2)
    assert np.max(np.abs(z_wrong)) > 4.5


def test_sweep_reaches_the_goal_near_the_exact_steps(tmp_path):
    from batchlab.sweep.config import parse_sweep_config
    from batchlab.sweep.executors import InlineExecutor
    from batchlab.sweep.runner import prepare_sweep, run_sweep

    config = parse_sweep_config({"workloads": [q.NAME], "optimizers": ["sgd"], "batch_sizes": [4, 64, 1024],
                                 "trials": 2, "seed": 0})
    summary = run_sweep(prepare_sweep(config, str(tmp_path / "store")),
                        executor_factory=lambda fn, **kw: InlineExecutor(fn))
    results = {r.batch_size: r for r in summary.results[f"{q.NAME}/sgd"]}
    assert sorted(results) == [4, 64, 1024] and all(r.steps is not None for r in results.values())
    steps = [results[b].steps for b in (4, 64, 1024)]
    assert steps[0] > max(steps[1], steps[2])  # (two trials: the large batch sizes' order is the search's luck)
    # each best trial against the exact NQM at the learning rate it drew: within the trials' scatter
    truth = q.nqm_truth([4, 64, 1024], learning_rates={b: [r.parameters["learning_rate"]] for b, r in results.items()})
    for measured, expected in zip(steps, truth["steps"]):
        assert expected is not None and abs(math.log(measured / expected)) < 0.5


def test_nqm_truth_is_a_known_answer():
    sizes = [2**k for k in range(13)]
    truth = q.nqm_truth(sizes)
    steps = truth["steps"]
    assert all(s is not None for s in steps)
    assert all(a >= b for a, b in zip(steps, steps[1:])) and steps[0] > 10 * steps[-1]
    assert math.isfinite(truth["b_crit"]) and 1 < truth["b_crit"] < 4096
    assert truth["b_crit"] == pytest.approx(truth["e_min"] / truth["s_min"])
    assert truth["examples"] == [s * b for s, b in zip(steps, sizes)]
    # the registered search space brackets the optimal learning rates at every batch size 1..4096
    space = q.SEARCH_SPACES["sgd"]["learning_rate"]
    assert all(space["min_value"] < lr < space["max_value"] for lr in truth["learning_rates"])
    # tuning is never worse than a few fixed rates; a restricted search is never better
    fixed = q.nqm_truth(sizes, learning_rates=[0.1, 0.5, 1.0, 1.5])
    assert all(f >= s for f, s in zip(fixed["steps"], steps))
    # at the goal the finite training set changes the expected loss by under 1%
    for b, s, lr in zip(sizes[::4], steps[::4], truth["learning_rates"][::4]):
        finite = q.finite_set_expected_excess_loss(lr, b, [s])
        assert finite[0] == pytest.approx(q.nqm_expected_excess_loss(lr, b, [s])[0], rel=0.01)


def test_nqm_truth_refuses_bad_input_in_one_line():
    with pytest.raises(BatchlabError, match="allowed: sgd, momentum"):
        q.nqm_truth([16], optimizer="adam")
    with pytest.raises(BatchlabError, match="batch sizes must be numbers >= 1"):
        q.nqm_truth([0])
    with pytest.raises(BatchlabError, match="no rates for batch size 64"):
        q.nqm_truth([16, 64], learning_rates={16: [0.5]})
    with pytest.raises(BatchlabError, match="learning_rates must be finite numbers > 0"):
        q.nqm_truth([16], learning_rates=[-1.0])
