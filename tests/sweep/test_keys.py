"""Stable trial keys, ids, id blocks and seeds; study definitions; task grouping; the budget-growth rule."""

from __future__ import annotations

import pytest

from batchlab.sweep.budget import ran_out_of_steps
from batchlab.sweep.config import MAX_TRIALS_PER_STUDY, parse_sweep_config
from batchlab.errors import BatchlabError
from batchlab.store.studies import study_id
from batchlab.sweep.keys import FIRST_TRIAL_ID, allocate_ids, id_block, trial_id, trial_key, trial_seed
from batchlab.sweep.plan import make_tasks, plan_studies, stretch_point, stretch_search_space

BASE = {"workloads": ["mnist/fc_64_64_64"], "optimizers": ["sgd"], "batch_sizes": [8, 32], "trials": 2, "steps": 50}


def _study(**change):
    return plan_studies(parse_sweep_config({**BASE, **change}))[0]


def test_keys_name_their_parts_and_their_study_definition():
    study = _study()
    definition = study.definition
    assert study.digest == study_id(definition) and len(study.digest) == 12
    assert definition["workload"] == "mnist/fc_64_64_64/sgd" and definition["batch_size"] == 8
    assert definition["train_steps"] == 50 and definition["budget_round"] == 0
    assert definition["sweep"] == study.sweep and definition["budget_rule"] == {"rule": "fixed", "steps": 50}
    assert definition["stop_rule"] == {"metric": "val/classification_error", "goal": study.goal, "maximize": False}
    assert definition["evaluation"]["rule"] == "geometric" and definition["evaluation"]["resolution"] == 0.05
    key = trial_key("mnist/fc_64_64_64", "sgd", 16, 3, 0, study.digest)
    assert key == f"mnist/fc_64_64_64/sgd|b=16|point=3|seed=0|study={study.digest}"
    assert study.trial_plans()[1].key == f"mnist/fc_64_64_64/sgd|b=8|point=1|seed=0|study={study.digest}"


def test_study_ids_follow_the_settings_that_define_the_measurement():
    base = _study()
    assert _study().digest == base.digest
    # Not part of the measurement: how it runs, which other batch sizes or optimizers, how many trials.
    for same in ({"workers": 7}, {"vectorize": "never"}, {"batch_sizes": [8, 32, 128]}, {"trials": 5},
                 {"optimizers": ["sgd", "adam"]}, {"executor": "dask"}):
        assert _study(**same).digest == base.digest, same
        assert _study(**same).sweep == base.sweep, same
    # Part of it: the budget, training set, seed, goal (trials stop at it and refine its bracket),
    # stop rule, evaluation schedule, search space.
    for other in ({"steps": 60}, {"train_examples": 1000}, {"seed": 1}, {"goal": 0.5}, {"stop_at_goal": False},
                  {"resolution": 0.1}, {"evaluations": 10}, {"schedule": "linear"},
                  {"search_spaces": {"sgd": {"learning_rate": {"type": "DOUBLE", "min_value": 0.1,
                                                               "max_value": 1.0, "scale": "LOG"}}}}):
        assert _study(**other).digest != base.digest, other
        assert _study(**other).sweep != base.sweep, other


def test_id_blocks_keep_studies_apart_and_resume_by_key():
    M = MAX_TRIALS_PER_STUDY
    a = [(("w/m/sgd", 8), "a", [(0, "a0"), (1, "a1")])]
    b = [(("w/m/sgd", 8), "b", [(0, "b0"), (1, "b1")])]
    # ids start at 1, as in the batch_science release and batchlab train/study
    assert allocate_ids(a, {}) == [1]
    assert allocate_ids(a + b, {}) == [1, M + 1]
    # a in the store at block 0: b (another definition) takes the next free block, a keeps its own
    held = {("w/m/sgd", 8): {1: "a0"}}
    assert allocate_ids(b + a, held) == [M + 1, 1]
    # a block holding any trial (here a `batchlab train` trial, id 1) is not free
    assert allocate_ids(b, {("w/m/sgd", 8): {1: "train"}}) == [M + 1]
    # other (workload, batch size): independent blocks
    assert allocate_ids([(("w/m/sgd", 16), "c", [(0, "c0")])], held) == [1]
    # a stored study found in block 3 (a resumed sweep whose earlier blocks were taken) stays there
    assert allocate_ids(a, {("w/m/sgd", 8): {3 * M + 2: "a1", 1: "x"}}) == [3 * M + 1]
    with pytest.raises(BatchlabError, match="trial id 2 of a is held by another trial"):
        allocate_ids(a, {("w/m/sgd", 8): {1: "a0", 2: "train"}})
    with pytest.raises(BatchlabError, match="do not follow one id block"):
        allocate_ids(a, {("w/m/sgd", 8): {1: "a0", 5: "a1"}})


def test_studies_written_with_ids_from_0_keep_their_ids_on_resume():
    # A sweep stored by a batchlab whose sweep ids started at 0: resuming keeps its ids (found by key)
    M = MAX_TRIALS_PER_STUDY
    a = [(("w/m/sgd", 8), "a", [(0, "a0"), (1, "a1"), (2, "a2")])]
    assert allocate_ids(a, {("w/m/sgd", 8): {0: "a0", 1: "a1"}}) == [0]
    assert allocate_ids(a, {("w/m/sgd", 8): {M: "a0"}}) == [M]
    # a new definition beside it takes a block none of whose ids (1 + k M ... (k + 1) M) is held
    b = [(("w/m/sgd", 8), "b", [(0, "b0")])]
    assert allocate_ids(b + a, {("w/m/sgd", 8): {M: "a0", M + 1: "a1"}}) == [2 * M + 1, M]


def test_budget_rule_sizes_each_batch_size():
    config = parse_sweep_config({**BASE, "steps": None, "batch_sizes": [8, 128, 1024]})
    studies = plan_studies(config)
    # default: the workload's default_steps x default_batch_size examples, floor default_steps
    from batchlab.workloads import get_workload

    w = get_workload("mnist/fc_64_64_64")
    examples = w.default_steps * w.default_batch_size
    assert [s.steps for s in studies] == [examples // 8, w.default_steps, w.default_steps]
    assert studies[0].definition["budget_rule"]["rule"] == "examples"
    config = parse_sweep_config({**BASE, "steps": None, "budget_epochs": 2.0, "min_steps": 100,
                                 "train_examples": 1000, "batch_sizes": [8, 16, 64], "max_steps": 200})
    assert [s.steps for s in plan_studies(config)] == [200, 125, 100]


def test_grown_rounds_stretch_decay_and_warmup():
    assert stretch_point({"learning_rate": 0.1, "learning_rate_decay_steps": 30, "warmup_steps": 5}, 2.0) == {
        "learning_rate": 0.1, "learning_rate_decay_steps": 60, "warmup_steps": 10}
    space = {"learning_rate_decay_steps": {"type": "INTEGER", "min_value": 25, "max_value": 50, "scale": "LINEAR_SCALE"}}
    assert stretch_search_space(space, 2.0)["learning_rate_decay_steps"]["max_value"] == 100
    study = _study(schedule="linear")
    grown = study.grown(2.0)
    assert grown.steps == 100 and grown.stretch == 2.0 and grown.budget_round == 1
    for before, after in zip(study.trial_plans(), grown.trial_plans()):
        assert after.hyperparameters["learning_rate_decay_steps"] == 2 * before.hyperparameters["learning_rate_decay_steps"]
        assert after.hyperparameters["learning_rate"] == before.hyperparameters["learning_rate"]
        assert after.key != before.key
    assert grown.definition["schedule_stretch"] == 2.0 and grown.definition["budget_round"] == 1
    assert grown.definition["search_space"]["learning_rate_decay_steps"]["max_value"] == 100


def test_ids_and_seeds_derive_from_the_point_index():
    assert FIRST_TRIAL_ID == 1
    assert trial_id(0) == 1 and trial_id(5) == 6 and trial_id(5, block=2) == 2 * MAX_TRIALS_PER_STUDY + 6
    assert id_block(1) == 0 and id_block(MAX_TRIALS_PER_STUDY) == 0 and id_block(MAX_TRIALS_PER_STUDY + 1) == 1
    with pytest.raises(ValueError):
        trial_id(MAX_TRIALS_PER_STUDY)
    seeds = [trial_seed(0, i) for i in range(100)]
    assert len(set(seeds)) == 100 and seeds == [trial_seed(0, i) for i in range(100)]
    assert trial_seed(1, 0) != trial_seed(0, 0) and all(0 <= s < 2**31 for s in seeds)


def test_plan_is_deterministic_and_tasks_follow_point_order():
    config = parse_sweep_config({"workloads": ["mnist/fc_64_64_64"], "optimizers": ["sgd", "momentum"],
                                 "batch_sizes": [8, 32], "trials": 5, "steps": 50})
    studies = plan_studies(config)
    assert [(s.optimizer, s.batch_size) for s in studies] == [("sgd", 8), ("sgd", 32), ("momentum", 8), ("momentum", 32)]
    again = plan_studies(config)
    assert [t.key for s in studies for t in s.trial_plans()] == [t.key for s in again for t in s.trial_plans()]
    assert studies[0].points != studies[1].points  # each batch size its own points (tests/sweep/test_plan.py)
    trials = studies[0].trial_plans()
    assert [t.trial_id for t in trials] == [1, 2, 3, 4, 5]  # ids from 1, as in the release
    tasks = make_tasks(studies[0], [trials[1], trials[2], trials[4]], vectorized=True, group_size=2)
    assert [[t.point_index for t in task.trials] for task in tasks] == [[1], [2], [4]]
    tasks = make_tasks(studies[0], trials, vectorized=True, group_size=2)
    assert [[t.point_index for t in task.trials] for task in tasks] == [[0, 1], [2, 3], [4]]
    assert all(len(t.trials) == 1 and not t.vectorized for t in make_tasks(studies[0], trials, False, 4))
    grown = studies[0].grown(2.0)
    assert grown.steps == 100 and grown.trial_plans()[0].key != trials[0].key


@pytest.mark.parametrize(
    "outcomes, grow",
    [
        ([("COMPLETE", None), ("INFEASIBLE", None)], True),
        ([("COMPLETE", None), ("COMPLETE", 40)], False),
        ([("INFEASIBLE", None), ("INFEASIBLE", None)], False),
        ([], False),
        # a stop-at-goal trial stopped before its budget: no evidence that the budget was too small
        ([("STOPPED_AT_GOAL", None), ("INFEASIBLE", None)], False),
        ([("STOPPED_AT_GOAL", 30), ("COMPLETE", None)], False),
        ([("STOPPED_AT_GOAL", None), ("COMPLETE", None)], True),
    ],
)
def test_budget_grows_only_when_every_trial_ran_out_of_steps(outcomes, grow):
    assert ran_out_of_steps(outcomes) is grow


def test_gpu_studies_are_their_own_definitions_and_cpu_ids_are_unchanged():
    config = parse_sweep_config({**BASE, "device": "cpu"})
    cpu, = [s for s in plan_studies(config) if s.batch_size == config.batch_sizes[0]][:1]
    gpu, = [s for s in plan_studies(config, device_type="cuda") if s.batch_size == config.batch_sizes[0]][:1]
    assert "device" not in cpu.definition and gpu.definition["device"] == "cuda"
    assert gpu.digest != cpu.digest and gpu.sweep == cpu.sweep  # other trial keys, the same sweep id
    assert cpu.digest == _study().digest  # the device setting itself does not enter a CPU study's id
