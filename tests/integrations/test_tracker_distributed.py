"""NoiseScaleTracker under real DistributedDataParallel and FSDP2 processes (gloo, 2 CPU processes).

One ``torch.multiprocessing`` spawn (module fixture) runs every distributed case and writes each
rank's results as JSON; the tests compare them with single-process runs of the same model on the
same examples, computed here. Every case: float64 models, the same initial parameters on every
rank, a global batch of ``GLOBAL`` examples per step of which rank r takes the r-th half, SGD steps
in between (so later steps measure at moved parameters, the same in every run up to rounding).

Tolerances: a distributed run and its single-process twin compute the same numbers in a different
summation order (DDP's all-reduce sums the ranks' gradients and divides by 2, FSDP2 reduce-scatters,
a single process accumulates micro-batch gradients into .grad; the small norms are averaged by an
all-reduce or by a mean), so they agree to rounding: float64 gives ~1e-16 relative per operation,
amplified by tr(Sigma)'s difference small - big and by a few SGD steps; ``REL = 1e-9`` leaves
orders of magnitude of room while any real difference (a wrong world size, a reduction over the
wrong group, a clipped gradient) changes the estimate by a factor.
"""

from __future__ import annotations

import json
import math
import os
import socket
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from batchlab.errors import BatchlabError
from batchlab.probes.noise_scale import moments_from_norms, noise_scale
from batchlab.probes.tracker import NoiseScaleTracker

WORLD = 2
GLOBAL = 16  # examples per step, over both ranks
STEPS = 3
REL = 1e-9  # see the module docstring

# the linear regression of tests/probes/test_tracker.py, whose noise scale is known exactly:
# x ~ N(0, C), y = w*^T x + N(0, S2), loss (f(x) - y)^2 / 2, at w = w* + A (never updated)
C = np.array([2.0, 1.0, 0.6, 0.3])
A = np.array([0.5, -0.4, 0.3, 0.5])
W_STAR = np.array([0.2, 0.1, -0.3, 0.4])
S2 = 0.1
B_SIMPLE = ((A @ (C * A) + S2) * C.sum() + ((C * A) ** 2).sum()) / ((C * A) ** 2).sum()
LINEAR_BATCH, LINEAR_STEPS, LINEAR_LEVEL = 64, 40, 0.99


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8, dtype=torch.float64), nn.Tanh(), nn.Linear(8, 1, dtype=torch.float64))


def loss_fn(outputs, targets):
    return 0.5 * (outputs - targets).square().mean()


def batch(step: int, size: int = GLOBAL):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size, 4, generator=g, dtype=torch.float64)
    y = torch.sin(x.sum(1, keepdim=True)) + 0.3 * torch.randn(size, 1, generator=g, dtype=torch.float64)
    return x, y


def linear_batch(step: int):
    g = torch.Generator().manual_seed(5000 + step)
    x = torch.randn(LINEAR_BATCH, 4, generator=g, dtype=torch.float64) * torch.as_tensor(np.sqrt(C))
    noise = torch.randn(LINEAR_BATCH, generator=g, dtype=torch.float64) * math.sqrt(S2)
    return x, (x @ torch.as_tensor(W_STAR) + noise)[:, None]


def linear_model() -> nn.Module:
    model = nn.Sequential(nn.Linear(4, 1, bias=False, dtype=torch.float64))
    with torch.no_grad():
        model[0].weight.copy_(torch.as_tensor(W_STAR + A)[None])
    return model


def _full(t: torch.Tensor) -> float:
    return float(t.full_tensor() if hasattr(t, "full_tensor") else t)


def train(model, tracker, *, rank: int, world: int, micro: int, clip: str | None = None, no_sync=None) -> dict:
    """``STEPS`` SGD steps, each over rank ``rank``'s share of the global batch in ``micro``
    micro-batches (loss / micro each; ``no_sync()`` around all but the last when given), then
    ``tracker.update``; ``clip``: ``clip_grad_norm_`` to 1e-3 ``"before"`` or ``"after"`` the update
    (the same trajectory either way; the norms before and after clipping are recorded)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    history, norms = [], []
    for step in range(STEPS):
        x, y = batch(step)
        xs, ys = x.chunk(world)[rank], y.chunk(world)[rank]
        optimizer.zero_grad(set_to_none=True)
        for m, (xm, ym) in enumerate(zip(xs.chunk(micro), ys.chunk(micro))):
            with no_sync() if no_sync is not None and m < micro - 1 else nullcontext():
                (loss_fn(model(xm), ym) / micro).backward()
        if clip == "before":
            norms.append(clip_to_small_norm(model))
        tracker.update(model, batch_size=GLOBAL, grad_scale=1 / micro)
        if clip == "after":
            norms.append(clip_to_small_norm(model))
        history.append(dict(tracker.last))
        optimizer.step()
    return {"history": history, "state": tracker.to_dict(), "clip_norms": norms}


def clip_to_small_norm(model) -> tuple[float, float]:
    before = _full(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3))
    return before, _full(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))


def single_process(micro_batches: int, clip: str | None = None) -> dict:
    """The same steps in one process: the global batch in ``micro_batches`` micro-batches (rank 0's
    share first), loss / micro_batches each."""
    model = mlp()
    tracker = NoiseScaleTracker(model, beta=0.9)
    return train(model, tracker, rank=0, world=1, micro=micro_batches, clip=clip)


def _ddp_case(rank, micro, grad_at="update", clip=None, group=None):
    model = nn.parallel.DistributedDataParallel(mlp())
    tracker = NoiseScaleTracker(model, beta=0.9, grad_at=grad_at, process_group=group)
    return train(model, tracker, rank=rank, world=WORLD, micro=micro, clip=clip, no_sync=model.no_sync)


def _sharded_case(rank, micro, mesh_shape=None, grad_at="update", clip=None):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = mlp()
    mesh = None
    if mesh_shape is not None:
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("replicate", "shard"))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    tracker = NoiseScaleTracker(model, beta=0.9, grad_at=grad_at)

    class NoSync:  # FSDP2's no_sync: no reduce-scatter for this backward pass
        def __enter__(self):
            model.set_requires_gradient_sync(False)

        def __exit__(self, *exc):
            model.set_requires_gradient_sync(True)

    out = train(model, tracker, rank=rank, world=WORLD, micro=micro, clip=clip, no_sync=NoSync)
    out["grad_is_sharded"] = type(model[0].weight.grad).__name__ == "DTensor"
    out["placements"] = [("shard" if p.is_shard() else "replicate" if p.is_replicate() else str(p))
                        for p in model[0].weight.placements]
    return out


def _linear_case(rank):
    """Fixed parameters (no step): each step a fresh global batch; the DDP reading at LINEAR_LEVEL."""
    model = nn.parallel.DistributedDataParallel(linear_model())
    tracker = NoiseScaleTracker(model, beta=None)
    for step in range(LINEAR_STEPS):
        x, y = linear_batch(step)
        model.zero_grad(set_to_none=True)
        loss_fn(model(x.chunk(WORLD)[rank]), y.chunk(WORLD)[rank]).backward()
        tracker.update(model, batch_size=LINEAR_BATCH)
    return {"reading": tracker.reading(LINEAR_LEVEL), "small_batch_size": tracker.last["small_batch_size"]}


def _raised(action) -> str | None:
    try:
        action()
    except BatchlabError as exc:
        return str(exc)
    return None


def _errors(rank):
    """One-line refusals, and a rank with nothing to measure: it takes part in the step's all-reduce
    and both ranks raise (instead of the other waiting in it), then both go on in step."""
    from torch.distributed.fsdp import fully_shard

    out = {}
    model = mlp()
    fully_shard(model)
    out["sharded_parameters_without_module"] = _raised(lambda: NoiseScaleTracker(list(model.parameters())))
    ddp = nn.parallel.DistributedDataParallel(mlp())
    tracker = NoiseScaleTracker(ddp, beta=None)
    x, y = batch(0)
    if rank == 0:  # rank 1 back-propagates nothing (DDP's own all-reduce is not entered either)
        with ddp.no_sync():
            loss_fn(ddp(x.chunk(WORLD)[rank]), y.chunk(WORLD)[rank]).backward()
    out["rank_without_gradients"] = _raised(lambda: tracker.update(ddp, batch_size=GLOBAL))
    ddp.zero_grad(set_to_none=True)
    loss_fn(ddp(x.chunk(WORLD)[rank]), y.chunk(WORLD)[rank]).backward()
    tracker.update(ddp, batch_size=GLOBAL)
    out["steps_after"] = tracker.steps
    return out


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        results = {
            "ddp": _ddp_case(rank, micro=1),
            "ddp_world_group": _ddp_case(rank, micro=1, group=dist.new_group([0, 1])),
            "ddp_accumulate": _ddp_case(rank, micro=2),
            "ddp_clip_backward": _ddp_case(rank, micro=2, grad_at="backward", clip="before"),
            "ddp_clip_update": _ddp_case(rank, micro=1, clip="before"),
            "fsdp": _sharded_case(rank, micro=1),
            "fsdp_accumulate": _sharded_case(rank, micro=2),
            "fsdp_clip_backward": _sharded_case(rank, micro=2, grad_at="backward", clip="before"),
            "hsdp_replicate2": _sharded_case(rank, micro=1, mesh_shape=(2, 1)),
            "hsdp_shard2": _sharded_case(rank, micro=1, mesh_shape=(1, 2)),
            "linear": _linear_case(rank),
            "errors": _errors(rank),
        }
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("tracker_distributed")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=WORLD, join=True)
    return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.fixture(scope="module")
def single():
    # "clipped": clipped after the update (grad_at="update" reads the unclipped .grad), the trajectory
    # of the runs that clip before it
    return {2: single_process(2), 4: single_process(4), "clipped": single_process(4, clip="after")}


def assert_same_estimates(run: dict, reference: dict):
    for step, (got, want) in enumerate(zip(run["history"], reference["history"], strict=True)):
        assert got["small_batch_size"] == want["small_batch_size"], step
        assert got["trace_sigma"] == pytest.approx(want["trace_sigma"], rel=REL), step
        assert got["grad_norm_sq"] == pytest.approx(want["grad_norm_sq"], rel=REL), step
    for key in ("b_simple", "b_simple_low", "b_simple_high", "trace_sigma", "grad_norm_sq"):
        got, want = run["state"][key], reference["state"][key]
        assert (got is None) == (want is None), key
        if want is not None:
            assert got == pytest.approx(want, rel=REL), key
    assert run["state"]["steps"] == reference["state"]["steps"] == STEPS


def test_ddp_one_micro_batch_per_rank_equals_one_process_with_two(ranks, single):
    """Rank r's local gradient (the hooks) is the single process's r-th micro-batch gradient, DDP's
    all-reduced .grad the accumulated one: the same small and big gradients."""
    for rank in ranks:
        assert rank["ddp"]["history"][0]["small_batch_size"] == GLOBAL / 2
        assert_same_estimates(rank["ddp"], single[2])
    assert ranks[0]["ddp"]["state"] == ranks[1]["ddp"]["state"]  # sync: every rank holds the same


def test_accumulation_is_the_same_estimate_under_ddp_and_in_one_process(ranks, single):
    """k = 2 micro-batches per rank on 2 ranks (DDP's no_sync for the first) and 4 micro-batches in
    one process over the same examples: b = GLOBAL / 4 either way."""
    for rank in ranks:
        assert rank["ddp_accumulate"]["history"][0]["small_batch_size"] == GLOBAL / 4
        assert_same_estimates(rank["ddp_accumulate"], single[4])


def test_accumulation_equals_the_large_batch_it_adds_up_to():
    """Gradient accumulation's big gradient is the gradient of the large batch the micro-batches make
    up: the tracker's step estimate equals moments_from_norms of the micro-batch gradients computed
    one at a time and of the large batch's gradient in one backward pass (tolerance: summing k
    micro-batch gradients vs one batch's gradient, rounding only)."""
    model = mlp()
    tracker = NoiseScaleTracker(model, beta=None)
    x, y = batch(0)
    k = 4
    for xm, ym in zip(x.chunk(k), y.chunk(k)):
        (loss_fn(model(xm), ym) / k).backward()
    tracker.update(model, batch_size=GLOBAL, grad_scale=1 / k)
    tracker.remove()

    def flat_grad(inputs, targets):
        model.zero_grad(set_to_none=True)
        loss_fn(model(inputs), targets).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    small = np.mean([float(flat_grad(xm, ym).square().sum()) for xm, ym in zip(x.chunk(k), y.chunk(k))])
    big = float(flat_grad(x, y).square().sum())
    grad_norm_sq, trace_sigma = moments_from_norms(small, big, GLOBAL // k, GLOBAL)
    assert tracker.last["small_batch_size"] == GLOBAL // k
    assert tracker.trace_sigma == pytest.approx(trace_sigma, rel=REL)
    assert tracker.grad_norm_sq == pytest.approx(grad_norm_sq, rel=REL)


def test_fsdp2_equals_ddp_and_the_single_process(ranks, single):
    """FSDP2 (fully_shard on each Linear and the root, 1-D mesh over both ranks): the hooks sit on
    the unsharded parameters, the big norm is the shards' sum over the mesh."""
    for rank in ranks:
        assert rank["fsdp"]["grad_is_sharded"] and rank["fsdp"]["placements"] == ["shard"]
        assert_same_estimates(rank["fsdp"], rank["ddp"])
        assert_same_estimates(rank["fsdp"], single[2])
        assert_same_estimates(rank["fsdp_accumulate"], single[4])


def test_hsdp_sums_over_the_shard_dimension_only(ranks, single):
    """A 2-D (replicate, shard) mesh on 2 processes: (2, 1) replicates every parameter on both ranks
    with shards of size 1 (summing the local norms over the world instead of the shard group would
    double |.grad|^2); (1, 2) shards over both ranks (the same as FSDP). Both are the single-process
    estimate."""
    for rank in ranks:
        assert rank["hsdp_replicate2"]["placements"] == ["replicate", "shard"]
        assert_same_estimates(rank["hsdp_replicate2"], single[2])
        assert_same_estimates(rank["hsdp_shard2"], single[2])


def test_grad_at_backward_reads_the_gradient_before_clipping(ranks, single):
    """clip_grad_norm_ after backward rewrites .grad (checked: the norm fell to the clip), yet with
    grad_at="backward" (read at the end of the last backward pass, after DDP's and FSDP2's
    reductions) the estimate is the unclipped one; with grad_at="update" after clipping it is not."""
    for rank in ranks:
        for case in ("ddp_clip_backward", "fsdp_clip_backward"):
            for before, after in rank[case]["clip_norms"]:
                # clip_grad_norm_ scales by max_norm / (norm + 1e-6): the clipped norm is 1e-3 to ~1e-6 relative
                assert after == pytest.approx(1e-3, rel=1e-4) and before > 100 * after
            assert_same_estimates(rank[case], single["clipped"])
        clipped = rank["ddp_clip_update"]["history"][0]
        assert clipped["grad_norm_sq"] != pytest.approx(single[2]["history"][0]["grad_norm_sq"], rel=0.5)


def test_ddp_noise_scale_matches_the_single_process_one_within_its_interval(ranks):
    """The linear regression at fixed parameters, LINEAR_STEPS steps of LINEAR_BATCH examples over 2
    DDP ranks (b = 32, B = 64): the 99% interval is resolved and holds both the exact B_simple and
    the single-process per-example estimate over the same examples (noise_scale, b = 1). A 99%
    interval misses the truth in 1% of seeds; the data here are fixed, so the test is deterministic."""
    reading = ranks[0]["linear"]["reading"]
    assert ranks[1]["linear"]["reading"] == reading and ranks[0]["linear"]["small_batch_size"] == LINEAR_BATCH / 2
    assert reading["resolved"] and reading["steps"] == LINEAR_STEPS and reading["level"] == LINEAR_LEVEL
    low, high = reading["b_simple_low"], reading["b_simple_high"]
    assert low <= reading["b_simple"] <= high
    assert low <= B_SIMPLE <= high
    reference = noise_scale(linear_model(), loss_fn, [linear_batch(s) for s in range(LINEAR_STEPS)],
                            method="per_example")
    assert low <= reference.b_simple <= high


def test_bad_input_is_one_line():
    frozen = nn.Linear(3, 1).requires_grad_(False)
    with pytest.raises(BatchlabError, match="no trainable parameters") as info:
        NoiseScaleTracker(frozen)
    assert "\n" not in str(info.value)
    model = mlp()
    tracker = NoiseScaleTracker(model)
    with torch.no_grad():  # a forward without gradients: nothing to measure
        loss_fn(model(batch(0)[0]), batch(0)[1])
    with pytest.raises(BatchlabError, match="no gradients since the last update") as info:
        tracker.update(model, batch_size=GLOBAL)
    assert "\n" not in str(info.value)
    with pytest.raises(BatchlabError, match="grad_at must be one of update, backward"):
        NoiseScaleTracker(model, grad_at="step")


def test_sharded_parameters_need_the_module(ranks):
    message = ranks[0]["errors"]["sharded_parameters_without_module"]
    assert message is not None and "fully_shard module" in message and "\n" not in message


def test_a_rank_with_nothing_to_measure_fails_every_rank_without_a_hang(ranks):
    """The rank without gradients raises its own reason, the other one that a worker had nothing to
    measure (both after the step's all-reduce, which carries the count); the next step is measured on
    both (the collectives stayed in step)."""
    assert "no gradients since the last update" in ranks[1]["errors"]["rank_without_gradients"]
    assert "1 other worker(s) had nothing to measure" in ranks[0]["errors"]["rank_without_gradients"]
    assert [r["errors"]["steps_after"] for r in ranks] == [1, 1]


def test_an_explicit_process_group_of_the_world_is_the_default(ranks):
    """process_group= (here the world, as an explicit group) is where sync all-reduces: the same numbers."""
    for rank in ranks:
        assert rank["ddp_world_group"] == rank["ddp"]
