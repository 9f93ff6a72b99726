"""The exact NQM prediction for batchlab's optimizers: what ``batchlab report --nqm`` draws beside the
measured steps-to-result curves (docs/methods.md, "The NQM prediction in the report").

:func:`predict` maps each batchlab optimizer name (:mod:`batchlab.optim.builtin`) to an NQM algorithm
and preconditioning power as Zhang et al. (2019) model them, tunes it per batch size with the exact
engine (:func:`batchlab.nqm.tuning.tune`, nothing re-implemented here) and returns one
:class:`NqmPrediction` per optimizer, or None for an optimizer the NQM cannot model
(:func:`unsupported_reason` says why).

Fixed settings, the ones of the NQM figure set (:mod:`batchlab.nqm.figures`):

* problem: the preset ``zhang2019-binned`` (h_i = 1/i, c = h, D = 10^4 directions in 84 curvature bins);
* target: expected loss 0.01, steps = the first passage (the smallest t with L(t) < 0.01);
* tuning: the official grids (the notebook's, declared in each algorithm's registry entry), the learning
  rate and, where the algorithm has one, the momentum tuned independently at every batch size;
* ``b_crit``: the registry's ``mccandlish_b_crit`` (:mod:`batchlab.analysis.definitions`) of
  :func:`batchlab.analysis.critical_batch_size.summarize_curve` on the tuned curve over the figure set's
  comparison grid :data:`B_CRIT_BATCH_SIZES` (B = 4, 16, ..., 2^20), not over the caller's batch sizes:
  the NQM's critical batch size is a property of the model and the algorithm, and over a measured
  workload's few decades the NQM curves of momentum and the preconditioned algorithms are still
  perfectly scaling (their fit over those batch sizes is infinite).

Steps at every batch size come from independent per-batch-size searches (the engine tunes every batch
size on its own), so results are cached per (algorithm, power, batch size) for the process: the
optimizers that share a mapping (adam, adamw, soap) and repeated calls cost nothing more.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from batchlab.errors import BatchlabError

PRESET = "zhang2019-binned"
"""The NQM problem of every prediction: the preset of the NQM figure set."""

TARGET = 0.01
"""Target expected loss (the NQM figure set's and ``batchlab nqm sweep``'s default)."""

GRID = "official"
"""Tuning grid: the notebook's grids, as the NQM figure set uses them (``batchlab nqm`` ``--grid official``)."""

B_CRIT_BATCH_SIZES = tuple(4**k for k in range(1, 11))
"""The batch grid ``b_crit`` is fitted on: B = 4, 16, ..., 2^20, the NQM figure set's optimizer-comparison
grid (:data:`batchlab.nqm.figures.COMPARE_BATCH_SIZES`), so ``b_crit`` equals the ``B_crit`` column of
``batchlab nqm figures`` for the curves it shares (``sgd p=0``, ``momentum p=0``, ``momentum p=0.5``)."""


@dataclass(frozen=True)
class NqmMapping:
    """How one batchlab optimizer is modelled: the NQM algorithm (:mod:`batchlab.nqm.algorithms`), its
    preconditioning power ``p`` (update direction ``H^-p g``), the short words the report prints (a legend
    label) and the reason for the choice, in one line."""

    nqm_algorithm: str
    precondition: float
    words: str
    rationale: str


# The mapping, after Zhang et al. (2019), section 3 and their NQM notebook. In the NQM the per-example
# gradient covariance C equals the curvature H (the preset has c = h), so the Fisher is H and a
# preconditioner built from gradient statistics is a power of H:
#
# * sgd: plain SGD, p = 0; the learning rate tuned.
# * momentum / nesterov: the heavy-ball / Nesterov base updates, p = 0; learning rate and momentum tuned
#   on the notebook's grid (batchlab's sweeps search the momentum too: it is in both optimizers' search
#   spaces).
# * adam (and adamw): Adam divides by sqrt(v), v the running mean of the squared minibatch gradient, per
#   direction v = h^2 E[x^2] + c / B. Once the gradient noise dominates (late in training, where most
#   steps are spent) v ~ c / B = h / B, so Adam applies H^-1/2 up to the factor sqrt(B), which the
#   per-batch-size tuning of the learning rate absorbs: p = 0.5. Adam's first moment
#   m <- beta1 m + (1 - beta1) g with x <- x - lr m is exactly heavy-ball momentum with mu = beta1 and
#   learning rate lr (1 - beta1), so Adam is NQM momentum with p = 0.5, learning rate and momentum tuned.
#   epsilon is ignored (it only matters where v < epsilon^2). AdamW's decoupled weight decay has no NQM
#   counterpart (the NQM has no regulariser; decay would shift every curvature by the same constant) and
#   is ignored: adamw = adam.
# * kfac: batchlab's kfac is heavy-ball momentum on the K-FAC preconditioned gradient, which approximates
#   the natural gradient F^-1 g = H^-1 g on the NQM: NQM momentum with p = 1. Damping is ignored (it
#   would add a constant to every curvature of the preconditioner).
# * soap: Adam run in the eigenbasis of Shampoo's preconditioner. The NQM's H is diagonal, so that
#   eigenbasis is the coordinate basis and SOAP reduces to Adam: p = 0.5 with momentum, the same
#   prediction as adam. The NQM cannot tell them apart: what SOAP adds over Adam is the basis rotation.
MAPPINGS: dict[str, NqmMapping] = {
    "sgd": NqmMapping("sgd", 0.0, "SGD (p = 0)", "plain SGD, learning rate tuned per batch size"),
    "momentum": NqmMapping("momentum", 0.0, "heavy-ball momentum (p = 0)",
                           "heavy-ball momentum, learning rate and momentum tuned per batch size"),
    "nesterov": NqmMapping("nesterov", 0.0, "Nesterov momentum (p = 0)",
                           "Nesterov momentum, learning rate and momentum tuned per batch size"),
    "adam": NqmMapping("momentum", 0.5, "Adam-like: heavy-ball momentum on H^-0.5 g",
                       "Adam's sqrt(v) ~ sqrt(h / B) once gradient noise dominates, so p = 0.5; beta1 is heavy-ball "
                       "momentum; learning rate and momentum tuned per batch size, epsilon ignored"),
    "adamw": NqmMapping("momentum", 0.5, "Adam-like: heavy-ball momentum on H^-0.5 g",
                        "as adam; decoupled weight decay has no NQM counterpart and is ignored"),
    "soap": NqmMapping("momentum", 0.5, "Adam-like: heavy-ball momentum on H^-0.5 g",
                       "as adam: SOAP is Adam in Shampoo's eigenbasis, which on the diagonal NQM is the coordinate "
                       "basis, so the NQM cannot tell SOAP from Adam"),
    "kfac": NqmMapping("momentum", 1.0, "K-FAC-like: heavy-ball momentum on H^-1 g",
                       "batchlab's kfac is heavy-ball momentum on the K-FAC gradient, an approximation of the natural "
                       "gradient F^-1 g = H^-1 g on the NQM, so p = 1; learning rate and momentum tuned per batch "
                       "size, damping ignored"),
}

# Optimizers the NQM cannot model, and why (an unlisted name gets a generic reason).
UNSUPPORTED: dict[str, str] = {
    "lars": "LARS rescales each layer's step by the trust ratio |w| / |update|, a state-dependent nonlinear factor; "
            "the NQM has no layers and its optimum is w = 0, so no NQM algorithm corresponds",
    "lamb": "LAMB rescales each layer's Adam step by the trust ratio |w| / |update|, a state-dependent nonlinear "
            "factor; the NQM has no layers and its optimum is w = 0, so no NQM algorithm corresponds",
    "muon": "Muon replaces each weight matrix's momentum by its orthogonal polar factor (every singular value set "
            "to 1), a nonlinear update of whole matrices; the NQM's directions evolve independently and linearly, "
            "so no NQM algorithm corresponds",
}


@dataclass(frozen=True, eq=False)
class NqmPrediction:
    """The exact NQM prediction for one batchlab optimizer.

    Attributes:
        optimizer: the batchlab optimizer name asked for.
        algorithm: the NQM model of it in a few words (a legend label), e.g. "Adam-like: heavy-ball
            momentum on H^-0.5 g".
        problem: the NQM problem, in words (preset, dimension, spectrum).
        batch_sizes: the batch sizes asked for, sorted and without repeats (``int64``).
        steps: first-passage steps to :attr:`target` at each batch size, tuned there (``float``; NaN
            where the target is not reached within the algorithm's step budget).
        b_crit: ``mccandlish_b_crit`` (E_min / S_min of the fit S(B) = S_min + E_min / B) of the tuned
            curve over :attr:`b_crit_batch_sizes`; None when the fit fails or is infinite.
        exact: True: every value is the exact expected-loss first passage (no sampling), certified by
            the engine; False if a step count was too long to certify (an upper bound then) or an
            unreached batch size was searched by binary lifting only (engine's ``certified`` field).
        target: the target, in words.
        rationale: why the optimizer is modelled so, and what is tuned, in one line.
        nqm_algorithm: the NQM registry name (``sgd``, ``momentum``, ``nesterov``).
        precondition: the preconditioning power ``p`` (update direction ``H^-p g``).
        learning_rates: the tuned learning rate at each batch size.
        momenta: the tuned momentum at each batch size (NaN for algorithms without momentum).
        grid_edge: True where the tuned learning rate lies at either end of the official grid's
            learning-rate axis, or the tuned momentum at its top (0.99999): the optimum may lie beyond
            the grid, so the steps there are exact for the configuration found but an upper bound on
            the algorithm's tuned optimum (e.g. momentum at B <= 4, the K-FAC-like p = 1 at B = 4 and 8).
        b_crit_batch_sizes: the batch grid ``b_crit`` is fitted on (:data:`B_CRIT_BATCH_SIZES`).
        b_crit_extrapolated: the fitted ``b_crit`` lies outside the reached part of that grid.
        fit_warnings: the fit's warnings (poor fit, extrapolation, ...) and a note when the tuning of a
            point of that grid reached the grid's edge, one line each.
    """

    optimizer: str
    algorithm: str
    problem: str
    batch_sizes: np.ndarray
    steps: np.ndarray
    b_crit: float | None
    exact: bool
    target: str
    rationale: str = ""
    nqm_algorithm: str = ""
    precondition: float = 0.0
    learning_rates: np.ndarray = field(default_factory=lambda: np.zeros(0))
    momenta: np.ndarray = field(default_factory=lambda: np.zeros(0))
    grid_edge: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    b_crit_batch_sizes: tuple[int, ...] = B_CRIT_BATCH_SIZES
    b_crit_extrapolated: bool = False
    fit_warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        """JSON-ready (plain Python numbers and lists; NaN steps as None)."""

        def number(value):
            value = float(value)
            return value if np.isfinite(value) else None

        return {
            "optimizer": self.optimizer,
            "algorithm": self.algorithm,
            "problem": self.problem,
            "target": self.target,
            "exact": bool(self.exact),
            "rationale": self.rationale,
            "nqm_algorithm": self.nqm_algorithm,
            "precondition": float(self.precondition),
            "batch_sizes": [int(b) for b in self.batch_sizes],
            "steps": [None if not np.isfinite(s) else int(s) for s in self.steps],
            "learning_rates": [number(v) for v in self.learning_rates],
            "momenta": [number(v) for v in self.momenta],
            "grid_edge": [bool(v) for v in self.grid_edge],
            "b_crit": None if self.b_crit is None else float(self.b_crit),
            "b_crit_batch_sizes": [int(b) for b in self.b_crit_batch_sizes],
            "b_crit_extrapolated": bool(self.b_crit_extrapolated),
            "fit_warnings": list(self.fit_warnings),
        }


def supported_optimizers() -> tuple[str, ...]:
    """The batchlab optimizer names :func:`predict` models, in mapping order."""
    return tuple(MAPPINGS)


def unsupported_reason(name: str) -> str:
    """Why :func:`predict` returns None for ``name`` (one line); ``""`` for a modelled optimizer."""
    if name in MAPPINGS:
        return ""
    if name in UNSUPPORTED:
        return UNSUPPORTED[name]
    return (f"no NQM model is defined for optimizer {name!r}; the NQM models "
            f"{', '.join(MAPPINGS)}")


def mapping(name: str) -> NqmMapping | None:
    """The :class:`NqmMapping` of optimizer ``name`` (None when the NQM cannot model it)."""
    return MAPPINGS.get(name)


# --------------------------------------------------------------------------------------------------
# The engine, cached per (NQM algorithm, power, batch size)

_lock = threading.Lock()
_points: dict[tuple[str, float, int], object] = {}  # -> batchlab.nqm.tuning.TunedPoint
_fits: dict[tuple[str, float], tuple[float | None, bool, tuple[str, ...]]] = {}
_problem = None


def _nqm_problem():
    global _problem
    if _problem is None:
        from batchlab.nqm.problem import preset

        _problem = preset(PRESET)
    return _problem


def problem_words() -> str:
    """The problem of every prediction, in words: ``zhang2019-binned (D = 10000, h_i = 1/i in 84 bins, c = h)``."""
    problem = _nqm_problem()
    return f"{PRESET} (D = {problem.dimension}, h_i = 1/i in {problem.curvature.size} bins, c = h)"


def target_words() -> str:
    """The target, in words: ``expected loss 0.01, first passage (initial loss 4.702)``."""
    return f"expected loss {TARGET:g}, first passage (initial loss {_nqm_problem().initial_loss():.4g})"


def _tuned(nqm_algorithm: str, precondition: float, batch_sizes) -> list:
    """The engine's tuned points at ``batch_sizes`` (cached; the missing ones tuned in one call)."""
    from batchlab.nqm.algorithms import Algorithm
    from batchlab.nqm.tuning import tune

    keys = [(nqm_algorithm, float(precondition), int(b)) for b in batch_sizes]
    with _lock:
        missing = sorted({k[2] for k in keys if k not in _points})
        if missing:
            points = tune(_nqm_problem(), Algorithm(nqm_algorithm, precondition), missing, TARGET, grid=GRID)
            for b, point in zip(missing, points):
                _points[(nqm_algorithm, float(precondition), b)] = point
        return [_points[k] for k in keys]


def _at_grid_edge(nqm_algorithm: str, precondition: float, points) -> np.ndarray:
    """Per point: the tuned learning rate at an end of the official learning-rate axis, or the tuned
    momentum at the top of the momentum axis (momentum 0 is plain SGD, a true boundary, not an edge)."""
    from batchlab.nqm.algorithms import Algorithm
    from batchlab.nqm.tuning import official_grid

    axes = official_grid(Algorithm(nqm_algorithm, precondition))
    rates = axes["learning_rate"]
    top = axes["momentum"].max() if "momentum" in axes else None
    return np.array([p.learning_rate in (rates.min(), rates.max()) or (top is not None and p.momentum == top)
                     for p in points], dtype=bool)


def _b_crit(nqm_algorithm: str, precondition: float) -> tuple[float | None, bool, tuple[str, ...]]:
    """``(b_crit, extrapolated, warnings)`` of the tuned curve over :data:`B_CRIT_BATCH_SIZES`."""
    from batchlab.analysis.critical_batch_size import summarize_curve
    from batchlab.nqm.tuning import steps_curve

    key = (nqm_algorithm, float(precondition))
    if key in _fits:
        return _fits[key]
    points = _tuned(nqm_algorithm, precondition, B_CRIT_BATCH_SIZES)
    edge = [int(p.batch_size) for p, at in zip(points, _at_grid_edge(nqm_algorithm, precondition, points)) if at]
    notes = (f"tuning reached the edge of the official grid at B = {', '.join(map(str, edge))}: the steps there are "
             "upper bounds on the tuned optimum",) if edge else ()
    try:
        summary = summarize_curve(steps_curve(points, label=f"{nqm_algorithm} p={precondition:g}"))
    except BatchlabError as exc:  # fewer than two reached batch sizes: no fit
        result = (None, False, (str(exc),) + notes)
    else:
        value = summary["critical_batch_sizes"]["mccandlish_b_crit"]["value"]
        result = (None if value is None else float(value), bool(summary["extrapolated"]),
                  tuple(summary["fit"]["warnings"]) + notes)
    with _lock:
        _fits[key] = result
    return result


def _check_batch_sizes(batch_sizes: Sequence[int]) -> np.ndarray:
    try:
        values = np.asarray([float(b) for b in batch_sizes], dtype=float)
    except (TypeError, ValueError):
        raise BatchlabError(f"NQM prediction: batch sizes must be positive integers, got {list(batch_sizes)!r}") from None
    if values.size == 0:
        raise BatchlabError("NQM prediction: give at least one batch size")
    if not np.all(np.isfinite(values)) or np.any(values < 1) or np.any(values != np.round(values)):
        raise BatchlabError(f"NQM prediction: batch sizes must be positive integers, got {values.tolist()}")
    return np.unique(values.astype(np.int64))


def predict(optimizers: Sequence[str], batch_sizes: Sequence[int]) -> dict[str, NqmPrediction | None]:
    """The exact NQM prediction for each optimizer at ``batch_sizes``.

    Returns ``{name: NqmPrediction}`` in the order of ``optimizers`` (repeats once), with None for an
    optimizer the NQM cannot model (:func:`unsupported_reason`). Batch sizes are sorted and deduplicated.
    Optimizers that share a mapping are computed once; results are cached for the process.

    Raises:
        BatchlabError (one line): a batch size that is not a positive integer, or none given.
    """
    sizes = _check_batch_sizes(batch_sizes)
    out: dict[str, NqmPrediction | None] = {}
    for name in optimizers:
        if name in out:
            continue
        entry = MAPPINGS.get(name)
        if entry is None:
            out[name] = None
            continue
        # One engine call for the asked batch sizes and the b_crit grid together (they share the
        # power tables); later look-ups hit the cache.
        _tuned(entry.nqm_algorithm, entry.precondition, sorted(set(sizes.tolist()) | set(B_CRIT_BATCH_SIZES)))
        points = _tuned(entry.nqm_algorithm, entry.precondition, sizes)
        b_crit, extrapolated, warnings = _b_crit(entry.nqm_algorithm, entry.precondition)
        steps = np.array([np.nan if p.result.steps is None else float(p.result.steps) for p in points])
        out[name] = NqmPrediction(
            optimizer=name,
            algorithm=entry.words,
            problem=problem_words(),
            batch_sizes=sizes.copy(),
            steps=steps,
            b_crit=b_crit,
            # "uncertified": a step count too long to verify (an upper bound), or an unreached point whose
            # budget only binary lifting searched (an oscillating loss could dip below the target unseen).
            exact=all(p.result.certified != "uncertified" for p in points),
            target=target_words(),
            rationale=entry.rationale,
            nqm_algorithm=entry.nqm_algorithm,
            precondition=entry.precondition,
            learning_rates=np.array([p.learning_rate for p in points], dtype=float),
            momenta=np.array([np.nan if p.momentum is None else p.momentum for p in points], dtype=float),
            grid_edge=_at_grid_edge(entry.nqm_algorithm, entry.precondition, points),
            b_crit_extrapolated=extrapolated,
            fit_warnings=warnings,
        )
    return out


def clear_cache() -> None:
    """Forget the cached engine results (tests; a changed engine in a long-lived process)."""
    with _lock:
        _points.clear()
        _fits.clear()


__all__ = [
    "B_CRIT_BATCH_SIZES",
    "GRID",
    "MAPPINGS",
    "PRESET",
    "TARGET",
    "UNSUPPORTED",
    "NqmMapping",
    "NqmPrediction",
    "clear_cache",
    "mapping",
    "predict",
    "problem_words",
    "supported_optimizers",
    "target_words",
    "unsupported_reason",
]
