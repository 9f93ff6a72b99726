import numpy as np
import pytest

from batchlab.errors import BatchlabError
from batchlab.nqm.dynamics import Algorithm, apply, map_power, moment_recurrence
from batchlab.nqm.problem import zhang2019_binned
from batchlab.nqm.schedules import (
    Segment,
    _pwc_loss_and_gradient,
    batch_size_segments,
    bayes_lower_bound_steps,
    first_passage_scheduled,
    linear_decay_segments,
    optimal_pwc_sgd,
    parse_schedule,
    scheduled_loss_at_step,
    warmup_cosine_segments,
)
from batchlab.nqm.steps import first_passage_candidates
from batchlab.nqm.tuning import tune

PROBLEM = zhang2019_binned()


def test_pwc_loss_and_adjoint_gradient_are_exact():
    h, c = PROBLEM.curvature, PROBLEM.noise
    log_lr = np.log([0.8, 0.2, 0.03])
    args = (250, h, h**-1.0, c / 16, np.ones(h.size), PROBLEM.loss_weights)
    loss, grad = _pwc_loss_and_gradient(log_lr, *args)
    u = None
    for lr in np.exp(log_lr):
        rec = moment_recurrence(PROBLEM, Algorithm("sgd"), lr)
        u = rec.initial_state(1) if u is None else u
        u = apply(*map_power(rec, 250), u, 1 / 16)
    assert loss == pytest.approx(float(rec.loss(u)[0, 0]), rel=1e-12)
    eps = 1e-6
    numeric = [(_pwc_loss_and_gradient(log_lr + eps * e, *args)[0] - _pwc_loss_and_gradient(log_lr - eps * e, *args)[0]) / (2 * eps)
               for e in np.eye(3)]
    assert np.allclose(grad, numeric, rtol=1e-5)


def test_optimal_pwc_beats_constant_and_respects_bounds():
    constant = tune(PROBLEM, Algorithm("sgd"), [64], 0.01, grid="official")[0]
    result = optimal_pwc_sgd(PROBLEM, 0.0, 64, 0.01, 10, upper_k=-(-constant.result.steps // 10))
    assert result.reached and result.steps % 10 == 0
    assert result.steps < constant.result.steps
    assert result.steps >= bayes_lower_bound_steps(PROBLEM, 0.01, 64)
    assert max(result.learning_rates) <= 2 / (1 + 1e-4 + 1e-4) + 1e-9


def test_bayes_bound_is_below_information_bound_and_close():
    bound = bayes_lower_bound_steps(PROBLEM, 0.01, 64)
    assert 0.9 * 10_000 / (2 * 0.01 * 64) < bound < 10_000 / (2 * 0.01 * 64)


def test_constant_segments_equal_constant_schedule():
    lrs = np.array([0.01, 0.1, 0.5])
    plain = first_passage_candidates(moment_recurrence(PROBLEM, Algorithm("sgd"), lrs), [64], 0.01, 10**6)[:, 0]
    split = first_passage_scheduled(PROBLEM, Algorithm("sgd"), lrs, [Segment(777), Segment(0)], 0.01, 10**6, batch_size=64)
    assert np.array_equal(plain, split)


def test_batch_size_schedule_and_linear_decay_losses():
    # B(t): 100 steps at B = 16, then B = 256 forever; compare with manual chaining.
    segments = batch_size_segments([(100, 16), (1, 256)])
    loss = scheduled_loss_at_step(PROBLEM, Algorithm("sgd"), 0.3, segments, 400)
    rec = moment_recurrence(PROBLEM, Algorithm("sgd"), 0.3)
    u = apply(*map_power(rec, 100), rec.initial_state(1), 1 / 16)
    u = apply(*map_power(rec, 300), u, 1 / 256)
    assert loss == pytest.approx(float(rec.loss(u)[0, 0]), rel=1e-12)
    # a short linear decay is represented step by step (exact)
    segs = linear_decay_segments(50, 0.1)
    assert len(segs) == 51 and segs[0].lr_factor == 1.0 and segs[-1].lr_factor == pytest.approx(0.1)
    assert len(linear_decay_segments(10**6, 0.0, max_segments=64)) == 65
    cos = warmup_cosine_segments(10, 100, 0.0)
    assert cos[0].lr_factor == pytest.approx(0.1) and max(s.lr_factor for s in cos) == pytest.approx(1.0)


def test_schedule_parsing_and_errors():
    assert parse_schedule("pwc:10") == ("pwc", 10)
    assert parse_schedule("linear") == ("linear", None)
    for bad in ("pwc:0", "pwc:x", "step"):
        with pytest.raises(BatchlabError):
            parse_schedule(bad)
    with pytest.raises(BatchlabError):
        linear_decay_segments(0)
    with pytest.raises(BatchlabError):
        batch_size_segments([(10, 0)])
