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
    with pytest.raises(BatchlabError, match="sweep config .*x.toml' does not exist"):
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


def test_a_non_utf8_or_unreadable_config_is_one_line(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes(GOOD.encode("utf-8") + "# r\u00e9sum\u00e9\n".encode("latin-1"))
    with pytest.raises(BatchlabError) as info:
        load_sweep_config(path)
    assert "\n" not in str(info.value) and "is not UTF-8 text (byte 0xe9 on line" in str(info.value)
    with pytest.raises(BatchlabError, match="is a directory, not a file"):
        load_sweep_config(tmp_path)


def test_a_workload_on_the_command_line_replaces_the_files_workloads(tmp_path):
    from batchlab.sweep.config import sweep_config_from_options

    path = tmp_path / "sweep.toml"
    path.write_text(GOOD)
    config = sweep_config_from_options("mnist/fc_128_128_128", path, {"trials": 3})
    assert config.workloads == ["mnist/fc_128_128_128"] and config.trials == 3
    assert config.optimizers == ["sgd", "momentum"] and config.steps == 100  # the rest from the file


SGD_SPACE = {"learning_rate": {"type": "DOUBLE", "min_value": 0.05, "max_value": 0.5, "scale": "LINEAR_SCALE"}}
CONFIG_SGD_SPACE = {"learning_rate": {"type": "DOUBLE", "min_value": 0.01, "max_value": 1.0, "scale": "LOG_SCALE"}}


def test_search_space_file_overrides_the_configs_spaces_per_optimizer(tmp_path):
    import json

    from batchlab.sweep.config import sweep_config_from_options

    path = tmp_path / "sweep.toml"
    path.write_text(GOOD.replace("[search_spaces.sgd.learning_rate]", "[search_spaces.momentum.learning_rate]"))
    space = tmp_path / "space.json"
    space.write_text(json.dumps({"sgd": SGD_SPACE}))
    config = sweep_config_from_options(None, path, {}, space)
    assert config.search_spaces == {"sgd": SGD_SPACE, "momentum": CONFIG_SGD_SPACE}
    space.write_text(json.dumps({"momentum": SGD_SPACE}))
    assert sweep_config_from_options(None, path, {}, space).search_spaces == {"momentum": SGD_SPACE}
    # one space, one optimizer: --optimizer sgd also drops the file's space of momentum
    space.write_text(json.dumps(SGD_SPACE))
    config = sweep_config_from_options(None, path, {"optimizers": ["sgd"]}, space)
    assert config.optimizers == ["sgd"] and config.search_spaces == {"sgd": SGD_SPACE}
    with pytest.raises(BatchlabError, match="holds one search space but 2 optimizers are searched"):
        sweep_config_from_options(None, path, {}, space)
    config = sweep_config_from_options("mnist/fc_64_64_64", None, {"batch_sizes": [8], "trials": 1, "store": "s"},
                                       space)
    assert config.search_spaces == {"sgd": SGD_SPACE}


def test_study_spaces_file_beats_config_beats_workload_beats_default_and_ids_follow_the_space(tmp_path):
    import dataclasses
    import json

    from batchlab.search import default_search_space
    from batchlab.sweep.config import sweep_config_from_options
    from batchlab.sweep.plan import plan_studies
    from batchlab.workloads import get_workload, register_workload

    declared = {"learning_rate": {"type": "DOUBLE", "min_value": 0.1, "max_value": 0.3, "scale": "LOG_SCALE"}}
    register_workload(dataclasses.replace(get_workload("mnist/fc_64_64_64"), name="mnist/fc_declares_sgd",
                                          search_spaces={"sgd": declared}))
    base = {"workloads": ["mnist/fc_declares_sgd"], "optimizers": ["sgd", "momentum"], "batch_sizes": [8],
            "trials": 2, "steps": 10}

    def spaces(config):
        return {s.optimizer: s.search_space for s in plan_studies(config)}

    workload_first = spaces(parse_sweep_config(base))
    assert workload_first == {"sgd": declared, "momentum": default_search_space("momentum").to_batch_science()}
    in_config = parse_sweep_config({**base, "search_spaces": {"sgd": CONFIG_SGD_SPACE}})
    assert spaces(in_config)["sgd"] == CONFIG_SGD_SPACE
    space = tmp_path / "space.toml"
    space.write_text('[sgd.learning_rate]\ntype = "DOUBLE"\nmin_value = 0.05\nmax_value = 0.5\n')
    path = tmp_path / "sweep.toml"
    path.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in base.items())
                    + '\n[search_spaces.sgd.learning_rate]\ntype = "DOUBLE"\nmin_value = 0.01\nmax_value = 1.0\n'
                      'scale = "LOG_SCALE"\n')
    from_file = sweep_config_from_options(None, path, {}, space)
    assert spaces(from_file)["sgd"] == SGD_SPACE
    # the same space, as written, in the config or in a --search-space file: the same sweep and study ids
    short = {"learning_rate": {**CONFIG_SGD_SPACE["learning_rate"], "scale": "LOG"}}
    same = tmp_path / "same.json"
    same.write_text(json.dumps({"sgd": short}))
    in_toml = tmp_path / "in_config.toml"
    in_toml.write_text(path.read_text().replace('"LOG_SCALE"', '"LOG"'))
    base_only = tmp_path / "base.toml"
    base_only.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in base.items()) + "\n")
    digests = [[s.digest for s in plan_studies(c)]
               for c in (load_sweep_config(in_toml), sweep_config_from_options(None, base_only, {}, same))]
    assert digests[0] == digests[1]
    assert plan_studies(from_file)[0].digest != digests[0][0]  # another space is another study
