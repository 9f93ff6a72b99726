"""Vectorized trials against sequential ``run_trial``: one step and one evaluation agree within
floating-point rounding on every machine; whole trials are equal to the bit where the exactness
self-check finds the vectorized path identical on this machine (``vectorized_identical``), and only
there does ``vectorize = "auto"`` use it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

import batchlab.workloads.registry as registry
from batchlab.errors import BatchlabError
from batchlab.sweep.fused_mlp import mlp_layers
from batchlab.sweep.vectorize_choice import vectorization_costs, vectorization_pays, vectorized_identical
from batchlab.sweep.vectorized import (StackedTrials, measure_stacked, run_trials_vectorized, shared_order_seed,
                                       vectorization_obstacle)
from batchlab.train import TrialSpec, prepare_trial, run_trial
from batchlab.train.evaluation import measure

POINTS = {
    "sgd": [{"learning_rate": 0.05}, {"learning_rate": 0.3, "learning_rate_decay_steps": 6, "end_learning_rate_factor": 0.1},
            {"learning_rate": 40.0}],  # the last one diverges
    "momentum": [{"learning_rate": 0.02, "momentum": 0.9}, {"learning_rate": 0.1, "momentum": 0.5, "warmup_steps": 3}],
    "nesterov": [{"learning_rate": 0.02, "momentum": 0.9, "weight_decay": 1e-3}, {"learning_rate": 0.05, "momentum": 0.7}],
    "adam": [{"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.99}, {"learning_rate": 3e-3, "beta1": 0.5, "epsilon": 1e-6}],
}


def _specs(optimizer, stop_at_goal=False, steps=12, data_order_seed=None):
    return [
        TrialSpec(workload="mnist/fc_64_64_64", optimizer=optimizer, batch_size=16, hyperparameters=h, steps=steps,
                  train_examples=512, seed=10 + i, data_seed=1, stop_at_goal=stop_at_goal,
                  evaluation_steps=[1, 4, 8, steps], data_order_seed=data_order_seed)
        for i, h in enumerate(POINTS[optimizer])
    ]


def _assert_evaluations_agree(a: dict, b: dict) -> None:
    """Two evaluation rows of the same model by two computation paths (stacked against one model, or
    after the same single step) agree within rounding: float32 products summed in another order (a
    batched kernel against ``torch.nn.Linear``'s, another instruction set or thread count) differ in
    the last bits of each logit, so a mean cross entropy agrees to about 1e-6 relative, and an example
    whose two largest logits tie within that rounding may flip its class (at most a few of the
    split's examples)."""
    assert a.keys() == b.keys()
    for name, value in a.items():
        if "classification" in name:
            assert abs(value - b[name]) <= 2.5e-3, (name, a, b)
        else:
            assert b[name] == pytest.approx(value, rel=1e-5, abs=1e-7), (name, a, b)


def _assert_like_sequential(sequential, vectorized, identical: bool) -> None:
    """Vectorized whole trials against sequential ones of the same specs. ``identical`` (the exactness
    self-check found the vectorized path bit-identical here): equal to the bit, every measurement.
    Else only what the shared loop fixes (the measured steps, the statuses and step counts of these
    trials: none near a goal or the divergence bound) and their first evaluation (one step from the
    same initial model) within rounding: training amplifies a last-bit difference step after step, so
    whole trials cannot be compared within any fixed tolerance."""
    for s, v in zip(sequential, vectorized, strict=True):
        assert (v.status, v.steps, v.resolution) == (s.status, s.steps, s.resolution)
        assert [m["step"] for m in v.measurements] == [m["step"] for m in s.measurements]
        if identical:
            assert (v.steps_to_goal, v.steps_lower, v.measurements) == (s.steps_to_goal, s.steps_lower, s.measurements)
        else:
            _assert_evaluations_agree(s.measurements[0], v.measurements[0])


def _fresh_state(stack: StackedTrials) -> tuple[dict, dict, dict]:
    return ({n: v.clone() for n, v in stack.params.items()}, {n: v.clone() for n, v in stack.buffers.items()},
            {s: {n: v.clone() for n, v in d.items()} for s, d in stack.opt_state.items()})


@pytest.mark.parametrize("order", [None, 7], ids=["own-orders", "shared-order"])
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "nesterov", "adam"])
def test_one_vectorized_step_equals_the_sequential_step_within_rounding(optimizer, order):
    # the fused MLP path: own orders (K stacked batches) or a shared order (one batch for all K, the
    # first layer of all K one GEMM), one step from the same initial models as each trial's own
    # torch optimizer step on its own batch
    specs = _specs(optimizer, data_order_seed=order)
    prepared = [prepare_trial(spec) for spec in specs]
    stack = StackedTrials(prepared)
    assert (stack.shared, stack.fused) == (order is not None, True)
    params, buffers, opt_state = _fresh_state(stack)
    gradients: list = []
    losses = stack.advance(params, buffers, opt_state, list(range(len(specs))), 0, gradients)
    for i, p in enumerate(prepared):
        loss = p.algorithm.step(*stack.batch(stack.samplers[i].indices(0)))
        # float32 products and sums in another order (batched kernels against torch.nn.Linear's; the
        # kernel depends on the CPU's instruction set, the thread count and the sizes): each value
        # within a few hundred float32 ulps (2^-24 each) of the largest magnitude in its tensor
        assert losses[i] == pytest.approx(loss, rel=1e-5)
        lr = p.algorithm.hyperparameters["learning_rate"]
        for name, param in p.model.named_parameters():
            grad = gradients[0][name][i]
            torch.testing.assert_close(grad, param.grad, rtol=1e-4, atol=1e-5 * float(param.grad.abs().max()))
            # the update: lr x (a function of the gradient). SGD's, momentum's and Nesterov's first step is
            # lr g (Nesterov (1 + mu) lr g <= 2 lr g), so the gradients' rounding above (within about
            # 1.1e-4 of the largest gradient) moves a parameter by at most 2 lr 1.25e-4 max|g|; Adam's
            # first step is lr g / (|g| + eps), which moves by up to lr delta / eps for a gradient
            # rounding delta, so it is compared within 5% of lr
            moved = 0.05 * lr if optimizer == "adam" else 2 * lr * 1.25e-4 * float(param.grad.abs().max())
            torch.testing.assert_close(params[name][i], param.detach(), rtol=1e-5, atol=moved)
    # one evaluation of the K stepped models together against each alone
    splits = prepared[0].eval_splits
    for row, p in zip(stack.measure_rows(params, buffers, splits), prepared):
        _assert_evaluations_agree(measure(p.workload, p.model, splits), row)


@pytest.mark.parametrize("order", [None, 7], ids=["own-orders", "shared-order"])
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "nesterov", "adam"])
def test_vectorized_equals_sequential(optimizer, order):
    # whole trials: to the bit where the exactness self-check finds the path identical on this machine
    # (each trial runs its own operations: the first layer's GEMM columns, the batched layers' backward
    # products, one loss per trial, torch.optim's roundings), else the loop's bookkeeping and the first
    # evaluation within rounding
    specs = _specs(optimizer, data_order_seed=order)
    vectorized = run_trials_vectorized(specs)
    _assert_like_sequential([run_trial(spec) for spec in specs], vectorized, vectorized_identical(specs))
    if optimizer == "sgd":
        assert vectorized[2].status == "INFEASIBLE" and vectorized[0].status == "COMPLETE"


def test_stop_at_goal_and_group_size_do_not_change_a_trial(monkeypatch):
    # A goal-beating trial stops early in both paths (its goal metric clears the goal by tens of
    # examples at steps 4 and 8, far beyond rounding); a trial's numbers do not depend on its group
    # where the self-check finds every stack size (1 to 3) bit-identical to the trial alone.
    specs = _specs("sgd", stop_at_goal=True)
    for spec in specs:
        spec.hyperparameters = {"learning_rate": 0.2}
    specs[1].hyperparameters = {"learning_rate": 1e-4}
    workload = registry.WORKLOADS["mnist/fc_64_64_64"]
    monkeypatch.setitem(registry.WORKLOADS, workload.name, replace(workload, goal=0.865))  # reached at step 8
    together = run_trials_vectorized(specs)
    alone = run_trials_vectorized([specs[0]])[0]
    sequential = [run_trial(spec) for spec in specs]
    for result in (together[0], alone, sequential[0]):
        assert result.steps_to_goal is not None and result.steps == result.steps_to_goal == 8
        assert result.status == "STOPPED_AT_GOAL" and result.steps_lower == 4
    assert together[1].steps == 12 and together[1].status == "COMPLETE" and together[1].steps_lower is None
    identical = vectorized_identical(specs)
    _assert_like_sequential(sequential, together, identical)
    _assert_like_sequential(sequential[:1], [alone], identical)
    if identical:
        assert alone.measurements == together[0].measurements


def test_what_cannot_be_vectorized_is_named():
    specs = _specs("momentum")
    specs[1].batch_size = 32
    assert vectorization_obstacle(specs) == "trials differ in batch_size"
    kfac = [TrialSpec(workload="mnist/fc_64_64_64", optimizer="kfac", batch_size=16, hyperparameters={})]
    assert "not vectorized" in vectorization_obstacle(kfac)
    ema = _specs("sgd")
    ema[0].hyperparameters = {"learning_rate": 0.1, "ema_decay": 0.9}
    with pytest.raises(BatchlabError, match="ema_decay is not vectorized"):
        run_trials_vectorized(ema)


@pytest.mark.parametrize("order", [None, 3], ids=["own-orders", "shared-order"])
@pytest.mark.parametrize("refine", ["replay", "dense"])
def test_default_schedule_goal_steps_match_sequential(monkeypatch, refine, order):
    # the default schedule: every metric at the full steps (measured for all K at once), the goal
    # split alone at the resolution steps: all of them (dense), or those of the bracket where the goal
    # is first met (replay, from the stacked snapshot: with a shared order, on the shared batches)
    specs = _specs("momentum", steps=60, stop_at_goal=refine == "replay", data_order_seed=order)
    for spec in specs:
        spec.evaluation_steps, spec.evaluations, spec.resolution, spec.refine = None, 4, 0.2, refine
    specs.append(replace(specs[0], hyperparameters={"learning_rate": 0.05, "momentum": 0.9}, seed=30))
    workload = registry.WORKLOADS["mnist/fc_64_64_64"]
    monkeypatch.setitem(registry.WORKLOADS, workload.name, replace(workload, goal=0.8))
    vectorized = run_trials_vectorized(specs)
    identical = vectorized_identical(specs)
    goal_only = 0
    for spec, result in zip(specs, vectorized):
        sequential = run_trial(spec)
        if identical:  # the same goal steps, brackets and measurements, to the bit
            assert (result.status, result.steps, result.steps_to_goal, result.steps_lower, result.measurements) == (
                sequential.status, sequential.steps, sequential.steps_to_goal, sequential.steps_lower,
                sequential.measurements)
        else:  # where a trial first meets the goal may move with rounding: the first evaluation
            _assert_evaluations_agree(sequential.measurements[0], result.measurements[0])
        goal_only += sum("train/cross_entropy_error" not in m for m in result.measurements)
        if refine == "replay" and result.steps_to_goal is not None:
            assert result.status == "STOPPED_AT_GOAL" and result.steps == result.steps_to_goal
    assert goal_only > 0
    assert any(r.steps_to_goal not in {1, 2, 3, 5, 8, 12, 15, 30, 45, 60} for r in vectorized if r.steps_to_goal)
    different = _specs("momentum")
    different[1].resolution = 0.1
    assert vectorization_obstacle(different) == "trials differ in resolution"


def test_vectorized_updates_come_from_the_optimizer_registry():
    import batchlab.sweep.vectorized as vectorized
    from batchlab.optim import get_optimizer, vectorized_optimizer_names

    names = vectorized_optimizer_names()
    assert not hasattr(vectorized, "VECTORIZED_OPTIMIZERS")  # derived from the registry, never a list of its own
    assert {"sgd", "momentum", "nesterov", "adam"} <= set(names)
    assert all(get_optimizer(name).vectorized is not None for name in names)
    assert not hasattr(vectorized, "_update")
    lamb = [TrialSpec(workload="mnist/fc_64_64_64", optimizer="lamb", batch_size=16, hyperparameters={})]
    assert vectorization_obstacle(lamb).startswith("optimizer 'lamb' is not vectorized (vectorized: ")
    devices = _specs("sgd")
    devices[1].device = "cpu"
    assert vectorization_obstacle(devices) == "trials differ in device"


def _toy_specs(make_model, seeds=(1, 2)):
    from batchlab.workloads import Workload, regression

    def data():
        x = torch.randn(300, 4, generator=torch.Generator().manual_seed(0))
        return {"train": (x[:200], x[:200].sum(1)), "val": (x[200:], x[200:].sum(1))}

    workload = Workload(name="toy/vmap", make_model=make_model, data=data, task=regression(), goal=0.05)
    return [TrialSpec(workload=workload, optimizer="sgd", batch_size=16, hyperparameters={"learning_rate": 0.05},
                      steps=6, seed=seed, evaluation_steps=[3, 6], stop_at_goal=False) for seed in seeds]


def _dropout():
    return nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.Linear(8, 1), nn.Flatten(0))


def _batch_norm():
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1), nn.Flatten(0))


class _Projected(nn.Module):
    """A fixed random projection, drawn from each trial's seed, and a linear head."""

    def __init__(self):
        super().__init__()
        self.register_buffer("projection", torch.randn(4, 4))
        self.head = nn.Sequential(nn.Linear(4, 1), nn.Flatten(0))

    def forward(self, x):
        return self.head(x @ self.projection)


def _random_buffer():
    return _Projected()


def _class_per_trial():
    class Local(nn.Linear):  # a new class at every call of make_model
        pass

    return Local(4, 1)


@pytest.mark.parametrize(("make_model", "reason"), [
    (_dropout, "does not run under torch.func.vmap \\(vmap: called random operation"),
    (_batch_norm, "training changes their model's buffers \\(1.running_mean, 1.running_var"),
    (_random_buffer, "their models differ in the buffer 'projection'"),
    (_class_per_trial, "stack_module_state: Expected all models to be of the same class"),
])
def test_models_that_cannot_be_vectorized_are_refused_before_training(make_model, reason):
    from batchlab.sweep.vectorized import NotVectorizable

    with pytest.raises(NotVectorizable, match="^cannot vectorize these trials: .*" + reason) as err:
        run_trials_vectorized(_toy_specs(make_model))
    assert "\n" not in str(err.value)
    assert isinstance(err.value, BatchlabError)
    run_trials_vectorized(_toy_specs(_random_buffer, seeds=(3,)))  # one trial: its own buffer, fine


def test_shared_order_seed_needs_one_seed_for_all():
    specs = _specs("sgd", data_order_seed=4)
    assert shared_order_seed(specs) == 4
    specs[1] = replace(specs[1], data_order_seed=5)
    assert shared_order_seed(specs) is None
    assert shared_order_seed(_specs("sgd")) is None
    assert vectorization_obstacle(specs) is None  # differing orders still vectorize (stacked batches)


def test_mlp_layers_recognises_exactly_linear_relu_stacks():
    from batchlab.workloads import get_workload

    fc = mlp_layers(get_workload("mnist/fc_64_64_64").build_model(seed=0))
    assert fc.flatten and fc.layers == (("1.weight", "1.bias"), ("3.weight", "3.bias"), ("5.weight", "5.bias"),
                                        ("7.weight", "7.bias"))
    no_bias = mlp_layers(nn.Sequential(nn.Linear(4, 3, bias=False), nn.ReLU(), nn.Linear(3, 2)))
    assert not no_bias.flatten and no_bias.layers == (("0.weight", None), ("2.weight", "2.bias"))
    for model in (_dropout(), _batch_norm(), nn.Sequential(nn.Linear(4, 3), nn.ReLU()),
                  nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 1)), nn.Sequential(nn.Flatten(0), nn.Linear(4, 1)),
                  nn.Sequential(), _Projected()):
        assert mlp_layers(model) is None


def test_fused_gradients_equal_the_per_trial_gradients():
    # the fused step (one GEMM for the first layer of all K, autograd of the summed losses) gives
    # each trial the gradient and loss of its own model on the shared batch
    specs = _specs("momentum", data_order_seed=2)
    specs[0].hyperparameters = {**specs[0].hyperparameters, "label_smoothing": 0.1}
    specs[1].hyperparameters = {**specs[1].hyperparameters, "label_smoothing": 0.1}
    prepared = [prepare_trial(spec) for spec in specs]
    stack = StackedTrials(prepared)
    assert stack.fused
    x, y = stack.batch_of([0, 1], 0)
    assert x.shape == (16, 1, 28, 28)
    grads, losses = stack.grad_and_loss(stack.params, stack.buffers, x, y)
    identical = vectorized_identical(specs)  # the self-check compares exactly these gradients
    for r, p in enumerate(prepared):
        model = p.model
        model.zero_grad()
        loss = p.workload.loss(model(x), y, label_smoothing=0.1)
        loss.backward()
        # float32 products summed in another order: within rounding (see the single-step test)
        assert losses[r].item() == pytest.approx(loss.item(), rel=1e-6)
        for name, param in model.named_parameters():
            torch.testing.assert_close(grads[name][r], param.grad, rtol=1e-5, atol=1e-7)
            if identical:
                assert torch.equal(grads[name][r], param.grad), name  # the same products, same kernels: to the bit


def test_stacked_evaluation_equals_measure():
    specs = _specs("adam", data_order_seed=1)
    prepared = [prepare_trial(spec) for spec in specs]
    stack = StackedTrials(prepared)
    splits = prepared[0].eval_splits
    assert set(splits) == {"train", "val"}
    together = stack.measure_rows(stack.params, stack.buffers, splits)
    assert len(together) == len(specs)
    for row, p in zip(together, prepared):
        alone = measure(p.workload, p.model, splits)
        assert row.keys() == alone.keys()
        for name, value in alone.items():
            assert row[name] == pytest.approx(value, rel=1e-6, abs=1e-9), name
    # the vmap path (a model that is not an MLP) on a regression task, with a buffer
    toy = [prepare_trial(spec) for spec in _toy_specs(_random_buffer, seeds=(4,))] * 2
    toy_stack = StackedTrials(toy)
    assert not toy_stack.fused
    rows = toy_stack.measure_rows(toy_stack.params, toy_stack.buffers, toy[0].eval_splits)
    alone = measure(toy[0].workload, toy[0].model, toy[0].eval_splits)
    for row in rows:
        assert row.keys() == alone.keys() == {"train/mse", "train/mae", "val/mse", "val/mae"}
        for name, value in alone.items():
            assert row[name] == pytest.approx(value, rel=1e-6), name


def test_measure_stacked_streams_the_workloads_batches():
    # per-trial sums of each evaluation batch, the workload's subset cap and batch size
    from batchlab.workloads import Workload, regression

    x = torch.randn(50, 3, generator=torch.Generator().manual_seed(0))
    workload = Workload(name="toy/stack", make_model=lambda: nn.Linear(3, 1), data=lambda: {}, task=regression(),
                        goal=0.1, eval_examples={"val": 30}, eval_batch_size=7)
    weights = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    batches = []

    def forward(xb):
        batches.append(len(xb))
        return (weights @ xb.t()).unsqueeze(-1)  # (K=2, N, 1)

    target = x.sum(1)
    rows = measure_stacked(workload, forward, {"val": (x, target)})
    assert batches == [7, 7, 7, 7, 2]
    from batchlab.workloads.metrics import fixed_subset

    kept = fixed_subset(50, 30)
    for k, row in enumerate(rows):
        error = (x[kept] @ weights[k] - target[kept]).double()
        assert row["val/mse"] == pytest.approx(error.square().mean().item(), rel=1e-6)
        assert row["val/mae"] == pytest.approx(error.abs().mean().item(), rel=1e-6)


def test_cost_rule_measures_and_leaves_the_trials_alone(monkeypatch):
    import copy

    import batchlab.sweep.vectorize_choice as choice

    specs = _specs("momentum", data_order_seed=5)
    before = copy.deepcopy(specs)
    first_run = run_trials_vectorized(specs)
    rng = torch.get_rng_state()
    monkeypatch.setattr(choice, "_PAYS", {})
    cost = vectorization_costs(specs)
    assert cost.sequential > 0 and cost.vectorized > 0 and cost.ratio == cost.sequential / cost.vectorized
    pays = vectorization_pays(specs)
    assert isinstance(pays, bool)
    assert specs == before and torch.equal(torch.get_rng_state(), rng)
    again = run_trials_vectorized(specs)
    assert [r.measurements for r in again] == [r.measurements for r in first_run]  # bit for bit
    # what cannot be vectorized is never chosen; on the CPU, neither is the inexact vmap path (a model
    # that is not an MLP), so timing never changes a result
    assert vectorization_pays(_toy_specs(_dropout)) is False
    monkeypatch.setattr(choice, "vectorization_costs", lambda specs, **kw: pytest.fail("the vmap path was timed"))
    toy = _toy_specs(_random_buffer, seeds=(3, 3))
    assert run_trials_vectorized(toy) and vectorization_pays(toy) is False
    # cached per (workload, optimizer, batch size, K, device, shared order): measured once
    monkeypatch.setattr(choice, "vectorization_costs", lambda specs, **kw: pytest.fail("measured twice"))
    assert vectorization_pays(copy.deepcopy(specs)) is pays
    assert vectorization_pays(specs[:1]) is False
    assert vectorization_pays([specs[0], replace(specs[1], batch_size=32)]) is False


# --- review fixes: models the fused path cannot compute, the exactness self-check, the driver's rule ---------


def _mlp_specs(make_model, batch_size=2, inputs=16, seeds=(1, 2, 3), data_order_seed=None, eval_batch_size=None,
               steps=6):
    """Trials of a tiny classification workload (``inputs`` features, 4 classes) on ``make_model``."""
    from batchlab.workloads import Workload

    def data():
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(90, inputs, generator=g), torch.randint(0, 4, (90,), generator=g)
        return {"train": (x[:70], y[:70]), "val": (x[70:], y[70:])}

    workload = Workload(name="toy/mlp", make_model=make_model, data=data, goal=0.5, eval_batch_size=eval_batch_size)
    return [TrialSpec(workload=workload, optimizer="momentum", batch_size=batch_size,
                      hyperparameters={"learning_rate": 0.05 * (i + 1), "momentum": 0.9}, steps=steps, seed=seed,
                      evaluation_steps=[2, steps], stop_at_goal=False, data_order_seed=data_order_seed)
            for i, seed in enumerate(seeds)]


def _weight_norm_mlp():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.nn.utils.weight_norm is deprecated
        return nn.Sequential(nn.utils.weight_norm(nn.Linear(16, 8)), nn.ReLU(), nn.Linear(8, 4))


_HOOK_CALLS = []


def _hooked_mlp():
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    model[0].register_forward_hook(lambda module, args, out: _HOOK_CALLS.append(1))
    return model


class _Raises(nn.Module):
    """A user's model raising (not a RuntimeError) under torch.func transforms: in training, or only in
    the evaluation's forward pass (``in_evaluation``: vmap without grad)."""

    in_evaluation = False

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 4)

    def forward(self, x):
        functorch = torch._C._functorch
        wrapped = (functorch.is_batchedtensor if self.in_evaluation else functorch.is_functorch_wrapped_tensor)
        if wrapped(self.linear.weight):
            raise ValueError("a user's model failing under vmap")
        return self.linear(x)


class _RaisesInEvaluation(_Raises):
    in_evaluation = True


def test_mlp_layers_refuses_what_the_fused_path_would_not_compute():
    import torch.nn.modules.module as module_mod

    def plain():
        return nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))

    assert mlp_layers(plain()) is not None
    assert mlp_layers(_weight_norm_mlp()) is None  # parameters 0.weight_g, 0.weight_v
    assert mlp_layers(_hooked_mlp()) is None
    for register in ("register_forward_pre_hook", "register_full_backward_hook", "register_full_backward_pre_hook"):
        model = plain()
        getattr(model[2], register)(lambda *args: None)
        assert mlp_layers(model) is None, register
    with_buffer = plain()
    with_buffer.register_buffer("scale", torch.ones(1))
    assert mlp_layers(with_buffer) is None
    own_forward = plain()
    own_forward[0].forward = lambda x: x
    assert mlp_layers(own_forward) is None
    handle = module_mod.register_module_forward_hook(lambda *args: None)
    try:
        assert mlp_layers(plain()) is None  # a global module hook
    finally:
        handle.remove()
    assert mlp_layers(plain()) is not None


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")  # weight norm under vmap
@pytest.mark.parametrize("make_model", [_weight_norm_mlp, _hooked_mlp, _Raises, _RaisesInEvaluation],
                         ids=["weight-norm", "hooked", "raises", "raises-in-evaluation"])
def test_models_outside_the_fused_path_never_fail_with_a_traceback(monkeypatch, make_model):
    import batchlab.sweep.vectorize_choice as choice
    from batchlab.sweep.vectorized import NotVectorizable

    monkeypatch.setattr(choice, "_PAYS", {})
    specs = _mlp_specs(make_model)
    assert vectorization_pays(specs) is False  # on the CPU: not an MLP (vmap is not exact), never an exception
    _HOOK_CALLS.clear()
    try:
        results = run_trials_vectorized(specs)  # vectorize = "always": vmap, or refused before training
    except NotVectorizable as err:
        assert "\n" not in str(err)
    else:
        _assert_like_sequential([run_trial(spec) for spec in specs], results, identical=False)  # vmap: rounding
        if make_model is _hooked_mlp:
            assert _HOOK_CALLS  # the hook ran (vmap calls the module), never silently skipped
    if make_model in (_Raises, _RaisesInEvaluation):
        with pytest.raises(NotVectorizable, match="a user's model failing under vmap"):
            run_trials_vectorized(specs)


@pytest.mark.parametrize("order", [None, 5], ids=["own-orders", "shared-order"])
@pytest.mark.parametrize(("batch", "inputs", "hidden"), [(1, 32, 10), (1, 8, 4), (2, 16, 10), (3, 20, 5), (16, 64, 64)])
def test_small_layers_are_chosen_on_the_cpu_only_when_measured_bit_identical(monkeypatch, order, batch, inputs, hidden):
    import batchlab.sweep.vectorize_choice as choice
    from batchlab.sweep.vectorize_choice import VectorizationCost

    def make_model():
        return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, 4))

    specs = _mlp_specs(make_model, batch_size=batch, inputs=inputs, data_order_seed=order, eval_batch_size=7)
    stack = StackedTrials([prepare_trial(spec) for spec in specs])
    assert stack.fused and stack.exact  # the same operations ...
    cost = vectorization_costs(specs)  # ... measured: the same bits?
    vectorized_results = run_trials_vectorized(specs)
    sequential = [run_trial(spec) for spec in specs]
    identical = all(v.measurements == s.measurements for v, s in zip(vectorized_results, sequential))
    # torch 2.13 picks other CPU kernels for small products (N x in x out below ~400), which round
    # differently: the self-check must see it (exact implies identical), and the cost rule must never
    # choose an inexact path on the CPU
    if cost.exact:
        assert identical
    monkeypatch.setattr(choice, "_PAYS", {})
    pays = vectorization_pays(specs)
    if not identical:
        assert not cost.exact and pays is False
    assert not pays or cost.exact
    # the rule itself: on the CPU exact AND cheaper
    for exact, expected in ((False, False), (True, True)):
        monkeypatch.setattr(choice, "_PAYS", {})
        monkeypatch.setattr(choice, "vectorization_costs",
                            lambda specs, exact=exact, **kw: VectorizationCost(sequential=1.0, vectorized=0.01, exact=exact))
        assert vectorization_pays(specs) is expected


def test_pays_cache_follows_the_workload_key_and_the_model(monkeypatch):
    import batchlab.sweep.vectorize_choice as choice
    from batchlab.sweep.vectorize_choice import VectorizationCost

    calls = []

    def costs(specs, **kwargs):
        calls.append(len(specs))
        return VectorizationCost(sequential=1.0, vectorized=0.1, exact=True)

    monkeypatch.setattr(choice, "_PAYS", {})
    monkeypatch.setattr(choice, "vectorization_costs", costs)
    small = _mlp_specs(lambda: nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4)))
    wide = _mlp_specs(lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))  # same name, new model
    assert vectorization_pays(small) and vectorization_pays(small) and calls == [3]
    assert vectorization_pays(wide) and calls == [3, 3]  # measured again: not the stale answer
    assert any(k[0] == "toy/mlp" for k in choice._PAYS)


def test_driver_does_not_vectorize_what_the_worker_never_would():
    from batchlab.sweep.config import SweepConfig
    from batchlab.sweep.plan import StudyPlan
    from batchlab.sweep.vectorize_plan import should_vectorize

    def study(workload, device_type="cpu"):
        return StudyPlan(workload=workload, optimizer="momentum", batch_size=16, steps=10, trials=4, seed=0,
                         train_examples=None, stop_at_goal=False, search_space={}, metric="val/classification_error",
                         goal=0.1, maximize=False, points=({"learning_rate": 0.1},) * 4, device_type=device_type)

    def config(vectorize):
        return SweepConfig(workloads=["mnist/simple_cnn_narrow"], optimizers=["momentum"], batch_sizes=[16], trials=4,
                           vectorize=vectorize)

    auto, always, never = config("auto"), config("always"), config("never")
    assert should_vectorize(auto, study("mnist/fc_64_64_64")) is True
    assert should_vectorize(auto, study("mnist/simple_cnn_narrow")) is False  # CPU, not an MLP: one trial a task
    assert should_vectorize(auto, study("mnist/simple_cnn_narrow", "cuda")) is True  # the worker measures
    assert should_vectorize(always, study("mnist/simple_cnn_narrow")) is True
    assert should_vectorize(never, study("mnist/fc_64_64_64")) is False


def test_driver_rule_follows_a_workload_re_registered_under_its_name():
    from batchlab.sweep.fused_mlp import mlp_workload
    from batchlab.workloads import Workload, register_workload

    def workload(make_model):
        return Workload(name="toy/driver", make_model=make_model, data=lambda: {}, goal=0.5)

    register_workload(workload(lambda: nn.Sequential(nn.Conv1d(1, 2, 3), nn.Flatten(), nn.Linear(4, 2))))
    assert mlp_workload("toy/driver") is False
    register_workload(workload(lambda: nn.Sequential(nn.Flatten(), nn.Linear(6, 2))))  # edited, same name
    assert mlp_workload("toy/driver") is True
    assert mlp_workload("no/such_workload") is False  # never a traceback in the driver's rule


# --- the vectorize contract: "auto" only where identical here, a forced "always" that is not is its own study ---


def _sweep_config(workload, vectorize, batch_sizes=(16,), trials=3):
    from batchlab.sweep.config import parse_sweep_config

    return parse_sweep_config({"workloads": [workload], "optimizers": ["momentum"], "batch_sizes": list(batch_sizes),
                               "trials": trials, "steps": 4, "seed": 1, "stop_at_goal": False, "vectorize": vectorize,
                               **({"train_examples": 512} if workload.startswith("mnist/") else {})})


def _tiny_mlp_workload():
    """A registered toy MLP with layers small enough (``N x in x out`` below ~400) that torch may pick
    other CPU kernels for the batched products: bit-identical on some machines, not on others."""
    from batchlab.workloads import register_workload

    workload = _mlp_specs(lambda: nn.Sequential(nn.Linear(16, 10), nn.ReLU(), nn.Linear(10, 4)))[0].workload
    register_workload(replace(workload, name="toy/tiny_mlp"))
    return "toy/tiny_mlp"


def _task(vectorized=True, choose=True):
    from batchlab.sweep.plan import make_tasks, plan_studies

    study = plan_studies(_sweep_config("mnist/fc_64_64_64", "auto", trials=2))[0]
    (task,) = make_tasks(study, study.trial_plans(), vectorized, 2, choose=choose)
    return task


@pytest.mark.parametrize("exact", [False, True])
def test_auto_vectorizes_a_task_only_where_the_self_check_finds_it_identical(monkeypatch, exact):
    import batchlab.sweep.vectorize_choice as choice
    from batchlab.sweep.vectorize_choice import VectorizationCost
    from batchlab.sweep.worker import run_task, trial_spec

    monkeypatch.setattr(choice, "_PAYS", {})
    monkeypatch.setattr(choice, "vectorization_costs",  # vectorizing is 100x cheaper: only exactness decides
                        lambda specs, **kw: VectorizationCost(sequential=1.0, vectorized=0.01, exact=exact))
    task = _task()
    outcomes = run_task(task)
    assert [o.vectorized for o in outcomes] == [exact, exact]
    if not exact:  # the fallback is the sequential path itself: what run_trial gives, to the bit
        assert [o.measurements for o in outcomes] == [run_trial(trial_spec(task, i)).measurements for i in range(2)]


def test_auto_requires_identity_on_an_accelerator_too(monkeypatch):
    # an accelerator's sequential trials are reproducible on it too: "auto" never trades that for speed
    import batchlab.sweep.vectorize_choice as choice
    import batchlab.train.device as device_mod
    from batchlab.sweep.vectorize_choice import VectorizationCost

    monkeypatch.setattr(device_mod, "resolve_device", lambda name=None: torch.device("cuda"))
    for exact in (False, True):
        monkeypatch.setattr(choice, "_PAYS", {})
        monkeypatch.setattr(choice, "vectorization_costs",
                            lambda specs, exact=exact, **kw: VectorizationCost(sequential=1.0, vectorized=0.01, exact=exact))
        assert vectorization_pays(_specs("momentum")) is exact


def test_a_forced_vectorization_that_is_not_identical_is_its_own_study_and_said(monkeypatch, tmp_path, capsys):
    import json

    import batchlab.sweep.vectorize_choice as choice
    from batchlab.sweep.executors import InlineExecutor
    from batchlab.sweep.plan import INEXACT_VECTORIZED
    from batchlab.sweep.progress import JsonReporter, RichReporter
    from batchlab.sweep.runner import StudyProgress, prepare_sweep, run_sweep

    checked = []

    def check(answer):
        def vectorized_identical(specs, threads=None):
            checked.append((len(specs), threads))
            return answer
        return vectorized_identical

    never = prepare_sweep(_sweep_config("mnist/fc_64_64_64", "never", (16, 32)), str(tmp_path / "never"))
    monkeypatch.setattr(choice, "vectorized_identical", check(True))
    same = prepare_sweep(_sweep_config("mnist/fc_64_64_64", "always", (16, 32)), str(tmp_path / "same"))
    assert checked == [(3, 1), (3, 1)]  # each study's first K trials, one torch thread as in the workers
    assert [s.digest for s in same.studies] == [s.digest for s in never.studies] and same.warnings == []

    monkeypatch.setattr(choice, "vectorized_identical", check(False))
    plan = prepare_sweep(_sweep_config("mnist/fc_64_64_64", "always", (16, 32)), str(tmp_path / "forced"))
    assert all(s.inexact_vectorized and s.definition["vectorized"] == INEXACT_VECTORIZED["vectorized"]
               for s in plan.studies)
    assert not {s.digest for s in plan.studies} & {s.digest for s in never.studies}  # never one study
    (warning,) = plan.warnings
    assert "\n" not in warning and "not bit-identical" in warning and "batch sizes 16, 32" in warning
    progress = [StudyProgress(study=s, total=s.trials) for s in plan.studies]
    info = {"executor": "inline", "workers": 1, "store": "s", "finished_before": 0, "created_store": False}
    for reporter in (RichReporter(terminal=False), JsonReporter()):
        capsys.readouterr()
        reporter.start(plan, progress, info)
        err = capsys.readouterr().err.splitlines()
        assert f"warning: {warning}" in err
    # the run goes on, vectorized, and its store records the definition
    one = prepare_sweep(_sweep_config("mnist/fc_64_64_64", "always"), str(tmp_path / "run"))
    summary = run_sweep(one, executor_factory=InlineExecutor)
    assert summary.trials_run == 3
    from batchlab.store import Store

    con = Store.open(tmp_path / "run").connect()
    (definition,) = [json.loads(d) for (d,) in con.execute("select definition from studies").fetchall()]
    con.close()
    assert definition["vectorized"] == {"bit_identical_to_sequential": False}

    monkeypatch.setattr(choice, "vectorized_identical", lambda *a, **k: pytest.fail("auto never checks in the driver"))
    assert prepare_sweep(_sweep_config("mnist/fc_64_64_64", "auto"), str(tmp_path / "auto")).warnings == []


@pytest.mark.parametrize("workload", ["mnist/fc_64_64_64", "tiny"])
def test_a_forced_vectorization_is_identical_to_sequential_or_recorded_as_not(tmp_path, workload):
    # On this machine, either outcome: where the self-check finds the forced vectorized path identical,
    # its sweep IS the sequential sweep (same study ids, every measurement to the bit); where not, it
    # is recorded as its own study and said. (This machine's CPU decides which branch runs.)
    from batchlab.sweep.executors import InlineExecutor
    from batchlab.sweep.runner import prepare_sweep, run_sweep
    from sweep_helpers import store_contents

    name = _tiny_mlp_workload() if workload == "tiny" else workload
    batch = 2 if workload == "tiny" else 16
    threads = torch.get_num_threads()
    plans = {v: prepare_sweep(_sweep_config(name, v, (batch,)), str(tmp_path / v)) for v in ("never", "always")}
    assert torch.get_num_threads() == threads  # the driver's check ran with one thread, then restored it
    forced = plans["always"].studies[0]
    if forced.inexact_vectorized:
        assert forced.digest != plans["never"].studies[0].digest and len(plans["always"].warnings) == 1
    else:
        assert forced.digest == plans["never"].studies[0].digest and plans["always"].warnings == []
        for plan in plans.values():
            run_sweep(plan, executor_factory=InlineExecutor)
        assert store_contents(tmp_path / "always") == store_contents(tmp_path / "never")
