"""Fit any steps table: one S(B) fit and data-read regimes per group of a CSV or Parquet file.

A steps table has one row per batch size (per group): columns ``batch_size`` and ``steps`` (steps to
result, updates), optional ``reached`` (bool; default: ``steps`` is a finite number, so an empty cell or
``inf`` means not reached), ``budget`` (the step
budget an unreached batch size ran to: its censoring bound ``S > budget``) and ``steps_lower`` (the
evaluation step before the reaching one: the bracket ``(steps_lower, steps]``). Other columns are
ignored unless named as the group column. Without ``budget``, an unreached row's ``steps`` value
(when given) is taken as the steps it ran. Without ``steps_lower`` the steps are treated as exact.
Batch sizes are whole numbers from 1 to 2^53 (:data:`LARGEST`, the largest whole number a float holds
exactly), and every finite steps, budget and steps_lower value is at most 2^53 too. A CSV is UTF-8 text
(a byte-order mark allowed); a file in another encoding is one line saying so.

Definitions of every returned quantity: docs/methods.md ("Critical batch size", "Regimes read from
the data", "The S(B) fit").
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np

from batchlab.analysis.critical_batch_size import summarize_curve
from batchlab.analysis.definitions import REGISTRY
from batchlab.analysis.curve import StepsCurve
from batchlab.analysis.regimes import check_tolerance
from batchlab.errors import BatchlabError, decode_utf8, one_line

REQUIRED = ("batch_size", "steps")
OPTIONAL = ("reached", "budget", "steps_lower")
FORMATS = (".csv", ".parquet", ".pq")
#: The largest batch size and step count a steps table may hold (2^53: whole numbers up to it are exact floats).
LARGEST = 2**53
_TRUE = {"true", "1", "yes", "t", "y"}
_FALSE = {"false", "0", "no", "f", "n"}


def read_steps_table(path: str | Path):
    """Read a steps table (CSV or Parquet by extension) into a pandas DataFrame, checked.

    Raises:
        BatchlabError: unreadable file, unknown format, missing columns, non-numeric or non-positive
            batch sizes or steps, or a ``reached`` value that is not a boolean.
    """
    import pandas as pd

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise BatchlabError(f"steps table {str(path)!r}: unknown format {suffix or '(none)'!r}; allowed: {', '.join(FORMATS)}")
    if not path.is_file():
        raise BatchlabError(f"steps table {str(path)!r} does not exist or is not a file")
    try:
        if suffix == ".csv":
            text = decode_utf8(path.read_bytes(), f"steps table {str(path)!r}")
            frame = pd.read_csv(io.StringIO(text))
        else:
            frame = pd.read_parquet(path)
    except BatchlabError:
        raise
    except Exception as exc:  # noqa: BLE001 - any reader failure is a user error about the file
        message = one_line(exc) or type(exc).__name__
        raise BatchlabError(f"cannot read steps table {str(path)!r}: {message}") from None
    frame.columns = [str(c).strip() for c in frame.columns]
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise BatchlabError(
            f"steps table {str(path)!r} lacks column(s) {missing}; required: {list(REQUIRED)}, optional: "
            f"{list(OPTIONAL)}; found: {list(frame.columns)}"
        )
    if frame.empty:
        raise BatchlabError(f"steps table {str(path)!r} has no rows")
    frame = frame.copy()
    frame.attrs["columns"] = list(frame.columns)
    frame["batch_size"] = _numeric(frame["batch_size"], "batch_size", path)
    sizes = frame["batch_size"]
    bad = sizes[~(np.isfinite(sizes) & (sizes > 0) & (sizes <= LARGEST) & (sizes == np.round(sizes)))]
    if len(bad):
        raise BatchlabError(f"steps table {str(path)!r}: batch sizes must be whole numbers > 0 and <= 2^53, "
                            f"got {bad.tolist()[:5]}")
    frame["steps"] = _numeric(frame["steps"], "steps", path)
    if "reached" in frame.columns:
        frame["reached"] = [_boolean(v, path) for v in frame["reached"]]
    else:
        frame["reached"] = np.isfinite(frame["steps"].to_numpy())
    reached = frame["reached"].to_numpy(dtype=bool)
    steps = frame["steps"].to_numpy()
    bad = steps[reached & ~(np.isfinite(steps) & (steps > 0))]
    if bad.size:
        raise BatchlabError(f"steps table {str(path)!r}: steps must be > 0 where the goal was reached, got {bad.tolist()[:5]}")
    for column in ("steps", "budget", "steps_lower"):
        if column in frame.columns:
            if column != "steps":
                frame[column] = _numeric(frame[column], column, path)
            values = frame[column].to_numpy()
            finite = values[np.isfinite(values)]
            wrong = finite[(finite < 0) | (finite > LARGEST)]
            if wrong.size:
                raise BatchlabError(f"steps table {str(path)!r}: {column} must be >= 0 and <= 2^53 (or empty), "
                                    f"got {wrong.tolist()[:5]}")
    if "steps_lower" in frame.columns:
        lower = frame["steps_lower"].to_numpy()
        wrong = reached & np.isfinite(lower) & (lower >= steps)
        if wrong.any():
            raise BatchlabError(
                f"steps table {str(path)!r}: steps_lower must be < steps, got {lower[wrong].tolist()[:5]} "
                f"for steps {steps[wrong].tolist()[:5]}"
            )
    return frame


def steps_table_curves(frame, group_by: str | None = None, label: str = "") -> list[tuple[object, StepsCurve]]:
    """One :class:`StepsCurve` per value of ``group_by`` (or one for the whole table), in sorted group order."""
    if group_by is not None and group_by not in frame.attrs.get("columns", list(frame.columns)):
        columns = frame.attrs.get("columns", list(frame.columns))
        raise BatchlabError(f"unknown group column {group_by!r}; allowed: {columns}")
    if group_by is None:
        groups = [(None, frame)]
    else:
        if frame[group_by].isna().any():
            raise BatchlabError(f"group column {group_by!r} has empty values; every row needs a group")
        keys = sorted(frame[group_by].unique().tolist(), key=lambda v: (str(type(v)), v))
        groups = [(_plain(k), frame[frame[group_by] == k]) for k in keys]
    curves = []
    for key, rows in groups:
        name = label if key is None else f"{group_by}={key}"
        sizes = rows["batch_size"].astype(np.int64)
        dup = sorted(set(sizes[sizes.duplicated()].tolist()))
        if dup:
            if key is None:
                raise BatchlabError(f"duplicate batch size(s) {dup}: each batch size needs one row; group the rows by a "
                                    f"column (one of {frame.attrs.get('columns', list(frame.columns))}) to fit one curve per value")
            raise BatchlabError(f"duplicate batch size(s) {dup} in group {group_by}={key!r}; each batch size needs one row per group")
        points, lower, censored = [], [], []
        has_lower = "steps_lower" in rows.columns
        for _, row in rows.iterrows():
            b = int(row["batch_size"])
            if row["reached"]:
                points.append((b, int(round(float(row["steps"])))))
                low = row["steps_lower"] if has_lower else None
                lower.append(None if low is None or not math.isfinite(float(low)) else int(round(float(low))))
                censored.append(None)
            else:
                points.append((b, None))
                lower.append(None)
                bound = row["budget"] if "budget" in rows.columns else row["steps"]
                censored.append(None if bound is None or not math.isfinite(float(bound)) else int(round(float(bound))))
        use_lower = has_lower and any(v is not None for v in lower)
        curves.append((key, StepsCurve.from_points(points, label=name, steps_lower=lower if use_lower else None,
                                                   censored_at=censored if any(c is not None for c in censored) else None)))
    return curves


def fit_steps_table(path: str | Path, group_by: str | None = None, tolerance: float = 0.1,
                    b0: float | None = None) -> list[dict]:
    """Fit every group of the steps table at ``path``; one JSON-ready dict per group.

    Keys: ``group`` (``None`` without ``group_by``), ``s_min`` (fit), ``s_min_measured``, ``e_min``,
    one key per named critical batch size of :data:`batchlab.analysis.definitions.REGISTRY`
    (``mccandlish_b_crit``, ``overhead_20pct``, ...; the data-read ones are ``None`` with a reason in
    ``reasons``), ``residual`` (rms log residual), ``chi2``, ``dof``, ``p_value``,
    ``b0``, ``batch_size_range``, ``points_used``, ``censored_batch_sizes``, ``extrapolated``,
    ``warnings``, ``reasons``, ``tolerance``; ``error`` (``None``, or why the group could not be fitted,
    e.g. fewer than two reached batch sizes, with the other values ``None``).
    """
    check_tolerance(tolerance)
    frame = read_steps_table(path)
    out = []
    for key, curve in steps_table_curves(frame, group_by, label=Path(path).stem):
        entry = {"group": key, "group_by": group_by, "tolerance": tolerance, "error": None}
        try:
            summary = summarize_curve(curve, tolerance=tolerance, b0=b0)
        except BatchlabError as exc:
            entry["error"] = str(exc)
            for name in ("s_min", "s_min_measured", "e_min", *(d.name for d in REGISTRY), "residual"):
                entry[name] = None
            out.append(entry)
            continue
        named = summary["critical_batch_sizes"]
        fit = summary["fit"]
        entry.update(
            {
                "s_min": fit["s_min"],
                "s_min_measured": summary["s_min"]["measured"]["value"],
                "e_min": fit["e_min"],
                **{name: value["value"] for name, value in named.items()},
                "residual": fit["rms_log_residual"],
                "max_abs_log_residual": fit["max_abs_log_residual"],
                "chi2": fit["chi2"],
                "dof": fit["dof"],
                "p_value": fit["p_value"],
                "b0": summary["b0"],
                "batch_size_range": summary["batch_size_range"],
                "points_used": summary["points_used"],
                "censored_batch_sizes": summary["censored_batch_sizes"],
                "extrapolated": summary["extrapolated"],
                "warnings": summary["warnings"],
                "reasons": {d.name: named[d.name].get("reason") for d in REGISTRY if d.source == "data"},
                "regimes": [{"batch_size": r["batch_size"], "steps": r["steps"], "regime": r["regime"]}
                            for r in summary["regimes"]],
            }
        )
        out.append(entry)
    return out


def _numeric(series, column: str, path: Path):
    import pandas as pd

    values = pd.to_numeric(series, errors="coerce")
    bad = series[values.isna() & series.notna() & (series.astype(str).str.strip() != "")]
    if len(bad):
        raise BatchlabError(f"steps table {str(path)!r}: column {column!r} must be numeric, got {bad.astype(str).tolist()[:5]}")
    return values.astype(float)


def _boolean(value, path: Path) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    if isinstance(value, float) and value in (0.0, 1.0):
        return bool(value)
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise BatchlabError(f"steps table {str(path)!r}: column 'reached' must be true or false, got {value!r}")


def _plain(value):
    """numpy scalars to Python (JSON-ready group values)."""
    return value.item() if hasattr(value, "item") else value
