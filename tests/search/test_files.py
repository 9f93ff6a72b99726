"""Search-space files (``--search-space FILE``): layouts, formats, and one line for every bad file."""

import json

import pytest

from batchlab.errors import BatchlabError
from batchlab.search import search_spaces_from_file
from batchlab.search.files import read_text

LR = {"type": "DOUBLE", "min_value": 0.01, "max_value": 1.0, "scale": "LOG"}
LR_TOML = '[learning_rate]\ntype = "DOUBLE"\nmin_value = 0.01\nmax_value = 1.0\nscale = "LOG"\n'


@pytest.mark.parametrize(
    "name, text",
    [
        ("space.json", json.dumps({"learning_rate": LR})),
        ("space.toml", LR_TOML),
        ("space.txt", "  \n" + json.dumps({"learning_rate": LR})),  # no known extension, starts with '{': JSON
        ("space", LR_TOML),  # no known extension, not '{': TOML
        ("space.json", "\ufeff" + json.dumps({"learning_rate": LR})),  # a byte-order mark is dropped
    ],
)
def test_one_space_in_json_or_toml_applies_to_the_one_optimizer(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    assert search_spaces_from_file(path, ["sgd"]) == {"sgd": {"learning_rate": LR}}  # as written


def test_spaces_keyed_by_optimizer_name_only_those_named(tmp_path):
    path = tmp_path / "spaces.toml"
    path.write_text(LR_TOML.replace("[learning_rate]", "[momentum.learning_rate]"))
    assert search_spaces_from_file(path, ["sgd", "momentum"]) == {"momentum": {"learning_rate": LR}}
    assert search_spaces_from_file(path, ["momentum"]) == {"momentum": {"learning_rate": LR}}  # a study of momentum


def _write(path, content):
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "name, content, optimizers, fragment",
    [
        ("s.toml", b'[learning_rate]\ntype = "DOUBLE" # caf\xe9\n', ["sgd"], "is not UTF-8 text (byte 0xe9 on line 2"),
        ("s.json", json.dumps({"learning_rate": LR}).encode("utf-16"), ["sgd"], "is UTF-16 text"),
        ("s.json", "", ["sgd"], "is empty; allowed: a TOML or JSON object"),
        ("s.toml", " \n\n", ["sgd"], "is empty"),
        ("s.toml", "# only a comment\n", ["sgd"], "must be an object of parameter name -> config"),
        ("s.json", "[1, 2]", ["sgd"], "must be an object of parameter name -> config"),
        ("s.json", "0.5", ["sgd"], "must be an object"),
        ("s.json", "{}", ["sgd"], "must be an object"),
        ("s.json", '{"learning_rate": ', ["sgd"], "not valid JSON"),
        ("s.toml", "[learning_rate\n", ["sgd"], "not valid TOML"),
        ("s.json", '{"learning_rate": {"type": "DOUBLE", "min_value": NaN, "max_value": 1}}', ["sgd"],
         "NaN is not JSON"),
        ("s.json", '{"learning_rate": {"type": "DOUBLE", "type": "INTEGER"}}', ["sgd"], "key 'type' given twice"),
        ("s.toml", LR_TOML.replace('"LOG"', '"CUBIC"'), ["sgd"], "parameter 'learning_rate': unknown scale 'CUBIC'"),
        ("s.toml", LR_TOML.replace("[learning_rate]", "[sgd.learning_rate]").replace('"LOG"', '"CUBIC"'),
         ["sgd"], ": sgd: parameter 'learning_rate': unknown scale 'CUBIC'"),
        ("s.toml", LR_TOML.replace("[learning_rate]", "[adam.learning_rate]"), ["sgd", "momentum"],
         "optimizer 'adam' is not searched here; allowed: sgd, momentum"),
        ("s.toml", LR_TOML, ["sgd", "momentum"], "holds one search space but 2 optimizers are searched"),
        ("s.json", '{"learning_rate": {"min_value": 0.01, "max_value": 1.0}}', ["sgd"],
         "optimizer 'learning_rate' is not searched here; allowed: sgd (a file holding one search space needs a type"),
        ("s.json", '{"learning_rate": {"type": "DOUBLE", "min_value": 0.1, "max_value": 1' + "0" * 400 + "}}", ["sgd"],
         "max_value must be a finite number, got 1000"),  # too large for a float: not an OverflowError
        ("s.toml", '[label_smoothing]\ntype = "DISCRETE"\nfeasible_points = [0.0, "0.1"]\n', ["sgd"],
         "feasible_points must be finite numbers (or null: off), got '0.1'"),
        ("missing.toml", None, ["sgd"], "does not exist"),
    ],
)
def test_a_bad_file_is_one_line_naming_it(tmp_path, name, content, optimizers, fragment):
    path = _write(tmp_path / name, content)
    with pytest.raises(BatchlabError) as info:
        search_spaces_from_file(path, optimizers)
    message = str(info.value)
    assert "\n" not in message and f"search-space file {str(path)!r}" in message
    assert fragment in message


def test_a_directory_is_not_a_file(tmp_path):
    with pytest.raises(BatchlabError, match="is a directory, not a file"):
        read_text(tmp_path, "search-space file")
