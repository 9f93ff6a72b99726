"""Writing trials: one as it runs (:class:`TrialWriter`) or whole ones at once (:class:`TrialRecord`).

A trial writer appends each evaluation to a journal ``<store>/pending/<uuid>.jsonl`` that no reader
looks at. ``finish`` writes the measurements as one Parquet file and commits it with the trial row;
only then does the trial become visible, whole. A writer that never finishes leaves only its
journal: nothing visible, and its ``trial_key`` is not in ``finished_trial_keys()``.

Durability of the journal: each ``record`` is written through to the operating system (flushed,
not fsynced), so it survives the death of the writing process (SIGKILL included: the kernel's page
cache outlives the process). It is fsynced once, in ``finish``, before the trial is published, so
a trial whose publish fails (an id clash) keeps a durable journal. An fsync per record would only
protect an *unfinished* trial against a machine crash, and an unfinished trial is never visible and
is run again by a resumed sweep, so its journal tail is worth nothing; skipping those fsyncs cuts a
record from milliseconds (one fsync, more on a loaded disk) to microseconds.
"""

from __future__ import annotations

import json
import numbers
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from batchlab.errors import BatchlabError
from batchlab.store.files import store_writes
from batchlab.store.schema import PENDING_DIR, SCHEMAS, split_workload, validate_status
from batchlab.store.studies import (
    canonical_json,
    check_definition,
    early_stopping,
    make_study_definition,
    study_id,
)


class PublishTarget(Protocol):
    """What the writer needs of a :class:`batchlab.store.store.Store` (this module does not import
    that one, which imports this one for :meth:`~batchlab.store.store.Store.trial_writer`)."""

    root: Path

    def write_data_file(self, table: str, data: pa.Table, *, presorted: bool = False) -> str: ...

    def publish(self, trials: pa.Table, measurement_files: list[str], workloads: pa.Table | None = None,
                studies: pa.Table | None = None, operation: str = "append") -> int: ...


@dataclass(frozen=True)
class TrialRecord:
    """One whole trial to publish with :func:`publish_trials`.

    ``measurements`` holds ``(step, metric, value)`` triples; ``step`` counts optimizer updates.
    ``study_definition`` (from :func:`batchlab.store.studies.make_study_definition`) says what the
    trial was run under; the trial row gets its :func:`~batchlab.store.studies.study_id`, and the
    study row is added the first time that id appears at this workload and batch size (another
    definition at the same workload and batch size is another study, kept apart). When it is None
    the definition is built from ``train_steps``, ``search_space``, ``seed`` and ``source`` (and
    ``early_stopping=True`` is kept as the definition's ``early_stopping`` key). ``tags`` describe
    the workload; they are recorded the first time the workload appears in the store.
    """

    workload: str
    batch_size: int
    trial_id: int
    trial_key: str
    parameters: Mapping[str, Any]
    status: str
    steps: int
    seed: int | None = None
    source: str = "batchlab"
    measurements: Sequence[tuple[int, str, float]] = ()
    search_space: Mapping[str, Any] | None = None
    train_steps: int | None = None
    early_stopping: bool = False
    tags: Mapping[str, Any] | None = field(default=None)
    study_definition: Mapping[str, Any] | None = None


def record_definition(r: TrialRecord) -> dict:
    """The study definition of a record: its own (re-validated), or one built from its fields."""
    if r.study_definition is not None:
        return check_definition(r.study_definition, r.workload, int(r.batch_size))
    extra = {"early_stopping": True} if r.early_stopping else {}
    return make_study_definition(
        workload=r.workload, batch_size=int(r.batch_size), train_steps=r.train_steps,
        search_space=r.search_space, seed=r.seed, source=r.source, **extra,
    )


def _check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int (numpy integers accepted) if it is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise BatchlabError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_value(metric: str, value: Any) -> float:
    if not isinstance(metric, str) or not metric:
        raise BatchlabError(f"metric names must be non-empty strings, got {metric!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise BatchlabError(f"value of metric {metric!r} must be a number, got {value!r}") from None


def _validate_record(r: TrialRecord) -> dict:
    """Check a record's fields; returns its study definition."""
    split_workload(r.workload)
    _check_int("batch_size", r.batch_size, 1)
    _check_int("trial_id", r.trial_id, 0)
    _check_int("steps", r.steps, 0)
    validate_status(r.status)
    if not isinstance(r.trial_key, str) or not r.trial_key:
        raise BatchlabError(f"trial_key must be a non-empty string, got {r.trial_key!r}")
    if r.seed is not None:
        _check_int("seed", r.seed, 0)
    if r.train_steps is not None:
        _check_int("train_steps", r.train_steps, 0)
    return record_definition(r)


def _plain_json(value: Any) -> Any:
    """JSON fallback for numpy scalars and arrays (their ``item``/``tolist``)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, allow_nan=True, default=_plain_json)


def study_row(definition: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> dict:
    """The studies-table row (on-disk schema) of a validated study definition."""
    return {
        "workload": definition["workload"], "batch_size": int(definition["batch_size"]),
        "study_id": study_id(definition),
        "search_space": None if definition.get("search_space") is None else _json(definition["search_space"]),
        "train_steps": definition.get("train_steps"), "early_stopping": early_stopping(definition),
        "definition": canonical_json(definition), "extra": _json(dict(extra or {})),
    }


def _rows(records: Sequence[TrialRecord], definitions: Sequence[dict]) -> tuple[pa.Table, pa.Table, pa.Table, pa.Table]:
    """(trials, measurements, workloads, studies) Arrow tables for ``records``."""
    ids = [study_id(d) for d in definitions]
    trials = pa.Table.from_pylist(
        [
            {
                "workload": r.workload, "batch_size": int(r.batch_size), "trial_id": int(r.trial_id),
                "trial_key": r.trial_key, "study_id": sid, "parameters": _json(dict(r.parameters)),
                "status": r.status, "steps": int(r.steps),
                "seed": None if r.seed is None else int(r.seed), "source": r.source,
            }
            for r, sid in zip(records, ids)
        ],
        schema=SCHEMAS["trials"],
    )
    m_cols: dict[str, list] = {k: [] for k in ("workload", "batch_size", "trial_id", "step", "metric", "value")}
    for r in records:
        seen = set()
        for step, metric, value in r.measurements:
            step = _check_int("step", step, 0)
            value = _check_value(metric, value)
            if (step, metric) in seen:
                raise BatchlabError(
                    f"trial {r.trial_key!r} records metric {metric!r} twice at step {step}"
                )
            seen.add((step, metric))
            for k, v in zip(m_cols, (r.workload, r.batch_size, r.trial_id, step, metric, value)):
                m_cols[k].append(v)
    measurements = pa.table(
        {k: pa.array(v, SCHEMAS["measurements"].field(k).type.value_type
                     if pa.types.is_dictionary(SCHEMAS["measurements"].field(k).type)
                     else SCHEMAS["measurements"].field(k).type) for k, v in m_cols.items()}
    ).cast(SCHEMAS["measurements"])
    workloads = {}
    studies = {}
    for r, definition, sid in zip(records, definitions, ids):
        dataset, model, optimizer = split_workload(r.workload)
        workloads.setdefault(r.workload, {
            "workload": r.workload, "dataset": dataset, "model": model, "optimizer": optimizer,
            "tags": _json(dict(r.tags or {})),
        })
        if (r.workload, int(r.batch_size), sid) not in studies:
            studies[(r.workload, int(r.batch_size), sid)] = study_row(definition)
    return (
        trials,
        measurements,
        pa.Table.from_pylist(list(workloads.values()), schema=SCHEMAS["workloads"]),
        pa.Table.from_pylist(list(studies.values()), schema=SCHEMAS["studies"]),
    )


def publish_trials(store: PublishTarget, records: Sequence[TrialRecord]) -> int:
    """Publish whole trials in one atomic commit; returns how many were new.

    Trials whose ``trial_key`` is already published are skipped (so re-publishing is harmless).
    BatchlabError for invalid fields, or a trial id already used at that workload and batch size
    under another key.
    """
    definitions = [_validate_record(r) for r in records]
    if not records:
        return 0
    trials, measurements, workloads, studies = _rows(records, definitions)
    files = [store.write_data_file("measurements", measurements)] if measurements.num_rows else []
    try:
        return store.publish(trials, files, workloads, studies)
    except BaseException:
        for rel in files:
            (store.root / rel).unlink(missing_ok=True)
        raise


class TrialWriter:
    """Writes one trial as it runs: ``record`` per evaluation, then ``finish`` to publish it."""

    def __init__(self, store: PublishTarget, **fields: Any):
        self.store = store
        self._fields = fields
        self._record = TrialRecord(status="COMPLETE", steps=0, **fields)
        definition = _validate_record(self._record)
        # the definition is fixed now (a caller's dict changing later does not move the trial)
        self._fields["study_definition"] = definition
        self.study_definition = definition
        self.study_id = study_id(definition)
        self._measurements: list[tuple[int, str, float]] = []
        self._seen: set[tuple[int, str]] = set()
        self._finished = False
        self.journal_path = store.root / PENDING_DIR / f"{uuid.uuid4().hex}.jsonl"
        header = {k: v for k, v in fields.items()}
        header["parameters"] = dict(fields["parameters"])
        for key in ("search_space", "tags"):
            if header.get(key) is not None:
                header[key] = dict(header[key])
        with store_writes(store.root, "write a trial journal"):  # a read-only store, a full disk
            self._journal = open(self.journal_path, "x", encoding="utf-8")
            try:
                self._append({"header": header})
            except OSError:
                self._journal.close()
                self.journal_path.unlink(missing_ok=True)
                raise

    @property
    def trial_key(self) -> str:
        return self._record.trial_key

    def _append(self, entry: dict) -> None:
        # Flushed to the OS (survives SIGKILL), not fsynced: see the module docstring.
        self._journal.write(json.dumps(entry, allow_nan=True, default=_plain_json) + "\n")
        self._journal.flush()

    def record(self, step: int, values: Mapping[str, float]) -> None:
        """Record the metrics evaluated after ``step`` updates; not visible until ``finish``.

        At return the record is in the journal as far as the operating system is concerned (it
        survives the death of this process); it is fsynced by ``finish`` (see the module docstring).

        BatchlabError for a negative or non-integer step, a non-numeric value, a metric recorded
        twice at one step, or a writer already finished.
        """
        if self._finished:
            raise BatchlabError(f"trial {self.trial_key!r} is already finished")
        step = _check_int("step", step, 0)
        clean = {}
        for metric, value in values.items():
            value = _check_value(metric, value)
            if (step, metric) in self._seen:
                raise BatchlabError(
                    f"trial {self.trial_key!r} records metric {metric!r} twice at step {step}"
                )
            clean[metric] = value
        self._append({"step": step, "values": clean})
        for metric, value in clean.items():
            self._seen.add((step, metric))
            self._measurements.append((step, metric, value))

    def finish(self, status: str = "COMPLETE", steps: int | None = None) -> bool:
        """Publish the whole trial atomically with ``status`` and ``steps`` (updates trained;
        default: the last recorded step, or 0). Returns False (and publishes nothing) if a trial
        with this key was already published. The journal is removed afterwards."""
        if self._finished:
            raise BatchlabError(f"trial {self.trial_key!r} is already finished")
        validate_status(status)
        if steps is None:
            steps = max((s for s, _, _ in self._measurements), default=0)
        record = TrialRecord(
            status=status, steps=steps, measurements=self._measurements, **self._fields
        )
        os.fsync(self._journal.fileno())  # the journal is durable before anything is published
        published = publish_trials(self.store, [record]) == 1
        self._finished = True
        self._journal.close()
        self.journal_path.unlink(missing_ok=True)
        return published

    def __del__(self):
        journal = getattr(self, "_journal", None)
        if journal is not None and not journal.closed:
            journal.close()


