"""--refine-search: more trials around the incumbent of each flagged study, as a recorded search round."""

from __future__ import annotations

import json

import pytest

from batchlab.errors import BatchlabError
from batchlab.search import SearchSpace
from batchlab.sweep.executors import InlineExecutor
from batchlab.sweep.runner import Reporter, SweepInterrupted, prepare_sweep, run_sweep
from sweep_helpers import run_sweep_cli, store_contents, tiny_config

W = "mnist/fc_64_64_64/momentum"


def inline(fn, **kw):
    return InlineExecutor(fn)


def refine_config(budget=2):
    """The tiny sweep (momentum at B = 8 and 64, 3 trials each, no stop at the goal) with 30 steps and
    the loose goal val/classification_error < 0.8: at B = 8 one of the 3 trials reaches it (the
    one_reaching_trial flag fires), at B = 64 none does (no flag, no incumbent)."""
    return tiny_config().model_copy(update={"goal": 0.8, "steps": 30, "refine_search": budget})


def definitions(path) -> dict[str, dict]:
    from batchlab.store import Store

    con = Store.open(path).connect()
    try:
        return {sid: json.loads(d) for sid, d in con.execute("select study_id, definition from studies").fetchall()}
    finally:
        con.close()


@pytest.fixture(scope="module")
def refined(tmp_path_factory):
    path = tmp_path_factory.mktemp("refine") / "store"
    summary = run_sweep(prepare_sweep(refine_config(), str(path)), executor_factory=inline)
    return path, summary, store_contents(path)


def test_a_flagged_study_gets_budget_more_trials_around_its_incumbent_as_search_round_1(refined):
    from batchlab.sweep.config import MAX_TRIALS_PER_STUDY

    path, summary, (trials, _) = refined
    assert [f["kind"] for f in summary.tuning_flags] == ["one_reaching_trial"]
    assert summary.tuning_flags[0]["batch_size"] == 8
    (added,) = summary.refined
    assert (added["batch_size"], added["search_round"], added["trials"]) == (8, 1, 2)
    assert added["flags"] == ["one_reaching_trial"]
    by_place = {}
    for t in trials:
        by_place.setdefault(t[1], []).append(t)
    assert len(by_place[64]) == 3  # not flagged: no more trials
    assert sorted(t[2] for t in by_place[8]) == [1, 2, 3, MAX_TRIALS_PER_STUDY + 1, MAX_TRIALS_PER_STUDY + 2]
    refine = [d for d in definitions(path).values() if d.get("search_round")]
    # the flags are recorded outside the hashed definition (the summary, the search_refined event)
    assert len(refine) == 1 and refine[0]["batch_size"] == 8 and "flags" not in refine[0]["refine"]
    assert added["decided"] == "now"
    round0 = {sid: d for sid, d in definitions(path).items() if not d.get("search_round") and d["batch_size"] == 8}
    assert list(round0) == [refine[0]["refine"]["study"]]  # it names the round it refines
    # the incumbent is round 0's best trial; the new points lie in the box a quarter range around it
    incumbent = refine[0]["refine"]["around"]
    first = [t for t in by_place[8] if t[2] <= 3]
    assert incumbent in [json.loads(t[7]) for t in first]
    space = SearchSpace.from_batch_science(refine[0]["refine"]["space"])
    for t in by_place[8]:
        if t[2] > MAX_TRIALS_PER_STUDY:
            point = json.loads(t[7])
            for p in space.parameters:
                assert abs(p.unit(point[p.name]) - p.unit(incumbent[p.name])) <= 0.25 + 1e-9
    # the table analyses all rounds of the study: 5 trials at B = 8, and says which rounds it used
    rows = {r.batch_size: r for r in summary.results[W]}
    assert rows[8].n_trials == 5 and rows[64].n_trials == 3
    rounds = summary.studies[W][8]
    assert [(r["budget_round"], r.get("search_round", 0), r["trials"]) for r in rounds] == [(0, 0, 3), (0, 1, 2)]
    assert rounds[1]["analysed"] and rounds[0]["reported"]


class KillAfterFirstRefinedTrial(Reporter):
    def trial(self, progress, outcome, totals):
        if totals["study"].search_round:
            raise KeyboardInterrupt


def test_a_sweep_killed_in_its_search_round_resumes_to_the_same_trials(refined, tmp_path):
    _, _, contents = refined
    path = str(tmp_path / "store")
    with pytest.raises(SweepInterrupted):
        run_sweep(prepare_sweep(refine_config(), path), KillAfterFirstRefinedTrial(), executor_factory=inline)
    assert len(store_contents(path)[0]) == 7  # round 0 and the first trial of the search round
    summary = run_sweep(prepare_sweep(refine_config(), path), executor_factory=inline)
    assert (summary.trials_skipped, summary.trials_run) == (7, 1)
    assert store_contents(path) == contents  # the same trials, points, ids and measurements
    again = run_sweep(prepare_sweep(refine_config(), path), executor_factory=inline)
    assert (again.trials_skipped, again.trials_run) == (8, 0)


def test_minimal_flags_pick_the_refined_studies(tmp_path):
    """Through ``flags_fn``: a flag at a batch size without a best trial refines nothing, a search-edge
    flag extends its parameter past the range's edge."""
    from batchlab.analysis.tuning_flags import TuningFlag

    def flags(studies):
        return [TuningFlag("search_edge", 8, "edge", parameters=("learning_rate",)),
                TuningFlag("better_than_perfect_scaling", 64, "b64")]

    summary = run_sweep(prepare_sweep(refine_config(budget=1), str(tmp_path / "s")), executor_factory=inline,
                        flags_fn=flags)
    (added,) = summary.refined
    assert added["batch_size"] == 8 and added["flags"] == ["search_edge"] and added["trials"] == 1
    (refine,) = [d for d in definitions(tmp_path / "s").values() if d.get("search_round")]
    assert refine["refine"]["extended"] == ["learning_rate"]


@pytest.mark.parametrize("value", [0, -1, "0", "1.5", "two", True, 2.0, "²", "٣", 100001, "100001"])
def test_a_budget_that_is_not_a_positive_integer_is_refused(value):
    from batchlab.sweep.config import parse_sweep_config
    from batchlab.sweep.refine import refine_budget

    with pytest.raises(BatchlabError, match="positive integer"):
        refine_budget(value)
    data = {"workloads": ["mnist/fc_64_64_64"], "optimizers": ["sgd"], "batch_sizes": [8], "trials": 1,
            "refine_search": value}
    with pytest.raises(BatchlabError, match="refine_search.*positive integer") as error:
        parse_sweep_config(data)
    assert "\n" not in str(error.value) and "1 to 100000" in str(error.value)  # the allowed values
    assert refine_budget("3") == refine_budget(3) == refine_budget("+3") == 3


def test_refine_search_zero_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    result, _ = run_sweep_cli("mnist/fc_64_64_64", "--batch-sizes", "8", "--trials", "1", "--store",
                              str(tmp_path / "s"), "--refine-search", "0")
    assert result.returncode == 2 and not (tmp_path / "s").exists()
    assert result.stderr.strip().count("\n") == 0
    assert "--refine-search BUDGET must be a positive integer" in result.stderr


def test_the_analysis_reads_a_search_round_with_the_study_it_refines(refined):
    """One unit per sweep: at B = 8 the round-0 study and its search round are one study searched
    further (no --mix-studies needed), so steps to result rests on all 5 trials there."""
    from batchlab.analysis.steps_to_result import steps_to_result_many
    from batchlab.analysis.units import find_units, unit_selection
    from batchlab.store import Store

    path, summary, _ = refined
    con = Store.open(path).connect()
    try:
        (unit,) = [u for u in find_units(con) if u.workload == W]
        round1 = [sid for sid, d in unit.definitions.items() if d.get("search_round")]
        assert len(unit.study_ids) == 3 and len(round1) == 1 and not unit.skipped_studies
        assert unit.batch_study[8] == unit.definitions[round1[0]]["refine"]["study"]  # B = 8 is the round-0 study
        (results,) = steps_to_result_many(con, [unit_selection(con, unit, metric="val/classification_error",
                                                               goal=0.8)])
    finally:
        con.close()
    rows = {r.batch_size: r for r in results}
    assert rows[8].n_trials == 5 and rows[64].n_trials == 3
    assert rows[8].steps == {r.batch_size: r for r in summary.results[W]}[8].steps


def test_the_search_round_is_decided_once_part_then_whole_equals_whole_alone(tmp_path):
    """Sticky decisions: a part of the sweep (B = 8 only) decides B = 8's search round; the whole sweep
    then has a neighbour at B = 64 and more flags at B = 8 (as tuning_flags compares neighbours), yet
    re-plans the stored round instead of deciding a second one: its trials equal a whole-only run's,
    with no duplicate, and analyze's trial counts equal the table's, with or without --refine-search."""
    from batchlab.analysis.steps_to_result import steps_to_result_many
    from batchlab.analysis.tuning_flags import TuningFlag
    from batchlab.analysis.units import find_units, unit_selection
    from batchlab.store import Store
    from batchlab.sweep.runner import part_of

    def flags(studies):  # a neighbour comparison only when the neighbour is in the curve
        out = [TuningFlag("one_reaching_trial", 8, "one")]
        if 64 in {int(s.batch_size) for s in studies}:
            out.append(TuningFlag("better_than_perfect_scaling", 8, "b8 vs b64"))
        return out

    both, alone = str(tmp_path / "both"), str(tmp_path / "alone")
    part = run_sweep(part_of(prepare_sweep(refine_config(), both), batch_sizes=[8]), executor_factory=inline,
                     flags_fn=flags)
    whole = run_sweep(prepare_sweep(refine_config(), both), executor_factory=inline, flags_fn=flags)
    fresh = run_sweep(prepare_sweep(refine_config(), alone), executor_factory=inline, flags_fn=flags)
    assert len(store_contents(both)[0]) == 3 + 2 + 3  # no second search round at B = 8
    assert store_contents(both) == store_contents(alone)
    assert [(r["batch_size"], r["flags"], r["decided"]) for r in part.refined] == [(8, ["one_reaching_trial"], "now")]
    assert [(r["study_id"], r["decided"]) for r in whole.refined] == [(part.refined[0]["study_id"], "stored")]
    assert fresh.refined[0]["flags"] == ["better_than_perfect_scaling", "one_reaching_trial"]
    assert fresh.refined[0]["study_id"] == part.refined[0]["study_id"]  # the flags are not in the definition
    plain = run_sweep(prepare_sweep(refine_config().model_copy(update={"refine_search": None}), both),
                      executor_factory=inline)
    assert plain.trials_run == 0 and [r["decided"] for r in plain.refined] == ["stored"]
    con = Store.open(both).connect()
    try:
        (unit,) = [u for u in find_units(con) if u.workload == W]
        (results,) = steps_to_result_many(con, [unit_selection(con, unit, metric="val/classification_error",
                                                               goal=0.8)])
    finally:
        con.close()
    analysed = {r.batch_size: r.n_trials for r in results}
    assert analysed == {8: 5, 64: 3}
    for summary in (whole, fresh, plain):
        assert {r.batch_size: r.n_trials for r in summary.results[W]} == analysed


def test_the_search_edge_of_a_search_rounds_best_trial_is_judged_on_what_was_searched(refined):
    """The best trial at B = 8 is in the search round, whose own space is the box around the incumbent;
    its edges are those of the box joined with the refined study's space (here the space itself: the
    box is clipped to it), not the box's."""
    from batchlab.analysis.metaparameters import best_trial_spaces
    from batchlab.analysis.selection import Selection
    from batchlab.analysis.steps_to_result import steps_to_result_many
    from batchlab.store import Store
    from batchlab.sweep.config import MAX_TRIALS_PER_STUDY

    path, _, _ = refined
    (refine,) = [d for d in definitions(path).values() if d.get("search_round")]
    con = Store.open(path).connect()
    try:
        (results,) = steps_to_result_many(con, [Selection(workload=W, metric="val/classification_error", goal=0.8)])
        spaces = best_trial_spaces(con, results)
    finally:
        con.close()
    best = {r.batch_size: r for r in results}[8]
    assert best.trial_id > MAX_TRIALS_PER_STUDY  # a search-round trial
    assert spaces[8] == SearchSpace.from_batch_science(refine["refine"]["space"])
    assert spaces[8] != SearchSpace.from_batch_science(refine["search_space"])


def test_at_most_one_search_round_per_study_is_analysed_with_it():
    """A store written before decisions were sticky may hold two search rounds of one study: the unit
    takes the smallest id and skips the other, and steps to result refuses the pair as a mix."""
    from batchlab.analysis.steps_to_result import _one_study_with_its_search_rounds
    from batchlab.analysis.units import Unit, _attach_search_rounds

    base = {"batch_size": 8}
    first, second = ({"batch_size": 8, "search_round": 1, "refine": {"study": "a"}} for _ in range(2))
    third = {"batch_size": 8, "search_round": 2, "refine": {"study": "a"}}
    studies = {"a": (8, base), "r1": (8, first), "r2": (8, second), "r3": (8, third)}
    unit = Unit(W, "g", "rule", ())
    assert _attach_search_rounds(unit, ["r2", "r1", "r3"], {"a"}, studies) == ["r1"]
    assert sorted(unit.skipped_studies) == ["r2", "r3"] and "at most one" in unit.skipped_studies["r2"]
    definitions_ = {k: d for k, (_, d) in studies.items()}
    assert _one_study_with_its_search_rounds(["a", "r1"], definitions_)
    assert not _one_study_with_its_search_rounds(["a", "r1", "r2"], definitions_)
    assert not _one_study_with_its_search_rounds(["a", "r3"], definitions_)


def test_the_extended_box_is_decided_by_its_bounds_not_by_the_budget():
    """A search edge on a LINEAR momentum range [0.5, 0.99] at 0.985: the extended box passes 1, which
    the optimizer refuses, so the box is clipped for every budget (a budget whose points all happened
    to fall below 1 used to keep the extension), and a larger budget only adds points."""
    from batchlab.analysis.tuning_flags import TuningFlag
    from batchlab.search import study_points_seed
    from batchlab.sweep.refine import refine_box

    space = {"learning_rate": {"type": "DOUBLE", "min_value": 0.01, "max_value": 1.0, "scale": "LOG_SCALE"},
             "momentum": {"type": "DOUBLE", "min_value": 0.5, "max_value": 0.99, "scale": "LINEAR_SCALE"}}
    incumbent = {"learning_rate": 0.1, "momentum": 0.985}
    flags = [TuningFlag("search_edge", 8, "edge", parameters=("momentum",))]
    seed = study_points_seed(0, "mnist/fc_64_64_64", "momentum", 8, 1)
    boxes = {budget: refine_box(space, "momentum", incumbent, flags, budget, seed) for budget in (1, 2, 6)}
    assert all(d["extended"] == [] and box == boxes[6][0] for box, _, d in boxes.values())
    assert boxes[6][0].to_batch_science()["momentum"]["max_value"] == 0.99
    assert boxes[6][1][:2] == boxes[2][1]
