"""``import_table``: long-format measurements from any trainer, atomic, one line per problem."""

import json
import math

import pandas as pd
import pytest

from batchlab.errors import BatchlabError
from batchlab.store import Store, TrialRecord, publish_trials
from batchlab.store.table_import import import_table

W = "mnist/fc_64_64_64/sgd"
HEADER = "workload,batch_size,trial_id,step,val/classification_error,train/cross_entropy_error,param:learning_rate,status"
GOOD = [
    f"{W},64,1,0,0.9,2.3,0.1,",
    f"{W},64,1,10,0.5,,0.1,",
    f"{W},64,1,20,nan,1.0,0.1,",
    f"{W},64,2,0,0.9,2.3,0.3,INFEASIBLE",
    f"{W},128,1,0,0.9,2.3,0.2,STOPPED_AT_GOAL",
    f"{W},128,1,5,0.02,2.1,0.2,STOPPED_AT_GOAL",
]


def write(path, rows, header=HEADER):
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_import_csv_builds_trials_studies_and_measurements(tmp_path, store):
    report = import_table(store, write(tmp_path / "runs.csv", GOOD))
    assert (report.studies, report.trials_added, report.measurements_added) == (2, 3, 11)
    con = store.connect()
    trials = con.execute("SELECT batch_size, trial_id, trial_key, parameters, status, steps, source "
                         "FROM trials ORDER BY 1, 2").fetchall()
    assert trials == [
        (64, 1, f"table:runs.csv:{W}/64/1", '{"learning_rate": 0.1}', "COMPLETE", 20, "table import:runs.csv"),
        (64, 2, f"table:runs.csv:{W}/64/2", '{"learning_rate": 0.3}', "INFEASIBLE", 0, "table import:runs.csv"),
        (128, 1, f"table:runs.csv:{W}/128/1", '{"learning_rate": 0.2}', "STOPPED_AT_GOAL", 5, "table import:runs.csv"),
    ]
    values = con.execute("SELECT step, value FROM measurements WHERE batch_size = 64 AND trial_id = 1 "
                         "AND metric = 'val/classification_error' ORDER BY step").fetchall()
    assert values[:2] == [(0, 0.9), (10, 0.5)] and values[2][0] == 20 and math.isnan(values[2][1])
    # an empty cell is "not evaluated"
    assert con.execute("SELECT count(*) FROM measurements WHERE trial_id = 1 AND batch_size = 64 AND step = 10 "
                       "AND metric = 'train/cross_entropy_error'").fetchone() == (0,)
    studies = store.study_definitions(W)
    assert [s["definition"]["source"] for s in studies] == ["table import:runs.csv"] * 2
    assert [s["n_trials"] for s in studies] == [2, 1]
    # importing again adds nothing
    again = import_table(store, tmp_path / "runs.csv")
    assert (again.trials_added, again.trials_already_present, again.measurements_added) == (0, 3, 0)
    assert len(store.study_definitions()) == 2


def test_import_parquet_with_optional_columns(tmp_path, store):
    df = pd.DataFrame({
        "workload": [W] * 3, "batch_size": [32] * 3, "trial_id": [7] * 3, "step": [0, 50, 100],
        "val/classification_error": [0.9, 0.2, 0.1], "param:learning_rate": [0.5] * 3,
        "param:optimizer_name": ["sgd"] * 3, "steps": [120] * 3, "seed": [4] * 3,
        "train_steps": [200] * 3, "train_examples": [1000] * 3,
    })
    df.to_parquet(tmp_path / "runs.parquet")
    report = import_table(store, tmp_path / "runs.parquet")
    assert (report.trials_added, report.measurements_added) == (1, 3)
    row = store.connect().execute("SELECT parameters, steps, seed FROM trials").fetchone()
    assert json.loads(row[0]) == {"learning_rate": 0.5, "optimizer_name": "sgd"} and row[1:] == (120, 4)
    (s,) = store.study_definitions()
    assert (s["definition"]["train_steps"], s["definition"]["train_examples"]) == (200, 1000)


@pytest.mark.parametrize("header, rows, match", [
    ("workload,batch_size,step,val/classification_error", [f"{W},64,0,0.5"], "missing column.*trial_id"),
    (HEADER, [f"{W},64,1,zero,0.5,1,0.1,"], "column 'step' must hold integers, got 'zero'"),
    (HEADER, [f"{W},64,1,1.5,0.5,1,0.1,"], "column 'step' must hold integers"),
    (HEADER, [f"{W},0,1,0,0.5,1,0.1,"], "column 'batch_size' must be >= 1"),
    (HEADER, [f"{W},-64,1,0,0.5,1,0.1,"], "column 'batch_size' must be >= 1"),
    (HEADER, [f"{W},64,1,0,0.5,1,0.1,COMPLETE", f"{W},64,1,1,0.5,1,0.1,INFEASIBLE"], "conflicting 'status'"),
    (HEADER, [f"{W},64,1,0,0.5,1,0.1,", f"{W},64,1,0,0.4,1,0.1,"], "step 0 twice"),
    (HEADER, [f"{W},64,1,0,0.5,1,0.1,DONE"], "unknown status 'DONE'"),
    (HEADER, [f"{W},64,1,0,bad,1,0.1,"], "metric column 'val/classification_error' must hold numbers, got 'bad'"),
    (HEADER, [f"{W},64,1,0,0.5,1,0.1,", f"{W},64,1,1,0.5,1,0.2,"], "conflicting 'param:learning_rate'"),
    (HEADER, ["mnist/fc,64,1,0,0.5,1,0.1,"], "dataset/model/optimizer"),
    (HEADER + ",loss", [f"{W},64,1,0,0.5,1,0.1,,0.3"], "unknown column 'loss'"),
    ("workload,batch_size,trial_id,step", [f"{W},64,1,0"], "no metric column"),
    (HEADER, [], "no rows"),
    # review fixes: an id beyond int64 used to wrap to a negative id; numpy reprs leaked into messages;
    # a steps value below the trial's last evaluation step was accepted
    (HEADER, [f"{W},64,99999999999999999999,0,0.5,1,0.1,"], r"column 'trial_id' must be <= 9223372036854775807"),
    (HEADER, [f"{W},0,1,0,0.5,1,0.1,"], r"must be >= 1, got 0$"),
    (HEADER, [f"{W},64,1,0,0.5,1,0.1,", f"{W},64,1,1,0.5,1,0.2,"], r"values 0\.1 and 0\.2$"),
    (HEADER + ",steps", [f"{W},64,1,0,0.5,1,0.1,,3", f"{W},64,1,5,0.5,1,0.1,,3"],
     "has steps 3, fewer than its last evaluation step 5"),
])
def test_malformed_tables_are_one_line_errors_and_write_nothing(tmp_path, store, header, rows, match):
    path = write(tmp_path / "bad.csv", rows, header)
    with pytest.raises(BatchlabError, match=match) as info:
        import_table(store, path)
    assert "\n" not in str(info.value)
    assert store.state().seq == 0
    assert not any((store.root / "data").rglob("*.parquet"))


def test_a_trial_id_used_in_the_store_is_a_collision(tmp_path, store):
    publish_trials(store, [TrialRecord(workload=W, batch_size=64, trial_id=2, trial_key="mine",
                                       parameters={}, status="COMPLETE", steps=1)])
    seq = store.state().seq
    with pytest.raises(BatchlabError, match="trial id 2 .* already published"):
        import_table(store, write(tmp_path / "runs.csv", GOOD))
    assert store.state().seq == seq and store.table("trials").num_rows == 1
    assert len(list((store.root / "data" / "measurements").glob("*.parquet"))) == 0


def test_unknown_file_kind_is_refused(tmp_path, store):
    (tmp_path / "runs.txt").write_text("x")
    with pytest.raises(BatchlabError, match="must end in one of"):
        import_table(store, tmp_path / "runs.txt")
    with pytest.raises(BatchlabError, match="does not exist"):
        import_table(store, tmp_path / "none.csv")


def test_store_fixture_is_fresh(store):
    assert isinstance(store, Store) and store.state().seq == 0


def assert_nothing_written(store):
    assert store.state().seq == 0
    assert not any((store.root / "data").rglob("*.parquet"))


ONE = "\n".join([HEADER, f"{W},64,1,0,0.9,2.3,0.1,"]) + "\n"


@pytest.mark.parametrize("name, data, fragment", [
    # a Latin-1 cell used to give a UnicodeDecodeError traceback (pandas), a Latin-1 header too
    ("latin1.csv", ONE.replace(W, "m\xe9nist/fc/sgd").encode("latin-1"), "is not UTF-8 text (byte 0xe9 on line 2"),
    ("header.csv", ONE.replace("param:learning_rate", "param:r\xe9").encode("latin-1"), "byte 0xe9 on line 1"),
    ("utf16.csv", ONE.encode("utf-16"), "is UTF-16 text; batchlab reads UTF-8"),
    ("utf16be.csv", b"\xfe\xff" + ONE.encode("utf-16-be"), "is UTF-16 text"),
    ("utf32.csv", ONE.encode("utf-32"), "is UTF-32 text"),
    ("nobom.csv", ONE.encode("utf-16-le"), "holds NUL bytes"),
    ("binary.csv", bytes(range(256)) * 4, "holds NUL bytes"),
    ("latin1.csv.gz", __import__("gzip").compress(ONE.replace(W, "m\xe9nist/fc/sgd").encode("latin-1")),
     "is not UTF-8 text"),
    ("empty.csv", b"", "Empty CSV file"),
])
def test_a_table_in_another_encoding_is_one_line_and_writes_nothing(tmp_path, store, name, data, fragment):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(BatchlabError) as info:
        import_table(store, tmp_path / name)
    assert fragment in str(info.value) and str(info.value).isprintable()
    assert_nothing_written(store)


@pytest.mark.parametrize("bad_row, message", [
    (f"{W},64,2,0,0.5\xb0,1,0.1,", "column 'val/classification_error', data row 40001, is not UTF-8 text"),
    (f"{W},64,2,0,0.5,1,0.1,D\xc9J\xc0", "long.csv is not UTF-8 text .*invalid UTF8"),
])
def test_a_latin1_cell_past_the_checked_head_is_one_line(tmp_path, store, bad_row, message):
    rows = [f"{W},64,1,{step},0.5,1,0.1," for step in range(40_000)]  # > 1 MiB before the bad row
    path = tmp_path / "long.csv"
    path.write_bytes(("\n".join([HEADER, *rows, bad_row]) + "\n").encode("latin-1"))
    assert path.stat().st_size > 1 << 20
    with pytest.raises(BatchlabError, match=message) as info:
        import_table(store, path)
    assert str(info.value).isprintable()
    assert_nothing_written(store)


def test_a_utf8_byte_order_mark_is_allowed(tmp_path, store):
    (tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbf" + ONE.encode())
    assert import_table(store, tmp_path / "bom.csv").trials_added == 1


@pytest.mark.parametrize("workload", ["../../escaped/sgd", "mnist/../fc/sgd", "./fc/sgd", "mn\\ist/fc/sgd",
                                      "mn ist/fc/sgd", "mn\x07ist/fc/sgd"])
def test_a_workload_name_that_is_no_relative_path_is_refused(tmp_path, store, workload):
    # "../../escaped/sgd" used to import with exit 0 (only export refused it)
    path = tmp_path / "w.csv"
    path.write_bytes(ONE.replace(W, f'"{workload}"').encode())
    with pytest.raises(BatchlabError, match="is not of the form dataset/model/optimizer: three or more parts") as info:
        import_table(store, path)
    assert str(info.value).isprintable()
    assert_nothing_written(store)


def _trial_ids(store):
    return sorted(r[0] for r in store.connect().execute("SELECT trial_id FROM trials").fetchall())


@pytest.mark.parametrize("cell, expected", [
    ("9223372036854775806", 2**63 - 2),  # used to be refused: "must be <= 9223372036854775807, got 9.2e18"
    ("9223372036854775807", 2**63 - 1),
    ("9223372036854775296", 2**63 - 512),
    ("9223372036854775806.0", 2**63 - 2),  # whole numbers in float notation, compared exactly
    ("1e3", 1000), ("3.0", 3), ("+4", 4), (" 5 ", 5), ("6.00e0", 6),
])
def test_integer_cells_are_read_exactly(tmp_path, store, cell, expected):
    path = tmp_path / "ids.csv"
    path.write_text("\n".join([HEADER, f"{W},64,{cell},0,0.9,2.3,0.1,"]) + "\n")
    import_table(store, path)
    assert _trial_ids(store) == [expected]


@pytest.mark.parametrize("column, cell, message", [
    ("trial_id", "9223372036854775808", "column 'trial_id' must be <= 9223372036854775807, got 9223372036854775808$"),
    ("trial_id", "9223372036854775807.5", "column 'trial_id' must hold integers, got '9223372036854775807.5'"),
    ("trial_id", "1e999999999", "must be <= 9223372036854775807, got 1e999999999$"),
    ("step", "0x10", "column 'step' must hold integers, got '0x10'"),  # pyarrow would read 16
    ("batch_size", "true", "column 'batch_size' must hold integers, got 'true'"),  # used to import as 1
    ("step", "1.5", "column 'step' must hold integers, got '1.5'"),
    ("step", "nan", "column 'step' must hold integers, got 'nan'"),
    ("step", "inf", "column 'step' must hold integers, got 'inf'"),
    ("step", "1_000", "column 'step' must hold integers, got '1_000'"),
    ("batch_size", "0.0", "column 'batch_size' must be >= 1, got 0.0$"),
    ("trial_id", "-1e0", "column 'trial_id' must be >= 0, got -1e0$"),
])
def test_integer_cells_that_are_no_integer_in_range_are_refused(tmp_path, store, column, cell, message):
    values = {"batch_size": "64", "trial_id": "1", "step": "0", column: cell}
    path = tmp_path / "bad.csv"
    path.write_text("\n".join([HEADER, f"{W},{values['batch_size']},{values['trial_id']},{values['step']},"
                               "0.9,2.3,0.1,"]) + "\n")
    with pytest.raises(BatchlabError, match=message):
        import_table(store, path)
    assert_nothing_written(store)


def test_parquet_integer_columns_are_checked_exactly(tmp_path, store):
    import pyarrow as pa
    import pyarrow.parquet as pq

    def table(**columns):
        base = {"workload": [W], "batch_size": [64], "trial_id": [1], "step": [0], "val/classification_error": [0.5]}
        base.update(columns)
        path = tmp_path / "t.parquet"
        pq.write_table(pa.table(base), path)
        return path

    import_table(store, table(trial_id=pa.array([2**63 - 1], pa.int64()), step=pa.array([10.0])))
    assert _trial_ids(store) == [2**63 - 1]
    for columns, message in [
        ({"trial_id": pa.array([2**63], pa.uint64())}, "must be <= 9223372036854775807, got 9223372036854775808"),
        ({"trial_id": pa.array([2.0**63])}, "must be <= 9223372036854775807, got 9.223372036854776e"),
        ({"step": pa.array([2.5])}, "column 'step' must hold integers, got 2.5"),
        ({"step": pa.array([float("nan")])}, "column 'step' must hold integers, got nan"),
        ({"batch_size": pa.array([True])}, "column 'batch_size' must hold integers, got True"),
        ({"workload": pa.array([b"mnist/fc/sgd"])}, "column 'workload' must hold text"),
        ({"param:lr": pa.array([[1.0]])}, "column 'param:lr' must hold text, numbers or booleans"),
        ({"param:lr": pa.array([float("inf")])}, "t.parquet: parameter column 'param:lr' values must be finite"),
    ]:
        with pytest.raises(BatchlabError, match=message):
            import_table(store, table(**columns))
    assert store.state().seq == 1


def test_a_column_given_twice_is_refused(tmp_path, store):
    path = tmp_path / "twice.csv"
    path.write_text("\n".join([HEADER + ",step", f"{W},64,1,0,0.9,2.3,0.1,,0"]) + "\n")
    with pytest.raises(BatchlabError, match="column 'step' occurs twice"):
        import_table(store, path)
    assert_nothing_written(store)
