"""Import the batch_science release (Shallue et al.) into a store.

Release layout (docs/methods.md, "The batch_science release"): ``<workload>/<batch_size>/study.json`` and
``<workload>/<batch_size>/<trial_id>/{metadata.json, measurements.csv}``, where ``<workload>`` is
``dataset/model/optimizer`` or, for the ``mnist_subsets``, ``imagenet_subsets`` and
``solution_quality`` groups, one more leading level. A *study directory* is one that holds a
``study.json`` or whose integer-named subdirectories hold trial files; its name must be an integer
(the batch size) and the workload is its parent's path relative to the imported root (if the root
is itself inside the release, its own trailing directory names complete the three levels).

Each ``study.json`` becomes a study definition (:mod:`batchlab.store.studies`) with source
``batch_science``: its ``train_steps``, ``parameter_configs`` as the search space, evaluation
``{"rule": "release"}``, no stop rule (the release does not record one) and its ``early_stopping``
flag as the definition's ``early_stopping`` key. A trial's ``status`` must be one of the release's
(COMPLETE, INCOMPLETE, INFEASIBLE); a ``batchlab_status`` field, written by batchlab's export for
STOPPED_AT_GOAL and RACED trials, takes precedence, so export -> import keeps that status. A
``batchlab_studies`` list in ``study.json`` (written by batchlab's export: ``{study_id, definition,
trial_ids}`` per study definition of that batch size) gives the listed trials their own definitions
back; trials it does not list get the release definition.

Each trial becomes the trial key ``batch_science:<workload>/<batch_size>/<trial_id>``, so
re-importing adds nothing twice. ``measurements.csv`` has a ``step`` column and one column per
metric; every non-empty cell becomes one measurement row (``nan``/``inf`` are numbers; an empty
cell means "not evaluated"). A malformed file raises BatchlabError naming the file and the problem
(``skip_bad=True`` skips the study or trial and lists it instead). Nothing is visible until the one
commit at the end, so an error or a crash at any point leaves the store as it was.

Speed: the CSV bodies of a study that share a header are concatenated and parsed by one
``pyarrow.csv.read_csv`` call (per-file parsing costs ~100 us of fixed overhead per file, which
dominates at 194k trials); only when that fails is each file parsed alone, to name the bad one.
Studies are spread over worker processes (``jobs``), each writing its own Parquet files.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from batchlab.errors import BatchlabError, decode_utf8, not_utf8_reason, one_line, printable
from batchlab.finite import INT64_MAX
from batchlab.store.schema import RELEASE_STATUSES, SCHEMAS, STATUSES, validate_workload_name
from batchlab.store.studies import check_definition, make_study_definition, study_id
from batchlab.store.writer import study_row
from batchlab.store.store import Store

SOURCE = "batch_science"
KEY_PREFIX = "batch_science:"
FLUSH_ROWS = 4_000_000  # measurement rows per Parquet file written by the import


def trial_key(workload: str, batch_size: int, trial_id: int) -> str:
    """The store key of a release trial."""
    return f"{KEY_PREFIX}{workload}/{batch_size}/{trial_id}"


class MalformedFile(Exception):
    """A problem with one release file (path, problem); becomes a BatchlabError or a skip."""

    def __init__(self, path: Path | str, problem: str):
        super().__init__(f"{printable(path)}: {problem}")
        self.path = printable(path)
        self.problem = problem


@dataclass
class StudyDir:
    """One study found in the release tree."""

    path: Path
    workload: str
    batch_size: int | None  # None: the directory name is not an integer
    num_trials: int


@dataclass
class ImportReport:
    """What an import did: counts, what was skipped (path, problem), and the time it took."""

    studies: int = 0
    trials_added: int = 0
    trials_already_present: int = 0
    measurements_added: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {
            "studies": self.studies,
            "trials_added": self.trials_added,
            "trials_already_present": self.trials_already_present,
            "measurements_added": self.measurements_added,
            "skipped": [{"path": p, "problem": q} for p, q in self.skipped],
            "seconds": round(self.seconds, 3),
            "measurements_per_second": round(self.measurements_added / self.seconds)
            if self.seconds > 0 else None,
        }


# ------------------------------------------------------------------------- discovery
def _is_int_name(name: str) -> bool:
    """Whether a directory name is a decimal integer (ASCII digits, optional ``-``)."""
    digits = name[1:] if name.startswith("-") else name
    return digits.isascii() and digits.isdigit()


def _looks_like_study(path: Path, subdirs: list[os.DirEntry]) -> bool:
    if (path / "study.json").is_file():
        return True
    for entry in subdirs[:3]:
        if _is_int_name(entry.name) and (
            os.path.exists(os.path.join(entry.path, "metadata.json"))
            or os.path.exists(os.path.join(entry.path, "measurements.csv"))
        ):
            return True
    return False


def find_studies(root: Path) -> list[StudyDir]:
    """Every study directory under ``root``, sorted by (workload, batch size)."""
    root = Path(root)
    if not root.is_dir():
        raise BatchlabError(f"release path {root} is not a directory")
    found: list[StudyDir] = []
    anchor = list(root.resolve().parts)

    def walk(path: Path, rel: tuple[str, ...]) -> None:
        subdirs = sorted((e for e in os.scandir(path) if e.is_dir()), key=lambda e: e.name)
        if _looks_like_study(path, subdirs):
            parts = list(rel[:-1])
            if len(parts) < 3:  # the root is inside the release: borrow its trailing names
                need = 3 - len(parts)
                parts = anchor[len(anchor) - need:] + parts if rel else anchor[-4:-1]
            name = path.name
            found.append(StudyDir(path, "/".join(parts), int(name) if _is_int_name(name) else None,
                                  len(subdirs)))
            return
        for entry in subdirs:
            walk(Path(entry.path), rel + (entry.name,))

    walk(root, ())
    found.sort(key=lambda s: (s.workload, s.batch_size if s.batch_size is not None else -1, str(s.path)))
    return found


# ------------------------------------------------------------------------- one study
def _load_json(path: Path) -> dict:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        raise MalformedFile(path, "missing file") from None
    try:
        value = json.loads(decode_utf8(data, "the file"))
    except BatchlabError as exc:
        raise MalformedFile(path, str(exc)) from None
    except ValueError as exc:
        raise MalformedFile(path, f"bad JSON ({one_line(exc)})") from None
    if not isinstance(value, dict):
        raise MalformedFile(path, "bad JSON (expected an object)")
    return value


def _require(path: Path, data: dict, name: str, kind: type | tuple, what: str):
    if name not in data:
        raise MalformedFile(path, f"missing field {name!r}")
    value = data[name]
    if isinstance(value, bool) and kind is not bool:
        raise MalformedFile(path, f"field {name!r} must be {what}, got {value!r}")
    if not isinstance(value, kind):
        raise MalformedFile(path, f"field {name!r} must be {what}, got {value!r}")
    if kind is int and value > INT64_MAX:  # the store's columns are int64
        raise MalformedFile(path, f"field {name!r} must be <= {INT64_MAX}, got {value}")
    return value


STUDY_FIELDS = ("batch_size", "dataset", "model", "optimizer", "early_stopping", "train_steps",
                "parameter_configs")


def read_study_json(path: Path, batch_size: int) -> dict:
    """The validated study.json of a study directory (its ``batch_size`` must match the name)."""
    data = _load_json(path)
    bs = _require(path, data, "batch_size", int, "an integer")
    if bs < 1:
        raise MalformedFile(path, f"batch_size must be >= 1, got {bs}")
    if bs != batch_size:
        raise MalformedFile(path, f"batch_size {bs} does not match its directory {batch_size}")
    for name in ("dataset", "model", "optimizer"):
        _require(path, data, name, str, "a string")
    _require(path, data, "early_stopping", bool, "true or false")
    steps = _require(path, data, "train_steps", int, "an integer >= 0")
    if steps < 0:
        raise MalformedFile(path, f"field 'train_steps' must be an integer >= 0, got {steps}")
    _require(path, data, "parameter_configs", dict, "an object")
    return data


def read_metadata_json(path: Path, trial_id: int) -> dict:
    """The validated metadata.json of a trial (status, steps, trial_id, parameters)."""
    data = _load_json(path)
    status = _require(path, data, "status", str, "a string")
    if status not in RELEASE_STATUSES:
        raise MalformedFile(path, f"unknown status {status!r} (allowed: {', '.join(RELEASE_STATUSES)})")
    if "batchlab_status" in data:  # written by batchlab's export (a STOPPED_AT_GOAL or RACED trial)
        own = data["batchlab_status"]
        if own not in STATUSES:
            raise MalformedFile(path, f"unknown batchlab_status {own!r} (allowed: {', '.join(STATUSES)})")
        data = dict(data, status=own)
    steps = _require(path, data, "steps", int, "an integer >= 0")
    if steps < 0:
        raise MalformedFile(path, f"field 'steps' must be an integer >= 0, got {steps}")
    tid = _require(path, data, "trial_id", int, "an integer")
    if tid != trial_id:
        raise MalformedFile(path, f"trial_id {tid} does not match its directory {trial_id}")
    _require(path, data, "parameters", dict, "an object")
    return data


def _parse_header(path: Path, line: bytes, raw: bytes) -> tuple[str, ...]:
    """The column names of the header ``line`` of measurements.csv ``raw``."""
    try:
        names = next(csv.reader([line.decode("utf-8").rstrip("\r\n")]))
    except (UnicodeDecodeError, StopIteration, csv.Error):
        names = None
    if not names or names[0] != "step":
        encoding = not_utf8_reason(raw)
        if encoding is not None:
            raise MalformedFile(path, f"the file {encoding}")
        if not raw.strip():
            raise MalformedFile(path, "empty file (it needs the header step,<metric>,...)")
        if names is None:
            raise MalformedFile(path, "bad CSV header")
        raise MalformedFile(path, f"first column must be 'step', got {names[:1]}")
    metrics = names[1:]
    if any(not m for m in metrics) or len(set(metrics)) != len(metrics):
        raise MalformedFile(path, f"metric columns must be non-empty and distinct, got {metrics}")
    return tuple(names)


def _parse_bodies(names: tuple[str, ...], body: bytes) -> pa.Table:
    types = {n: pa.float64() for n in names}
    types["step"] = pa.int64()
    if not body:
        return pa.Table.from_batches([], pa.schema([(n, types[n]) for n in names]))
    return pacsv.read_csv(
        io.BytesIO(body),
        read_options=pacsv.ReadOptions(column_names=list(names), use_threads=False),
        parse_options=pacsv.ParseOptions(ignore_empty_lines=False),
        convert_options=pacsv.ConvertOptions(
            column_types=types, null_values=[""], strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        ),
    )


@dataclass
class _Trial:
    trial_id: int
    meta: dict
    csv_path: Path
    names: tuple[str, ...]
    body: bytes
    rows: int


def _read_trial(study: StudyDir, trial_id: int) -> _Trial:
    tdir = os.path.join(study.path, str(trial_id))  # plain strings: pathlib costs ~30% here
    meta = read_metadata_json(Path(tdir, "metadata.json"), trial_id)
    csv_path = os.path.join(tdir, "measurements.csv")
    try:
        with open(csv_path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise MalformedFile(csv_path, "missing file") from None
    raw = raw.removeprefix(codecs.BOM_UTF8)
    head, _, body = raw.partition(b"\n")
    names = _parse_header(csv_path, head, raw)
    body = body.rstrip(b"\r\n\t ")
    if body:
        body += b"\n"
    return _Trial(trial_id, meta, csv_path, names, body, body.count(b"\n"))


def _check_measurements(trial: _Trial, table: pa.Table) -> None:
    """Per-file checks: missing steps, negative steps, duplicate steps."""
    steps = table.column("step")
    if steps.null_count:
        raise MalformedFile(trial.csv_path, "a row has no step value")
    s = steps.combine_chunks().to_numpy(zero_copy_only=False)
    if (s < 0).any():
        raise MalformedFile(trial.csv_path, f"negative step {int(s[s < 0][0])}")
    ss = np.sort(s)
    dup = ss[1:][ss[1:] == ss[:-1]]
    if dup.size:
        raise MalformedFile(trial.csv_path, f"duplicate step {int(dup[0])}")


def _steps_are_valid(trial_ids: np.ndarray, steps: pa.ChunkedArray) -> bool:
    """No missing or negative step, and no step twice within a trial (ids are grouped)."""
    if steps.null_count:
        return False
    s = steps.combine_chunks().to_numpy(zero_copy_only=False)
    if s.size == 0:
        return True
    if (s < 0).any():
        return False
    order = np.lexsort((s, trial_ids))
    si, ii = s[order], trial_ids[order]
    return not ((si[1:] == si[:-1]) & (ii[1:] == ii[:-1])).any()


def _parse_one(trial: _Trial) -> pa.Table:
    try:
        table = _parse_bodies(trial.names, trial.body)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        encoding = not_utf8_reason(b"\n" + trial.body)  # the newline: line numbers count the header
        if encoding is not None:
            raise MalformedFile(trial.csv_path, f"the file {encoding}") from None
        raise MalformedFile(trial.csv_path, f"non-numeric or malformed value ({one_line(exc)})") from None
    if table.num_rows != trial.rows:
        raise MalformedFile(trial.csv_path, "malformed rows (blank line inside the file?)")
    _check_measurements(trial, table)
    return table


def _long_rows(workload: str, batch_size: int, names: tuple[str, ...], table: pa.Table,
               trial_ids: np.ndarray) -> list[pa.Table]:
    """Wide measurement rows (one per trial and step) -> long rows (one per non-empty value),
    as one table per metric, each sorted by (trial_id, step), so the import can write files in
    :data:`batchlab.store.schema.MEASUREMENT_ORDER`."""
    steps = table.column("step").combine_chunks().to_numpy(zero_copy_only=False)
    # (trial_id, step) order within the study: the tail of schema.MEASUREMENT_ORDER
    order = np.lexsort((steps, trial_ids))
    if not np.all(order[1:] > order[:-1]):
        table, trial_ids, steps = table.take(order), trial_ids[order], steps[order]
    workload_dict = pa.array([workload])
    out = []
    for metric in names[1:]:
        col = table.column(metric).combine_chunks()
        values = col.to_numpy(zero_copy_only=False)
        if col.null_count:
            keep = np.asarray(col.is_valid())
            ids, st, values = trial_ids[keep], steps[keep], values[keep]
        else:
            ids, st = trial_ids, steps
        n = len(values)
        if n == 0:
            continue
        zeros = np.zeros(n, np.int32)
        out.append(pa.table(
            {
                "workload": pa.DictionaryArray.from_arrays(zeros, workload_dict),
                "batch_size": pa.array(np.full(n, batch_size, np.int64)),
                "trial_id": pa.array(ids),
                "step": pa.array(st),
                "metric": pa.DictionaryArray.from_arrays(zeros, pa.array([metric])),
                "value": pa.array(values),
            },
            schema=SCHEMAS["measurements"],
        ))
    return out


@dataclass
class StudyResult:
    """The parsed rows of one study (trials present already are left out)."""

    study: dict | None
    trials: list[dict]
    more_studies: list[dict]  # rows of further definitions named by ``batchlab_studies``
    measurements: list[pa.Table]
    present: int
    skipped: list[tuple[str, str]]


def read_study(study: StudyDir, published_ids: set[int], skip_bad: bool) -> StudyResult:
    """Read and validate one study directory. Raises MalformedFile unless ``skip_bad``."""
    skipped: list[tuple[str, str]] = []

    def bad(err: MalformedFile) -> None:
        if not skip_bad:
            raise err
        skipped.append((err.path, err.problem))

    if study.batch_size is None or study.batch_size > INT64_MAX:
        why = "is not an integer" if study.batch_size is None else f"is larger than {INT64_MAX}"
        bad(MalformedFile(study.path, f"batch size directory name {why}"))
        return StudyResult(None, [], [], [], 0, skipped)
    try:
        validate_workload_name(study.workload)
    except BatchlabError as exc:
        bad(MalformedFile(study.path.parent, f"the directories name no store workload: {exc}"))
        return StudyResult(None, [], [], [], 0, skipped)
    try:
        study_json = read_study_json(study.path / "study.json", study.batch_size)
        definition = release_definition(study.workload, study.batch_size, study_json,
                                        study.path / "study.json")
        own = batchlab_definitions(study.workload, study.batch_size, study_json, study.path / "study.json")
    except MalformedFile as err:
        bad(err)
        return StudyResult(None, [], [], [], 0, skipped)

    trial_ids = []
    for entry in os.scandir(study.path):
        if entry.is_dir():
            if not (entry.name.isascii() and entry.name.isdigit()):
                bad(MalformedFile(entry.path, "trial directory name is not an integer"))
                continue
            if int(entry.name) > INT64_MAX:
                bad(MalformedFile(entry.path, f"trial directory name is larger than {INT64_MAX}"))
                continue
            trial_ids.append(int(entry.name))
    trial_ids.sort()
    present = 0
    by_header: dict[tuple[str, ...], list[_Trial]] = {}
    for tid in trial_ids:
        if tid in published_ids:
            present += 1
            continue
        try:
            trial = _read_trial(study, tid)
        except MalformedFile as err:
            bad(err)
            continue
        by_header.setdefault(trial.names, []).append(trial)

    good: list[_Trial] = []
    tables = []
    for names, group in by_header.items():
        try:
            table = _parse_bodies(names, b"".join(t.body for t in group))
            ok = table.num_rows == sum(t.rows for t in group)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            ok = False
        if ok:
            ids = np.repeat(np.array([t.trial_id for t in group], np.int64), [t.rows for t in group])
            ok = _steps_are_valid(ids, table.column("step"))
        if not ok:  # find the bad file(s): parse each alone
            kept, kept_tables = [], []
            for trial in group:
                try:
                    kept_tables.append(_parse_one(trial))
                    kept.append(trial)
                except MalformedFile as err:
                    bad(err)
            if not kept:
                continue
            group = kept
            table = pa.concat_tables(kept_tables)
            ids = np.repeat(np.array([t.trial_id for t in group], np.int64), [t.rows for t in group])
        good.extend(group)
        tables.extend(_long_rows(study.workload, study.batch_size, names, table, ids))

    sid = study_id(definition)
    own_ids = {tid: study_id(d) for tid, d in own.items()}
    trials = [
        {
            "workload": study.workload, "batch_size": study.batch_size, "trial_id": t.trial_id,
            "trial_key": trial_key(study.workload, study.batch_size, t.trial_id),
            "study_id": own_ids.get(t.trial_id, sid),
            "parameters": json.dumps(t.meta["parameters"], sort_keys=True),
            "status": t.meta["status"], "steps": t.meta["steps"], "seed": None,
            # a trial batchlab exported keeps its own study's source (it is not a release trial)
            "source": str(own[t.trial_id].get("source") or SOURCE) if t.trial_id in own else SOURCE,
        }
        for t in sorted(good, key=lambda t: t.trial_id)
    ]
    extra = {k: v for k, v in study_json.items() if k not in STUDY_FIELDS and k != "batchlab_studies"}
    row = study_row(definition, extra)
    row.update(dataset=study_json["dataset"], model=study_json["model"], optimizer=study_json["optimizer"])
    used = {t["study_id"] for t in trials}
    more, seen = [], {sid}
    for tid, d in own.items():
        if own_ids[tid] in used and own_ids[tid] not in seen:
            seen.add(own_ids[tid])
            more.append(study_row(d))
    if own and sid not in used and more:  # every trial has its own definition: no release row
        row = dict(more.pop(0), dataset=row["dataset"], model=row["model"], optimizer=row["optimizer"])
    return StudyResult(row, trials, more, tables, present, skipped)


def batchlab_definitions(workload: str, batch_size: int, study_json: dict, path: Path | str) -> dict[int, dict]:
    """{trial id: definition} from a ``batchlab_studies`` list in ``study.json`` (empty if none)."""
    listed = study_json.get("batchlab_studies")
    if listed is None:
        return {}
    if not isinstance(listed, list):
        raise MalformedFile(path, "field 'batchlab_studies' must be a list")
    out: dict[int, dict] = {}
    for entry in listed:
        if not isinstance(entry, dict) or not isinstance(entry.get("definition"), dict) \
                or not isinstance(entry.get("trial_ids"), list):
            raise MalformedFile(path, "each 'batchlab_studies' entry needs a 'definition' object and 'trial_ids'")
        try:
            d = check_definition(entry["definition"], workload, batch_size)
        except BatchlabError as exc:
            raise MalformedFile(path, f"batchlab_studies: {exc}") from None
        for tid in entry["trial_ids"]:
            if isinstance(tid, bool) or not isinstance(tid, int) or tid in out:
                raise MalformedFile(path, f"batchlab_studies: bad or repeated trial id {tid!r}")
            out[tid] = d
    return out


def release_definition(workload: str, batch_size: int, study_json: dict, path: Path | str = "study.json") -> dict:
    """The study definition of a release ``study.json`` (source ``batch_science``)."""
    try:
        return make_study_definition(
            workload=workload, batch_size=batch_size, train_steps=study_json["train_steps"],
            search_space=study_json["parameter_configs"], evaluation={"rule": "release"},
            source=SOURCE, early_stopping=bool(study_json["early_stopping"]),
        )
    except BatchlabError as exc:
        raise MalformedFile(path, str(exc)) from None


# ------------------------------------------------------------------------- the import
@dataclass
class _BatchOutput:
    files: list[str]
    trials: list[dict]
    studies: list[dict]
    present: int
    measurements: int
    skipped: list[tuple[str, str]]


def _import_batch(root: str, claim_id: str, studies: list[StudyDir], published: dict[tuple[str, int], set[int]],
                  skip_bad: bool) -> _BatchOutput:
    """Read a batch of studies and write their measurements as (uncommitted) Parquet files."""
    store = Store(Path(root), claim_id=claim_id)
    out = _BatchOutput([], [], [], 0, 0, [])
    pending: list[pa.Table] = []
    pending_rows = 0

    def flush() -> None:
        nonlocal pending, pending_rows
        if pending_rows:
            # files sorted by schema.MEASUREMENT_ORDER: a row group spans few (workload, metric)
            # pairs, so a query's filter on them skips the others' row groups (min/max statistics)
            ordered = sorted(pending, key=_segment_key)
            out.files.append(store.write_data_file("measurements", pa.concat_tables(ordered), presorted=True))
        pending, pending_rows = [], 0

    try:
        for study in studies:
            try:
                result = read_study(study, published.get((study.workload, study.batch_size), set()),
                                    skip_bad)
            except MalformedFile as err:
                raise BatchlabError(str(err)) from None
            out.skipped.extend(result.skipped)
            out.present += result.present
            if result.study is None:
                continue
            out.studies.append(result.study)
            out.studies.extend(dict(r, dataset=result.study["dataset"], model=result.study["model"],
                                    optimizer=result.study["optimizer"]) for r in result.more_studies)
            out.trials.extend(result.trials)
            for table in result.measurements:
                pending.append(table)
                pending_rows += table.num_rows
                out.measurements += table.num_rows
            if pending_rows >= FLUSH_ROWS:
                flush()
        flush()
    except BaseException:
        for rel in out.files:
            (store.root / rel).unlink(missing_ok=True)
        raise
    return out


def _segment_key(table: pa.Table) -> tuple[str, str, int]:
    """(workload, metric, batch_size) of a one-study, one-metric table from :func:`_long_rows`."""
    return (table.column("workload").chunk(0).dictionary[0].as_py(),
            table.column("metric").chunk(0).dictionary[0].as_py(),
            table.column("batch_size").chunk(0)[0].as_py())


def _batches(studies: list[StudyDir], trials_per_batch: int) -> list[list[StudyDir]]:
    batches, current, size = [], [], 0
    for study in studies:
        current.append(study)
        size += study.num_trials
        if size >= trials_per_batch:
            batches.append(current)
            current, size = [], 0
    if current:
        batches.append(current)
    return batches


def _published_release_ids(store: Store) -> dict[tuple[str, int], set[int]]:
    trials = store._committed("trials", store.state(), ["workload", "batch_size", "trial_id", "trial_key"])
    published: dict[tuple[str, int], set[int]] = {}
    for w, b, t, k in zip(*(trials[c].to_pylist() for c in trials.column_names)):
        if k == trial_key(w, b, t):
            published.setdefault((w, b), set()).add(t)
    return published


def _workload_tags(workload: str) -> str:
    parts = workload.split("/")
    tags = {"source": SOURCE}
    if len(parts) > 3:
        tags["group"] = parts[0]
    return json.dumps(tags, sort_keys=True)


def import_batch_science(
    store: Store,
    path: str | Path,
    *,
    skip_bad: bool = False,
    jobs: int = 1,
    trials_per_batch: int = 4000,
    log: Callable[[str], None] | None = None,
    studies: list[StudyDir] | None = None,
) -> ImportReport:
    """Import the release tree at ``path`` into ``store`` in one atomic commit.

    Raises BatchlabError (one line: the file and the problem) on the first malformed file unless
    ``skip_bad``; then the store is unchanged. ``jobs`` worker processes read studies in parallel.
    ``studies`` (from :func:`find_studies`) saves walking the tree again.
    """
    start = time.perf_counter()
    studies = find_studies(Path(path)) if studies is None else studies
    if not studies:
        raise BatchlabError(f"no studies (batch size directories with study.json) under {path}")
    published = _published_release_ids(store)
    batches = _batches(studies, trials_per_batch)
    outputs: list[_BatchOutput] = []
    try:
        if jobs <= 1 or len(batches) == 1:
            for batch in batches:
                outputs.append(_import_batch(str(store.root), store.claim_id, batch, published, skip_bad))
                if log:
                    log(f"read {sum(len(o.studies) for o in outputs)}/{len(studies)} studies")
        else:
            _run_parallel(store, batches, published, skip_bad, jobs, outputs, log, len(studies))
        report = ImportReport(seconds=0.0)
        for o in outputs:
            report.skipped.extend(o.skipped)
            report.trials_already_present += o.present
        files = [f for o in outputs for f in o.files]
        study_rows = [s for o in outputs for s in o.studies]
        report.studies = len({(s["workload"], s["batch_size"]) for s in study_rows})  # study directories
        trials = pa.Table.from_pylist([t for o in outputs for t in o.trials], schema=SCHEMAS["trials"])
        workloads = {}
        for s in study_rows:
            workloads.setdefault(s["workload"], {
                "workload": s["workload"], "dataset": s["dataset"], "model": s["model"],
                "optimizer": s["optimizer"], "tags": _workload_tags(s["workload"]),
            })
        studies_table = pa.Table.from_pylist(
            [{k: s[k] for k in SCHEMAS["studies"].names} for s in study_rows], schema=SCHEMAS["studies"]
        )
        workloads_table = pa.Table.from_pylist(list(workloads.values()), schema=SCHEMAS["workloads"])
        if trials.num_rows or files or study_rows:
            report.trials_added = store.publish(trials, files, workloads_table, studies_table,
                                                operation="import batch_science")
        report.measurements_added = (
            sum(o.measurements for o in outputs) if report.trials_added == trials.num_rows
            else _count_rows(store, files)
        )
    except BaseException:
        # the files this import wrote and no commit names (read once, unverified: a check of a damaged
        # store raising here would hide the error and leave the files behind)
        from batchlab.store.log import read_state

        live = read_state(store.root).all_files()
        for o in outputs:
            for rel in o.files:
                if rel not in live:
                    (store.root / rel).unlink(missing_ok=True)
        raise
    report.seconds = time.perf_counter() - start
    return report


def _count_rows(store: Store, files: list[str]) -> int:
    import pyarrow.parquet as pq

    live = store.state().all_files()
    return sum(pq.ParquetFile(store.root / f).metadata.num_rows for f in files if f in live)


def _run_parallel(store, batches, published, skip_bad, jobs, outputs, log, total) -> None:
    import multiprocessing

    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = [pool.submit(_import_batch, str(store.root), store.claim_id, b,
                               {k: v for k, v in published.items()
                                if any((s.workload, s.batch_size) == k for s in b)}, skip_bad)
                   for b in batches]
        error = None
        for future in futures:
            try:
                outputs.append(future.result())
            except BaseException as exc:  # keep collecting so every written file can be removed
                if error is None:
                    error = exc
                    for f in futures:
                        f.cancel()
            else:
                if log:
                    log(f"read {sum(len(o.studies) for o in outputs)}/{total} studies")
        if error is not None:
            raise error
