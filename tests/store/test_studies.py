"""Study definitions: ids, conflicting definitions kept apart, STOPPED_AT_GOAL, legacy files."""

import dataclasses
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchlab.errors import BatchlabError
from batchlab.store import STATUSES, Store, TrialRecord, publish_trials
from batchlab.store.batch_science_export import export_batch_science
from batchlab.store.batch_science_import import import_batch_science
from batchlab.store.maintenance import compact, store_info
from batchlab.store.studies import (
    DEFINITION_KEYS,
    canonical_json,
    legacy_study_id,
    make_study_definition,
    study_id,
)

W = "mnist/fc_64_64_64/sgd"
RULE = {"metric": "val/classification_error", "goal": 0.03, "maximize": False}


def definition(**kw):
    fields = dict(workload=W, batch_size=64, train_steps=3000, train_examples=55000,
                  evaluation={"rule": "geometric", "resolution": 0.05}, seed=0)
    fields.update(kw)
    return make_study_definition(**fields)


def record(trial_id, study_definition=None, status="COMPLETE", steps=100, **kw):
    return TrialRecord(workload=W, batch_size=64, trial_id=trial_id, trial_key=f"k{trial_id}",
                       parameters={"learning_rate": 0.1 * trial_id}, status=status, steps=steps,
                       measurements=[(0, "val/classification_error", 0.9), (steps, "val/classification_error", 0.1)],
                       study_definition=study_definition, **kw)


def test_definition_has_exactly_the_keys_and_a_canonical_id():
    d = definition(sweep="s1", budget_round=0)
    assert set(d) == set(DEFINITION_KEYS) | {"sweep", "budget_round"}
    assert d["stop_rule"] is None and d["source"] == "batchlab" and d["search_space"] is None
    sid = study_id(d)
    assert len(sid) == 12 and int(sid, 16) >= 0
    # key order and tuple/list spelling do not change the id; any value does
    assert study_id(dict(reversed(list(d.items())))) == sid
    assert canonical_json(d) == json.dumps(d, sort_keys=True, separators=(",", ":"))
    assert study_id(definition(sweep="s1", budget_round=0, train_steps=3001)) != sid
    assert study_id(definition(evaluation={"rule": "steps", "steps": (1, 2)})) == study_id(
        definition(evaluation={"rule": "steps", "steps": [1, 2]}))
    assert json.loads(json.dumps(d)) == d


def test_a_cpu_definition_keeps_its_id_and_a_gpu_one_is_another_study():
    # 07c6ab078dca: the id of this definition before devices existed (batchlab before issue 9)
    assert study_id(definition()) == study_id(definition(device="cpu")) == "07c6ab078dca"
    assert "device" not in definition(device="cpu") and "device" not in definition()
    gpu = definition(device="cuda:1")
    assert gpu["device"] == "cuda" and study_id(gpu) != study_id(definition())
    assert study_id(gpu) == study_id(definition(device="cuda"))
    # a stored definition re-validated (check_definition) keeps its device
    from batchlab.store.studies import check_definition
    assert check_definition(gpu, W, 64) == gpu


@pytest.mark.parametrize("bad, match", [
    ({"batch_size": 0}, "batch_size"),
    ({"train_steps": -1}, "train_steps"),
    ({"train_examples": 0}, "train_examples"),
    ({"workload": "mnist/fc"}, "dataset/model/optimizer"),
    ({"stop_rule": {"metric": "m", "goal": float("nan"), "maximize": False}}, "goal"),
    ({"stop_rule": {"metric": "m", "goal": 0.1}}, "stop_rule"),
    ({"evaluation": {"resolution": 0.05}}, "evaluation"),
    ({"source": ""}, "source"),
    ({"sweep": object()}, "sweep"),
    ({"sweep": float("inf")}, "sweep"),
    ({"device": ""}, "device"),
])
def test_bad_definitions_are_one_line_user_errors(bad, match):
    with pytest.raises(BatchlabError, match=match) as info:
        definition(**bad)
    assert "\n" not in str(info.value)


def test_conflicting_definitions_are_kept_apart(store):
    long_run = definition()
    short_sweep = definition(train_steps=100, train_examples=2000, sweep="abc")
    publish_trials(store, [record(1, long_run), record(2, long_run)])
    publish_trials(store, [record(3, short_sweep, steps=100)])
    publish_trials(store, [record(4, long_run)])  # the first definition again: no new study
    con = store.connect()
    rows = con.execute("SELECT study_id, train_steps, definition FROM studies ORDER BY train_steps").fetchall()
    assert [r[:2] for r in rows] == [(study_id(short_sweep), 100), (study_id(long_run), 3000)]
    assert [json.loads(r[2]) for r in rows] == [short_sweep, long_run]
    by_trial = dict(con.execute("SELECT trial_id, study_id FROM trials").fetchall())
    assert by_trial == {1: study_id(long_run), 2: study_id(long_run), 3: study_id(short_sweep),
                        4: study_id(long_run)}
    studies = store.study_definitions(W)
    assert [(s["study_id"], s["n_trials"]) for s in studies] == sorted(
        [(study_id(long_run), 3), (study_id(short_sweep), 1)])
    assert all(set(s) == {"workload", "batch_size", "study_id", "definition", "n_trials", "statuses"}
               for s in studies)
    assert store.study_definitions("other/work/load") == []
    assert [s["definitions_at_batch_size"] for s in store_info(store)["study_definitions"]] == [2, 2]
    # trial ids stay unique per workload and batch size across studies
    with pytest.raises(BatchlabError, match="trial id 3"):
        publish_trials(store, [TrialRecord(workload=W, batch_size=64, trial_id=3, trial_key="other",
                                           parameters={}, status="COMPLETE", steps=1,
                                           study_definition=long_run)])


def test_definition_of_another_batch_size_is_refused(store):
    with pytest.raises(BatchlabError, match="batch size 128"):
        publish_trials(store, [record(1, definition(batch_size=128))])
    assert store.state().seq == 0


def test_trial_writer_builds_a_definition_when_none_is_given(store):
    w = store.trial_writer(workload=W, batch_size=64, trial_id=1, trial_key="a", parameters={},
                           seed=3, train_steps=500, search_space={"learning_rate": {"type": "DOUBLE"}},
                           early_stopping=True)
    w.record(0, {"val/classification_error": 0.5})
    w.finish(steps=500)
    expected = make_study_definition(workload=W, batch_size=64, train_steps=500, seed=3,
                                     search_space={"learning_rate": {"type": "DOUBLE"}}, early_stopping=True)
    assert w.study_id == study_id(expected)
    (s,) = store.study_definitions()
    assert s["definition"] == expected and s["statuses"]["COMPLETE"] == 1
    con = store.connect()
    assert con.execute("SELECT early_stopping, search_space FROM studies").fetchone() == (
        True, json.dumps({"learning_rate": {"type": "DOUBLE"}}, sort_keys=True))


def test_trial_writer_takes_a_definition_and_stopped_at_goal(store):
    d = definition(stop_rule=RULE)
    w = store.trial_writer(workload=W, batch_size=64, trial_id=1, trial_key="a", parameters={},
                           study_definition=d)
    w.record(40, {"val/classification_error": 0.02})
    assert w.finish(status="STOPPED_AT_GOAL", steps=40)
    con = store.connect()
    assert con.execute("SELECT status, steps, study_id FROM trials").fetchone() == (
        "STOPPED_AT_GOAL", 40, study_id(d))
    assert con.execute("SELECT early_stopping FROM studies").fetchone() == (True,)
    assert "STOPPED_AT_GOAL" in STATUSES
    info = store_info(store)
    assert info["trials"]["STOPPED_AT_GOAL"] == 1
    (s,) = info["study_definitions"]
    assert (s["stop_rule"], s["train_steps"], s["train_examples"], s["source"]) == (RULE, 3000, 55000, "batchlab")
    with pytest.raises(BatchlabError, match="unknown trial status"):
        store.trial_writer(workload=W, batch_size=64, trial_id=2, trial_key="b", parameters={}).finish(
            status="STOPPED")


def test_compaction_keeps_study_columns(store):
    publish_trials(store, [record(1, definition())])
    publish_trials(store, [record(2, definition(train_steps=10), steps=10)])
    con = store.connect()
    before = [con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in ("studies", "trials")]
    compact(store, grace_seconds=0)
    assert len(store.state().files["studies"]) == 1
    con = store.connect()
    assert [con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in ("studies", "trials")] == before


def test_export_maps_stopped_at_goal_to_the_release_convention(store, tmp_path):
    d = definition(stop_rule=RULE)
    publish_trials(store, [record(1, d, status="STOPPED_AT_GOAL", steps=40), record(2, d, steps=3000)])
    report = export_batch_science(store, tmp_path / "out")
    assert report.stopped_at_goal == 1 and "STOPPED_AT_GOAL -> status COMPLETE" in report.as_dict()["status_mapping"]
    sdir = tmp_path / "out" / W / "64"
    study = json.loads((sdir / "study.json").read_text())
    assert study["early_stopping"] is True and study["train_steps"] == 3000
    meta = json.loads((sdir / "1" / "metadata.json").read_text())
    assert (meta["status"], meta["steps"], meta["batchlab_status"]) == ("COMPLETE", 40, "STOPPED_AT_GOAL")
    assert json.loads((sdir / "2" / "metadata.json").read_text())["status"] == "COMPLETE"
    # the import reads the status back
    again = Store.open(tmp_path / "again", create=True)
    import_batch_science(again, tmp_path / "out")
    statuses = dict(again.connect().execute("SELECT trial_id, status FROM trials").fetchall())
    assert statuses == {1: "STOPPED_AT_GOAL", 2: "COMPLETE"}
    (s,) = again.study_definitions()
    assert s["definition"] == d  # batchlab_studies in study.json gives the definition back
    # ... and the trials keep their study's source, so the release's first-N rule does not apply
    sources = {row[0] for row in again.connect().execute("SELECT DISTINCT source FROM trials").fetchall()}
    assert sources == {d["source"]} and d["source"] != "batch_science"


def test_export_writes_raced_trials_as_incomplete_and_the_import_reads_them_back(store, tmp_path):
    d = definition(stop_rule=RULE, race={"keep": 2})
    bounded = record(1, d, status="STOPPED_AT_GOAL", steps=40)
    bounded = dataclasses.replace(bounded, measurements=[*bounded.measurements, (20, "val/classification_error", 0.5),
                                                          (20, "val/classification_error:bound", 1.0)])
    publish_trials(store, [bounded, record(2, d, status="RACED", steps=50)])
    report = export_batch_science(store, tmp_path / "out")
    assert report.raced == 1 and "RACED -> status INCOMPLETE" in report.as_dict()["status_mapping"]
    assert report.bounded == 1  # a lower bound at step 20, with its flag column
    meta = json.loads((tmp_path / "out" / W / "64" / "2" / "metadata.json").read_text())
    assert (meta["status"], meta["steps"], meta["batchlab_status"]) == ("INCOMPLETE", 50, "RACED")
    again = Store.open(tmp_path / "again", create=True)
    import_batch_science(again, tmp_path / "out")
    statuses = dict(again.connect().execute("SELECT trial_id, status FROM trials").fetchall())
    assert statuses == {1: "STOPPED_AT_GOAL", 2: "RACED"}
    flags = again.connect().execute("SELECT trial_id, step, value FROM measurements WHERE metric LIKE '%:bound'").fetchall()
    assert flags == [(1, 20, 1.0)]  # the bound's flag comes back as it was


def test_export_of_several_definitions_at_one_batch_size_lists_them(store, tmp_path):
    a, b = definition(), definition(train_steps=100)
    publish_trials(store, [record(1, a), record(2, a), record(3, b)])
    report = export_batch_science(store, tmp_path / "out")
    assert (report.studies, report.trials, report.merged_batch_sizes) == (1, 3, 1)
    study = json.loads((tmp_path / "out" / W / "64" / "study.json").read_text())
    assert study["train_steps"] == 3000  # the definition with the most trials
    listed = {s["study_id"]: s["trial_ids"] for s in study["batchlab_studies"]}
    assert listed == {study_id(a): [1, 2], study_id(b): [3]}
    # export -> import keeps the studies apart, with their own ids
    again = Store.open(tmp_path / "again", create=True)
    assert import_batch_science(again, tmp_path / "out").studies == 1
    con = again.connect()
    assert dict(con.execute("SELECT trial_id, study_id FROM trials").fetchall()) == {
        1: study_id(a), 2: study_id(a), 3: study_id(b)}
    assert sorted(r[0] for r in con.execute("SELECT study_id FROM studies").fetchall()) == sorted(
        [study_id(a), study_id(b)])
    # a malformed batchlab_studies list is a malformed study.json
    path = tmp_path / "out" / W / "64" / "study.json"
    study["batchlab_studies"][0]["definition"]["batch_size"] = 8
    path.write_text(json.dumps(study))
    with pytest.raises(BatchlabError, match="batchlab_studies"):
        import_batch_science(Store.open(tmp_path / "third", create=True), tmp_path / "out")


def test_files_from_before_study_definitions_get_legacy_ids(store):
    """A store written by an older batchlab (no study_id/definition columns) still reads, compacts
    and takes new trials."""
    old_studies = pa.table({"workload": [W], "batch_size": [64], "search_space": [None],
                            "train_steps": [1000], "early_stopping": [False], "extra": ["{}"]})
    old_trials = pa.table({"workload": [W], "batch_size": [64], "trial_id": [1], "trial_key": ["old"],
                           "parameters": ["{}"], "status": ["COMPLETE"], "steps": [1000], "seed": [None],
                           "source": ["batchlab"]},
                          schema=pa.schema([(n, t) for n, t in [
                              ("workload", pa.string()), ("batch_size", pa.int64()), ("trial_id", pa.int64()),
                              ("trial_key", pa.string()), ("parameters", pa.string()), ("status", pa.string()),
                              ("steps", pa.int64()), ("seed", pa.int64()), ("source", pa.string())]]))
    from batchlab.store.log import CommitPlan, commit

    files = {}
    for name, table in (("studies", old_studies), ("trials", old_trials)):
        rel, _ = store.new_data_path(name)
        rel = rel.replace(".s2.parquet", ".parquet")  # an older batchlab's file name
        pq.write_table(table, store.root / rel)
        files[name] = [rel]
    commit(store.root, lambda state: CommitPlan(operation="old", add=files))
    legacy = legacy_study_id(W, 64)
    con = store.connect()
    assert con.execute("SELECT study_id FROM trials").fetchall() == [(legacy,)]
    sid, text = con.execute("SELECT study_id, definition FROM studies").fetchone()
    assert sid == legacy and json.loads(text)["source"] == "legacy" and json.loads(text)["train_steps"] == 1000
    publish_trials(store, [record(2, definition())])
    assert len(store.study_definitions(W)) == 2
    con = store.connect()
    before = [con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in ("studies", "trials")]
    compact(store, grace_seconds=0)
    con = store.connect()
    assert [con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in ("studies", "trials")] == before


def test_next_trial_id_never_lands_in_a_sweeps_block_of_ids(store):
    from batchlab.store.studies import TRIAL_ID_BLOCK

    plain = definition()
    publish_trials(store, [record(1, plain), record(2, plain)])
    assert store.next_trial_id(W, 64) == 3  # no sweep here: the next id
    swept = definition(train_steps=600, sweep="abc123")
    publish_trials(store, [record(TRIAL_ID_BLOCK + 1 + i, swept) for i in range(3)])
    # the sweep owns block 1 (ids 100001..): a `batchlab train` trial takes the next block, so the sweep
    # can still be extended by more points in its own block
    assert store.next_trial_id(W, 64) == 2 * TRIAL_ID_BLOCK + 1
    assert store.next_trial_id(W, 128) == 1  # other batch sizes are independent


def test_id_blocks_are_one_based_as_the_sweeps_ids():
    from batchlab.store.studies import TRIAL_ID_BLOCK, id_block
    from batchlab.sweep import keys

    assert keys.id_block is id_block  # the sweep allocates ids with the store's one definition
    assert [id_block(i) for i in (0, 1, TRIAL_ID_BLOCK, TRIAL_ID_BLOCK + 1, 3 * TRIAL_ID_BLOCK + 7)] == [-1, 0, 0, 1, 3]
    assert id_block(keys.trial_id(0, block=4)) == id_block(keys.trial_id(TRIAL_ID_BLOCK - 1, block=4)) == 4


def test_next_trial_id_keeps_clear_of_a_full_sweep_block(store):
    from batchlab.store.studies import TRIAL_ID_BLOCK

    swept = definition(train_steps=600, sweep="abc123")
    # the sweep's block 0 ends at id TRIAL_ID_BLOCK (one-based): the next id is the first of block 1,
    # which holds no sweep trial, so it is given out as is
    publish_trials(store, [record(i, swept) for i in (1, TRIAL_ID_BLOCK)])
    assert store.next_trial_id(W, 64) == TRIAL_ID_BLOCK + 1
