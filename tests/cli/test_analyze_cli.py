"""``batchlab analyze ...`` on a store imported from a release-format tree written here."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from analysis_fixtures import trial, write_release  # noqa: E402

from batchlab.cli import main  # noqa: E402
from cli_runner import run  # noqa: E402

W = "mnist/simple_cnn_base/nesterov_momentum"
E = "val/classification_error"


def rows(pairs):
    return [(step, {E: value, "val/cross_entropy_error": 2 * value}) for step, value in pairs]


def build_trials():
    trials = []
    for b in (1, 2, 4, 8, 16, 32, 64, 128):
        s = int(500 * (1 + 16 / b))
        for t, slowdown in ((1, 1.3), (2, 1.0), (3, 1.1)):
            hit = int(s * slowdown)
            trials.append(trial(W, b, t, rows([(hit // 3, 0.5), (hit, 0.008), (hit * 2, 0.004)]),
                                learning_rate=0.01 * b ** 0.5 * t, momentum=0.9))
    # B=256 never reaches the goal; its only trial was evaluated up to step 200 (censored: S > 200).
    trials.append(trial(W, 256, 1, rows([(100, 0.5), (200, 0.02)]), learning_rate=1.0, momentum=0.9))
    return trials


# The fixture is an imported release with 3 trials per batch size: fewer than the paper's 100 that
# ``--max-trials auto`` (the default) asks for there, so most tests use every trial.
ALL = ("--max-trials", "all")


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    root = write_release(tmp_path_factory.mktemp("release") / "batch_science", build_trials())
    path = tmp_path_factory.mktemp("store") / "store"
    main(["import", "batch-science", str(root), "--store", str(path), "--json"])
    return path


def test_steps_to_result_json_lines(capsys, store_dir):
    code, out, err = run(capsys, "analyze", "steps-to-result", "--store", str(store_dir), "--workload", W,
                         "--metric", E, "--goal", "0.01", *ALL, "--json")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [d["batch_size"] for d in lines] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    first = lines[0]
    assert first["steps"] == 500 * 17 and first["reached"] is True and first["trial_id"] == 2
    assert first["parameters"] == {"learning_rate": 0.02, "momentum": 0.9}
    assert first["effective_learning_rate"] == pytest.approx(0.2)
    # the bracket: the three trials reach at 8500, 9350, 11050 after evaluations at a third of that.
    assert (first["steps_lower"], first["censored_at"]) == (8500 // 3, None)
    assert first["max_trials"] is None and first["mixed_studies"] is False and len(first["study_ids"]) == 1
    assert lines[-1]["steps"] is None and lines[-1]["reached"] is False and lines[-1]["trial_id"] is None
    assert (lines[-1]["steps_lower"], lines[-1]["censored_at"]) == (None, 200)


def test_steps_to_result_options_reach_the_analysis(capsys, store_dir):
    base = ["analyze", "steps-to-result", "--store", str(store_dir), "--workload", W, "--metric", E, "--json", *ALL]
    code, out, _ = run(capsys, *base, "--goal", "0.01", "--max-trials", "1")
    assert json.loads(out.splitlines()[0])["trial_id"] == 1 and json.loads(out.splitlines()[0])["max_trials"] == 1
    code, out, _ = run(capsys, *base, "--goal", "0.01", "--step-budget", "8000")
    assert [json.loads(line)["steps"] for line in out.splitlines()][:2] == [None, 4500]
    code, out, _ = run(capsys, *base, "--goal", "0.01", "--example-budget", "8500")
    assert json.loads(out.splitlines()[0])["steps"] == 8500
    code, out, _ = run(capsys, *base, "--goal", "0.3", "--maximize")
    assert json.loads(out.splitlines()[0])["steps"] == 500 * 17 // 3  # 0.5 > 0.3 at the first evaluation
    code, out, _ = run(capsys, *base, "--goal", "0.01", "--status", "COMPLETE", "--status", "INCOMPLETE")
    assert code == 0


def test_steps_to_result_table(capsys, store_dir):
    code, out, _ = run(capsys, "analyze", "steps-to-result", "--store", str(store_dir), "--workload", W,
                       "--metric", E, "--goal", "0.01", *ALL)
    assert code == 0 and "not reached" in out and "8500" in out and "effective lr" in out
    assert "(2833, 8500]" in out and "> 200" in out
    assert "every selected trial per batch size" in out and "statuses COMPLETE, STOPPED_AT_GOAL" in out


def test_critical_batch_size_json_and_table(capsys, store_dir):
    args = ["analyze", "critical-batch-size", "--store", str(store_dir), "--workload", W, "--metric", E,
            "--goal", "0.01", "--bootstrap", "50", "--seed", "1", *ALL]
    code, out, err = run(capsys, *args, "--json")
    assert code == 0, err
    (line,) = out.splitlines()
    summary = json.loads(line)
    b_crit = summary["critical_batch_sizes"]["mccandlish_b_crit"]
    assert b_crit["value"] == pytest.approx(16.0, rel=0.1)
    assert summary["selection"]["goal"] == 0.01 and summary["selection"]["max_trials"] == "all"
    assert summary["selection"]["max_trials_used"] is None and summary["selection"]["mixed_studies"] is False
    assert [r["batch_size"] for r in summary["regimes"]][-1] == 256
    brackets = {r["batch_size"]: r for r in summary["brackets"]}
    assert (brackets[1]["steps_lower"], brackets[1]["steps"], brackets[256]["censored_at"]) == (2833, 8500, 200)
    # B = 256 has one trial: flagged, and B_crit is shown without it too (docs/methods.md, "Tuning flags")
    assert [(f["kind"], f["batch_size"]) for f in summary["tuning_flags"]] == [("one_reaching_trial", 256)]
    effect = summary["flagged_fit_effect"]
    assert effect["left_out"] == [256] and 256 not in effect["without_flagged"]["batch_sizes"]
    assert effect["all_points"]["b_crit"] == pytest.approx(b_crit["value"])
    code, out, _ = run(capsys, *args)
    assert "warning: tuning flag: batch size 256: its censoring (not reached) rests on its only trial" in out
    assert code == 0 and "mccandlish_b_crit" in out and "overhead_20pct" in out
    assert "rests on: measured batch sizes 1..128" in out and "B0 = 1" in out and "trials: every selected trial" in out


@pytest.mark.parametrize("tolerance", ["0", "1", "1.5", "-0.1"])
def test_tolerance_outside_zero_one_is_one_line_exit_2(capsys, store_dir, tolerance):
    code, out, err = run(capsys, "analyze", "critical-batch-size", "--store", str(store_dir), "--workload", W,
                         "--metric", E, "--goal", "0.01", *ALL, "--tolerance", tolerance, "--json")
    assert (code, out) == (2, "") and err.startswith("error: --tolerance must be in (0, 1)") and err.count("\n") == 1


def test_tolerance_reaches_the_analysis(capsys, store_dir):
    code, out, err = run(capsys, "analyze", "critical-batch-size", "--store", str(store_dir), "--workload", W,
                         "--metric", E, "--goal", "0.01", *ALL, "--bootstrap", "20", "--tolerance", "0.25", "--json")
    assert code == 0, err
    assert json.loads(out)["tolerance"] == 0.25


def test_release_workloads_default_to_the_papers_first_n(capsys, store_dir):
    for command in ("steps-to-result", "critical-batch-size"):
        code, out, err = run(capsys, "analyze", command, "--store", str(store_dir), "--workload", W,
                             "--metric", E, "--goal", "0.01", "--json")
        assert (code, out) == (2, "") and err.count("\n") == 1
        assert "batch size 1 has 3 trials" in err and "the paper's first 100" in err and "--max-trials all" in err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--workload", "mnist/simple_cnn_base/nesterov", "--metric", E], "unknown workload 'mnist/simple_cnn_base/nesterov'"),
        (["--workload", W, "--metric", "val/accuracy"], "unknown metric 'val/accuracy'"),
        (["--workload", W, "--metric", E, "--status", "DONE"], "unknown trial status 'DONE'"),
        (["--workload", W, "--metric", E, "--max-trials", "0"], "--max-trials"),
        (["--workload", W, "--metric", E, "--max-trials", "many"], "--max-trials must be a positive integer, 'all' or 'auto'"),
        (["--workload", W, "--metric", E, "--study", "nope"], "unknown study 'nope'"),
    ],
)
def test_bad_selection_is_one_line_exit_2(capsys, store_dir, extra, message):
    for command in ("steps-to-result", "critical-batch-size"):
        code, out, err = run(capsys, "analyze", command, "--store", str(store_dir), "--goal", "0.01", *ALL, *extra)
        assert code == 2 and out == ""
        assert err.startswith("error: ") and message in err and err.strip().count("\n") == 0


def test_unknown_names_list_what_exists(capsys, store_dir):
    _, _, err = run(capsys, "analyze", "steps-to-result", "--store", str(store_dir), "--workload", "x/y/z",
                    "--metric", E, "--goal", "0.01")
    assert f"known: {W}" in err
    _, _, err = run(capsys, "analyze", "steps-to-result", "--store", str(store_dir), "--workload", W,
                    "--metric", "val/acc", "--goal", "0.01")
    assert "known: val/classification_error, val/cross_entropy_error" in err


def test_negative_bootstrap_seed_is_one_line_exit_2(capsys, store_dir):
    code, out, err = run(capsys, "analyze", "critical-batch-size", "--store", str(store_dir), "--workload", W,
                         "--metric", E, "--goal", "0.01", *ALL, "--bootstrap", "5", "--seed", "-1", "--json")
    assert (code, out) == (2, "") and err == "error: seed must be an integer >= 0, got -1\n"


def test_empty_store_says_it_has_no_workloads(capsys, tmp_path):
    from batchlab.store import Store

    Store.open(tmp_path / "empty", create=True)
    code, out, err = run(capsys, "analyze", "steps-to-result", "--store", str(tmp_path / "empty"), "--workload", W,
                         "--metric", E, "--goal", "0.01")
    assert (code, out) == (2, "") and err.count("\n") == 1 and "the store has no workloads yet" in err


def test_too_few_reached_batch_sizes(capsys, store_dir):
    code, out, err = run(capsys, "analyze", "critical-batch-size", "--store", str(store_dir), "--workload", W,
                         "--metric", E, "--goal", "0.001", *ALL, "--json")
    assert code == 2 and out == "" and "need at least 2" in err


def test_missing_store_as_a_process(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "batchlab", "analyze", "steps-to-result", "--store", str(tmp_path / "none"),
         "--workload", W, "--metric", E, "--goal", "0.01", "--json"],
        capture_output=True, text=True,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: no batchlab store") and "Traceback" not in result.stderr


# --- studies, stop at goal, paper trial counts, steps tables --------------------------------------

SGD = "mnist/fc_64_64_64/sgd"


def record(trial_id, batch_size, pairs, definition, status="COMPLETE"):
    from batchlab.store.writer import TrialRecord

    return TrialRecord(
        workload=SGD, batch_size=batch_size, trial_id=trial_id, trial_key=f"{SGD}/{batch_size}/{trial_id}",
        parameters={"learning_rate": 0.1 * trial_id}, status=status, steps=max(s for s, _ in pairs),
        measurements=[(s, E, v) for s, v in pairs], study_definition=definition,
    )


@pytest.fixture(scope="module")
def studies_store(tmp_path_factory):
    """B=64 holds a 3000-step train and a 100-step sweep (two study definitions); B=128 only the
    sweep; B=32 a study whose trials stop at error < 0.02."""
    from batchlab.store import Store
    from batchlab.store.studies import make_study_definition, study_id
    from batchlab.store.writer import publish_trials

    train = make_study_definition(workload=SGD, batch_size=64, train_steps=3000, train_examples=55000)
    sweep = dict(train_steps=100, train_examples=2000, sweep="sweep-a")
    sweep64 = make_study_definition(workload=SGD, batch_size=64, **sweep)
    sweep128 = make_study_definition(workload=SGD, batch_size=128, **sweep)
    stop = make_study_definition(workload=SGD, batch_size=32, train_steps=1000,
                                 stop_rule={"metric": E, "goal": 0.02, "maximize": False})
    path = tmp_path_factory.mktemp("studies") / "store"
    store = Store.open(path, create=True)
    publish_trials(store, [
        record(1, 64, [(100, 0.5), (1680, 0.008)], train),
        record(2, 64, [(10, 0.5), (90, 0.5)], sweep64),
        record(3, 64, [(10, 0.5), (60, 0.5)], sweep64),
        record(1, 128, [(10, 0.5), (80, 0.009)], sweep128),
        record(1, 32, [(10, 0.5), (400, 0.015)], stop, status="STOPPED_AT_GOAL"),
    ])
    ids = {"train": study_id(train), "sweep64": study_id(sweep64), "sweep128": study_id(sweep128), "stop": study_id(stop)}
    return path, ids


def test_a_train_run_and_a_sweep_give_one_labelled_result_each(capsys, studies_store):
    """The documented workflow: a store holding a train run, a sweep and a stop-at-goal study at one
    workload answers one labelled result per unit (study group), never pooled and never refused as
    "trials from 2 studies"; a unit that cannot answer the goal is one warning line, not the whole run."""
    path, ids = studies_store
    base = ["analyze", "steps-to-result", "--store", str(path), "--workload", SGD, "--metric", E, "--goal", "0.01"]
    code, out, err = run(capsys, *base, "--json")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    errors = [d for d in lines if "error" in d]
    by_unit = {}
    for d in lines:
        if "error" not in d:
            by_unit.setdefault(d["unit"], []).append((d["batch_size"], d["steps"], d["study_ids"]))
    assert by_unit[f"{SGD} [sweep sweep-a]"] == [(64, None, [ids["sweep64"]]), (128, 80, [ids["sweep128"]])]
    (train_unit,) = [u for u, r in by_unit.items() if r == [(64, 1680, [ids["train"]])]]
    assert train_unit.startswith(f"{SGD} [studies ") and len(by_unit) == 2
    # the stop-at-goal study (stopped at error < 0.02) cannot answer the stricter 0.01: said, not pooled
    assert len(errors) == 1 and "goal 0.01 is stricter" in errors[0]["error"] and errors[0]["unit"] not in by_unit
    assert err.count("\n") == 1 and err.startswith(f"warning: {errors[0]['unit']}: ")
    code, out, err = run(capsys, *base)
    assert code == 0 and f"{SGD} [sweep sweep-a]: steps to" in out and f"{train_unit}: steps to" in out
    code, out, err = run(capsys, *base, "--study", "sweep-a", "--json")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(d["batch_size"], d["steps"], d["study_ids"]) for d in lines] == [
        (64, None, [ids["sweep64"]]), (128, 80, [ids["sweep128"]])]
    assert lines[0]["censored_at"] == 60  # the sweep's own trials could never give the train's 1680
    code, out, err = run(capsys, *base, "--study", f"{ids['train']},{ids['sweep128']}", "--json")
    assert [json.loads(line)["steps"] for line in out.splitlines()] == [1680, 80]
    code, out, err = run(capsys, *base[:-1], "0.02", "--study", ids["train"], "--study", ids["stop"], "--json")
    assert [(json.loads(line)["batch_size"], json.loads(line)["steps"]) for line in out.splitlines()] == [
        (32, 400), (64, 1680)]
    code, out, err = run(capsys, *base[:-1], "0.02", "--mix-studies", "--json")
    assert code == 0, err
    lines = {json.loads(line)["batch_size"]: json.loads(line) for line in out.splitlines()}
    assert lines[64]["mixed_studies"] is True and lines[64]["study_ids"] == sorted([ids["train"], ids["sweep64"]])
    assert lines[64]["steps"] == 1680 and lines[128]["mixed_studies"] is False
    code, out, err = run(capsys, *base[:-1], "0.02", "--mix-studies")
    assert code == 0 and "MIXED studies" in out


def test_metric_goal_and_direction_default_to_the_studies_stop_rule(capsys, studies_store):
    path, ids = studies_store
    base = ["analyze", "steps-to-result", "--store", str(path), "--workload", SGD, "--json"]
    code, out, err = run(capsys, *base, "--study", ids["stop"])
    assert code == 0, err
    (line,) = [json.loads(line) for line in out.splitlines()]
    assert (line["metric"], line["goal"], line["steps"]) == (E, 0.02, 400) and line["maximize"] is False
    # --goal alone takes the stop rule's metric; --metric alone of another metric needs its --goal
    code, out, err = run(capsys, *base, "--study", ids["stop"], "--goal", "0.03")
    assert code == 0 and json.loads(out)["goal"] == 0.03 and json.loads(out)["metric"] == E
    code, out, err = run(capsys, *base, "--study", ids["stop"], "--metric", "val/cross_entropy_error")
    assert (code, out) == (2, "") and err.count("\n") == 1 and "give --goal" in err


def test_studies_with_different_stop_rules_are_not_pooled_without_a_goal(capsys, tmp_path):
    from batchlab.store import Store
    from batchlab.store.studies import make_study_definition
    from batchlab.store.writer import publish_trials

    path = tmp_path / "store"
    definitions = [make_study_definition(workload=SGD, batch_size=b, train_steps=1000,
                                         stop_rule={"metric": E, "goal": goal, "maximize": False})
                   for b, goal in ((32, 0.02), (64, 0.05))]
    publish_trials(Store.open(path, create=True), [
        record(1, 32, [(10, 0.5), (400, 0.015)], definitions[0], status="STOPPED_AT_GOAL"),
        record(1, 64, [(10, 0.5), (200, 0.04)], definitions[1], status="STOPPED_AT_GOAL")])
    base = ["analyze", "steps-to-result", "--store", str(path), "--workload", SGD, "--mix-studies", "--json"]
    code, out, err = run(capsys, *base)
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert "2 different stop rules" in err and "give --metric and --goal" in err
    code, out, err = run(capsys, *base, "--metric", E, "--goal", "0.05")
    assert code == 0 and [json.loads(line)["steps"] for line in out.splitlines()] == [400, 200]


def test_workload_is_dataset_model_with_optimizer_or_the_stores_name(capsys, studies_store):
    path, ids = studies_store
    base = ["analyze", "steps-to-result", "--store", str(path), "--study", ids["stop"], "--json"]
    answers = []
    for workload in (["--workload", SGD], ["--workload", "mnist/fc_64_64_64", "--optimizer", "sgd"],
                     ["--workload", "mnist/fc_64_64_64"]):
        code, out, err = run(capsys, *base, *workload)
        assert code == 0, err
        answers.append(out)
    assert answers[0] == answers[1] == answers[2]
    for workload, known in ((["--workload", "mnist/fc_64_64_64", "--optimizer", "adam"], "mnist/fc_64_64_64/adam"),
                            (["--workload", "foo/bar/baz"], "foo/bar/baz"),
                            (["--workload", SGD, "--optimizer", "adam"], "--optimizer")):
        code, out, err = run(capsys, *base, *workload)
        assert (code, out) == (2, "") and err.count("\n") == 1 and known in err
        assert workload[1] == SGD or f"known: {SGD}" in err


def test_stricter_goal_on_stop_at_goal_trials_is_refused(capsys, studies_store):
    path, ids = studies_store
    base = ["analyze", "steps-to-result", "--store", str(path), "--workload", SGD, "--metric", E,
            "--study", ids["stop"], "--json"]
    code, out, err = run(capsys, *base, "--goal", "0.02")
    assert code == 0 and json.loads(out)["steps"] == 400
    code, out, err = run(capsys, *base, "--goal", "0.01")
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert "stopped at their goal" in err and "goal 0.01 is stricter" in err and "a goal >= 0.02" in err
    code, out, err = run(capsys, *base, "--goal", "0.01", "--status", "COMPLETE")
    assert code == 0 and json.loads(out)["n_trials"] == 0


def test_release_with_enough_trials_uses_the_first_100_and_says_so(capsys, tmp_path):
    trials = [trial(W, b, t, rows([(50, 0.5), (1000 + b + (t == 101) * -500, 0.005)]), learning_rate=0.1)
              for b in (8, 16) for t in range(1, 102)]
    root = write_release(tmp_path / "batch_science", trials)
    path = tmp_path / "store"
    main(["import", "batch-science", str(root), "--store", str(path), "--json"])
    capsys.readouterr()
    base = ["analyze", "steps-to-result", "--store", str(path), "--workload", W, "--metric", E, "--goal", "0.01"]
    code, out, err = run(capsys, *base, "--json")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(d["steps"], d["n_trials"], d["max_trials"]) for d in lines] == [(1008, 100, 100), (1016, 100, 100)]
    code, out, err = run(capsys, *base)
    assert "first 100 trials per batch size by trial id (the paper's rule" in out
    code, out, err = run(capsys, *base, "--max-trials", "all", "--json")
    assert [json.loads(line)["steps"] for line in out.splitlines()] == [508, 516]


def write_table(path, rows, header="batch_size,steps,optimizer"):
    path.write_text(header + "\n" + "\n".join(",".join(str(v) for v in row) for row in rows) + "\n")
    return path


def test_steps_table_fits_one_curve_per_group(capsys, tmp_path):
    rows = [(b, round(1000 * (1 + 64 / b)), "sgd") for b in (4, 16, 64, 256, 1024, 4096)]
    rows += [(b, round(800 * (1 + 256 / b)), "momentum") for b in (4, 16, 64, 256, 1024, 4096)]
    table = write_table(tmp_path / "steps.csv", rows)
    code, out, err = run(capsys, "analyze", "critical-batch-size", "--steps-table", table, "--group-by", "optimizer",
                         "--json")
    assert code == 0, err
    groups = {d["group"]: d for d in map(json.loads, out.splitlines())}
    assert set(groups) == {"sgd", "momentum"}
    for key in ("s_min", "e_min", "mccandlish_b_crit", "overhead_20pct", "perfect_scaling_end",
                "maximal_parallelism_start", "residual"):
        assert key in groups["sgd"], key
    assert _value(groups["sgd"]["mccandlish_b_crit"]) == pytest.approx(64, rel=0.05)
    assert _value(groups["momentum"]["mccandlish_b_crit"]) == pytest.approx(256, rel=0.05)
    code, out, err = run(capsys, "analyze", "critical-batch-size", "--steps-table", table, "--group-by", "optimizer")
    assert code == 0 and "mccandlish_b_crit" in out and "sgd" in out


def _value(entry):
    return entry["value"] if isinstance(entry, dict) else entry


@pytest.mark.parametrize(
    "header, rows, message",
    [
        ("batch_size,optimizer", [(4, "sgd")], "steps"),
        ("batch_size,steps", [(0, 100), (8, 50)], "batch"),
        ("batch_size,steps", [(4, -1), (8, 50)], "steps"),
    ],
)
def test_bad_steps_table_is_one_line_exit_2(capsys, tmp_path, header, rows, message):
    table = write_table(tmp_path / "bad.csv", rows, header=header)
    code, out, err = run(capsys, "analyze", "critical-batch-size", "--steps-table", table, "--json")
    assert (code, out) == (2, "") and err.startswith("error: ") and err.count("\n") == 1 and message in err


def test_steps_table_option_errors(capsys, tmp_path, store_dir):
    code, out, err = run(capsys, "analyze", "critical-batch-size", "--steps-table", tmp_path / "none.csv", "--json")
    assert (code, out) == (2, "") and "does not exist" in err and err.count("\n") == 1
    code, out, err = run(capsys, "analyze", "critical-batch-size", "--store", store_dir, "--workload", W,
                         "--metric", E, "--goal", "0.01", "--group-by", "x")
    assert code == 2 and "--group-by needs --steps-table" in err
    code, out, err = run(capsys, "analyze", "critical-batch-size", "--workload", W)
    assert code == 2 and "missing --store (or give --steps-table FILE)" in err  # --metric, --goal: defaulted


def test_steps_interval_notes_are_per_batch_size_not_the_first_rows(capsys, store_dir):
    """Review fix: the table printed the first batch size's interval note as if it held for all."""
    code, out, err = run(capsys, "analyze", "critical-batch-size", "--store", str(store_dir), "--workload", W,
                         "--metric", E, "--goal", "0.01", "--bootstrap", "20", *ALL)
    assert code == 0, err
    text = " ".join(out.split())
    assert "steps interval: for the median" in text and "one-sided: no distribution-free lower bound" in text
    # B=256 (one trial, not reached) has its own note, named with its batch size
    assert "steps interval at B = 256:" in text
    assert "-th best" not in text


def test_steps_table_text_says_what_each_fit_rests_on_and_shows_group_errors(capsys, tmp_path):
    """Review fix: the text table showed an empty row for a group that failed, without the reason,
    and left out B0, the measured batch-size range and the points used."""
    rows = [(b, round(1000 * (1 + 64 / b)), "sgd") for b in (4, 16, 64, 256)] + [(16, 500, "one")]
    table = write_table(tmp_path / "steps.csv", rows)
    code, out, err = run(capsys, "analyze", "critical-batch-size", "--steps-table", table, "--group-by", "optimizer")
    assert code == 0, err
    assert "measured B" in out and "4..256" in out and "points" in out and "b0" in out
    assert "error (one): " in out and "need at least 2 batch sizes" in " ".join(out.split())


def test_s_min_line_does_not_call_an_unseen_plateau_measured(capsys, tmp_path):
    """Review fix: the text printed 'measured plateau' even when no plateau was seen (plateau_seen
    false), where the smallest measured steps are only an upper bound on the plateau."""
    rows = [(b, round(1000 * (1 + 64 / b))) for b in (4, 16, 64, 256)]
    store_rows = "\n".join(f"a/b/c,{b},0,{s},0.01\na/b/c,{b},0,{s - 1},0.5" for b, s in rows)
    csv = tmp_path / "runs.csv"
    csv.write_text("workload,batch_size,trial_id,step,val/err\n" + store_rows + "\n")
    store = tmp_path / "store"
    assert run(capsys, "import", "table", csv, "--store", store)[0] == 0
    code, out, err = run(capsys, "analyze", "critical-batch-size", "--store", store, "--workload", "a/b/c",
                         "--metric", "val/err", "--goal", "0.05", "--bootstrap", "10")
    assert code == 0, err
    text = " ".join(out.split())
    assert "measured plateau" not in text
    assert "smallest measured steps 1250 at B = 256 (no plateau seen: an upper bound on the plateau)" in text


# --- raced studies (docs/methods.md, "Racing") ----------------------------------------------------


@pytest.fixture(scope="module")
def raced_store(tmp_path_factory):
    """B=8 and B=16, five trials each, raced on error < 0.05 with keep 2 (the trials of
    tests/analysis/test_racing.py's small study, cut by race_trials)."""
    from analysis_fixtures import publish_store, race_trials
    from batchlab.store.studies import make_study_definition

    errors = {1: [0.9, 0.5, 0.2, 0.1], 2: [0.9, 0.3, 0.04, 0.01], 3: [0.9, 0.6, 0.04, 0.02],
              4: [0.9, 0.8, 0.07, 0.03], 5: [0.9, 0.9, 0.9, 0.9]}
    full, definitions = [], {}
    for b in (8, 16):
        definitions[b] = make_study_definition(workload=SGD, batch_size=b, train_steps=40, race={"keep": 2},
                                               stop_rule={"metric": E, "goal": 0.05, "maximize": False})
        full += [trial(SGD, b, t, [(s * 16 // b, {E: v}) for s, v in zip((10, 20, 30, 40), values)], study=b,
                       learning_rate=0.1 * t) for t, values in errors.items()]
    path = tmp_path_factory.mktemp("raced") / "store"
    ids = publish_store(path, race_trials(full, E, 0.05), definitions)
    return path, ids


def test_raced_study_steps_to_result_counts_raced_trials(capsys, raced_store):
    path, ids = raced_store
    base = ["analyze", "steps-to-result", "--store", str(path), "--workload", SGD, "--metric", E, "--goal", "0.05"]
    code, out, err = run(capsys, *base, "--json")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(d["batch_size"], d["steps"], d["steps_lower"], d["trial_id"]) for d in lines] == [
        (8, 60, 40, 2), (16, 30, 20, 2)]
    assert [(d["n_trials"], d["n_reached"], d["n_raced"], d["value_bound"]) for d in lines] == [(5, 2, 3, None)] * 2
    code, out, err = run(capsys, *base)
    assert code == 0 and "2/5 (3 raced)" in out and "statuses COMPLETE, STOPPED_AT_GOAL, RACED" in out


def test_raced_study_stricter_goal_is_one_line_exit_2(capsys, raced_store):
    path, ids = raced_store
    code, out, err = run(capsys, "analyze", "steps-to-result", "--store", str(path), "--workload", SGD, "--metric", E,
                         "--goal", "0.015", "--json")
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert "is not determined" in err and f"raced study {ids[8]}" in err and "without --race" in err
    code, out, err = run(capsys, "analyze", "critical-batch-size", "--store", str(path), "--workload", SGD,
                         "--metric", E, "--goal", "0.015", "--json")
    assert (code, out) == (2, "") and "is not determined" in err


def test_steps_table_prints_each_values_interval(capsys, tmp_path):
    """Issue 21, item 8: --steps-table printed no intervals although its help said so."""
    from batchlab.cli.output import fmt

    factors = (1.1, 0.95, 1.05, 0.9, 1.08, 0.97)
    rows = [(b, round(1000 * (1 + 64 / b) * f), "sgd") for b, f in zip((4, 16, 64, 256, 1024, 4096), factors)]
    table = write_table(tmp_path / "steps.csv", rows)
    base = ["analyze", "critical-batch-size", "--steps-table", table, "--group-by", "optimizer", "--level", "0.8"]
    code, out, err = run(capsys, *base, "--json")
    assert code == 0, err
    (group,) = map(json.loads, out.splitlines())
    interval = group["intervals"]["mccandlish_b_crit"]
    assert interval["low"] < group["mccandlish_b_crit"] < interval["high"] and group["interval"]["level"] == 0.8
    code, out, err = run(capsys, *base)
    assert code == 0, err
    text = " ".join(out.split())
    assert "80% intervals" in text and "intervals: for the parameter of the hyperbola" in text
    assert f"{fmt(group['mccandlish_b_crit'])} [{fmt(interval['low'])}, {fmt(interval['high'])}]" in text


@pytest.mark.parametrize("rows, header, fragment", [
    ([(4, 1000), (16, 400), (64, "")], "batch_size,steps", "unreached row(s) 3 (batch size(s) [64]) have no budget"),
    ([(4, 1000), (16, 0.4), (64, 200)], "batch_size,steps", "steps must be whole numbers (steps count updates), got [0.4] in row(s) 2"),
])
def test_steps_table_unbounded_or_fractional_rows_are_one_line_exit_2(capsys, tmp_path, rows, header, fragment):
    table = write_table(tmp_path / "bad.csv", rows, header=header)
    code, out, err = run(capsys, "analyze", "critical-batch-size", "--steps-table", table)
    assert (code, out) == (2, "") and err.startswith("error: ") and err.count("\n") == 1 and fragment in err
