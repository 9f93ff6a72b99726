"""Vectorized trials give the measurements of sequential ``run_trial``: to the bit where the exactness
self-check says so, else up to floating-point rounding."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import nn

import batchlab.workloads.registry as registry
from batchlab.errors import BatchlabError
from batchlab.sweep.fused_mlp import mlp_layers
from batchlab.sweep.vectorize_choice import vectorization_costs, vectorization_pays
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


def _assert_same(sequential, vectorized):
    assert (vectorized.status, vectorized.steps, vectorized.steps_to_goal, vectorized.steps_lower) == (
        sequential.status, sequential.steps, sequential.steps_to_goal, sequential.steps_lower)
    assert vectorized.resolution == sequential.resolution
    assert [m["step"] for m in vectorized.measurements] == [m["step"] for m in sequential.measurements]
    for a, b in zip(sequential.measurements, vectorized.measurements):
        assert a.keys() == b.keys()
        for name in a:
            if "classification" in name:
                assert abs(a[name] - b[name]) <= 2.5e-3, (name, a, b)  # at most a few examples flip
            elif math.isfinite(a[name]):
                assert b[name] == pytest.approx(a[name], rel=1e-4, abs=1e-5), (name, a, b)


@pytest.mark.parametrize("order", [None, 7], ids=["own-orders", "shared-order"])
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "nesterov", "adam"])
def test_vectorized_equals_sequential(optimizer, order):
    # the fused MLP path: own orders (K stacked batches) or a shared order (one batch for all K, the
    # first layer of all K one GEMM)
    specs = _specs(optimizer, data_order_seed=order)
    stack = StackedTrials([prepare_trial(spec) for spec in specs])
    assert (stack.shared, stack.fused) == (order is not None, True)
    vectorized = run_trials_vectorized(specs)
    for spec, result in zip(specs, vectorized):
        sequential = run_trial(spec)
        _assert_same(sequential, result)
        if stack.exact:
            # each trial runs its own operations (the first layer's GEMM columns, the batched layers'
            # backward products, one loss per trial, torch.optim's roundings): to the bit
            assert result.measurements == sequential.measurements
    if optimizer == "sgd":
        assert vectorized[2].status == "INFEASIBLE" and vectorized[0].status == "COMPLETE"


def test_stop_at_goal_and_group_size_do_not_change_a_trial(monkeypatch):
    # A goal-beating trial stops early in both paths; a trial's numbers do not depend on its group.
    specs = _specs("sgd", stop_at_goal=True)
    for spec in specs:
        spec.hyperparameters = {"learning_rate": 0.2}
    specs[1].hyperparameters = {"learning_rate": 1e-4}
    workload = registry.WORKLOADS["mnist/fc_64_64_64"]
    monkeypatch.setitem(registry.WORKLOADS, workload.name, replace(workload, goal=0.865))  # reached at step 8
    together = run_trials_vectorized(specs)
    alone = run_trials_vectorized([specs[0]])[0]
    sequential = [run_trial(spec) for spec in specs]
    assert together[0].steps_to_goal is not None and together[0].steps == together[0].steps_to_goal == 8
    assert together[0].status == "STOPPED_AT_GOAL" and together[0].steps_lower == 4
    assert together[1].steps == 12 and together[1].status == "COMPLETE" and together[1].steps_lower is None
    assert alone.measurements == together[0].measurements
    for s, v in zip(sequential, together):
        _assert_same(s, v)


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
    goal_only = 0
    for spec, result in zip(specs, vectorized):
        sequential = run_trial(spec)
        _assert_same(sequential, result)
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
    for r, p in enumerate(prepared):
        model = p.model
        model.zero_grad()
        loss = p.workload.loss(model(x), y, label_smoothing=0.1)
        loss.backward()
        assert losses[r].item() == pytest.approx(loss.item(), rel=1e-6)
        for name, param in model.named_parameters():
            torch.testing.assert_close(grads[name][r], param.grad, rtol=1e-5, atol=1e-7)
            if stack.device.type == "cpu":
                assert torch.equal(grads[name][r], param.grad), name  # the same products: to the bit


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
        for spec, result in zip(specs, results):
            _assert_same(run_trial(spec), result)
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
    from batchlab.sweep.runner import should_vectorize

    def study(workload, device_type="cpu"):
        return StudyPlan(workload=workload, optimizer="momentum", batch_size=16, steps=10, trials=4, seed=0,
                         train_examples=None, stop_at_goal=False, search_space={}, metric="val/classification_error",
                         goal=0.1, maximize=False, points=({"learning_rate": 0.1},) * 4, device_type=device_type)

    def config(vectorize):
        return SweepConfig(workloads=["mnist/simple_cnn_narrow"], optimizers=["momentum"], batch_sizes=[16], trials=4,
                           vectorize=vectorize)

    auto, always, never = config("auto"), config("always"), config("never")
    assert should_vectorize(auto, study("mnist/fc_64_64_64"), 0) is True
    assert should_vectorize(auto, study("mnist/simple_cnn_narrow"), 0) is False  # CPU, not an MLP: one trial a task
    assert should_vectorize(auto, study("mnist/simple_cnn_narrow", "cuda"), 0) is True  # the worker measures
    assert should_vectorize(always, study("mnist/simple_cnn_narrow"), 0) is True
    assert should_vectorize(never, study("mnist/fc_64_64_64"), 0) is False


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
