"""One meaning of ``--workload`` in every command that reads a store (``store info``, ``analyze``,
``plot``): the store's ``dataset/model/optimizer``, or ``dataset/model`` with ``--optimizer`` (every
optimizer of it the store holds without); a workload the store does not hold is one line naming
those it holds, exit 2, nothing printed on stdout."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from analysis_fixtures import publish_store, trial  # noqa: E402

from cli_runner import run  # noqa: E402

E = "val/classification_error"
SGD, MOMENTUM = "mnist/fc_64_64_64/sgd", "mnist/fc_64_64_64/momentum"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from batchlab.store.studies import make_study_definition

    definitions = {w: make_study_definition(workload=w, batch_size=16, train_steps=100) for w in (SGD, MOMENTUM)}
    trials = [trial(w, 16, 1, [(10, {E: 0.5}), (50, {E: 0.01})], study=w, learning_rate=0.1) for w in (SGD, MOMENTUM)]
    path = tmp_path_factory.mktemp("workloads") / "store"
    publish_store(path, trials, definitions)
    return path


def _info_workloads(capsys, store, *args):
    code, out, err = run(capsys, "store", "info", "--store", store, *args, "--json")
    assert code == 0, err
    return sorted({s["workload"] for s in json.loads(out)["study_definitions"]})


def test_store_info_workload_takes_every_spelling(capsys, store):
    assert _info_workloads(capsys, store) == [MOMENTUM, SGD]
    assert _info_workloads(capsys, store, "--workload", SGD) == [SGD]
    assert _info_workloads(capsys, store, "--workload", "mnist/fc_64_64_64", "--optimizer", "momentum") == [MOMENTUM]
    assert _info_workloads(capsys, store, "--workload", "mnist/fc_64_64_64") == [MOMENTUM, SGD]


@pytest.mark.parametrize("args, named", [
    (["--workload", "foo/bar/baz"], "'foo/bar/baz'"),
    (["--workload", "mnist/fc_64_64_64/sgdd"], "did you mean 'mnist/fc_64_64_64/sgd'?"),
    (["--workload", "mnist/fc_64_64_64", "--optimizer", "adam"], "'mnist/fc_64_64_64/adam'"),
    (["--workload", SGD, "--optimizer", "momentum"], "--optimizer says momentum"),
])
@pytest.mark.parametrize("command", [["store", "info"], ["analyze", "steps-to-result"],
                                     ["analyze", "critical-batch-size"]])
def test_an_unknown_workload_is_one_line_naming_the_stores(capsys, store, command, args, named):
    """Before: ``store info --workload foo/bar/baz`` exited 0 with "study definitions (0)"."""
    code, out, err = run(capsys, *command, "--store", store, *args)
    assert (code, out) == (2, "") and err.count("\n") == 1 and err.startswith("error: ") and named in err
    if "--optimizer says" not in named:
        assert f"known: {MOMENTUM}, {SGD}" in err


def test_plot_takes_the_same_workload(capsys, store, tmp_path):
    code, out, err = run(capsys, "plot", "steps-to-result", "--store", store, "--workload", "foo/bar/baz",
                         "--metric", E, "--goal", "0.02", "--out", tmp_path / "f.png")
    assert (code, out) == (2, "") and f"known: {MOMENTUM}, {SGD}" in err and list(tmp_path.iterdir()) == []
    code, out, err = run(capsys, "plot", "steps-to-result", "--store", store, "--workload", "mnist/fc_64_64_64",
                         "--metric", E, "--goal", "0.02", "--out", tmp_path / "f.png")
    assert code == 0, err
