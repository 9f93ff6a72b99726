import json
import math
import struct

import pytest

from batchlab.errors import BatchlabError
from batchlab.store import Store, TrialRecord, publish_trials
from batchlab.store.batch_science_export import export_batch_science
from batchlab.store.batch_science_import import import_batch_science
from batchlab.store.synthetic_release import write_study

TRICKY = [0.1, 1 / 3, 5e-324, 1.7976931348623157e308, -0.0, 1e-7, 123456789.123456789,
          float("inf"), float("-inf"), float("nan"), 2.0 ** -1074 * 3, 0.30000000000000004]


def _bits(x):
    return struct.pack("<d", x)


def _dump(store):
    con = store.connect()
    out = {}
    for name in ("workloads", "studies", "trials"):
        out[name] = sorted(con.execute(f"SELECT * FROM {name}").fetchall())
    rows = con.execute("SELECT workload, batch_size, trial_id, step, metric, value FROM measurements").fetchall()
    out["measurements"] = sorted((*r[:5], _bits(r[5])) for r in rows)
    return out


def test_import_export_import_round_trips_bit_exactly(tmp_path, release):
    root, studies = release
    tricky = [{"step": i * 10, "val/classification_error": v, "train/cross_entropy_error": v / 7}
              for i, v in enumerate(TRICKY)]
    tricky.append({"step": 500, "val/classification_error": 0.25})  # empty train cell
    write_study(root, "lm1b/transformer_base/nesterov_momentum", 256, [
        {"trial_id": 9, "status": "COMPLETE", "steps": 500, "parameters": {"learning_rate": 0.3},
         "measurements": tricky},
        {"trial_id": 11, "status": "INCOMPLETE", "steps": 0, "parameters": {}, "measurements": []},
    ])
    study = json.loads((root / "lm1b/transformer_base/nesterov_momentum/256/study.json").read_text())
    study["note"] = "an extra field is kept"
    (root / "lm1b/transformer_base/nesterov_momentum/256/study.json").write_text(json.dumps(study))
    first = Store.open(tmp_path / "first", create=True)
    import_batch_science(first, root)
    report = export_batch_science(first, tmp_path / "exported")
    assert (report.studies, report.trials) == (7, 26)
    second = Store.open(tmp_path / "second", create=True)
    import_batch_science(second, tmp_path / "exported")
    assert _dump(first) == _dump(second)
    again = json.loads((tmp_path / "exported/lm1b/transformer_base/nesterov_momentum/256/study.json").read_text())
    assert again == study
    meta = json.loads((tmp_path / "exported/mnist/simple_cnn_base/sgd/8/3/metadata.json").read_text())
    original = json.loads((root / "mnist/simple_cnn_base/sgd/8/3/metadata.json").read_text())
    assert meta == {k: v for k, v in original.items() if not k.startswith("_internal")}
    values = [r[5] for r in _dump(second)["measurements"] if r[2] == 9 and r[4] == "val/classification_error"]
    assert sorted(values) == sorted(_bits(v) for v in TRICKY + [0.25])
    assert any(math.isnan(struct.unpack("<d", v)[0]) for v in values)


def test_export_refuses_a_non_empty_target(tmp_path, release, store):
    import_batch_science(store, release[0])
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    with pytest.raises(BatchlabError, match="not an empty directory"):
        export_batch_science(store, tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]


def test_export_of_writer_trials_is_importable(tmp_path, store):
    publish_trials(store, [TrialRecord(
        workload="mnist/fc_64_64_64/sgd", batch_size=32, trial_id=1, trial_key="sweep-1",
        parameters={"learning_rate": 0.5}, status="COMPLETE", steps=20, train_steps=20,
        measurements=[(0, "val/classification_error", 0.9), (20, "val/classification_error", 0.02)])])
    export_batch_science(store, tmp_path / "out")
    other = Store.open(tmp_path / "other", create=True)
    import_batch_science(other, tmp_path / "out")
    assert other.table("measurements").sort_by("step")["value"].to_pylist() == [0.9, 0.02]
