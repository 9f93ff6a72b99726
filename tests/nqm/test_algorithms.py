"""The registry of NQM algorithms: every entry complete, consistent and the only source of names."""

import json

import numpy as np
import pytest

from batchlab.errors import BatchlabError
from batchlab.nqm import algorithms
from batchlab.nqm.algorithms import (
    BASE_UPDATES,
    Algorithm,
    NQMAlgorithm,
    get_nqm_algorithm,
    nqm_algorithm_names,
    register_nqm_algorithm,
)
from batchlab.nqm.dynamics import linear_update, losses_at_steps, moment_recurrence
from batchlab.nqm.problem import power_law
from batchlab.nqm.steps import default_max_steps, official_low
from batchlab.nqm.tuning import official_grid, tune

NAMES = nqm_algorithm_names()


def test_the_registry_holds_every_algorithm_the_engine_had():
    assert set(NAMES) == {"sgd", "momentum", "nesterov", "ema", "momentum+ema", "nesterov+ema"}


@pytest.mark.parametrize("name", NAMES)
def test_every_entry_is_complete(name):
    entry = get_nqm_algorithm(name)
    assert isinstance(entry, NQMAlgorithm) and entry.name == name and entry.summary.strip()
    assert entry.base in BASE_UPDATES and entry.update is BASE_UPDATES[entry.base]
    axes = entry.grid()
    assert tuple(axes) == entry.hyperparameters and list(axes)[0] == "learning_rate"
    for axis, values in axes.items():
        assert values.ndim == 1 and values.size >= 2 and np.all(np.isfinite(values))
        if axis == "learning_rate":
            assert np.all(values > 0)
        else:  # momentum / EMA decay axes
            assert np.all((values >= 0) & (values < 1))
    assert entry.grid() is not axes and all(np.array_equal(axes[k], v) for k, v in entry.grid().items())
    assert entry.default_max_steps == entry.official_high - 1 == default_max_steps(name)
    json.dumps(entry.describe(), allow_nan=False)
    algorithm = Algorithm(name, 0.5)
    assert algorithm.entry is entry and algorithm.uses_momentum == ("momentum" in axes)
    assert algorithm.uses_ema == ("ema_decay" in axes) == entry.ema
    assert official_grid(algorithm).keys() == axes.keys()


def test_the_official_grids_and_budgets_are_the_notebooks():
    sgd, momentum, ema = (get_nqm_algorithm(n).grid() for n in ("sgd", "momentum", "ema"))
    np.testing.assert_array_equal(sgd["learning_rate"], np.logspace(-5, 0.5, 100))
    np.testing.assert_array_equal(momentum["learning_rate"], np.logspace(-8, 1, 100))
    np.testing.assert_array_equal(momentum["momentum"], 1.0 - 10.0 ** (-5.0 + 5.0 * np.arange(20) / 19.0))
    np.testing.assert_array_equal(ema["ema_decay"], momentum["momentum"])
    np.testing.assert_array_equal(get_nqm_algorithm("nesterov+ema").grid()["ema_decay"], [0.0, 0.9, 0.99, 0.999, 0.9999])
    assert default_max_steps("sgd") == 10**9 - 1 and default_max_steps("nesterov") == 10**7 - 1
    for name in NAMES:  # every grid holds plain SGD (momentum = decay = 0): tuning bounds its search with it
        assert all(np.any(v == 0.0) for axis, v in get_nqm_algorithm(name).grid().items() if axis != "learning_rate")
    assert official_low(1, "sgd") == 1 and official_low(1, "momentum") == 0  # the notebook clamps SGD only


@pytest.mark.parametrize("base", sorted(BASE_UPDATES))
def test_each_base_update_samples_what_its_linear_map_says(base):
    # w' = A w + b eps (the exact dynamics) and the sampled update (Monte Carlo) are one definition
    update = BASE_UPDATES[base]
    rng = np.random.default_rng(0)
    h, x, v, eps = (rng.uniform(0.1, 1.0, 5) for _ in range(4))
    lr, p, mu = 0.3, 0.25, (0.7 if update.uses_momentum else None)
    gain = lr * h**-p
    A, b, readout, init = linear_update(base, lr * h ** (1 - p), gain, momentum=mu if mu is not None else 0.0)
    state = [x, v][: len(A)]
    expected = [sum(A[i][k] * state[k] for k in range(len(A))) + b[i] * eps for i in range(len(A))]
    x_new, v_new = update.sample(x, v, gain, h, eps, mu)
    np.testing.assert_allclose(x_new, expected[0], rtol=1e-14)
    if update.uses_momentum:
        np.testing.assert_allclose(v_new, expected[1], rtol=1e-14)
    assert readout[0] == 1.0 and init[0] == 1.0


def test_unknown_names_are_one_line_errors():
    for call in (lambda: get_nqm_algorithm("adam"), lambda: Algorithm("adam")):
        with pytest.raises(BatchlabError) as info:
            call()
        message = str(info.value)
        assert "\n" not in message and message.startswith("unknown optimizer 'adam'") and "sgd" in message
    with pytest.raises(BatchlabError, match="unknown base update"):
        algorithms.get_base_update("lion")
    with pytest.raises(BatchlabError, match="already registered"):
        register_nqm_algorithm(get_nqm_algorithm("sgd"))
    with pytest.raises(BatchlabError, match=r"\[0, 1\]"):
        Algorithm("sgd", 1.5)


@pytest.fixture
def registered():
    """Register test entries; remove them afterwards (the registry is process-global)."""
    added = []

    def add(entry):
        added.append(entry.name)
        return register_nqm_algorithm(entry)

    yield add
    for name in added:
        algorithms._REGISTRY.pop(name, None)


def test_a_new_algorithm_is_one_entry(registered):
    # "heavy-ball" declared as one entry (momentum's base update, a small grid of its own) runs everywhere
    grid = lambda: {"learning_rate": np.array([0.1, 0.3, 1.0]), "momentum": np.array([0.0, 0.5, 0.9])}  # noqa: E731
    registered(NQMAlgorithm("heavy-ball", "test entry", "momentum", False, grid, 10**6))
    assert "heavy-ball" in nqm_algorithm_names()
    problem = power_law(1.0, 1.0, 20)
    new, old = Algorithm("heavy-ball"), Algorithm("momentum")
    rec_new = moment_recurrence(problem, new, 0.3, momentum=0.5)
    rec_old = moment_recurrence(problem, old, 0.3, momentum=0.5)
    np.testing.assert_array_equal(losses_at_steps(rec_new, 4, [0, 7, 50]), losses_at_steps(rec_old, 4, [0, 7, 50]))
    (point,) = tune(problem, new, [8], 0.5, grid="official")
    assert point.result.reached and point.learning_rate in grid()["learning_rate"] and point.momentum in grid()["momentum"]
    with pytest.raises(BatchlabError, match="needs a momentum"):
        moment_recurrence(problem, new, 0.3)


def _grid(**axes):
    return lambda: {k: np.asarray(v, dtype=float) for k, v in axes.items()}


@pytest.mark.parametrize("fields, match", [
    (dict(name="two words"), "non-empty word"),
    (dict(summary="two\nlines"), "summary must be one non-empty line"),
    (dict(base="lion"), "unknown base update 'lion'"),
    (dict(official_high=1), "official_high must be an integer >= 2"),
    (dict(base="momentum", pwc=True, grid=_grid(learning_rate=[0.1], momentum=[0.0])), "pwc and notebook_fudge need"),
    (dict(ema=True, notebook_fudge=True, grid=_grid(learning_rate=[0.1], ema_decay=[0.0])), "pwc and notebook_fudge"),
    (dict(grid=_grid(learning_rate=[0.1], momentum=[0.0])), "grid\\(\\) must return the axes learning_rate in"),
    (dict(grid=_grid(learning_rate=[0.0, 0.1])), "grid axis learning_rate must be .* > 0"),
    (dict(base="momentum", grid=_grid(learning_rate=[0.1], momentum=[1.0])), "grid axis momentum must be .* in \\[0, 1\\)"),
])
def test_a_malformed_entry_is_refused_at_registration(registered, fields, match):
    base = dict(name="x", summary="test entry", base="sgd", ema=False, grid=_grid(learning_rate=[0.1, 1.0]),
                official_high=100)
    with pytest.raises(BatchlabError, match=match) as info:
        registered(NQMAlgorithm(**(base | fields)))
    assert "\n" not in str(info.value) and "x" not in nqm_algorithm_names()
