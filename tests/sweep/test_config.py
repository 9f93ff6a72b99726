"""Sweep configuration: TOML loading and one-line validation errors naming the field."""

from __future__ import annotations

import pytest

from batchlab.errors import BatchlabError
from batchlab.sweep.config import SweepConfig, load_sweep_config, parse_sweep_config

GOOD = """
workloads = ["mnist/fc_64_64_64"]
optimizers = ["sgd", "momentum"]
batch_sizes = [64, 16]
trials = 4
store = "runs/x"
steps = 100
train_examples = 1000

[budgets]
16 = 300

[search_spaces.sgd.learning_rate]
type = "DOUBLE"
min_value = 0.01
max_value = 1.0
scale = "LOG_SCALE"
"""


def test_good_file_loads_with_defaults_and_budgets(tmp_path):
    path = tmp_path / "sweep.toml"
    path.write_text(GOOD)
    config = load_sweep_config(path)
    assert config.batch_sizes == [16, 64]
    from batchlab.workloads import get_workload

    workload = get_workload("mnist/fc_64_64_64")
    assert config.study_steps(workload, 16) == 300 and config.study_steps(workload, 64) == 100
    assert config.executor == "local" and not config.uses_dask and config.vectorize == "auto"
    assert config.stop_at_goal is True and config.grow_budget is False


def test_command_line_overrides_win(tmp_path):
    path = tmp_path / "sweep.toml"
    path.write_text(GOOD)
    config = load_sweep_config(path, {"trials": 9, "workers": 3, "store": None})
    assert config.trials == 9 and config.workers == 3 and config.store == "runs/x"


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"executor": "ray"}, "field 'executor': Input should be 'local' or 'dask'"),
        ({"trials": 0}, "field 'trials': Input should be greater than or equal to 1"),
        ({"batch_sizes": [16, 16]}, "field 'batch_sizes': batch sizes must be distinct"),
        ({"batch_sizes": [0, 16]}, "field 'batch_sizes': batch sizes must be positive"),
        ({"vectorize": "yes"}, "field 'vectorize': Input should be 'auto', 'always' or 'never'"),
        ({"trails": 3}, "unknown field 'trails'; allowed fields: workloads, optimizers, batch_sizes, trials"),
        ({"budgets": {"32": 10}}, "budgets: batch sizes [32] are not in batch_sizes; allowed: [16, 64]"),
        ({"scheduler": "10.0.0.1"}, "field 'scheduler': scheduler must look like tcp://HOST:PORT"),
        ({"steps": 10, "budget_epochs": 2.0}, "steps (a fixed budget) and budget_epochs (an epoch budget) exclude"),
        ({"steps": 10, "min_steps": 2}, "min_steps bounds the epoch budget and cannot be combined with steps"),
        ({"min_steps": 20, "max_steps": 10}, "min_steps 20 exceeds max_steps 10; allowed: min_steps <= max_steps"),
        ({"budget_epochs": 0}, "field 'budget_epochs': Input should be greater than 0"),
        ({"resolution": 1.5}, "field 'resolution': Input should be less than 1"),
        ({"schedule": "cosine"}, "field 'schedule': Input should be 'constant' or 'linear'"),
        ({"optimizers": ["sgd", "momentun"]}, "field 'optimizers': unknown optimizer 'momentun' (did you mean 'momentum'?)"),
        ({"workloads": ["mnist/fc_128"]}, "field 'workloads': unknown workload 'mnist/fc_128'"),
        ({"search_spaces": {"sgd": {"learning_rate": {"type": "DOUBLE", "min_value": 1, "max_value": 2, "scale": "CUBIC"}}}},
         "field 'search_spaces.sgd': parameter 'learning_rate': unknown scale 'CUBIC'; allowed:"),
    ],
)
def test_bad_values_are_one_line_naming_field_and_allowed(change, expected):
    data = {"workloads": ["mnist/fc_64_64_64"], "optimizers": ["sgd"], "batch_sizes": [16, 64], "trials": 2}
    data.update(change)
    with pytest.raises(BatchlabError) as info:
        parse_sweep_config(data, source="s.toml")
    message = str(info.value)
    assert "\n" not in message and message.startswith("s.toml: ")
    assert expected in message


def test_missing_required_field_and_bad_toml(tmp_path):
    with pytest.raises(BatchlabError, match="field 'trials' is required"):
        parse_sweep_config({"workloads": ["mnist/fc_64_64_64"], "optimizers": ["sgd"], "batch_sizes": [1]})
    path = tmp_path / "bad.toml"
    path.write_text("trials = [1,\n")
    with pytest.raises(BatchlabError, match="not valid TOML"):
        load_sweep_config(path)
    with pytest.raises(BatchlabError, match="does not exist"):
        load_sweep_config(tmp_path / "missing.toml")


def test_scheduler_means_dask_and_workers_default_to_cores():
    config = SweepConfig(workloads=["w"], optimizers=["sgd"], batch_sizes=[1], trials=1, scheduler="tcp://127.0.0.1:8786")
    assert config.uses_dask
    assert config.resolved_workers() >= 1


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"batch_sizes": [True]}, "field 'batch_sizes.0': Input should be a valid integer"),
        ({"trials": True}, "field 'trials': Input should be a valid integer"),
        ({"steps": 2.0}, "field 'steps': Input should be a valid integer"),
        ({"budgets": {"16": True}}, "field 'budgets.16': Input should be a valid integer"),
        ({"stop_at_goal": "yes"}, "field 'stop_at_goal': Input should be a valid boolean"),
        ({"goal": float("nan")}, "field 'goal': must be a finite number, got nan"),
        ({"goal": float("inf")}, "field 'goal': must be a finite number, got inf"),
        ({"goal": True}, "field 'goal': must be a finite number, got True"),
        ({"grow_factor": float("nan")}, "field 'grow_factor': must be a finite number"),
    ],
)
def test_booleans_and_non_finite_numbers_are_not_silently_coerced(change, expected):
    data = {"workloads": ["mnist/fc_64_64_64"], "optimizers": ["sgd"], "batch_sizes": [16, 64], "trials": 2}
    data.update(change)
    with pytest.raises(BatchlabError) as info:
        parse_sweep_config(data, source="s.toml")
    assert "\n" not in str(info.value) and expected in str(info.value)


def test_integer_and_float_goals_are_accepted():
    data = {"workloads": ["mnist/fc_64_64_64"], "optimizers": ["sgd"], "batch_sizes": [16], "trials": 2}
    assert parse_sweep_config({**data, "goal": 0}).goal == 0.0
    assert parse_sweep_config({**data, "goal": 0.05, "grow_factor": 3}).grow_factor == 3.0


def test_budget_rule_keys_mirror_the_flags(tmp_path):
    from batchlab.workloads import get_workload

    path = tmp_path / "sweep.toml"
    path.write_text('workloads = ["mnist/fc_64_64_64"]\noptimizers = ["sgd"]\nbatch_sizes = [8, 64, 512]\n'
                    'trials = 2\nbudget_epochs = 1.0\nmin_steps = 100\nmax_steps = 5000\ntrain_examples = 10000\n'
                    'resolution = 0.1\nschedule = "linear"\n')
    config = load_sweep_config(path, {"min_steps": 50})
    workload = get_workload("mnist/fc_64_64_64")
    assert [config.study_steps(workload, b) for b in (8, 64, 512)] == [1250, 157, 50]
    assert config.budget_rule(workload) == {"rule": "examples", "examples": 10000, "min_steps": 50, "max_steps": 5000,
                                            "basis": "epochs", "epochs": 1.0, "train_examples": 10000}
    assert config.resolution == 0.1 and config.schedule == "linear"


def test_command_line_defaults_live_in_the_library(tmp_path):
    from batchlab.sweep.config import DEFAULT_OPTIMIZERS, sweep_config_from_options

    config = sweep_config_from_options("mnist/fc_64_64_64", None, {"batch_sizes": [8], "trials": 1, "store": "s",
                                                                   "seed": None})
    assert config.optimizers == list(DEFAULT_OPTIMIZERS) == ["sgd"] and config.seed == 0
    with pytest.raises(BatchlabError, match="missing --batch-sizes, --trials"):
        sweep_config_from_options("mnist/fc_64_64_64", None, {"store": "s"})
    with pytest.raises(BatchlabError, match="either WORKLOAD or --config"):
        sweep_config_from_options("mnist/fc_64_64_64", tmp_path / "x.toml", {})
    with pytest.raises(BatchlabError, match="missing WORKLOAD"):
        sweep_config_from_options(None, None, {})


def test_stop_at_goal_has_one_default():
    from batchlab.sweep.config import DEFAULT_STOP_AT_GOAL, SweepConfig

    assert DEFAULT_STOP_AT_GOAL is True
    assert SweepConfig.model_fields["stop_at_goal"].default is DEFAULT_STOP_AT_GOAL
    import typer.main

    from batchlab.cli import app

    command = typer.main.get_command(app)
    for name in ("train", "study"):
        (param,) = [p for p in command.commands[name].params if p.name == "stop_at_goal"]
        assert param.default is DEFAULT_STOP_AT_GOAL, name


def test_trial_spec_stops_at_the_goal_by_default_too():
    import inspect

    from batchlab.sweep.config import DEFAULT_STOP_AT_GOAL
    from batchlab.train import TrialSpec
    from batchlab.train.study import run_study

    assert inspect.signature(TrialSpec).parameters["stop_at_goal"].default is DEFAULT_STOP_AT_GOAL
    assert inspect.signature(run_study).parameters["stop_at_goal"].default is DEFAULT_STOP_AT_GOAL


def test_device_key_is_checked():
    from batchlab.sweep.config import parse_sweep_config

    base = {"workloads": ["mnist/fc_64_64_64"], "optimizers": ["sgd"], "batch_sizes": [8], "trials": 1}
    assert parse_sweep_config(base).device == "auto"
    assert parse_sweep_config({**base, "device": "cpu"}).device == "cpu"
    assert parse_sweep_config({**base, "device": " CPU "}).device == "cpu"  # read as --device reads it
    with pytest.raises(BatchlabError, match="field 'device'.*allowed: auto, cpu, cuda, cuda:N, mps"):
        parse_sweep_config({**base, "device": "gpu"})
