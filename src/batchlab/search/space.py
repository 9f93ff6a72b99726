"""Search spaces in the batch_science form, and their quasi-random points.

A search space is an ordered set of parameters, each as in the release's ``study.json``
``parameter_configs``::

    {"learning_rate": {"type": "DOUBLE", "min_value": 1e-4, "max_value": 10.0, "scale": "LOG_SCALE"},
     "label_smoothing": {"type": "DISCRETE", "feasible_points": [0.0, 0.01, 0.1]}}

Types: ``DOUBLE`` (a real range), ``INTEGER`` (an inclusive integer range), ``DISCRETE``
(``feasible_points``). Scales (``LINEAR``, ``LOG``, ``REVERSE_LOG``; the ``_SCALE`` suffix of the
release is accepted and written back) map a unit coordinate ``u`` in [0, 1) to a value:

* ``LINEAR``: ``lo + u (hi - lo)``
* ``LOG``: ``lo exp(u log(hi / lo))`` (needs ``0 < lo``)
* ``REVERSE_LOG``: ``1 - (1 - hi) exp(u log((1 - lo) / (1 - hi)))``, i.e. ``1 - value`` is
  log-uniform (momentum); needs ``0 <= lo <= hi < 1``.

An ``INTEGER`` parameter maps ``u`` through its scale over ``[lo, hi + 1)`` and takes the floor, so
every integer in ``[lo, hi]`` is reachable. A ``DISCRETE`` parameter takes ``feasible_points[floor(u n)]``.

Points come from ``scipy.stats.qmc.Halton(d, scramble=True, rng=numpy.random.default_rng(seed))``: a scrambled Halton sequence,
one dimension per parameter in the space's order, deterministic given the seed. ``sample(n, seed)``
is the first ``n`` points of that sequence and ``point(index, seed)`` is point number ``index``
(fast-forwarded), so a sweep can resume by index.

Each study searches its own sequence (:data:`POINTS_RULE`): its seed is :func:`study_points_seed`
of the sweep's (or ``batchlab study``'s) seed and the study's identity (workload, optimizer, batch
size), as independent studies would be scrambled; budget rounds of one study re-use its points.
"""

from __future__ import annotations

import hashlib
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from batchlab.errors import BatchlabError
from batchlab.finite import finite_real

TYPES = ("DOUBLE", "INTEGER", "DISCRETE")
#: How a study's points are drawn, recorded in sweep ids and ``batchlab study`` definitions (so a store
#: made when every study of a sweep searched the same points keeps those studies apart).
POINTS_RULE = "halton-per-study"
SCALES = ("LINEAR", "LOG", "REVERSE_LOG")
_SCALE_SUFFIX = "_SCALE"


def _canonical_scale(name: str, scale: object) -> str:
    """Return ``LINEAR``/``LOG``/``REVERSE_LOG`` for a scale spelled with or without ``_SCALE``."""
    if not isinstance(scale, str):
        raise BatchlabError(f"parameter {name!r}: scale must be one of {', '.join(SCALES)}, got {scale!r}")
    short = scale.upper()
    if short.endswith(_SCALE_SUFFIX):
        short = short[: -len(_SCALE_SUFFIX)]
    if short not in SCALES:
        raise BatchlabError(
            f"parameter {name!r}: unknown scale {scale!r}; allowed: "
            + ", ".join(s + _SCALE_SUFFIX for s in SCALES)
        )
    return short


def _real(name: str, field: str, value: object) -> float:
    if not finite_real(value):
        raise BatchlabError(f"parameter {name!r}: {field} must be a finite number, got {value!r:.40}")
    return float(value)


@dataclass(frozen=True)
class Parameter:
    """One searched hyperparameter. ``min_value``/``max_value`` for DOUBLE and INTEGER,
    ``feasible_points`` for DISCRETE; ``scale`` is LINEAR, LOG or REVERSE_LOG (None for DISCRETE)."""

    name: str
    type: str
    scale: str | None = None
    min_value: float | int | None = None
    max_value: float | int | None = None
    feasible_points: tuple | None = None

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not name:
            raise BatchlabError(f"parameter name must be a non-empty string, got {name!r}")
        if self.type not in TYPES:
            raise BatchlabError(f"parameter {name!r}: unknown type {self.type!r}; allowed: {', '.join(TYPES)}")
        if self.type == "DISCRETE":
            points = self.feasible_points
            if not isinstance(points, tuple) or len(points) == 0:
                raise BatchlabError(f"parameter {name!r}: DISCRETE needs a non-empty list feasible_points")
            return
        if self.scale not in SCALES:
            raise BatchlabError(f"parameter {name!r}: unknown scale {self.scale!r}; allowed: {', '.join(SCALES)}")
        lo = _real(name, "min_value", self.min_value)
        hi = _real(name, "max_value", self.max_value)
        if lo > hi:
            raise BatchlabError(f"parameter {name!r}: min_value {lo:g} > max_value {hi:g}; need min_value <= max_value")
        if self.type == "INTEGER" and (lo != int(lo) or hi != int(hi)):
            raise BatchlabError(f"parameter {name!r}: INTEGER needs integer min_value and max_value, got {lo:g}, {hi:g}")
        if self.scale == "LOG" and lo <= 0:
            raise BatchlabError(
                f"parameter {name!r}: LOG scale needs 0 < min_value <= max_value, got min_value {lo:g}"
            )
        if self.scale == "REVERSE_LOG":
            if self.type == "INTEGER":
                raise BatchlabError(f"parameter {name!r}: INTEGER allows scales LINEAR, LOG, not REVERSE_LOG")
            if lo < 0 or hi >= 1:
                raise BatchlabError(
                    f"parameter {name!r}: REVERSE_LOG scale needs 0 <= min_value <= max_value < 1, got [{lo:g}, {hi:g}]"
                )

    def value(self, u: float) -> float | int | object:
        """Map a unit coordinate ``u`` in [0, 1) to this parameter's value (see the module docstring)."""
        if self.type == "DISCRETE":
            points = self.feasible_points
            return points[min(int(u * len(points)), len(points) - 1)]
        lo, hi = float(self.min_value), float(self.max_value)
        if self.type == "INTEGER":
            # Spread u over [lo, hi + 1) so that the top integer gets its share, then floor.
            top = hi + 1.0
            if self.scale == "LOG":
                x = lo * math.exp(u * math.log(top / lo))
            else:
                x = lo + u * (top - lo)
            return int(min(max(math.floor(x), lo), hi))
        if self.scale == "LINEAR":
            x = lo + u * (hi - lo)
        elif self.scale == "LOG":
            x = lo * math.exp(u * math.log(hi / lo))
        else:  # REVERSE_LOG: 1 - x is log-uniform between 1 - hi and 1 - lo.
            x = 1.0 - (1.0 - hi) * math.exp(u * math.log((1.0 - lo) / (1.0 - hi)))
        return min(max(x, lo), hi)

    def unit(self, value: object) -> float:
        """The unit coordinate of ``value``, the inverse of :meth:`value` (for INTEGER and DISCRETE the
        middle of the value's cell), unclipped (a value outside the range gives a coordinate outside
        [0, 1]); a DISCRETE value that is not a feasible point gives the nearest one's."""
        if self.type == "DISCRETE":
            points = list(self.feasible_points)
            if value in points:
                index = points.index(value)
            else:
                index = int(np.argmin([abs(float(p) - float(value)) if p is not None else np.inf for p in points]))
            return (index + 0.5) / len(points)
        lo, hi, x = float(self.min_value), float(self.max_value), float(value)
        if self.type == "INTEGER":
            hi, x = hi + 1.0, x + 0.5
        if hi == lo:
            return 0.5
        if self.scale == "LINEAR":
            return (x - lo) / (hi - lo)
        if self.scale == "LOG":
            return math.log(x / lo) / math.log(hi / lo)
        return math.log((1.0 - x) / (1.0 - hi)) / math.log((1.0 - lo) / (1.0 - hi))

    def _unclipped(self, u: float) -> float:
        """A DOUBLE parameter's value at unit coordinate ``u``, also outside [0, 1] (the scale extended)."""
        lo, hi = float(self.min_value), float(self.max_value)
        if self.scale == "LINEAR":
            return lo + u * (hi - lo)
        if self.scale == "LOG":
            return lo * math.exp(u * math.log(hi / lo))
        return 1.0 - (1.0 - hi) * math.exp(u * math.log((1.0 - lo) / (1.0 - hi)))

    def box(self, center: object, half_width: float, extend: bool = False) -> "Parameter":
        """The sub-range of this parameter within ``half_width`` unit coordinates of ``center``, in its
        own type and scale, clipped to the range; with ``extend`` (the centre at a search edge) a DOUBLE
        range extends the scale past that edge instead (a LINEAR range not below 0 when it starts at
        0 or above; REVERSE_LOG stays below 1 by construction)."""
        c = self.unit(center)
        a, b = c - half_width, c + half_width
        if self.type == "DISCRETE":
            n = len(self.feasible_points)
            first, last = max(0, math.floor(a * n)), min(n - 1, math.floor(b * n))
            return Parameter(self.name, "DISCRETE", feasible_points=self.feasible_points[first:last + 1])
        if self.type == "INTEGER" or not extend:
            a, b = max(0.0, a), min(1.0, b)
        if self.type == "INTEGER":
            low, high = int(self.value(a)), int(self.value(min(b, 1.0 - 1e-12)))
            return Parameter(self.name, "INTEGER", self.scale, min(low, high), max(low, high))
        low, high = self._unclipped(a), self._unclipped(b)
        if self.scale == "LINEAR" and float(self.min_value) >= 0:
            low = max(low, 0.0)
        return Parameter(self.name, "DOUBLE", self.scale, min(low, high), max(low, high))

    def to_batch_science(self) -> dict:
        """This parameter's ``parameter_configs`` entry (scales written with the release's ``_SCALE``)."""
        if self.type == "DISCRETE":
            return {"type": "DISCRETE", "feasible_points": list(self.feasible_points)}
        cast = int if self.type == "INTEGER" else float
        return {
            "type": self.type,
            "min_value": cast(self.min_value),
            "max_value": cast(self.max_value),
            "scale": self.scale + _SCALE_SUFFIX,
        }

    @classmethod
    def from_batch_science(cls, name: str, config: object) -> Parameter:
        """Parse one ``parameter_configs`` entry; BatchlabError naming the problem if it is invalid."""
        if not isinstance(config, Mapping):
            raise BatchlabError(f"parameter {name!r}: config must be an object with type and range, got {config!r}")
        known = {"type", "scale", "min_value", "max_value", "feasible_points", "name"}
        extra = sorted(set(config) - known)
        if extra:
            raise BatchlabError(f"parameter {name!r}: unknown field {extra[0]!r}; allowed: {', '.join(sorted(known))}")
        kind = config.get("type")
        if not isinstance(kind, str) or kind.upper() not in TYPES:
            raise BatchlabError(f"parameter {name!r}: unknown type {kind!r}; allowed: {', '.join(TYPES)}")
        kind = kind.upper()
        if kind == "DISCRETE":
            points = config.get("feasible_points")
            if isinstance(points, (str, bytes)) or not isinstance(points, Sequence) or len(points) == 0:
                raise BatchlabError(f"parameter {name!r}: DISCRETE needs a non-empty list feasible_points, got {points!r}")
            bad = [p for p in points if p is not None and not finite_real(p)]
            if bad:
                raise BatchlabError(f"parameter {name!r}: feasible_points must be finite numbers (or null: off), "
                                    f"got {bad[0]!r:.40}")
            return cls(name=name, type=kind, feasible_points=tuple(points))
        for field in ("min_value", "max_value"):
            if field not in config:
                raise BatchlabError(f"parameter {name!r}: {kind} needs min_value and max_value (missing {field})")
        scale = _canonical_scale(name, config.get("scale", "LINEAR_SCALE"))
        lo = _real(name, "min_value", config["min_value"])
        hi = _real(name, "max_value", config["max_value"])
        if kind == "INTEGER" and lo == int(lo) and hi == int(hi):
            lo, hi = int(lo), int(hi)
        return cls(name=name, type=kind, scale=scale, min_value=lo, max_value=hi)


class SearchSpace:
    """An ordered tuple of :class:`Parameter`; quasi-random points as dicts ``{name: value}``."""

    def __init__(self, parameters: Sequence[Parameter]):
        parameters = tuple(parameters)
        names = [p.name for p in parameters]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise BatchlabError(f"search space names parameter {duplicates[0]!r} twice; names must be unique")
        self.parameters = parameters

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.parameters]

    def __len__(self) -> int:
        return len(self.parameters)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SearchSpace) and self.parameters == other.parameters

    def __repr__(self) -> str:
        return f"SearchSpace({list(self.parameters)!r})"

    @classmethod
    def from_batch_science(cls, parameter_configs: object) -> SearchSpace:
        """Build from ``parameter_configs``: a mapping name -> config (study.json), or a list of
        configs that each carry a ``name``. BatchlabError (one line) for any invalid entry."""
        if isinstance(parameter_configs, Mapping):
            items = list(parameter_configs.items())
        elif isinstance(parameter_configs, Sequence) and not isinstance(parameter_configs, (str, bytes)):
            items = []
            for config in parameter_configs:
                if not isinstance(config, Mapping) or not isinstance(config.get("name"), str):
                    raise BatchlabError(f"each parameter config in a list needs a string 'name', got {config!r}")
                items.append((config["name"], config))
        else:
            raise BatchlabError(
                f"parameter_configs must be an object of name -> config (or a list of named configs), got {parameter_configs!r}"
            )
        return cls([Parameter.from_batch_science(name, config) for name, config in items])

    def to_batch_science(self) -> dict:
        """The ``parameter_configs`` object (name -> config), in the space's order."""
        return {p.name: p.to_batch_science() for p in self.parameters}

    def _unit_points(self, start: int, count: int, seed: int) -> np.ndarray:
        from scipy.stats import qmc

        engine = qmc.Halton(d=len(self.parameters), scramble=True, rng=np.random.default_rng(seed))
        if start:
            engine.fast_forward(start)
        return engine.random(count)

    def _validated_seed(self, seed: object) -> int:
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise BatchlabError(f"seed must be an integer >= 0, got {seed!r}")
        return int(seed)

    def sample(self, n: int, seed: int = 0) -> list[dict]:
        """The first ``n`` points of the scrambled Halton sequence for ``seed``, as dicts."""
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise BatchlabError(f"number of points must be an integer >= 0, got {n!r}")
        seed = self._validated_seed(seed)
        if not self.parameters or n == 0:
            return [{} for _ in range(int(n))]
        units = self._unit_points(0, int(n), seed)
        return [self._point_from_unit(row) for row in units]

    def point(self, index: int, seed: int = 0) -> dict:
        """Point number ``index`` (0-based) of the sequence for ``seed``; equals ``sample(index + 1, seed)[index]``."""
        if isinstance(index, bool) or not isinstance(index, numbers.Integral) or index < 0:
            raise BatchlabError(f"point index must be an integer >= 0, got {index!r}")
        seed = self._validated_seed(seed)
        if not self.parameters:
            return {}
        return self._point_from_unit(self._unit_points(int(index), 1, seed)[0])

    def box(self, center: Mapping[str, object], half_width: float = 0.25,
            extend: Sequence[str] = ()) -> "SearchSpace":
        """The space within ``half_width`` unit coordinates of the point ``center`` in every parameter
        (:meth:`Parameter.box`; each in its own scale), extending past the range's edge for the
        parameters named in ``extend`` (those where ``center`` sits at a search edge). A parameter
        ``center`` does not name keeps its whole range."""
        if not 0 < half_width <= 0.5:
            raise BatchlabError(f"box half width must be in (0, 0.5] unit coordinates, got {half_width!r}")
        return SearchSpace([p.box(center[p.name], half_width, p.name in extend) if p.name in center else p
                            for p in self.parameters])

    def _point_from_unit(self, row: np.ndarray) -> dict:
        return {p.name: _plain(p.value(float(u))) for p, u in zip(self.parameters, row)}


def study_points_seed(seed: int, workload: str, optimizer: str, batch_size: int, search_round: int = 0) -> int:
    """The seed of one study's scrambled Halton sequence: the first 8 bytes (little endian, top bit
    cleared) of the sha256 of ``seed``, the workload's ``dataset/model`` name, the optimizer and the
    batch size. Stable across runs, resumes and narrowed sweeps (nothing else enters), distinct per
    study, so every batch size searches its own points. ``search_round`` > 0 (a refined search of the
    study, :mod:`batchlab.sweep.refine`) enters too, so each round draws its own sequence."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise BatchlabError(f"seed must be an integer >= 0, got {seed!r}")
    size = int(batch_size) if isinstance(batch_size, numbers.Integral) else batch_size  # a bad one: refused later
    text = f"batchlab-study-points|{int(seed)}|{workload}|{optimizer}|{size}"
    if search_round:
        text += f"|search_round={int(search_round)}"
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little") & 0x7FFFFFFFFFFFFFFF


def _plain(value: object) -> object:
    """numpy scalars -> Python scalars, so points are JSON-ready."""
    return value.item() if isinstance(value, np.generic) else value
