import numpy as np
import pytest

import dataclasses
import json

import duckdb

from analysis_fixtures import tables_from_trials, trial
from batchlab.analysis.metaparameters import (
    format_search_edge_warning,
    linear_heuristic,
    optimal_metaparameters,
    parameter_edge,
    search_edge_warnings,
    search_space_edges,
    searched_ranges,
    square_root_heuristic,
    trial_outcomes,
)
from batchlab.analysis.selection import Selection
from batchlab.analysis.steps_to_result import steps_to_result, steps_to_result_many
from batchlab.errors import BatchlabError
from batchlab.search import Parameter

W = "mnist/simple_cnn_base/nesterov_momentum"
M = "val/classification_error"


def curve(pairs):
    return [(step, {M: value}) for step, value in pairs]


@pytest.fixture
def con(make_con):
    return make_con(
        [
            trial(W, 8, 1, curve([(100, 0.005)]), learning_rate=0.01, momentum=0.9),
            trial(W, 8, 5, curve([(100, 0.5)]), learning_rate=0.001, momentum=0.99),
            trial(W, 8, 3, curve([(5, float("nan"))]), status="INFEASIBLE", learning_rate=5.0, momentum=0.999),
            trial(W, 8, 9, curve([(5, float("nan"))]), status="INFEASIBLE", learning_rate=6.0, momentum=0.999),
            trial(W, 8, 4, curve([(50, 0.005)]), status="INCOMPLETE", learning_rate=1.0, momentum=0.0),
            trial(W, 32, 1, curve([(40, 0.005)]), learning_rate=0.04, momentum=0.9),
            trial(W, 32, 2, curve([(40, 0.005)]), learning_rate=0.05, momentum=0.5),
            trial(W, 128, 1, curve([(10, 0.004)]), learning_rate=0.2, momentum=0.95),
            trial(W, 512, 1, curve([(10, 0.5)]), learning_rate=0.2, momentum=0.95),
        ]
    )


def test_heuristic_lines_are_anchored_at_the_smallest_batch_size():
    np.testing.assert_allclose(linear_heuristic([2, 4, 16], 2, 0.1), [0.1, 0.2, 0.8])
    np.testing.assert_allclose(square_root_heuristic([2, 8, 32], 2, 0.1), [0.1, 0.2, 0.4])


def test_optimal_metaparameters_of_the_best_trials(con):
    opt = optimal_metaparameters(steps_to_result(con, W, M, 0.01))
    np.testing.assert_array_equal(opt.batch_sizes, [8, 32, 128])  # 512 not reached
    np.testing.assert_allclose(opt.values["learning_rate"], [0.01, 0.04, 0.2])  # tie at 32 -> trial 1
    np.testing.assert_allclose(opt.values["momentum"], [0.9, 0.9, 0.95])
    np.testing.assert_allclose(opt.values["effective_learning_rate"], [0.1, 0.4, 4.0])
    lines = opt.heuristics("effective_learning_rate")
    np.testing.assert_allclose(lines["linear"], [0.1, 0.4, 1.6])
    np.testing.assert_allclose(lines["square_root"], [0.1, 0.2, 0.4])
    rows = opt.to_rows()
    assert rows[0] == {"batch_size": 8, "learning_rate": 0.01, "momentum": 0.9, "effective_learning_rate": pytest.approx(0.1),
                       "search_edge": []}


def test_optimal_metaparameters_without_momentum(make_con):
    w = "mnist/fc_1024/sgd"
    con = make_con([trial(w, 2, 1, curve([(10, 0.0)]), learning_rate=0.5), trial(w, 4, 1, curve([(5, 0.0)]), learning_rate=1.0)])
    opt = optimal_metaparameters(steps_to_result(con, w, M, 0.01))
    assert not opt.has("momentum") and opt.heuristics("momentum") == {}
    np.testing.assert_allclose(opt.values["effective_learning_rate"], [0.5, 1.0])


def test_trial_outcomes_for_the_scatter(con):
    frame = trial_outcomes(con, Selection(W, M, 0.01))
    at8 = frame[frame.batch_size == 8]
    assert list(at8.trial_id) == [1, 3, 5, 9]  # the INCOMPLETE trial 4 is left out
    assert list(at8.outcome) == ["reached", "diverged", "not_reached", "diverged"]
    assert list(at8.best) == [True, False, False, False]
    assert at8.effective_learning_rate.iloc[0] == pytest.approx(0.1)
    assert frame[frame.batch_size == 32].best.tolist() == [True, False]
    assert frame[frame.batch_size == 512].outcome.tolist() == ["not_reached"]
    # max_trials: diverged trials after the last selected trial's id are dropped.
    limited = trial_outcomes(con, Selection(W, M, 0.01, max_trials=2))
    assert list(limited[limited.batch_size == 8].trial_id) == [1, 3, 5]
    # "auto" cuts nothing outside imported release workloads, so every diverged trial stays
    auto = trial_outcomes(con, Selection(W, M, 0.01, max_trials="auto"))
    assert list(auto[auto.batch_size == 8].trial_id) == [1, 3, 5, 9]


# ---- search-edge warnings -------------------------------------------------------------------------

LR = Parameter("learning_rate", "DOUBLE", "LOG", 1e-4, 1.0)
MOMENTUM = Parameter("momentum", "DOUBLE", "REVERSE_LOG", 0.5, 0.999)
LINEAR = Parameter("warmup", "DOUBLE", "LINEAR", 0.0, 1.0)


def edge(parameter, value):
    found = parameter_edge(parameter, value)
    return None if found is None else found["edge"]


@pytest.mark.parametrize(
    "value, expected",
    [
        (1e-4, "low"), (2e-4, "low"),  # log position 0, 0.075
        (5e-4, None), (0.05, None),  # 0.175, 0.675: inside (0.05 would be the low 10% on a linear scale)
        (0.5, "high"), (1.0, "high"),  # 0.925 (only 0.5 of the range on a linear scale), 1
        (0.3, None),  # 0.869
        (2.0, "high"), (5e-5, "low"),  # outside the range: the nearer edge
    ],
)
def test_log_scale_edges_are_the_outer_tenth_in_log_space(value, expected):
    assert edge(LR, value) == expected


@pytest.mark.parametrize(
    "value, expected",
    [
        (0.5, "low"), (0.55, "low"), (0.7, "low"),  # 1 - momentum log-positions 0, 0.017, 0.082
        (0.8, None), (0.9, None), (0.995, None),  # 0.147, 0.259, 0.741 (0.995 is 99% of the range linearly)
        (0.9985, "high"), (0.999, "high"),  # 0.935, 1
    ],
)
def test_reverse_log_scale_edges_are_the_outer_tenth_of_log_one_minus_value(value, expected):
    assert edge(MOMENTUM, value) == expected


@pytest.mark.parametrize("value, expected", [(0.0, "low"), (0.05, "low"), (0.12, None), (0.5, None), (0.88, None),
                                             (0.95, "high"), (1.0, "high")])
def test_linear_scale_edges(value, expected):
    assert edge(LINEAR, value) == expected


def test_integer_discrete_and_unsearched_parameters():
    steps = Parameter("decay_steps", "INTEGER", "LINEAR", 50, 100)
    assert [edge(steps, v) for v in (50, 54, 60, 75, 96, 100)] == ["low", "low", None, None, "high", "high"]
    small = Parameter("layers", "INTEGER", "LINEAR", 1, 3)
    assert [edge(small, v) for v in (1, 2, 3)] == ["low", None, "high"]  # first/last value of a short range
    log_int = Parameter("width", "INTEGER", "LOG", 8, 1024)
    assert [edge(log_int, v) for v in (8, 12, 32, 512, 800)] == ["low", "low", None, None, "high"]
    discrete = Parameter("label_smoothing", "DISCRETE", feasible_points=(0.1, 0.0, 0.01))
    assert [edge(discrete, v) for v in (0.0, 0.01, 0.1)] == ["low", None, "high"]
    found = parameter_edge(discrete, 0.1)
    assert (found["min_value"], found["max_value"], found["scale"], found["position"]) == (0.0, 0.1, "DISCRETE", None)
    assert edge(Parameter("flag", "DISCRETE", feasible_points=(0, 1)), 1) is None  # no interior to compare with
    assert edge(Parameter("kind", "DISCRETE", feasible_points=("a", "b", "c")), "a") is None
    assert edge(Parameter("fixed", "DOUBLE", "LOG", 0.1, 0.1), 0.1) is None  # not searched
    assert edge(LR, None) is None and edge(LR, "fast") is None
    outside = parameter_edge(LR, 2.0)
    assert outside["outside"] and outside["position"] > 1
    with pytest.raises(BatchlabError, match=r"fraction must be a number in \(0, 0.5\)"):
        parameter_edge(LR, 0.5, fraction=0.6)


def test_search_space_edges_reads_the_batch_science_form_and_a_wider_fraction():
    configs = {
        "learning_rate": {"type": "DOUBLE", "min_value": 1e-4, "max_value": 1.0, "scale": "LOG_SCALE"},
        "momentum": {"type": "DOUBLE", "min_value": 0.5, "max_value": 0.999, "scale": "REVERSE_LOG_SCALE"},
    }
    found = search_space_edges({"learning_rate": 0.5, "momentum": 0.9}, configs)
    assert [(f["parameter"], f["edge"], f["value"]) for f in found] == [("learning_rate", "high", 0.5)]
    assert found[0]["min_value"] == 1e-4 and found[0]["max_value"] == 1.0 and found[0]["scale"] == "LOG"
    assert search_space_edges({"momentum": 0.9}, configs, fraction=0.3)[0]["edge"] == "low"  # position 0.26
    assert search_space_edges({}, configs) == []


SPACE_A = {"learning_rate": {"type": "DOUBLE", "min_value": 1e-3, "max_value": 10.0, "scale": "LOG_SCALE"},
           "momentum": {"type": "DOUBLE", "min_value": 0.5, "max_value": 0.999, "scale": "REVERSE_LOG_SCALE"}}
SPACE_B = {"learning_rate": {"type": "DOUBLE", "min_value": 1e-1, "max_value": 100.0, "scale": "LOG_SCALE"},
           "momentum": {"type": "DOUBLE", "min_value": 0.5, "max_value": 0.999, "scale": "REVERSE_LOG_SCALE"}}


def store_with_spaces(trials, spaces, trial_studies=None):
    """A connection whose studies carry search spaces: ``spaces`` maps (batch_size, study_id) to a
    parameter_configs dict (study_id None: a store without study ids); ``trial_studies`` maps
    (batch_size, trial_id) to its study id."""
    tables = tables_from_trials(trials)
    with_ids = any(sid is not None for _, sid in spaces)
    rows = [{"workload": W, "batch_size": b, "search_space": json.dumps(space), "train_steps": 100,
             "early_stopping": False} | ({"study_id": sid} if with_ids else {}) for (b, sid), space in spaces.items()]
    import pandas as pd

    tables["studies"] = pd.DataFrame(rows)
    if trial_studies is not None:
        tables["trials"]["study_id"] = [trial_studies.get((b, t)) for b, t in
                                        zip(tables["trials"]["batch_size"], tables["trials"]["trial_id"])]
    con = duckdb.connect(":memory:")
    for name, frame in tables.items():
        con.register(f"source_{name}", frame)
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM source_{name}")
    return con


def test_search_edge_warnings_for_the_best_trial_of_each_reached_batch_size():
    trials = [
        trial(W, 8, 1, curve([(100, 0.005)]), learning_rate=0.0012, momentum=0.9),  # lr in the low 10%
        trial(W, 8, 2, curve([(200, 0.005)]), learning_rate=0.1, momentum=0.9),  # not the best: ignored
        trial(W, 32, 1, curve([(40, 0.005)]), learning_rate=0.1, momentum=0.9),  # inside on both
        trial(W, 128, 1, curve([(10, 0.004)]), learning_rate=8.0, momentum=0.9985),  # both high
        trial(W, 512, 1, curve([(10, 0.5)]), learning_rate=9.0, momentum=0.5),  # not reached: no warning
    ]
    con = store_with_spaces(trials, {(b, None): SPACE_A for b in (8, 32, 128, 512)})
    results = steps_to_result(con, W, M, 0.01)
    warnings = search_edge_warnings(con, results)
    assert [(w["batch_size"], w["trial_id"], w["parameter"], w["edge"]) for w in warnings] == [
        (8, 1, "learning_rate", "low"), (128, 1, "learning_rate", "high"), (128, 1, "momentum", "high"),
    ]
    first = warnings[0]
    assert (first["value"], first["min_value"], first["max_value"], first["scale"]) == (0.0012, 1e-3, 10.0, "LOG")
    assert first["study_id"] is None and first["fraction"] == 0.1 and not first["outside"]
    assert first["message"] == format_search_edge_warning(first)
    assert first["message"].startswith("batch size 8: best trial 1 has learning_rate = 0.0012, in the low 10% of "
                                       "its searched range [0.001, 10] (log scale)")
    json.dumps(warnings)  # JSON-ready
    # the metaparameter outputs carry them: rows and the plot's edge mask
    opt = optimal_metaparameters(results, search_edges=warnings)
    assert opt.edge_limited("learning_rate").tolist() == [True, False, True]
    assert opt.edge_limited("momentum").tolist() == [False, False, True]
    assert opt.edge_limited("effective_learning_rate").tolist() == [True, False, True]
    rows = opt.to_rows()
    assert rows[1]["search_edge"] == []
    assert [w["parameter"] for w in rows[2]["search_edge"]] == ["learning_rate", "momentum"]
    assert rows[0]["search_edge"] == [{"parameter": "learning_rate", "edge": "low", "value": 0.0012,
                                       "min_value": 1e-3, "max_value": 10.0, "scale": "LOG"}]
    with pytest.raises(BatchlabError, match="unknown metaparameter"):
        opt.edge_limited("beta1")


def test_search_edge_warnings_use_the_best_trials_own_study():
    # Two studies at batch size 8 with different learning-rate ranges; lr 0.15 is at the low edge of
    # study "b" (0.1..100) but inside study "a" (0.001..10).
    trials = [
        trial(W, 8, 1, curve([(100, 0.005)]), learning_rate=0.15, momentum=0.9),
        trial(W, 8, 2, curve([(200, 0.005)]), learning_rate=0.15, momentum=0.9),
    ]
    spaces = {(8, "a"): SPACE_A, (8, "b"): SPACE_B}
    mixed = Selection(W, M, 0.01, mix_studies=True)
    in_b = store_with_spaces(trials, spaces, trial_studies={(8, 1): "b", (8, 2): "a"})
    (warning,) = search_edge_warnings(in_b, steps_to_result_many(in_b, [mixed])[0])
    assert (warning["study_id"], warning["edge"], warning["min_value"]) == ("b", "low", 0.1)
    in_a = store_with_spaces(trials, spaces, trial_studies={(8, 1): "a", (8, 2): "b"})
    assert search_edge_warnings(in_a, steps_to_result_many(in_a, [mixed])[0]) == []
    # the best trial's own study has no search space: another study's range is not used in its place
    unknown = store_with_spaces(trials, {(8, "b"): SPACE_B}, trial_studies={(8, 1): "c", (8, 2): "b"})
    assert search_edge_warnings(unknown, steps_to_result_many(unknown, [mixed])[0]) == []
    # without a study id on the trials, the result's study_ids pick the study
    (result,) = steps_to_result_many(in_b, [mixed])[0]
    no_ids = store_with_spaces(trials, spaces)
    for ids, expected in ((["b"], ["b"]), (["a"], []), ([], ["b"])):  # [] -> every study at that batch size
        found = search_edge_warnings(no_ids, [dataclasses.replace(result, study_ids=ids)])
        assert [w["study_id"] for w in found] == expected


def test_search_edge_warnings_skip_studies_without_a_readable_space(con):
    results = steps_to_result(con, W, M, 0.01)  # the plain fixture: search_space "{}"
    assert results[0].reached and search_edge_warnings(con, results) == []
    assert search_edge_warnings(con, []) == []
    broken = store_with_spaces([trial(W, 8, 1, curve([(100, 0.005)]), learning_rate=0.0011)],
                               {(8, None): {"learning_rate": {"type": "DOUBLE", "scale": "LOG_SCALE"}}})
    assert search_edge_warnings(broken, steps_to_result(broken, W, M, 0.01)) == []


def test_searched_ranges_per_batch_size_for_plots():
    trials = [trial(W, 8, 1, curve([(100, 0.005)]), learning_rate=0.15, momentum=0.9),
              trial(W, 32, 1, curve([(100, 0.5)]), learning_rate=0.15, momentum=0.9)]  # 32: not reached
    discrete = {**SPACE_A, "smoothing": {"type": "DISCRETE", "feasible_points": [0.0, 0.1, 0.2]}}
    con = store_with_spaces(trials, {(8, "a"): discrete, (32, "a"): SPACE_A, (32, "b"): SPACE_B})
    results = steps_to_result_many(con, [Selection(W, M, 0.01, mix_studies=True)])[0]
    ranges = searched_ranges(con, results)
    assert ranges[8] == {"learning_rate": (1e-3, 10.0, "LOG"), "momentum": (0.5, 0.999, "REVERSE_LOG")}
    # two studies with different learning-rate ranges at 32: only the range they share is given
    assert ranges[32] == {"momentum": (0.5, 0.999, "REVERSE_LOG")}
    assert searched_ranges(con, []) == {}


def test_best_trial_spaces_one_space_per_batch_size():
    from batchlab.analysis.metaparameters import best_trial_spaces
    from batchlab.search import SearchSpace

    trials = [trial(W, 8, 1, curve([(100, 0.005)]), learning_rate=0.15, momentum=0.9),
              trial(W, 32, 1, curve([(100, 0.5)]), learning_rate=0.15, momentum=0.9),  # not reached: still answered
              trial(W, 128, 1, curve([(100, 0.005)]), learning_rate=0.15, momentum=0.9)]
    con = store_with_spaces(trials, {(8, "a"): SPACE_A, (32, "a"): SPACE_A, (128, "a"): SPACE_A, (128, "b"): SPACE_B})
    results = steps_to_result_many(con, [Selection(W, M, 0.01, mix_studies=True)])[0]
    spaces = best_trial_spaces(con, results)
    assert spaces == {8: SearchSpace.from_batch_science(SPACE_A), 32: SearchSpace.from_batch_science(SPACE_A)}
    # 128: two studies with different spaces and no study id on the trials: no one space
    same = store_with_spaces(trials, {(b, "a"): SPACE_A for b in (8, 32, 128)})
    assert sorted(best_trial_spaces(same, steps_to_result(same, W, M, 0.01))) == [8, 32, 128]
    assert best_trial_spaces(con, []) == {}


def test_a_search_rounds_space_is_its_box_joined_with_the_space_it_refines():
    """A box extended past the refined space's upper learning-rate edge (search_edge) and inside it in
    momentum: the searched range is [lower of the two, upper of the two] per parameter."""
    from batchlab.analysis.metaparameters import _searched_with_base
    from batchlab.search import SearchSpace

    base = SearchSpace.from_batch_science({
        "learning_rate": {"type": "DOUBLE", "min_value": 1e-4, "max_value": 1.0, "scale": "LOG_SCALE"},
        "momentum": {"type": "DOUBLE", "min_value": 0.5, "max_value": 0.999, "scale": "REVERSE_LOG_SCALE"}})
    box = SearchSpace.from_batch_science({
        "learning_rate": {"type": "DOUBLE", "min_value": 0.1, "max_value": 10.0, "scale": "LOG_SCALE"},
        "momentum": {"type": "DOUBLE", "min_value": 0.8, "max_value": 0.95, "scale": "REVERSE_LOG_SCALE"}})
    joined = _searched_with_base(box, base).to_batch_science()
    assert (joined["learning_rate"]["min_value"], joined["learning_rate"]["max_value"]) == (1e-4, 10.0)
    assert (joined["momentum"]["min_value"], joined["momentum"]["max_value"]) == (0.5, 0.999)
    assert _searched_with_base(box, None) == box
