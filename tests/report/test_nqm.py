"""batchlab.report.nqm: the exact NQM prediction per batchlab optimizer (docs/methods.md, "The NQM
prediction in the report")."""

import json

import numpy as np
import pytest

from batchlab.errors import BatchlabError
from batchlab.report import nqm

BATCH_SIZES = [16, 64, 256, 1024, 4096]
MODELLED = ["sgd", "momentum", "nesterov", "adam", "adamw", "kfac", "soap"]
UNMODELLED = ["lars", "lamb", "muon"]


@pytest.fixture(scope="module")
def predictions():
    # One call for every test (about 1-4 s cold on one core: five distinct engine runs, each over the
    # batch sizes above plus the b_crit grid 4, 16, ..., 2^20).
    return nqm.predict(MODELLED + UNMODELLED, BATCH_SIZES)


def test_mapping_gives_different_algorithms(predictions):
    models = {name: (predictions[name].nqm_algorithm, predictions[name].precondition)
              for name in ("sgd", "momentum", "adam", "kfac")}
    assert models == {"sgd": ("sgd", 0.0), "momentum": ("momentum", 0.0), "adam": ("momentum", 0.5),
                      "kfac": ("momentum", 1.0)}
    assert len({predictions[n].algorithm for n in ("sgd", "momentum", "nesterov", "adam", "kfac")}) == 5
    assert all(len(predictions[n].algorithm) <= 45 for n in MODELLED)  # a legend label
    assert all(predictions[n].rationale and "\n" not in predictions[n].rationale for n in MODELLED)
    assert predictions["nesterov"].nqm_algorithm == "nesterov"
    # adamw and soap are modelled as adam (see the mapping's comments): the same curve, computed once.
    for name in ("adamw", "soap"):
        assert (predictions[name].nqm_algorithm, predictions[name].precondition) == ("momentum", 0.5)
        np.testing.assert_array_equal(predictions[name].steps, predictions["adam"].steps)
    assert nqm.supported_optimizers() == tuple(nqm.MAPPINGS)


def test_critical_batch_size_ordering_of_zhang_et_al(predictions):
    # Zhang et al. (2019): SGD <= momentum <= Adam-like (p = 0.5) <= K-FAC-like (p = 1). The engine gives
    # on zhang2019-binned, target 0.01, official grids, fitted over B = 4..2^20: sgd 8.0e2, nesterov
    # 1.9e4, momentum 3.2e4, adam 8.4e4, kfac 3.8e6 (extrapolated: the p = 1 curve scales perfectly until
    # it needs one step). Nesterov's B_crit is below heavy-ball momentum's although it needs fewer steps
    # everywhere: its curve bends earlier (a poor hyperbola, chi2 = 255 on 8 dof). Strict inequalities
    # hold with margins of 2x or more.
    b = {name: predictions[name].b_crit for name in ("sgd", "momentum", "nesterov", "adam", "kfac")}
    assert all(value is not None for value in b.values())
    assert 2 * b["sgd"] < b["momentum"] < b["adam"] < b["kfac"]
    assert 2 * b["sgd"] < b["nesterov"] <= b["momentum"]
    assert 600 < b["sgd"] < 1000  # docs/methods.md: the fit-derived bounds 80 and 8006 at tol 0.1
    assert predictions["kfac"].b_crit_extrapolated and not predictions["adam"].b_crit_extrapolated
    # The steps at a batch size follow the same order (each model needs fewer steps than the one before).
    for small, large in (("sgd", "momentum"), ("momentum", "adam"), ("adam", "kfac")):
        assert np.all(predictions[large].steps <= predictions[small].steps)


def test_unsupported_optimizers_give_none_and_a_reason(predictions):
    for name in UNMODELLED + ["not-an-optimizer"]:
        assert nqm.predict([name], BATCH_SIZES[:1])[name] is None
        reason = nqm.unsupported_reason(name)
        assert reason and "\n" not in reason
    for name in UNMODELLED:
        assert predictions[name] is None
    assert "trust ratio" in nqm.unsupported_reason("lars")
    assert "polar factor" in nqm.unsupported_reason("muon")
    assert "not-an-optimizer" in nqm.unsupported_reason("not-an-optimizer")
    assert nqm.unsupported_reason("sgd") == ""


def test_steps_monotone_and_fields(predictions):
    for name in MODELLED:
        p = predictions[name]
        assert isinstance(p, nqm.NqmPrediction)
        assert p.optimizer == name and p.exact
        assert p.batch_sizes.dtype.kind == "i" and p.batch_sizes.tolist() == BATCH_SIZES
        assert p.steps.dtype == float and p.steps.shape == (len(BATCH_SIZES),)
        reached = p.steps[np.isfinite(p.steps)]
        assert reached.size == len(BATCH_SIZES)
        assert np.all(np.diff(reached) <= 0), name
        assert p.problem == "zhang2019-binned (D = 10000, h_i = 1/i in 84 bins, c = h)"
        assert "0.01" in p.target
        assert p.b_crit_batch_sizes == tuple(4**k for k in range(1, 11))
        with pytest.raises(AttributeError):  # frozen
            p.b_crit = 1.0


def test_to_dict_is_json(predictions):
    for name in MODELLED:
        d = predictions[name].to_dict()
        text = json.dumps(d, allow_nan=False)
        back = json.loads(text)
        assert back["optimizer"] == name and back["batch_sizes"] == BATCH_SIZES
        assert back["steps"] == [int(s) for s in predictions[name].steps]
        for key in ("algorithm", "problem", "target", "b_crit", "exact"):
            assert key in back


def test_unreached_steps_are_nan_and_null(monkeypatch):
    # A budget too small for any batch size: NaN steps, null in JSON, and no b_crit (the fit needs two
    # reached batch sizes). The engine's budget is forced through its own default_max_steps.
    import batchlab.nqm.tuning as tuning

    nqm.clear_cache()
    monkeypatch.setattr(tuning, "default_max_steps", lambda name: 3)
    try:
        p = nqm.predict(["sgd"], [16, 64])["sgd"]
    finally:
        nqm.clear_cache()
    assert np.all(np.isnan(p.steps)) and p.b_crit is None
    assert json.loads(json.dumps(p.to_dict(), allow_nan=False))["steps"] == [None, None]


def test_curve_is_the_engines(predictions):
    # No re-implementation: the same numbers as the engine's own API (the library behind
    # `batchlab nqm sweep --grid official` and the figure table's fit path).
    from batchlab.analysis.critical_batch_size import summarize_curve
    from batchlab.nqm.algorithms import Algorithm
    from batchlab.nqm.problem import preset
    from batchlab.nqm.sweep import sweep_rows
    from batchlab.nqm.tuning import steps_curve, tune

    problem = preset("zhang2019-binned")
    rows = sweep_rows(problem, Algorithm("momentum", 0.5), BATCH_SIZES, 0.01, grid="official")
    assert predictions["adam"].steps.tolist() == [float(r["steps"]) for r in rows]
    assert predictions["adam"].learning_rates.tolist() == [r["learning_rate"] for r in rows]
    assert predictions["adam"].momenta.tolist() == [r["momentum"] for r in rows]
    points = tune(problem, Algorithm("sgd", 0.0), list(nqm.B_CRIT_BATCH_SIZES), 0.01, grid="official")
    summary = summarize_curve(steps_curve(points))
    assert predictions["sgd"].b_crit == summary["critical_batch_sizes"]["mccandlish_b_crit"]["value"]
    assert np.all(np.isnan(predictions["sgd"].momenta))


def test_grid_edge_is_flagged():
    # The K-FAC-like p = 1 optimum at B = 8 needs a learning rate below the official grid's 1e-8.
    p = nqm.predict(["kfac", "sgd"], [8, 64])
    assert p["kfac"].grid_edge.tolist() == [True, False]
    assert not p["sgd"].grid_edge.any()
    assert any("edge of the official grid at B = 4" in w for w in p["kfac"].fit_warnings)


def test_order_repeats_and_bad_batch_sizes():
    out = nqm.predict(["muon", "sgd", "muon", "sgd"], [64, 16, 64])
    assert list(out) == ["muon", "sgd"]
    assert out["sgd"].batch_sizes.tolist() == [16, 64]
    assert nqm.predict([], [16]) == {}
    for bad in ([], [0], [16, -4], [1.5], ["x"], [float("nan")]):
        with pytest.raises(BatchlabError):
            nqm.predict(["sgd"], bad)


def test_every_builtin_optimizer_has_an_nqm_decision():
    # A new built-in optimizer must be mapped (MAPPINGS) or given its reason (UNSUPPORTED) in
    # batchlab.report.nqm (docs/internals.md, "Add an optimizer").
    from batchlab.optim.builtin import BUILTIN_OPTIMIZERS

    for entry in BUILTIN_OPTIMIZERS:
        assert (entry.name in nqm.MAPPINGS) != (entry.name in nqm.UNSUPPORTED), entry.name
