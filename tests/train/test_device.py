"""Device names, their validation and resolution, and a trial on a GPU when one is present."""

import math

import pytest
import torch

from batchlab.errors import BatchlabError
from batchlab.store import Store
from batchlab.train import TrialSpec, run_trial
from batchlab.train import device as devices
from batchlab.train.device import DEVICE_ENV, check_device, describe_device, resolve_device

NO_CUDA = not torch.cuda.is_available()


def _fake_cuda(monkeypatch, count):
    """Pretend ``count`` CUDA GPUs are present (names and indices only; nothing runs on them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


@pytest.mark.parametrize("name", ["auto", "cpu", " CPU ", "Auto"])
def test_names_always_available(name):
    assert check_device(name) == name.strip().lower()


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "cuda:-1", "tpu", "", "cuda:0:1"])
def test_unknown_names_are_one_line_naming_the_allowed_values(name):
    with pytest.raises(BatchlabError, match="allowed: auto, cpu, cuda, cuda:N, mps") as err:
        check_device(name)
    assert "\n" not in str(err.value)
    with pytest.raises(BatchlabError, match="device must be a string"):
        check_device(3)


@pytest.mark.skipif(not NO_CUDA, reason="needs a machine without a CUDA GPU")
@pytest.mark.parametrize("name", ["cuda", "cuda:0"])
def test_cuda_without_a_gpu_is_an_error(name):
    with pytest.raises(BatchlabError, match="not available.*no CUDA GPU") as err:
        check_device(name)
    assert "\n" not in str(err.value)


def test_auto_resolves_to_the_best_device_and_pinned_workers_to_their_gpu(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    _fake_cuda(monkeypatch, 0)
    monkeypatch.setattr(devices, "_mps_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") and describe_device("cpu") == "cpu"
    _fake_cuda(monkeypatch, 4)
    assert resolve_device("auto") == torch.device("cuda:0") == resolve_device("cuda")
    assert resolve_device("cuda:3") == torch.device("cuda:3")
    with pytest.raises(BatchlabError, match="has 4 CUDA GPU\\(s\\), cuda:0 to cuda:3"):
        check_device("cuda:4")
    monkeypatch.setenv(DEVICE_ENV, "cuda:2")  # a pool worker pinned to GPU 2
    assert resolve_device("auto") == torch.device("cuda:2") == resolve_device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda:1")  # an explicit index wins
    assert resolve_device("cpu") == torch.device("cpu")


def test_bad_device_in_a_trial_is_one_line_and_writes_nothing(tmp_path):
    store = Store.open(tmp_path / "s", create=True)
    spec = TrialSpec(workload="mnist/fc_64_64_64", optimizer="sgd", batch_size=16, hyperparameters={"learning_rate": 0.1},
                     steps=2, train_examples=128, device="gpu")
    with pytest.raises(BatchlabError, match="unknown device 'gpu'; allowed: auto, cpu, cuda, cuda:N, mps") as err:
        run_trial(spec, store=store)
    assert "\n" not in str(err.value) and store.table("trials").num_rows == 0


def test_a_cpu_trial_records_its_device_and_keeps_cpu_study_definitions():
    spec = TrialSpec(workload="mnist/fc_64_64_64", optimizer="sgd", batch_size=16, hyperparameters={"learning_rate": 0.1},
                     steps=3, train_examples=128, evaluation_steps=[3], device="cpu")
    result = run_trial(spec)
    assert result.device == "cpu" and "device" not in result.study_definition


def test_rng_state_round_trip_on_cpu():
    cpu = torch.device("cpu")
    state = devices.get_rng_state(cpu)
    first = torch.rand(3)
    devices.set_rng_state(state, cpu)
    assert torch.equal(torch.rand(3), first)
    here = devices.get_rng_state(cpu)
    expected = torch.rand(3)
    devices.set_rng_state(here, cpu)
    with devices.fork_rng(cpu):
        torch.manual_seed(123)
        torch.rand(5)
    assert torch.equal(torch.rand(3), expected)  # the fork left the caller's stream where it was


@pytest.mark.skipif(NO_CUDA, reason="needs a CUDA GPU")
def test_a_trial_on_cuda_matches_the_cpu_run():
    from batchlab.sweep.vectorized import run_trials_vectorized

    common = dict(workload="mnist/fc_64_64_64", optimizer="momentum", batch_size=32,
                  hyperparameters={"learning_rate": 0.05, "momentum": 0.9}, steps=40, train_examples=512, seed=3,
                  evaluation_steps=[10, 20, 40])
    cpu = run_trial(TrialSpec(**common, device="cpu"))
    gpu = run_trial(TrialSpec(**common, device="cuda"))
    assert gpu.device.startswith("cuda:") and cpu.device == "cpu"
    assert "cuda" in describe_device(gpu.device)
    assert gpu.study_definition["device"] == "cuda" and "device" not in cpu.study_definition
    assert (gpu.status, gpu.steps) == (cpu.status, cpu.steps)
    for a, b in zip(cpu.measurements, gpu.measurements):
        assert a["step"] == b["step"]
        assert b["val/cross_entropy_error"] == pytest.approx(a["val/cross_entropy_error"], rel=1e-3)
        assert abs(b["val/classification_error"] - a["val/classification_error"]) <= 5e-3
    vectorized = run_trials_vectorized([TrialSpec(**common, device="cuda"), TrialSpec(**{**common, "seed": 4}, device="cuda")])
    assert vectorized[0].device == gpu.device and vectorized[0].status == gpu.status
    final = vectorized[0].measurements[-1]["val/cross_entropy_error"]
    assert math.isfinite(final) and final == pytest.approx(gpu.measurements[-1]["val/cross_entropy_error"], rel=1e-3)
