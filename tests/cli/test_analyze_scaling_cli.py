"""``batchlab analyze scaling``: B_crit and S_min against size across a steps table's groups; bad input."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from test_scaling import EXPONENT, write_table  # noqa: E402

from cli_runner import run  # noqa: E402


def test_scaling_json_and_text(capsys, tmp_path):
    table = write_table(tmp_path / "scaling.csv")
    code, out, err = run(capsys, "analyze", "scaling", "--steps-table", table, "--group-by", "model", "--x", "params",
                         "--at", "3e7,1e10", "--bootstrap", "200", "--json")
    assert code == 0, err
    (result,) = [json.loads(text) for text in out.splitlines()]
    fit = result["fits"]["mccandlish_b_crit"]
    assert fit["exponent"]["low"] < EXPONENT < fit["exponent"]["high"] and fit["bootstrap"]["n_boot"] == 200
    assert [p["extrapolated"] for p in fit["predictions"]] == [False, True]
    code, out, err = run(capsys, "analyze", "scaling", "--steps-table", table, "--group-by", "model", "--x", "params",
                         "--at", "1e10")
    assert code == 0, err
    text = " ".join(out.split())
    assert "B_crit = c * params^b: b = " in text and "S_min = c * params^b: b = " in text
    assert "90% intervals" in text and "parametric bootstrap check of b" in text and "extrapolated" in text
    assert "t quantile, 3 dof" in text


def test_the_group_column_may_be_the_size(capsys, tmp_path):
    table = write_table(tmp_path / "scaling.csv")
    code, out, err = run(capsys, "analyze", "scaling", "--steps-table", table, "--group-by", "params", "--x", "params",
                         "--json")
    assert code == 0, err
    assert [g["group"] for g in json.loads(out)["groups"]] == [1e6, 4e6, 1.6e7, 6.4e7, 2.56e8]


@pytest.mark.parametrize(
    "sizes, extra, x, options, fragment",
    [
        ((1e6,), None, "params", (), "need at least 2 groups to fit a power law across groups, got 1 (model=m0)"),
        ((1e6, 1e7), ["m9,big,4,100"], "params", (), "size column 'params' must be numeric"),
        ((1e6, 1e7), ["m1,2e7,4,100"], "params", (), "size column 'params' is not constant within group(s) model=m1"),
        ((1e6, 1e7), ["m9,0,4,100"], "params", (), "size column 'params' must be > 0"),
        ((1e6, 1e7), ["m9,-1,4,100"], "params", (), "size column 'params' must be > 0"),
        ((1e6, 1e7), None, "size", (), "unknown --x column 'size'"),
        ((1e6, 1e7), None, "params", ("--at", "0"), "sizes to predict at must be finite numbers > 0"),
        ((1e6, 1e7), None, "params", ("--level", "1.5"), "--level must be in (0, 1)"),
        ((1e6, 1e7), ["m9,1e8,4,"], "params", (), "unreached row(s) "),
    ],
)
def test_bad_scaling_input_is_one_line_exit_2_and_writes_nothing(capsys, tmp_path, sizes, extra, x, options, fragment):
    table = write_table(tmp_path / "bad.csv", sizes=sizes, extra=extra)
    before = sorted(tmp_path.iterdir())
    code, out, err = run(capsys, "analyze", "scaling", "--steps-table", table, "--group-by", "model", "--x", x,
                         *options, "--json")
    assert (code, out) == (2, "") and err.startswith("error: ") and err.count("\n") == 1 and fragment in err
    assert "Traceback" not in err and sorted(tmp_path.iterdir()) == before
