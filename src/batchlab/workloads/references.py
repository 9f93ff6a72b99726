"""Finding a workload: by registered name, entry point, or reference to a function returning one.

:func:`resolve_workload` accepts, in this order:

1. a :class:`~batchlab.workloads.base.Workload` object (returned as is);
2. ``"package.module:function"`` or ``"path/to/file.py:function"`` (any string with a ``:``): the
   function (called without arguments) returns a Workload; a Workload object at that name is taken
   as is. A file path is resolved against the current directory and imported under a module name
   unique to its absolute path (two files called ``workload.py`` do not clash). The result is cached
   per process under the normalised reference (``/abs/path/file.py:function`` or
   ``package.module:function``), stored in ``workload.reference``; the workload pickles as that
   reference, so pool and Dask workers re-import it;
3. a registered name ``dataset/model`` (the built-ins, and :func:`register_workload`);
4. the name of an entry point in the group ``batchlab.workloads`` (its value
   ``package.module:function`` is resolved as in 2).

A bad reference raises one :class:`~batchlab.errors.BatchlabError` line naming the reference and the
problem (missing file, missing module, missing function, a result that is not a Workload, an
exception in the user's code: its type and message).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from batchlab.errors import BatchlabError, unknown_name_error
from batchlab.workloads.base import Workload

__all__ = [
    "ENTRY_POINT_GROUP", "resolve_workload", "register_workload", "workload_key", "worker_resolvable",
    "is_reference", "normalize_reference", "entry_point_names", "cached",
]

ENTRY_POINT_GROUP = "batchlab.workloads"

_RESOLVED: dict[str, Workload] = {}  # normalised reference -> workload, per process
_FILE_MODULES: dict[str, Any] = {}  # absolute path -> imported module


def is_reference(text: str) -> bool:
    """Whether ``text`` is a reference (``module:function`` or ``file.py:function``) rather than a name."""
    return isinstance(text, str) and ":" in text


def _split(reference: str) -> tuple[str, str]:
    target, sep, attribute = reference.rpartition(":")
    if not sep or not target or not attribute or not attribute.replace("_", "a").replace(".", "a").isalnum():
        raise BatchlabError(f"bad workload reference {reference!r}: expected package.module:function or path/to/file.py:function")
    return target, attribute


def _is_file(target: str) -> bool:
    return target.endswith(".py") or "/" in target or os.sep in target


def normalize_reference(reference: str) -> str:
    """The reference with a file path made absolute (``~`` expanded, against the current directory)."""
    target, attribute = _split(reference)
    if _is_file(target):
        return f"{Path(target).expanduser().resolve()}:{attribute}"
    return f"{target}:{attribute}"


def cached(reference: str) -> Workload | None:
    """The workload this process resolved from the normalised ``reference``, if any."""
    return _RESOLVED.get(reference)


def _problem(reference: str, problem: str) -> BatchlabError:
    return BatchlabError(f"workload reference {reference!r}: {problem}")


def _user_error(reference: str, where: str, exc: BaseException) -> BatchlabError:
    message = " ".join(str(exc).split()) or "(no message)"
    return _problem(reference, f"{type(exc).__name__} {where}: {message}")


def _import_file(reference: str, path: Path) -> Any:
    key = str(path)
    if key in _FILE_MODULES:
        return _FILE_MODULES[key]
    if not path.is_file():
        raise _problem(reference, f"file not found: {path}")
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    module_name = f"batchlab_user_workload_{''.join(c if c.isalnum() else '_' for c in path.stem)}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise _problem(reference, f"cannot import {path} as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up here
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(module_name, None)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise _user_error(reference, f"while importing {path}", exc) from exc
    _FILE_MODULES[key] = module
    return module


def _import_module(reference: str, name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise _problem(reference, f"module {name!r} not found (is it installed, or on PYTHONPATH?)") from None
        raise _user_error(reference, f"while importing module {name!r}", exc) from exc
    except Exception as exc:
        raise _user_error(reference, f"while importing module {name!r}", exc) from exc


def _load_reference(reference: str, normalized: str) -> Workload:
    target, attribute = _split(normalized)
    if _is_file(target):
        module, where = _import_file(reference, Path(target)), target
    else:
        module, where = _import_module(reference, target), f"module {target!r}"
    obj: Any = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            known = sorted(n for n, v in vars(module).items() if not n.startswith("_") and (
                isinstance(v, Workload) or (callable(v) and getattr(v, "__module__", None) == module.__name__)))
            hint = f"; found: {', '.join(known)}" if known else ""
            raise _problem(reference, f"no function {attribute!r} in {where}{hint}")
        obj = getattr(obj, part)
    if isinstance(obj, Workload):
        result = obj
    elif callable(obj):
        try:
            result = obj()
        except BatchlabError as exc:
            raise _problem(reference, str(exc)) from exc
        except Exception as exc:
            raise _user_error(reference, f"in {attribute}()", exc) from exc
        if not isinstance(result, Workload):
            raise _problem(reference, f"{attribute}() returned {type(result).__name__}, not a batchlab Workload")
    else:
        raise _problem(reference, f"{attribute} is a {type(obj).__name__}, not a function returning a batchlab Workload")
    if result.reference != normalized:
        result = dataclasses.replace(result, reference=normalized)
    return result


def _resolve_reference(reference: str) -> Workload:
    normalized = normalize_reference(reference)
    if normalized not in _RESOLVED:
        _RESOLVED[normalized] = _load_reference(reference, normalized)
    return _RESOLVED[normalized]


def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def entry_point_names() -> list[str]:
    """Names of the workloads installed packages publish in the ``batchlab.workloads`` entry-point group."""
    return sorted(_entry_points())


def _resolve_entry_point(name: str, entry_point: Any) -> Workload:
    value = entry_point.value.strip()
    if ":" not in value:
        raise BatchlabError(f"workload entry point {name!r} ({value}): its value must be package.module:function")
    workload = _resolve_reference(value)
    if workload.name != name:
        raise BatchlabError(f"workload entry point {name!r} ({value}) returned the workload {workload.name!r}; the entry point name must be the workload name")
    return workload


def resolve_workload(workload: Any) -> Workload:
    """The :class:`Workload` for an object, a registered or entry-point name, or a reference (module docstring).

    Raises:
        BatchlabError: unknown name (closest suggested), or a bad reference (one line naming it and the problem).
    """
    from batchlab.workloads import registry

    if isinstance(workload, Workload):
        return workload
    if not isinstance(workload, str):
        raise BatchlabError(f"a workload must be a Workload, a name dataset/model or a reference module:function / file.py:function, got {type(workload).__name__}")
    if is_reference(workload):
        return _resolve_reference(workload)
    if workload in registry.WORKLOADS:
        return registry.WORKLOADS[workload]
    entry_points = _entry_points()
    if workload in entry_points:
        return _resolve_entry_point(workload, entry_points[workload])
    raise unknown_name_error("workload", workload, sorted(set(registry.WORKLOADS) | set(entry_points)))


def register_workload(workload: Any) -> Workload:
    """Register a Workload (or what :func:`resolve_workload` accepts) under its name in this process,
    so ``get_workload(name)`` and every command of this process find it; returns it.

    Re-registering a name replaces the earlier entry (a re-run notebook cell), except a built-in's.
    A workload registered only here (no reference) cannot be sent to pool or Dask workers: use a
    reference (:func:`worker_resolvable`).
    """
    from batchlab.workloads import registry

    resolved = resolve_workload(workload)
    if resolved.name in registry.BUILTIN_NAMES and registry.WORKLOADS.get(resolved.name) is not resolved:
        raise BatchlabError(f"cannot register {resolved.name!r}: a built-in workload has that name; choose another dataset/model name")
    registry.WORKLOADS[resolved.name] = resolved
    return resolved


def workload_key(workload: Any) -> str:
    """The string that resolves to ``workload`` in another process: its normalised reference when the
    workload is the one that reference resolves to, else its name (a built-in, entry-point or
    registered name: :func:`worker_resolvable` says whether a fresh process can resolve it).

    A modified copy of a referenced workload (``dataclasses.replace(w, goal=...)``) keeps the
    ``reference`` field but is not what the reference gives, so its key is its name: sending the
    reference would make workers run the unmodified workload.
    """
    if isinstance(workload, str):
        if is_reference(workload):
            return normalize_reference(workload)
        workload = resolve_workload(workload)
    if not isinstance(workload, Workload):
        raise BatchlabError(f"a workload must be a Workload, a name or a reference, got {type(workload).__name__}")
    if workload.reference is not None and cached(workload.reference) is workload:
        return workload.reference
    return workload.name


def worker_resolvable(key: str) -> bool:
    """Whether a fresh worker process can resolve ``key`` (a :func:`workload_key`): a reference, a
    built-in name or an entry-point name; False for a workload registered only in this process."""
    from batchlab.workloads import registry

    if is_reference(key):
        return True
    return key in registry.BUILTIN_NAMES or key in _entry_points()
