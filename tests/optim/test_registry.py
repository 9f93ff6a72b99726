"""The optimizer registry: every entry complete, unknown names one-line errors everywhere, user entries
registered in this process or published as entry points, and a user optimizer training through run_trial."""

import math
from importlib import metadata

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from batchlab.errors import BatchlabError
from batchlab.optim import (
    COMMON_DEFAULTS,
    ENTRY_POINT_GROUP,
    OptimizerEntry,
    Rule,
    build_training_algorithm,
    default_search_space,
    get_optimizer,
    optimizer_defaults,
    optimizer_names,
    register_optimizer,
    resolve_hyperparameters,
)
from batchlab.optim import registry
from batchlab.search import Parameter, SearchSpace

BUILTIN = ["sgd", "momentum", "nesterov", "adam", "kfac", "lars", "lamb", "adamw", "soap", "muon"]


@pytest.fixture
def clean_registry(monkeypatch):
    """The registry as it is now, restored after the test (registrations and entry points undone)."""
    registry._registry()
    monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    monkeypatch.setattr(registry, "_all_entry_points_loaded", False)
    return registry


def rmsprop_entry(name="my_rmsprop"):
    """A user's optimizer, declared once: torch.optim.RMSprop with its smoothing constant ``alpha``."""
    return OptimizerEntry(
        name=name,
        summary="RMSprop (torch.optim.RMSprop)",
        defaults={"learning_rate": 1e-3, "alpha": 0.99},
        rules={"alpha": Rule(0.0, 1.0, high_open=True)},
        search_space=(Parameter("learning_rate", "DOUBLE", "LOG", 1e-5, 1e-1),
                      Parameter("alpha", "DOUBLE", "REVERSE_LOG", 0.9, 0.999)),
        build=lambda params, h: torch.optim.RMSprop(
            params, lr=h["learning_rate"], alpha=h["alpha"], weight_decay=h["weight_decay"]),
    )


@pytest.mark.parametrize("name", BUILTIN)
def test_every_entry_is_complete(name):
    entry = get_optimizer(name)
    assert entry.name == name and entry.summary and "\n" not in entry.summary
    defaults = optimizer_defaults(name)
    assert list(defaults)[: len(entry.defaults)] == list(entry.defaults)  # its own names first
    assert set(COMMON_DEFAULTS) <= set(defaults)
    for key, value in defaults.items():  # a rule for every hyperparameter, admitting its default
        rule = entry.rule(key)
        assert rule is not None, key
        assert value is None or rule.admits(float(value)), (key, value)
    space = default_search_space(name)
    assert space.names == [p.name for p in entry.search_space] and "learning_rate" in space.names
    assert set(space.names) <= set(defaults)
    for point in space.sample(3, seed=1):  # every point of the space is accepted by the optimizer
        resolve_hyperparameters(name, point)
    model = nn.Linear(3, 2)
    optimizer = entry.build(list(model.parameters()), resolve_hyperparameters(name, {}))
    assert isinstance(optimizer, torch.optim.Optimizer)
    assert [p for g in optimizer.param_groups for p in g["params"]].__len__() == 2


def test_builtin_names_in_order_and_vectorized_ones():
    assert optimizer_names()[: len(BUILTIN)] == BUILTIN
    assert registry.vectorized_optimizer_names()[:4] == ["sgd", "momentum", "nesterov", "adam"]
    assert get_optimizer("kfac").preconditioner is not None and get_optimizer("kfac").vectorized is None


@pytest.mark.parametrize(
    "call",
    [
        lambda: get_optimizer("adamx"),
        lambda: optimizer_defaults("adamx"),
        lambda: resolve_hyperparameters("adamx", {}),
        lambda: default_search_space("adamx"),
        lambda: build_training_algorithm("adamx", nn.Linear(2, 2), F.cross_entropy),
    ],
    ids=["get", "defaults", "resolve", "search_space", "build"],
)
def test_unknown_name_is_a_one_line_error_everywhere(call):
    with pytest.raises(BatchlabError, match=r"unknown optimizer 'adamx' \(did you mean 'adam'\?\); known: adam, adamw") as info:
        call()
    assert "\n" not in str(info.value)


def test_register_round_trip(clean_registry):
    entry = rmsprop_entry()
    assert register_optimizer(entry) is entry
    assert register_optimizer(entry) is entry  # the same object again: a no-op
    assert get_optimizer("my_rmsprop") is entry and "my_rmsprop" in optimizer_names()
    assert optimizer_defaults("my_rmsprop")["alpha"] == 0.99
    assert default_search_space("my_rmsprop", train_steps=10, schedule="linear").names == [
        "learning_rate", "alpha", "learning_rate_decay_steps", "end_learning_rate_factor"]
    with pytest.raises(BatchlabError, match=r"alpha must be a number in \[0, 1\)"):
        resolve_hyperparameters("my_rmsprop", {"alpha": 1.0})
    algo = build_training_algorithm("my_rmsprop", nn.Linear(2, 2), F.cross_entropy, {"learning_rate": 0.01})
    assert isinstance(algo.optimizer, torch.optim.RMSprop) and algo.optimizer.defaults["alpha"] == 0.99
    with pytest.raises(BatchlabError, match="already registered; pass replace=True"):
        register_optimizer(rmsprop_entry())
    replacement = register_optimizer(rmsprop_entry(), replace=True)
    assert get_optimizer("my_rmsprop") is replacement
    with pytest.raises(BatchlabError, match="'adam' is built in and cannot be replaced"):
        register_optimizer(rmsprop_entry("adam"), replace=True)
    with pytest.raises(BatchlabError, match="needs a batchlab.optim.OptimizerEntry"):
        register_optimizer({"name": "x"})


def test_a_registered_optimizer_trains_through_run_trial(clean_registry):
    from batchlab.train import TrialSpec, run_trial

    register_optimizer(rmsprop_entry())
    result = run_trial(TrialSpec(workload="mnist/fc_64_64_64", optimizer="my_rmsprop", batch_size=64,
                                 hyperparameters={"learning_rate": 1e-3}, steps=20, train_examples=2000,
                                 evaluation_steps=[0]))
    assert result.status == "COMPLETE" and result.steps == 20
    assert result.workload == "mnist/fc_64_64_64/my_rmsprop"
    first, last = result.measurements[0], result.measurements[-1]
    assert last["step"] == 20 and last["train/cross_entropy_error"] < first["train/cross_entropy_error"]


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"name": "my/opt"}, "no '/' or spaces"),
        ({"summary": "two\nlines"}, "summary must be one non-empty line"),
        ({"defaults": {"alpha": 0.9}}, "defaults must be a mapping that includes learning_rate"),
        ({"defaults": {"learning_rate": 1e-3, "alpha": 0.9, "gamma": 0.5}}, "hyperparameter 'gamma' has no rule"),
        ({"defaults": {"learning_rate": -1.0, "alpha": 0.9}}, "default learning_rate=-1.0 is not a number > 0"),
        ({"search_space": (Parameter("momentum", "DOUBLE", "LOG", 0.1, 0.9),)}, "'momentum' is not a hyperparameter it accepts"),
        ({"search_space": (Parameter("alpha", "DOUBLE", "LINEAR", 0.5, 0.9),)}, "must name learning_rate"),
        ({"search_space": (Parameter("learning_rate", "DOUBLE", "LINEAR", 0.0, 0.9),)}, "goes outside a number > 0"),
        ({"search_space": (Parameter("learning_rate", "DOUBLE", "LOG", 1e-3, 1.0),
                           Parameter("learning_rate_decay_steps", "INTEGER", "LINEAR", 10, 20))},
         "'learning_rate_decay_steps' is added by the linear schedule"),
        ({"defaults": {"learning_rate": 1e-3, "alpha": 0.9, "period": 2}, "rules": {"alpha": Rule(0.0, 1.0), "period": Rule(1, 10, integer=True)},
          "search_space": (Parameter("learning_rate", "DOUBLE", "LOG", 1e-3, 1.0),
                           Parameter("period", "DOUBLE", "LINEAR", 1, 10))},
         "search space of period must be INTEGER or DISCRETE"),
        ({"build": None}, "build must be a function"),
        ({"vectorized": "yes"}, "vectorized must be a VectorizedUpdate"),
    ],
)
def test_a_bad_declaration_is_a_one_line_error_when_declared(change, fragment):
    base = rmsprop_entry()
    fields = {f: getattr(base, f) for f in ("name", "summary", "defaults", "rules", "search_space", "build")}
    fields.update(change)
    with pytest.raises(BatchlabError, match=fragment) as info:
        OptimizerEntry(**fields)
    assert "\n" not in str(info.value)


class FakeEntryPoint:
    """Stands in for an installed package's ``importlib.metadata.EntryPoint``."""

    def __init__(self, name, target, value="my_package.optimizers:entry"):
        self.name, self.value, self._target = name, value, target
        self.loads = 0

    def load(self):
        self.loads += 1
        if isinstance(self._target, Exception):
            raise self._target
        return self._target


def install(monkeypatch, *entry_points):
    def entry_points_of(group=None, **_):
        assert group == ENTRY_POINT_GROUP
        return list(entry_points)

    monkeypatch.setattr(metadata, "entry_points", entry_points_of)


def test_entry_points_are_loaded_lazily_by_name(clean_registry, monkeypatch):
    good = FakeEntryPoint("plugin_rmsprop", lambda: rmsprop_entry("plugin_rmsprop"))
    broken = FakeEntryPoint("plugin_broken", ImportError("no module named 'missing'"))
    install(monkeypatch, good, broken)
    assert "plugin_rmsprop" not in registry._entries  # nothing loaded before it is asked for
    assert get_optimizer("plugin_rmsprop").name == "plugin_rmsprop"
    assert optimizer_defaults("plugin_rmsprop")["alpha"] == 0.99
    assert good.loads == 1 and broken.loads == 0  # the other entry point was not touched
    with pytest.raises(BatchlabError, match=r"entry point 'plugin_broken' \(my_package.optimizers:entry\): cannot be loaded: "
                                            r"ImportError: no module named 'missing'") as info:
        get_optimizer("plugin_broken")
    assert "\n" not in str(info.value)


def test_all_entry_points_are_listed(clean_registry, monkeypatch):
    install(monkeypatch, FakeEntryPoint("plugin_rmsprop", lambda: rmsprop_entry("plugin_rmsprop")))
    assert optimizer_names()[-1] == "plugin_rmsprop"
    assert default_search_space("plugin_rmsprop").names == ["learning_rate", "alpha"]


@pytest.mark.parametrize(
    ("target", "fragment"),
    [
        (lambda: "not an entry", "returned str, not a batchlab.optim.OptimizerEntry"),
        (lambda: rmsprop_entry("other_name"), "returned an entry named 'other_name'; the names must agree"),
        ("a string", "is not a function returning an OptimizerEntry"),
        (lambda: rmsprop_entry("bad/name"), r"\(my_package.optimizers:entry\): failed: BatchlabError: optimizer name must be"),
    ],
)
def test_bad_entry_points_name_themselves(clean_registry, monkeypatch, target, fragment):
    install(monkeypatch, FakeEntryPoint("plugin_bad", target))
    with pytest.raises(BatchlabError, match=fragment):
        get_optimizer("plugin_bad")


def test_entry_point_from_a_temporary_distribution(clean_registry, tmp_path, monkeypatch):
    """The real importlib.metadata path: a dist-info on sys.path declaring the entry point."""
    package = tmp_path / "tmp_batchlab_plugin.py"
    package.write_text(
        "import torch\n"
        "from batchlab.optim import OptimizerEntry\n"
        "from batchlab.search import Parameter\n"
        "def entry():\n"
        "    return OptimizerEntry(name='tmp_adagrad', summary='Adagrad (torch.optim.Adagrad)',\n"
        "        defaults={'learning_rate': 0.01},\n"
        "        search_space=(Parameter('learning_rate', 'DOUBLE', 'LOG', 1e-4, 1.0),),\n"
        "        build=lambda params, h: torch.optim.Adagrad(params, lr=h['learning_rate']))\n"
    )
    dist = tmp_path / "tmp_batchlab_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tmp-batchlab-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\ntmp_adagrad = tmp_batchlab_plugin:entry\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    algo = build_training_algorithm("tmp_adagrad", nn.Linear(2, 2), F.cross_entropy)
    assert isinstance(algo.optimizer, torch.optim.Adagrad)
    assert math.isclose(algo.learning_rate, 0.01)


def test_search_spaces_are_the_entries_own(clean_registry):
    for name in BUILTIN:
        assert default_search_space(name) == SearchSpace(get_optimizer(name).search_space)


def test_a_broken_entry_point_does_not_hide_an_unknown_name(clean_registry, monkeypatch):
    install(monkeypatch, FakeEntryPoint("plugin_broken", ImportError("boom")))
    with pytest.raises(BatchlabError, match=r"unknown optimizer 'adamx' .*plugin_broken"):
        get_optimizer("adamx")


def test_a_search_space_object_is_accepted():
    base = rmsprop_entry()
    entry = OptimizerEntry(name="x", summary="x", defaults=base.defaults, rules=base.rules,
                           search_space=SearchSpace(base.search_space), build=base.build)
    assert entry.search_space == base.search_space
