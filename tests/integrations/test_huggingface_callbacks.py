"""batchlab.integrations.huggingface with the real transformers.Trainer on CPU: the noise-scale callback
(against a plain loop's tracker on the same micro-batches and parameters, unclipped under clipping, logs
reaching TensorBoard and W&B offline and nothing with report_to="none"), the scheduled batch sizes and
learning rates, and every bad input."""

from __future__ import annotations

import json
import math
import os
import pathlib

import pytest

transformers = pytest.importorskip("transformers")

import torch
from torch import nn
from transformers import Trainer, TrainerCallback, TrainingArguments

from batchlab.errors import BatchlabError
from batchlab.integrations.huggingface import (
    NoiseScaleCallback,
    ScheduledBatchSampler,
    ScheduledTrainer,
    add_noise_scale_callback,
    plan_batch_sizes,
)
from batchlab.integrations.metrics import logged_metrics
from batchlab.integrations.schedule import BatchSizeSchedule, examples_lr_schedule
from batchlab.probes.tracker import NoiseScaleTracker

# Same micro-batches, same parameters, same float32 backward kernels; the Trainer's path divides the loss by
# the accumulation count through accelerate and sums in a possibly different order, so the float64
# running sums of float32 squared norms agree to float32 rounding, not bitwise.
RTOL = 1e-5


class Tiny(nn.Module):
    """A 2-layer regression net returning {"loss"}; while training it records each micro-batch it sees."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.hidden = nn.Linear(4, 8)
        self.out = nn.Linear(8, 1)
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, x, y):
        if self.training and torch.is_grad_enabled():
            self.seen.append((x.detach().clone(), y.detach().clone()))
        pred = self.out(torch.tanh(self.hidden(x))).squeeze(-1)
        return {"loss": ((pred - y) ** 2).mean()}


class Pairs(torch.utils.data.Dataset):
    def __init__(self, n: int, scale: float = 1.0, seed: int = 1):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=g)
        self.y = scale * (self.x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.3 * torch.randn(n, generator=g))

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}


class ParamsAtStep(TrainerCallback):
    """The model's parameters at the start of every optimizer step (what its gradients are taken at)."""

    def __init__(self):
        self.states = []

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self.states.append({k: v.detach().clone() for k, v in model.state_dict().items()})


def _args(tmp_path, **kw):
    base = {"output_dir": str(tmp_path / "out"), "report_to": "none", "use_cpu": True, "save_strategy": "no",
                "disable_tqdm": True, "logging_steps": 1, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2,
                "learning_rate": 0.05, "max_steps": 4, "dataloader_pin_memory": False, "seed": 0}
    base.update(kw)
    return TrainingArguments(**base)


def _replay(params, seen, steps_micro, *, clip: float = 0.0, grad_at: str = "backward", beta=None):
    """A plain loop's tracker over the same micro-batches at the recorded parameters of each step, each
    micro-batch's loss divided by k as the Trainer does and ``grad_scale=1/k`` as the tracker's contract
    says, so its tr(Sigma) and |G|^2 are those of the unscaled mean loss."""
    model = Tiny()
    tracker = NoiseScaleTracker(model, beta=beta, grad_at=grad_at)
    it = iter(seen)
    for state, k in zip(params, steps_micro):
        model.load_state_dict({n: v for n, v in state.items()})
        model.zero_grad()
        rows = 0
        for _ in range(k):
            x, y = next(it)
            (model(x, y)["loss"] / k).backward()
            rows += len(y)
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        tracker.update(model, batch_size=rows, world_size=1, grad_scale=1.0 / k)
    return tracker


def _train(tmp_path, *, callback=None, dataset=None, install=True, **kw):
    model = Tiny()
    recorder = ParamsAtStep()
    trainer = Trainer(model=model, args=_args(tmp_path, **kw), train_dataset=dataset or Pairs(64),
                      callbacks=[recorder])
    cb = add_noise_scale_callback(trainer, callback or NoiseScaleCallback(beta=None)) if install else None
    trainer.train()
    return trainer, model, recorder, cb


def _close(a, b):
    return math.isclose(a, b, rel_tol=RTOL, abs_tol=0.0)


# -- the noise-scale callback -----------------------------------------------------------------------


@pytest.mark.parametrize("max_grad_norm", [1.0, 0.0])
def test_trainer_estimate_equals_plain_loop_unclipped(tmp_path, max_grad_norm):
    trainer, model, recorder, cb = _train(tmp_path, max_grad_norm=max_grad_norm, dataset=Pairs(64, scale=10.0))
    assert trainer.state.global_step == 4 and cb.tracker.steps == 4 and cb.skipped_steps == 0
    # the Trainer's logged grad_norm is the pre-clip norm: > 1, so max_grad_norm=1.0 really rescaled .grad
    assert all(h["grad_norm"] > 1.0 for h in trainer.state.log_history if "grad_norm" in h)
    plain = _replay(recorder.states, model.seen, [2] * 4)
    got, want = cb.tracker.reading(), plain.reading()
    for key in ("trace_sigma", "grad_norm_sq", "b_simple_low"):
        assert _close(got[key], want[key]), (key, got[key], want[key])
    # a tracker reading .grad after clipping (grad_at="update" on a clipped loop) would have been different
    clipped = _replay(recorder.states, model.seen, [2] * 4, clip=1.0, grad_at="update")
    assert not _close(clipped.reading()["grad_norm_sq"], want["grad_norm_sq"])
    # the reading was added to the Trainer's own logs at every log step: tr(Sigma) and |G|^2 from the
    # first on, the interval (b_simple_low) from the second on (it needs two measured steps)
    logged = [h for h in trainer.state.log_history if "noise_scale/b_simple_low" in h]
    assert [h["step"] for h in logged] == [2, 3, 4]
    first = {k for k in trainer.state.log_history[0] if k.startswith("noise_scale/")}
    assert first == {"noise_scale/trace_sigma", "noise_scale/grad_norm_sq"}
    assert _close(logged[-1]["noise_scale/b_simple_low"], want["b_simple_low"])
    assert _close(logged[-1]["noise_scale/trace_sigma"], want["trace_sigma"])
    assert ("noise_scale/b_simple" in logged[-1]) == bool(want["resolved"])
    # the same key set as the Lightning callback (one helper); per layer nothing without per_layer=True
    assert {k for k in logged[-1] if k.startswith("noise_scale/")} == set(logged_metrics(want))


def test_short_last_batch_step_is_left_out(tmp_path):
    # 22 examples in micro-batches of 4: per epoch steps [4, 4], [4, 4], [4, 2]; the last one is unequal
    trainer, model, recorder, cb = _train(tmp_path, dataset=Pairs(22), max_steps=6)
    assert trainer.state.global_step == 6 and cb.skipped_steps == 2 and cb.tracker.steps == 4
    keep = [i for i in range(6) if i % 3 != 2]
    seen = [model.seen[2 * i + j] for i in keep for j in range(2)]
    plain = _replay([recorder.states[i] for i in keep], seen, [2] * 4)
    assert _close(cb.tracker.reading()["trace_sigma"], plain.reading()["trace_sigma"])
    assert _close(cb.tracker.reading()["grad_norm_sq"], plain.reading()["grad_norm_sq"])


def test_single_micro_batch_step_is_left_out(tmp_path):
    # 20 examples in micro-batches of 4: per epoch steps [4, 4], [4, 4], [4]; the last has one batch size only
    trainer, model, recorder, cb = _train(tmp_path, dataset=Pairs(20), max_steps=3)
    assert trainer.state.global_step == 3 and cb.skipped_steps == 1 and cb.tracker.steps == 2
    plain = _replay(recorder.states[:2], model.seen[:4], [2, 2])
    assert _close(cb.tracker.reading()["trace_sigma"], plain.reading()["trace_sigma"])


def test_per_layer_and_every(tmp_path):
    trainer, _model, _recorder, cb = _train(tmp_path, callback=NoiseScaleCallback(per_layer=True, every=2, beta=None))
    assert cb.tracker.steps == 2 and cb.tracker.calls == 4
    # steps 1 and 3 are measured, 2 and 4 are not: nothing new to log at 2 and 4; the interval
    # (b_simple_low) needs two measured steps
    noisy = [h for h in trainer.state.log_history if any(k.startswith("noise_scale/") for k in h)]
    assert {h["step"] for h in noisy} <= {1, 3}
    assert [h["step"] for h in noisy if "noise_scale/b_simple_low" in h] == [3]
    # step 3's log holds each layer's tr(Sigma) and |G|^2 (the tracker has not moved since), and no per-layer
    # B_simple (a point value without an interval is not logged)
    last = next(h for h in trainer.state.log_history if h.get("step") == 3)
    want = {f"noise_scale/layer/{layer}/{key}": e[key] for layer, e in cb.tracker.per_layer.items()
            for key in ("trace_sigma", "grad_norm_sq")}
    assert len(want) == 4 and {k: v for k, v in last.items() if k.startswith("noise_scale/layer/")} == want


def test_tensorboard_event_file(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = tmp_path / "out"  # the TensorBoard callback writes under output_dir/runs/
    _trainer, _, _, cb = _train(tmp_path, report_to=["tensorboard"])
    files = list(logdir.rglob("events.out.tfevents.*"))
    assert files
    acc = EventAccumulator(str(files[0].parent))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "train/noise_scale/b_simple_low" in tags
    values = [e.value for e in acc.Scalars("train/noise_scale/b_simple_low")]
    assert len(values) == 3  # steps 2, 3, 4 (the interval needs two measured steps)
    assert math.isclose(values[-1], cb.tracker.reading()["b_simple_low"], rel_tol=1e-6)  # float32 in the file


def test_wandb_offline(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    for key, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path),
                       "WANDB_PROJECT": "batchlab-test", "WANDB_DISABLE_CODE": "true"}.items():
        monkeypatch.setenv(key, value)
    try:
        _trainer, _, _, cb = _train(tmp_path, report_to=["wandb"])
    finally:
        wandb.finish()
        # wandb keeps a per-process singleton holding the first run's settings (its WANDB_DIR): tear it
        # down, or a later W&B test in this process (the Lightning one) writes under this test's directory
        wandb.teardown()
    runs = list(tmp_path.rglob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    history = _wandb_history(runs[0])
    logged = [h for h in history if "train/noise_scale/b_simple_low" in h]
    assert [h["train/global_step"] for h in logged] == [2, 3, 4]
    # W&B stores the float64 as JSON text (Python's repr, which round-trips exactly); the tolerance only
    # allows a writer that shortens the text to ~15 significant digits
    assert math.isclose(logged[-1]["train/noise_scale/b_simple_low"], cb.tracker.reading()["b_simple_low"],
                        rel_tol=1e-12)


def test_noise_scale_state_is_checkpointed_and_resumed(tmp_path):
    # an uninterrupted 6-step run, and the same run resumed from its step-3 checkpoint with a new callback
    full, _, _, cb_full = _train(tmp_path, max_steps=6, save_strategy="steps", save_steps=3)
    checkpoint = tmp_path / "out" / "checkpoint-3"
    saved = json.loads((checkpoint / "trainer_state.json").read_text())["stateful_callbacks"]["NoiseScaleCallback"]
    assert saved["attributes"]["tracker_state"]["steps"] == 3 and saved["args"]["beta"] is None
    trainer = Trainer(model=Tiny(), args=_args(tmp_path, max_steps=6), train_dataset=Pairs(64))
    cb = add_noise_scale_callback(trainer, NoiseScaleCallback(beta=None))
    trainer.train(resume_from_checkpoint=str(checkpoint))
    assert trainer.state.global_step == 6 and cb.tracker.steps == 6 and cb.tracker.calls == 6
    # the Trainer restores parameters, optimizer, scheduler and RNG and skips the micro-batches already
    # taken: steps 4-6 run the same float32 operations on the same inputs, and the tracker continues from
    # the checkpoint's running sums, so the estimate is the uninterrupted run's, bitwise
    assert cb.tracker.state_dict() == cb_full.tracker.state_dict()
    assert cb.reading == cb_full.reading


def test_restoring_callbacks_from_the_checkpoint_is_refused(tmp_path):
    trainer = Trainer(model=Tiny(), args=_args(tmp_path, restore_callback_states_from_checkpoint=True),
                      train_dataset=Pairs(16))
    with pytest.raises(BatchlabError, match="restore_callback_states_from_checkpoint=False") as exc:
        add_noise_scale_callback(trainer)
    _one_line(exc)


def _wandb_history(path):
    """The history rows of an offline W&B run file: W&B's LevelDB-style log (a 7-byte header, 32 KiB
    blocks of records: crc32, length, type FULL/FIRST/MIDDLE/LAST, data) of ``Record`` protobufs."""
    import struct

    from wandb.proto import wandb_internal_pb2

    raw, block, pos, rows, part = path.read_bytes(), 32768, 7, [], b""
    assert raw[:4] == b":W&B"
    while pos + 7 <= len(raw):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        if kind == 0 and length == 0:  # block padding
            pos += left
            continue
        data, pos = raw[pos + 7:pos + 7 + length], pos + 7 + length
        part = data if kind in (1, 2) else part + data
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(part)
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


def test_report_to_none_writes_nothing(tmp_path):
    before = set(os.listdir(tmp_path))
    _trainer, _, _, cb = _train(tmp_path)
    assert cb.tracker.steps == 4
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert not [p for p in written if "tfevents" in p or "wandb" in p], written
    assert set(os.listdir(tmp_path)) - before <= {"out"}


# -- the noise-scale callback: bad input ------------------------------------------------------------


def _one_line(exc):
    assert "\n" not in str(exc.value) and str(exc.value)


def test_frozen_model_is_one_line_error(tmp_path):
    model = Tiny()
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(BatchlabError, match="no trainable parameters") as exc:
        Trainer(model=model, args=_args(tmp_path), train_dataset=Pairs(16), callbacks=[NoiseScaleCallback()])
    _one_line(exc)


def test_one_batch_size_is_one_line_error(tmp_path):
    trainer = Trainer(model=Tiny(), args=_args(tmp_path, gradient_accumulation_steps=1), train_dataset=Pairs(16))
    with pytest.raises(BatchlabError, match="gradient_accumulation_steps >= 2") as exc:
        add_noise_scale_callback(trainer)
    _one_line(exc)


def test_callback_behind_reporters_is_one_line_error(tmp_path):
    pytest.importorskip("tensorboard")
    trainer = Trainer(model=Tiny(), args=_args(tmp_path, report_to=["tensorboard"]),
                      train_dataset=Pairs(16), callbacks=[NoiseScaleCallback()])
    with pytest.raises(BatchlabError, match="add_noise_scale_callback") as exc:
        trainer.train()
    _one_line(exc)


@pytest.mark.parametrize("options", [{"level": 1.0}, {"beta": 1.5}, {"every": 0}])
def test_bad_callback_options(options):
    with pytest.raises(BatchlabError) as exc:
        NoiseScaleCallback(**options)
    _one_line(exc)


# -- batch-size schedules ---------------------------------------------------------------------------


class StepRows(TrainerCallback):
    """Rows of each micro-batch, grouped by optimizer step, counted by a forward pre-hook."""

    def __init__(self):
        self.steps: list[list[int]] = []
        self._hook = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._hook = model.register_forward_pre_hook(
            lambda m, a, kw: self.steps[-1].append(len(kw["y"])) if m.training else None, with_kwargs=True)

    def on_step_begin(self, args, state, control, **kwargs):
        self.steps.append([])

    def on_train_end(self, args, state, control, **kwargs):
        self._hook.remove()


SCHEDULE = BatchSizeSchedule(((0, 4), (16, 8), (48, 16)))


def _scheduled(tmp_path, schedule=SCHEDULE, total=96, dataset=None, **kw):
    targs = {k: kw.pop(k) for k in list(kw) if k in TrainingArguments.__dataclass_fields__}
    targs.setdefault("max_steps", -1)
    rows = StepRows()
    trainer = ScheduledTrainer(model=Tiny(), args=_args(tmp_path, **targs), train_dataset=dataset or Pairs(40),
                               callbacks=[rows], batch_size_schedule=schedule, total_examples=total, **kw)
    return trainer, rows


def test_plan_follows_schedule():
    assert plan_batch_sizes(SCHEDULE, 96) == [4] * 4 + [8] * 4 + [16] * 3
    assert plan_batch_sizes(SCHEDULE, 97) == [4] * 4 + [8] * 4 + [16] * 4  # the last step is taken in full
    s = ScheduledBatchSampler(SCHEDULE, num_examples=40, total_examples=96, micro_batches_per_step=2, world_size=2,
                              rank=1, seed=3)
    batches = list(s)
    assert len(batches) == len(s) == 22 and [len(b) for b in batches[::2]] == [1] * 4 + [2] * 4 + [4] * 3
    # the two ranks' slices of a step are disjoint and together the step's micro-batches
    s0 = ScheduledBatchSampler(SCHEDULE, num_examples=40, total_examples=96, micro_batches_per_step=2, world_size=2,
                               rank=0, seed=3)
    both = [a + b for a, b in zip(s0, s)]
    flat = [i for b in both for i in b]
    assert len(flat) == 96 and sorted(flat[:40]) == list(range(40))  # the first pass is a permutation
    assert list(s) == batches  # the same order on every iteration (resume)


@pytest.mark.parametrize("rule", ["linear", "sqrt"])
def test_scheduled_trainer_batch_sizes_lr_and_examples(tmp_path, rule):
    trainer, rows = _scheduled(tmp_path, lr_rule=rule)
    trainer.train()
    plan = [4] * 4 + [8] * 4 + [16] * 3
    assert trainer.state.global_step == 11
    assert [sum(r) for r in rows.steps] == plan
    assert all(len(r) == 2 and r[0] == r[1] for r in rows.steps)  # two equal micro-batches per step
    assert sum(map(sum, rows.steps)) == 96
    logs = [h for h in trainer.state.log_history if "learning_rate" in h]
    consumed = [sum(plan[:t]) for t in range(len(plan))]
    factor = (lambda b: b / 4) if rule == "linear" else (lambda b: math.sqrt(b / 4))
    # transformers' "linear" schedule (the default lr_scheduler_type), counted in examples: 1 - C/96
    want = [0.05 * (1 - c / 96) * factor(b) for c, b in zip(consumed, plan)]
    got = [h["learning_rate"] for h in logs]
    # the same float64 product taken in another order (factor / learning_rate x learning_rate): a few ulps
    assert len(got) == 11 and all(math.isclose(g, w, rel_tol=1e-12) for g, w in zip(got, want)), (got, want)
    assert [h["schedule/batch_size"] for h in logs] == plan
    assert [h["schedule/examples"] for h in logs] == [c + b for c, b in zip(consumed, plan)]


def test_scheduled_trainer_custom_lr_schedule_and_noise_callback(tmp_path):
    shape = examples_lr_schedule("cosine", 96, warmup_examples=8)
    trainer, _rows = _scheduled(tmp_path, lr_rule={4: 0.01, 8: 0.02, 16: 0.03}, lr_schedule=shape)
    cb = add_noise_scale_callback(trainer, beta=None)
    trainer.train()
    plan = [4] * 4 + [8] * 4 + [16] * 3
    consumed = [sum(plan[:t]) for t in range(len(plan))]
    table = {4: 0.01, 8: 0.02, 16: 0.03}
    want = [shape(c) * table[b] for c, b in zip(consumed, plan)]
    got = [h["learning_rate"] for h in trainer.state.log_history if "learning_rate" in h]
    # the same float64 product taken in another order: a few ulps (the warmup's first rate is 0 in both)
    assert len(got) == 11 and all(math.isclose(g, w, rel_tol=1e-12) for g, w in zip(got, want)), (got, want)
    # the callback saw the scheduled batch sizes: every step measured (equal micro-batches), the last at 16
    assert cb.tracker.steps == 11 and cb.skipped_steps == 0 and cb.tracker.last["batch_size"] == 16


class MarkSkipped(TrainerCallback):
    """Marks the update of one optimizer step as skipped the way an fp16 overflow does (accelerate's
    ``AcceleratedOptimizer.step_was_skipped``, read by the Trainer before stepping its scheduler); the
    update itself still runs (no scaler on CPU), which changes nothing the test looks at."""

    def __init__(self, step: int):
        self.step = step

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        optimizer._is_overflow = state.global_step == self.step


def test_lr_keeps_to_the_plan_when_an_update_is_skipped(tmp_path):
    trainer, _rows = _scheduled(tmp_path)
    trainer.add_callback(MarkSkipped(step=2))
    cb = add_noise_scale_callback(trainer, beta=None)
    trainer.train()
    plan = [4] * 4 + [8] * 4 + [16] * 3
    consumed = [sum(plan[:t]) for t in range(len(plan))]
    want = [0.05 * (1 - c / 96) * b / 4 for c, b in zip(consumed, plan)]
    got = [h["learning_rate"] for h in trainer.state.log_history if "learning_rate" in h]
    # every step's rate is its own (a scheduler counting its step() calls would lag by one after step 2);
    # tolerance: the same float64 product in another order, a few ulps
    assert len(got) == 11 and all(math.isclose(g, w, rel_tol=1e-12) for g, w in zip(got, want)), (got, want)
    # the noise-scale callback left the skipped update out
    assert cb.skipped_steps == 1 and cb.tracker.steps == 10


def test_scheduled_trainer_leaves_the_callers_arguments_alone_and_reads_a_schedule_file(tmp_path):
    args = _args(tmp_path, max_steps=-1)
    SCHEDULE.save(tmp_path / "schedule.json")
    first = ScheduledTrainer(model=Tiny(), args=args, train_dataset=Pairs(40), batch_size_schedule=SCHEDULE,
                             total_examples=96)
    second = ScheduledTrainer(model=Tiny(), args=args, train_dataset=Pairs(40),
                              batch_size_schedule=tmp_path / "schedule.json", total_examples=48)
    assert args.max_steps == -1 and first.args.max_steps == 11 and second.args.max_steps == 8
    assert second.batch_sampler.step_batch_sizes == (4, 4, 4, 4, 8, 8, 8, 8)


def _two_process_worker(rank: int, world: int, port: int, out: str) -> None:
    """One of two gloo processes of a ScheduledTrainer with the noise-scale callback (what accelerate reads
    from torchrun's environment variables); writes its micro-batches, parameters per step and estimate."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    args = _args(pathlib.Path(out), max_steps=-1, per_device_train_batch_size=2, ddp_backend="gloo")
    rows, params = StepRows(), ParamsAtStep()
    trainer = ScheduledTrainer(model=Tiny(), args=args, train_dataset=Pairs(40), callbacks=[rows, params],
                               batch_size_schedule=SCHEDULE, total_examples=96)
    cb = add_noise_scale_callback(trainer, beta=None)
    trainer.train()
    torch.save({"world": args.world_size, "rows": rows.steps, "seen": trainer.model.seen, "params": params.states,
                "state": cb.tracker.state_dict(), "skipped": cb.skipped_steps, "grad_norm_sq": cb.tracker.grad_norm_sq,
                "trace_sigma": cb.tracker.trace_sigma}, os.path.join(out, f"rank{rank}.pt"))


@pytest.mark.slow  # two spawned processes, each importing transformers: 20-30 s, most of it start-up
def test_two_processes_schedule_and_noise_scale(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_two_process_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    plan = [4] * 4 + [8] * 4 + [16] * 3
    for result in ranks:
        assert result["world"] == 2 and result["skipped"] == 0 and result["state"]["steps"] == 11
        # the sampler's own rank split passed through accelerate unsharded: B_t / (k n) rows per micro-batch
        assert result["rows"] == [[b // 4] * 2 for b in plan]
    # every process decided alike and holds the same (all-reduced) estimate
    assert ranks[0]["state"] == ranks[1]["state"]
    # one process replays both ranks' micro-batches at rank 0's parameters of each step, each loss / (k n):
    # the same four small gradients of B / 4 examples and the same mean gradient (grad_scale 1 / (k n))
    model = Tiny()
    tracker = NoiseScaleTracker(model, beta=None, grad_at="backward")
    for t, (state, b) in enumerate(zip(ranks[0]["params"], plan)):
        model.load_state_dict(state)
        model.zero_grad()
        for j in range(2):
            for r in range(2):
                x, y = ranks[r]["seen"][2 * t + j]
                (model(x, y)["loss"] / 4).backward()
        tracker.update(model, batch_size=b, world_size=1, grad_scale=1.0 / 4)
    # gloo's all-reduce sums in another order than one process's accumulation: float32 rounding only
    assert tracker.steps == 11
    assert math.isclose(ranks[0]["grad_norm_sq"], tracker.grad_norm_sq, rel_tol=1e-4)
    assert math.isclose(ranks[0]["trace_sigma"], tracker.trace_sigma, rel_tol=1e-4)


def test_tokens_schedule(tmp_path):
    schedule = BatchSizeSchedule(((0, 32), (64, 64)), unit="tokens")
    trainer, rows = _scheduled(tmp_path, schedule=schedule, total=192, tokens_per_example=8, lr_rule="none")
    trainer.train()
    assert [sum(r) for r in rows.steps] == [4, 4, 8, 8]


# -- batch-size schedules: bad input ----------------------------------------------------------------


def test_non_increasing_schedule_is_one_line_error():
    with pytest.raises(BatchlabError, match="not increasing") as exc:
        BatchSizeSchedule(((0, 8), (16, 4)))
    _one_line(exc)


@pytest.mark.parametrize("kw, match", [
    ({"schedule": BatchSizeSchedule(((0, 4), (16, 7)))}, "multiple of 2"),
    ({"gradient_accumulation_steps": 8}, "multiple of 8"),
    ({"max_steps": 5}, "leave max_steps at -1"),
    ({"warmup_steps": 3}, "warmup"),
    ({"lr_rule": {4: 0.1, 8: 0.2}}, "no rate for batch size"),
    ({"lr_rule": "cube"}, "unknown learning-rate rule"),
    ({"schedule": [(0, 4)]}, "BatchSizeSchedule"),
    ({"total": 0}, "total_examples"),
    ({"schedule": BatchSizeSchedule(((0, 32),), unit="tokens")}, "tokens_per_example"),
    ({"lr_scheduler_type": "reduce_lr_on_plateau", "eval_strategy": "steps", "eval_steps": 1, "eval_dataset": Pairs(8)},
     "not a LambdaLR"),
    ({"lr_scheduler_type": "warmup_stable_decay", "lr_scheduler_kwargs": {"num_decay_steps": 2}},
     "lr_scheduler_kwargs num_decay_steps counts optimizer steps"),
    ({"lr_scheduler_type": "inverse_sqrt"}, "inverse_sqrt's timescale counts optimizer steps"),
])
def test_bad_schedule_input_before_training(tmp_path, kw, match):
    with pytest.raises(BatchlabError, match=match) as exc:
        _scheduled(tmp_path, **kw)
    _one_line(exc)


def test_user_scheduler_and_iterable_dataset_are_errors(tmp_path):
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    with pytest.raises(BatchlabError, match="no scheduler") as exc:
        ScheduledTrainer(model=model, args=_args(tmp_path, max_steps=-1), train_dataset=Pairs(16),
                         optimizers=(opt, sched), batch_size_schedule=SCHEDULE, total_examples=32)
    _one_line(exc)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(Pairs(16))

    with pytest.raises(BatchlabError, match="map-style") as exc:
        ScheduledTrainer(model=Tiny(), args=_args(tmp_path, max_steps=-1), train_dataset=Stream(),
                         batch_size_schedule=SCHEDULE, total_examples=32)
    _one_line(exc)


def test_scheduled_trainer_resumes_the_same_batches(tmp_path):
    full, rows_full = _scheduled(tmp_path / "a", save_strategy="steps", save_steps=5)
    full.train()
    resumed, rows_resumed = _scheduled(tmp_path / "a")
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "out" / "checkpoint-5"))
    assert resumed.state.global_step == 11
    assert [sum(r) for r in rows_resumed.steps] == [sum(r) for r in rows_full.steps][5:]
    # the examples of each resumed step are the uninterrupted run's (the order does not depend on progress)
    assert len(resumed.model.seen) == len(full.model.seen) - 10 == 12
    assert all(torch.equal(a[0], b[0]) for a, b in zip(resumed.model.seen, full.model.seen[10:]))
    # the resumed state's log history holds the first 5 steps from the checkpoint; the rates are the same
    lr = [h["learning_rate"] for h in resumed.state.log_history if "learning_rate" in h]
    lr_full = [h["learning_rate"] for h in full.state.log_history if "learning_rate" in h]
    assert len(lr) == 11 and lr == lr_full
