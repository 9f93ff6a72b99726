"""What a worker runs: specs carry the workload key and the device, so spawned workers re-import user workloads."""

import pickle

from batchlab.sweep.executors import LocalPoolExecutor
from batchlab.sweep.plan import StudyPlan, TrialPlan, TrialTask
from batchlab.sweep.worker import run_task, trial_spec
from batchlab.train import run_trial

USER_WORKLOAD = '''
import torch
from torch import nn

from batchlab.workloads import Workload, regression


def data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(300, 4, generator=generator)
    return {"train": (x[:200], x[:200].sum(1)), "val": (x[200:], x[200:].sum(1))}


def workload():
    return Workload(name="toy/sum", make_model=lambda: nn.Linear(4, 1), data=data, task=regression(), goal=0.05)
'''


def _task(reference, device="cpu", trials=2, device_type="cpu"):
    study = StudyPlan(workload=reference, optimizer="sgd", batch_size=16, steps=12, trials=trials, seed=0,
                      train_examples=None, stop_at_goal=False, search_space={}, metric="val/mse", goal=0.05,
                      maximize=False, workload_name="toy/sum", device=device, device_type=device_type)
    plans = tuple(TrialPlan(key=f"k{i}", trial_id=i + 1, point_index=i, seed=5 + i,
                            hyperparameters={"learning_rate": 0.05 * (i + 1)}) for i in range(trials))
    return TrialTask(study, plans, vectorized=False)


def test_specs_carry_the_reference_and_the_device(tmp_path):
    path = tmp_path / "user_workload.py"
    path.write_text(USER_WORKLOAD)
    task = _task(f"{path}:workload")
    spec = trial_spec(task, 1)
    assert spec.workload == f"{path.resolve()}:workload" and isinstance(spec.workload, str)
    assert spec.device == "cpu" and spec.seed == 6 and spec.hyperparameters == {"learning_rate": 0.1}
    assert pickle.loads(pickle.dumps(task)) == task  # plain data: it travels to any worker
    outcomes = run_task(task)
    expected = run_trial(spec)
    assert outcomes[1].measurements == expected.measurements and outcomes[1].status == expected.status
    assert outcomes[1].device == expected.device == "cpu"


def test_auto_becomes_the_device_type_the_driver_recorded(tmp_path):
    # the driver resolved "auto" (its definitions say where trials train); workers must not re-resolve it
    assert trial_spec(_task("toy.py:workload", device="auto", device_type="cuda"), 0).device == "cuda"
    assert trial_spec(_task("toy.py:workload", device="auto", device_type="cpu"), 0).device == "cpu"
    assert trial_spec(_task("toy.py:workload", device="cuda:1", device_type="cuda"), 0).device == "cuda:1"


def test_a_spawned_pool_worker_reimports_a_user_workload_from_its_file(tmp_path):
    path = tmp_path / "user_workload.py"
    path.write_text(USER_WORKLOAD)
    task = _task(f"{path}:workload", trials=1)
    in_process = run_task(task)
    with LocalPoolExecutor(run_task, workers=1) as executor:
        executor.submit(task)
        (outcome,) = list(executor.outcomes())
    assert outcome.error is None and not outcome.lost, outcome.error
    assert [o.measurements for o in outcome.result] == [o.measurements for o in in_process]


def test_a_vectorized_task_whose_model_cannot_be_vectorized_runs_its_trials_one_at_a_time(tmp_path):
    path = tmp_path / "dropout_workload.py"
    path.write_text(USER_WORKLOAD.replace("make_model=lambda: nn.Linear(4, 1)",
                                          "make_model=lambda: nn.Sequential(nn.Dropout(0.2), nn.Linear(4, 1))"))
    task = _task(f"{path}:workload")
    vectorized_task = TrialTask(task.study, task.trials, vectorized=True)
    outcomes = run_task(vectorized_task)
    assert [o.vectorized for o in outcomes] == [False, False]
    assert [o.measurements for o in outcomes] == [o.measurements for o in run_task(task)]  # what run_trial gives
