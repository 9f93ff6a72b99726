"""The store's schema facts live in one module; the store package has no import cycle; one layout."""

import ast
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import batchlab.store
from batchlab.errors import BatchlabError
from batchlab.store import Store, TrialRecord, publish_trials, schema
from batchlab.store.batch_science_import import import_batch_science
from batchlab.store.maintenance import compact
from batchlab.store.table_import import import_table

STORE_PACKAGE = Path(batchlab.store.__file__).parent


def _imports(path: Path) -> set[str]:
    """The batchlab.store modules ``path`` imports anywhere (top level, functions, TYPE_CHECKING)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("batchlab.store."):
            found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[2] for a in node.names if a.name.startswith("batchlab.store."))
    return found


def test_the_store_package_has_no_import_cycle():
    graph = {p.stem: _imports(p) - {p.stem} for p in STORE_PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert "store" not in graph["writer"] and "writer" in graph["store"]
    assert graph["schema"] == set()  # the schema depends on nothing in the store

    def visit(module, path):
        assert module not in path, f"import cycle: {' -> '.join(path + [module])}"
        for dep in graph.get(module, ()):
            visit(dep, path + [module])

    for module in graph:
        visit(module, [])


def _defined(path: Path) -> set[str]:
    """The names a module defines at its top level (assignments, functions, classes)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names - {"__all__"}


def test_names_are_defined_once_in_the_schema():
    own = {n for n in _defined(STORE_PACKAGE / "schema.py") if not n.startswith("_")}  # its public names
    assert {"MARKER", "FORMAT_VERSION", "LOCK_FILE", "LOG_DIR", "DATA_DIR", "PENDING_DIR", "STATUSES", "TABLES",
            "split_workload", "validate_status", "store_workload_name", "MEASUREMENT_ORDER"} <= own
    for path in STORE_PACKAGE.glob("*.py"):
        if path.stem != "schema":
            assert not own & _defined(path), f"{path.name} defines the schema's {sorted(own & _defined(path))}"
    assert schema.store_workload_name("mnist/fc_64_64_64", "adam") == "mnist/fc_64_64_64/adam"
    assert schema.split_workload(schema.store_workload_name("mnist_subsets/mnist_6875/cnn", "sgd")) == (
        "mnist_subsets/mnist_6875", "cnn", "sgd")
    assert set(schema.DEFAULT_ANALYSIS_STATUSES) <= set(schema.STATUSES)
    for name in schema.TABLES:
        assert set(schema.VIEW_COLUMNS[name]) <= set(schema.SCHEMAS[name].names)
    with pytest.raises(BatchlabError, match="unknown trial status 'DONE'"):
        schema.validate_status("DONE")


def _layout(path: Path) -> tuple:
    """What a Parquet file's layout is: per column (compression, encodings), and the row-group size
    of every group but the last."""
    meta = pq.ParquetFile(path).metadata
    group = meta.row_group(0)
    columns = tuple((group.column(i).path_in_schema, group.column(i).compression,
                     tuple(sorted(group.column(i).encodings))) for i in range(group.num_columns))
    return columns, meta.schema.to_arrow_schema()


def _sorted_by_layout(table) -> bool:
    rows = table.select(list(schema.MEASUREMENT_ORDER)).to_pylist()
    keys = [tuple(r[c] for c in schema.MEASUREMENT_ORDER) for r in rows]
    return keys == sorted(keys)


def test_every_writer_writes_measurements_in_one_layout(tmp_path, release):
    store = Store.open(tmp_path / "s", create=True)
    metric_rows = [(s, m, 1.0 / (1 + s)) for s in (30, 0, 10, 20) for m in ("val/b", "train/a")]
    publish_trials(store, [TrialRecord(workload="mnist/fc/sgd", batch_size=b, trial_id=1, trial_key=f"t{b}",
                                       parameters={}, status="COMPLETE", steps=30, measurements=metric_rows)
                            for b in (8, 4)])
    (tmp_path / "t.csv").write_text("workload,batch_size,trial_id,step,val/b,train/a\n"
                                    "mnist/fc/adam,4,1,10,0.5,0.2\nmnist/fc/adam,4,1,0,0.9,0.8\n")
    import_table(store, tmp_path / "t.csv")
    import_batch_science(store, release[0])
    files = [store.root / f for f in store.state().files["measurements"]]
    assert len(files) >= 3
    layouts = {_layout(f) for f in files}
    assert len(layouts) == 1, layouts
    for f in files:
        assert _sorted_by_layout(pq.read_table(f))
    (columns, _), = layouts
    by_name = {name: (compression, encodings) for name, compression, encodings in columns}
    assert by_name["step"][0] == "SNAPPY" and "DELTA_BINARY_PACKED" in by_name["step"][1]
    assert all("RLE_DICTIONARY" in by_name[c][1] for c in schema.parquet_options("measurements")["use_dictionary"])
    compact(store, grace_seconds=0)
    (merged,) = store.state().files["measurements"]
    assert _layout(store.root / merged) in layouts
    assert _sorted_by_layout(pq.read_table(store.root / merged))


@pytest.mark.parametrize("name", [
    "../../escaped/sgd", "mnist/../x/sgd", "./mnist/fc/sgd", "/abs/fc/sgd", "mnist//fc/sgd", "mnist/fc/sgd/",
    "mnist\\x/fc/sgd", "mn ist/fc/sgd", "mn\x07ist/fc/sgd", "mn\x00ist/fc/sgd", "mnist/fc/sgd\n", "-mnist/fc/sgd",
    ".hidden/fc/sgd", "fc/sgd", "x" * 101 + "/fc/sgd",
])
def test_a_workload_name_that_is_no_relative_directory_path_is_refused_naming_the_form(name):
    # "../../escaped/sgd" used to enter the store (only export refused it); every store name passes
    # split_workload, the one check used by trials, study definitions and both imports
    with pytest.raises(BatchlabError) as info:
        schema.split_workload(name)
    message = str(info.value)
    assert "dataset/model/optimizer: three or more parts separated by '/'" in message
    assert message.isprintable() and repr(name) in message
    with pytest.raises(BatchlabError):
        schema.validate_workload_name(name)


@pytest.mark.parametrize("name", ["mnist/fc_64_64_64/sgd", "imagenet_subsets/imagenet_10/resnet-50/nesterov_momentum",
                                  "données/mlp.v2/adam+wd", "x" * 100 + "/fc/sgd"])
def test_store_workload_names_are_accepted(name):
    assert schema.validate_workload_name(name) == name
    assert "/".join(schema.split_workload(name)) == name


def test_trials_and_study_definitions_refuse_such_a_workload_name(tmp_path):
    # a user Workload named "../.." trained with --store used to publish the workload "../../sgd"
    from batchlab.store import Store, TrialRecord, publish_trials
    from batchlab.store.studies import make_study_definition

    store = Store.open(tmp_path / "store", create=True)
    with pytest.raises(BatchlabError, match=r"workload '\.\./\.\./sgd' is not of the form dataset/model/optimizer"):
        publish_trials(store, [TrialRecord(workload="../../sgd", batch_size=8, trial_id=1, trial_key="k",
                                           parameters={}, status="COMPLETE", steps=1)])
    assert store.state().seq == 0
    with pytest.raises(BatchlabError, match="is not of the form dataset/model/optimizer"):
        make_study_definition(workload="my\\data/mlp/sgd", batch_size=8, train_steps=10)
