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


def test_the_analysis_reads_the_store_schemas_own_names(tmp_path):
    """The analysis' names are the schema's (no copies), and every query of the analysis binds against
    views that have exactly the schema's columns (a store's): a column the analysis selects that the
    schema lacks, or a column renamed in the schema only, fails here."""
    from batchlab.analysis import tables
    from batchlab.analysis.bootstrap import critical_batch_size_with_intervals
    from batchlab.analysis.budgets import best_measurement, best_measurement_by_budget
    from batchlab.analysis.metaparameters import searched_ranges, trial_outcomes
    from batchlab.analysis.selection import study_definitions
    from batchlab.store import Store, TrialRecord, publish_trials, schema

    assert tables.VIEW_COLUMNS is schema.VIEW_COLUMNS and tables.TRIAL_STATUSES is schema.STATUSES
    assert tables.DEFAULT_STATUSES is schema.DEFAULT_ANALYSIS_STATUSES
    assert set(tables.DEFAULT_STATUSES) <= set(schema.STATUSES)
    for name, optional in tables.OPTIONAL_COLUMNS.items():
        assert set(optional) <= set(schema.VIEW_COLUMNS[name])

    store = Store.open(tmp_path / "store", create=True)
    metric = "val/classification_error"
    publish_trials(store, [
        TrialRecord(workload=W, batch_size=b, trial_id=i, trial_key=f"{b}-{i}",
                    parameters={"learning_rate": 0.1 * i, "momentum": 0.9}, status="COMPLETE", steps=100,
                    measurements=[(0, metric, 0.9), (50 // b, metric, 0.5), (100 // b, metric, 0.01 * i)],
                    train_steps=100,
                    search_space={"learning_rate": {"type": "DOUBLE", "min_value": 0.01, "max_value": 1.0,
                                                  "scale": "LOG_SCALE"}})
        for b in (2, 4, 8) for i in (1, 2)
    ])
    con = store.connect()
    for name in schema.TABLES:
        assert tables.view_columns(con, name) == schema.VIEW_COLUMNS[name]
    selection = Selection(W, metric, 0.05)
    (results,) = steps_to_result_many(con, [selection])
    assert [r.reached for r in results] == [True, True, True]
    assert workload_names(con) == [W] and metric_names(con, W) == [metric]
    assert len(study_definitions(con, W)) == 3
    assert [b.batch_size for b in best_measurement(con, W, metric, step_budget=50)] == [2, 4, 8]
    assert best_measurement_by_budget(con, W, metric, [10, 100]).budgets == (10, 100)
    assert set(trial_outcomes(con, selection)["outcome"]) == {"reached"}
    assert set(searched_ranges(con, results)) == {2, 4, 8}
    estimate = critical_batch_size_with_intervals(con, selection, n_boot=3)
    assert list(estimate.to_dict()["critical_batch_sizes"])  # one entry per registry name
