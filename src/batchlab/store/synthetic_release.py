"""Write batch_science release trees: explicit small ones (for tests) and large synthetic ones.

:func:`write_study` writes one study with the trials and measurements given, in the exact release
format (docs/methods.md, "The batch_science release"). :func:`generate_release` writes a whole synthetic release shaped by a
table of studies (``shallue_studies.csv``: ``workload_dir, batch_size, complete_trials,
incomplete_trials, infeasible_trials``) with decreasing error curves whose steps to result follow
S(B) = S_min (1 + B_crit / B), evaluated at irregular steps; it is what ``benchmarks/store_scale.py``
imports. Curves are synthetic: they have the shape of the release, not its numbers.
"""

from __future__ import annotations

import csv
import io
import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

EXAMPLE_PARAMETER_CONFIGS = {
    "learning_rate": {"type": "DOUBLE", "min_value": 1e-4, "max_value": 10.0, "scale": "LOG_SCALE"},
    "momentum": {"type": "DOUBLE", "min_value": 0.9, "max_value": 0.9999, "scale": "REVERSE_LOG_SCALE"},
}


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as JSON (creating parent directories)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))


def write_study(
    root: str | Path,
    workload: str,
    batch_size: int,
    trials: Sequence[Mapping[str, Any]],
    *,
    train_steps: int = 1000,
    early_stopping: bool = False,
    parameter_configs: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``<root>/<workload>/<batch_size>/`` with ``study.json`` and one directory per trial.

    Each trial is a mapping with ``trial_id``, ``status``, ``steps``, ``parameters`` and
    ``measurements``: a list of row dicts ``{"step": t, "<split>/<metric>": value, ...}``
    (columns are the union of the rows' keys, ``step`` first; a missing key is an empty cell).
    Returns the study directory.
    """
    parts = workload.split("/")
    sdir = Path(root).joinpath(*parts, str(batch_size))
    write_json(sdir / "study.json", {
        "batch_size": batch_size, "dataset": "/".join(parts[:-2]), "model": parts[-2],
        "optimizer": parts[-1], "early_stopping": early_stopping, "train_steps": train_steps,
        "parameter_configs": dict(parameter_configs or EXAMPLE_PARAMETER_CONFIGS),
    })
    for trial in trials:
        tdir = sdir / str(trial["trial_id"])
        write_json(tdir / "metadata.json", {
            "parameters": dict(trial["parameters"]), "status": trial["status"],
            "steps": trial["steps"], "trial_id": trial["trial_id"],
            "_internal_study_name": "synthetic", "_internal_trial_id": trial["trial_id"],
        })
        rows = list(trial["measurements"])
        names = ["step"] + sorted({k for r in rows for k in r if k != "step"})
        lines = [",".join(names)]
        for r in rows:
            lines.append(",".join("" if r.get(n) is None else repr(r[n]) for n in names))
        (tdir / "measurements.csv").write_text("\n".join(lines) + "\n")
    return sdir


# ------------------------------------------------------------------------- synthetic release
@dataclass(frozen=True)
class StudyShape:
    """One row of the studies table."""

    workload: str
    batch_size: int
    complete: int
    incomplete: int
    infeasible: int


def read_study_shapes(path: str | Path) -> list[StudyShape]:
    """Rows of ``shallue_studies.csv``."""
    with open(path, newline="") as handle:
        return [
            StudyShape(r["workload_dir"], int(r["batch_size"]), int(r["complete_trials"]),
                       int(r["incomplete_trials"]), int(r["infeasible_trials"]))
            for r in csv.DictReader(handle)
        ]


def workload_metrics(workload: str) -> tuple[list[str], str, float, bool]:
    """(metric columns, goal metric, goal, maximize) used for a synthetic workload."""
    if workload.startswith(("lm1b/", "common_crawl/")):
        return (["train/cross_entropy_error", "val/cross_entropy_error"],
                "val/cross_entropy_error", 3.9, False)
    base = ["train/classification_error", "train/cross_entropy_error",
            "val/classification_error", "val/cross_entropy_error"]
    if workload.startswith("open_images"):
        return base + ["val/average_precision"], "val/average_precision", 0.31, True
    goal = 0.03 if "/fc_" in workload else 0.01 if workload.startswith("mnist") else 0.1
    return base, "val/classification_error", goal, False


def _seed(*parts: Any) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


def _evaluation_steps(rng: np.random.Generator, rows: int, last: int) -> np.ndarray:
    """``rows`` distinct irregular steps in [1, last] ending at ``last``: gaps grow geometrically
    (dense early, sparse late) with multiplicative jitter. Requires rows <= last."""
    gaps = np.geomspace(1.0, 50.0, rows) * rng.uniform(0.5, 1.5, rows)
    spare = last - rows  # every gap is at least 1; the spare steps are spread by the weights
    gaps = 1 + np.floor(gaps / gaps.sum() * spare).astype(np.int64)
    steps = np.cumsum(gaps)
    steps[-1] = last
    return steps


def _study_tables(shape: StudyShape, values_per_trial: float, scale: float):
    """(trial metadata list, wide table of all rows, rows per trial) for one synthetic study."""
    rng = np.random.default_rng(_seed(shape.workload, shape.batch_size))
    metrics, goal_metric, goal, maximize = workload_metrics(shape.workload)
    counts = [max(0, round(n * scale)) for n in (shape.complete, shape.incomplete, shape.infeasible)]
    if shape.complete and counts[0] == 0:
        counts[0] = 1
    statuses = np.array(["COMPLETE"] * counts[0] + ["INCOMPLETE"] * counts[1] + ["INFEASIBLE"] * counts[2])
    rng.shuffle(statuses)
    n = len(statuses)
    b_crit = 2.0 ** (8 + _seed(shape.workload) % 6)
    s_min = 200.0 * (1 + _seed(shape.workload, "s") % 5)
    s_goal = s_min * (1 + b_crit / shape.batch_size)  # steps the best trial needs
    train_steps = int(4 * s_goal) + 10
    # rows per trial: an INFEASIBLE trial (diverged early) gets 1/8 of the others' evaluations;
    # the mean is set so that the study holds values_per_trial values per trial on average
    weight = np.where(statuses == "INFEASIBLE", 1 / 8, 1.0)
    rows_mean = values_per_trial / len(metrics) * n / max(weight.sum(), 1e-9)
    lr = 10 ** rng.uniform(-4, 1, n)
    quality = np.exp(-0.5 * (np.log10(lr) + 1.5) ** 2 / 0.6 ** 2)  # 1 at the best learning rate
    trials, tables, rows_per_trial = [], [], []
    for i in range(n):
        status = statuses[i]
        rows = max(2, int(round(rng.normal(1.0, 0.15) * rows_mean * weight[i])))
        steps_trained = train_steps if status == "COMPLETE" else int(train_steps * rng.uniform(0.05, 0.9))
        rows = min(rows, steps_trained)
        steps = _evaluation_steps(rng, rows, steps_trained)
        tau = s_goal / max(quality[i], 1e-3) / 3.0
        progress = 1 - np.exp(-steps / tau)
        floor = goal * (0.8 if quality[i] > 0.5 else 1.05 + rng.uniform(0, 0.5))
        noise = rng.normal(0, 0.02, (len(steps), len(metrics)))
        cols = {"step": steps}
        for j, m in enumerate(metrics):
            if m == "val/average_precision":
                v = (goal / 0.8 * (1 - 0.2 * (1 - quality[i]))) * progress * (1 + 0.1 * noise[:, j])
            elif "cross_entropy" in m and goal > 1:
                v = 10.0 - (10.0 - floor) * progress + 0.1 * noise[:, j]
            elif "cross_entropy" in m:
                v = 2.3 * (1 - progress) + 3 * floor * progress * (1 + noise[:, j])
            else:
                v = 0.9 * (1 - progress) + floor * progress * (1 + noise[:, j])
            if status == "INFEASIBLE":
                v[len(v) // 2:] = np.nan
            cols[m] = v
        tables.append(pa.table(cols))
        rows_per_trial.append(len(steps))
        trials.append({"trial_id": i + 1, "status": str(status), "steps": int(steps_trained),
                       "parameters": {"learning_rate": float(lr[i]),
                                      "momentum": float(1 - 10 ** rng.uniform(-4, -1))}})
    return trials, tables, rows_per_trial, train_steps, metrics


def generate_release(
    root: str | Path,
    shapes: Sequence[StudyShape],
    *,
    scale: float = 1.0,
    total_measurements: int = 71_638_836,
) -> dict:
    """Write a synthetic release under ``root``: trial counts scaled by ``scale`` (at least one
    COMPLETE trial per study), about ``total_measurements * scale`` values in all. Returns counts."""
    root = Path(root)
    all_trials = sum(s.complete + s.incomplete + s.infeasible for s in shapes)
    values_per_trial = total_measurements / all_trials
    written = {"studies": 0, "trials": 0, "measurements": 0}
    for shape in shapes:
        trials, tables, rows, train_steps, metrics = _study_tables(shape, values_per_trial, scale)
        parts = shape.workload.split("/")
        sdir = root.joinpath(*parts, str(shape.batch_size))
        write_json(sdir / "study.json", {
            "batch_size": shape.batch_size, "dataset": "/".join(parts[:-2]), "model": parts[-2],
            "optimizer": parts[-1], "early_stopping": False, "train_steps": train_steps,
            "parameter_configs": EXAMPLE_PARAMETER_CONFIGS,
        })
        header = (",".join(["step", *metrics]) + "\n").encode()
        if tables:
            sink = io.BytesIO()
            pacsv.write_csv(pa.concat_tables(tables), sink, pacsv.WriteOptions(include_header=False))
            body = sink.getvalue()
            ends = np.flatnonzero(np.frombuffer(body, np.uint8) == 10) + 1
            cuts = np.concatenate([[0], ends[np.cumsum(rows) - 1]])
        for k, trial in enumerate(trials):
            tdir = sdir / str(trial["trial_id"])
            tdir.mkdir(parents=True)
            (tdir / "metadata.json").write_text(json.dumps(trial))
            (tdir / "measurements.csv").write_bytes(header + body[cuts[k]:cuts[k + 1]])
            written["measurements"] += rows[k] * len(metrics)  # nan cells are measurements too
        written["studies"] += 1
        written["trials"] += len(trials)
    return written
