"""Whether a value is a usable finite number: the one check the validations of hyperparameters and search
spaces share (``math.isfinite(float(v))`` alone raises OverflowError for an int beyond the float range)."""

from __future__ import annotations

import math
import numbers

__all__ = ["INT64_MAX", "finite_or_none", "finite_real"]

#: The largest integer an int64 column (step, trial id, batch size, budget) holds: 2^63 - 1.
INT64_MAX = 2**63 - 1


def finite_real(value: object) -> bool:
    """Whether ``value`` is a real number (not a bool) whose float value is finite; an integer beyond the
    float range (``10**400``) is not."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def finite_or_none(value) -> float | None:
    """``float(value)`` when it is finite; ``None`` for ``None``, NaN and infinities (a JSON or CSV cell
    that has no number)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None
