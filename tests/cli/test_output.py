"""batchlab.cli.output: valid JSON always, tables never cut, notes on stderr, output paths checked."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from batchlab.cli.output import cell, check_output_path, emit_json, fmt, json_ready, note, print_table
from batchlab.errors import BatchlabError


def test_json_ready_turns_non_finite_numpy_and_paths_into_json_types():
    value = {"a": float("inf"), "b": np.float64("nan"), "c": np.int64(3), "d": np.array([1.0, np.inf]),
             "e": Path("/x/y"), 4: (1, 2), "f": -math.inf}
    out = json_ready(value)
    assert out == {"a": None, "b": None, "c": 3, "d": [1.0, None], "e": "/x/y", "4": [1, 2], "f": None}
    json.dumps(out, allow_nan=False)


def test_emit_json_prints_one_valid_document(capsys):
    emit_json({"loss": [1.0, float("inf"), float("nan")], "step": np.int32(7)})
    text = capsys.readouterr().out
    assert text.count("\n") == 1
    assert json.loads(text) == {"loss": [1.0, None, None], "step": 7}


def test_print_table_to_a_pipe_keeps_every_cell_whole(capsys):
    name = "imagenet/resnet_50_with_a_very_long_model_name/nesterov_momentum"
    rows = [[name, 0.0123456, 128, "x" * 60] for _ in range(3)]
    print_table("a title", ["workload", "learning rate", "batch size", "notes"], rows, caption="a caption")
    out = capsys.readouterr().out
    assert out.count(name) == 3
    assert "0.01235" in out
    assert "x" * 60 in out
    assert "…" not in out


def test_note_goes_to_stderr(capsys):
    note("created a new store at /tmp/s")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "created a new store at /tmp/s\n"


def test_check_output_path_refuses_a_missing_parent(tmp_path):
    assert check_output_path(tmp_path / "new") == tmp_path / "new"
    with pytest.raises(BatchlabError, match="does not exist"):
        check_output_path(tmp_path / "missing" / "store")
    assert not (tmp_path / "missing").exists()


def test_cell_formats():
    assert fmt(None) == "" and fmt(3) == "3" and fmt(0.123456) == "0.1235" and fmt(float("inf")) == "inf"
    assert cell({"value": 2.0}) == "2" and cell(True) == "true" and cell("a/b") == "a/b"


def test_a_reader_going_away_is_a_broken_pipe_for_main_not_richs_exit_1(monkeypatch):
    # ``batchlab ... | head``: rich would exit with status 1; main() turns BrokenPipeError into a quiet 0.
    import io
    import sys

    class ClosedPipe(io.StringIO):
        def write(self, text):
            raise BrokenPipeError

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    with pytest.raises(BrokenPipeError):
        print_table("t", ["a"], [["x"]])
