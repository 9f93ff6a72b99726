"""batchlab.integrations.schedule: schedules in examples, their files, accumulation and the LR rules."""

from __future__ import annotations

import json
import math

import pytest

from batchlab.errors import BatchlabError
from batchlab.integrations.schedule import (
    BatchSizeSchedule,
    accumulation_steps,
    checked_rule,
    examples_lr_schedule,
    rescaled_learning_rate,
)

RAMP = BatchSizeSchedule(((0, 64), (1_000, 128), (5_000, 256)))


def _one_line(exc_info) -> str:
    text = str(exc_info.value)
    assert "\n" not in text and text
    return text


def test_batch_size_at_is_the_last_point_started():
    assert [RAMP.batch_size_at(c) for c in (0, 999, 1_000, 4_999, 5_000, 10**12)] == [64, 64, 128, 128, 256, 256]
    assert RAMP.starts == [0, 1_000, 5_000] and RAMP.batch_sizes == [64, 128, 256]
    assert BatchSizeSchedule([[0, 7]]).batch_size_at(123) == 7  # lists are accepted and stored as tuples
    assert BatchSizeSchedule([[0, 7]]).points == ((0, 7),)


@pytest.mark.parametrize("points, unit, match", [
    (((0, 64), (100, 32)), "examples", "not increasing"),
    (((0, 64), (100, 64)), "examples", "not increasing"),
    (((0, 64), (0, 128)), "examples", "strictly increasing"),
    (((0, 64), (200, 128), (100, 256)), "examples", "strictly increasing"),
    (((10, 64),), "examples", "must start at 0"),
    (((0, 0),), "examples", ">= 1"),
    (((0, -4),), "examples", ">= 1"),
    (((0, 2.5),), "examples", "integer"),
    (((0, True),), "examples", "integer"),
    (((-1, 4),), "examples", ">= 0"),
    ((), "examples", "at least one"),
    (((0, 4, 5),), "examples", "pair"),
    ("0:64", "examples", "list of"),
    (((0, 64),), "steps", "unknown batch-size schedule unit 'steps'; known: examples, tokens"),
])
def test_bad_schedules_are_one_line_errors(points, unit, match):
    with pytest.raises(BatchlabError, match=match) as exc:
        BatchSizeSchedule(points, unit=unit)
    _one_line(exc)


def test_dict_round_trip_and_form():
    d = RAMP.to_dict()
    assert d == {"format": "batchlab.batch_size_schedule", "version": 1, "unit": "examples",
                 "points": [{"start": 0, "batch_size": 64}, {"start": 1000, "batch_size": 128},
                            {"start": 5000, "batch_size": 256}]}
    assert BatchSizeSchedule.from_dict(json.loads(json.dumps(d))) == RAMP
    tokens = BatchSizeSchedule(((0, 4096),), unit="tokens")
    assert BatchSizeSchedule.from_dict(tokens.to_dict()) == tokens


def test_save_is_atomic_and_load_reads_it(tmp_path):
    path = tmp_path / "schedule.json"
    RAMP.save(path)
    assert BatchSizeSchedule.load(path) == RAMP
    assert sorted(p.name for p in tmp_path.iterdir()) == ["schedule.json"]  # no temporary file left
    BatchSizeSchedule(((0, 8),)).save(path)  # replaces the file whole
    assert BatchSizeSchedule.load(path).points == ((0, 8),)


@pytest.mark.parametrize("content, match", [
    (b"{not json", "is not JSON"),
    (b"\xff\xfe{\x00}\x00", "UTF-16"),
    (b'{"format": "x", "version": 1, "points": []}', "not a batch-size schedule"),
    (b'{"format": "batchlab.batch_size_schedule", "version": 2, "points": []}', "version 2; known: 1"),
    (b'{"format": "batchlab.batch_size_schedule", "version": 1, "points": [{"start": 0}]}', "exactly start and batch_size"),
    (b'{"format": "batchlab.batch_size_schedule", "version": 1, "points": {"0": 4}}', "must be a list"),
    ((b'{"format": "batchlab.batch_size_schedule", "version": 1, "unit": "examples", "points": '
      b'[{"start": 0, "batch_size": 8}, {"start": 5, "batch_size": 4}]}'), "not increasing"),
    (b'{"format": "batchlab.batch_size_schedule", "version": 1, "points": [], "extra": 1}', "unknown keys extra"),
    (b"[1, 2]", "JSON object"),
    (b'{"format": "batchlab.batch_size_schedule", "version": 1, "points": [{"start": 0, "batch_size": 8}]}',
     "has no 'unit'"),
])
def test_bad_files_are_one_line_errors_naming_the_file(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(BatchlabError, match=match) as exc:
        BatchSizeSchedule.load(path)
    assert str(path) in _one_line(exc)


def test_missing_file_names_it(tmp_path):
    with pytest.raises(BatchlabError, match="ENOENT") as exc:
        BatchSizeSchedule.load(tmp_path / "nope.json")
    assert "nope.json" in _one_line(exc)


def test_olmo_core_form():
    # OLMo-core's BatchSizeSchedulerCallback(batch_sizes=[...], schedule=[Duration.tokens(...), ...]):
    # global batch sizes and starts in tokens
    assert RAMP.to_olmo_core(sequence_length=512) == {
        "batch_sizes": [64 * 512, 128 * 512, 256 * 512],
        "schedule": [{"value": 0, "unit": "tokens"}, {"value": 1000 * 512, "unit": "tokens"},
                     {"value": 5000 * 512, "unit": "tokens"}]}
    tokens = BatchSizeSchedule(((0, 1024), (10_000, 4096)), unit="tokens")
    assert tokens.to_olmo_core() == {"batch_sizes": [1024, 4096],
                                     "schedule": [{"value": 0, "unit": "tokens"}, {"value": 10_000, "unit": "tokens"}]}
    with pytest.raises(BatchlabError, match="sequence_length") as exc:
        RAMP.to_olmo_core()
    _one_line(exc)
    with pytest.raises(BatchlabError, match="already in tokens"):
        tokens.to_olmo_core(sequence_length=8)
    with pytest.raises(BatchlabError, match="96 is not a multiple of 64") as exc:
        BatchSizeSchedule(((0, 64), (10, 96))).to_olmo_core(sequence_length=1)
    _one_line(exc)


def test_accumulation_steps():
    assert accumulation_steps(128, 16, 2) == 4
    assert accumulation_steps(32, 32) == 1
    with pytest.raises(BatchlabError) as exc:
        accumulation_steps(100, 16, 2)
    assert _one_line(exc) == ("batch size 100 is not reachable by gradient accumulation with micro-batches of 16 on 2 "
                              "worker(s) (32 per pass); reachable: 32, 64, 96, 128, ... (multiples of 32)")
    with pytest.raises(BatchlabError, match="not reachable"):
        accumulation_steps(8, 16)  # smaller than one pass: k would be 1/2
    with pytest.raises(BatchlabError, match="micro_batch_size must be >= 1, got 0"):
        accumulation_steps(8, 0)
    with pytest.raises(BatchlabError, match="world_size"):
        accumulation_steps(8, 4, 1.5)


def test_rescaled_learning_rate_rules():
    assert rescaled_learning_rate(0.1, 64, 256, "linear") == pytest.approx(0.4)
    assert rescaled_learning_rate(0.1, 64, 256, "sqrt") == pytest.approx(0.2)
    assert rescaled_learning_rate(0.1, 64, 32, "sqrt") == pytest.approx(0.1 / math.sqrt(2))
    assert rescaled_learning_rate(0.1, 64, 256, "none") == 0.1
    assert rescaled_learning_rate(0.1, 64, 256, {64: 0.1, 256: 0.3}) == 0.3
    assert rescaled_learning_rate(0.1, 64, 256, {"64": 0.1, "256": 0.3}) == 0.3  # JSON's string keys
    with pytest.raises(BatchlabError) as exc:
        rescaled_learning_rate(0.1, 64, 128, {64: 0.1, 256: 0.3})
    assert _one_line(exc) == "learning-rate table has no rate for batch size(s) 128; it covers 64, 256"
    with pytest.raises(BatchlabError, match="unknown learning-rate rule 'cubic'; known: linear, sqrt, none"):
        rescaled_learning_rate(0.1, 64, 128, "cubic")
    with pytest.raises(BatchlabError, match="positive number"):
        rescaled_learning_rate(0.1, 64, 64, {64: -1.0})
    with pytest.raises(BatchlabError, match="base_lr"):
        rescaled_learning_rate(float("nan"), 64, 64, "linear")


def test_checked_rule_needs_a_table_covering_the_schedule():
    assert checked_rule("sqrt", RAMP.batch_sizes) == "sqrt"
    assert checked_rule({64: 1, 128: 2, 256: 3, 512: 4}, RAMP.batch_sizes) == {64: 1.0, 128: 2.0, 256: 3.0, 512: 4.0}
    with pytest.raises(BatchlabError, match="no rate for batch size.s. 128, 256") as exc:
        checked_rule({64: 0.1}, RAMP.batch_sizes)
    _one_line(exc)
    with pytest.raises(BatchlabError, match="empty"):
        checked_rule({}, RAMP.batch_sizes)


def test_examples_lr_schedule_shapes():
    cosine = examples_lr_schedule("cosine", total_examples=1000, warmup_examples=100, final_factor=0.1)
    assert cosine(0) == 0.0 and cosine(50) == pytest.approx(0.5) and cosine(100) == pytest.approx(1.0)
    assert cosine(550) == pytest.approx(0.1 + 0.9 * 0.5)
    assert cosine(1000) == pytest.approx(0.1) and cosine(10**9) == pytest.approx(0.1)
    linear = examples_lr_schedule("linear", 1000)
    assert linear(0) == 1.0 and linear(250) == pytest.approx(0.75) and linear(1000) == 0.0
    assert examples_lr_schedule("constant", 10, 5)(7) == 1.0
    for args, match in ((("cosine", 0), "total_examples"), (("cosine", 10, 11), "warmup_examples"),
                        (("step", 10), "unknown learning-rate schedule shape 'step'"),
                        (("cosine", 10, 0, 1.5), "final_factor")):
        with pytest.raises(BatchlabError, match=match):
            examples_lr_schedule(*args)


def test_an_lr_schedule_in_examples_is_not_stretched_by_a_ramp():
    """The LR's shape, read at each step's examples consumed, is the same curve whether the run trains at a
    constant batch or under a ramp: the ramp takes fewer steps over the same examples, and the schedule
    ends where the examples end (a schedule in steps would be cut short: at step 100 of a 100-step
    schedule the ramped run has consumed ~3x the examples)."""
    f = examples_lr_schedule("cosine", total_examples=10_000, warmup_examples=500)
    ramp = BatchSizeSchedule(((0, 50), (2_000, 100), (6_000, 200)))

    def run(schedule):
        consumed, lrs = 0, []
        while consumed < 10_000:
            b = schedule.batch_size_at(consumed)
            lrs.append((consumed, rescaled_learning_rate(0.1, 50, b, "none") * f(consumed)))
            consumed += b
        return lrs

    constant, ramped = run(BatchSizeSchedule(((0, 50),))), run(ramp)
    assert len(ramped) < len(constant)  # fewer steps
    by_consumed = dict(constant)
    for consumed, lr in ramped:  # every ramped step sits on the constant run's curve
        assert lr == pytest.approx(by_consumed[consumed])
    assert ramped[-1][0] + ramp.batch_size_at(ramped[-1][0]) == 10_000  # and the schedule ends with the examples
