"""User-facing errors.

Every error a user can cause (a bad flag value, a malformed file, an unknown name) is raised as a
:class:`BatchlabError` whose message is one line naming the problem and the allowed values. The
command line prints it as ``error: <message>`` and exits with status 2, with no traceback.
"""

from __future__ import annotations

import codecs
import difflib
import operator
from collections.abc import Iterable
from typing import Any


class BatchlabError(ValueError):
    """A problem with the user's input; the message is a single line fit to print as is."""


def printable(text: str) -> str:
    """``text`` (a file name, a cell of a user's file) with every non-printable character (newline, NUL,
    an escape sequence's ESC) written as its ``\\n``/``\\xNN`` escape, so a message stays one clean line."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def one_line(text, limit: int = 300) -> str:
    """``text`` (e.g. a library's error message quoting a user's file) fit for a one-line error: runs of
    whitespace become one space, other non-printable characters their escapes (:func:`printable`),
    and anything past ``limit`` characters ``...``."""
    flat = printable(" ".join(str(text).split()))
    return flat if len(flat) <= limit else flat[:limit] + " ..."


# Byte-order marks, UTF-32 first (its little-endian mark starts with UTF-16's).
_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
         (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"))


def not_utf8_reason(data: bytes, complete: bool = True) -> str | None:
    """Why ``data`` (a file's bytes; its first bytes only when not ``complete``) is not UTF-8 text, as
    the end of a sentence naming the file, or None when it is UTF-8 (a UTF-8 byte-order mark is
    allowed). Names UTF-16/32 (by their byte-order marks), NUL bytes (binary data, or UTF-16/32
    without a mark) and the first invalid byte with its line (Latin-1 and other 8-bit encodings)."""
    for bom, name in _BOMS:
        if data.startswith(bom):
            return f"is {name} text; batchlab reads UTF-8: convert it (e.g. iconv -f {name} -t UTF-8)"
    if b"\x00" in data:
        return "holds NUL bytes (binary data, or UTF-16/32 text without a byte-order mark); it must be UTF-8 text"
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final=complete)
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        return (f"is not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line}; Latin-1 or another "
                "encoding?); batchlab reads UTF-8: convert it (e.g. iconv -f LATIN1 -t UTF-8)")
    return None


def decode_utf8(data: bytes, what: str) -> str:
    """``data`` decoded as UTF-8 (a leading byte-order mark dropped); else a one-line
    :class:`BatchlabError` starting with ``what`` (e.g. the file's name) and saying why
    (:func:`not_utf8_reason`)."""
    reason = not_utf8_reason(data)
    if reason is not None:
        raise BatchlabError(f"{what} {reason}")
    return data.decode("utf-8-sig")


def unknown_name_error(kind: str, name: str, known: Iterable[str]) -> BatchlabError:
    """Return the error for an unknown ``name`` of ``kind``, suggesting the closest known name."""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return BatchlabError(f"unknown {kind} {name!r}{hint}; known: {', '.join(known)}")


def checked_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an ``int`` (anything with ``__index__``, e.g. a numpy integer; not a float and not a
    bool), at least ``minimum`` (and at most ``maximum`` when given); else a one-line
    :class:`BatchlabError` naming ``name`` and the allowed values: ``NAME must be an integer >= MINIMUM,
    got VALUE`` (not an integer; ``an integer from MINIMUM to MAXIMUM`` with a maximum), ``NAME must
    be >= MINIMUM, got VALUE`` (too small, no maximum) or ``NAME VALUE is out of range; allowed:
    integers from MINIMUM to MAXIMUM``."""
    allowed = f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum}"
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise BatchlabError(f"{name} must be {allowed}, got {value!r}") from None
    if maximum is not None and not minimum <= value <= maximum:
        raise BatchlabError(f"{name} {value} is out of range; allowed: integers from {minimum} to {maximum}")
    if value < minimum:
        raise BatchlabError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


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
