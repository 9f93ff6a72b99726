"""The NQM algorithms: one registry, each algorithm declared once.

An NQM algorithm is a *base update* (the per-direction linear stochastic update of the iterate, and of a
velocity when it has one) optionally wrapped in an EMA of iterates, applied to the preconditioned
gradient ``H^-p g`` (the preconditioning power ``p`` is a separate parameter of every algorithm, see
:class:`Algorithm`). docs/methods.md, "Algorithms, exactly", gives the updates.

* :data:`BASE_UPDATES` (``sgd``, ``momentum``, ``nesterov``): each :class:`BaseUpdate` holds the linear
  map ``w' = A w + b eps`` that :mod:`batchlab.nqm.dynamics` turns into exact moment recurrences, and the
  same update written out on samples for :mod:`batchlab.nqm.montecarlo`.
* ``_REGISTRY``, read through :func:`nqm_algorithm_names` and :func:`get_nqm_algorithm` (``sgd``,
  ``momentum``, ``nesterov``, ``ema``, ``momentum+ema``, ``nesterov+ema``):
  each :class:`NQMAlgorithm` names its base update, whether it keeps an EMA, its official tuning grid
  (:mod:`batchlab.nqm.tuning`), its default step budget and what it supports (the optimised PWC
  schedule, the notebook's steady-state fudge).

Everything else reads the registry: :func:`get_nqm_algorithm` (an unknown name is a one-line
:class:`~batchlab.errors.BatchlabError`), :func:`nqm_algorithm_names`, the CLI's ``--optimizer`` help
and ``batchlab nqm algorithms``. Adding an algorithm is one :class:`NQMAlgorithm` entry (plus a
:class:`BaseUpdate` if its update is new); docs/internals.md, "How to change X".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from batchlab.errors import BatchlabError, unknown_name_error

SECOND_GRID = 1.0 - 10.0 ** (-5.0 + 5.0 * np.arange(20) / 19.0)
"""The notebook's momentum / EMA-decay axis: ``{1 - 10^(-5 + 5 j / 19) : j = 0..19}`` (0.99999 down to 0)."""

EMA_GRID_WITH_MOMENTUM = np.array([0.0, 0.9, 0.99, 0.999, 0.9999])
"""batchlab's EMA-decay axis when momentum is tuned too (the notebook has no such grid)."""


# --------------------------------------------------------------------------------------------------
# Base updates


@dataclass(frozen=True)
class BaseUpdate:
    """A per-direction base update of the iterate ``x`` (and a velocity ``v`` when ``uses_momentum``).

    Attributes:
        name: the base name (``sgd``, ``momentum``, ``nesterov``).
        summary: the update in one line.
        uses_momentum: whether it has a momentum coefficient ``mu`` (and a velocity state).
        linear: ``linear(z, a, momentum, one) -> (A, b, readout, init)``: the update ``w' = A w + b eps``
            with curvature step ``z = lr h^(1-p)``, noise gain ``a = lr h^-p`` and ``one = ones_like(z)``;
            ``A[i][k]``, ``b[i]`` are arrays or scalars, ``readout`` the vector e with evaluated iterate
            ``e . w`` and ``init`` the vector f with ``w_0 = f x_0``. ``x`` is the first component.
        sample: ``sample(x, v, gain, h, eps, mu) -> (x, v)``: one update of sampled states (``gain = lr
            h^-p``, ``eps`` the batch-gradient noise; ``mu`` is None without momentum).

    With momentum 0 an update that uses momentum must be plain SGD's: :func:`batchlab.nqm.tuning.tune`
    bounds its search by SGD's answer when the grid holds 0 on every axis but the learning rate.
    """

    name: str
    summary: str
    uses_momentum: bool
    linear: Callable
    sample: Callable


def _sgd_linear(z, a, momentum, one):
    return [[1.0 - z]], [-a], [1.0], [1.0]


def _sgd_sample(x, v, gain, h, eps, mu):
    return x - gain * (h * x + eps), v


def _momentum_linear(z, a, momentum, one):
    # v' = mu v - z x - a eps ; x' = x + v'
    return [[1.0 - z, momentum * one], [-z, momentum * one]], [-a, -a], [1.0, 0.0], [1.0, 0.0]


def _momentum_sample(x, v, gain, h, eps, mu):
    v = mu * v - gain * (h * x + eps)
    return x + v, v


def _nesterov_linear(z, a, momentum, one):
    # gradient at the look-ahead x + mu v:  v' = mu v - z (x + mu v) - a eps ; x' = x + v'
    return [[1.0 - z, momentum * (1.0 - z)], [-z, momentum * (1.0 - z)]], [-a, -a], [1.0, 0.0], [1.0, 0.0]


def _nesterov_sample(x, v, gain, h, eps, mu):
    v = mu * v - gain * (h * (x + mu * v) + eps)
    return x + v, v


BASE_UPDATES: dict[str, BaseUpdate] = {
    u.name: u
    for u in (
        BaseUpdate("sgd", "x <- x - lr h^-p g", False, _sgd_linear, _sgd_sample),
        BaseUpdate("momentum", "heavy ball: v <- mu v - lr h^-p g, x <- x + v", True, _momentum_linear,
                   _momentum_sample),
        BaseUpdate("nesterov", "v <- mu v - lr h^-p g(x + mu v), x <- x + v", True, _nesterov_linear,
                   _nesterov_sample),
    )
}


def get_base_update(name: str) -> BaseUpdate:
    """The :class:`BaseUpdate` called ``name`` (unknown: a one-line error)."""
    try:
        return BASE_UPDATES[name]
    except KeyError:
        raise unknown_name_error("base update", name, BASE_UPDATES) from None


# --------------------------------------------------------------------------------------------------
# Algorithms


@dataclass(frozen=True)
class NQMAlgorithm:
    """One NQM algorithm, declared once.

    Attributes:
        name: the name users pass (``--optimizer``, ``Algorithm(name)``).
        summary: one line for listings.
        base: the name of its :class:`BaseUpdate`.
        ema: whether an EMA of iterates ``x_ema' = gamma x_ema + (1 - gamma) x'`` is kept and evaluated.
        grid: ``grid() -> {axis: values}``: the official tuning grid, axes from outer to inner
            (``learning_rate`` first, then ``momentum`` and ``ema_decay`` where used); see
            :mod:`batchlab.nqm.tuning`.
        official_high: the notebook's bisection upper bound; the default step budget is one less.
        pwc: supports the optimised piecewise-constant schedule (:func:`batchlab.nqm.schedules.optimal_pwc_sgd`,
            which uses plain SGD's closed-form steady state).
        notebook_fudge: supports the notebook's ``1e-8`` steady-state fudge (single-moment dynamics).
        clamp_official_low: the notebook clamps its ``low`` convention to ``>= 1`` for this algorithm.

    ``pwc`` and ``notebook_fudge`` rest on plain SGD's single-moment dynamics, so they need base ``sgd``
    without EMA. :func:`register_nqm_algorithm` checks an entry (a one-line :class:`BatchlabError`).
    """

    name: str
    summary: str
    base: str
    ema: bool
    grid: Callable[[], dict[str, np.ndarray]]
    official_high: int
    pwc: bool = False
    notebook_fudge: bool = False
    clamp_official_low: bool = False

    @property
    def update(self) -> BaseUpdate:
        """The :class:`BaseUpdate` of :attr:`base`."""
        return get_base_update(self.base)

    @property
    def uses_momentum(self) -> bool:
        return self.update.uses_momentum

    @property
    def hyperparameters(self) -> tuple[str, ...]:
        """The tuned hyperparameters: ``learning_rate``, then ``momentum`` and ``ema_decay`` where used."""
        return ("learning_rate",) + (("momentum",) if self.uses_momentum else ()) + (("ema_decay",) if self.ema else ())

    @property
    def default_max_steps(self) -> int:
        """The default step budget: the notebook's ``high`` minus one."""
        return self.official_high - 1

    def describe(self) -> dict:
        """JSON-ready description (``batchlab nqm algorithms --json``)."""
        return {
            "name": self.name,
            "summary": self.summary,
            "base": self.base,
            "base_update": self.update.summary,
            "ema": self.ema,
            "hyperparameters": list(self.hyperparameters),
            "grid": {axis: {"n": int(values.size), "min": float(values.min()), "max": float(values.max())}
                     for axis, values in self.grid().items()},
            "default_max_steps": self.default_max_steps,
            "pwc": self.pwc,
            "notebook_fudge": self.notebook_fudge,
        }


def _sgd_grid() -> dict[str, np.ndarray]:
    return {"learning_rate": np.logspace(-5, 0.5, 100)}


def _momentum_grid() -> dict[str, np.ndarray]:
    return {"learning_rate": np.logspace(-8, 1, 100), "momentum": SECOND_GRID.copy()}


def _ema_grid() -> dict[str, np.ndarray]:
    return {"learning_rate": np.logspace(-8, 1, 100), "ema_decay": SECOND_GRID.copy()}


def _momentum_ema_grid() -> dict[str, np.ndarray]:
    return {**_momentum_grid(), "ema_decay": EMA_GRID_WITH_MOMENTUM.copy()}


_REGISTRY: dict[str, NQMAlgorithm] = {}


def register_nqm_algorithm(entry: NQMAlgorithm) -> NQMAlgorithm:
    """Add ``entry`` to the registry and return it.

    Raises:
        BatchlabError (one line): not an :class:`NQMAlgorithm`, a name already registered or not one
            word, a summary that is not one line, an unknown base update, ``official_high`` not an
            integer >= 2, ``pwc`` or ``notebook_fudge`` on anything but base ``sgd`` without EMA, or a
            grid whose axes are not :attr:`NQMAlgorithm.hyperparameters` in order (each a non-empty
            1-D array: learning rates > 0, momentum / EMA decay in [0, 1)).
    """
    if not isinstance(entry, NQMAlgorithm):
        raise BatchlabError(f"register_nqm_algorithm needs a batchlab.nqm.algorithms.NQMAlgorithm, "
                            f"got {type(entry).__name__}")
    where = f"NQM algorithm {entry.name!r}"
    if not isinstance(entry.name, str) or not entry.name or any(c.isspace() for c in entry.name):
        raise BatchlabError(f"NQM algorithm name must be a non-empty word, got {entry.name!r}")
    if entry.name in _REGISTRY:
        raise BatchlabError(f"{where} is already registered")
    if not isinstance(entry.summary, str) or not entry.summary.strip() or "\n" in entry.summary:
        raise BatchlabError(f"{where}: summary must be one non-empty line")
    get_base_update(entry.base)
    if isinstance(entry.official_high, bool) or not isinstance(entry.official_high, int) or entry.official_high < 2:
        raise BatchlabError(f"{where}: official_high must be an integer >= 2, got {entry.official_high!r}")
    if (entry.pwc or entry.notebook_fudge) and (entry.base != "sgd" or entry.ema):
        raise BatchlabError(f"{where}: pwc and notebook_fudge need base update 'sgd' without EMA")
    axes = entry.grid() if callable(entry.grid) else None
    if not isinstance(axes, dict) or tuple(axes) != entry.hyperparameters:
        raise BatchlabError(f"{where}: grid() must return the axes {', '.join(entry.hyperparameters)} in this order")
    for axis, values in axes.items():
        values = np.asarray(values, dtype=float)
        in_range = np.all(values > 0) if axis == "learning_rate" else np.all((values >= 0) & (values < 1))
        if values.ndim != 1 or values.size == 0 or not np.all(np.isfinite(values)) or not in_range:
            allowed = "> 0" if axis == "learning_rate" else "in [0, 1)"
            raise BatchlabError(f"{where}: grid axis {axis} must be a non-empty 1-D array of finite values {allowed}")
    _REGISTRY[entry.name] = entry
    return entry


for _entry in (
    NQMAlgorithm("sgd", "plain SGD (the notebook's grid: lr in logspace(-5, 0.5, 100))", "sgd", False, _sgd_grid,
                 10**9, pwc=True, notebook_fudge=True, clamp_official_low=True),
    NQMAlgorithm("momentum", "heavy-ball momentum (lr x momentum grid of the notebook)", "momentum", False,
                 _momentum_grid, 10**7),
    NQMAlgorithm("nesterov", "Nesterov momentum (the momentum grid)", "nesterov", False, _momentum_grid, 10**7),
    NQMAlgorithm("ema", "SGD with an EMA of iterates, read at the EMA (lr x decay grid of the notebook)", "sgd", True,
                 _ema_grid, 10**7),
    NQMAlgorithm("momentum+ema", "heavy-ball momentum with an EMA of iterates (momentum grid x decay in "
                 "{0, 0.9, 0.99, 0.999, 0.9999})", "momentum", True, _momentum_ema_grid, 10**7),
    NQMAlgorithm("nesterov+ema", "Nesterov momentum with an EMA of iterates (as momentum+ema)", "nesterov", True,
                 _momentum_ema_grid, 10**7),
):
    register_nqm_algorithm(_entry)
del _entry


def nqm_algorithm_names() -> tuple[str, ...]:
    """The registered algorithm names, in registration order."""
    return tuple(_REGISTRY)


def get_nqm_algorithm(name: str) -> NQMAlgorithm:
    """The registry entry called ``name``; an unknown name is a one-line :class:`BatchlabError`."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise unknown_name_error("optimizer", name, _REGISTRY) from None


@dataclass(frozen=True)
class Algorithm:
    """An NQM training algorithm as the engine runs it: a registered ``name`` and preconditioning power ``p``
    (the update direction is ``H^-p g``, ``0 <= p <= 1``)."""

    name: str = "sgd"
    precondition: float = 0.0

    def __post_init__(self) -> None:
        get_nqm_algorithm(self.name)
        p = float(self.precondition)
        if not np.isfinite(p) or not 0.0 <= p <= 1.0:
            raise BatchlabError(f"precondition power p must be in [0, 1], got {self.precondition}")

    @property
    def entry(self) -> NQMAlgorithm:
        """The registry entry of :attr:`name`."""
        return get_nqm_algorithm(self.name)

    @property
    def base(self) -> str:
        """The base update's name: ``sgd``, ``momentum`` or ``nesterov``."""
        return self.entry.base

    @property
    def update(self) -> BaseUpdate:
        return self.entry.update

    @property
    def uses_momentum(self) -> bool:
        return self.entry.uses_momentum

    @property
    def uses_ema(self) -> bool:
        return self.entry.ema


__all__ = [
    "BASE_UPDATES",
    "EMA_GRID_WITH_MOMENTUM",
    "SECOND_GRID",
    "Algorithm",
    "BaseUpdate",
    "NQMAlgorithm",
    "get_base_update",
    "get_nqm_algorithm",
    "nqm_algorithm_names",
    "register_nqm_algorithm",
]
