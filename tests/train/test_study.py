import json

import pytest

from batchlab.errors import BatchlabError
from batchlab.search import default_search_space, study_points_seed
from batchlab.store import Store
from batchlab.train import TrialResult, best_final_trial, best_trial, run_study


def trial(trial_id, status="COMPLETE", steps_to_goal=None, final=0.5, maximize=False):
    return TrialResult(
        workload="d/m/o", batch_size=8, trial_id=trial_id, trial_key=str(trial_id), parameters={}, seed=0,
        status=status, steps=100, steps_to_goal=steps_to_goal,
        measurements=[{"step": 100, "val/metric": final}], metric="val/metric", goal=0.1, maximize=maximize,
    )


def test_best_trial_is_fewest_steps_ties_to_lower_id_complete_only():
    trials = [trial(1, steps_to_goal=40), trial(2, steps_to_goal=30), trial(3, steps_to_goal=30),
              trial(4, status="INFEASIBLE", steps_to_goal=10), trial(5)]
    assert best_trial(trials).trial_id == 2
    assert best_trial([trial(1), trial(2, status="INFEASIBLE", steps_to_goal=5)]) is None


def test_best_final_trial_respects_direction_and_ties():
    trials = [trial(1, final=0.3), trial(2, final=0.2), trial(3, final=0.2), trial(4, status="INFEASIBLE", final=0.0)]
    assert best_final_trial(trials).trial_id == 2
    up = [trial(1, final=0.3, maximize=True), trial(2, final=0.2, maximize=True)]
    assert best_final_trial(up).trial_id == 1
    assert best_final_trial([trial(1, status="INFEASIBLE")]) is None


def first_steps_from_store(store, goal):
    """Each trial's first evaluation step beating the goal, computed from the store alone."""
    rows = store.connect().execute(
        "select trial_id, min(step) from measurements where metric = 'val/classification_error' and value < ? group by trial_id",
        [goal],
    ).fetchall()
    return dict(rows)


def test_study_records_n_trials_and_picks_the_best(tmp_path, easy_workload):
    store = Store.open(tmp_path / "s", create=True)
    result = run_study(easy_workload, "momentum", 64, trials=3, store=store, steps=16, train_examples=512, seed=0,
                       stop_at_goal=False)
    space = default_search_space("momentum", train_steps=16)
    own = study_points_seed(0, easy_workload, "momentum", 64)  # the study's own sequence (EASY is its name)
    con = store.connect()
    trials = con.execute("select trial_id, parameters, status, seed from trials order by trial_id").fetchall()
    assert [t[0] for t in trials] == [1, 2, 3]
    assert [json.loads(t[1]) for t in trials] == space.sample(3, seed=own)
    assert [t[3] for t in trials] == [0, 1, 2]
    assert json.loads(con.execute("select search_space from studies").fetchone()[0]) == space.to_batch_science()

    firsts = first_steps_from_store(store, 0.75)
    statuses = {t[0]: t[2] for t in trials}
    candidates = sorted((s, i) for i, s in firsts.items() if statuses[i] == "COMPLETE")
    assert candidates  # with seed 0 a trial beats the loose goal early
    assert (result.best.steps_to_goal, result.best.trial_id) == candidates[0]
    assert [t.steps_to_goal for t in result.trials] == [firsts.get(t.trial_id) for t in result.trials]

    more = run_study(easy_workload, "momentum", 64, trials=1, store=store, steps=16, train_examples=512, seed=0,
                       stop_at_goal=False)
    assert [t.trial_id for t in more.trials] == [4]  # the study continues its quasi-random sequence
    assert [t.parameters for t in more.trials] == space.sample(4, seed=own)[3:]


def test_bad_study_writes_nothing(tmp_path):
    store = Store.open(tmp_path / "s", create=True)
    with pytest.raises(BatchlabError, match="number of trials"):
        run_study("mnist/fc_64_64_64", "sgd", 8, trials=0, store=store, steps=5, train_examples=64)
    with pytest.raises(BatchlabError, match="batch size 100 is out of range"):
        run_study("mnist/fc_64_64_64", "sgd", 100, trials=2, store=store, steps=5, train_examples=64)
    assert store.table("trials").num_rows == 0 and store.pending_headers() == []


def test_best_trial_counts_trials_stopped_at_the_goal():
    trials = [trial(1, steps_to_goal=40), trial(2, status="STOPPED_AT_GOAL", steps_to_goal=30)]
    assert best_trial(trials).trial_id == 2
    assert best_final_trial(trials).trial_id == 1  # a stopped trial's last evaluation is not at the budget


def test_a_study_is_one_definition_and_stopped_trials_say_so(tmp_path, easy_workload):
    store = Store.open(tmp_path / "s", create=True)
    # 4 trials: the study's 4th point (learning rate 0.23, momentum 0.91) meets the loose goal early
    result = run_study(easy_workload, "momentum", 64, trials=4, store=store, steps=16, train_examples=512, seed=0,
                       stop_at_goal=True, resolution=0.1)
    con = store.connect()
    rows = con.execute("select trial_id, status, steps, study_id from trials order by trial_id").fetchall()
    assert len({r[3] for r in rows}) == 1  # every trial of the study under one definition
    stopped = [t for t in result.trials if t.status == "STOPPED_AT_GOAL"]
    assert stopped and all(t.steps == t.steps_to_goal < 16 for t in stopped)
    assert result.best.status == "STOPPED_AT_GOAL"
    definition = json.loads(con.execute("select definition from studies").fetchone()[0])
    assert definition["source"] == "batchlab study" and definition["seed"] == 0
    assert definition["stop_rule"] == {"metric": "val/classification_error", "goal": 0.75, "maximize": False}
    assert definition["evaluation"] == {"rule": "geometric", "resolution": 0.1, "refine": "replay"}


def test_study_specs_carry_the_device_and_gpu_studies_get_their_own_id(monkeypatch):
    from batchlab.store.studies import study_id
    from batchlab.train import device as devices
    from batchlab.train.study import study_trial_specs

    args = ("mnist/fc_64_64_64", "sgd", 16, 2, 1, 20)
    cpu = study_trial_specs(*args, device="cpu")
    assert [s.device for s in cpu] == ["cpu", "cpu"] and "device" not in cpu[0].study_definition
    monkeypatch.setattr(devices, "device_type", lambda name="auto": "cuda")  # as on a GPU machine
    gpu = study_trial_specs(*args, device="auto")
    assert [s.device for s in gpu] == ["auto", "auto"] and gpu[0].study_definition["device"] == "cuda"
    assert study_id(gpu[0].study_definition) != study_id(cpu[0].study_definition)
    assert {k: v for k, v in gpu[0].study_definition.items() if k != "device"} == cpu[0].study_definition


def test_a_study_of_a_user_workload_object(tmp_path):
    import torch
    from torch import nn

    from batchlab.workloads import Workload, regression

    def data():
        x = torch.randn(200, 3, generator=torch.Generator().manual_seed(0))
        return {"train": (x[:150], x[:150].sum(1)), "val": (x[150:], x[150:].sum(1))}

    workload = Workload(name="toy/line", make_model=lambda: nn.Linear(3, 1), data=data, task=regression(), goal=0.1,
                        default_steps=10)
    store = Store.open(tmp_path / "s", create=True)
    result = run_study(workload, "sgd", 16, 2, store, steps=10, stop_at_goal=False)
    assert result.workload == "toy/line/sgd" and [t.trial_id for t in result.trials] == [1, 2]
    assert all(t.status in ("COMPLETE", "INFEASIBLE") and t.device == "cpu" for t in result.trials)
    assert store.table("trials").num_rows == 2


def test_best_final_metric_of_a_raced_study_is_the_full_protocols():
    """Before: the JSON's best_final_metric was over the COMPLETE trials whatever else happened, so a
    raced study (its non-reaching trials RACED early, one trial COMPLETE at 0.712) printed 0.712 where
    the full run (those trials COMPLETE, the best at 0.218) printed 0.218. Now it is reported only when
    no trial reached the goal nor was raced, over the trials that ran their whole budget."""
    from batchlab.train.study import best_final_summary

    full = [trial(1, "STOPPED_AT_GOAL", 40), trial(2, "STOPPED_AT_GOAL", 60), trial(3, final=0.712),
            trial(4, final=0.218)]
    raced = full[:3] + [trial(4, "RACED", final=0.9)]
    assert best_final_summary(full) == best_final_summary(raced) == {
        "best_final_trial": None, "best_final_metric": None, "best_final_over": None}
    none_reached = [trial(1, final=0.712), trial(2, final=0.218), trial(3, "INFEASIBLE", final=0.1),
                    trial(4, "STOPPED_AT_GOAL", final=0.05)]  # a stopped trial without steps: not comparable
    assert best_final_summary(none_reached) == {"best_final_trial": 2, "best_final_metric": 0.218,
                                                "best_final_over": 2}


def test_a_study_with_refine_search_adds_a_recorded_search_round_where_a_flag_fires(tmp_path, easy_workload):
    """4 trials at B = 64 with 16 steps: the best reaches the loose goal and a tuning flag fires for it
    (batchlab.analysis.tuning_flags over this one batch size), so --refine-search 2 adds 2 trials in
    the box around it, under a study definition of their own (search round 1, naming the round it
    refines); a study without a flag gets none."""
    from batchlab.search import SearchSpace
    from batchlab.store.studies import study_id

    store = Store.open(tmp_path / "s", create=True)
    result = run_study(easy_workload, "momentum", 64, trials=4, store=store, steps=16, train_examples=512, seed=0,
                       stop_at_goal=True, resolution=0.1, refine_search=2)
    assert result.flags  # here the best trial's learning rate lies in the top 10% of its range (search_edge)
    assert len(result.trials) == 6 and result.refined == [5, 6]
    con = store.connect()
    definitions = {sid: json.loads(d) for sid, d in con.execute("select study_id, definition from studies").fetchall()}
    studies = dict(con.execute("select trial_id, study_id from trials").fetchall())
    round0, round1 = definitions[studies[1]], definitions[studies[5]]
    assert studies[5] == studies[6] != studies[1] and round1["search_round"] == 1 and "search_round" not in round0
    assert round1["refine"]["study"] == study_id(round0)
    assert "flags" not in round1["refine"]  # the flags are in result.flags, not in the hashed definition
    incumbent = round1["refine"]["around"]
    assert incumbent == best_trial(result.trials[:4]).parameters
    space = SearchSpace.from_batch_science(round0["search_space"])
    for t in result.trials[4:]:
        assert all(abs(p.unit(t.parameters[p.name]) - p.unit(incumbent[p.name])) <= 0.25 + 1e-9
                   for p in space.parameters)
    none = run_study(easy_workload, "momentum", 64, trials=1, store=store, steps=16, train_examples=512, seed=0,
                     stop_at_goal=True, resolution=0.1, refine_search=2, flags_fn=lambda studies: [])
    assert none.refined == [] and len(none.trials) == 1
    with pytest.raises(BatchlabError, match="positive integer"):
        run_study(easy_workload, "momentum", 64, trials=1, store=store, steps=16, refine_search=0)


def test_the_analysis_reads_a_study_search_round_with_the_study_it_refines(tmp_path, easy_workload):
    """``batchlab study --refine-search`` at B = 64 of a curve B = 32, 64 (one settings group): the
    search round is not a second study at B = 64, so the curve stays one unit (not one per study id),
    with the search round analysed with the study it refines: B = 64 rests on its 4 + 4 trials and the
    round's 1."""
    from batchlab.analysis.steps_to_result import steps_to_result_many
    from batchlab.analysis.tuning_flags import TuningFlag
    from batchlab.analysis.units import find_units, unit_selection

    store = Store.open(tmp_path / "s", create=True)
    options = {"store": store, "steps": 16, "train_examples": 512, "seed": 0, "stop_at_goal": True,
               "resolution": 0.1}
    run_study(easy_workload, "momentum", 32, trials=2, **options)
    base = run_study(easy_workload, "momentum", 64, trials=4, **options)
    more = run_study(easy_workload, "momentum", 64, trials=4, refine_search=1,  # the study continued, refined
                     flags_fn=lambda studies: [TuningFlag("one_reaching_trial", 64, "x")], **options)
    assert base.best is not None and more.refined == [9]
    con = store.connect()
    try:
        (unit,) = find_units(con)
        round1 = [sid for sid, d in unit.definitions.items() if d.get("search_round")]
        assert sorted(unit.batch_study) == [32, 64] and len(round1) == 1 and not unit.skipped_studies
        refined = unit.definitions[round1[0]]["refine"]["study"]
        assert refined in unit.study_ids and len(unit.study_ids) == 3
        (results,) = steps_to_result_many(con, [unit_selection(con, unit)])
    finally:
        con.close()
    assert {r.batch_size: r.n_trials for r in results} == {32: 2, 64: 4 + 4 + 1}


@pytest.mark.parametrize("budget", ["0", "-2", "1.5"])
def test_study_refine_search_that_is_not_a_positive_integer_is_one_line_and_exit_2(tmp_path, budget):
    import subprocess
    import sys

    command = [sys.executable, "-m", "batchlab", "study", "mnist/fc_64_64_64", "--optimizer", "sgd", "--batch-size",
               "8", "--trials", "1", "--store", str(tmp_path / "s"), f"--refine-search={budget}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2 and not (tmp_path / "s").exists()
    assert result.stderr.strip().count("\n") == 0
    assert "--refine-search BUDGET must be a positive integer" in result.stderr
