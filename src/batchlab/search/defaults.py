"""Default search spaces per optimizer, in the batch_science form.

Each optimizer's constant-learning-rate space is declared in its registry entry
(``batchlab.optim.get_optimizer(name).search_space``; the built-ins and the reasons for their ranges
are in :mod:`batchlab.optim.builtin`). With ``schedule="linear"`` the Shallue linear-decay parameters are
added: ``learning_rate_decay_steps`` INTEGER over [train_steps / 2, train_steps] and
``end_learning_rate_factor`` LOG over [1e-4, 0.1] (docs/methods.md, "Optimizers, schedules and search spaces").
"""

from __future__ import annotations

import numbers

from batchlab.errors import BatchlabError
from batchlab.search.space import Parameter, SearchSpace

SCHEDULES = ("constant", "linear")


def default_search_space(name: str, train_steps: int | None = None, schedule: str = "constant") -> SearchSpace:
    """The default :class:`SearchSpace` for optimizer ``name``: its registry entry's ``search_space``.

    ``schedule="linear"`` adds ``learning_rate_decay_steps`` (INTEGER, LINEAR over
    [ceil(train_steps / 2), train_steps]) and ``end_learning_rate_factor`` (LOG over [1e-4, 0.1]);
    it needs ``train_steps`` >= 1.
    """
    from batchlab.optim.registry import get_optimizer

    entry = get_optimizer(name)  # unknown name: one-line error
    if schedule not in SCHEDULES:
        raise BatchlabError(f"unknown schedule {schedule!r}; allowed: {', '.join(SCHEDULES)}")
    parameters = list(entry.search_space)
    if schedule == "linear":
        if isinstance(train_steps, bool) or not isinstance(train_steps, numbers.Integral) or train_steps < 1:
            raise BatchlabError(f"the linear schedule needs train_steps, an integer >= 1, got {train_steps!r}")
        half = (int(train_steps) + 1) // 2
        parameters.append(
            Parameter(
                name="learning_rate_decay_steps", type="INTEGER", scale="LINEAR",
                min_value=max(1, half), max_value=int(train_steps),
            )
        )
        parameters.append(
            Parameter(name="end_learning_rate_factor", type="DOUBLE", scale="LOG", min_value=1e-4, max_value=0.1)
        )
    return SearchSpace(parameters)

