"""Finding a workload: by registered name, entry point, or reference to a function returning one.

:func:`resolve_workload` accepts, in this order:

1. a :class:`~batchlab.workloads.base.Workload` object (returned as is);
2. ``"package.module:function"`` or ``"path/to/file.py:function"`` (any string with a ``:``): the
   function (called without arguments) returns a Workload; a Workload object at that name is taken
   as is. A file path is resolved against the current directory and imported under a module name
   unique to its absolute path (two files called ``workload.py`` do not clash; the import rules are
   :mod:`batchlab.references`'s, shared with the checkpoint adapters). The result is cached
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
import importlib.metadata
from typing import Any

from batchlab.errors import BatchlabError, unknown_name_error
from batchlab.references import ReferenceKind, is_reference
from batchlab.workloads.base import Workload

__all__ = [
    "ENTRY_POINT_GROUP", "resolve_workload", "register_workload", "workload_key", "worker_resolvable",
    "is_reference", "normalize_reference", "entry_point_names", "cached",
]

ENTRY_POINT_GROUP = "batchlab.workloads"

#: Workload references: errors ``workload reference 'REF': ...``, files imported as ``batchlab_user_workload_*``.
WORKLOAD_REFERENCE = ReferenceKind("workload", "function", "batchlab_user_workload")

_RESOLVED: dict[str, Workload] = {}  # normalised reference -> workload, per process


def normalize_reference(reference: str) -> str:
    """The reference with a file path made absolute (``~`` expanded, against the current directory)."""
    return WORKLOAD_REFERENCE.normalize(reference)


def cached(reference: str) -> Workload | None:
    """The workload this process resolved from the normalised ``reference``, if any."""
    return _RESOLVED.get(reference)


def _load_reference(reference: str, normalized: str) -> Workload:
    kind = WORKLOAD_REFERENCE
    _, attribute = kind.split(normalized)
    _, obj = kind.attribute_of(reference, normalized, offered=lambda value: isinstance(value, Workload))
    if isinstance(obj, Workload):
        result = obj
    elif callable(obj):
        result = kind.call(reference, attribute, obj)
        if not isinstance(result, Workload):
            raise kind.error(reference, f"{attribute}() returned {type(result).__name__}, not a batchlab Workload")
    else:
        raise kind.error(reference, f"{attribute} is a {type(obj).__name__}, not a function returning a batchlab Workload")
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
