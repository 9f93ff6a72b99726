"""The ``batchlab`` command line.

The main app only assembles the commands, and lazily: :data:`LAZY_COMMANDS` names every top-level
command and the module that registers it (``register(app)``); the root group (:class:`LazyGroup`)
lists those names at once and imports a module, and has typer build its commands, only when one of
them is looked up: when it is invoked, or when help or completion lists the commands (``batchlab
--help`` then loads every module; each module keeps its heavy imports, torch, duckdb, matplotlib,
inside the command functions). So ``batchlab nqm sweep`` imports the ``nqm`` group and what its
command needs, and nothing of training, the store or plotting.

Values of plain options (``str``, ``bool``, ``int``, ``float``) are converted without pydantic when
they already have the type or are numbers in plain decimal notation (:class:`PlainCoercion`); every
other value, and every other kind of option, goes through typer's own conversion, so accepted values,
results and error messages are typer's.

User errors (:class:`batchlab.errors.BatchlabError` and click usage errors) are printed as one line,
``error: ...``, with exit status 2, and so is an OSError that reaches :func:`main` (a full disk, a
read-only directory: strerror, errno name and file) and DuckDB failing to read a data file. Ctrl-C
is one line, ``interrupted ...``, with exit status 130 (``batchlab sweep`` says how many trials are
saved). Shared options are declared once in
:mod:`batchlab.cli.options`; everything printed goes through :mod:`batchlab.cli.output`. (No ``from
__future__ import annotations`` here or in :mod:`batchlab.cli.nqm`: typer reads the commands' annotations,
and string annotations would be compiled at each start-up.)
"""

import importlib
import re
import sys
from collections.abc import MutableMapping

import typer
from typer.core import TyperGroup

from batchlab.errors import BatchlabError

#: Every top-level command but ``version``, in the order ``batchlab --help`` lists them (after
#: ``version``), with the module whose ``register(app)`` adds it. A module is imported when one of its
#: commands is first looked up.
LAZY_COMMANDS = {
    "workloads": "batchlab.cli.train",
    "optimizers": "batchlab.cli.train",
    "train": "batchlab.cli.train",
    "study": "batchlab.cli.train",
    "sweep": "batchlab.cli.sweep",
    "report": "batchlab.cli.report",
    "predict": "batchlab.cli.predict",
    "advise": "batchlab.cli.advise",
    "nqm": "batchlab.cli.nqm",
    "store": "batchlab.cli.store",
    "import": "batchlab.cli.store",
    "export": "batchlab.cli.store",
    "analyze": "batchlab.cli.analyze",
    "plot": "batchlab.cli.plot",
    "probe": "batchlab.cli.probe",
}

#: The app settings that shape how typer builds commands; the main app and the apps the command
#: modules register into share them, so a lazily built command is the one an eager build gives.
_BUILD_SETTINGS = {"add_completion": False, "pretty_exceptions_enable": False, "rich_markup_mode": None}


def load_commands(module_name: str) -> dict:
    """The click commands that ``module_name``'s ``register(app)`` adds, by name, as typer builds them
    (with :class:`PlainCoercion` on their plain options)."""
    module = importlib.import_module(module_name)
    holder = typer.Typer(**_BUILD_SETTINGS)
    module.register(holder)
    commands = dict(typer.main.get_group(holder).commands)
    for command in commands.values():
        PlainCoercion.install(command)
    return commands


class LazyCommands(MutableMapping):
    """A group's ``commands`` mapping whose lazy entries are built on first lookup.

    Names (iteration, ``in``, ``len``) never load anything; ``mapping[name]`` (and ``get``, ``items``,
    ``values``) loads the entry's module (:func:`load_commands`) and keeps every command it registers.
    """

    def __init__(self, eager: dict, lazy: dict[str, str]):
        self._loaded = dict(eager)
        self._lazy = {name: module for name, module in lazy.items() if name not in self._loaded}
        self._order = [*self._loaded, *self._lazy]

    def __getitem__(self, name: str):
        if name not in self._loaded and name in self._lazy:
            self._loaded.update(load_commands(self._lazy[name]))
        return self._loaded[name]

    def __setitem__(self, name: str, command) -> None:
        self._loaded[name] = command
        self._lazy.pop(name, None)
        if name not in self._order:
            self._order.append(name)

    def __delitem__(self, name: str) -> None:
        self._order.remove(name)
        self._lazy.pop(name, None)
        self._loaded.pop(name, None)

    def __contains__(self, name) -> bool:
        return name in self._order

    def __iter__(self):
        return iter(list(self._order))

    def __len__(self) -> int:
        return len(self._order)


class LazyGroup(TyperGroup):
    """The root group: the commands built with the app (``version``) plus :data:`LAZY_COMMANDS`, loaded
    on first lookup (:class:`LazyCommands`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        PlainCoercion.install(self)  # the root and its eager commands (version)
        self.commands = LazyCommands(self.commands, LAZY_COMMANDS)


_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]{0,17})\Z")
_DECIMAL = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]{1,3})?\Z")
_NUMBERS = {int: _INTEGER, float: _DECIMAL}
_PLAIN_KINDS = (str, bool, int, float)


class PlainCoercion:
    """Conversion of one plain option (``str``, ``bool``, ``int`` or ``float``, single-valued,
    unconstrained) without building a pydantic adapter.

    typer (>= 0.22) converts every option value, ``--help`` included, with a pydantic ``TypeAdapter``;
    importing pydantic and building the adapters is a large part of a short command's start-up. Here
    ``None`` and a value that already has the option's type are kept, and text in plain decimal
    notation (:data:`_INTEGER`, :data:`_DECIMAL`: where Python's ``int``/``float`` and pydantic give the
    same number) is converted with ``int``/``float``; anything else (``+7``, ``1_000``, `` 0.5``,
    ``abc``, ``yes``) goes to typer's own conversion, built on first need, so what is accepted and every
    error message stay typer's.
    """

    def __init__(self, descriptor):
        self.descriptor = descriptor
        self.kind = descriptor.annotation
        self._typer = None

    @classmethod
    def install(cls, command) -> None:
        """Give every plain option of ``command`` (its ``--help`` too, and those of its subcommands)
        this conversion. A typer without runtime conversion (options without ``type_descriptor``)
        keeps its own."""
        for param in command.params:
            cls._install_param(param)
        if getattr(command, "_help_option", False) is None:  # typer builds --help on first use
            build_help_option = command.get_help_option

            def get_help_option(ctx):
                option = build_help_option(ctx)
                if option is not None:
                    cls._install_param(option)
                return option

            command.get_help_option = get_help_option
        for sub in getattr(command, "commands", {}).values():
            cls.install(sub)

    @classmethod
    def _install_param(cls, param) -> None:
        descriptor = getattr(param, "type_descriptor", None)
        if descriptor is None or getattr(param, "_runtime_param", False) is not None:
            return
        missing = object()
        info = getattr(descriptor, "parameter_info", missing)
        if info is missing or getattr(descriptor, "file_annotation", missing) is missing:
            return  # another typer than the one this was written against: it keeps its own conversion
        try:
            from typer._coercion import build_runtime_param  # noqa: F401  (used by coerce, checked now)
        except ImportError:
            return
        plain = (
            getattr(descriptor, "annotation", None) in _PLAIN_KINDS
            and descriptor.file_annotation is None
            and getattr(info, "parser", None) is None
            and getattr(info, "min", None) is None
            and getattr(info, "max", None) is None
            and not param.multiple
            and param.nargs == 1
            and getattr(descriptor, "is_path", True) is False
            and getattr(descriptor, "is_choice", True) is False
        )
        if plain:
            param._runtime_param = cls(descriptor)

    def coerce(self, value, param, ctx):
        """The option's value (typer's ``RuntimeParam.coerce`` contract)."""
        if value is None or type(value) is self.kind:
            return value
        pattern = _NUMBERS.get(self.kind)
        if pattern is not None and type(value) is str and pattern.match(value):
            return self.kind(value)
        if self._typer is None:
            from typer._coercion import build_runtime_param

            self._typer = build_runtime_param(self.descriptor)
        return self._typer.coerce(value, param=param, ctx=ctx)


app = typer.Typer(
    name="batchlab",
    help="The science of batch size: exact NQM, measured steps-to-result, critical batch size.",
    no_args_is_help=True,
    invoke_without_command=False,
    cls=LazyGroup,
    **_BUILD_SETTINGS,
)


@app.command("version")
def version() -> None:
    """Print the batchlab version."""
    from batchlab import __version__

    print(__version__)


def fail(message: str) -> None:
    """Print a one-line user error and exit with status 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _print_version(value: bool) -> None:
    """``batchlab --version``: print the version (as ``batchlab version`` does) and stop."""
    if value:
        version()
        raise typer.Exit()


@app.callback()
def _root(
    show_version: bool = typer.Option(False, "--version", help="Print the batchlab version and exit.",
                                      callback=_print_version, is_eager=True),
) -> None:
    """The science of batch size: exact NQM, measured steps-to-result, critical batch size."""


try:  # recent typer vendors click under typer._click; older ones use click itself
    from typer._click.exceptions import UsageError as _UsageError
except ImportError:  # pragma: no cover
    from click.exceptions import UsageError as _UsageError


def _is_data_read_error(exc: Exception) -> bool:
    """Whether ``exc`` is DuckDB failing to read a file (I/O, or a file it cannot decode: a damaged
    data file that passed the store's per-read checks), not an error in a query (binder, parser, ...)."""
    return type(exc).__module__ in ("duckdb", "_duckdb") and type(exc).__name__ in (
        "Error", "IOException", "InvalidInputException")


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
    except OSError as exc:  # a full disk, a read-only directory, an unreadable file, where no module said more
        from batchlab.atomic import os_error_text

        fail(os_error_text(exc).replace("\n", " "))
    except Exception as exc:
        if not _is_data_read_error(exc):
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        fail(f"cannot read the store's data files: {first} (a damaged file? `batchlab store repair --store DIR "
             "--dry-run` checks every file against the size and sha256 recorded when it was committed)")
    # Without standalone mode typer returns the status of typer.Exit, and turns Ctrl-C into status 130.
    if code == 130:
        print("interrupted", file=sys.stderr)
    if isinstance(code, int) and not isinstance(code, bool) and code:
        raise SystemExit(code)
