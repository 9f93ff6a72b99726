"""Fit any steps table: one S(B) fit and data-read regimes per group of a CSV or Parquet file.

A steps table has one row per batch size (per group): columns ``batch_size`` and ``steps`` (steps to
result, updates), optional ``reached`` (bool; default: ``steps`` is a finite number, so an empty cell or
``inf`` means not reached), ``budget`` (the step
budget an unreached batch size ran to: its censoring bound ``S > budget``) and ``steps_lower`` (the
evaluation step before the reaching one: the bracket ``(steps_lower, steps]``), and the pass-through
columns ``n_trials`` (trials run at that batch size) and ``second_steps`` (the second-best trial's
steps, empty or ``inf`` where it did not reach the goal), copied into each batch size's row of the
result and not used by the fit. Other columns are ignored unless named as the group column. An
unreached row's censoring bound is its ``budget``, else its ``steps`` value (the steps it ran); an
unreached row with neither is an error (never dropped). Without ``steps_lower`` the steps are treated
as exact. Batch sizes, steps, budgets, steps_lower, n_trials and second_steps are whole numbers (steps
count updates; a fractional value is an error naming its rows, rows counted from 1 below the header),
at most 2^53 (:data:`LARGEST`, the largest whole number a float holds exactly). A CSV is UTF-8 text
(a byte-order mark allowed); a file in another encoding is one line saying so.

Definitions of every returned quantity: docs/methods.md ("Critical batch size", "Regimes read from
the data", "The S(B) fit", "Intervals", "Steps tables").
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np

from batchlab.analysis.bootstrap import FIT_METHOD, FIT_TARGET
from batchlab.analysis.critical_batch_size import observation_arrays, profile_intervals, summarize_curve
from batchlab.analysis.definitions import REGISTRY
from batchlab.analysis.curve import StepsCurve
from batchlab.analysis.regimes import check_tolerance
from batchlab.errors import BatchlabError, decode_utf8, one_line

REQUIRED = ("batch_size", "steps")
OPTIONAL = ("reached", "budget", "steps_lower", "n_trials", "second_steps")
#: Columns copied into each batch size's result row, unused by the fit.
PASS_THROUGH = ("n_trials", "second_steps")
#: The fit parameters and fit-derived named batch sizes given intervals (in this order).
INTERVAL_NAMES = ("s_min", "e_min", *(d.name for d in REGISTRY if d.source == "fit"))
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
    for column in ("steps", "budget", "steps_lower", *PASS_THROUGH):
        if column in frame.columns:
            if column != "steps":
                frame[column] = _numeric(frame[column], column, path)
            values = frame[column].to_numpy()
            finite = values[np.isfinite(values)]
            wrong = finite[(finite < 0) | (finite > LARGEST)]
            if wrong.size:
                raise BatchlabError(f"steps table {str(path)!r}: {column} must be >= 0 and <= 2^53 (or empty), "
                                    f"got {wrong.tolist()[:5]}")
            fractional = np.isfinite(values) & (values != np.round(values))
            if fractional.any():
                raise BatchlabError(f"steps table {str(path)!r}: {column} must be whole numbers (steps count updates), "
                                    f"got {values[fractional].tolist()[:5]} in row(s) {row_numbers(fractional)}")
    if "steps_lower" in frame.columns:
        lower = frame["steps_lower"].to_numpy()
        wrong = reached & np.isfinite(lower) & (lower >= steps)
        if wrong.any():
            raise BatchlabError(
                f"steps table {str(path)!r}: steps_lower must be < steps, got {lower[wrong].tolist()[:5]} "
                f"for steps {steps[wrong].tolist()[:5]}"
            )
    budget = frame["budget"].to_numpy() if "budget" in frame.columns else np.full(len(frame), np.nan)
    unbounded = ~reached & ~np.isfinite(budget) & ~np.isfinite(steps)
    if unbounded.any():
        sizes = frame["batch_size"].to_numpy()[unbounded].astype(np.int64).tolist()
        raise BatchlabError(
            f"steps table {str(path)!r}: unreached row(s) {row_numbers(unbounded)} (batch size(s) {sizes[:5]}) have no "
            "budget: add a 'budget' column with the steps each ran to (S > budget), or give those steps in 'steps'")
    if "n_trials" in frame.columns:
        trials = frame["n_trials"].to_numpy()
        wrong = trials < 1  # NaN compares False: an empty cell is allowed
        if wrong.any():
            raise BatchlabError(f"steps table {str(path)!r}: n_trials must be >= 1 (or empty), got "
                                f"{trials[wrong].tolist()[:5]} in row(s) {row_numbers(wrong)}")
    if "second_steps" in frame.columns:
        second = frame["second_steps"].to_numpy()
        wrong = np.isfinite(second) & (~reached | (second < np.where(reached, steps, 0.0)))
        if wrong.any():
            raise BatchlabError(f"steps table {str(path)!r}: second_steps must be >= steps where the goal was reached "
                                f"(and empty where it was not), got {second[wrong].tolist()[:5]} in row(s) {row_numbers(wrong)}")
    return frame


def steps_table_curves(frame, group_by: str | None = None, label: str = "") -> list[tuple[object, StepsCurve]]:
    """One :class:`StepsCurve` per value of ``group_by`` (or one for the whole table), in sorted group order."""
    curves = []
    for key, rows in table_groups(frame, group_by):
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
        has_budget = "budget" in rows.columns
        for _, row in rows.iterrows():
            b = int(row["batch_size"])
            if row["reached"]:
                points.append((b, int(row["steps"])))
                low = float(row["steps_lower"]) if has_lower else math.nan
                lower.append(int(low) if math.isfinite(low) else None)
                censored.append(None)
            else:  # read_steps_table checked that one of budget and steps is finite
                points.append((b, None))
                lower.append(None)
                bound = float(row["budget"]) if has_budget else math.nan
                censored.append(int(bound) if math.isfinite(bound) else int(row["steps"]))
        use_lower = has_lower and any(v is not None for v in lower)
        curves.append((key, StepsCurve.from_points(points, label=name, steps_lower=lower if use_lower else None,
                                                   censored_at=censored if any(c is not None for c in censored) else None)))
    return curves


def table_groups(frame, group_by: str | None) -> list[tuple[object, object]]:
    """``[(group value, its rows), ...]`` in sorted group order (``[(None, frame)]`` without ``group_by``);
    values are plain Python (JSON-ready). BatchlabError for an unknown or partly empty group column."""
    columns = frame.attrs.get("columns", list(frame.columns))
    if group_by is None:
        return [(None, frame)]
    if group_by not in columns:
        raise BatchlabError(f"unknown group column {group_by!r}; allowed: {columns}")
    if frame[group_by].isna().any():
        raise BatchlabError(f"group column {group_by!r} has empty values; every row needs a group")
    keys = sorted(frame[group_by].unique().tolist(), key=lambda v: (str(type(v)), v))
    return [(_plain(k), frame[frame[group_by] == k]) for k in keys]


def fit_steps_table(path: str | Path, group_by: str | None = None, tolerance: float = 0.1,
                    b0: float | None = None, level: float = 0.9) -> list[dict]:
    """Fit every group of the steps table at ``path``; one JSON-ready dict per group.

    Keys: ``group`` (``None`` without ``group_by``), ``s_min`` (fit), ``s_min_measured``, ``e_min``,
    one key per named critical batch size of :data:`batchlab.analysis.definitions.REGISTRY`
    (``mccandlish_b_crit``, ``overhead_20pct``, ...; the data-read ones are ``None`` with a reason in
    ``reasons``), ``intervals`` (``{name: {"low", "high"}}`` for ``s_min``, ``e_min`` and every
    fit-derived named batch size, :data:`INTERVAL_NAMES`; ``None`` on an unbounded side) with
    ``interval`` (``level``, ``target``, ``method``, ``scatter``, ``note``: :func:`curve_intervals`),
    ``residual`` (rms log residual), ``chi2``, ``dof``, ``p_value``,
    ``b0``, ``batch_size_range``, ``points_used``, ``censored_batch_sizes``, ``extrapolated``,
    ``warnings``, ``reasons``, ``tolerance``, ``regimes`` (per batch size: ``batch_size``, ``steps``,
    ``regime`` and the table's pass-through columns, :data:`PASS_THROUGH`); ``error`` (``None``, or
    why the group could not be fitted, e.g. fewer than two reached batch sizes, with the other values
    ``None``).
    """
    check_tolerance(tolerance)
    return fit_steps_frame(read_steps_table(path), group_by, tolerance, b0, level, label=Path(path).stem)


def fit_steps_frame(frame, group_by: str | None = None, tolerance: float = 0.1, b0: float | None = None,
                    level: float = 0.9, label: str = "") -> list[dict]:
    """:func:`fit_steps_table` of a frame :func:`read_steps_table` returned (``label`` names the curves)."""
    check_tolerance(tolerance)
    if not 0 < level < 1:
        raise BatchlabError(f"level must be in (0, 1), got {level}")
    passed = [c for c in PASS_THROUGH if c in frame.columns]
    out = []
    rows_of = dict(table_groups(frame, group_by))
    for key, curve in steps_table_curves(frame, group_by, label=label):
        entry = {"group": key, "group_by": group_by, "tolerance": tolerance, "error": None}
        try:
            summary = summarize_curve(curve, tolerance=tolerance, b0=b0)
        except BatchlabError as exc:
            entry["error"] = str(exc)
            for name in ("s_min", "s_min_measured", "e_min", *(d.name for d in REGISTRY), "residual", "intervals"):
                entry[name] = None
            out.append(entry)
            continue
        named = summary["critical_batch_sizes"]
        fit = summary["fit"]
        intervals, interval = curve_intervals(curve, tolerance, fit["b0"], level, fit["sigma_floor"])
        extra = {int(r["batch_size"]): {c: _whole_or_none(r[c]) for c in passed} for _, r in rows_of[key].iterrows()}
        entry.update(
            {
                "s_min": fit["s_min"],
                "s_min_measured": summary["s_min"]["measured"]["value"],
                "e_min": fit["e_min"],
                **{name: value["value"] for name, value in named.items()},
                "intervals": intervals,
                "interval": interval,
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
                "regimes": [{"batch_size": r["batch_size"], "steps": r["steps"], "regime": r["regime"],
                             **extra[r["batch_size"]]} for r in summary["regimes"]],
            }
        )
        out.append(entry)
    return out


def curve_intervals(curve: StepsCurve, tolerance: float, b0: float, level: float = 0.9,
                    sigma_floor: float | None = None) -> tuple[dict, dict]:
    """Profile-likelihood intervals of one curve's fit, as ``analyze critical-batch-size`` gives them.

    :func:`batchlab.analysis.critical_batch_size.profile_intervals` over
    :func:`~batchlab.analysis.critical_batch_size.observation_arrays` of ``curve``: ``S_min`` and
    ``E_min`` over the accepted B_crit set, each fit-derived named batch size its definition applied to
    the B_crit bounds (``b0``: the fit's B0). Returns ``({name: {"low", "high"}}`` for
    :data:`INTERVAL_NAMES` (``None`` on an unbounded side, both ``None`` when the fit has no residual
    degrees of freedom), ``{"level", "target", "method", "scatter", "note"})`` (docs/methods.md,
    "Intervals").
    """
    b, y, v, kind = observation_arrays(curve)
    floor = {} if sigma_floor is None else {"sigma_floor": sigma_floor}
    prof = {k: float(np.asarray(value).reshape(-1)[0])
            for k, value in profile_intervals(b, y[None], v[None], kind[None], level=level, **floor).items()}
    b_low, b_high = prof["b_crit_low"], prof["b_crit_high"]
    none = math.isnan(b_low)
    bounds = {"s_min": (prof["s_min_low"], prof["s_min_high"]), "e_min": (prof["e_min_low"], prof["e_min_high"])}
    for d in REGISTRY:
        if d.source == "fit" and not none:
            bounds[d.name] = (d.from_b_crit(b_low, tolerance, b0), d.from_b_crit(b_high, tolerance, b0))
    intervals = {name: {"low": None, "high": None} if none else
                 {"low": _finite_or_none(bounds[name][0]), "high": _finite_or_none(bounds[name][1])}
                 for name in INTERVAL_NAMES}
    if none:
        note = "no interval: the fit has no residual degrees of freedom (two points)"
    elif not math.isfinite(b_high):
        note = "unbounded above: no plateau is required by the data"
    else:
        note = None
    return intervals, {"level": level, "target": FIT_TARGET, "method": FIT_METHOD,
                       "scatter": _finite_or_none(prof.get("scatter", math.nan)), "note": note}


def _finite_or_none(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _whole_or_none(value) -> int | None:
    """A pass-through cell: a whole number, or ``None`` (empty or ``inf``)."""
    value = float(value)
    return int(value) if math.isfinite(value) else None


def row_numbers(mask) -> str:
    """The 1-based data rows (counted below the header) where ``mask`` holds: the first five, then how many more."""
    where = (np.flatnonzero(np.asarray(mask)) + 1).tolist()
    return ", ".join(str(r) for r in where[:5]) + (f" and {len(where) - 5} more" if len(where) > 5 else "")


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
