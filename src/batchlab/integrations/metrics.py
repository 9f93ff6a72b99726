"""What the two noise-scale callbacks log and accept: one key set, one set of option rules.

Both :class:`batchlab.integrations.lightning.NoiseScaleCallback` and
:class:`batchlab.integrations.huggingface.NoiseScaleCallback` log exactly :func:`logged_metrics` of
their tracker's reading (definitions: docs/methods.md, "Batch-size schedules and the Lightning
callbacks") and check their ``every``, ``beta`` and ``level`` with :func:`checked_options`. No
optional dependency: this module imports neither lightning nor transformers.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

from batchlab.errors import BatchlabError, checked_int

#: The reading's keys logged whenever they hold a finite number (B_simple itself only when resolved).
READING_KEYS = ("b_simple_low", "b_simple_high", "trace_sigma", "grad_norm_sq")
#: The per-layer keys logged (per-layer B_simple has no interval, so its point value is not logged).
LAYER_KEYS = ("trace_sigma", "grad_norm_sq")


def logged_metrics(reading: Mapping | None, per_layer: Mapping[str, Mapping] | None = None,
                   prefix: str = "noise_scale/") -> dict[str, float]:
    """The logged name -> value of a tracker ``reading`` (:meth:`NoiseScaleTracker.reading`):
    ``<prefix>b_simple`` (examples) only when the reading is ``resolved`` (its interval has an upper
    end), ``<prefix>b_simple_low`` and ``<prefix>b_simple_high`` (the interval's ends; the upper one
    only when it exists), ``<prefix>trace_sigma`` and ``<prefix>grad_norm_sq`` (tr(Sigma) per example
    and |G|^2 of the unscaled mean loss); with ``per_layer`` (the tracker's ``per_layer``: module name
    -> its entry) also ``<prefix>layer/<module>/trace_sigma`` and ``.../grad_norm_sq``. Finite values
    only, as floats; ``{}`` for ``None`` (no reading yet)."""
    if reading is None:
        return {}
    out: dict[str, float] = {}
    if reading.get("resolved") and reading.get("b_simple") is not None:
        out["b_simple"] = reading["b_simple"]
    for key in READING_KEYS:
        if reading.get(key) is not None:
            out[key] = reading[key]
    for module, entry in (per_layer or {}).items():
        for key in LAYER_KEYS:
            if entry.get(key) is not None:
                out[f"layer/{module}/{key}"] = entry[key]
    return {prefix + k: float(v) for k, v in out.items() if math.isfinite(float(v))}


def checked_options(every, beta, level) -> tuple[int, float | None, float]:
    """The callbacks' ``every`` (an integer >= 1: measure one optimizer step in ``every``), ``beta``
    (the EMA decay per measured step, a number in [0, 1), or ``None`` for the plain mean) and ``level``
    (the interval's two-sided level, a number in (0, 1)), as ``(int, float or None, float)``; else a
    one-line :class:`BatchlabError` naming the option and its allowed values."""
    every = checked_int("NoiseScaleCallback every", every, 1)
    if beta is not None:
        if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not 0.0 <= beta < 1.0:
            raise BatchlabError(f"NoiseScaleCallback beta must be a number in [0, 1) or None (the plain mean), "
                                f"got {beta!r}")
        beta = float(beta)
    if isinstance(level, bool) or not isinstance(level, numbers.Real) or not 0.0 < level < 1.0:
        raise BatchlabError(f"NoiseScaleCallback level must be a number in (0, 1), got {level!r}")
    return every, beta, float(level)


def check_resumed_settings(callback: str, state: dict, beta: float | None, every: int) -> None:
    """A one-line :class:`BatchlabError` when a checkpoint's tracker state was measured with another
    ``beta`` or ``every`` than the callback resuming it (the state's would silently replace them)."""
    saved_beta, saved_every = state.get("beta"), state.get("every", 1)
    if saved_beta != beta or saved_every != every:
        raise BatchlabError(f"{callback}: the checkpoint's noise-scale state was measured with beta={saved_beta!r}, "
                            f"every={saved_every!r}, this callback has beta={beta!r}, every={every!r}; resume with "
                            "the same settings")


__all__ = ["LAYER_KEYS", "READING_KEYS", "check_resumed_settings", "checked_options", "logged_metrics"]
