"""The ``batchlab`` command line.

The main app only assembles the command groups; each module in this package registers its own
commands through ``register(app)`` and keeps heavy imports (torch, duckdb, matplotlib) inside the
command functions so that ``batchlab --help`` stays fast. Commands parse, call the library and print.

User errors (:class:`batchlab.errors.BatchlabError` and click usage errors) are printed as one line,
``error: ...``, with exit status 2. Ctrl-C is one line, ``interrupted ...``, with exit status 130
(``batchlab sweep`` says how many trials are saved). Shared options are declared once in
:mod:`batchlab.cli.options`; everything printed goes through :mod:`batchlab.cli.output`.
"""

from __future__ import annotations

import sys

import typer

from batchlab.errors import BatchlabError

app = typer.Typer(
    name="batchlab",
    help="The science of batch size: exact NQM, measured steps-to-result, critical batch size.",
    no_args_is_help=True,
    invoke_without_command=False,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _register_all() -> None:
    from batchlab.cli import analyze, nqm, plot, store, train, sweep

    for module in (nqm, store, analyze, plot, train, sweep):
        module.register(app)


@app.command("version")
def version() -> None:
    """Print the batchlab version."""
    from batchlab import __version__

    print(__version__)


_register_all()


def fail(message: str) -> None:
    """Print a one-line user error and exit with status 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


@app.callback()
def _root() -> None:
    """The science of batch size: exact NQM, measured steps-to-result, critical batch size."""


try:  # recent typer vendors click under typer._click; older ones use click itself
    from typer._click.exceptions import UsageError as _UsageError
except ImportError:  # pragma: no cover
    from click.exceptions import UsageError as _UsageError


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app, turning user errors into one line and exit status 2."""
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="batchlab", standalone_mode=False)
    except _UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError" and exc.ctx is not None:
            print(exc.ctx.get_help(), file=sys.stderr)
            raise SystemExit(2) from None
        where = f" (command: {exc.ctx.command_path})" if exc.ctx is not None else ""
        fail(f"{exc.format_message()}{where}".replace("\n", " "))
    except (typer.Abort, KeyboardInterrupt):  # click turns Ctrl-C into Abort
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except BatchlabError as exc:
        fail(str(exc).replace("\n", " "))
    except BrokenPipeError:  # the reader went away (``| head``): stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        raise SystemExit(0) from None
    # Without standalone mode typer returns the status of typer.Exit, and turns Ctrl-C into status 130.
    if code == 130:
        print("interrupted", file=sys.stderr)
    if isinstance(code, int) and not isinstance(code, bool) and code:
        raise SystemExit(code)
