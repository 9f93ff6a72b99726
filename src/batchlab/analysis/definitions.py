"""Named critical batch sizes: one registry, declared once, read by every table, summary and interval.

Each entry of :data:`REGISTRY` is a :class:`CriticalBatchSizeDefinition`: its ``name`` (the key in
every JSON summary, ``critical_batch_sizes``), a one-line ``definition`` (printed under tables and in
the JSON), a short ``label`` (a column header in wide tables), its ``source`` and how it is computed:

* ``source="fit"``: from the S(B) fit (:mod:`batchlab.analysis.critical_batch_size`), as
  ``from_b_crit(b_crit, tolerance, b0)``, a function of the fitted ``B_crit`` that does not decrease
  with it; its interval is the ``B_crit`` interval mapped through that function
  (:mod:`batchlab.analysis.bootstrap`).
* ``source="data"``: read from the measured points by :func:`batchlab.analysis.regimes.read_regimes`,
  whose output has an entry of the same name (``value``, ``reason``, bounds); no interval.

``headline`` entries are the ones compact tables show (``batchlab analyze --steps-table``); full
tables show every entry. Names are unique; an unknown name is a one-line error
(:func:`get_definition`). Definitions and estimators: docs/methods.md, "Critical batch size".

Tables iterate the registry, never a list of their own::

    for d in REGISTRY:                      # or named_definitions(headline_only=True)
        value = summary["critical_batch_sizes"][d.name]["value"]
        header = d.label                    # legend: f"{d.label} = {d.name}: {d.definition}"
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from batchlab.errors import BatchlabError, unknown_name_error

if TYPE_CHECKING:  # annotations only: critical_batch_size imports this module
    from batchlab.analysis.critical_batch_size import ScalingFit

SOURCES = ("fit", "data")
#: The quantities :func:`batchlab.analysis.regimes.read_regimes` reads from the data under these names.
DATA_QUANTITIES = ("perfect_scaling_end", "maximal_parallelism_start")


@dataclass(frozen=True)
class CriticalBatchSizeDefinition:
    """One named critical batch size (see the module docstring for the fields)."""

    name: str
    definition: str
    label: str
    source: str
    from_b_crit: Callable[[float, float, float], float] | None = None
    headline: bool = True

    def __post_init__(self) -> None:
        for attribute in ("name", "label"):
            text = getattr(self, attribute)
            if not isinstance(text, str) or not text or any(c.isspace() for c in text):
                raise BatchlabError(f"critical batch size {attribute} must be a non-empty word, got {text!r}")
        if self.source not in SOURCES:
            raise BatchlabError(f"critical batch size {self.name!r}: source must be one of {', '.join(SOURCES)}, "
                                f"got {self.source!r}")
        if (self.source == "fit") != (self.from_b_crit is not None):
            raise BatchlabError(f"critical batch size {self.name!r}: from_b_crit is required for source 'fit' "
                                "and must be None for source 'data'")
        if self.source == "data" and self.name not in DATA_QUANTITIES:
            raise BatchlabError(f"critical batch size {self.name!r}: a data-read definition must be one of "
                                f"read_regimes' quantities {', '.join(DATA_QUANTITIES)}")
        if not self.definition or "\n" in self.definition:
            raise BatchlabError(f"critical batch size {self.name!r}: definition must be one non-empty line")

    def value(self, fit: ScalingFit, tolerance: float, b0: float, regimes: dict | None) -> float | None:
        """The value for ``fit`` (at ``tolerance``, perfect scaling measured from ``b0``) and
        ``regimes`` (:func:`~batchlab.analysis.regimes.read_regimes` of the curve; None when no curve
        is available, which leaves the data-read entries None)."""
        if self.from_b_crit is not None:
            return self.from_b_crit(fit.b_crit, tolerance, b0)
        return None if regimes is None else regimes[self.name]["value"]


REGISTRY: tuple[CriticalBatchSizeDefinition, ...] = (
    CriticalBatchSizeDefinition(
        "mccandlish_b_crit",
        "E_min / S_min of the fit S(B) = S_min + E_min / B (McCandlish et al. 2018): twice the minimum steps and examples",
        "B_crit", "fit",
        lambda b_crit, tolerance, b0: b_crit,
    ),
    CriticalBatchSizeDefinition(
        "overhead_20pct",
        "batch size where steps exceed perfect scaling from B0 by 20% (Zhang et al. 2024), from the fit: "
        "0.2 B_crit + 1.2 B0",
        "B_20%", "fit",
        lambda b_crit, tolerance, b0: 0.2 * b_crit + 1.2 * b0,
    ),
    CriticalBatchSizeDefinition(
        "perfect_scaling_end",
        "read from the data: the last measured B before the first B above B0 whose S(B) B exceeds (1 + tol) S(B0) B0 "
        "(Shallue regime 1 ends; contiguous from B0)",
        "ps_end_data", "data",
    ),
    CriticalBatchSizeDefinition(
        "maximal_parallelism_start",
        "read from the data: the smallest measured B from which every larger measured S is within (1 + tol) of the "
        "minimum measured S (Shallue regime 3 starts)",
        "mp_start_data", "data",
    ),
    CriticalBatchSizeDefinition(
        "fit_perfect_scaling_end",
        "from the fit: tol * B_crit, where examples to result exceed E_min by tol (a model quantity)",
        "ps_end_fit", "fit",
        lambda b_crit, tolerance, b0: tolerance * b_crit,
        headline=False,
    ),
    CriticalBatchSizeDefinition(
        "fit_maximal_parallelism_start",
        "from the fit: B_crit / tol, where steps to result come within tol of S_min (a model quantity)",
        "mp_start_fit", "fit",
        lambda b_crit, tolerance, b0: b_crit / tolerance if b_crit > 0 else 0.0,
        headline=False,
    ),
)


def _check_unique(entries: tuple[CriticalBatchSizeDefinition, ...]) -> None:
    for attribute in ("name", "label"):
        seen = [getattr(d, attribute) for d in entries]
        dup = sorted({x for x in seen if seen.count(x) > 1})
        if dup:
            raise BatchlabError(f"critical batch size definitions repeat the {attribute} {dup[0]!r}")


_check_unique(REGISTRY)


def definition_names(*, headline_only: bool = False) -> tuple[str, ...]:
    """The names of the registry's definitions, in registry order (the order every table uses)."""
    return tuple(d.name for d in named_definitions(headline_only=headline_only))


def named_definitions(*, headline_only: bool = False) -> tuple[CriticalBatchSizeDefinition, ...]:
    """The registry's definitions in order; ``headline_only``: only those compact tables show."""
    return tuple(d for d in REGISTRY if d.headline or not headline_only)


def get_definition(name: str) -> CriticalBatchSizeDefinition:
    """The definition called ``name``; an unknown name is a one-line BatchlabError listing the known ones."""
    for d in REGISTRY:
        if d.name == name:
            return d
    raise unknown_name_error("critical batch size definition", str(name), definition_names())


def named_values(summary: dict, *, headline_only: bool = False) -> dict[str, float | None]:
    """``{name: value}`` of a summary's ``critical_batch_sizes`` (from
    :func:`~batchlab.analysis.critical_batch_size.summarize_curve` or a bootstrap estimate's
    ``to_dict``), in registry order; a name the summary lacks reads None."""
    named = summary.get("critical_batch_sizes") or {}
    return {d.name: (named.get(d.name) or {}).get("value")
            for d in named_definitions(headline_only=headline_only)}


def legend(*, headline_only: bool = False) -> list[str]:
    """One line per definition for under a table: ``"label = name: definition"``."""
    return [f"{d.label} = {d.name}: {d.definition}" for d in named_definitions(headline_only=headline_only)]
