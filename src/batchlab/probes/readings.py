"""How a prediction of the critical batch size is read: a point, a bound, or no value.

An estimate whose interval is open on one side is a bound at its finite end, never a point
(docs/methods.md, "Scoring predictors", rule 4). Shared by :mod:`batchlab.probes.predict` (which
prints each prediction's reading) and :mod:`batchlab.probes.scoring` (which scores by it).
"""

from __future__ import annotations

from dataclasses import dataclass

from batchlab.finite import finite_or_none

POINT, LOWER, UPPER, NONE = "point", "lower_bound", "upper_bound", "none"


@dataclass(frozen=True)
class Estimate:
    """One prediction read under the protocol: ``kind`` ``point``, ``lower_bound``, ``upper_bound`` or
    ``none``; ``value``: the point or the bound (examples; None for ``none``)."""

    kind: str
    value: float | None


def classify(value, low, high, has_interval: bool = True) -> Estimate:
    """The protocol's reading of a predicted ``value`` with interval ``[low, high]`` (None or non-finite:
    unbounded or missing). ``has_interval``: whether the prediction came with an interval at all
    (without one, missing ends mean "no interval" and a value is a point)."""
    value, low, high = finite_or_none(value), finite_or_none(low), finite_or_none(high)
    if not has_interval or (low is not None and high is not None):
        return Estimate(POINT, value) if value is not None and value > 0 else Estimate(NONE, None)
    if low is not None and low > 0:  # a lower bound of 0 (or below) says nothing about a batch size
        return Estimate(LOWER, low)
    if high is not None and high > 0:
        return Estimate(UPPER, high)
    return Estimate(NONE, None)
