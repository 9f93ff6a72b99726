import json
import subprocess
import sys

import pytest

from cli_runner import run  # noqa: E402


def test_sweep_json_official_matches_table_d_convention(capsys):
    code, out, _ = run(capsys, "nqm", "sweep", "--preset", "zhang2019-binned", "--optimizer", "sgd",
                       "--precondition", "0", "--batch-sizes", "4,64", "--target", "0.01", "--grid", "official", "--json")
    assert code == 0
    rows = [json.loads(line) for line in out.strip().splitlines()]
    assert [r["batch_size"] for r in rows] == [4, 64]
    for row in rows:
        for key in ("batch_size", "steps", "reached", "learning_rate", "momentum", "ema_decay", "final_loss"):
            assert key in row
        assert row["reached"] is True and row["momentum"] is None and row["ema_decay"] is None
        assert row["final_loss"] < 0.01
    # Table D (official low convention, notebook fudge) 1507367 and 95759; exact NQM within 0.1%
    assert rows[0]["official_low"] == pytest.approx(1507367, rel=1e-3)
    assert rows[1]["official_low"] == pytest.approx(95759, rel=1e-3)
    assert rows[0]["steps"] == rows[0]["official_low"] + 1
    code, out, _ = run(capsys, "nqm", "sweep", "--batch-sizes", "4,64", "--target", "0.01", "--grid", "official",
                       "--notebook-fudge", "--json")
    assert code == 0 and [json.loads(line)["official_low"] for line in out.strip().splitlines()] == [1507367, 95759]


def test_sweep_momentum_with_fit(capsys):
    code, out, _ = run(capsys, "nqm", "sweep", "--optimizer", "momentum", "--batch-sizes", "16,1024,65536",
                       "--grid", "official", "--max-steps", "2000000", "--fit", "--json")
    assert code == 0
    lines = [json.loads(line) for line in out.strip().splitlines()]
    assert all(r["momentum"] is not None for r in lines[:3])
    fit = lines[3]["fit"]
    assert fit["critical_batch_sizes"]["mccandlish_b_crit"]["value"] > 0
    assert set(fit["critical_batch_sizes"]) == {"mccandlish_b_crit", "overhead_20pct", "perfect_scaling_end",
                                                "maximal_parallelism_start", "fit_perfect_scaling_end",
                                                "fit_maximal_parallelism_start"}
    assert fit["batch_grid"] == {"batch_sizes": [16, 1024, 65536], "n": 3, "n_reached": 3, "smallest": 16,
                                 "largest": 65536, "b0": 16, "learning_rate_grid": "official"}


def test_sweep_not_reached_is_null(capsys):
    code, out, _ = run(capsys, "nqm", "sweep", "--batch-sizes", "4", "--target", "0.001", "--max-steps", "100",
                       "--grid", "official", "--json")
    row = json.loads(out)
    assert code == 0 and row["reached"] is False and row["steps"] is None


def test_sweep_power_law_spectrum_file_and_schedule(capsys, tmp_path):
    code, out, _ = run(capsys, "nqm", "sweep", "--power-law", "1,1", "--dim", "100", "--batch-sizes", "8",
                       "--target", "0.05", "--json")
    assert code == 0 and json.loads(out)["reached"]
    spectrum = tmp_path / "eig.txt"
    spectrum.write_text("\n".join(str(1 / i) for i in range(1, 51)))
    code, out, _ = run(capsys, "nqm", "sweep", "--spectrum", str(spectrum), "--batch-sizes", "8,64",
                       "--target", "0.05", "--schedule", "pwc:5", "--json")
    rows = [json.loads(line) for line in out.strip().splitlines()]
    assert code == 0 and all(r["steps"] % 5 == 0 and r["steps"] <= r["constant_steps"] + 5 for r in rows)
    code, out, _ = run(capsys, "nqm", "sweep", "--spectrum", str(spectrum), "--batch-sizes", "8",
                       "--target", "0.05", "--schedule", "linear", "--json")
    row = json.loads(out)
    assert code == 0 and row["reached"] and row["decay_steps"] > 0 and row["final_loss"] < 0.05


def test_fit_command_and_human_table(capsys):
    code, out, _ = run(capsys, "nqm", "fit", "--batch-sizes", "4,64,1024,16384", "--grid", "official", "--json")
    assert code == 0 and json.loads(out)["fit"]["b_crit"] > 0
    code, out, _ = run(capsys, "nqm", "sweep", "--batch-sizes", "4,64", "--grid", "official")
    assert code == 0 and "steps" in out and "batch" in out


def test_fit_prints_data_read_and_fit_derived_regimes_with_the_grid(capsys):
    sizes = ",".join(str(4**k) for k in range(1, 11))  # 4 .. 2^20, every other power of two
    code, out, _ = run(capsys, "nqm", "fit", "--batch-sizes", sizes, "--grid", "official", "--json")
    summary = json.loads(out)
    named = summary["critical_batch_sizes"]
    assert code == 0 and named["perfect_scaling_end"]["value"] == 256
    assert named["maximal_parallelism_start"]["value"] == 16384
    assert named["fit_perfect_scaling_end"]["source"] == "fit" and named["perfect_scaling_end"]["source"] == "data"
    assert summary["batch_grid"]["n"] == 10 and summary["batch_grid"]["b0"] == 4
    code, out, _ = run(capsys, "nqm", "fit", "--batch-sizes", sizes, "--grid", "official")
    assert code == 0
    assert "batch grid: B = 4..1048576, 10 batch sizes (10 reached), B0 = 4, learning-rate grid official" in out
    for name in ("perfect_scaling_end", "maximal_parallelism_start", "fit_perfect_scaling_end",
                 "fit_maximal_parallelism_start", "mccandlish_b_crit", "S_min measured", "S_min fit"):
        assert name in out
    code, out, _ = run(capsys, "nqm", "fit", "--precondition", "0.75", "--batch-sizes", "4,16,64,256,1024,4096",
                       "--grid", "official")
    assert code == 0 and "beyond the measured range" in out and "warning: B_crit" in out and "extrapolated" in out
    code, out, _ = run(capsys, "nqm", "fit", "--batch-sizes", "4,16,64", "--grid", "official", "--b0", "16", "--json")
    assert code == 0 and json.loads(out)["b0"] == 16


def _strict_json_lines(out):
    """Parse JSON lines refusing NaN/Infinity (which Python's json would otherwise accept)."""
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return [json.loads(line, parse_constant=refuse) for line in out.strip().splitlines()]


def test_curve_json_every_step_and_log(capsys):
    code, out, _ = run(capsys, "nqm", "curve", "--learning-rate", "0.1", "--batch-size", "16", "--steps", "50", "--json")
    *rows, last = _strict_json_lines(out)
    assert code == 0 and [r["step"] for r in rows] == list(range(51))
    assert rows[0]["loss"] == pytest.approx(4.7025, abs=5e-5) and rows[-1]["loss"] < rows[0]["loss"]
    assert last["curve"]["diverged"] is False and last["curve"]["diverged_at_step"] is None
    assert last["curve"]["final_loss"] == rows[-1]["loss"]
    code, out, _ = run(capsys, "nqm", "curve", "--optimizer", "momentum", "--momentum", "0.9", "--learning-rate",
                       "0.01", "--batch-size", "16", "--steps", "100000", "--every", "log", "--json")
    *rows, last = _strict_json_lines(out)
    assert code == 0 and rows[0]["step"] == 0 and rows[-1]["step"] == 100000 and len(rows) < 250
    assert last["curve"]["optimizer"] == "momentum" and last["curve"]["diverged"] is False


@pytest.mark.parametrize("every", ["1", "log"])
def test_curve_json_of_a_diverging_run_is_valid_json_and_says_it_diverged(capsys, every):
    # lr = 3 > 2 / h_max: the expected loss grows like (1 - 3)^(2t) and overflows float64 within 1000 steps
    code, out, _ = run(capsys, "nqm", "curve", "--learning-rate", "3", "--batch-size", "4", "--steps", "1000",
                       "--every", every, "--json")
    assert code == 0 and "Infinity" not in out and "NaN" not in out
    *rows, last = _strict_json_lines(out)
    curve = last["curve"]
    assert curve["diverged"] is True and curve["final_loss"] is None
    k = curve["diverged_at_step"]
    assert 0 < k <= 1000
    assert all(r["loss"] is None for r in rows if r["step"] >= k)
    assert all(r["loss"] is not None and r["loss"] > 0 for r in rows if r["step"] < k)
    assert max(r["loss"] for r in rows if r["step"] < k) > 1e250  # grew to the edge of float64 first
    code, out, _ = run(capsys, "nqm", "curve", "--learning-rate", "3", "--batch-size", "4", "--steps", "1000",
                       "--every", every)
    assert code == 0 and f"diverged: the expected loss overflowed (is not finite) from step {k} on" in out


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["sweep", "--batch-sizes", "0,4"], "batch sizes must be > 0"),
        (["sweep", "--batch-sizes", "-4"], "batch sizes must be > 0"),
        (["sweep", "--target", "0"], "target must be > 0"),
        (["sweep", "--target", "10"], "below the initial loss"),
        (["sweep", "--precondition", "1.5"], "[0, 1]"),
        (["sweep", "--optimizer", "adam"], "unknown optimizer 'adam'"),
        (["fit", "--optimizer", "nesterov-ema"], "did you mean 'nesterov+ema'"),
        (["curve", "--optimizer", "kfac", "--learning-rate", "0.1", "--batch-size", "4", "--steps", "10"],
         "known: ema, momentum, momentum+ema, nesterov, nesterov+ema, sgd"),
        (["sweep", "--optimizer", "momentum", "--schedule", "pwc:3"], "pwc:K is implemented for --optimizer sgd only"),
        (["sweep", "--optimizer", "ema", "--notebook-fudge"], "--notebook-fudge applies to --optimizer sgd"),
        (["sweep", "--preset", "nope"], "unknown preset"),
        (["sweep", "--schedule", "step"], "unknown schedule"),
        (["sweep", "--grid", "fine"], "unknown grid"),
        (["curve", "--optimizer", "momentum", "--momentum", "1.0", "--learning-rate", "0.1", "--batch-size", "4",
          "--steps", "10"], "[0, 1)"),
        (["curve", "--optimizer", "ema", "--ema-decay", "-0.1", "--learning-rate", "0.1", "--batch-size", "4",
          "--steps", "10"], "[0, 1)"),
        (["curve", "--learning-rate", "0.1", "--batch-size", "0", "--steps", "10"], "batch size must be > 0"),
        (["sweep", "--power-law", "1,1"], "--dim"),
        (["sweep", "--batch-sizes", "4,inf"], "batch sizes must be > 0 and finite"),
        # a repeated batch size is refused, as `batchlab sweep` refuses it (it used to be dropped silently)
        (["sweep", "--batch-sizes", "4,4"], "--batch-sizes must be distinct, got 4 more than once"),
        (["fit", "--batch-sizes", "4,16,16.0"], "--batch-sizes must be distinct, got 16 more than once"),
        (["curve", "--learning-rate", "0.1", "--batch-size", "inf", "--steps", "10"], "batch size must be > 0 and finite"),
        (["curve", "--learning-rate", "0.1", "--batch-size", "4", "--steps", "10", "--momentum", "0.9"],
         "--momentum does not apply to optimizer 'sgd'"),
        (["curve", "--optimizer", "momentum", "--momentum", "0.9", "--ema-decay", "0.9", "--learning-rate", "0.1",
          "--batch-size", "4", "--steps", "10"], "--ema-decay does not apply to optimizer 'momentum'"),
        (["sweep", "--batch-sizes", "2.5,3", "--max-steps", "10", "--fit"], "batch sizes must be whole numbers"),
        (["fit", "--tolerance", "1.5"], "--tolerance must be in (0, 1)"),
        (["sweep", "--fit", "--tolerance", "0"], "--tolerance must be in (0, 1)"),
        (["fit", "--batch-sizes", "4,16,64", "--grid", "official", "--b0", "8"], "b0 must be a batch size that reached"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, args, fragment):
    code, out, err = run(capsys, "nqm", *args)
    assert code == 2
    assert err.startswith("error: ") and err.strip().count("\n") == 0 and fragment in err
    assert out == ""


def test_bad_spectrum_files_exit_2(capsys, tmp_path):
    for text in ("", "1\n-1\n"):
        path = tmp_path / "s.txt"
        path.write_text(text)
        code, _, err = run(capsys, "nqm", "sweep", "--spectrum", str(path))
        assert code == 2 and err.startswith("error: ") and "spectrum" in err
    path.write_bytes(b"\xff\xfe\x00garbage")  # not text at all
    code, out, err = run(capsys, "nqm", "sweep", "--spectrum", str(path))
    assert (code, out) == (2, "") and err.startswith("error: ") and err.count("\n") == 1 and "not a UTF-8 text" in err


@pytest.mark.parametrize("blocker", ["file", "parent-file"])
def test_figures_out_blocked_by_a_file_fails_before_computing(capsys, tmp_path, blocker):
    existing = tmp_path / "taken"
    existing.write_text("keep me")
    out_dir = existing if blocker == "file" else existing / "sub"
    code, out, err = run(capsys, "nqm", "figures", "--out", str(out_dir), "--workers", "1")
    assert (code, out) == (2, "") and err.startswith("error: ") and err.count("\n") == 1
    assert "figure directory" in err and existing.read_text() == "keep me"


def test_subprocess_exit_code_and_no_traceback():
    result = subprocess.run([sys.executable, "-m", "batchlab", "nqm", "sweep", "--batch-sizes", "0"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: ")


def test_out_of_memory_is_a_one_line_user_error(capsys, monkeypatch):
    import batchlab.nqm.dynamics as dynamics

    def too_big(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(dynamics, "moment_recurrence", too_big)
    code, out, err = run(capsys, "nqm", "curve", "--power-law", "1,1", "--dim", "50", "--learning-rate", "0.1",
                         "--batch-size", "4", "--steps", "10")
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert "(50 eigenvalues) needs more memory than this machine has" in err


def test_pwc_schedule_respects_max_steps(capsys):
    def pwc(max_steps):
        code, out, _ = run(capsys, "nqm", "sweep", "--batch-sizes", "4", "--schedule", "pwc:3", "--max-steps",
                           str(max_steps), "--json")
        assert code == 0
        return json.loads(out)

    free = pwc(400_000)  # the optimal 3-piece schedule needs 3 * 102742 = 308226 updates
    assert free["reached"] and free["steps"] == 3 * free["piece_length"] <= 400_000
    capped = pwc(free["steps"] - 1)  # one update short of it: not reached within the budget
    assert capped["reached"] is False and capped["steps"] is None


def test_algorithms_lists_the_registry(capsys):
    from batchlab.nqm.algorithms import nqm_algorithm_names

    code, out, _ = run(capsys, "nqm", "algorithms", "--json")
    entries = _strict_json_lines(out)
    assert code == 0 and [e["name"] for e in entries] == list(nqm_algorithm_names())
    assert {e["name"]: e["hyperparameters"] for e in entries}["nesterov+ema"] == ["learning_rate", "momentum",
                                                                                 "ema_decay"]
    code, out, _ = run(capsys, "nqm", "algorithms")
    assert code == 0 and all(name in out for name in nqm_algorithm_names())


def test_figures_out_under_a_missing_parent_is_an_error_and_writes_nothing(capsys, tmp_path):
    target = tmp_path / "no-such-dir" / "figs"
    code, out, err = run(capsys, "nqm", "figures", "--out", str(target), "--workers", "1")
    assert (code, out) == (2, "") and err.startswith("error: ") and err.count("\n") == 1
    assert "does not exist" in err and "no-such-dir" in err
    assert list(tmp_path.iterdir()) == []


def test_figure_directory_refuses_a_missing_parent(tmp_path):
    from batchlab.errors import BatchlabError
    from batchlab.plots.nqm import figure_directory

    with pytest.raises(BatchlabError, match="does not exist"):
        figure_directory(tmp_path / "missing" / "figs")
    assert not (tmp_path / "missing").exists()
    assert figure_directory(tmp_path / "figs").is_dir()  # the directory itself is created under an existing parent


def test_sweep_pwc_json_is_unchanged_by_the_move_to_the_library(capsys):
    # numbers of `nqm sweep --batch-sizes 16,256 --schedule pwc:3 --json` captured before the PWC tuning moved
    # out of the CLI into batchlab.nqm.tuning.tune_pwc
    code, out, _ = run(capsys, "nqm", "sweep", "--batch-sizes", "16,256", "--schedule", "pwc:3", "--json")
    rows = _strict_json_lines(out)
    assert code == 0
    assert [(r["batch_size"], r["steps"], r["piece_length"], r["constant_steps"]) for r in rows] == [
        (16, 77091, 25697, 379888), (256, 11388, 3796, 25881)]
    # The optimised learning rates and loss are compared within 1e-9 (relative), not bitwise: L-BFGS-B
    # runs on sums that numpy evaluates with the CPU's SIMD kernels (AVX-512, AVX2, ...), whose rounding
    # differs between machines and moves the local optimum in the 13th digit (seen: 4e-13). The step
    # counts above, integers read from that optimum, are the same on every machine we ran.
    assert rows[0]["learning_rates"] == pytest.approx([0.7985549026874106, 0.16855378594170747, 0.020544034048037552],
                                                      rel=1e-9)
    assert rows[1]["final_loss"] == pytest.approx(0.00999588498738715, rel=1e-9)
    assert all(r["schedule"] == "pwc:3" and r["certified"] == "local-optimum" and r["grid"] == "official" for r in rows)


def test_the_critical_batch_size_table_has_one_column_per_registry_definition(capsys):
    from batchlab.analysis.definitions import named_definitions
    from batchlab.cli import nqm as nqm_cli
    from batchlab.nqm.sweep import fit_summary

    rows = [{"batch_size": b, "steps": s} for b, s in ((4, 1000), (16, 260), (64, 80), (256, 40), (1024, 35))]
    summary = fit_summary(rows, "toy curve")
    nqm_cli._print_critical_batch_sizes([summary])
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "curve" in line and "S_min" in line)
    columns = [cell.strip() for cell in header.strip("┃ ").split("┃")]
    labels = [d.label for d in named_definitions()]
    assert columns[2 : 2 + len(labels)] == labels
    for d in named_definitions():
        assert f"{d.label} = {d.name}: {d.definition}" in out
    for column in columns[1:]:  # every number printed is defined under the table
        assert any(line.startswith(f"{column} = ") or f"; {column} = " in line for line in out.splitlines()), column


def test_figures_default_directory_is_created_with_a_note(capsys, tmp_path, monkeypatch):
    import batchlab.plots.nqm as plots_nqm

    seen = {}

    def fake_compute(out_dir, workers):  # the directory handling is under test, not the computation
        seen["out"] = out_dir
        return {}, {"training_curves": plots_nqm.figure_directory(out_dir) / "x.png"}, {"compute_s": 0.0}

    monkeypatch.setattr(plots_nqm, "compute_and_draw_nqm_figures", fake_compute)
    monkeypatch.setattr(plots_nqm, "critical_batch_size_table", lambda data: [])
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "nqm", "figures", "--json")
    assert code == 0 and seen["out"] == "figures/nqm" and (tmp_path / "figures" / "nqm").is_dir()
    assert err.strip() == "created figures/nqm"
    assert _strict_json_lines(out)[-1]["figures"] == {"training_curves": "figures/nqm/x.png"}


# --- start-up: lazy command groups -------------------------------------------------------------------

#: Imported by no command below: training, the store, plotting and the analysis are other groups'.
HEAVY = ("torch", "duckdb", "matplotlib", "pyarrow", "pandas", "scipy", "batchlab.train", "batchlab.store",
         "batchlab.plots", "batchlab.analysis", "batchlab.sweep", "batchlab.workloads")

_LAUNCHER = """
import json, sys
from batchlab.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    assert not exc.code, exc.code
watched = json.loads(sys.stdin.read())
loaded = sorted(m for m in sys.modules if m.startswith("batchlab.cli."))
heavy = sorted({m for m in sys.modules for h in watched if m == h or m.startswith(h + ".")})
print(json.dumps({"cli": loaded, "heavy": heavy}), file=sys.stderr)
"""


def _imports(*args):
    """(command modules loaded, heavy modules loaded) by ``batchlab ARGS`` in a fresh process."""
    done = subprocess.run([sys.executable, "-c", _LAUNCHER, *args], input=json.dumps(HEAVY), capture_output=True,
                          text=True, check=True)
    report = json.loads(done.stderr.strip().splitlines()[-1])
    return report["cli"], report["heavy"], done.stdout


def test_nqm_sweep_imports_only_what_it_needs():
    cli, heavy, out = _imports("nqm", "sweep", "--batch-sizes", "4096", "--grid", "official", "--json")
    assert json.loads(out)["reached"] is True
    assert heavy == [] and "batchlab.cli.nqm" in cli
    assert not {"batchlab.cli.train", "batchlab.cli.sweep", "batchlab.cli.store", "batchlab.cli.analyze",
                "batchlab.cli.plot"} & set(cli)
    cli, heavy, out = _imports("version")
    assert out.strip() and heavy == [] and cli == []
    # `batchlab --version` prints the same line as `batchlab version` and loads no command module
    cli, heavy, flag_out = _imports("--version")
    assert flag_out == out and heavy == [] and cli == []


def _eager_app():
    """The main app as it was before lazy loading: every module registered up front."""
    import typer

    import batchlab.cli as cli
    from batchlab.cli import advise, analyze, nqm, plot, predict, probe, report, store, sweep, train

    app = typer.Typer(name="batchlab", help=cli.app.info.help, no_args_is_help=True, invoke_without_command=False,
                      add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
    app.command("version")(cli.version)
    for module in (nqm, store, analyze, plot, probe, train, sweep, report, predict, advise):
        module.register(app)
    app.callback()(cli._root)
    return app


def _helps(app):
    """The help text of the main command and of every group, by command path."""
    import typer.main

    def helps(command, path):
        context = command.make_context(path, [], resilient_parsing=True)
        yield path, command.get_help(context)
        for name in getattr(command, "commands", {}):
            sub = command.commands[name]
            if getattr(sub, "commands", None):
                yield from helps(sub, f"{path} {name}")

    return dict(helps(typer.main.get_command(app), "batchlab"))


def test_lazy_groups_list_every_command_with_its_help():
    from batchlab.cli import LAZY_COMMANDS, app

    lazy, eager = _helps(app), _helps(_eager_app())
    assert list(lazy) == list(eager) and lazy == eager  # same commands, order and help texts
    listed = lazy["batchlab"].split("Commands:")[1].split()
    assert [name for name in ["version", *LAZY_COMMANDS] if name in listed] == ["version", *LAZY_COMMANDS]
    assert {"batchlab nqm", "batchlab store", "batchlab analyze", "batchlab plot"} <= set(lazy)


def test_lazy_names_load_nothing_until_looked_up(monkeypatch):
    import batchlab.cli as cli

    loads = []
    monkeypatch.setattr(cli, "load_commands", lambda name: loads.append(name) or {"nqm": f"<{name}>"})
    commands = cli.LazyCommands({"version": "built"}, {"nqm": "batchlab.cli.nqm", "plot": "batchlab.cli.plot"})
    assert list(commands) == ["version", "nqm", "plot"] and "plot" in commands and len(commands) == 3
    assert loads == []
    assert commands["nqm"] == "<batchlab.cli.nqm>" and commands.get("nqm") == "<batchlab.cli.nqm>"
    assert loads == ["batchlab.cli.nqm"] and commands.get("nope") is None


@pytest.mark.parametrize("flag, texts", [
    ("--max-steps", ["7", "0", "-3", "+7", "007", "1_000", " 5", "1.5", "1e3", "x", "123456789012345678901"]),
    ("--precondition", ["0", "0.5", "-0.0", "1e-2", "2.5E+3", ".5", "5.", "+1", " 0.5", "1_0", "inf", "nan", "x"]),
    ("--preset", ["zhang2019", "", " a b "]),
    ("--json", ["true", "no", "1"]),
])
def test_plain_option_conversion_is_typers(flag, texts):
    pytest.importorskip("typer._coercion")  # typer >= 0.22 converts option values itself
    import typer.main
    from typer._click.exceptions import BadParameter
    from typer._coercion import build_runtime_param

    from batchlab.cli import PlainCoercion, app

    sweep = typer.main.get_command(app).commands["nqm"].commands["sweep"]
    (param,) = [p for p in sweep.params if flag in p.opts]
    assert isinstance(param.get_runtime_param(), PlainCoercion)
    ctx = sweep.make_context("sweep", [], resilient_parsing=True)
    typers = build_runtime_param(param.type_descriptor)

    def outcome(conversion, text):
        try:
            value = conversion.coerce(text, param=param, ctx=ctx)
            return type(value), repr(value)
        except BadParameter as exc:
            return "error", exc.format_message()

    for text in texts:
        assert outcome(param.get_runtime_param(), text) == outcome(typers, text), text
