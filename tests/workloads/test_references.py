import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from batchlab.errors import BatchlabError
from batchlab.workloads import (
    Workload,
    get_workload,
    register_workload,
    registry,
    resolve_workload,
    worker_resolvable,
    workload_key,
    workload_names,
)
from batchlab.workloads import references

WORKLOAD_FILE = """
import torch
from batchlab.workloads import Workload, regression

def make_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, generator=g)
    return {{"train": (x[:30], x[:30].sum(1)), "val": (x[30:], x[30:].sum(1))}}

def workload():
    return Workload(name="{name}", make_model=lambda: torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Flatten(0)),
                    data=make_data, task=regression(), goal=0.5, default_steps=20, default_batch_size=8)

def not_a_workload():
    return 42

def broken():
    raise RuntimeError("no GPU\\nhere")
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def user_file(tmp_path):
    return write(tmp_path / "workload.py", WORKLOAD_FILE.format(name="toy/mlp"))


def test_a_file_reference_resolves_once_per_process_with_an_absolute_reference(user_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    w = resolve_workload("workload.py:workload")
    assert isinstance(w, Workload) and w.name == "toy/mlp"
    assert w.reference == f"{user_file.resolve()}:workload"
    assert resolve_workload(f"{user_file}:workload") is w  # relative and absolute: one object
    assert get_workload("./workload.py:workload") is w  # every command taking a WORKLOAD
    assert workload_key(w) == workload_key("workload.py:workload") == w.reference
    assert worker_resolvable(workload_key(w))
    assert "toy/mlp" not in workload_names()  # resolving does not register the name


def test_two_files_with_the_same_name_do_not_clash(tmp_path):
    a = write(tmp_path / "a" / "workload.py", WORKLOAD_FILE.format(name="toy/a"))
    b = write(tmp_path / "b" / "workload.py", WORKLOAD_FILE.format(name="toy/b"))
    assert resolve_workload(f"{a}:workload").name == "toy/a"
    assert resolve_workload(f"{b}:workload").name == "toy/b"


def test_a_module_reference(tmp_path, monkeypatch):
    write(tmp_path / "userpkg_w1" / "__init__.py", "")
    write(tmp_path / "userpkg_w1" / "work.py", WORKLOAD_FILE.format(name="toy/module"))
    monkeypatch.syspath_prepend(str(tmp_path))
    w = resolve_workload("userpkg_w1.work:workload")
    assert w.name == "toy/module" and w.reference == "userpkg_w1.work:workload"
    data = w.load_data()
    assert data.num_train == 30 and w.evaluate(w.build_model(0), data.val).keys() == {"val/mse", "val/mae"}


def test_a_workload_object_at_the_reference_is_taken_as_is(tmp_path):
    path = write(tmp_path / "obj.py", WORKLOAD_FILE.format(name="toy/obj") + "\nWORKLOAD = workload()\n")
    w = resolve_workload(f"{path}:WORKLOAD")
    assert w.name == "toy/obj" and w.reference == f"{path}:WORKLOAD"


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("{dir}/missing.py:workload", "workload reference '{dir}/missing.py:workload': file not found: {dir}/missing.py$"),
        ("{file}:nothing", "workload reference '{file}:nothing': no function 'nothing' in {file}; found: broken, make_data, not_a_workload, workload$"),
        ("{file}:not_a_workload", "workload reference '{file}:not_a_workload': not_a_workload\\(\\) returned int, not a batchlab Workload$"),
        ("{file}:broken", "workload reference '{file}:broken': RuntimeError in broken\\(\\): no GPU here$"),
        ("no_such_module_w9:workload", "workload reference 'no_such_module_w9:workload': module 'no_such_module_w9' not found"),
        ("{dir}/importerror.py:workload", "workload reference '{dir}/importerror.py:workload': ModuleNotFoundError while importing {dir}/importerror.py: No module named 'not_installed_w9'$"),
        ("{dir}/syntax.py:workload", "workload reference '{dir}/syntax.py:workload': SyntaxError while importing {dir}/syntax.py: "),
        ("{dir}/badname.py:workload", "workload reference '{dir}/badname.py:workload': workload name must be 'dataset/model'"),
        ("{file}:", "bad workload reference"),
    ],
)
def test_bad_references_are_one_line_errors(user_file, reference, message):
    directory = user_file.parent
    write(directory / "importerror.py", "import not_installed_w9\n")
    write(directory / "syntax.py", "def workload(:\n")
    write(directory / "badname.py", WORKLOAD_FILE.format(name="no_slash"))
    reference = reference.format(dir=directory, file=user_file)
    with pytest.raises(BatchlabError) as info:
        resolve_workload(reference)
    text = str(info.value)
    assert "\n" not in text
    import re

    assert re.match(message.format(dir=re.escape(str(directory)), file=re.escape(str(user_file))), text), text


def test_a_failed_import_is_retried_after_the_file_is_fixed(tmp_path):
    path = write(tmp_path / "later.py", "raise ValueError('not yet')\n")
    with pytest.raises(BatchlabError, match="ValueError while importing"):
        resolve_workload(f"{path}:workload")
    write(path, WORKLOAD_FILE.format(name="toy/later"))
    assert resolve_workload(f"{path}:workload").name == "toy/later"


def test_a_referenced_workload_pickles_as_its_reference(user_file):
    w = resolve_workload(f"{user_file}:workload")
    blob = pickle.dumps(w)
    assert pickle.loads(blob) is w
    assert str(user_file).encode() in blob and b"make_data" not in blob  # the reference, not the code
    # a fresh process (as a spawned pool or Dask worker) re-imports the file
    code = "import pickle, sys; w = pickle.loads(sys.stdin.buffer.read()); print(w.name, w.reference, w.load_data().num_train)"
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, check=True).stdout.decode().split()
    assert out == ["toy/mlp", w.reference, "30"]


def test_a_builtin_pickles_as_its_name_and_other_workloads_by_value(user_file):
    builtin = get_workload("mnist/fc_64_64_64")
    assert pickle.loads(pickle.dumps(builtin)) is builtin
    import dataclasses

    changed = dataclasses.replace(resolve_workload(f"{user_file}:workload"), goal=0.25)  # not what the reference gives
    copy = pickle.loads(pickle.dumps(dataclasses.replace(changed, make_model=torch.nn.Identity)))
    assert copy.goal == 0.25 and copy.name == "toy/mlp"


def test_register_workload_makes_a_name_known_in_this_process_only(user_file, monkeypatch):
    monkeypatch.setattr(registry, "WORKLOADS", dict(registry.WORKLOADS))
    w = register_workload(f"{user_file}:workload")
    assert get_workload("toy/mlp") is w and "toy/mlp" in workload_names()
    assert workload_key("toy/mlp") == w.reference and worker_resolvable(w.reference)
    local = Workload(name="toy/local", make_model=torch.nn.Identity, data=w.data, goal=1.0)
    assert register_workload(local) is local and workload_key(local) == "toy/local"
    assert not worker_resolvable("toy/local")
    assert worker_resolvable("mnist/fc_64_64_64")
    with pytest.raises(BatchlabError, match="cannot register 'mnist/fc_64_64_64': a built-in workload has that name"):
        register_workload(Workload(name="mnist/fc_64_64_64", make_model=torch.nn.Identity, data=w.data, goal=1.0))


def test_unknown_names_still_suggest_the_closest():
    with pytest.raises(BatchlabError, match=r"unknown workload 'mnist/fc_64_64' \(did you mean 'mnist/fc_64_64_64'\?\)"):
        resolve_workload("mnist/fc_64_64")
    with pytest.raises(BatchlabError, match="a workload must be a Workload, a name"):
        resolve_workload(3)


@pytest.fixture
def installed_plugin(tmp_path, monkeypatch):
    """A package with a batchlab.workloads entry point, installed as a dist-info on sys.path."""
    write(tmp_path / "plugin_w9" / "__init__.py", WORKLOAD_FILE.format(name="plugin/mlp"))
    write(tmp_path / "plugin_w9-1.0.dist-info" / "METADATA", "Metadata-Version: 2.1\nName: plugin-w9\nVersion: 1.0\n")
    write(tmp_path / "plugin_w9-1.0.dist-info" / "entry_points.txt",
          "[batchlab.workloads]\nplugin/mlp = plugin_w9:workload\nplugin/wrong = plugin_w9:workload\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_entry_points_are_workload_names(installed_plugin):
    assert {"plugin/mlp", "plugin/wrong"} <= set(workload_names())
    w = get_workload("plugin/mlp")
    assert w.name == "plugin/mlp" and w.reference == "plugin_w9:workload"
    assert worker_resolvable("plugin/mlp") and workload_key("plugin/mlp") == "plugin_w9:workload"
    with pytest.raises(BatchlabError, match="entry point 'plugin/wrong' \\(plugin_w9:workload\\) returned the workload 'plugin/mlp'"):
        get_workload("plugin/wrong")


def test_the_module_names_of_user_files_are_private(user_file):
    resolve_workload(f"{user_file}:workload")
    imported = [name for name in sys.modules if name.startswith("batchlab_user_workload_workload_")]
    module = references.WORKLOAD_REFERENCE.import_target("check", str(user_file.resolve()))  # not imported again
    assert module.__name__ in imported and sys.modules[module.__name__] is module
    assert module.__file__ == str(user_file.resolve())


def test_a_modified_builtin_in_the_registry_pickles_by_value(monkeypatch):
    import dataclasses

    original = get_workload("mnist/fc_64_64_64")
    easier = dataclasses.replace(original, goal=0.5)
    monkeypatch.setitem(registry.WORKLOADS, original.name, easier)
    assert pickle.loads(pickle.dumps(easier)).goal == 0.5
    assert pickle.loads(pickle.dumps(original)) is original


def test_a_modified_copy_of_a_referenced_workload_is_keyed_by_its_name(user_file, monkeypatch):
    import dataclasses

    monkeypatch.setattr(registry, "WORKLOADS", dict(registry.WORKLOADS))
    w = resolve_workload(f"{user_file}:workload")
    easier = dataclasses.replace(w, goal=5.0)  # keeps w.reference, but the reference gives w
    assert easier.reference == w.reference and workload_key(w) == w.reference
    assert workload_key(easier) == "toy/mlp"  # workers must not be sent the unmodified workload
    register_workload(easier)
    assert not worker_resolvable(workload_key("toy/mlp"))


def test_the_shared_reference_rules_name_their_kind(user_file):
    from batchlab.references import ReferenceKind

    adapters = ReferenceKind("adapter", "attribute", "batchlab_user_adapter")
    with pytest.raises(BatchlabError, match=r"^bad adapter reference 'x': expected package.module:attribute or "
                                            r"path/to/file.py:attribute$"):
        adapters.split("x")
    with pytest.raises(BatchlabError, match=r"^adapter reference 'r': no attribute 'nothing' in .*; found: broken, "
                                            r"make_data, not_a_workload, workload$"):
        adapters.attribute_of("r", f"{user_file}:nothing")
    # the same file under two kinds: two private modules, so neither kind's names shadow the other's
    as_adapter, _ = adapters.attribute_of("r", f"{user_file}:workload")
    as_workload = references.WORKLOAD_REFERENCE.import_target("r", str(user_file))
    assert as_adapter is not as_workload and as_adapter.__name__.startswith("batchlab_user_adapter_workload_")
