"""Export a store in the batch_science release layout (the inverse of the import).

Writes ``<workload>/<batch_size>/study.json`` and ``<workload>/<batch_size>/<trial_id>/
{metadata.json, measurements.csv}`` for every study and trial. ``measurements.csv`` has ``step``
then one column per metric (sorted by name), one row per evaluated step, an empty cell where a
metric was not evaluated at that step. Floats are written by Arrow's CSV writer, which prints the
shortest decimal that parses back to the same double (``nan``, ``inf``, ``-inf`` included), so
import -> export -> import gives bit-identical values. Fields without a column in the store
(``_internal_*`` of metadata.json) are not reproduced; extra ``study.json`` fields are.

Mapping to the release's conventions (docs/methods.md, "Trial statuses"):

- The release knows only COMPLETE, INCOMPLETE and INFEASIBLE. A STOPPED_AT_GOAL trial is written
  with ``status`` COMPLETE, ``steps`` = the updates it actually ran (fewer than ``train_steps``) and
  ``batchlab_status: "STOPPED_AT_GOAL"`` in its metadata.json; its study.json says
  ``early_stopping: true``. This is how the release itself records early-stopped studies (their
  COMPLETE trials ran fewer steps than ``train_steps``), so a release reader sees an early-stopping
  study, and batchlab's import reads ``batchlab_status`` back, so the status survives a round trip.
  Bounded values (docs/methods.md, "Bounded measurements") keep the store's form: the metric's cell
  holds the bound and the column ``<metric>:bound`` of the same row its flag (``1``: lower bound,
  ``-1``: upper bound), which batchlab's import reads back as it was; a reader of the release format
  that ignores that column would take the bound for a value, so the export counts them (``bounded``).
  A RACED trial (stopped by racing, docs/methods.md "Racing") is written as INCOMPLETE (stopped
  before its budget for a reason other than a goal) with ``batchlab_status: "RACED"``, read back
  the same way.
- The release has one study per workload and batch size. Where the store holds several study
  definitions there, all their trials are written into that one directory (trial ids are unique per
  workload and batch size); ``study.json`` takes ``train_steps`` and ``parameter_configs`` from the
  definition with the most trials and lists every definition with its trial ids under
  ``batchlab_studies``. The report counts such batch sizes (``merged_batch_sizes``).

The tree is built under a temporary sibling directory and renamed into place at the end, so an
interrupted export leaves no partial ``--out`` directory.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from batchlab.errors import BatchlabError
from batchlab.store.store import Store
from batchlab.store.schema import BOUND_SUFFIX, validate_workload_name


@dataclass
class ExportReport:
    """Counts written by an export."""

    studies: int = 0
    trials: int = 0
    measurements: int = 0
    stopped_at_goal: int = 0  # STOPPED_AT_GOAL trials written as COMPLETE (see the module docstring)
    raced: int = 0  # RACED trials written as INCOMPLETE
    bounded: int = 0  # values written as bounds, flagged in a ``<metric>:bound`` column
    merged_batch_sizes: int = 0  # batch sizes whose several study definitions share one study.json

    def as_dict(self) -> dict:
        return {"studies": self.studies, "trials": self.trials, "measurements": self.measurements,
                "stopped_at_goal": self.stopped_at_goal, "raced": self.raced, "bounded": self.bounded,
                "merged_batch_sizes": self.merged_batch_sizes,
                "status_mapping": STATUS_MAPPING}


#: How statuses are written (the export's own output repeats it).
STATUS_MAPPING = ("STOPPED_AT_GOAL -> status COMPLETE with steps = updates run, batchlab_status "
                  "STOPPED_AT_GOAL in metadata.json, early_stopping true in study.json; RACED -> status "
                  "INCOMPLETE, batchlab_status RACED")


def _safe_parts(workload: str) -> list[str]:
    """The directory names of ``workload`` (a store name, :func:`validate_workload_name`)."""
    try:
        return validate_workload_name(workload).split("/")
    except BatchlabError as exc:  # a store written before names were checked at import
        raise BatchlabError(f"{exc}; it cannot be exported as a directory path") from None


def _csv_bytes(metrics: list[str], steps: np.ndarray, values: np.ndarray, present: np.ndarray) -> bytes:
    """measurements.csv of one trial: ``steps`` (n,), ``values`` and ``present`` (n, metrics)."""
    header = ",".join(["step", *metrics]) + "\n"
    if len(steps) == 0:
        return header.encode()
    columns = {"step": pa.array(steps)}
    for j in range(len(metrics)):
        columns[f"c{j}"] = pa.array(values[:, j], mask=~present[:, j])  # missing -> empty cell
    sink = io.BytesIO()
    pacsv.write_csv(pa.table(columns), sink, pacsv.WriteOptions(include_header=False))
    return header.encode() + sink.getvalue()


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, allow_nan=True) + "\n")


def export_batch_science(store: Store, out: str | Path) -> ExportReport:
    """Write every study and trial of ``store`` under ``out`` (which must not exist or be empty)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BatchlabError(f"export target {out} exists and is not an empty directory")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BatchlabError(f"cannot create the export target's directory {out.parent}: {exc.strerror or exc}") from None
    tmp = out.with_name(f".tmp-{uuid.uuid4().hex}-{out.name}")
    report = ExportReport()
    con = store.connect()
    try:
        workloads = {r[0]: r[1:] for r in con.execute(
            "SELECT workload, dataset, model, optimizer FROM workloads").fetchall()}
        # every study, with its trial count, trial ids and whether any trial stopped at its goal
        studies = con.execute(
            """
            SELECT s.workload, s.batch_size, s.study_id, s.search_space, s.train_steps,
                   s.early_stopping, s.definition,
                   count(t.trial_id) AS n, list(t.trial_id ORDER BY t.trial_id) FILTER (t.trial_id IS NOT NULL),
                   coalesce(bool_or(t.status = 'STOPPED_AT_GOAL'), false)
            FROM (SELECT workload, batch_size, study_id, any_value(search_space) AS search_space,
                         any_value(train_steps) AS train_steps, any_value(early_stopping) AS early_stopping,
                         any_value(definition) AS definition
                  FROM studies GROUP BY ALL) s
            LEFT JOIN trials t USING (workload, batch_size, study_id)
            GROUP BY ALL ORDER BY s.workload, s.batch_size, n DESC, s.study_id
            """).fetchall()
        committed = store._committed("studies", store.state(),
                                     ["workload", "batch_size", "study_id", "extra"])
        extras = {}
        for w, b, sid, e in zip(*(committed[c].to_pylist() for c in committed.column_names)):
            extras.setdefault((w, b, sid), json.loads(e or "{}"))
        by_key: dict[tuple, list] = {}
        for row in studies:
            by_key.setdefault((row[0], row[1]), []).append(row)
        tmp.mkdir()
        for (workload, batch_size), group in by_key.items():
            dataset, model, optimizer = workloads[workload]
            sdir = tmp.joinpath(*_safe_parts(workload), str(batch_size))
            sdir.mkdir(parents=True)
            _, _, sid, search_space, train_steps, _, _, _, _, _ = group[0]  # the most trials
            study = dict(extras.get((workload, batch_size, sid), {}))
            study.update({
                "batch_size": batch_size, "dataset": dataset, "model": model,
                "optimizer": optimizer,
                "early_stopping": any(bool(r[5]) or bool(r[9]) for r in group),
                "train_steps": 0 if train_steps is None else train_steps,
                "parameter_configs": json.loads(search_space) if search_space else {},
            })
            if len(group) > 1 or json.loads(group[0][6] or "{}").get("source") != "batch_science":
                study["batchlab_studies"] = [
                    {"study_id": r[2], "definition": json.loads(r[6]), "trial_ids": r[8] or []}
                    for r in group
                ]
                report.merged_batch_sizes += len(group) > 1
            _write_json(sdir / "study.json", study)
            report.studies += 1
            _export_study(con, sdir, workload, batch_size, report)
        con.close()
        os.replace(tmp, out)  # also replaces an empty directory
    except BaseException:
        con.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report


def _export_study(con, sdir: Path, workload: str, batch_size: int, report: ExportReport) -> None:
    trials = con.execute(
        "SELECT trial_id, parameters, status, steps FROM trials "
        "WHERE workload = ? AND batch_size = ? ORDER BY trial_id", [workload, batch_size]).fetchall()
    m = con.execute(
        "SELECT trial_id, step, metric, value FROM measurements "
        "WHERE workload = ? AND batch_size = ? ORDER BY trial_id, step", [workload, batch_size]
    ).to_arrow_table()
    metrics = sorted(set(m["metric"].to_pylist())) if m.num_rows else []
    report.bounded += sum(1 for name in m["metric"].to_pylist() if name.endswith(BOUND_SUFFIX)) if m.num_rows else 0
    tids = m["trial_id"].combine_chunks().to_numpy(zero_copy_only=False)
    steps = m["step"].combine_chunks().to_numpy(zero_copy_only=False)
    values = m["value"].combine_chunks().to_numpy(zero_copy_only=False)
    code = {name: j for j, name in enumerate(metrics)}
    cols = np.array([code[x] for x in m["metric"].to_pylist()], np.int64) if m.num_rows else np.zeros(0, np.int64)
    # one wide row per (trial, step): rows are sorted by (trial, step), so a new row starts
    # wherever either changes
    new_row = np.ones(len(tids), bool)
    if len(tids):
        new_row[1:] = (tids[1:] != tids[:-1]) | (steps[1:] != steps[:-1])
    row = np.cumsum(new_row) - 1
    n_rows = int(row[-1]) + 1 if len(row) else 0
    wide = np.zeros((n_rows, len(metrics)))
    present = np.zeros((n_rows, len(metrics)), bool)
    wide[row, cols] = values
    present[row, cols] = True
    row_tid = tids[new_row]
    row_step = steps[new_row]
    bounds = np.searchsorted(row_tid, [t[0] for t in trials], side="left")
    ends = np.searchsorted(row_tid, [t[0] for t in trials], side="right")
    for (tid, parameters, status, steps_trained), lo, hi in zip(trials, bounds, ends):
        tdir = sdir / str(tid)
        tdir.mkdir()
        meta = {"parameters": json.loads(parameters), "status": status, "steps": steps_trained,
                "trial_id": tid}
        if status == "STOPPED_AT_GOAL":  # the release's convention; see the module docstring
            meta.update(status="COMPLETE", batchlab_status="STOPPED_AT_GOAL")
            report.stopped_at_goal += 1
        elif status == "RACED":  # not a release status: stopped early for another reason than a goal
            meta.update(status="INCOMPLETE", batchlab_status="RACED")
            report.raced += 1
        _write_json(tdir / "metadata.json", meta)
        (tdir / "measurements.csv").write_bytes(_csv_bytes(metrics, row_step[lo:hi], wide[lo:hi], present[lo:hi]))
        report.trials += 1
    report.measurements += m.num_rows
