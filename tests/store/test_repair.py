"""``store repair``: a missing log entry is restored from its verified copy; what cannot be verified
is quarantined, never deleted; an intact store is left exactly as it is."""

import json

import pytest

from batchlab.errors import BatchlabError
from batchlab.store.integrity import QUARANTINE_DIR, StoreDamaged, repair
from batchlab.store.log import LOG_COPY_DIR, entry_name, read_state
from batchlab.store.schema import LOG_DIR
from store_damage import data_bytes, entry_files, every_file, flip_middle, rows, three_commits


def _snapshot(store):
    return {t: rows(store, t) for t in ("workloads", "studies", "trials", "measurements")}


@pytest.mark.parametrize("seq", [1, 2, 3])
def test_a_deleted_entry_is_restored_from_its_copy_and_every_trial_is_readable(tmp_path, seq):
    store = three_commits(tmp_path)
    before = _snapshot(store)
    (store.root / LOG_DIR / entry_name(seq)).unlink()
    with pytest.raises(StoreDamaged) as info:
        store.state()
    message = str(info.value)
    assert "\n" not in message and f"log entry {LOG_DIR}/{entry_name(seq)} is missing" in message
    assert f"would restore log entry {seq} from its copy" in message and "8 trials visible again" in message
    assert [a.kind for a in repair(store.root, dry_run=True)] == ["restore"]
    assert not (store.root / LOG_DIR / entry_name(seq)).exists()  # a dry run writes nothing
    actions = repair(store.root)
    assert [(a.kind, a.seq, a.trials, len(a.files)) for a in actions] == [("restore", seq, 8, 4)]
    after = _snapshot(store)
    assert after == before  # every trial readable again
    keys = [r[3] for r in after["trials"]]
    assert len(keys) == len(set(keys)) == 24  # nothing duplicated
    assert repair(store.root) == []  # intact now


def test_repairing_an_intact_store_changes_nothing(tmp_path):
    store = three_commits(tmp_path)
    before = every_file(store.root)
    assert repair(store.root) == []
    assert every_file(store.root) == before


def test_entry_and_copy_deleted_fills_the_gap_and_quarantines_the_unnamed_files(tmp_path):
    store = three_commits(tmp_path)
    lost = entry_files(store, 2)
    kept_before = [r for r in rows(store, "trials") if not r[0].startswith("cifar_10/")]
    everything = data_bytes(store.root)
    (store.root / LOG_DIR / entry_name(2)).unlink()
    (store.root / LOG_COPY_DIR / entry_name(2)).unlink()
    with pytest.raises(StoreDamaged, match="would replace missing log entry 2 by an empty entry, moving 4 data files"):
        store.state()
    actions = repair(store.root)
    assert [(a.kind, a.seq, sorted(a.files), a.trials) for a in actions] == [("fill", 2, lost, 8)]
    assert rows(store, "trials") == kept_before  # commits 1 and 3 readable
    assert all((store.root / QUARANTINE_DIR / f).is_file() and not (store.root / f).exists() for f in lost)
    assert data_bytes(store.root) == everything  # nothing deleted
    entry = json.loads((store.root / LOG_DIR / entry_name(2)).read_bytes())
    assert entry["operation"] == "repair" and sorted(m["file"] for m in entry["repair"]["quarantined"]) == lost


@pytest.mark.parametrize("table", ["workloads", "studies", "trials", "measurements"])
def test_a_file_damaged_in_place_is_quarantined_with_its_commit_and_the_rest_stays_readable(tmp_path, table):
    store = three_commits(tmp_path)
    commit2 = entry_files(store, 2)
    target = next(f for f in commit2 if f.startswith(f"data/{table}/"))
    flip_middle(store.root / target)  # same size, magic intact: only the sha256 tells
    everything = data_bytes(store.root)
    store.state()  # the per-read check does not hash
    actions = repair(store.root)
    assert [(a.kind, a.seq, a.files) for a in actions] == [("quarantine", 2, commit2)]
    assert "does not match the sha256" in actions[0].reason
    assert actions[0].trials == (0 if table == "trials" else 8)  # trial rows of the intact files moved
    trials = rows(store, "trials")
    assert len(trials) == 16 and not any(r[0].startswith("cifar_10/") for r in trials)
    assert {r[0] for r in rows(store, "measurements")} == {r[0] for r in trials}
    assert all((store.root / QUARANTINE_DIR / f).is_file() for f in commit2)
    assert data_bytes(store.root) == everything  # moved, not deleted
    assert repair(store.root) == []


def test_a_truncated_file_is_refused_on_read_then_quarantined(tmp_path):
    store = three_commits(tmp_path)
    target = next(f for f in entry_files(store, 3) if "/measurements/" in f)
    path = store.root / target
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(StoreDamaged) as info:
        store.state()
    assert f"data file {target} (made visible by log entry 3) has 100 bytes" in str(info.value)
    assert "would move 4 data files of log entry 3 to quarantine/" in str(info.value)
    actions = repair(store.root)
    assert [(a.kind, a.seq) for a in actions] == [("quarantine", 3)]
    assert len(rows(store, "trials")) == 16 and (store.root / QUARANTINE_DIR / target).stat().st_size == 100


@pytest.mark.parametrize("text, damage", [
    ("{not json", "is not valid JSON"),
    # valid JSON that is no log entry used to reach the log replay: a TypeError traceback in every command
    ('{"seq": 2, "add": 5}', "is not a log entry"),
])
def test_a_damaged_log_entry_is_restored_from_its_copy(tmp_path, text, damage):
    store = three_commits(tmp_path)
    before = _snapshot(store)
    (store.root / LOG_DIR / entry_name(2)).write_text(text)
    with pytest.raises(BatchlabError, match=f"log entry 000000000002.json {damage}"):
        store.state()
    assert [a.kind for a in repair(store.root)] == ["restore"]
    assert _snapshot(store) == before
    assert (store.root / QUARANTINE_DIR / LOG_DIR / entry_name(2)).read_text() == text


def test_a_copy_of_another_shape_is_not_restored_and_nothing_is_lost(tmp_path):
    # a deleted entry whose copy has malformed records or file lists cannot verify its files: the gap
    # is filled and the files quarantined (it used to be "restored" and crash the replay)
    store = three_commits(tmp_path)
    copy = store.root / LOG_COPY_DIR / entry_name(3)
    entry = json.loads(copy.read_bytes())
    entry["files"] = {name: 5 for name in entry["files"]}
    copy.write_text(json.dumps(entry))
    (store.root / LOG_DIR / entry_name(3)).unlink()
    with pytest.raises(StoreDamaged, match="log entry log/000000000003.json is missing"):
        store.state()
    files = every_file(store.root)
    assert [a.kind for a in repair(store.root)] == ["fill"]
    assert len(rows(store, "trials")) == 16
    kept = set(every_file(store.root).values())
    assert all(content in kept for name, content in files.items() if name.endswith(".parquet"))  # moved, not deleted


def test_a_store_from_before_records_opens_and_repair_records_it(tmp_path):
    store = three_commits(tmp_path)
    before = _snapshot(store)
    for path in (store.root / LOG_DIR).glob("*.json"):  # what older versions wrote: no records, no copies
        entry = json.loads(path.read_bytes())
        del entry["files"]
        path.write_text(json.dumps(entry))
    for path in (store.root / LOG_COPY_DIR).glob("*.json"):
        path.unlink()
    assert _snapshot(store) == before and read_state(store.root).records == {}
    actions = repair(store.root)
    assert [(a.kind, a.seqs, len(a.files)) for a in actions] == [("copy", [1, 2, 3], 0), ("record", [], 12)]
    state = read_state(store.root)
    assert set(state.records) == state.all_files() and state.checkpoint_seq == 4
    assert _snapshot(store) == before and repair(store.root) == []
