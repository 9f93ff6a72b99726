import subprocess
import sys

from batchlab.errors import unknown_name_error


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "batchlab", *args], capture_output=True, text=True)


def test_unknown_command_is_one_line_exit_2():
    result = run_cli("no-such-command")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert result.stderr.startswith("error: ")
    assert "Traceback" not in result.stderr


def test_unknown_option_is_one_line_exit_2():
    result = run_cli("version", "--bogus")
    assert result.returncode == 2
    assert "--bogus" in result.stderr and "Traceback" not in result.stderr


def test_unknown_name_suggests_closest():
    err = unknown_name_error("optimizer", "momentm", ["sgd", "momentum", "adam"])
    assert "did you mean 'momentum'" in str(err)
    assert "adam, momentum, sgd" in str(err)


def test_ctrl_c_in_any_command_is_one_line_and_status_130(capsys, monkeypatch):
    # typer turns KeyboardInterrupt into a returned status 130 without standalone mode; main() must
    # exit with it (it used to exit 0, silently)
    import batchlab.train

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(batchlab.train, "prepare_trial", interrupted)
    from batchlab.cli import main

    try:
        main(["train", "mnist/fc_64_64_64", "--optimizer", "sgd", "--batch-size", "8", "--learning-rate", "0.1"])
        code = 0
    except SystemExit as exc:
        code = exc.code
    assert code == 130
    assert capsys.readouterr().err == "interrupted\n"
