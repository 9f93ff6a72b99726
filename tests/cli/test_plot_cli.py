"""``batchlab plot ...``: every figure command writes a PNG from an imported release-format store."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from analysis_fixtures import trial, write_release  # noqa: E402

from batchlab.cli import main  # noqa: E402
from cli_runner import run  # noqa: E402

NESTEROV = "mnist/simple_cnn_base/nesterov_momentum"
SGD = "mnist/fc_1024/sgd"
E = "val/classification_error"
PNG = b"\x89PNG\r\n\x1a\n"
# The store is an imported release, whose default is the paper's first 100 trials per batch size
# (refused here: 3 trials); the selection commands take --max-trials all like ``analyze``.
ALL_TRIALS = {command: ["--max-trials", "all"] for command in
              ("steps-to-result", "compare-workloads", "goals", "metaparameters", "lr-momentum", "best-measurement")}


def build_trials():
    trials = []
    for workload, b_crit in ((NESTEROV, 64), (SGD, 8)):
        for b in (1, 4, 16, 64, 256):
            for t in (1, 2, 3):
                hit = int(300 * (1 + b_crit / b) * (1 + 0.2 * t))
                params = {"learning_rate": 0.001 * b * t}
                if workload == NESTEROV:
                    params["momentum"] = 1 - 10.0 ** (-t)
                status = "INFEASIBLE" if t == 3 and b == 256 else "COMPLETE"
                rows = [(hit // 4, {E: 0.3}), (hit, {E: 0.009}), (3 * hit, {E: 0.004})]
                trials.append(trial(workload, b, t, rows, status=status, **params))
    return trials


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    root = write_release(tmp_path_factory.mktemp("release") / "batch_science", build_trials())
    path = tmp_path_factory.mktemp("store") / "store"
    main(["import", "batch-science", str(root), "--store", str(path), "--json"])
    return path


@pytest.mark.parametrize(
    "command, args",
    [
        ("steps-to-result", ["--workload", NESTEROV, "--metric", E, "--goal", "0.01", "--bootstrap", "20"]),
        ("compare-workloads", ["--workload", NESTEROV, "--workload", SGD, "--metric", E, "--goal", "0.01",
                               "--reference-batch-size", "4"]),
        ("goals", ["--workload", NESTEROV, "--metric", E, "--goal", "0.01", "--goal", "0.005", "--no-fit"]),
        ("metaparameters", ["--workload", NESTEROV, "--metric", E, "--goal", "0.01"]),
        ("lr-momentum", ["--workload", NESTEROV, "--metric", E, "--goal", "0.01", "--batch-size", "1",
                         "--batch-size", "256"]),
        ("best-measurement", ["--workload", SGD, "--metric", E, "--step-budget", "500", "--step-budget", "5000"]),
    ],
)
def test_every_plot_command_writes_a_png(capsys, store_dir, tmp_path, command, args):
    out_file = tmp_path / f"{command}.png"
    code, out, err = run(capsys, "plot", command, "--store", str(store_dir), *args, *ALL_TRIALS[command],
                         "--out", str(out_file))
    assert code == 0, err
    assert out.strip() == str(out_file)
    assert out_file.read_bytes()[:8] == PNG
    assert [p.name for p in tmp_path.iterdir()] == [out_file.name]
    assert all(line.startswith("warning: ") for line in err.splitlines())  # what the figure rests on


@pytest.mark.parametrize(
    "command, args, message",
    [
        ("steps-to-result", ["--workload", NESTEROV, "--metric", E, "--goal", "0.01", "--out", "{tmp}/f.jpg"],
         "must end in one of"),
        ("steps-to-result", ["--workload", "mnist/nope/sgd", "--metric", E, "--goal", "0.01", "--out", "{tmp}/f.png"],
         "unknown workload"),
        ("compare-workloads", ["--workload", NESTEROV, "--workload", SGD, "--metric", E, "--goal", "0.01",
                               "--goal", "0.02", "--goal", "0.03", "--out", "{tmp}/f.png"], "give --goal once"),
        ("lr-momentum", ["--workload", SGD, "--metric", E, "--goal", "0.01", "--out", "{tmp}/f.png"],
         "momentum optimizers only"),
        ("best-measurement", ["--workload", SGD, "--metric", E, "--step-budget", "5", "--example-budget", "5",
                              "--out", "{tmp}/f.png"], "budgets of one kind"),
        ("metaparameters", ["--workload", SGD, "--metric", E, "--goal", "0.0001", "--out", "{tmp}/f.png"],
         "no batch size reached"),
        ("steps-to-result", ["--workload", NESTEROV, "--metric", E, "--goal", "0.01", "--bootstrap", "3",
                             "--seed", "-1", "--out", "{tmp}/f.png"], "seed must be an integer >= 0"),
    ],
)
def test_plot_errors_are_one_line_and_write_nothing(capsys, store_dir, tmp_path, command, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code, out, err = run(capsys, "plot", command, "--store", str(store_dir), *args, *ALL_TRIALS[command])
    assert code == 2 and out == ""
    assert err.startswith("error: ") and message in err and err.strip().count("\n") == 0
    assert list(tmp_path.iterdir()) == []


def test_out_that_is_an_existing_directory_is_one_line_and_kept(capsys, store_dir, tmp_path):
    target = tmp_path / "figure.png"
    target.mkdir()
    code, out, err = run(capsys, "plot", "steps-to-result", "--store", str(store_dir), "--workload", NESTEROV,
                         "--metric", E, "--goal", "0.01", "--max-trials", "all", "--out", str(target))
    assert (code, out) == (2, "") and err.count("\n") == 1 and "is an existing directory" in err
    assert target.is_dir() and list(tmp_path.iterdir()) == [target]


@pytest.mark.parametrize("command", ["metaparameters", "lr-momentum"])
def test_metaparameter_plots_mark_and_list_search_edge_warnings(capsys, tmp_path, command):
    # learning rates searched over [1e-3, 1] (log): the best trial at B=64 uses 0.9 (the top 10%);
    # momentum 0.9 over [0.5, 0.999] (reverse log) is inside (position 0.26).
    trials = []
    for b, best_lr in ((4, 0.03), (16, 0.1), (64, 0.9)):
        trials.append(trial(NESTEROV, b, 1, [(100, {E: 0.005})], learning_rate=best_lr, momentum=0.9))
        trials.append(trial(NESTEROV, b, 2, [(300, {E: 0.005})], learning_rate=0.01, momentum=0.99))
    configs = {"learning_rate": {"type": "DOUBLE", "min_value": 1e-3, "max_value": 1.0, "scale": "LOG_SCALE"},
               "momentum": {"type": "DOUBLE", "min_value": 0.5, "max_value": 0.999, "scale": "REVERSE_LOG_SCALE"}}
    root = write_release(tmp_path / "release" / "batch_science", trials, parameter_configs=configs)
    store = tmp_path / "store"
    main(["import", "batch-science", str(root), "--store", str(store), "--json"])
    capsys.readouterr()
    out_file = tmp_path / f"{command}.png"
    code, out, err = run(capsys, "plot", command, "--store", str(store), "--workload", NESTEROV, "--metric", E,
                         "--goal", "0.01", "--max-trials", "all", "--out", str(out_file))
    assert code == 0, err
    assert out.strip() == str(out_file) and out_file.read_bytes()[:8] == PNG
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: batch size 64: best trial 1 has learning_rate = 0.9, "
                                                   "in the high 10% of its searched range [0.001, 1]")


def test_steps_to_result_plot_rejects_a_tolerance_outside_0_1(capsys, store_dir, tmp_path):
    code, out, err = run(capsys, "plot", "steps-to-result", "--store", str(store_dir), "--workload", NESTEROV,
                         "--metric", E, "--goal", "0.01", "--max-trials", "all", "--tolerance", "1.5",
                         "--out", str(tmp_path / "f.png"))
    assert (code, out) == (2, "") and err.strip() == "error: --tolerance must be in (0, 1), got 1.5"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["steps-to-result", "metaparameters", "lr-momentum", "best-measurement"])
def test_plot_selects_trials_like_analyze(capsys, store_dir, tmp_path, command):
    target = ["--step-budget", "5000"] if command == "best-measurement" else ["--goal", "0.01"]
    base = ["plot", command, "--store", str(store_dir), "--workload", NESTEROV, "--metric", E, *target,
            "--out", str(tmp_path / "f.png")]
    # the paper's first-N default for imported release workloads, refused with one line when fewer exist
    code, out, err = run(capsys, *base)
    assert (code, out) == (2, "") and "fewer than the paper's first 100" in err and err.count("\n") == 1
    # a study id that does not exist: one line naming it
    code, out, err = run(capsys, *base, "--max-trials", "all", "--study", "nosuchstudy")
    assert (code, out) == (2, "") and "nosuchstudy" in err and err.count("\n") == 1
    code, out, err = run(capsys, *base, "--max-trials", "2", "--mix-studies")
    assert code == 0, err


def test_goal_met_at_step_0_is_one_line_not_a_traceback(capsys, tmp_path):
    """Review fix: a goal already met at the first evaluation, step 0, gave S = 0 and a
    ZeroDivisionError traceback in plot steps-to-result (and a confusing bracket error in analyze)."""
    table = tmp_path / "runs.csv"
    table.write_text("workload,batch_size,trial_id,step,val/err\n"
                     "a/b/c,16,0,0,0.01\na/b/c,32,0,0,0.5\na/b/c,32,0,10,0.01\na/b/c,64,0,0,0.5\na/b/c,64,0,5,0.01\n")
    store = tmp_path / "store"
    assert run(capsys, "import", "table", table, "--store", store)[0] == 0
    args = ("--store", store, "--workload", "a/b/c", "--metric", "val/err", "--goal", "0.05")
    code, out, err = run(capsys, "plot", "steps-to-result", *args, "--out", tmp_path / "f.png")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "met at step 0" in err
    assert not (tmp_path / "f.png").exists()
    code, out, err = run(capsys, "analyze", "critical-batch-size", *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "met at step 0" in err


@pytest.fixture(scope="module")
def raced_store(tmp_path_factory):
    """One raced study (keep 2, stop at error < 0.05) at B=8: trials 4 and 5 are RACED at step 20."""
    from analysis_fixtures import publish_store, race_trials
    from batchlab.store.studies import make_study_definition

    errors = {1: [0.9, 0.5, 0.2, 0.1], 2: [0.9, 0.3, 0.04, 0.01], 3: [0.9, 0.6, 0.04, 0.02],
              4: [0.9, 0.8, 0.07, 0.03], 5: [0.9, 0.9, 0.9, 0.9]}
    definition = make_study_definition(workload=NESTEROV, batch_size=8, train_steps=40, race={"keep": 2},
                                       stop_rule={"metric": E, "goal": 0.05, "maximize": False})
    full = [trial(NESTEROV, 8, t, [(s, {E: v}) for s, v in zip((10, 20, 30, 40), values)], study="s",
                  learning_rate=0.1 * t, momentum=1 - 0.1 ** t) for t, values in errors.items()]
    path = tmp_path_factory.mktemp("raced") / "store"
    ids = publish_store(path, race_trials(full, E, 0.05), {"s": definition})
    return path, ids["s"]


def test_best_measurement_plot_refuses_a_raced_study(capsys, raced_store, tmp_path):
    path, sid = raced_store
    out_file = tmp_path / "f.png"
    base = ["plot", "best-measurement", "--store", str(path), "--workload", NESTEROV, "--metric", E,
            "--out", str(out_file)]
    code, out, err = run(capsys, *base, "--step-budget", "40")
    assert (code, out) == (2, "") and err.count("\n") == 1 and not out_file.exists()
    assert f"raced study {sid} stopped trial" in err and "re-run the study without --race" in err
    assert "a step budget <= 20" in err
    code, out, err = run(capsys, *base, "--step-budget", "20")  # every raced curve is complete up to 20
    assert code == 0, err
    assert out_file.read_bytes().startswith(PNG)


def test_lr_momentum_plot_of_a_raced_study(capsys, raced_store, tmp_path):
    path, _ = raced_store
    out_file = tmp_path / "f.png"
    code, out, err = run(capsys, "plot", "lr-momentum", "--store", str(path), "--workload", NESTEROV, "--metric", E,
                         "--goal", "0.05", "--out", str(out_file))
    assert code == 0, err
    assert out_file.read_bytes().startswith(PNG)


@pytest.fixture(scope="module")
def two_unit_store(tmp_path_factory):
    """A train-like study at B=8 (stop at error < 0.05) and a sweep ``sw`` at B=8 and 32 (the same stop
    rule): two units of one workload, which before units were refused as "trials from 2 studies"."""
    from analysis_fixtures import publish_store
    from batchlab.store.studies import make_study_definition

    stop = {"metric": E, "goal": 0.05, "maximize": False}
    definitions = {"train": make_study_definition(workload=NESTEROV, batch_size=8, train_steps=40, stop_rule=stop),
                   "sw8": make_study_definition(workload=NESTEROV, batch_size=8, train_steps=40, stop_rule=stop,
                                                sweep="sw"),
                   "sw32": make_study_definition(workload=NESTEROV, batch_size=32, train_steps=40, stop_rule=stop,
                                                 sweep="sw")}
    trials = [trial(NESTEROV, b, t, [(1, {E: 0.5}), (hit, {E: 0.04})], study=study, status="STOPPED_AT_GOAL",
                    learning_rate=0.1 * t, momentum=0.9)
              for study, b, hits in (("train", 8, {1: 30}), ("sw8", 8, {2: 20, 3: 30}), ("sw32", 32, {1: 5, 2: 20}))
              for t, hit in hits.items()]
    path = tmp_path_factory.mktemp("units") / "store"
    publish_store(path, trials, definitions)
    return path


def test_steps_to_result_plot_draws_one_labelled_curve_per_unit(capsys, two_unit_store, tmp_path):
    """The figure's curves are the units analyze answers (checked through its JSON)."""
    out_file = tmp_path / "steps.png"
    # no --metric/--goal: the studies' recorded stop rule (error < 0.05)
    code, out, err = run(capsys, "plot", "steps-to-result", "--store", two_unit_store, "--workload",
                         "mnist/simple_cnn_base", "--optimizer", "nesterov_momentum", "--out", out_file)
    assert code == 0, err
    assert out.strip() == str(out_file) and out_file.read_bytes().startswith(PNG)
    code, out, err = run(capsys, "analyze", "steps-to-result", "--store", two_unit_store, "--workload", NESTEROV,
                         "--json")
    import json

    units = {}
    for row in map(json.loads, out.splitlines()):
        units.setdefault(row["unit"], []).append((row["batch_size"], row["steps"], row["goal"]))
    assert units[f"{NESTEROV} [sweep sw]"] == [(8, 20, 0.05), (32, 5, 0.05)]
    assert [v for k, v in units.items() if k != f"{NESTEROV} [sweep sw]"] == [[(8, 30, 0.05)]]


def test_per_unit_figures_are_written_beside_out(capsys, two_unit_store, tmp_path):
    out_file = tmp_path / "meta.png"
    code, out, err = run(capsys, "plot", "metaparameters", "--store", two_unit_store, "--workload", NESTEROV,
                         "--out", out_file)
    assert code == 0, err
    written = sorted(p.name for p in tmp_path.iterdir())
    assert len(written) == 2 and "meta.nesterov_momentum_sweep_sw.png" in written
    assert sorted(out.split()) == sorted(str(tmp_path / name) for name in written)
    # --study narrows to one unit: the figure is --out itself
    code, out, err = run(capsys, "plot", "metaparameters", "--store", two_unit_store, "--workload", NESTEROV,
                         "--study", "sw", "--out", tmp_path / "one.png")
    assert code == 0 and out.strip() == str(tmp_path / "one.png")
