"""batchlab.probes.scoring: the fixed scoring protocol on data with known truth."""

import json
import math

import numpy as np
import pytest

from batchlab.errors import BatchlabError
from batchlab.probes.scoring import (
    BASELINES,
    Estimate,
    MeasuredUnit,
    classify,
    read_measured,
    read_measured_csv,
    score_estimates,
    score_records,
)
from batchlab.report.predictions import read_predictions, score_files

UNIT_A = "synthetic/net/sgd [sweep aaaaaaaaaaaa]"
UNIT_B = "synthetic/net/sgd [sweep bbbbbbbbbbbb]"


def _line(predictor, value, low=None, high=None, *, method="fieller", unit=None, steps_at=100, protocol=100,
          default_batch_size=32, lr=0.1, workload="synthetic/net", optimizer="sgd"):
    settings = {"batch_size": 32, "hyperparameters": {"learning_rate": lr}, "steps_at": steps_at,
                "protocol_steps_at": protocol, "default_batch_size": default_batch_size,
                "reference": {"rule": "tuned", "learning_rate": lr}}
    return json.dumps({"workload": workload, "optimizer": optimizer, "predictor": predictor,
                       "critical_batch_size": value, "low": low, "high": high, "interval_method": method,
                       "examples": 1000, "note": "", "unit": unit, "measured": 12345.0, "settings": settings})


def _records(tmp_path, lines, name="p.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return read_predictions([path])


def _units(*specs):
    return {name: MeasuredUnit(name, value, low, high, tuple(sizes)) for name, value, low, high, sizes in specs}


def test_unresolved_estimates_are_bounds_never_points():
    assert classify(100.0, 50.0, 200.0) == Estimate("point", 100.0)
    # an interval open above (|G|^2's interval includes 0; every branched multiplier passed): a lower bound,
    # whatever the point estimate says
    assert classify(2400.0, 380.0, None) == Estimate("lower_bound", 380.0)
    assert classify(None, 1700.0, None) == Estimate("lower_bound", 1700.0)
    assert classify(30.0, None, 90.0) == Estimate("upper_bound", 90.0)
    assert classify(None, None, None) == Estimate("none", None)
    assert classify(5.0, None, None) == Estimate("none", None)  # an interval unbounded both ways says nothing
    assert classify(9.0, 0.0, None) == Estimate("none", None)  # nor does [0, inf)
    assert classify(5.0, None, None, has_interval=False) == Estimate("point", 5.0)  # no interval (calibrated NQM)
    assert classify(float("nan"), 1.0, 2.0) == Estimate("none", None)


def test_known_ratios_give_the_share_and_geometric_error():
    ratios = [0.5, 1.0, 2.0, 4.0, 0.25]
    units = [MeasuredUnit(f"u{i}", 100.0, 60.0, 180.0) for i in range(5)]
    score = score_estimates("p", [(u, Estimate("point", 100.0 * r), "") for u, r in zip(units, ratios)])
    assert score.ratios == pytest.approx(ratios)
    assert (score.n_points, score.n_within) == (5, 3)  # 0.5 and 2 are hits (closed band)
    assert score.geometric_error == pytest.approx(2 ** (6 / 5))
    # consistent: inside [60 / 2, 180 * 2] = [30, 360]: not 25 (0.25x) nor 400 (4x)
    assert score.n_consistent == 3
    low, high = score.within_interval
    assert low < 0.6 < high and 0 < low and high < 1


def test_a_log_uniform_guess_over_two_decades_is_within_2x_about_30_percent():
    rng = np.random.default_rng(20240521)
    n = 20_000
    measured = 10 ** rng.uniform(1, 3, n)
    guess = measured * 10 ** rng.uniform(-1, 1, n)
    units = [MeasuredUnit(f"u{i}", m, m / 1.5, m * 1.5) for i, m in enumerate(measured)]
    score = score_estimates("guess", [(u, Estimate("point", g), "") for u, g in zip(units, guess)])
    # P(|log10 r| <= log10 2) = log10(4) / 2 = 0.301; E|ln r| = ln(10) / 2, so the geometric error is sqrt(10)
    assert score.within_share == pytest.approx(math.log10(4) / 2, abs=0.015)
    assert score.geometric_error == pytest.approx(math.sqrt(10), rel=0.02)
    low, high = score.within_interval
    assert low < math.log10(4) / 2 < high


def test_bounds_are_counted_apart_and_consistent_when_they_allow_a_value_within_2x():
    units = [MeasuredUnit(f"u{i}", 100.0, 80.0, 125.0) for i in range(4)]
    estimates = [Estimate("lower_bound", 150.0), Estimate("lower_bound", 250.0), Estimate("upper_bound", 40.0),
                 Estimate("none", None)]
    score = score_estimates("p", [(u, e, "") for u, e in zip(units, estimates)])
    assert (score.n_units, score.n_points, score.n_bounds, score.n_bounds_consistent, score.n_none) == (4, 0, 3, 1, 1)
    assert score.ratios == [] and score.within_share is None and score.geometric_error is None
    assert [u.consistent for u in score.units] == [True, False, False, None]


def test_each_predictor_on_its_own_at_the_protocol_checkpoint_beside_the_baselines(tmp_path):
    measured = _units((UNIT_A, 100.0, 70.0, 140.0, [8, 32, 128, 512]), (UNIT_B, 400.0, 300.0, 600.0, [16, 64]))
    records = _records(tmp_path, [
        _line("b_simple", 90.0, 60.0, 120.0),  # no unit: both units of the workload
        _line("b_simple", 95.0, 60.0, 120.0, steps_at=30),  # another checkpoint: never scored, even if better
        _line("b_noise", 1000.0, 500.0, None, unit=UNIT_A),  # open above: a lower bound
        _line("b_noise", 350.0, 200.0, 700.0, unit=UNIT_B),
        _line("calibrated_nqm", 250.0, method="", unit=UNIT_A),  # no interval: a point
        json.dumps({"step": 5, "workload": "synthetic/net", "optimizer": "sgd", "b_simple": 100.0, "settings": {}}),
    ])
    board = score_records(records, measured)
    assert board.units == [UNIT_A, UNIT_B]
    by = {s.predictor: s for s in board.rows}
    assert [s.predictor for s in board.predictors] == ["b_simple", "b_noise", "calibrated_nqm"]
    assert by["b_simple"].ratios == pytest.approx([0.9, 90.0 / 400.0]) and by["b_simple"].n_within == 1
    assert board.off_checkpoint == {"b_simple": [(UNIT_A, 30), (UNIT_B, 30)]}
    assert (by["b_noise"].n_points, by["b_noise"].n_bounds, by["b_noise"].n_bounds_consistent) == (1, 1, 0)
    assert by["b_noise"].ratios == pytest.approx([350.0 / 400.0])
    assert by["calibrated_nqm"].n_units == 1 and by["calibrated_nqm"].ratios == pytest.approx([2.5])
    # baselines: the default batch size 32; sqrt(8 * 512) = 64 and sqrt(16 * 64) = 32
    assert by[BASELINES[0]].ratios == pytest.approx([0.32, 0.08]) and by[BASELINES[0]].baseline
    assert by[BASELINES[1]].ratios == pytest.approx([0.64, 0.08])
    assert board.reference_rules == {"tuned": 5}  # one per scored (predictor, unit)


def test_a_unit_without_a_measured_value_or_a_record_without_a_unit_is_a_warning(tmp_path):
    measured = _units((UNIT_A, None, None, None, [8, 16]), (UNIT_B, 400.0, 300.0, 600.0, [16, 64]))
    records = _records(tmp_path, [_line("b_simple", 90.0, 60.0, 120.0),
                                  _line("b_simple", 9.0, 6.0, 12.0, unit="synthetic/net/sgd [sweep zzz]")])
    board = score_records(records, measured)
    assert board.units == [UNIT_B]
    assert any("no finite measured" in w for w in board.warnings)
    assert any("sweep zzz" in w for w in board.warnings)


def test_two_predictions_for_one_unit_at_the_checkpoint_and_an_unknown_checkpoint_are_errors(tmp_path):
    measured = _units((UNIT_A, 100.0, 70.0, 140.0, [8, 32]))
    two = _records(tmp_path, [_line("b_simple", 90.0, 60.0, 120.0, lr=0.1), _line("b_simple", 50.0, 40.0, 60.0, lr=0.3)])
    with pytest.raises(BatchlabError, match="two predictions of b_simple"):
        score_records(two, measured)
    assert score_records(two, measured, strict=False).warnings
    unknown = _records(tmp_path, [_line("b_simple", 90.0, 60.0, 120.0, protocol=None)], name="old.jsonl")
    with pytest.raises(BatchlabError, match="protocol checkpoint of workload 'synthetic/net' is unknown"):
        score_records(unknown, measured)


def test_records_without_the_protocol_fields_use_the_registered_workloads_defaults(tmp_path):
    unit = "mnist/fc_64_64_64/sgd [sweep cccccccccccc]"
    measured = _units((unit, 200.0, 150.0, 300.0, [16, 1024]))
    lines = [_line("b_simple", 150.0, 100.0, 220.0, workload="mnist/fc_64_64_64", steps_at=s, protocol=None,
                   default_batch_size=None) for s in (750, 100)]
    board = score_records(_records(tmp_path, lines), measured)  # default budget 3000: the checkpoint is 750
    (simple,) = board.predictors
    assert simple.ratios == pytest.approx([0.75]) and board.off_checkpoint == {"b_simple": [(unit, 100)]}
    assert board.baselines[0].ratios == pytest.approx([128 / 200.0])


CSV_HEADER = "unit,section,batch_size,quantity,value,lower,upper,note\n"


def test_measured_values_from_a_report_csv(tmp_path):
    path = tmp_path / "report.csv"
    path.write_text(CSV_HEADER + "".join([
        f"{UNIT_A},steps_to_result,8,n_trials,4,,,\n",
        f"{UNIT_A},steps_to_result,8,steps,400,,,\n",
        f"{UNIT_A},steps_to_result,256,n_trials,4,,,\n",
        f'{UNIT_A},critical_batch_size,,mccandlish_b_crit,120.5,80,inf,"90% profile-likelihood interval; "\n',
        f"{UNIT_A},critical_batch_size,,perfect_scaling_end,64,,,\n",
        f"{UNIT_B},critical_batch_size,,mccandlish_b_crit,,,,\n",
    ]))
    units = read_measured_csv([path])
    assert units[UNIT_A] == MeasuredUnit(UNIT_A, 120.5, 80.0, None, (8.0, 256.0), str(path))
    assert units[UNIT_B].value is None and not units[UNIT_B].scorable and units[UNIT_A].workload == "synthetic/net/sgd"
    other = tmp_path / "other.csv"
    other.write_text(CSV_HEADER + f"{UNIT_A},critical_batch_size,,mccandlish_b_crit,99,80,130,\n")
    with pytest.raises(BatchlabError, match="two measured values"):
        read_measured_csv([path, other])
    for text, message in (("a,b\n1,2\n", "is not a report CSV"), (CSV_HEADER + f"{UNIT_A},fit,,x,1,,,\n", "no critical"),
                          (CSV_HEADER + f"{UNIT_A},critical_batch_size,,mccandlish_b_crit,abc,,,\n", "line 2: value")):
        other.write_text(text)
        with pytest.raises(BatchlabError, match=message):
            read_measured_csv([other])
    with pytest.raises(BatchlabError, match="does not exist"):
        read_measured_csv([tmp_path / "missing.csv"])


def test_score_files_reads_both_and_refuses_scoring_without_measured_values(tmp_path):
    path = tmp_path / "report.csv"
    path.write_text(CSV_HEADER + f"{UNIT_A},steps_to_result,8,n_trials,4,,,\n"
                    f"{UNIT_A},steps_to_result,128,n_trials,4,,,\n"
                    f"{UNIT_A},critical_batch_size,,mccandlish_b_crit,100,70,140,\n")
    predictions = tmp_path / "p.jsonl"
    predictions.write_text(_line("branched", 128.0, 128.0, 256.0, method="bracket") + "\n")
    board = score_files([predictions], [path])
    assert board.predictors[0].ratios == pytest.approx([1.28]) and board.baselines[1].ratios == pytest.approx([0.32])
    with pytest.raises(BatchlabError, match=r"needs --measured FILE \(a report.csv or a steps-table refit .jsonl\)"):
        score_files([predictions], [])


def test_measured_values_from_a_steps_table_refit_and_by_extension(tmp_path, capsys):
    """The --json lines of `batchlab analyze critical-batch-size --steps-table FILE --group-by unit` are
    measured values too: made here by that command from a table with a known hyperbola."""
    import csv as csv_module

    from tests.cli.cli_runner import run

    table = tmp_path / "steps.csv"
    with table.open("w", newline="") as handle:
        writer = csv_module.writer(handle)
        writer.writerow(["unit", "batch_size", "steps"])
        for b in (8, 16, 32, 64, 128, 256, 512):
            writer.writerow([UNIT_A, b, int(round(100 * (1 + 64 / b) * (1.03 if b % 3 else 0.97)))])
    code, out, err = run(capsys, "analyze", "critical-batch-size", "--steps-table", table, "--group-by", "unit", "--json")
    assert code == 0, err
    refit = tmp_path / "refit.jsonl"
    refit.write_text(out)
    units = read_measured([refit])
    entry = json.loads(refit.read_text().splitlines()[0])
    interval = entry["intervals"]["mccandlish_b_crit"]
    assert units[UNIT_A] == MeasuredUnit(UNIT_A, entry["mccandlish_b_crit"], interval["low"], interval["high"],
                                         (8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0), str(refit))
    assert units[UNIT_A].value == pytest.approx(64, rel=0.25)
    for name, text, message in (("x.txt", "", "unknown kind '.txt'"), ("bad.jsonl", "{", "line 1 is not JSON"),
                                ("keys.jsonl", '{"group": "a"}', "needs the keys group and mccandlish_b_crit")):
        (tmp_path / name).write_text(text)
        with pytest.raises(BatchlabError, match=message):
            read_measured([tmp_path / name])



@pytest.mark.parametrize("line, message", [
    ('{"group": "u", "mccandlish_b_crit": 5, "intervals": [1]}', "line 1: intervals must be an object"),
    ('{"group": "u", "mccandlish_b_crit": 5, "intervals": {"mccandlish_b_crit": 3}}', "line 1: intervals must be"),
    ('{"group": "u", "mccandlish_b_crit": 5, "regimes": [5]}', "line 1: regimes must be a list of objects"),
    ('{"group": "u", "mccandlish_b_crit": 5, "regimes": {"batch_size": 8}}', "line 1: regimes must be a list"),
    ('{"group": "u", "mccandlish_b_crit": 5, "regimes": [{"batch_size": "x"}]}', "regimes batch_size is 'x'"),
    ('{"group": "u", "mccandlish_b_crit": 5, "regimes": [{"batch_size": null}]}', "regimes batch_size is None"),
    ('{"group": "u", "mccandlish_b_crit": "abc"}', "line 1: mccandlish_b_crit is 'abc'; allowed: a number or null"),
    ('{"group": "u", "mccandlish_b_crit": true}', "mccandlish_b_crit is True"),
    ('{"group": "u", "mccandlish_b_crit": 5, "intervals": {"mccandlish_b_crit": {"low": "1", "high": 9}}}',
     "intervals.mccandlish_b_crit.low is '1'"),
    ('{"group": "u", "mccandlish_b_crit": 5}\n{"group": "u", "mccandlish_b_crit": 5}',
     "line 2: group 'u' is given twice in this file \\(also line 1\\)"),
    ("", "has no record"),
    ("\n\n", "has no record"),
])
def test_a_malformed_refit_file_is_refused_in_one_line_naming_file_and_line(tmp_path, line, message):
    path = tmp_path / "refit.jsonl"
    path.write_text(line)
    with pytest.raises(BatchlabError, match=message) as info:
        read_measured([path])
    assert "\n" not in str(info.value) and "refit.jsonl" in str(info.value)


def test_a_refit_line_may_leave_b_crit_and_its_interval_null(tmp_path):
    path = tmp_path / "refit.jsonl"
    path.write_text('{"group": "u", "mccandlish_b_crit": null, "intervals": {"mccandlish_b_crit": '
                    '{"low": 4.0, "high": null}}, "regimes": [{"batch_size": 16}, {"batch_size": 8}]}\n')
    assert read_measured([path])["u"] == MeasuredUnit("u", None, 4.0, None, (8.0, 16.0), str(path))


def test_score_files_refuses_a_run_that_scores_no_unit(tmp_path):
    measured = tmp_path / "refit.jsonl"
    measured.write_text(json.dumps({"group": UNIT_B, "mccandlish_b_crit": 100.0}) + "\n")
    predictions = tmp_path / "p.jsonl"
    predictions.write_text(_line("branched", 128.0, 100.0, 256.0, method="bracket", unit=UNIT_A) + "\n")
    with pytest.raises(BatchlabError, match="--score scored no unit: predictions for .*no measured unit"):
        score_files([predictions], [measured])
    with pytest.raises(BatchlabError, match="prediction FILE '.*missing.jsonl' does not exist"):
        score_files([tmp_path / "missing.jsonl"], [measured])
