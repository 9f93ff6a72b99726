import pyarrow as pa
import pytest

from analysis_fixtures import tables_from_trials, trial
from batchlab.analysis.selection import Selection, metric_names, workload_names
from batchlab.analysis.steps_to_result import steps_to_result_many
from batchlab.analysis.tables import VIEW_COLUMNS, connect_tables
from batchlab.errors import BatchlabError

W = "mnist/fc_1024/sgd"


def test_views_from_pandas_and_arrow_tables_keep_exactly_the_view_columns():
    tables = tables_from_trials([trial(W, 4, 1, [(10, {"val/classification_error": 0.5, "train/cross_entropy_error": 1.0})])])
    tables["trials"]["extra"] = 1
    tables["measurements"] = pa.Table.from_pandas(tables["measurements"])
    con = connect_tables(**tables)
    for name, columns in VIEW_COLUMNS.items():
        assert tuple(c[0] for c in con.execute(f"SELECT * FROM {name}").description) == columns
    assert workload_names(con) == [W]
    assert metric_names(con, W) == ["train/cross_entropy_error", "val/classification_error"]


def test_missing_columns_are_named():
    tables = tables_from_trials([trial(W, 4, 1, [(10, {"val/classification_error": 0.5})])])
    tables["measurements"] = tables["measurements"].drop(columns=["step"])
    with pytest.raises(BatchlabError, match=r"table 'measurements' lacks columns \['step'\]"):
        connect_tables(**tables)


def test_unchecked_unknown_metric_is_simply_unreached():
    con = connect_tables(**tables_from_trials([trial(W, 4, 1, [(10, {"val/classification_error": 0.5})])]))
    (results,) = steps_to_result_many(con, [Selection(W, "val/nothing", 1.0)], check=False)
    assert [(r.batch_size, r.reached) for r in results] == [(4, False)]
    with pytest.raises(BatchlabError, match="unknown metric 'val/nothing'"):
        steps_to_result_many(con, [Selection(W, "val/nothing", 1.0)])
    assert Selection(W, "m", 1, max_trials=3).describe()["max_trials"] == 3


def test_tables_without_study_columns_still_work():
    # Tables written before study definitions existed lack study_id and definition: they read as NULL.
    tables = tables_from_trials([trial(W, 4, 1, [(10, {"val/classification_error": 0.005})])])
    tables["trials"] = tables["trials"].drop(columns=["study_id"])
    tables["studies"] = tables["studies"].drop(columns=["study_id", "definition"])
    con = connect_tables(**tables)
    assert con.execute("SELECT study_id FROM trials").fetchall() == [(None,)]
    (results,) = steps_to_result_many(con, [Selection(W, "val/classification_error", 0.01)])
    assert [(r.steps, r.study_ids, r.mixed_studies) for r in results] == [(10, [], False)]
    with pytest.raises(BatchlabError, match="unknown study 's1': workload 'mnist/fc_1024/sgd' has no recorded study ids"):
        steps_to_result_many(con, [Selection(W, "val/classification_error", 0.01, studies=("s1",))])


def test_study_columns_are_text_and_listed():
    tables = tables_from_trials([trial(W, 4, 1, [(10, {"val/classification_error": 0.005})], study="abc")],
                                definitions={"abc": {"batch_size": 4, "sweep": "s"}})
    con = connect_tables(**tables)
    assert con.execute("SELECT study_id, definition FROM studies").fetchall() == [("abc", '{"batch_size": 4, "sweep": "s"}')]
    from batchlab.analysis.selection import study_definitions

    assert study_definitions(con, W) == {"abc": {"batch_size": 4, "sweep": "s"}}
