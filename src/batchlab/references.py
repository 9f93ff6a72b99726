"""References to the user's Python objects: ``package.module:attribute`` or ``path/to/file.py:attribute``.

A *reference* is a string ``TARGET:ATTRIBUTE``. ``TARGET`` is a file path when it ends in ``.py`` or
holds a path separator, else a module name; ``ATTRIBUTE`` is a (dotted) name in that module, split at
the last ``:``. The *normalised* reference has the file path made absolute (``~`` expanded, against
the current directory), so the same file named two ways is one reference.

A file is imported once per process under a module name unique to its absolute path
(``{prefix}_{stem}_{sha1(path)[:12]}``, so two files called ``workload.py`` do not clash) and held in
``sys.modules`` under it (pickling and dataclasses look modules up there); a file whose import failed
is removed again and imported anew on the next use. A module name is imported with
:func:`importlib.import_module`.

Each use names its kind (:class:`ReferenceKind`: ``workload``, ``adapter``), and every problem is one
:class:`~batchlab.errors.BatchlabError` line ``KIND reference 'REF': PROBLEM`` (``bad KIND reference
...`` for a malformed one); an exception in the user's code is named by its type and its message on
one line. What a reference resolves to, and whether that is cached, is the user's of this module
(:mod:`batchlab.workloads.references`, :mod:`batchlab.integrations.branched`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from batchlab.errors import BatchlabError, one_line

__all__ = ["ReferenceKind", "is_reference", "is_file_target"]


def is_reference(text: Any) -> bool:
    """Whether ``text`` is a reference (a string with a ``:``) rather than a name."""
    return isinstance(text, str) and ":" in text


def is_file_target(target: str) -> bool:
    """Whether a reference's ``target`` is a file path (ends in ``.py`` or holds a path separator)."""
    return target.endswith(".py") or "/" in target or os.sep in target


@dataclass(frozen=True)
class ReferenceKind:
    """One kind of reference: how its errors name it and its files' modules.

    ``kind``: the word errors start with (``"workload"``: ``workload reference 'REF': ...``);
    ``attribute``: what the attribute is called in them (``"function"``: ``no function 'f' in ...``,
    ``expected package.module:function or path/to/file.py:function``); ``module_prefix``: the start
    of the module names user files are imported under.
    """

    kind: str
    attribute: str
    module_prefix: str

    def error(self, reference: str, problem: str) -> BatchlabError:
        """``KIND reference 'REF': PROBLEM`` as an error."""
        return BatchlabError(f"{self.kind} reference {reference!r}: {problem}")

    def user_error(self, reference: str, where: str, exc: BaseException) -> BatchlabError:
        """The error for an exception the user's code raised ``where`` (``while importing x.py``):
        ``KIND reference 'REF': TYPE WHERE: MESSAGE`` (the message on one line)."""
        return self.error(reference, f"{type(exc).__name__} {where}: {one_line(exc) or '(no message)'}")

    def split(self, reference: str) -> tuple[str, str]:
        """``(target, attribute)`` of ``reference``; a malformed one is an error naming the two forms."""
        target, sep, attribute = str(reference).rpartition(":")
        if not sep or not target or not attribute or not attribute.replace("_", "a").replace(".", "a").isalnum():
            raise BatchlabError(f"bad {self.kind} reference {reference!r}: expected package.module:{self.attribute} "
                                f"or path/to/file.py:{self.attribute}")
        return target, attribute

    def normalize(self, reference: str) -> str:
        """``reference`` with a file path made absolute (``~`` expanded, against the current directory)."""
        target, attribute = self.split(reference)
        if is_file_target(target):
            return f"{Path(target).expanduser().resolve()}:{attribute}"
        return f"{target}:{attribute}"

    def import_target(self, reference: str, target: str) -> ModuleType:
        """The module a reference's ``target`` names: a file imported once per process (module
        docstring), or an importable module; ``reference`` is what errors quote."""
        if is_file_target(target):
            return self._import_file(reference, Path(target))
        try:
            return importlib.import_module(target)
        except ModuleNotFoundError as exc:
            if exc.name and (target == exc.name or target.startswith(exc.name + ".")):
                raise self.error(reference, f"module {target!r} not found (is it installed, or on PYTHONPATH?)") from None
            raise self.user_error(reference, f"while importing module {target!r}", exc) from exc
        except Exception as exc:
            raise self.user_error(reference, f"while importing module {target!r}", exc) from exc

    def _import_file(self, reference: str, path: Path) -> ModuleType:
        digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
        name = f"{self.module_prefix}_{''.join(c if c.isalnum() else '_' for c in path.stem)}_{digest}"
        if name in sys.modules:
            return sys.modules[name]
        if not path.is_file():
            raise self.error(reference, f"file not found: {path}")
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise self.error(reference, f"cannot import {path} as Python")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look modules up here
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:
            sys.modules.pop(name, None)  # imported anew next time (the file may be fixed)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise self.user_error(reference, f"while importing {path}", exc) from exc
        return module

    def attribute_of(self, reference: str, normalized: str,
                     offered: Callable[[Any], bool] = lambda value: False) -> tuple[ModuleType, Any]:
        """``(module, object)`` the normalised reference names, the module imported as
        :meth:`import_target`. A missing attribute is an error listing the module's public names
        that could be meant: the functions and classes it defines, and the values ``offered`` accepts
        (e.g. Workload objects)."""
        target, attribute = self.split(normalized)
        module = self.import_target(reference, target)
        obj: Any = module
        for part in attribute.split("."):
            if not hasattr(obj, part):
                known = sorted(n for n, v in vars(module).items() if not n.startswith("_") and (
                    offered(v) or (callable(v) and getattr(v, "__module__", None) == module.__name__)))
                hint = f"; found: {', '.join(known)}" if known else ""
                where = target if is_file_target(target) else f"module {target!r}"
                raise self.error(reference, f"no {self.attribute} {attribute!r} in {where}{hint}")
            obj = getattr(obj, part)
        return module, obj

    def call(self, reference: str, attribute: str, function: Callable[[], Any]) -> Any:
        """``function()`` (the referenced factory, called without arguments); a BatchlabError it raises
        comes back prefixed with the reference, any other exception as :meth:`user_error`
        ``TYPE in ATTRIBUTE(): MESSAGE``."""
        try:
            return function()
        except BatchlabError as exc:
            raise self.error(reference, str(exc)) from exc
        except Exception as exc:
            raise self.user_error(reference, f"in {attribute}()", exc) from exc
