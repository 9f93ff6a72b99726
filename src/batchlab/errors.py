"""User-facing errors.

Every error a user can cause (a bad flag value, a malformed file, an unknown name) is raised as a
:class:`BatchlabError` whose message is one line naming the problem and the allowed values. The
command line prints it as ``error: <message>`` and exits with status 2, with no traceback.
"""

from __future__ import annotations

import difflib
import operator
from collections.abc import Iterable
from typing import Any


class BatchlabError(ValueError):
    """A problem with the user's input; the message is a single line fit to print as is."""


def unknown_name_error(kind: str, name: str, known: Iterable[str]) -> BatchlabError:
    """Return the error for an unknown ``name`` of ``kind``, suggesting the closest known name."""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return BatchlabError(f"unknown {kind} {name!r}{hint}; known: {', '.join(known)}")


def checked_int(name: str, value: Any, minimum: int) -> int:
    """``value`` as an ``int`` (anything with ``__index__``; not a float), at least ``minimum``; else a
    one-line :class:`BatchlabError` naming ``name``."""
    try:
        value = operator.index(value)
    except TypeError:
        raise BatchlabError(f"{name} must be an integer, got {value!r}") from None
    if value < minimum:
        raise BatchlabError(f"{name} must be >= {minimum}, got {value}")
    return value


def increasing_ints(name: str, values: Any, minimum: int, item: str = "value") -> list[int]:
    """``values`` (a list-like, not a string) as a non-empty, strictly increasing list of ints, each at
    least ``minimum``; else a one-line :class:`BatchlabError` naming ``name`` (and ``item``, what one
    value is) and the rule."""
    rule = f"integers >= {minimum}, strictly increasing"
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise BatchlabError(f"{name} must be a list of {rule}, got {values!r}")
    out = []
    for value in values:
        try:
            value = operator.index(value)
        except TypeError:
            raise BatchlabError(f"{name} must hold integers >= {minimum}, got {value!r}") from None
        if value < minimum:
            raise BatchlabError(f"{name} must hold integers >= {minimum}, got {value}")
        out.append(int(value))
    if not out:
        raise BatchlabError(f"{name} needs at least one {item} ({rule})")
    if any(b <= a for a, b in zip(out, out[1:])):
        raise BatchlabError(f"{name} must be strictly increasing (no repeats), got {','.join(map(str, out))}")
    return out
