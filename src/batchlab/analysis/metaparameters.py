"""Optimal metaparameters against batch size, the scaling heuristics, and every trial's outcome.

* The *optimal* metaparameters at a batch size are those of its best trial (the one attaining steps
  to result, ties to the lower trial id): ``learning_rate`` η, ``momentum`` γ and the effective
  learning rate η/(1−γ) (η itself when the optimizer has no momentum).
* The heuristics of science.md 3.4 are anchored at the smallest batch size ``B0`` with a value
  ``y0``: **linear** ``y0 * B / B0`` and **square root** ``y0 * sqrt(B / B0)``.
* :func:`trial_outcomes` labels every trial of a workload for the (η, 1−γ) scatter: ``reached`` or
  ``not_reached`` for the selected trials, ``diverged`` for ``INFEASIBLE`` ones.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import duckdb
import numpy as np
import pandas as pd

from batchlab.analysis.selection import Selection, check_selection
from batchlab.analysis.steps_to_result import BatchSizeResult, effective_learning_rate, trial_first_steps

METAPARAMETERS = ("learning_rate", "momentum", "effective_learning_rate")
REACHED, NOT_REACHED, DIVERGED = "reached", "not_reached", "diverged"


def linear_heuristic(batch_sizes, b0: float, y0: float) -> np.ndarray:
    """``y0 * B / B0``: the linear scaling rule anchored at ``(B0, y0)``."""
    return y0 * np.asarray(batch_sizes, dtype=float) / b0


def square_root_heuristic(batch_sizes, b0: float, y0: float) -> np.ndarray:
    """``y0 * sqrt(B / B0)``: the square-root scaling rule anchored at ``(B0, y0)``."""
    return y0 * np.sqrt(np.asarray(batch_sizes, dtype=float) / b0)


@dataclass(frozen=True)
class OptimalMetaparameters:
    """The best trial's metaparameters at each batch size where the goal was reached.

    Attributes:
        batch_sizes: reached batch sizes, increasing.
        values: ``{name: array}`` for each of :data:`METAPARAMETERS`; NaN where the best trial lacks it.
    """

    batch_sizes: np.ndarray
    values: dict[str, np.ndarray]

    def heuristics(self, name: str) -> dict[str, np.ndarray]:
        """Linear and square-root heuristic lines for ``name`` at :attr:`batch_sizes`.

        Anchored at the smallest batch size where ``name`` has a value; empty dict if it has none.
        """
        y = self.values[name]
        finite = np.flatnonzero(np.isfinite(y))
        if finite.size == 0:
            return {}
        b0, y0 = float(self.batch_sizes[finite[0]]), float(y[finite[0]])
        return {
            "linear": linear_heuristic(self.batch_sizes, b0, y0),
            "square_root": square_root_heuristic(self.batch_sizes, b0, y0),
        }

    def has(self, name: str) -> bool:
        """Whether any best trial has a value for ``name``."""
        return bool(np.isfinite(self.values[name]).any())

    def to_rows(self) -> list[dict]:
        """One JSON-ready dict per batch size."""
        return [
            {"batch_size": int(b)} | {name: _none_if_nan(self.values[name][i]) for name in METAPARAMETERS}
            for i, b in enumerate(self.batch_sizes)
        ]


def optimal_metaparameters(results: Sequence[BatchSizeResult]) -> OptimalMetaparameters:
    """The best trials' metaparameters from :func:`~batchlab.analysis.steps_to_result.steps_to_result`."""
    reached = sorted((r for r in results if r.reached), key=lambda r: r.batch_size)
    values = {
        "learning_rate": [r.learning_rate for r in reached],
        "momentum": [r.momentum for r in reached],
        "effective_learning_rate": [r.effective_learning_rate for r in reached],
    }
    return OptimalMetaparameters(
        batch_sizes=np.array([r.batch_size for r in reached], dtype=float),
        values={k: np.array([np.nan if x is None else x for x in v], dtype=float) for k, v in values.items()},
    )


def trial_outcomes(con: duckdb.DuckDBPyConnection, selection: Selection) -> pd.DataFrame:
    """Every trial behind the (η, 1−γ) scatter, labelled ``reached``, ``not_reached`` or ``diverged``.

    The selected trials (the selection's status and max-trials rules) are ``reached`` or
    ``not_reached``; ``INFEASIBLE`` trials are ``diverged``. When ``INFEASIBLE`` is not among the
    selected statuses and ``max_trials`` is set, only diverged trials with ids up to the last selected
    trial's id at that batch size are kept (those the search ran before stopping).

    Columns: ``batch_size``, ``trial_id``, ``status``, ``outcome``, ``best`` (the best trial of its
    batch size), ``first_step`` (NaN if not reached), ``learning_rate``, ``momentum``,
    ``effective_learning_rate`` (NaN where a parameter is absent). Sorted by batch size and trial id.
    """
    check_selection(con, selection)
    chosen = trial_first_steps(con, selection)
    if "INFEASIBLE" not in selection.statuses:
        diverged = con.execute(
            "SELECT batch_size, trial_id, parameters, status FROM trials WHERE workload = ? AND status = 'INFEASIBLE'",
            [selection.workload],
        ).df()
        if selection.max_trials is not None:
            last = chosen.groupby("batch_size")["trial_id"].max()
            limit = diverged["batch_size"].map(last)
            diverged = diverged[limit.notna() & (diverged["trial_id"] <= limit)]
        diverged = diverged.assign(first_step=np.nan, value=np.nan)
        frame = pd.concat([chosen, diverged[chosen.columns]], ignore_index=True)
    else:
        frame = chosen
    frame = frame.sort_values(["batch_size", "trial_id"], ignore_index=True)
    frame["outcome"] = np.where(
        frame["status"] == "INFEASIBLE", DIVERGED, np.where(frame["first_step"].notna(), REACHED, NOT_REACHED)
    )
    frame["best"] = False
    reached = frame[frame["first_step"].notna()].sort_values(["batch_size", "first_step", "trial_id"])
    frame.loc[reached.groupby("batch_size").head(1).index, "best"] = True
    parameters = [json.loads(p) if isinstance(p, str) and p else {} for p in frame["parameters"]]
    frame["learning_rate"] = [_as_float(p.get("learning_rate")) for p in parameters]
    frame["momentum"] = [_as_float(p.get("momentum")) for p in parameters]
    frame["effective_learning_rate"] = [
        _as_float(effective_learning_rate(_float_or_none(p.get("learning_rate")), _float_or_none(p.get("momentum"))))
        for p in parameters
    ]
    return frame[
        ["batch_size", "trial_id", "status", "outcome", "best", "first_step", "learning_rate", "momentum", "effective_learning_rate"]
    ]


def _float_or_none(value) -> float | None:
    try:
        return None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None


def _as_float(value) -> float:
    value = _float_or_none(value)
    return np.nan if value is None else value


def _none_if_nan(value: float) -> float | None:
    return None if not np.isfinite(value) else float(value)
