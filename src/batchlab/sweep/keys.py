"""Stable names for trials: sweep ids, trial keys, id blocks and seeds.

Every study of a sweep (one workload, optimizer, batch size and budget round) has a *study
definition* (:func:`batchlab.store.studies.make_study_definition`: step budget, training examples,
search space, evaluation schedule, stop rule, seed, source) with three extra keys: ``sweep`` (the
:func:`sweep_id`), ``budget_round`` and ``budget_rule``. A trial's key is
``<workload>/<optimizer>|b=<B>|point=<i>|seed=<s>|study=<study id>``, so a key names exactly one
study definition: re-running the same sweep produces the same keys (finished trials are skipped),
and changing anything that defines the measurement produces new keys (nothing stale is reused).

Trial ids are unique per (workload, batch size) across the store and start at 1, as in the
batch_science release and in ``batchlab train``/``study`` (:data:`FIRST_TRIAL_ID`). Each study
definition gets its own *block* of ids: point ``i`` of the study in block ``k`` has id
``k * MAX_TRIALS_PER_STUDY + 1 + i`` (:func:`trial_id`). A study whose trials are already in the
store keeps the ids they have (found by key, so a resumed sweep writes the ids an uninterrupted one
would; a study written by a batchlab whose sweep ids started at 0 keeps that base), and a new
definition takes the lowest block that holds no trial at all (:func:`allocate_ids`). So sweeps with
other settings on the same store are kept apart, not refused. Seeds derive from the point index,
never from the store or the id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from batchlab.errors import BatchlabError
from batchlab.store.schema import store_workload_name
from batchlab.store.studies import id_block  # the store's one definition of the id blocks
from batchlab.sweep.config import MAX_TRIALS_PER_STUDY

#: The id of a study's first trial (point 0) in block 0: the batch_science release's base.
FIRST_TRIAL_ID = 1


def sweep_id(settings: Mapping[str, Any]) -> str:
    """12 hex digits naming a sweep: the sha256 of the canonical JSON of ``settings``.

    ``settings`` are the sweep's settings that define its measurements (the budget rule, training
    examples, seed, stop at goal, evaluation schedule, search spaces, schedule), not how it runs
    (workers, executor, vectorization) nor which workloads, optimizers and batch sizes it covers (a
    sweep extended by a batch size keeps its id). See :meth:`batchlab.sweep.plan.sweep_settings`.
    """
    from batchlab.store.studies import canonical_json

    return hashlib.sha256(canonical_json(dict(settings)).encode("utf-8")).hexdigest()[:12]


def trial_key(workload: str, optimizer: str, batch_size: int, point_index: int, seed: int, digest: str) -> str:
    """The trial's stable key, e.g. ``mnist/fc_128_128_128/sgd|b=64|point=3|seed=0|study=1a2b3c4d5e6f``."""
    return f"{store_workload_name(workload, optimizer)}|b={int(batch_size)}|point={int(point_index)}|seed={int(seed)}|study={digest}"


def trial_id(point_index: int, block: int = 0) -> int:
    """The trial id of point ``point_index`` in id block ``block``: ``block * MAX_TRIALS_PER_STUDY + 1 + i``."""
    if not 0 <= point_index < MAX_TRIALS_PER_STUDY:
        raise ValueError(f"point index must be in [0, {MAX_TRIALS_PER_STUDY}), got {point_index}")
    if block < 0:
        raise ValueError(f"id block must be >= 0, got {block}")
    return int(block) * MAX_TRIALS_PER_STUDY + FIRST_TRIAL_ID + int(point_index)


def allocate_ids(
    wanted: Iterable[tuple[tuple[str, int], str, list[tuple[int, str]]]],
    held: Mapping[tuple[str, int], Mapping[int, str]],
) -> list[int]:
    """The first trial id (the id of point 0) of each wanted study, in order; point ``i`` gets
    ``first + i``.

    ``wanted``: per study ``((workload, batch_size), name, [(point_index, trial_key), ...])``;
    ``held``: the store's trials, ``{(workload, batch_size): {trial_id: trial_key}}``. A study
    with a trial in the store keeps that trial's ids (block ``k`` with the current base, ``k *
    MAX_TRIALS_PER_STUDY + 1``, or a block written by an older batchlab with base 0); any other takes
    the lowest block of its (workload, batch size) that holds no stored trial and no block given out
    before it. Deterministic given the store, so a resumed sweep gets the ids of the interrupted one.

    Raises:
        BatchlabError: a study's stored trials sit in two blocks or off their point's id, or a planned
            id is held by a trial of another key (a trial written into the block by hand or by
            ``batchlab train``).
    """
    wanted = list(wanted)
    taken: dict[tuple[str, int], set[int]] = {}
    for place, ids in held.items():
        taken[place] = {id_block(i) for i in ids}
    by_key = {place: {key: int(i) for i, key in ids.items()} for place, ids in held.items()}
    firsts: list[int | None] = []
    for place, name, trials in wanted:  # first the studies already (partly) in the store
        stored = by_key.get(place, {})
        found = {(stored[key] - point) for point, key in trials if key in stored}
        if len(found) > 1 or any(f < 0 or f % MAX_TRIALS_PER_STUDY not in (0, FIRST_TRIAL_ID) for f in found):
            raise BatchlabError(f"the store's trials of {name} do not follow one id block; allowed: a store "
                                "written by batchlab sweep (or another --store)")
        firsts.append(found.pop() if found else None)
    for index, (place, name, trials) in enumerate(wanted):
        used = taken.setdefault(place, set())
        if firsts[index] is None:
            block = 0
            while block in used:
                block += 1
            firsts[index] = trial_id(0, block)
        used.add(firsts[index] // MAX_TRIALS_PER_STUDY)
        ids = held.get(place, {})
        for point, key in trials:
            planned = firsts[index] + point
            other = ids.get(planned)
            if other is not None and other != key:
                raise BatchlabError(
                    f"trial id {planned} of {name} is held by another trial (key {other!r}); allowed: a store "
                    "where batchlab sweep owns its id blocks, or another --store"
                )
    return [int(f) for f in firsts]


def trial_seed(sweep_seed: int, point_index: int) -> int:
    """The trial's seed (model initialisation and data order): distinct per point, stable per sweep."""
    digest = hashlib.sha256(f"batchlab-trial-seed|{int(sweep_seed)}|{int(point_index)}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
