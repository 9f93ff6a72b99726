import json

import numpy as np
import pandas as pd
import pytest

from batchlab.analysis.steps_table import fit_steps_table, read_steps_table, steps_table_curves
from batchlab.errors import BatchlabError

KEYS = {"group", "s_min", "e_min", "mccandlish_b_crit", "overhead_20pct", "perfect_scaling_end",
        "maximal_parallelism_start", "residual"}


def table():
    rows = []
    for optimizer, b_crit in (("sgd", 64.0), ("momentum", 256.0)):
        for b in 2 ** np.arange(0, 12):
            rows.append({"optimizer": optimizer, "batch_size": int(b), "steps": round(1000 * (1 + b_crit / b)),
                         "lr": 0.1, "note": "x"})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_group_by_fits_one_curve_per_value(tmp_path, suffix):
    path = tmp_path / f"steps{suffix}"
    frame = table()
    frame.to_csv(path, index=False) if suffix == ".csv" else frame.to_parquet(path)
    out = fit_steps_table(path, group_by="optimizer")
    assert [r["group"] for r in out] == ["momentum", "sgd"]
    for row, b_crit in zip(out, (256.0, 64.0)):
        assert KEYS <= set(row) and row["error"] is None
        assert row["mccandlish_b_crit"] == pytest.approx(b_crit, rel=1e-2)
        assert row["s_min"] == pytest.approx(1000, rel=1e-2)
        assert row["residual"] < 1e-2 and row["b0"] == 1 and row["points_used"] == 12
    sgd = out[1]
    assert sgd["perfect_scaling_end"] == 4 and sgd["maximal_parallelism_start"] == 512
    json.dumps(out)  # JSON-ready
    with pytest.raises(BatchlabError, match=r"duplicate batch size\(s\) \[1, 2, 4"):  # both optimizers in one curve
        fit_steps_table(path)


def test_whole_table_without_group_and_censoring(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("batch_size,steps,reached,budget\n16,64000,true,\n64,16500,true,\n256,4600,true,\n"
                    "1024,,false,3000\n4096,,false,3000\n")
    (row,) = fit_steps_table(path)
    assert row["group"] is None and row["censored_batch_sizes"] == [1024, 4096]
    assert [r["regime"] for r in row["regimes"]][3:] == [None, None]
    curve = steps_table_curves(read_steps_table(path))[0][1]
    assert curve.censored_at == (None, None, None, 3000, 3000)


def test_too_few_reached_points_is_reported_per_group(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("g,batch_size,steps,budget\na,1,100,\na,2,50,\na,4,25,\nb,1,100,\nb,2,,200\n")
    out = fit_steps_table(path, group_by="g")
    assert out[0]["error"] is None and "at least 2" in out[1]["error"] and out[1]["mccandlish_b_crit"] is None


@pytest.mark.parametrize(
    "text, group_by, fragment",
    [
        ("batch_size,step\n1,10\n", None, "lacks column(s) ['steps']"),
        ("size,steps\n1,10\n", None, "lacks column(s) ['batch_size']"),
        ("batch_size,steps\n0,10\n2,5\n", None, "batch sizes must be whole numbers > 0"),
        ("batch_size,steps\n-2,10\n2,5\n", None, "batch sizes must be whole numbers > 0"),
        ("batch_size,steps\n1.5,10\n2,5\n", None, "batch sizes must be whole numbers > 0"),
        ("batch_size,steps\n1,0\n2,5\n", None, "steps must be > 0"),
        ("batch_size,steps\n1,-3\n2,5\n", None, "steps must be > 0"),
        ("batch_size,steps\n1,ten\n2,5\n", None, "column 'steps' must be numeric"),
        ("batch_size,steps,reached\n1,10,maybe\n2,5,true\n", None, "column 'reached' must be true or false"),
        ("batch_size,steps\n1,10\n2,5\n", "optimizer", "unknown group column 'optimizer'; allowed: ['batch_size', 'steps']"),
        ("g,batch_size,steps\na,1,10\na,1,5\n", "g", "duplicate batch size(s) [1] in group g='a'"),
        ("batch_size,steps\n", None, "has no rows"),
        # a batch size of 2^63 used to be accepted (and wrap around as int64); steps of 1e300 gave a traceback
        ("batch_size,steps\n9223372036854775808,10\n2,5\n", None, "batch sizes must be whole numbers > 0 and <= 2^53"),
        ("batch_size,steps\n9007199254740994,10\n2,5\n", None, "batch sizes must be whole numbers > 0 and <= 2^53"),
        ("batch_size,steps\n1,1e300\n2,5\n", None, "steps must be >= 0 and <= 2^53 (or empty), got [1e+300]"),
        ("batch_size,steps,reached\n1,-4,false\n2,5,true\n", None, "steps must be >= 0 and <= 2^53"),
        ("batch_size,steps,reached,budget\n1,,false,1e20\n2,5,true,\n", None, "budget must be >= 0 and <= 2^53"),
    ],
)
def test_bad_tables_are_one_line_errors(tmp_path, text, group_by, fragment):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(BatchlabError) as info:
        fit_steps_table(path, group_by=group_by)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_bad_paths_and_tolerance(tmp_path):
    with pytest.raises(BatchlabError, match=r"unknown format '.txt'; allowed: .csv, .parquet, .pq"):
        fit_steps_table(tmp_path / "t.txt")
    with pytest.raises(BatchlabError, match="does not exist"):
        fit_steps_table(tmp_path / "missing.csv")
    path = tmp_path / "t.csv"
    path.write_text("batch_size,steps\n1,100\n2,50\n4,30\n")
    with pytest.raises(BatchlabError, match=r"tolerance must be in \(0, 1\)"):
        fit_steps_table(path, tolerance=1.5)
    garbage = tmp_path / "g.parquet"
    garbage.write_bytes(b"not parquet")
    with pytest.raises(BatchlabError, match="cannot read steps table"):
        fit_steps_table(garbage)


def test_one_b0_for_the_fit_and_the_data_read_regimes(tmp_path):
    """Review fix: a smallest batch size whose bracket starts at 0 (an upper bound only) is not a fit
    point, so the fit (and overhead_20pct) measured from B0 = 32 while the data-read regimes were read
    from B0 = 16: perfect_scaling_end 64 printed beside b0 32 (from 32 it is 128)."""
    path = tmp_path / "z.csv"
    path.write_text("batch_size,steps,steps_lower\n16,1000,0\n32,520,500\n64,260,250\n128,140,130\n256,100,95\n")
    (group,) = fit_steps_table(path)
    assert group["b0"] == 32
    assert group["perfect_scaling_end"] == 128
    assert group["overhead_20pct"] == pytest.approx(0.2 * group["mccandlish_b_crit"] + 1.2 * 32)
    assert [r["regime"] for r in group["regimes"]][:2] == [None, "perfect_scaling"]


def test_bootstrap_reads_regimes_from_the_fits_b0():
    from batchlab.analysis.bootstrap import bootstrap_critical_batch_size

    trials = {16: np.array([1000.0]), 32: np.array([520.0]), 64: np.array([260.0]), 128: np.array([140.0]),
              256: np.array([100.0])}
    lower = {16: 0, 32: 500, 64: 250, 128: 130, 256: 95}
    summary = bootstrap_critical_batch_size(trials, n_boot=10, steps_lower=lower).to_dict()
    assert summary["b0"] == 32 and summary["data_regimes"]["b0"] == 32
    assert summary["critical_batch_sizes"]["perfect_scaling_end"]["value"] == 128


@pytest.mark.parametrize("data, fragment", [
    ("batch_size,steps,g\n1,10,\xe9\n2,5,\xe9\n".encode("latin-1"), "is not UTF-8 text (byte 0xe9 on line 2"),
    ("batch_size,steps\n1,10\n2,5\n".encode("utf-16"), "is UTF-16 text"),
    (bytes(range(256)), "holds NUL bytes"),
])
def test_a_steps_table_in_another_encoding_is_one_line(tmp_path, data, fragment):
    path = tmp_path / "t.csv"
    path.write_bytes(data)
    with pytest.raises(BatchlabError) as info:
        fit_steps_table(path)
    assert fragment in str(info.value) and str(info.value).isprintable()


def test_an_infinite_steps_value_means_not_reached(tmp_path):
    infinite, empty = tmp_path / "inf.csv", tmp_path / "empty.csv"
    infinite.write_text("batch_size,steps,budget\n1,100,\n2,50,\n4,30,\n8,inf,40\n")
    empty.write_text("batch_size,steps,budget\n1,100,\n2,50,\n4,30,\n8,,40\n")
    (entry,) = fit_steps_table(infinite)
    assert entry["regimes"][-1] == {"batch_size": 8, "steps": None, "regime": None} and entry["points_used"] == 3
    assert entry["censored_batch_sizes"] == [8]
    assert entry == fit_steps_table(empty)[0]  # the same path: an empty cell


def noisy_table(path, b_crit=64.0, s_min=1000.0, noise=0.1, seed=3, extra_columns=""):
    rng = np.random.default_rng(seed)
    sizes = 2 ** np.arange(0, 12)
    steps = np.round(s_min * (1 + b_crit / sizes) * np.exp(noise * rng.standard_normal(sizes.size))).astype(int)
    path.write_text("batch_size,steps\n" + "".join(f"{b},{s}\n" for b, s in zip(sizes, steps)))
    return path, sizes, steps


def test_each_fit_value_has_its_profile_likelihood_interval(tmp_path):
    """Issue 21, item 8: --steps-table printed no intervals although its help said so. Known truth:
    a hyperbola B_crit 64, S_min 1000 with 10% scatter; the intervals are those analyze gives a store
    whose batch sizes hold one trial each (bootstrap_critical_batch_size: the same fit, another path)."""
    from batchlab.analysis.bootstrap import bootstrap_critical_batch_size

    path, sizes, steps = noisy_table(tmp_path / "t.csv")
    (entry,) = fit_steps_table(path)
    intervals = entry["intervals"]
    assert set(intervals) == {"s_min", "e_min", "mccandlish_b_crit", "overhead_20pct", "fit_perfect_scaling_end",
                              "fit_maximal_parallelism_start"}
    b_crit = intervals["mccandlish_b_crit"]
    assert b_crit["low"] < 64 < b_crit["high"] and b_crit["low"] < entry["mccandlish_b_crit"] < b_crit["high"]
    assert intervals["s_min"]["low"] < 1000 < intervals["s_min"]["high"]
    assert entry["interval"]["level"] == 0.9 and "profile likelihood" in entry["interval"]["method"]
    store_like = bootstrap_critical_batch_size({int(b): np.array([float(s)]) for b, s in zip(sizes, steps)}, n_boot=1)
    for name, (low, high) in store_like.intervals.items():
        if name in intervals:
            assert intervals[name]["low"] == pytest.approx(low, rel=1e-9)
            assert intervals[name]["high"] == pytest.approx(high, rel=1e-9)
    wider = fit_steps_table(path, level=0.99)[0]["intervals"]["mccandlish_b_crit"]
    assert wider["low"] < b_crit["low"] and wider["high"] > b_crit["high"]
    json.dumps(entry)


def test_two_points_have_no_interval_and_say_why(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("batch_size,steps\n1,1000\n16,100\n")
    (entry,) = fit_steps_table(path)
    assert entry["intervals"]["mccandlish_b_crit"] == {"low": None, "high": None}
    assert "no residual degrees of freedom" in entry["interval"]["note"]


def test_an_unreached_row_takes_its_steps_as_the_bound_where_its_budget_is_empty(tmp_path):
    """Issue 21, item 8: with a budget column, an unreached row whose budget cell was empty was dropped
    silently even where its steps (the steps it ran) were given."""
    path = tmp_path / "t.csv"
    path.write_text("batch_size,steps,reached,budget\n16,64000,true,\n64,16500,true,\n256,4600,true,\n"
                    "1024,3000,false,\n4096,,false,2500\n")
    (entry,) = fit_steps_table(path)
    assert entry["censored_batch_sizes"] == [1024, 4096]
    assert steps_table_curves(read_steps_table(path))[0][1].censored_at == (None, None, None, 3000, 2500)


def test_pass_through_columns_are_copied_per_batch_size(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("batch_size,steps,n_trials,second_steps\n1,1000,4,1100\n4,300,4,\n16,120,2,inf\n64,70,1,\n")
    (entry,) = fit_steps_table(path)
    assert [(r["n_trials"], r["second_steps"]) for r in entry["regimes"]] == [(4, 1100), (4, None), (2, None), (1, None)]
    assert "n_trials" not in fit_steps_table(noisy_table(tmp_path / "u.csv")[0])[0]["regimes"][0]


@pytest.mark.parametrize(
    "text, fragment",
    [
        # issue 21, item 8: rows that were dropped silently, or rounded to 0 steps ("goal met at step 0")
        ("batch_size,steps\n1,100\n2,50\n4,\n8,\n", "unreached row(s) 3, 4 (batch size(s) [4, 8]) have no budget > 0: "
                                                      "add a 'budget' column"),
        ("batch_size,steps,reached,budget\n1,100,true,\n2,,false,\n4,30,true,\n", "unreached row(s) 2 (batch size(s) [2])"),
        ("batch_size,steps\n1,100\n2,0.4\n4,30\n", "steps must be whole numbers (steps count updates), got [0.4] in row(s) 2"),
        ("batch_size,steps\n1,100.5\n2,50\n4,30.25\n", "got [100.5, 30.25] in row(s) 1, 3"),
        ("batch_size,steps,reached,budget\n1,100,true,\n2,,false,2.5\n", "budget must be whole numbers"),
        ("batch_size,steps,steps_lower\n1,100,90.5\n2,50,40\n", "steps_lower must be whole numbers"),
        ("batch_size,steps,n_trials\n1,100,0\n2,50,3\n", "n_trials must be >= 1 (or empty), got [0.0] in row(s) 1"),
        ("batch_size,steps,n_trials\n1,100,2.5\n2,50,3\n", "n_trials must be whole numbers"),
        ("batch_size,steps,second_steps\n1,100,90\n2,50,60\n", "second_steps must be >= steps where the goal was "
                                                                 "reached (and empty where it was not), got [90.0] in row(s) 1"),
        ("batch_size,steps,reached,budget,second_steps\n1,100,true,,\n2,,false,80,90\n", "got [90.0] in row(s) 2"),
        # the tuning flags' columns (issue 21)
        ("batch_size,steps,n_trials,n_reached\n1,100,3,4\n2,50,3,1\n", "n_reached must be >= 1 where the goal was "
         "reached, 0 where it was not, and at most n_trials (or empty), got [4.0] in row(s) 1"),
        ("batch_size,steps,n_reached\n1,100,0\n2,50,1\n", "got [0.0] in row(s) 1"),
        ("batch_size,steps,reached,budget,n_reached\n1,100,true,,1\n2,,false,80,1\n", "got [1.0] in row(s) 2"),
        ("batch_size,steps,n_reached\n1,100,1.5\n2,50,1\n", "n_reached must be whole numbers"),
        ("batch_size,steps,learning_rate\n1,100,fast\n2,50,0.1\n", "column 'learning_rate' must be numeric"),
    ],
)
def test_unbounded_and_fractional_rows_are_one_line_errors_naming_the_rows(tmp_path, text, fragment):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(BatchlabError) as info:
        fit_steps_table(path)
    assert fragment in str(info.value) and "\n" not in str(info.value)


# --- trial columns: the trials' scatter and the tuning flags (issue 21) ---------------------------

GRID = np.unique(np.round(np.geomspace(1, 1e7, 400)))  # a ~4% evaluation grid: steps are evaluation steps


def trials_and_table(path, k=4, noise=0.2, seed=0, budget=900):
    """Known truth S(B) = 1000 (1 + 64 / B), B = 1..2048, ``k`` trials per batch size, each trial's first
    step the truth times exp(Exponential(noise)) on GRID, any step beyond ``budget`` at B >= 1024 not
    reached; returns the trials, brackets and budgets for bootstrap_critical_batch_size and writes
    the steps table of the same best two (``path``)."""
    rng = np.random.default_rng(seed)
    trials, lower, censored, lines = {}, {}, {}, []
    for b in 2 ** np.arange(0, 12):
        raw = 1000 * (1 + 64 / b) * np.exp(rng.exponential(noise, size=k))
        steps = GRID[np.searchsorted(GRID, raw)]
        if b >= 1024:
            steps = np.where(steps > budget, np.inf, steps)
        trials[int(b)] = steps
        best, second = np.sort(steps)[:2]
        if np.isfinite(best):
            lower[int(b)] = int(GRID[np.searchsorted(GRID, best) - 1])
            lines.append(f"{b},{int(best)},{lower[int(b)]},true,,{k},{int(second) if np.isfinite(second) else ''}")
        else:
            censored[int(b)] = budget
            lines.append(f"{b},,,false,{budget},{k},")
    path.write_text("batch_size,steps,steps_lower,reached,budget,n_trials,second_steps\n" + "\n".join(lines) + "\n")
    return trials, lower, censored


def test_trial_columns_give_the_fit_a_store_with_those_trials_gets(tmp_path):
    """Issue 21: a steps table with n_trials and second_steps enters the trials' scatter (from each
    batch size's best two) as a store holding those trials does; the fit, B_crit and every interval are
    bootstrap_critical_batch_size's on trial arrays whose best two are the table's values (the same
    fit, reached through another path: equal to 1e-12)."""
    from batchlab.analysis.bootstrap import bootstrap_critical_batch_size

    path = tmp_path / "t.csv"
    trials, lower, censored = trials_and_table(path)
    assert censored  # a censored batch size takes part under the same scatter
    store = bootstrap_critical_batch_size(trials, n_boot=1, steps_lower=lower, censored_at=censored)
    (entry,) = fit_steps_table(path)
    assert entry["interval"]["scatter_source"] == store.fit.scatter_source == "trials"
    assert entry["interval"]["trials_scatter"] == store.interval_notes["mccandlish_b_crit"]["trials_scatter"]
    assert entry["mccandlish_b_crit"] == pytest.approx(store.estimates["mccandlish_b_crit"], rel=1e-12)
    for name, bounds in entry["intervals"].items():
        assert [bounds["low"], bounds["high"]] == pytest.approx(list(store.intervals[name]), rel=1e-12)
    assert entry["censored_batch_sizes"] == sorted(censored) and entry["misfit"] == store.fit.misfit
    b_crit = entry["intervals"]["mccandlish_b_crit"]
    assert b_crit["low"] < 64 < b_crit["high"]  # the known truth is inside
    # without the trial columns the same points get the floor's or the residuals' scatter: another fit
    frame = pd.read_csv(path).drop(columns=["n_trials", "second_steps"])
    frame.to_csv(tmp_path / "bare.csv", index=False)
    (bare,) = fit_steps_table(tmp_path / "bare.csv")
    assert bare["interval"]["scatter_source"] != "trials" and bare["interval"]["trials_scatter"] is None
    assert bare["intervals"]["mccandlish_b_crit"] != b_crit


def flagged_table(path, drop=()):
    """Known truth S(B) = 1000 (1 + 64 / B), B = 1..1024, 4 trials each, second-best 10% slower; B = 8
    under-tuned (1.5x its steps: better than perfect scaling beside B = 16), B = 32 and 64 sharing their
    best learning rate, B = 256 resting on 1 of its 4 trials. Rows at ``drop`` left out."""
    lines = []
    for i, b in enumerate(2 ** np.arange(0, 11)):
        if b in drop:
            continue
        steps = round(1000 * (1 + 64 / b) * (1.5 if b == 8 else 1.0))
        lr = 0.1 if b in (32, 64) else 0.001 * (i + 1)
        lines.append(f"{b},{steps},4,{1 if b == 256 else 4},{round(1.1 * steps)},{lr},0.9")
    path.write_text("batch_size,steps,n_trials,n_reached,second_steps,learning_rate,momentum\n" + "\n".join(lines) + "\n")
    return path


def test_tuning_flags_and_b_crit_without_the_flagged_points(tmp_path):
    """Issue 21: with n_trials and n_reached (and the best trial's learning_rate) each group gets its
    tuning flags and B_crit with and without the flagged batch sizes, the keys a store's analysis emits.
    Known truth: a hyperbola with B_crit 64 and one under-tuned point; without the flagged points the fit
    is the table without those rows (another path, equal to 1e-12) and recovers B_crit 64."""
    from batchlab.analysis.tuning_flags import POINT_KINDS

    (entry,) = fit_steps_table(flagged_table(tmp_path / "t.csv"))
    flags = [(f["kind"], f["batch_size"]) for f in entry["tuning_flags"]]
    assert flags == [("better_than_perfect_scaling", 8), ("shared_grid_point", 32), ("shared_grid_point", 64),
                     ("one_reaching_trial", 256)]
    effect = entry["flagged_fit_effect"]
    assert effect["left_out"] == [8, 32, 64, 256] and effect["all_points"]["b_crit"] == entry["mccandlish_b_crit"]
    assert effect["all_points"]["low"] == entry["intervals"]["mccandlish_b_crit"]["low"]
    assert effect["text"].startswith("B_crit ") and "without the flagged B = 8, 32, 64, 256" in effect["text"]
    (kept,) = fit_steps_table(flagged_table(tmp_path / "kept.csv", drop=(8, 32, 64, 256)))
    without, kept_interval = effect["without_flagged"], kept["intervals"]["mccandlish_b_crit"]
    assert without["b_crit"] == pytest.approx(kept["mccandlish_b_crit"], rel=1e-12)
    assert [without["low"], without["high"]] == pytest.approx([kept_interval["low"], kept_interval["high"]], rel=1e-12)
    assert effect["without_flagged"]["b_crit"] == pytest.approx(64, rel=1e-3)
    assert abs(np.log(entry["mccandlish_b_crit"] / 64)) > 0.05  # the under-tuned point moves the full fit
    points = entry["point_flagged_fit_effect"]
    assert points["leave_out"] == list(POINT_KINDS) and points["left_out"] == [8, 256]
    json.dumps(entry)


def test_tuning_flags_need_both_trial_counts(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("batch_size,steps,n_trials\n1,1000,4\n4,300,4\n16,120,1\n")
    (entry,) = fit_steps_table(path)
    assert entry["tuning_flags"] is None and entry["flagged_fit_effect"] is None
    path.write_text("batch_size,steps,n_trials,n_reached\n1,1000,4,4\n4,300,4,\n16,120,1,1\n")
    (entry,) = fit_steps_table(path)
    assert entry["tuning_flags"] is None
    assert "no tuning flags: n_trials or n_reached is empty at B = [4]" in entry["warnings"]


def test_steps_table_text_prints_the_tuning_flags_as_warnings(capsys, tmp_path):
    from batchlab.cli import main

    main(["analyze", "critical-batch-size", "--steps-table", str(flagged_table(tmp_path / "t.csv"))])
    out = capsys.readouterr().out
    assert "warning: tuning flag: batch size 8: S(16) x 16 = 80000 examples < S(8) x 8 = 108000" in out
    assert "warning: tuning flag: batch size 256: steps to result 1250 rests on 1 of 4 trials" in out
    assert "warning: tuning flags: B_crit " in out and "without the flagged B = 8, 32, 64, 256" in out
    assert ("warning: tuning flags (better_than_perfect_scaling and one_reaching_trial only): " in out
            and "without the flagged B = 8, 256" in out)


def test_a_parquet_table_with_a_duplicate_index_is_read_by_position(tmp_path):
    parts = [table()[table()["optimizer"] == o].reset_index(drop=True) for o in ("sgd", "momentum")]
    frame = pd.concat(parts)  # index 0..11 twice
    assert frame.index.duplicated().any()
    frame.to_parquet(tmp_path / "dup.parquet")
    frame.to_csv(tmp_path / "same.csv", index=False)
    read = read_steps_table(tmp_path / "dup.parquet")
    assert read.index.tolist() == list(range(24))
    dup = fit_steps_table(tmp_path / "dup.parquet", group_by="optimizer")
    same = fit_steps_table(tmp_path / "same.csv", group_by="optimizer")
    assert [g["mccandlish_b_crit"] for g in dup] == pytest.approx([g["mccandlish_b_crit"] for g in same], rel=1e-9)


@pytest.mark.parametrize("text", ["batch_size,steps,reached\n1,100,true\n2,50,true\n4,0,false\n",
                                  "batch_size,steps,budget\n1,100,\n2,50,\n4,,0\n"])
def test_an_unreached_row_with_a_zero_bound_is_an_error_not_dropped(tmp_path, text):
    path = tmp_path / "zero.csv"
    path.write_text(text)
    with pytest.raises(BatchlabError, match=r"unreached row\(s\) 3 \(batch size\(s\) \[4\]\) have no budget > 0"):
        fit_steps_table(path)


def test_a_failed_group_has_the_same_keys_as_a_fitted_one(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("g,batch_size,steps\na,1,100\na,2,50\na,4,30\nb,1,100\n")
    fitted, failed = fit_steps_table(path, group_by="g")
    assert failed["error"] and set(failed) == set(fitted)
    assert failed["regimes"] == [] and failed["warnings"] == [] and failed["interval"] is None


def test_a_reached_rows_budget_censors_its_unreached_second_trial_in_the_scatter(tmp_path):
    from batchlab.analysis.steps_table import table_scatter

    path = tmp_path / "t.csv"
    path.write_text("batch_size,steps,n_trials,second_steps,budget\n1,1000,2,1200,\n2,500,2,,750\n4,300,2,,\n")
    rows = read_steps_table(path)
    est = table_scatter(rows)
    # B = 1: an event, log 1.2; B = 2: censored at its budget, exposure log 1.5; B = 4: no budget, left out
    assert est.tail_scale == pytest.approx(np.log(1.2) + np.log(1.5), rel=1e-12)
    assert (est.n_studies, est.n_censored, est.n_dropped) == (1, 1, 1)
