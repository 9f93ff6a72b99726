"""Default search spaces per optimizer, in the batch_science form, and which space a study searches.

Each optimizer's constant-learning-rate space is declared in its registry entry
(``batchlab.optim.get_optimizer(name).search_space``; the built-ins and the reasons for their ranges
are in :mod:`batchlab.optim.builtin`); a workload may declare its own for an optimizer
(``Workload.search_spaces``), which replaces the entry's. With ``schedule="linear"`` the Shallue
linear-decay parameters are added: ``learning_rate_decay_steps`` INTEGER over [train_steps / 2,
train_steps] and ``end_learning_rate_factor`` LOG over [1e-4, 0.1] (docs/methods.md, "Optimizers,
schedules and search spaces"). :func:`study_search_space` applies the precedence of a study's space.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

from batchlab.errors import BatchlabError
from batchlab.search.space import Parameter, SearchSpace

SCHEDULES = ("constant", "linear")


def default_search_space(name: str, train_steps: int | None = None, schedule: str = "constant",
                         workload: Any = None) -> SearchSpace:
    """The default :class:`SearchSpace` for optimizer ``name``: ``workload``'s declared space for it
    (``workload.search_spaces[name]``, when given and declared), else its registry entry's ``search_space``.

    ``schedule="linear"`` adds ``learning_rate_decay_steps`` (INTEGER, LINEAR over
    [ceil(train_steps / 2), train_steps]) and ``end_learning_rate_factor`` (LOG over [1e-4, 0.1]),
    each unless the space already names it; it needs ``train_steps`` >= 1.
    """
    from batchlab.optim.registry import get_optimizer

    entry = get_optimizer(name)  # unknown name: one-line error
    if schedule not in SCHEDULES:
        raise BatchlabError(f"unknown schedule {schedule!r}; allowed: {', '.join(SCHEDULES)}")
    declared = {} if workload is None else workload.search_spaces
    if name in declared:
        parameters = list(SearchSpace.from_batch_science(declared[name]).parameters)
    else:
        parameters = list(entry.search_space)
    if schedule == "linear":
        if isinstance(train_steps, bool) or not isinstance(train_steps, numbers.Integral) or train_steps < 1:
            raise BatchlabError(f"the linear schedule needs train_steps, an integer >= 1, got {train_steps!r}")
        half = (int(train_steps) + 1) // 2
        decay = (
            Parameter(name="learning_rate_decay_steps", type="INTEGER", scale="LINEAR", min_value=max(1, half),
                      max_value=int(train_steps)),
            Parameter(name="end_learning_rate_factor", type="DOUBLE", scale="LOG", min_value=1e-4, max_value=0.1),
        )
        named = {p.name for p in parameters}
        parameters.extend(p for p in decay if p.name not in named)
    return SearchSpace(parameters)


def study_search_space(optimizer: str, given: Mapping[str, Any] | None = None, workload: Any = None,
                       train_steps: int | None = None, schedule: str = "constant") -> SearchSpace:
    """The space a study of ``optimizer`` searches, the first that applies: ``given`` (parameter_configs
    from ``--search-space`` or a sweep config's ``search_spaces``, taken as is), ``workload``'s declared
    space for ``optimizer``, the optimizer's default (the last two through :func:`default_search_space`,
    with ``schedule``)."""
    if given is not None:
        return SearchSpace.from_batch_science(given)
    return default_search_space(optimizer, train_steps=train_steps, schedule=schedule, workload=workload)
