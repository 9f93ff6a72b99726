import json
import shutil

import pytest

from batchlab.errors import BatchlabError
from batchlab.store import Store
from batchlab.store.batch_science_import import find_studies, import_batch_science, trial_key
from batchlab.store.studies import study_id

from release_trees import make_release


def data_files(store):
    return sorted(p.name for p in (store.root / "data").rglob("*") if p.is_file())


def test_import_reads_every_group_and_field(release, store):
    root, studies = release
    report = import_batch_science(store, root)
    assert (report.studies, report.trials_added, report.skipped) == (6, 24, [])
    assert report.measurements_added == 24 * 5 * 2
    con = store.connect()
    workloads = {r[0]: r[1:] for r in con.execute("SELECT * FROM workloads").fetchall()}
    sub = "mnist_subsets/mnist_6875/simple_cnn_base/nesterov_momentum"
    assert workloads[sub][:3] == ("mnist_subsets/mnist_6875", "simple_cnn_base", "nesterov_momentum")
    assert json.loads(workloads[sub][3])["group"] == "mnist_subsets"
    study = con.execute("SELECT search_space, train_steps, early_stopping, study_id, definition "
                        "FROM studies WHERE workload = ? AND batch_size = 8", [sub]).fetchone()
    assert study[1:3] == (1000, False) and json.loads(study[0])["learning_rate"]["scale"] == "LOG_SCALE"
    definition = json.loads(study[4])
    assert definition["source"] == "batch_science" and definition["train_steps"] == 1000
    assert definition["search_space"] == json.loads(study[0]) and definition["early_stopping"] is False
    assert definition["evaluation"] == {"rule": "release"} and definition["stop_rule"] is None
    assert study[3] == study_id(definition)
    t = con.execute("SELECT trial_key, parameters, status, steps, seed, source, study_id FROM trials "
                    "WHERE workload = ? AND batch_size = 64 AND trial_id = 2", [sub]).fetchone()
    assert t[0] == trial_key(sub, 64, 2) and t[2:6] == ("INCOMPLETE", 1000, None, "batch_science")
    assert json.loads(t[1]) == {"learning_rate": 0.02, "momentum": 0.9}
    (s64,) = store.study_definitions(sub)[1:2] or [None]
    assert s64["batch_size"] == 64 and s64["study_id"] == t[6] and s64["n_trials"] == 4
    steps = con.execute("SELECT step, value FROM measurements WHERE workload = ? AND batch_size = 64 "
                        "AND trial_id = 2 AND metric = 'val/classification_error' ORDER BY step",
                        [sub]).fetchall()
    assert steps == [(0, 0.9 + 0.002), (3, 0.45 + 0.002), (10, 0.3 + 0.002),
                     (25, 0.225 + 0.002), (60, 0.18 + 0.002)]


def test_workload_name_when_the_root_is_inside_the_release(release, store):
    root, _ = release
    report = import_batch_science(store, root / "mnist" / "simple_cnn_base" / "sgd")
    assert report.studies == 2
    assert store.table("workloads")["workload"].to_pylist() == ["mnist/simple_cnn_base/sgd"]


def test_reimport_adds_nothing(release, store):
    root, _ = release
    import_batch_science(store, root)
    before = store.table("measurements").num_rows
    report = import_batch_science(store, root)
    assert (report.trials_added, report.trials_already_present) == (0, 24)
    assert store.table("measurements").num_rows == before
    assert store.table("trials").num_rows == 24
    assert store.state().seq == 1  # nothing new: no commit at all


def _csv(study, trial):
    return study / str(trial) / "measurements.csv"


def _replace_csv_line(path, index, text, encoding="utf-8"):
    lines = path.read_text().splitlines()
    lines[index] = text
    path.write_bytes(("\n".join(lines) + "\n").encode(encoding))


MALFORMED = {
    "bad JSON in study.json": (lambda s: (s / "study.json").write_text("{not json"),
                               "study.json", "bad JSON"),
    "bad JSON in metadata.json": (lambda s: (s / "2" / "metadata.json").write_text("[1, "),
                                  "2/metadata.json", "bad JSON"),
    "missing study.json": (lambda s: (s / "study.json").unlink(), "study.json", "missing file"),
    "missing metadata.json": (lambda s: (s / "3" / "metadata.json").unlink(),
                              "3/metadata.json", "missing file"),
    "missing measurements.csv": (lambda s: _csv(s, 1).unlink(), "1/measurements.csv",
                                 "missing file"),
    "non-numeric value": (lambda s: _replace_csv_line(_csv(s, 2), 2, "3,0.5,abc"),
                          "2/measurements.csv", "non-numeric"),
    "non-numeric step": (lambda s: _replace_csv_line(_csv(s, 2), 2, "x3,0.5,0.1"),
                         "2/measurements.csv", "non-numeric"),
    "unknown status": (lambda s: (s / "4" / "metadata.json").write_text(json.dumps(
        {"parameters": {}, "status": "DONE", "steps": 1, "trial_id": 4})),
        "4/metadata.json", "unknown status 'DONE'"),
    "duplicate steps": (lambda s: _replace_csv_line(_csv(s, 3), 3, "3,0.5,0.1"),
                        "3/measurements.csv", "duplicate step 3"),
    "non-integer batch size directory": (lambda s: s.rename(s.with_name("big")), "big",
                                         "batch size directory name is not an integer"),
    "batch size mismatch": (lambda s: (s / "study.json").write_text(json.dumps(
        dict(json.loads((s / "study.json").read_text()), batch_size=9))),
        "study.json", "does not match"),
    # other encodings, truncated files, values beyond the store's int64, workload directories that
    # name no store workload (these imported with exit 0, or gave an OverflowError traceback)
    "study.json in Latin-1": (lambda s: _edit_json(s / "study.json", "latin-1", dataset="m\xe9nist"),
                              "study.json", "is not UTF-8 text (byte 0xe9"),
    "study.json in UTF-16": (lambda s: _edit_json(s / "study.json", "utf-16"), "study.json", "is UTF-16 text"),
    "metadata.json in UTF-32": (lambda s: _edit_json(s / "2" / "metadata.json", "utf-32"),
                                "2/metadata.json", "is UTF-32 text"),
    "truncated metadata.json": (lambda s: _truncate(s / "2" / "metadata.json"), "2/metadata.json", "bad JSON"),
    "measurements.csv in UTF-16": (lambda s: _csv(s, 2).write_bytes(_csv(s, 2).read_text().encode("utf-16")),
                                   "2/measurements.csv", "is UTF-16 text"),
    "Latin-1 cell in measurements.csv": (lambda s: _replace_csv_line(_csv(s, 2), 2, "3,0.5\xb0,0.1", "latin-1"),
                                         "2/measurements.csv", "is not UTF-8 text (byte 0xb0 on line 3"),
    "NUL in measurements.csv": (lambda s: _replace_csv_line(_csv(s, 2), 2, "3,0.5\x00,0.1"),
                                "2/measurements.csv", "holds NUL bytes"),
    "empty measurements.csv": (lambda s: _csv(s, 2).write_bytes(b""), "2/measurements.csv", "empty file"),
    "truncated measurements.csv": (lambda s: _truncate(_csv(s, 2), b"\n3,"), "2/measurements.csv",
                                   "Expected 3 columns, got 2"),
    "train_steps beyond int64": (lambda s: _edit_json(s / "study.json", train_steps=2**64),
                                 "study.json", "field 'train_steps' must be <= 9223372036854775807"),
    "steps beyond int64": (lambda s: _edit_json(s / "2" / "metadata.json", steps=2**63),
                           "2/metadata.json", "field 'steps' must be <= 9223372036854775807"),
    "trial directory beyond int64": (lambda s: (s / "2").rename(s / str(2**63)), str(2**63),
                                     "trial directory name is larger than 9223372036854775807"),
    "workload directory with a space": (lambda s: s.parent.rename(s.parent.with_name("s gd")), "s gd",
                                        "is not of the form dataset/model/optimizer"),
    "workload directory with a backslash": (lambda s: s.parent.rename(s.parent.with_name("s\\gd")), "s\\gd",
                                            "is not of the form dataset/model/optimizer"),
    "workload directory with a control character": (lambda s: s.parent.rename(s.parent.with_name("s\x1bgd")),
                                                    "s\\x1bgd", "is not of the form dataset/model/optimizer"),
}


def _edit_json(path, encoding="utf-8", **fields):
    path.write_bytes(json.dumps(dict(json.loads(path.read_text()), **fields), ensure_ascii=False).encode(encoding))


def _truncate(path, after=None):
    """Cut the file in half, or just after the bytes ``after``."""
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2 if after is None else data.index(after) + len(after)])


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_file_stops_import_and_leaves_store_as_it_was(tmp_path, case):
    root = tmp_path / "rel"
    studies = make_release(root)
    store = Store.open(tmp_path / "store", create=True)
    import_batch_science(store, tmp_path / "rel" / "cifar_10")  # something already in the store
    before_rows, before_files, before_seq = store.table("measurements"), data_files(store), store.state().seq
    damage, where, problem = MALFORMED[case]
    study = studies[("mnist/simple_cnn_base/sgd", 64)]
    damage(study)
    with pytest.raises(BatchlabError) as info:
        import_batch_science(store, root)
    message = str(info.value)
    assert message.isprintable() and where in message and problem in message, message
    assert store.state().seq == before_seq
    assert data_files(store) == before_files
    assert store.table("measurements").equals(before_rows)


def test_skip_bad_imports_the_rest_and_lists_what_it_skipped(tmp_path):
    root = tmp_path / "rel"
    studies = make_release(root)
    s64 = studies[("mnist/simple_cnn_base/sgd", 64)]
    s8 = studies[("mnist/simple_cnn_base/sgd", 8)]
    _replace_csv_line(_csv(s64, 2), 2, "3,0.5,abc")
    _replace_csv_line(_csv(s64, 3), 3, "3,0.5,0.1")
    (s8 / "study.json").write_text("{")
    cifar = studies[("cifar_10/resnet_8/nesterov_momentum", 8)]
    cifar.rename(cifar.with_name("eight"))
    store = Store.open(tmp_path / "store", create=True)
    report = import_batch_science(store, root, skip_bad=True)
    skipped = sorted((p.replace(str(root) + "/", ""), q.split(" (")[0]) for p, q in report.skipped)
    assert skipped == [
        ("cifar_10/resnet_8/nesterov_momentum/eight", "batch size directory name is not an integer"),
        ("mnist/simple_cnn_base/sgd/64/2/measurements.csv", "non-numeric or malformed value"),
        ("mnist/simple_cnn_base/sgd/64/3/measurements.csv", "duplicate step 3"),
        ("mnist/simple_cnn_base/sgd/8/study.json", "bad JSON"),
    ]
    assert report.trials_added == 24 - 4 - 4 - 2
    ids = store.connect().execute(
        "SELECT DISTINCT trial_id FROM measurements WHERE workload = 'mnist/simple_cnn_base/sgd' "
        "ORDER BY 1").fetchall()
    assert ids == [(1,), (4,)]


def test_uneven_columns_and_empty_cells(tmp_path, store):
    from batchlab.store.synthetic_release import write_study

    rows_a = [{"step": 0, "val/x": 1.0}, {"step": 7, "val/x": 0.5, "train/y": float("nan")}]
    rows_b = [{"step": 2, "val/average_precision": 0.3}]
    write_study(tmp_path / "rel", "d/m/o", 4, [
        {"trial_id": 1, "status": "COMPLETE", "steps": 7, "parameters": {}, "measurements": rows_a},
        {"trial_id": 2, "status": "INFEASIBLE", "steps": 2, "parameters": {}, "measurements": rows_b},
        {"trial_id": 3, "status": "INCOMPLETE", "steps": 0, "parameters": {}, "measurements": []},
    ])
    import_batch_science(store, tmp_path / "rel")
    got = store.connect().execute(
        "SELECT trial_id, step, metric, isnan(value), value FROM measurements ORDER BY 1, 2, 3").fetchall()
    assert got[0] == (1, 0, "val/x", False, 1.0)
    assert got[1][:4] == (1, 7, "train/y", True)
    assert got[2:] == [(1, 7, "val/x", False, 0.5), (2, 2, "val/average_precision", False, 0.3)]
    assert store.table("trials").num_rows == 3


def test_parallel_import_equals_serial(tmp_path, release):
    root, _ = release
    serial = Store.open(tmp_path / "a", create=True)
    parallel = Store.open(tmp_path / "b", create=True)
    import_batch_science(serial, root)
    import_batch_science(parallel, root, jobs=2, trials_per_batch=5)
    q = "SELECT * FROM measurements ORDER BY ALL"
    assert serial.connect().execute(q).fetchall() == parallel.connect().execute(q).fetchall()


def test_find_studies_names_workloads_by_path(release):
    root, _ = release
    found = {(s.workload, s.batch_size) for s in find_studies(root)}
    assert ("mnist_subsets/mnist_6875/simple_cnn_base/nesterov_momentum", 64) in found
    assert len(found) == 6
    shutil.rmtree(root / "cifar_10")
    assert len(find_studies(root)) == 4


def test_a_study_without_trials_is_recorded(tmp_path, store):
    from batchlab.store.synthetic_release import write_study

    write_study(tmp_path / "rel", "d/m/o", 16, [], train_steps=0)
    report = import_batch_science(store, tmp_path / "rel")
    assert (report.studies, report.trials_added) == (1, 0)
    assert store.table("studies").to_pylist()[0]["train_steps"] == 0
    assert import_batch_science(store, tmp_path / "rel").trials_added == 0
    assert store.state().seq == 1


def sorted_by_layout(table):
    """Whether the rows of a measurements table are in schema.MEASUREMENT_ORDER."""
    import pyarrow as pa

    from batchlab.store.schema import MEASUREMENT_ORDER

    frame = table.select(list(MEASUREMENT_ORDER)).cast(
        pa.schema([(n, pa.string() if n in ("workload", "metric") else pa.int64()) for n in MEASUREMENT_ORDER])
    ).to_pandas()
    return frame.equals(frame.sort_values(list(MEASUREMENT_ORDER), kind="stable").reset_index(drop=True))


def test_measurement_files_are_sorted_with_small_row_groups(tmp_path, release, monkeypatch):
    # The layout that lets a query on (workload, metric) skip other row groups: rows sorted by
    # (workload, metric, batch_size, trial_id, step), row groups of at most 64k rows with min/max
    # statistics, key columns dictionary-encoded.
    import pyarrow.parquet as pq

    from batchlab.store import schema

    root, _ = release
    store = Store.open(tmp_path / "s", create=True)
    monkeypatch.setattr(schema, "MEASUREMENT_ROW_GROUP_ROWS", 16)  # several groups, tiny tree
    import_batch_science(store, root, jobs=2, trials_per_batch=5)
    files = [store.root / f for f in store.state().files["measurements"]]
    assert len(files) > 1
    for path in files:
        parquet = pq.ParquetFile(path)
        assert sorted_by_layout(parquet.read())
        meta = parquet.metadata
        assert meta.num_row_groups > 1
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            assert group.num_rows <= 16
            names = [group.column(j).path_in_schema for j in range(group.num_columns)]
            for name in ("workload", "metric", "batch_size", "trial_id"):
                column = group.column(names.index(name))
                assert column.statistics.has_min_max
                assert any("DICTIONARY" in e for e in column.encodings), (name, column.encodings)
            assert "DELTA_BINARY_PACKED" in group.column(names.index("step")).encodings
    # the whole store still answers as before
    plain = Store.open(tmp_path / "plain", create=True)
    import_batch_science(plain, root)
    q = "SELECT * FROM measurements ORDER BY ALL"
    assert store.connect().execute(q).fetchall() == plain.connect().execute(q).fetchall()


def test_utf8_byte_order_marks_are_allowed(tmp_path, store):
    root = tmp_path / "rel"
    studies = make_release(root, n_trials=2)
    study = studies[("mnist/simple_cnn_base/sgd", 64)]
    for path in (study / "study.json", study / "1" / "metadata.json", _csv(study, 1)):
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert import_batch_science(store, root).trials_added == 12
