"""Stable trial keys, ids and seeds; task grouping; the budget-growth rule."""

from __future__ import annotations

import pytest

from batchlab.sweep.budget import ran_out_of_steps
from batchlab.sweep.config import MAX_TRIALS_PER_STUDY, parse_sweep_config
from batchlab.sweep.keys import study_digest, trial_id, trial_key, trial_seed
from batchlab.sweep.plan import make_tasks, plan_studies


def test_keys_are_stable_and_name_their_parts():
    digest = study_digest(steps=100, train_examples=None, stop_at_goal=True, search_space={"a": 1})
    assert digest == study_digest(steps=100, train_examples=None, stop_at_goal=True, search_space={"a": 1})
    assert digest != study_digest(steps=200, train_examples=None, stop_at_goal=True, search_space={"a": 1})
    assert digest != study_digest(steps=100, train_examples=None, stop_at_goal=True, search_space={"a": 2})
    key = trial_key("mnist/fc_64_64_64", "sgd", 16, 3, 0, digest)
    assert key == f"mnist/fc_64_64_64/sgd|b=16|point=3|seed=0|study={digest}"


def test_ids_and_seeds_derive_from_the_point_index():
    assert trial_id(5) == 5 and trial_id(5, budget_round=2) == 2 * MAX_TRIALS_PER_STUDY + 5
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
    assert studies[0].points == studies[1].points  # the same search-space points at every batch size
    trials = studies[0].trial_plans()
    assert [t.trial_id for t in trials] == [0, 1, 2, 3, 4]
    tasks = make_tasks(studies[0], [trials[1], trials[2], trials[4]], vectorized=True, group_size=2)
    assert [[t.point_index for t in task.trials] for task in tasks] == [[1], [2], [4]]
    tasks = make_tasks(studies[0], trials, vectorized=True, group_size=2)
    assert [[t.point_index for t in task.trials] for task in tasks] == [[0, 1], [2, 3], [4]]
    assert all(len(t.trials) == 1 and not t.vectorized for t in make_tasks(studies[0], trials, False, 4))
    grown = studies[0].grown(2.0)
    assert grown.steps == 100 and grown.trial_plans()[0].trial_id == MAX_TRIALS_PER_STUDY
    assert grown.trial_plans()[0].key != trials[0].key


@pytest.mark.parametrize(
    "outcomes, grow",
    [
        ([("COMPLETE", None), ("INFEASIBLE", None)], True),
        ([("COMPLETE", None), ("COMPLETE", 40)], False),
        ([("INFEASIBLE", None), ("INFEASIBLE", None)], False),
        ([], False),
    ],
)
def test_budget_grows_only_when_every_trial_ran_out_of_steps(outcomes, grow):
    assert ran_out_of_steps(outcomes) is grow
