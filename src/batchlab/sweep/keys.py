"""Stable names for trials: keys for resume, ids and seeds derived from the search-space point index.

A trial is identified by (workload, optimizer, batch size, search-space point index, sweep seed) plus
a short digest of everything else that defines its study (step budget, training-set size,
stop-at-goal, the search space itself). Re-running the same sweep produces the same keys, so finished
trials are skipped; changing the study definition produces new keys, so nothing stale is reused.

Trial ids are derived from the point index, never from the store's ``next_trial_id`` at run time, so
a resumed sweep writes exactly the trials (ids, seeds, metaparameters) an uninterrupted one would.
A grown budget (round ``r`` > 0) re-runs the same points with ids offset by ``r * MAX_TRIALS_PER_STUDY``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from batchlab.sweep.config import MAX_TRIALS_PER_STUDY


def store_workload_name(workload: str, optimizer: str) -> str:
    """The store's workload name ``dataset/model/optimizer`` for registry name ``dataset/model``."""
    return f"{workload}/{optimizer}"


def study_digest(
    *, steps: int, train_examples: int | None, stop_at_goal: bool, search_space: dict[str, Any],
    evaluations: int | None = None,
) -> str:
    """A 10-hex-digit digest of a study's definition beyond its workload, optimizer and batch size."""
    definition = {"steps": int(steps), "train_examples": train_examples, "stop_at_goal": bool(stop_at_goal),
                  "search_space": search_space}
    if evaluations is not None:  # absent keeps the digests of sweeps made before the option existed
        definition["evaluations"] = int(evaluations)
    payload = json.dumps(
        definition,
        sort_keys=True, separators=(",", ":"), default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:10]


def trial_key(workload: str, optimizer: str, batch_size: int, point_index: int, seed: int, digest: str) -> str:
    """The trial's stable key, e.g. ``mnist/fc_128_128_128/sgd|b=64|point=3|seed=0|study=1a2b3c4d5e``."""
    return f"{store_workload_name(workload, optimizer)}|b={int(batch_size)}|point={int(point_index)}|seed={int(seed)}|study={digest}"


def trial_id(point_index: int, budget_round: int = 0) -> int:
    """The trial id in its study: the point index, offset by the budget round."""
    if not 0 <= point_index < MAX_TRIALS_PER_STUDY:
        raise ValueError(f"point index must be in [0, {MAX_TRIALS_PER_STUDY}), got {point_index}")
    return int(budget_round) * MAX_TRIALS_PER_STUDY + int(point_index)


def trial_seed(sweep_seed: int, point_index: int) -> int:
    """The trial's seed (model initialisation and data order): distinct per point, stable per sweep."""
    digest = hashlib.sha256(f"batchlab-trial-seed|{int(sweep_seed)}|{int(point_index)}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
