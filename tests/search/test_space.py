"""Search spaces: scales, ranges, determinism, point/sample consistency, round trip, validation."""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchlab.errors import BatchlabError
from batchlab.search import Parameter, SearchSpace

RELEASE_EXAMPLE = {  # the example study.json of the release (docs/methods.md, "Optimizers, schedules and search spaces")
    "learning_rate": {"type": "DOUBLE", "min_value": 1e-4, "max_value": 10.0, "scale": "LOG_SCALE"},
    "momentum": {"type": "DOUBLE", "min_value": 0.9, "max_value": 0.9999, "scale": "REVERSE_LOG_SCALE"},
    "learning_rate_decay_steps": {"type": "INTEGER", "min_value": 300000, "max_value": 600000, "scale": "LINEAR_SCALE"},
    "end_learning_rate_factor": {"type": "DOUBLE", "min_value": 1e-4, "max_value": 0.1, "scale": "LOG_SCALE"},
    "label_smoothing": {"type": "DISCRETE", "feasible_points": [0.0, 0.01, 0.1]},
}


def test_round_trip_of_the_release_example():
    space = SearchSpace.from_batch_science(RELEASE_EXAMPLE)
    assert space.to_batch_science() == RELEASE_EXAMPLE
    assert SearchSpace.from_batch_science(json.loads(json.dumps(space.to_batch_science()))) == space
    assert space.names == list(RELEASE_EXAMPLE)


def test_short_scale_names_and_named_lists_are_accepted():
    listed = [{"name": "lr", "type": "DOUBLE", "min_value": 0.1, "max_value": 1, "scale": "LOG"}]
    space = SearchSpace.from_batch_science(listed)
    assert space.to_batch_science() == {"lr": {"type": "DOUBLE", "min_value": 0.1, "max_value": 1.0, "scale": "LOG_SCALE"}}


def test_samples_lie_in_range_with_the_right_types():
    space = SearchSpace.from_batch_science(RELEASE_EXAMPLE)
    points = space.sample(200, seed=3)
    json.dumps(points)
    for p in points:
        assert 1e-4 <= p["learning_rate"] <= 10.0
        assert 0.9 <= p["momentum"] <= 0.9999
        assert isinstance(p["learning_rate_decay_steps"], int)
        assert 300000 <= p["learning_rate_decay_steps"] <= 600000
        assert 1e-4 <= p["end_learning_rate_factor"] <= 0.1
        assert p["label_smoothing"] in (0.0, 0.01, 0.1)
    assert {p["label_smoothing"] for p in points} == {0.0, 0.01, 0.1}


def test_scales_spread_points_as_documented():
    """LOG: log(value) is uniform; REVERSE_LOG: log(1 - value) is uniform; LINEAR: value is uniform."""
    space = SearchSpace([
        Parameter("a", "DOUBLE", "LOG", 1e-4, 1.0),
        Parameter("b", "DOUBLE", "REVERSE_LOG", 0.9, 0.9999),
        Parameter("c", "DOUBLE", "LINEAR", -1.0, 3.0),
    ])
    points = space.sample(512, seed=0)
    log_a = np.log10([p["a"] for p in points])
    log_b = np.log10([1 - p["b"] for p in points])
    c = np.array([p["c"] for p in points])
    for values, lo, hi in ((log_a, -4, 0), (log_b, -4, -1), (c, -1, 3)):
        quarters = np.histogram(values, bins=4, range=(lo, hi))[0]
        assert quarters.min() >= 120 and quarters.max() <= 136  # low discrepancy: ~128 per quarter


def test_integer_range_reaches_both_ends_evenly():
    space = SearchSpace([Parameter("n", "INTEGER", "LINEAR", 3, 6)])
    counts = np.bincount([p["n"] for p in space.sample(400, seed=1)], minlength=7)[3:]
    assert counts.min() >= 95 and counts.sum() == 400


def test_log_integer_range():
    space = SearchSpace([Parameter("n", "INTEGER", "LOG", 1, 1000)])
    values = [p["n"] for p in space.sample(300, seed=2)]
    assert min(values) >= 1 and max(values) <= 1000
    assert sum(v < 32 for v in values) > 100  # half the log range lies below sqrt(1001)


def test_deterministic_given_seed_and_different_across_seeds():
    space = SearchSpace.from_batch_science(RELEASE_EXAMPLE)
    assert space.sample(20, seed=7) == space.sample(20, seed=7)
    assert space.sample(20, seed=7) != space.sample(20, seed=8)
    assert space.sample(5, seed=7) == space.sample(20, seed=7)[:5]  # a prefix of one sequence


@settings(max_examples=20, deadline=None)
@given(index=st.integers(0, 300), seed=st.integers(0, 2**31))
def test_point_equals_sample_at_index(index, seed):
    space = SearchSpace.from_batch_science(RELEASE_EXAMPLE)
    assert space.point(index, seed) == space.sample(index + 1, seed)[index]


def test_degenerate_ranges_and_empty_space():
    space = SearchSpace([Parameter("x", "DOUBLE", "LOG", 0.5, 0.5), Parameter("k", "INTEGER", "LINEAR", 4, 4)])
    assert space.sample(3) == [{"x": 0.5, "k": 4}] * 3
    assert SearchSpace([]).sample(2) == [{}, {}]
    assert SearchSpace([]).point(5) == {}


@pytest.mark.parametrize(
    ("configs", "fragment"),
    [
        ({"lr": {"type": "DOUBLE", "min_value": 1.0, "max_value": 0.1, "scale": "LOG_SCALE"}}, "min_value 1 > max_value 0.1"),
        ({"lr": {"type": "DOUBLE", "min_value": 0.0, "max_value": 1.0, "scale": "LOG_SCALE"}}, "LOG scale needs 0 < min_value"),
        ({"lr": {"type": "DOUBLE", "min_value": -1.0, "max_value": 1.0, "scale": "LOG"}}, "LOG scale needs 0 < min_value"),
        ({"m": {"type": "DOUBLE", "min_value": 0.9, "max_value": 1.0, "scale": "REVERSE_LOG_SCALE"}}, r"REVERSE_LOG scale needs 0 <= min_value <= max_value < 1"),
        ({"m": {"type": "DOUBLE", "min_value": -0.1, "max_value": 0.9, "scale": "REVERSE_LOG_SCALE"}}, "REVERSE_LOG scale needs"),
        ({"m": {"type": "INTEGER", "min_value": 0, "max_value": 0, "scale": "REVERSE_LOG_SCALE"}}, "INTEGER allows scales LINEAR, LOG"),
        ({"x": {"type": "FLOAT", "min_value": 0, "max_value": 1, "scale": "LINEAR_SCALE"}}, "unknown type 'FLOAT'; allowed: DOUBLE, INTEGER, DISCRETE"),
        ({"x": {"type": "DOUBLE", "min_value": 0, "max_value": 1, "scale": "SQRT_SCALE"}}, "unknown scale 'SQRT_SCALE'; allowed: LINEAR_SCALE, LOG_SCALE, REVERSE_LOG_SCALE"),
        ({"x": {"type": "DOUBLE", "max_value": 1, "scale": "LINEAR_SCALE"}}, "needs min_value and max_value"),
        ({"x": {"type": "DOUBLE", "min_value": "a", "max_value": 1}}, "min_value must be a finite number"),
        ({"x": {"type": "DOUBLE", "min_value": 0, "max_value": math.inf}}, "max_value must be a finite number"),
        ({"x": {"type": "INTEGER", "min_value": 0.5, "max_value": 2}}, "INTEGER needs integer min_value and max_value"),
        ({"x": {"type": "DISCRETE", "feasible_points": []}}, "non-empty list feasible_points"),
        ({"x": {"type": "DISCRETE"}}, "non-empty list feasible_points"),
        ({"x": {"type": "DOUBLE", "min_value": 0, "max_value": 1, "step": 2}}, "unknown field 'step'"),
        ({"x": 3}, "config must be an object"),
        ("learning_rate", "parameter_configs must be an object"),
        ([{"type": "DOUBLE"}], "needs a string 'name'"),
    ],
)
def test_invalid_configs_give_one_line_errors(configs, fragment):
    with pytest.raises(BatchlabError, match=fragment) as info:
        SearchSpace.from_batch_science(configs)
    assert "\n" not in str(info.value)


def test_duplicate_names_and_bad_counts():
    p = Parameter("x", "DOUBLE", "LINEAR", 0, 1)
    with pytest.raises(BatchlabError, match="twice"):
        SearchSpace([p, p])
    space = SearchSpace([p])
    with pytest.raises(BatchlabError, match="integer >= 0"):
        space.sample(-1)
    with pytest.raises(BatchlabError, match="point index"):
        space.point(-2)
    with pytest.raises(BatchlabError, match="seed"):
        space.sample(2, seed=-1)


def test_study_points_seed_is_stable_and_distinct_per_study():
    from batchlab.search import study_points_seed

    seeds = {study_points_seed(s, w, o, b) for s in (0, 1) for w in ("a/b", "a/c") for o in ("sgd", "adam")
             for b in (1, 2, 1024)}
    assert len(seeds) == 24 and all(0 <= s < 2**63 for s in seeds)
    assert study_points_seed(0, "a/b", "sgd", 8) == study_points_seed(0, "a/b", "sgd", 8)
    assert study_points_seed(0, "a/b", "sgd", 8, search_round=1) != study_points_seed(0, "a/b", "sgd", 8)
    with pytest.raises(BatchlabError, match="seed"):
        study_points_seed(-1, "a/b", "sgd", 8)


@given(u=st.floats(0.0, 0.999))
def test_unit_inverts_value(u):
    for p in (Parameter("a", "DOUBLE", "LOG", 1e-4, 1.0), Parameter("b", "DOUBLE", "REVERSE_LOG", 0.5, 0.999),
              Parameter("c", "DOUBLE", "LINEAR", -1.0, 3.0)):
        assert math.isclose(p.unit(p.value(u)), u, abs_tol=1e-9)
    n = Parameter("n", "INTEGER", "LINEAR", 10, 19)
    assert n.value(n.unit(n.value(u))) == n.value(u)
    d = Parameter("d", "DISCRETE", feasible_points=(0.0, 0.1, 0.2, 0.3))
    assert d.value(d.unit(d.value(u))) == d.value(u)


def test_box_around_a_point_in_each_parameters_own_scale():
    space = SearchSpace([Parameter("lr", "DOUBLE", "LOG", 1e-4, 1.0),
                         Parameter("m", "DOUBLE", "REVERSE_LOG", 0.5, 0.999),
                         Parameter("n", "INTEGER", "LINEAR", 0, 99),
                         Parameter("d", "DISCRETE", feasible_points=(0.0, 0.1, 0.2, 0.3))])
    centre = {"lr": 1e-2, "m": 0.998, "n": 50, "d": 0.1}
    box = space.box(centre, 0.25)
    lr, m, n, d = box.parameters
    assert (lr.scale, m.scale) == ("LOG", "REVERSE_LOG")
    assert math.isclose(lr.min_value, 1e-3) and math.isclose(lr.max_value, 1e-1)  # a decade each way of 4
    assert 0.5 < m.min_value < 0.998 and m.max_value == 0.999  # clipped at the top edge
    assert (n.min_value, n.max_value) == (25, 75) and d.feasible_points == (0.0, 0.1, 0.2)
    for point in box.sample(64, seed=0):  # every point within a quarter range of the centre, in unit coordinates
        assert all(abs(p.unit(point[p.name]) - p.unit(centre[p.name])) <= 0.25 + 1e-9 for p in space.parameters[:2])
    # at a search edge the box extends the scale past it: beyond 0.999 (still below 1) and below 1e-4
    wide = space.box({**centre, "lr": 1.5e-4}, 0.25, extend=("lr", "m"))
    assert wide.parameters[0].min_value < 1e-4 and 0.999 < wide.parameters[1].max_value < 1
    assert math.isclose(wide.parameters[0].min_value, 1.5e-4 / 10)
    with pytest.raises(BatchlabError, match="half width"):
        space.box(centre, 0.0)
