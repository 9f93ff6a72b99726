"""Everything the command line prints, in one place: JSON documents, tables, notes, output paths.

Every command prints through these functions, so that the rules hold everywhere:

* :func:`emit_json` writes one valid JSON document (one line) on stdout. Non-finite floats become
  ``null`` (a JSON parser rejects ``NaN``/``Infinity``), numpy scalars and arrays become numbers and
  lists, paths become strings (:func:`json_ready` is the conversion alone). ``--json`` output that is
  a stream of objects calls it once per object (JSON lines).
* :func:`print_table` prints a rich table on stdout that never cuts a cell: on a terminal long cells
  fold onto the next line; written to a file or a pipe the table gets the width its content needs
  (no 80-column cut), so workload names, learning rates and ids stay whole and greppable.
* :func:`note` writes one line on stderr (progress, "created a new store at ...", hints), so stdout
  stays the command's result.
* :func:`check_output_path` refuses an output file or directory whose parent directory does not exist
  (a mistyped path is an error, never a silently created directory tree).

:func:`fmt` and :func:`cell` are the number formats of table cells.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePath
from typing import Any

from batchlab.errors import BatchlabError

__all__ = ["cell", "check_output_path", "emit_json", "fmt", "json_ready", "line", "note", "print_table"]


def json_ready(obj: Any, *, keep_infinite: bool = False) -> Any:
    """``obj`` as plain JSON types: non-finite floats as ``None``, numpy/torch scalars and arrays as
    numbers and lists, paths as strings, tuples and sets as lists, dataclasses as dicts, mapping keys
    as strings; any other object as its ``str``. The result always passes ``json.dumps(allow_nan=False)``.

    ``keep_infinite`` keeps +-inf (for text tables, where B_crit = inf must not read as unknown; the
    result is then no longer valid JSON)."""
    def convert(value: Any) -> Any:
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            if math.isfinite(value) or keep_infinite and math.isinf(value):
                return float(value)
            return None
        if isinstance(value, Mapping):
            return {str(k): convert(v) for k, v in value.items()}
        if isinstance(value, PurePath):
            return str(value)
        if isinstance(value, (list, tuple)):
            return [convert(v) for v in value]
        if isinstance(value, (set, frozenset)):
            return [convert(v) for v in sorted(value, key=repr)]
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return convert(dataclasses.asdict(value))
        if hasattr(value, "tolist") and not isinstance(value, (bytes, bytearray)):  # numpy, torch
            try:
                return convert(value.tolist())
            except (TypeError, ValueError):
                pass
        if hasattr(value, "item"):
            try:
                return convert(value.item())
            except (TypeError, ValueError):
                pass
        if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
            return [convert(v) for v in value]
        return str(value)

    return convert(obj)


def emit_json(obj: Any, file: Any = None) -> None:
    """Print ``obj`` as one JSON document on one line of ``file`` (default stdout; see :func:`json_ready`)."""
    print(json.dumps(json_ready(obj), allow_nan=False), file=file or sys.stdout, flush=True)


def note(message: str) -> None:
    """One line on stderr (progress, notes, hints); stdout stays the command's result."""
    print(str(message).replace("\n", " "), file=sys.stderr, flush=True)


def line(message: str = "") -> None:
    """One plain line on stdout (a table's warnings and notes), never wrapped."""
    print(message, flush=True)


def check_output_path(path: str | Path, what: str = "output path") -> Path:
    """``path`` as a Path, or a one-line BatchlabError when its parent directory does not exist (or is
    not a directory). The path itself may or may not exist; nothing is created."""
    out = Path(path).expanduser()
    parent = out.parent
    if not parent.exists():
        raise BatchlabError(f"{what} {str(path)!r}: the directory {str(parent)!r} does not exist (create it first)")
    if not parent.is_dir():
        raise BatchlabError(f"{what} {str(path)!r}: {str(parent)!r} is not a directory")
    return out


def fmt(value: Any) -> str:
    """A number for a table cell: ints as they are, floats with 4 significant digits (``inf``, ``nan``
    as such), booleans as ``true``/``false``, ``None`` as empty."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if hasattr(value, "item") and not isinstance(value, float):
        try:
            value = value.item()
        except (TypeError, ValueError):
            return str(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
    try:
        return f"{float(value):.4g}"
    except (TypeError, ValueError):
        return str(value)


def cell(value: Any) -> str:
    """Any value as a table cell: numbers through :func:`fmt`, a ``{"value": ...}`` dict as its value,
    ``None`` as empty, anything else as its ``str``."""
    if isinstance(value, dict) and "value" in value:
        value = value["value"]
    if value is None:
        return ""
    if isinstance(value, (bool, int, float)) or hasattr(value, "item"):
        return fmt(value)
    return str(value)


def print_table(title: str | None, columns: Sequence[str | tuple[str, str]], rows: Sequence[Sequence[Any]], *,
                caption: str | None = None) -> None:
    """Print a table on stdout. ``columns``: header names, or ``(name, justify)`` pairs with justify
    ``"left"``/``"right"``/``"center"`` (default: left for the first column, right for the others);
    ``rows``: sequences of cell values (strings as they are, other values through :func:`cell`).

    No cell is ever cut: on a terminal a long cell folds onto the next line; on a file or a pipe the
    table is as wide as its content needs."""
    from rich.table import Table

    table = Table(title=title, caption=caption, caption_justify="left")
    for index, column in enumerate(columns):
        name, justify = (column, "left" if index == 0 else "right") if isinstance(column, str) else column
        table.add_column(name, justify=justify, overflow="fold")
    for row in rows:
        table.add_row(*(value if isinstance(value, str) else cell(value) for value in row))
    probe = _stdout_console()
    if probe.is_terminal:
        probe.print(table)
        return
    width = max(20, _stdout_console(width=100_000).measure(table).maximum)
    _stdout_console(width=width, color_system=None).print(table)


def _stdout_console(**options: Any):
    """A rich Console on stdout whose reader going away (``batchlab ... | head``) raises
    BrokenPipeError, which :func:`batchlab.cli.main` turns into a quiet exit 0 like any other output
    (rich's own default is ``SystemExit(1)``)."""
    from rich.console import Console

    class _StdoutConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return _StdoutConsole(file=sys.stdout, markup=False, highlight=False, emoji=False, **options)
