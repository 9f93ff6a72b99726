"""batchlab.integrations.lightning: the callbacks inside a real lightning.Trainer.fit on CPU."""

from __future__ import annotations

import copy
import math
import os

import pytest

pytest.importorskip("lightning")

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from batchlab.errors import BatchlabError
from batchlab.integrations.lightning import BatchSizeSchedule, NoiseScaleCallback
from batchlab.integrations.schedule import BatchSizeSchedule as Schedule
from batchlab.integrations.schedule import examples_lr_schedule
from batchlab.probes.tracker import NoiseScaleTracker

N, D = 64, 6


def _data(seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=g)
    y = x @ torch.randn(D, 1, generator=g) + 0.5 * torch.randn(N, 1, generator=g)
    return TensorDataset(x, y)


class Regression(pl.LightningModule):
    def __init__(self, lr: float = 0.05, frozen: bool = False, manual: bool = False, scheduler: bool = False):
        super().__init__()
        torch.manual_seed(1)
        self.net = torch.nn.Sequential(torch.nn.Linear(D, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        if frozen:
            self.net.requires_grad_(False)
        self.lr, self.scheduler = lr, scheduler
        self.automatic_optimization = not manual

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        if not self.automatic_optimization:
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        return loss

    def configure_optimizers(self):
        opt = torch.optim.SGD([p for p in self.parameters() if p.requires_grad] or [torch.nn.Parameter(torch.zeros(1))],
                              lr=self.lr)
        if self.scheduler:
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1)}
        return opt


class Recorder(pl.Callback):
    """Per optimizer step: trainer.accumulate_grad_batches, the micro-batches and examples that went into it,
    the optimizer's learning rate when it steps."""

    def __init__(self):
        self.steps, self._micro = [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._micro.append(len(batch[0]))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.steps.append({"accumulate": trainer.accumulate_grad_batches, "micro": list(self._micro),
                           "lr": optimizer.param_groups[0]["lr"]})
        self._micro = []


def _trainer(tmp_path, callbacks, logger=False, **kwargs) -> pl.Trainer:
    return pl.Trainer(default_root_dir=tmp_path, callbacks=callbacks, logger=logger, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, accelerator="cpu", devices=1,
                      log_every_n_steps=1, **kwargs)


def _loader(batch_size: int = 4) -> DataLoader:
    return DataLoader(_data(), batch_size=batch_size, shuffle=False)


def _one_line(exc_info) -> str:
    text = str(exc_info.value)
    assert text and "\n" not in text
    return text


# ---------------------------------------------------------------------------------------------------
# NoiseScaleCallback


def _plain_loop_tracker(k: int, micro: int, steps: int, lr: float) -> NoiseScaleTracker:
    """The same model, data order and SGD run by hand with the tracker the way its docstring says."""
    model = Regression(lr=lr)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    tracker = NoiseScaleTracker(model, beta=None)
    batches = list(_loader(micro))
    for s in range(steps):
        opt.zero_grad()
        for x, y in batches[s * k:(s + 1) * k]:
            (torch.nn.functional.mse_loss(model.net(x), y) / k).backward()
        tracker.update(model, batch_size=k * micro, grad_scale=1.0 / k)
        opt.step()
    return tracker


def test_noise_scale_under_accumulation_equals_the_plain_loop(tmp_path):
    k, micro, steps = 4, 4, 4
    callback = NoiseScaleCallback(beta=None, batch_size_fn=lambda batch: int(batch[1].shape[0]))
    trainer = _trainer(tmp_path, [callback], accumulate_grad_batches=k, max_steps=steps)
    trainer.fit(Regression(), _loader(micro))
    plain = _plain_loop_tracker(k, micro, steps, lr=0.05)
    ours = callback.tracker
    assert ours.steps == plain.steps == steps
    assert ours.last["batch_size"] == k * micro and ours.last["small_batch_size"] == micro
    # Lightning's closure runs the same float32 operations in the same order, but through other code (its
    # loss division, its optimizer wrapper): agreement to float32 rounding, not bitwise, is what holds
    for name in ("grad_norm_sq", "trace_sigma", "b_simple"):
        assert getattr(ours, name) == pytest.approx(getattr(plain, name), rel=1e-5), name
    reading = callback.reading
    assert reading["steps"] == steps and reading["b_simple_low"] is not None
    assert reading == ours.reading(level=0.9)


def test_noise_scale_reads_gradients_before_lightnings_clipping(tmp_path):
    # on_before_optimizer_step runs before gradient_clip_val rewrites .grad: one step's estimate is the
    # same with a clip that shrinks the gradient 1000-fold as without (same run, bitwise)
    last = []
    for clip in (None, 1e-3):
        callback = NoiseScaleCallback(beta=None)
        _trainer(tmp_path, [callback], accumulate_grad_batches=2, max_steps=1, gradient_clip_val=clip).fit(
            Regression(), _loader(4))
        last.append(callback.tracker.last)
    assert last[0] == last[1] and last[0]["grad_norm_sq"] > 1e-3


def test_noise_scale_every_n_and_the_epochs_partial_step_is_skipped(tmp_path):
    # 64 examples / micro 4 = 16 micro-batches per epoch; k = 5: steps of 5, 5, 5 and a last one of 1.
    # every=3: steps 1 (call 0) measured, 2, 3 counted; step 4 (call 3) is due but has one micro-batch (one
    # batch size): left out, calls stay at 3, so epoch 2's first step (call 3) is measured instead; then
    # steps 6, 7 counted (calls 4, 5) and step 8 (call 6) left out the same way
    callback = NoiseScaleCallback(every=3, beta=None)
    trainer = _trainer(tmp_path, [callback], accumulate_grad_batches=5, max_epochs=2)
    trainer.fit(Regression(), _loader(4))
    assert trainer.global_step == 8
    assert callback.skipped_steps == 2
    assert callback.tracker.calls == 6 and callback.tracker.steps == 2


def test_noise_scale_leaves_out_a_step_of_unequal_micro_batches(tmp_path):
    # 64 examples in micro-batches of 5: 12 of 5 and a last of 4; k = 2: 6 steps of [5, 5] and one of [5, 4]
    callback = NoiseScaleCallback(beta=None)
    trainer = _trainer(tmp_path, [callback], accumulate_grad_batches=2, max_epochs=1)
    trainer.fit(Regression(), _loader(5))
    assert trainer.global_step == 7 and callback.skipped_steps == 1 and callback.tracker.steps == 6
    # the six equal steps are exactly what a plain loop measures (float32 rounding of another code path)
    plain = _plain_loop_tracker(2, 5, 6, lr=0.05)
    for name in ("grad_norm_sq", "trace_sigma"):
        assert getattr(callback.tracker, name) == pytest.approx(getattr(plain, name), rel=1e-5), name


class Blows(Regression):
    """Its loss is inf on micro-batches 2 and 3 of each epoch (the second optimizer step at k = 2)."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float("inf") if batch_idx in (2, 3) else loss


def test_noise_scale_leaves_out_a_step_the_grad_scaler_skips(tmp_path):
    from lightning.pytorch.plugins.precision import MixedPrecision

    # 16-bit AMP with a real GradScaler on CPU (Lightning turns "16-mixed" into bf16 on CPU, which has none);
    # a scale of 1 so that only the inf loss overflows (the default 65536 overflows fp16 on its own at first)
    callback = NoiseScaleCallback(beta=None)
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    trainer = _trainer(tmp_path, [callback], accumulate_grad_batches=2, max_epochs=1,
                       plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)])
    trainer.fit(Blows(), _loader(4))
    assert scaler.get_scale() == 0.5  # the scaler found inf once and skipped that update (it halves its scale)
    assert callback.skipped_steps == 1 and callback.tracker.steps == 7
    # the running sums stayed finite: the overflowed step never reached them
    assert math.isfinite(callback.tracker.trace_sigma) and math.isfinite(callback.tracker.grad_norm_sq)
    assert {"noise_scale/trace_sigma", "noise_scale/grad_norm_sq"} <= set(callback.logged_values())


class BuiltInConfigureModel(Regression):
    """Builds its layers in configure_model (after the callbacks' setup), as large models do."""

    def __init__(self):
        super().__init__()
        del self.net

    def configure_model(self):
        if not hasattr(self, "net"):
            torch.manual_seed(1)
            self.net = torch.nn.Sequential(torch.nn.Linear(D, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def test_noise_scale_with_layers_built_in_configure_model(tmp_path):
    callback = NoiseScaleCallback(beta=None)
    _trainer(tmp_path, [callback], accumulate_grad_batches=4, max_steps=4).fit(BuiltInConfigureModel(), _loader(4))
    # the same layers (same seed) as Regression: the same estimate as the plain loop
    plain = _plain_loop_tracker(4, 4, 4, lr=0.05)
    assert callback.tracker.steps == 4
    assert callback.tracker.trace_sigma == pytest.approx(plain.trace_sigma, rel=1e-5)  # float32, another code path


def _event_scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_logging_through_tensorboard(tmp_path):
    from lightning.pytorch.loggers import TensorBoardLogger

    logger = TensorBoardLogger(tmp_path, name="tb", version=0)
    noise = NoiseScaleCallback(beta=None, per_layer=True)
    schedule = BatchSizeSchedule(Schedule(((0, 8), (32, 16))), micro_batch_size=4)
    trainer = _trainer(tmp_path, [noise, schedule], logger=logger, max_steps=6)
    trainer.fit(Regression(), _loader(4))
    scalars = _event_scalars(logger.log_dir)
    assert {"noise_scale/b_simple_low", "noise_scale/trace_sigma", "noise_scale/grad_norm_sq",
            "noise_scale/layer/net.0/trace_sigma", "noise_scale/layer/net.2/grad_norm_sq",
            "batch_schedule/batch_size", "batch_schedule/accumulate_grad_batches", "batch_schedule/lr",
            "batch_schedule/consumed"} <= set(scalars)
    assert [v for _, v in scalars["batch_schedule/batch_size"]] == [8, 8, 8, 8, 16, 16]
    assert [v for _, v in scalars["batch_schedule/accumulate_grad_batches"]] == [2, 2, 2, 2, 4, 4]
    assert [v for _, v in scalars["batch_schedule/consumed"]] == [0, 8, 16, 24, 32, 48]
    # the last logged values are the callback's last reading (TensorBoard stores float32)
    last = noise.logged_values()
    assert scalars["noise_scale/b_simple_low"][-1][1] == pytest.approx(last["noise_scale/b_simple_low"], rel=1e-6)
    assert len(scalars["noise_scale/trace_sigma"]) == 6
    assert ("noise_scale/b_simple" in scalars) == noise.reading["resolved"]
    per_layer = sum(v for k, v in last.items() if k.startswith("noise_scale/layer/") and k.endswith("trace_sigma"))
    assert per_layer == pytest.approx(last["noise_scale/trace_sigma"])  # the layers add up


def test_logging_through_wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    logger = WandbLogger(offline=True, save_dir=str(tmp_path), project="batchlab-test")
    noise = NoiseScaleCallback(beta=None)
    schedule = BatchSizeSchedule(Schedule(((0, 8),)), micro_batch_size=4)
    trainer = _trainer(tmp_path, [noise, schedule], logger=logger, max_steps=3)
    try:
        trainer.fit(Regression(), _loader(4))
        summary = dict(logger.experiment.summary)
    finally:
        import wandb

        wandb.finish()
        # wandb keeps a per-process singleton holding the first run's settings (its WANDB_DIR): tear it
        # down, or a later W&B test in this process (the Hugging Face one) writes under this test's directory
        wandb.teardown()
    assert summary["batch_schedule/batch_size"] == 8
    assert summary["noise_scale/trace_sigma"] == pytest.approx(noise.reading["trace_sigma"])
    assert summary["noise_scale/b_simple_low"] == pytest.approx(noise.reading["b_simple_low"])
    assert list((tmp_path / "wandb").glob("offline-run-*"))  # written offline, where asked


def test_nothing_logged_without_a_logger(tmp_path):
    noise = NoiseScaleCallback(beta=None)
    schedule = BatchSizeSchedule(Schedule(((0, 8),)), micro_batch_size=4)
    trainer = _trainer(tmp_path, [noise, schedule], logger=False, max_steps=3)
    trainer.fit(Regression(), _loader(4))
    assert noise.reading["steps"] == 3 and noise.logged_values()  # measured, just not logged
    assert not any(k.startswith(("noise_scale/", "batch_schedule/")) for k in trainer.callback_metrics)
    assert not trainer.logged_metrics
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no log directory either


def test_logged_values_follow_resolution():
    callback = NoiseScaleCallback(prefix="ns/")
    callback.reading = {"b_simple": None, "b_simple_low": 12.0, "b_simple_high": None, "trace_sigma": 3.0,
                        "grad_norm_sq": -0.1, "steps": 5, "resolved": False, "level": 0.9}
    assert callback.logged_values() == {"ns/b_simple_low": 12.0, "ns/trace_sigma": 3.0, "ns/grad_norm_sq": -0.1}
    callback.reading = {"b_simple": 20.0, "b_simple_low": 12.0, "b_simple_high": 40.0, "trace_sigma": 3.0,
                        "grad_norm_sq": 0.15, "steps": 5, "resolved": True, "level": 0.9}
    assert callback.logged_values()["ns/b_simple"] == 20.0 and callback.logged_values()["ns/b_simple_high"] == 40.0


@pytest.mark.parametrize("module, kwargs, match", [
    (lambda: Regression(frozen=True), {"accumulate_grad_batches": 2}, "Regression has no trainable parameters"),
    (lambda: Regression(manual=True), {}, "automatic optimization only"),
    (Regression, {}, "accumulate_grad_batches=1 sees only one batch size; set Trainer.accumulate_grad_batches >= 2"),
])
def test_noise_scale_bad_setups_are_one_line_errors(tmp_path, module, kwargs, match):
    recorder = Recorder()
    trainer = _trainer(tmp_path, [NoiseScaleCallback(), recorder], max_steps=2, **kwargs)
    with pytest.raises(BatchlabError, match=match.replace("(", r"\(").replace(")", r"\)")) as exc:
        trainer.fit(module(), _loader(4))
    _one_line(exc)
    assert recorder.steps == []  # refused before the first step


def test_noise_scale_refuses_a_schedule_starting_at_one_micro_batch(tmp_path):
    trainer = _trainer(tmp_path, [NoiseScaleCallback(), BatchSizeSchedule(Schedule(((0, 4), (16, 8))))], max_steps=2)
    with pytest.raises(BatchlabError, match="starts at one micro-batch") as exc:
        trainer.fit(Regression(), _loader(4))
    _one_line(exc)


@pytest.mark.parametrize("kwargs, match", [
    ({"every": 0}, "every"), ({"beta": 1.0}, "beta"), ({"beta": "0.9"}, "beta"), ({"level": 1.5}, "level"),
    ({"prefix": 3}, "prefix"),
])
def test_noise_scale_bad_arguments(kwargs, match):
    with pytest.raises(BatchlabError, match=match):
        NoiseScaleCallback(**kwargs)


# ---------------------------------------------------------------------------------------------------
# BatchSizeSchedule


def _replay(steps: list[dict], base_lr: float) -> torch.nn.Module:
    """A plain loop that takes each recorded step's micro-batches, in data order, with loss / k and the
    recorded learning rate: what the Lightning run must have computed."""
    model = Regression(lr=base_lr)
    opt = torch.optim.SGD(model.parameters(), lr=base_lr)
    epoch = list(_loader(4))
    position = 0
    for step in steps:
        opt.zero_grad()
        for _ in step["micro"]:
            x, y = epoch[position % len(epoch)]
            position += 1
            (torch.nn.functional.mse_loss(model.net(x), y) / step["accumulate"]).backward()
        for group in opt.param_groups:
            group["lr"] = step["lr"]
        opt.step()
    return model


def test_schedule_follows_examples_and_owns_the_lr(tmp_path):
    # micro 4, 16 micro-batches an epoch. 8 -> 16 at 40 examples: the change is due at batch_idx 10, which
    # is not a multiple of the new k = 4 (Lightning zeroes at batch_idx % k == 0), so one more step of 8
    # runs and 16 starts at batch_idx 12 (48 examples). 16 -> 32 at 96: due at the start of epoch 2's
    # batch_idx 8, a multiple of 8: on time.
    lr_schedule = examples_lr_schedule("cosine", total_examples=200, warmup_examples=16)
    callback = BatchSizeSchedule(Schedule(((0, 8), (40, 16), (96, 32))), rule="sqrt", lr_schedule=lr_schedule)
    recorder = Recorder()
    trainer = _trainer(tmp_path, [callback, recorder], max_epochs=3)
    model = Regression(lr=0.1)
    trainer.fit(model, _loader(4))
    sizes = [sum(s["micro"]) for s in recorder.steps]
    assert sizes == [8] * 6 + [16] * 3 + [32] * 3
    assert [s["accumulate"] for s in recorder.steps] == [2] * 6 + [4] * 3 + [8] * 3
    assert [len(s["micro"]) for s in recorder.steps] == [s["accumulate"] for s in recorder.steps]
    consumed = [sum(sizes[:i]) for i in range(len(sizes))]
    assert [h["consumed"] for h in callback.history] == consumed
    assert callback.consumed == sum(sizes) == 3 * N and callback.steps == trainer.global_step == 12
    # lr = base_lr x f(examples consumed) x sqrt(B / B0); the callback takes the same float64 product in
    # another order: a few ulps (rel), and the warmup's first rate is 0 in both (abs covers nothing else)
    for step, before in zip(recorder.steps, consumed):
        want = 0.1 * lr_schedule(before) * math.sqrt(sum(step["micro"]) / 8)
        assert step["lr"] == pytest.approx(want, rel=1e-12, abs=1e-300)
    # the accumulation Lightning ran is exactly the planned one: a plain loop taking the same micro-batches
    # per step ends at the same parameters (float32 rounding of different code paths: tolerance)
    replayed = _replay(recorder.steps, 0.1)
    for ours, plain in zip(model.parameters(), replayed.parameters()):
        torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-6)


def test_schedule_linear_rule_base_lr_and_table(tmp_path):
    recorder = Recorder()
    callback = BatchSizeSchedule(Schedule(((0, 4), (16, 8))), base_lr=0.02, base_batch_size=8, rule="linear")
    _trainer(tmp_path, [callback, recorder], max_steps=6).fit(Regression(lr=0.5), _loader(4))
    assert [(sum(s["micro"]), s["lr"]) for s in recorder.steps] == [(4, 0.01)] * 4 + [(8, 0.02)] * 2
    recorder = Recorder()
    callback = BatchSizeSchedule(Schedule(((0, 4), (16, 8))), rule={4: 0.3, 8: 0.7})
    _trainer(tmp_path, [callback, recorder], max_steps=6).fit(Regression(lr=0.5), _loader(4))
    assert [s["lr"] for s in recorder.steps] == [0.3] * 4 + [0.7] * 2


def test_schedule_in_tokens(tmp_path):
    # 10 tokens an example, micro-batches of 4 examples = 40 tokens; 80 -> 160 tokens per step at 320 tokens
    recorder = Recorder()
    callback = BatchSizeSchedule(Schedule(((0, 80), (320, 160)), unit="tokens"), tokens_per_example=10)
    _trainer(tmp_path, [callback, recorder], max_steps=6).fit(Regression(), _loader(4))
    assert [s["accumulate"] for s in recorder.steps] == [2, 2, 2, 2, 4, 4]
    assert [h["consumed"] for h in callback.history] == [0, 80, 160, 240, 320, 480]


def test_schedule_in_tokens_counted_by_tokens_fn(tmp_path):
    # tokens_fn counts a micro-batch's tokens itself, here as a 0-dim integer tensor (like mask.sum()):
    # 7 "non-padding" tokens per example, so a step of k = 2 micro-batches of 4 consumes 56 tokens
    callback = BatchSizeSchedule(Schedule(((0, 80), (320, 160)), unit="tokens"), tokens_per_example=10,
                                 tokens_fn=lambda batch: (torch.ones(len(batch[0]), 7, dtype=torch.int64)).sum())
    _trainer(tmp_path, [callback], max_steps=7).fit(Regression(), _loader(4))
    assert [h["consumed"] for h in callback.history] == [56 * i for i in range(6)] + [336]
    assert [h["accumulate_grad_batches"] for h in callback.history] == [2] * 6 + [4]


def test_schedule_state_is_checkpointed():
    callback = BatchSizeSchedule(Schedule(((0, 8), (40, 16))))
    callback.consumed, callback.steps, callback.accumulation = 48, 6, 4
    restored = BatchSizeSchedule(Schedule(((0, 8), (40, 16))))
    restored.load_state_dict(copy.deepcopy(callback.state_dict()))
    assert (restored.consumed, restored.steps, restored.accumulation) == (48, 6, 4)
    with pytest.raises(BatchlabError, match="different batch-size schedule"):
        BatchSizeSchedule(Schedule(((0, 8),))).load_state_dict(callback.state_dict())


def _fit_with_checkpoints(root, ckpt_path=None):
    """Two epochs of both callbacks (8 -> 16 examples per step at 64 examples: 8 steps of k = 2, then 4 of
    k = 4), a checkpoint at the end of each epoch; resumed from ``ckpt_path`` when given."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    noise = NoiseScaleCallback(beta=None)
    schedule = BatchSizeSchedule(Schedule(((0, 8), (64, 16))), micro_batch_size=4)
    checkpoints = ModelCheckpoint(dirpath=root / "ckpt", every_n_epochs=1, save_top_k=-1)
    trainer = pl.Trainer(default_root_dir=root, callbacks=[noise, schedule, checkpoints], logger=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
                         max_epochs=2)
    model = Regression()
    trainer.fit(model, _loader(4), ckpt_path=ckpt_path)
    return trainer, model, noise, schedule


def test_both_callbacks_resume_from_a_checkpoint(tmp_path):
    full_trainer, full_model, full_noise, full_schedule = _fit_with_checkpoints(tmp_path / "full")
    first_epoch = sorted((tmp_path / "full" / "ckpt").glob("epoch=0-*.ckpt"))
    assert len(first_epoch) == 1 and full_trainer.global_step == 12
    trainer, model, noise, schedule = _fit_with_checkpoints(tmp_path / "resumed", ckpt_path=first_epoch[0])
    assert trainer.global_step == 12
    # epoch 2 alone, from the checkpoint: the schedule's progress and the tracker's running sums continue
    assert [h["step"] for h in schedule.history] == list(range(8, 12))
    assert schedule.history == full_schedule.history[8:]
    assert (schedule.consumed, schedule.steps, schedule.accumulation) == (128, 12, 4)
    # the same float32 operations on the same batches from restored parameters: bitwise the same run
    assert noise.tracker.state_dict() == full_noise.tracker.state_dict()
    assert noise.reading == full_noise.reading and noise.tracker.steps == 12
    for ours, theirs in zip(model.parameters(), full_model.parameters()):
        assert torch.equal(ours, theirs)


def test_schedule_reads_its_file(tmp_path):
    path = tmp_path / "schedule.json"
    Schedule(((0, 8), (40, 16))).save(path)
    assert BatchSizeSchedule(path).schedule == Schedule(((0, 8), (40, 16)))
    assert BatchSizeSchedule(os.fspath(path)).schedule.batch_sizes == [8, 16]


@pytest.mark.parametrize("make, match", [
    (lambda: BatchSizeSchedule(Schedule(((0, 16), (10, 8)))), "not increasing"),
    (lambda: BatchSizeSchedule({"format": "batchlab.batch_size_schedule", "version": 1, "unit": "examples",
                                "points": [{"start": 0, "batch_size": 16}, {"start": 10, "batch_size": 16}]}),
     "not increasing"),
    (lambda: BatchSizeSchedule({"format": "batchlab.batch_size_schedule", "version": 1,
                                "points": [{"start": 0, "batch_size": 16}]}), "has no 'unit'"),
    (lambda: BatchSizeSchedule([(0, 8)]), "schedule must be a batchlab BatchSizeSchedule"),
    (lambda: BatchSizeSchedule(Schedule(((0, 8), (10, 16))), rule={8: 0.1}), "no rate for batch size.s. 16"),
    (lambda: BatchSizeSchedule(Schedule(((0, 8),)), rule="cubic"), "unknown learning-rate rule 'cubic'"),
    (lambda: BatchSizeSchedule(Schedule(((0, 80),), unit="tokens")), "needs tokens_per_example"),
    (lambda: BatchSizeSchedule(Schedule(((0, 8),)), tokens_per_example=4), "applies to a batch-size schedule in tokens"),
    (lambda: BatchSizeSchedule(Schedule(((0, 8),)), tokens_fn=len), "tokens_fn applies to a batch-size schedule in tokens"),
    (lambda: BatchSizeSchedule(Schedule(((0, 8),)), base_lr=-1.0), "base_lr"),
    (lambda: BatchSizeSchedule(Schedule(((0, 8),)), micro_batch_size=0), "micro_batch_size"),
    (lambda: BatchSizeSchedule(Schedule(((0, 8),)), lr_schedule=0.5), "lr_schedule must be a callable"),
])
def test_schedule_bad_arguments_are_one_line_errors(make, match):
    with pytest.raises(BatchlabError, match=match) as exc:
        make()
    _one_line(exc)


@pytest.mark.parametrize("callback, module, kwargs, match", [
    # unreachable: 10 is not 4 x k; with micro_batch_size given, refused in setup
    (lambda: BatchSizeSchedule(Schedule(((0, 8), (32, 10))), micro_batch_size=4), Regression, {},
     "batch size 10 is not reachable by gradient accumulation with micro-batches of 4"),
    # the same read from the dataloader, refused in on_train_start, before the first batch
    (lambda: BatchSizeSchedule(Schedule(((0, 8), (32, 10)))), Regression, {}, "batch size 10 is not reachable"),
    (lambda: BatchSizeSchedule(Schedule(((0, 2),))), Regression, {}, "batch size 2 is not reachable"),
    (lambda: BatchSizeSchedule(Schedule(((0, 8),))), lambda: Regression(scheduler=True), {},
     "also returns an lr_scheduler"),
    (lambda: BatchSizeSchedule(Schedule(((0, 8),))), Regression, {"accumulate_grad_batches": 2},
     "remove Trainer.accumulate_grad_batches=2."),
    (lambda: BatchSizeSchedule(Schedule(((0, 8),))), lambda: Regression(manual=True), {}, "automatic optimization only"),
])
def test_schedule_bad_setups_are_refused_before_the_first_step(tmp_path, callback, module, kwargs, match):
    recorder = Recorder()
    trainer = _trainer(tmp_path, [callback(), recorder], max_steps=3, **kwargs)
    with pytest.raises(BatchlabError, match=match) as exc:
        trainer.fit(module(), _loader(4))
    _one_line(exc)
    assert recorder.steps == []


# ---------------------------------------------------------------------------------------------------
# DDP: two CPU processes (gloo), both callbacks


class _WriteRankZero(pl.Callback):
    """Rank 0 writes what the spawned run's callbacks hold (ddp_spawn returns no callback state)."""

    def __init__(self, path):
        self.path = str(path)

    def on_train_end(self, trainer, pl_module):
        if trainer.global_rank != 0:
            return
        noise = next(c for c in trainer.callbacks if isinstance(c, NoiseScaleCallback))
        schedule = next(c for c in trainer.callbacks if isinstance(c, BatchSizeSchedule))
        import json

        with open(self.path, "w") as handle:
            json.dump({"history": schedule.history, "last": noise.tracker.last, "steps": noise.tracker.steps,
                       "grad_norm_sq": noise.tracker.grad_norm_sq, "trace_sigma": noise.tracker.trace_sigma}, handle)


class _RankData(Regression):
    """Each rank's examples r, r + 2, ... in order (a DistributedSampler without shuffling, made here so
    the test knows the split; Lightning's own sampler shuffles)."""

    def train_dataloader(self):
        data = _data()
        sampler = torch.utils.data.DistributedSampler(data, num_replicas=2, rank=self.global_rank, shuffle=False)
        return DataLoader(data, batch_size=4, sampler=sampler)


@pytest.mark.slow  # two spawned processes, each importing lightning: 10-25 s, most of it start-up
def test_ddp_two_processes_count_examples_over_workers_and_match_one_process(tmp_path):
    import json

    out = tmp_path / "rank0.json"
    # micro-batches of 4 per device on 2 devices: 16 -> k = 2, 32 (from 64 examples on) -> k = 4
    callbacks = [BatchSizeSchedule(Schedule(((0, 16), (64, 32)))), NoiseScaleCallback(beta=None), _WriteRankZero(out)]
    trainer = pl.Trainer(default_root_dir=tmp_path, callbacks=callbacks, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, accelerator="cpu", devices=2,
                         strategy="ddp_spawn", max_steps=6, use_distributed_sampler=False)
    trainer.fit(_RankData())
    result = json.loads(out.read_text())
    assert [h["batch_size"] for h in result["history"]] == [16, 16, 16, 16, 32, 32]
    assert [h["accumulate_grad_batches"] for h in result["history"]] == [2, 2, 2, 2, 4, 4]
    assert result["last"]["batch_size"] == 32 and result["last"]["small_batch_size"] == 4
    # one process, the same micro-batches (rank r: examples r, r + 2, ...)
    model = Regression()
    opt = torch.optim.SGD(model.parameters(), lr=model.lr)
    tracker = NoiseScaleTracker(model, beta=None)
    data = _data()
    per_rank = [[data[i] for i in range(r, N, 2)] for r in range(2)]
    position = 0
    for h in result["history"]:
        k = h["accumulate_grad_batches"]
        opt.zero_grad()
        for j in range(position, position + k):
            for r in range(2):
                rows = per_rank[r][4 * (j % 8):4 * (j % 8) + 4]
                x, y = torch.stack([a for a, _ in rows]), torch.stack([b for _, b in rows])
                (torch.nn.functional.mse_loss(model.net(x), y) / (2 * k)).backward()
        position += k
        tracker.update(model, batch_size=8 * k, world_size=1, grad_scale=1.0 / (2 * k))
        opt.param_groups[0]["lr"] = h["lr"][0]  # the schedule's linear rule: 0.05 at 16, 0.1 at 32
        opt.step()
    # DDP all-reduces in another order of float32 additions than one process's accumulation: rounding only
    assert result["steps"] == tracker.steps == 6
    assert result["grad_norm_sq"] == pytest.approx(tracker.grad_norm_sq, rel=1e-4)
    assert result["trace_sigma"] == pytest.approx(tracker.trace_sigma, rel=1e-4)
