"""Run the ``batchlab`` command line in-process, as the CLI tests do."""

from batchlab.cli import main


def run(capsys, *args):
    """Run ``batchlab ARGS`` in-process; returns (exit code, stdout, stderr). Arguments are str()-ed."""
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err
