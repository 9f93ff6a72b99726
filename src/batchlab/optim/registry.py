"""The optimizer registry: name -> :class:`OptimizerEntry`, the one place every module reads optimizers from.

Three sources, in this order:

1. the built-ins (:data:`batchlab.optim.builtin.BUILTIN_OPTIMIZERS`);
2. entries registered in this process with :func:`register_optimizer`;
3. installed packages' entry points in the group ``batchlab.optimizers`` (``importlib.metadata``):
   each entry point's name is the optimizer name and its value a function taking no arguments that
   returns the :class:`OptimizerEntry`, e.g. in the package's ``pyproject.toml``::

       [project.entry-points."batchlab.optimizers"]
       adan = "my_package.optimizers:adan_entry"

   They are loaded lazily: :func:`get_optimizer` loads the one it is asked for, :func:`optimizer_names`
   loads them all. Pool and Dask workers see built-ins and entry points (they are found by name in any
   process); an entry registered with :func:`register_optimizer` exists only in the process that
   registered it, so sweep it with the inline executor (``--workers 1``) or publish it as an entry point.

A name in none of them is an error everywhere (building, defaults, search spaces): one line from
:func:`batchlab.errors.unknown_name_error` naming the closest known optimizer.
"""

from __future__ import annotations

from importlib import metadata

from batchlab.errors import BatchlabError, unknown_name_error
from batchlab.optim.entry import OptimizerEntry, Preconditioner, VectorizedUpdate
from batchlab.optim.hyperparameters import optimizer_defaults, resolve_hyperparameters
from batchlab.search.defaults import default_search_space  # reads the entries' search spaces

#: The entry-point group packages publish optimizers in.
ENTRY_POINT_GROUP = "batchlab.optimizers"

_entries: dict[str, OptimizerEntry] = {}
_builtin_names: frozenset[str] = frozenset()
_all_entry_points_loaded = False

__all__ = [
    "ENTRY_POINT_GROUP", "OptimizerEntry", "Preconditioner", "VectorizedUpdate", "default_search_space",
    "get_optimizer", "optimizer_defaults", "optimizer_names", "register_optimizer", "resolve_hyperparameters",
    "vectorized_optimizer_names",
]


def _registry() -> dict[str, OptimizerEntry]:
    """The registered entries, the built-ins put in first on the first call."""
    global _builtin_names
    if not _builtin_names:
        from batchlab.optim.builtin import BUILTIN_OPTIMIZERS

        builtins = {entry.name: entry for entry in BUILTIN_OPTIMIZERS}
        _entries.update({**builtins, **_entries})
        _builtin_names = frozenset(builtins)
    return _entries


def register_optimizer(entry: OptimizerEntry, *, replace: bool = False) -> OptimizerEntry:
    """Add ``entry`` to the registry (this process) and return it.

    Afterwards its name works everywhere an optimizer name does (``TrialSpec(optimizer=...)``,
    ``optimizer_defaults``, ``default_search_space``, sweeps with the inline executor). Registering the
    same entry object again is a no-op; another entry under a registered name is an error unless
    ``replace=True``; a built-in cannot be replaced (its results are in stores under its name).

    Raises:
        BatchlabError: ``entry`` is not an :class:`OptimizerEntry`, or its name is taken (see above).
    """
    if not isinstance(entry, OptimizerEntry):
        raise BatchlabError(f"register_optimizer needs a batchlab.optim.OptimizerEntry, got {type(entry).__name__}")
    registry = _registry()
    existing = registry.get(entry.name)
    if existing is not None and existing is not entry:
        if entry.name in _builtin_names:
            raise BatchlabError(f"optimizer {entry.name!r} is built in and cannot be replaced; register it under another name")
        if not replace:
            raise BatchlabError(f"optimizer {entry.name!r} is already registered; pass replace=True to replace it")
    registry[entry.name] = entry
    return entry


def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _load_entry_point(ep: metadata.EntryPoint) -> OptimizerEntry:
    """Load, call and check one entry point; one-line BatchlabError naming it when anything fails."""
    where = f"optimizer entry point {ep.name!r} ({ep.value})"
    try:
        factory = ep.load()
    except Exception as exc:  # an import error in the publishing package: say which entry point
        raise BatchlabError(f"{where}: cannot be loaded: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    if not callable(factory):
        raise BatchlabError(f"{where}: is not a function returning an OptimizerEntry")
    try:
        entry = factory()
    except Exception as exc:  # e.g. the entry's own declaration check: name the entry point, keep one line
        message = str(exc).splitlines()[0] if str(exc) else ""
        raise BatchlabError(f"{where}: failed: {type(exc).__name__}: {message}") from None
    if not isinstance(entry, OptimizerEntry):
        raise BatchlabError(f"{where}: returned {type(entry).__name__}, not a batchlab.optim.OptimizerEntry")
    if entry.name != ep.name:
        raise BatchlabError(f"{where}: returned an entry named {entry.name!r}; the names must agree")
    return entry


def get_optimizer(name: str) -> OptimizerEntry:
    """The entry of optimizer ``name`` (built in, registered, or from an installed entry point).

    Raises:
        BatchlabError: unknown name (one line, the closest known name suggested), or an entry point of
            that name that fails to load.
    """
    registry = _registry()
    entry = registry.get(name)
    if entry is not None:
        return entry
    if isinstance(name, str) and not _all_entry_points_loaded:
        ep = _entry_points().get(name)
        if ep is not None:
            return register_optimizer(_load_entry_point(ep))
    # The names known without loading anything more, so a broken entry point does not hide this error.
    known = list(registry) + ([n for n in _entry_points() if n not in registry] if not _all_entry_points_loaded else [])
    raise unknown_name_error("optimizer", str(name), known)


def optimizer_names() -> list[str]:
    """Every optimizer name: the built-ins (sgd, momentum, nesterov, adam, kfac, lars, lamb, adamw,
    soap, muon), then registered ones, then installed entry points (loaded here)."""
    global _all_entry_points_loaded
    registry = _registry()
    if not _all_entry_points_loaded:
        for name, ep in _entry_points().items():
            if name not in registry:
                register_optimizer(_load_entry_point(ep))
        _all_entry_points_loaded = True
    return list(registry)


def vectorized_optimizer_names() -> list[str]:
    """The optimizers whose entry has a vectorized update (trials can run stacked)."""
    return [name for name in optimizer_names() if _registry()[name].vectorized is not None]

