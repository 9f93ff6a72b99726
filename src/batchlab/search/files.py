"""Search spaces read from files (``--search-space FILE``), and the UTF-8 TOML or JSON text they are.

A search-space file holds the batch_science ``parameter_configs`` form (:mod:`batchlab.search.space`)
in one of two layouts:

* **one search space**: parameter name -> config, e.g. in TOML ``[learning_rate]`` with ``type``,
  ``min_value``, ``max_value``, ``scale``; it applies to the one optimizer of a study or sweep;
* **search spaces keyed by optimizer**: optimizer name -> parameter_configs, e.g. ``[sgd.learning_rate]``
  (the layout of a sweep config's ``search_spaces`` table); each key must be one of the optimizers
  searched, and an optimizer the file leaves out keeps its space from elsewhere.

The layout is read from the content: a file whose every top-level value is a table without a
``type`` field is keyed by optimizer; any other file is one search space (every parameter config
has a ``type``). The format is read from the extension, ``.toml`` or ``.json``; with any other
extension, a file whose first non-blank character is ``{`` is JSON, any other TOML. JSON is strict:
no ``NaN``/``Infinity``, no key given twice.

Every problem (missing, unreadable or non-UTF-8 file, empty, bad TOML or JSON, not an object, a bad
parameter, an optimizer not searched, one space for several optimizers) is one
:class:`~batchlab.errors.BatchlabError` line naming the file.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from batchlab.errors import BatchlabError, decode_utf8

__all__ = ["read_text", "read_document", "search_spaces_from_file"]


def read_text(path: str | os.PathLike, what: str) -> str:
    """The UTF-8 text of the file at ``path`` (a leading byte-order mark dropped; ``what`` names the file
    in errors, e.g. ``"sweep config"``).

    Raises:
        BatchlabError: one line: the file is missing, a directory, unreadable, or not UTF-8 text.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise BatchlabError(f"{what} {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise BatchlabError(f"{what} {str(path)!r} is a directory, not a file") from None
    except OSError as exc:
        raise BatchlabError(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}") from None
    return decode_utf8(data, f"{what} {str(path)!r}")


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """``text`` parsed as TOML (a table); BatchlabError naming ``source`` and the first problem."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BatchlabError(f"{source}: not valid TOML: {str(exc).splitlines()[0]}") from None


def parse_json(text: str, source: str) -> Any:
    """``text`` parsed as strict JSON (no NaN or Infinity, no key twice); BatchlabError naming ``source``."""

    def refuse_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON; allowed: finite numbers")

    def refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ValueError(f"key {key!r} given twice")
            out[key] = value
        return out

    try:
        return json.loads(text, parse_constant=refuse_constant, object_pairs_hook=refuse_duplicates)
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise BatchlabError(f"{source}: not valid JSON: {str(exc).splitlines()[0]}") from None


def read_document(path: str | os.PathLike, what: str) -> Any:
    """The TOML or JSON document in the file at ``path`` (format as in the module docstring).

    Raises:
        BatchlabError: one line: anything :func:`read_text` refuses, an empty file, bad TOML or JSON.
    """
    text = read_text(path, what)
    source = f"{what} {str(path)!r}"
    if not text.strip():
        raise BatchlabError(f"{source} is empty; allowed: a TOML or JSON object of parameter configs")
    suffix = Path(path).suffix.lower()
    is_json = suffix == ".json" or (suffix != ".toml" and text.lstrip().startswith("{"))
    return parse_json(text, source) if is_json else parse_toml(text, source)


def _keyed_by_optimizer(document: Mapping[str, Any]) -> bool:
    """Whether ``document`` is optimizer -> parameter_configs (its values are tables without ``type``)."""
    return all(isinstance(value, Mapping) and "type" not in value for value in document.values())


def search_spaces_from_file(path: str | os.PathLike, optimizers: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The search spaces of the file at ``path`` for a study or sweep searching ``optimizers``, as
    ``{optimizer: parameter_configs}`` (only the optimizers the file names; layouts as in the module
    docstring). Each space is checked and returned as written, as a sweep config's ``search_spaces``
    are, so the same space gives the same sweep id from either.

    Raises:
        BatchlabError: one line naming the file and the problem.
    """
    from batchlab.search.space import SearchSpace

    what = "search-space file"
    document = read_document(path, what)
    source = f"{what} {str(path)!r}"
    if not isinstance(document, Mapping) or not document:
        raise BatchlabError(f"{source}: must be an object of parameter name -> config (type, min_value/max_value or "
                            f"feasible_points, scale), or of optimizer name -> such an object; got {document!r:.80}")
    keyed = _keyed_by_optimizer(document)
    if keyed:
        extra = [name for name in document if name not in optimizers]
        if extra:
            from batchlab.optim import optimizer_names

            hint = "" if extra[0] in optimizer_names() else (
                " (a file holding one search space needs a type in every parameter config)")
            raise BatchlabError(f"{source}: optimizer {extra[0]!r} is not searched here; allowed: "
                                + ", ".join(optimizers) + hint)
        spaces = dict(document)
    elif len(optimizers) == 1:
        spaces = {optimizers[0]: document}
    else:
        raise BatchlabError(f"{source}: holds one search space but {len(optimizers)} optimizers are searched ("
                            + ", ".join(optimizers) + "); key it by optimizer name ([" + optimizers[0]
                            + ".learning_rate] in TOML)")
    for optimizer, configs in spaces.items():
        try:
            SearchSpace.from_batch_science(configs)
        except BatchlabError as exc:
            where = f"{source}: {optimizer}" if keyed else source
            raise BatchlabError(f"{where}: {exc}") from None
    return {optimizer: dict(configs) for optimizer, configs in spaces.items()}
