"""Fit any steps table: one S(B) fit and data-read regimes per group of a CSV or Parquet file.

A steps table has one row per batch size (per group): columns ``batch_size`` and ``steps`` (steps to
result, updates), optional ``reached`` (bool; default: ``steps`` is a finite number, so an empty cell or
``inf`` means not reached), ``budget`` (the step budget the study at that batch size ran to: an
unreached row's censoring bound ``S > budget``; on a reached row, optional, the step its unreached
trials ran to, where a second-best trial with empty ``second_steps`` is censored for the trials'
scatter) and ``steps_lower`` (the
evaluation step before the reaching one: the bracket ``(steps_lower, steps]``), and the trial columns
``n_trials`` (trials run at that batch size), ``n_reached`` (those that reached the goal) and
``second_steps`` (the second-best trial's steps, empty or ``inf`` where it did not reach the goal),
copied into each batch size's row of the result, and ``learning_rate``, ``momentum`` (the best
trial's values). Other columns are ignored unless named as the group column. An unreached row's
censoring bound is its ``budget``, else its ``steps`` value (the steps it ran); an unreached row with
neither, or whose bound is 0, is an error (never dropped). Without ``steps_lower`` the steps are
treated as exact. Batch sizes, steps, budgets, steps_lower, n_trials, n_reached and second_steps are
whole numbers (steps count updates; a fractional value is an error naming its rows, rows counted from
1 below the header), at most 2^53 (:data:`LARGEST`, the largest whole number a float holds exactly). A CSV is UTF-8 text
(a byte-order mark allowed); a file in another encoding is one line saying so.

Each group is fitted by :func:`batchlab.analysis.bootstrap.fit_with_intervals`, the fit a store gets:
with ``n_trials`` and ``second_steps`` the trials' scatter comes from each batch size's best two
(:func:`batchlab.analysis.scatter.scatter_from_best_two`, :func:`table_scatter`), as a store holding
those trials gives it. With ``n_trials`` and ``n_reached`` each group gets its tuning flags
(:func:`batchlab.analysis.tuning_flags.tuning_flags`, :func:`table_tuning`) and B_crit with and
without the flagged batch sizes (:func:`~batchlab.analysis.tuning_flags.flagged_fit_effect`).

Definitions of every returned quantity: docs/methods.md ("Critical batch size", "Regimes read from
the data", "The S(B) fit", "Intervals", "Steps tables").
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np

from batchlab.analysis.bootstrap import CurveFit, check_level, fit_with_intervals
from batchlab.analysis.curve import StepsCurve
from batchlab.analysis.definitions import REGISTRY
from batchlab.analysis.regimes import check_tolerance
from batchlab.analysis.scatter import ScatterEstimate, scatter_from_best_two
from batchlab.analysis.tuning_flags import POINT_KINDS, StudyTuning, flagged_fit_effect, tuning_flags
from batchlab.errors import BatchlabError, decode_utf8, one_line

REQUIRED = ("batch_size", "steps")
OPTIONAL = ("reached", "budget", "steps_lower", "n_trials", "n_reached", "second_steps", "learning_rate", "momentum")
#: Whole-number trial columns copied into each batch size's result row (the trials' scatter reads
#: ``n_trials`` and ``second_steps``, the tuning flags ``n_trials`` and ``n_reached``).
PASS_THROUGH = ("n_trials", "n_reached", "second_steps")
#: The best trial's hyperparameters a table may give (numbers; the tuning flags compare ``learning_rate``).
TUNED = ("learning_rate", "momentum")
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
    frame = frame.reset_index(drop=True)  # a Parquet file may store a duplicate index; rows are positional
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
    for column in TUNED:
        if column in frame.columns:
            frame[column] = _numeric(frame[column], column, path)
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
    bound = np.where(np.isfinite(budget), budget, steps)
    unbounded = ~reached & ~(np.isfinite(bound) & (bound > 0))
    if unbounded.any():
        sizes = frame["batch_size"].to_numpy()[unbounded].astype(np.int64).tolist()
        raise BatchlabError(
            f"steps table {str(path)!r}: unreached row(s) {row_numbers(unbounded)} (batch size(s) {sizes[:5]}) have no "
            "budget > 0: add a 'budget' column with the steps each ran to (S > budget), or give those steps in 'steps'")
    if "n_trials" in frame.columns:
        trials = frame["n_trials"].to_numpy()
        wrong = trials < 1  # NaN compares False: an empty cell is allowed
        if wrong.any():
            raise BatchlabError(f"steps table {str(path)!r}: n_trials must be >= 1 (or empty), got "
                                f"{trials[wrong].tolist()[:5]} in row(s) {row_numbers(wrong)}")
    if "n_reached" in frame.columns:
        got = frame["n_reached"].to_numpy()
        trials = frame["n_trials"].to_numpy() if "n_trials" in frame.columns else np.full(len(frame), np.nan)
        wrong = np.isfinite(got) & ((reached & (got < 1)) | (~reached & (got > 0)) | (got > trials))
        if wrong.any():
            raise BatchlabError(f"steps table {str(path)!r}: n_reached must be >= 1 where the goal was reached, 0 where "
                                f"it was not, and at most n_trials (or empty), got {got[wrong].tolist()[:5]} in row(s) "
                                f"{row_numbers(wrong)}")
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
    ``interval`` (``level``, ``target``, ``method``, ``scatter``, ``scatter_source``, ``scatter_dof``,
    ``trials_scatter``, ``note``: :func:`batchlab.analysis.bootstrap.fit_with_intervals`' notes),
    ``residual`` (rms log residual), ``max_abs_log_residual``, ``chi2``, ``dof``, ``p_value``, ``misfit``
    (what is wrong when the fit is poor, else ``None``), ``b0``, ``batch_size_range``, ``points_used``,
    ``censored_batch_sizes``, ``extrapolated``, ``warnings``, ``reasons``, ``tolerance``, ``regimes`` (per
    batch size: ``batch_size``, ``steps``, ``regime`` and the table's trial columns, :data:`PASS_THROUGH`),
    ``tuning_flags`` (:meth:`~batchlab.analysis.tuning_flags.TuningFlag.to_dict` of each flag; ``None``
    without ``n_trials`` and ``n_reached`` on every row of the group) and ``flagged_fit_effect``
    (:meth:`~batchlab.analysis.tuning_flags.FlaggedFitEffect.to_dict` plus ``text``; ``None`` without
    flags or without a fit) and ``point_flagged_fit_effect`` (the same with only the batch sizes of the
    point kinds, :data:`~batchlab.analysis.tuning_flags.POINT_KINDS`, left out, as the report gives it;
    ``None`` unless those are some but not all of the flagged batch sizes); ``error`` (``None``, or why
    the group could not be fitted, e.g. fewer than two reached batch sizes, with the fit's values
    ``None``).
    """
    check_tolerance(tolerance)
    return fit_steps_frame(read_steps_table(path), group_by, tolerance, b0, level, label=Path(path).stem)


def fit_steps_frame(frame, group_by: str | None = None, tolerance: float = 0.1, b0: float | None = None,
                    level: float = 0.9, label: str = "") -> list[dict]:
    """:func:`fit_steps_table` of a frame :func:`read_steps_table` returned (``label`` names the curves)."""
    check_tolerance(tolerance)
    check_level(level)
    passed = [c for c in PASS_THROUGH if c in frame.columns]
    out = []
    rows_of = dict(table_groups(frame, group_by))
    for key, curve in steps_table_curves(frame, group_by, label=label):
        rows = rows_of[key]
        entry = {"group": key, "group_by": group_by, "tolerance": tolerance, "error": None}
        studies, missing = table_tuning(rows)
        flags = None if studies is None else tuning_flags(studies, tolerance)
        try:
            one = table_fit_fn(rows, level, tolerance, b0)(curve)
        except BatchlabError as exc:
            entry["error"] = str(exc)
            for name in FIT_KEYS:  # every group has the same keys: a failed group's fit values are None/[]
                entry[name] = [] if name in LIST_KEYS else None
            entry["tuning_flags"] = None if flags is None else [f.to_dict() for f in flags]
            entry["flagged_fit_effect"] = entry["point_flagged_fit_effect"] = None
            out.append(entry)
            continue
        entry.update(_fit_entry(one, level))
        if missing:
            entry["warnings"].append(f"no tuning flags: n_trials or n_reached is empty at B = {missing}")
        entry["tuning_flags"] = None if flags is None else [f.to_dict() for f in flags]
        entry["flagged_fit_effect"] = entry["point_flagged_fit_effect"] = None
        if flags:
            # the same fit on the kept batch sizes, the trials' scatter from their rows alone (as a
            # store's fit of those batch sizes reads it from their trials; B0 their own, as there)
            fit_fn = table_fit_fn(rows, level, tolerance)
            effect = flagged_fit_effect(curve, flags, fit_fn, full=one)
            entry["flagged_fit_effect"] = effect.to_dict() | {"text": effect.text()}
            # the point kinds alone, as the report shows them: when they flag some, not all, flagged sizes
            point_sizes = {f.batch_size for f in flags if f.kind in POINT_KINDS}
            if point_sizes and point_sizes != {f.batch_size for f in flags}:
                points = flagged_fit_effect(curve, flags, fit_fn, full=one, leave_out=POINT_KINDS)
                entry["point_flagged_fit_effect"] = points.to_dict() | {"text": points.text()}
        extra = {int(r["batch_size"]): {c: _whole_or_none(r[c]) for c in passed} for _, r in rows.iterrows()}
        entry["regimes"] = [{**r, **extra[r["batch_size"]]} for r in entry["regimes"]]
        out.append(entry)
    return out


#: The keys :func:`_fit_entry` gives a fitted group (a failed group gets them too, ``None`` or ``[]``).
FIT_KEYS = ("s_min", "s_min_measured", "e_min", *(d.name for d in REGISTRY), "intervals", "interval", "residual",
            "max_abs_log_residual", "chi2", "dof", "p_value", "misfit", "b0", "batch_size_range", "points_used",
            "censored_batch_sizes", "extrapolated", "warnings", "reasons", "regimes")
#: The list-valued ones among :data:`FIT_KEYS` (``[]`` in a failed group).
LIST_KEYS = ("censored_batch_sizes", "warnings", "regimes")


def _fit_entry(one: CurveFit, level: float) -> dict:
    """The fit's part of a group's entry (keys: :func:`fit_steps_table`)."""
    fit, data = one.fit, one.data_regimes
    note = one.notes["mccandlish_b_crit"]
    return {
        "s_min": _finite_or_none(fit.s_min),
        "s_min_measured": data["s_min_measured"]["value"],
        "e_min": _finite_or_none(fit.e_min),
        **{d.name: _finite_or_none(one.estimates[d.name]) for d in REGISTRY},
        "intervals": {name: {"low": _finite_or_none(one.intervals[name][0]),
                             "high": _finite_or_none(one.intervals[name][1])} for name in INTERVAL_NAMES},
        "interval": {"level": level, **{k: note[k] for k in ("target", "method", "scatter", "scatter_source",
                                                             "scatter_dof", "trials_scatter", "note")}},
        "residual": fit.rms_log_residual,
        "max_abs_log_residual": fit.max_abs_log_residual,
        "chi2": fit.chi2,
        "dof": fit.dof,
        "p_value": fit.p_value,
        "misfit": fit.misfit,
        "b0": fit.b0,
        "batch_size_range": [fit.smallest_batch_size, fit.largest_batch_size],
        "points_used": fit.n_points,
        "censored_batch_sizes": [r["batch_size"] for r in fit.residuals if r["use"] == "censored"],
        "extrapolated": fit.extrapolated,
        "warnings": list(one.warnings),
        "reasons": {d.name: data[d.name].get("reason") for d in REGISTRY if d.source == "data"},
        "regimes": [{"batch_size": p["batch_size"], "steps": p["steps"], "regime": p["regime"]} for p in data["points"]],
    }


def table_fit_fn(rows, level: float = 0.9, tolerance: float = 0.1, b0: float | None = None):
    """The fit of a curve made from (some of) one group's ``rows``:
    :func:`~batchlab.analysis.bootstrap.fit_with_intervals` with the trials' scatter of the rows at the
    curve's batch sizes (:func:`table_scatter`). A ``fit_fn`` for
    :func:`~batchlab.analysis.tuning_flags.flagged_fit_effect`."""
    def fit(curve: StepsCurve) -> CurveFit:
        return fit_with_intervals(curve, level=level, tolerance=tolerance, b0=b0,
                                  scatter=table_scatter(rows, curve.batch_sizes))

    return fit


def table_scatter(rows, batch_sizes=None) -> ScatterEstimate | None:
    """The trials' scatter of one group's rows (:func:`~batchlab.analysis.scatter.scatter_from_best_two`
    of each row's ``steps`` where reached, ``second_steps``, ``n_trials`` and, where present, ``budget``:
    a reached row's empty ``second_steps`` is censored at its budget, or left out without one), over the rows whose batch
    size is in ``batch_sizes`` (default: every row). ``None`` without both columns, or when no row has
    two reached trials (then the fit uses its floor or the residuals)."""
    if "n_trials" not in rows.columns or "second_steps" not in rows.columns:
        return None
    if batch_sizes is not None:
        rows = rows[rows["batch_size"].isin([int(b) for b in batch_sizes])]
    reached = rows["reached"].to_numpy(dtype=bool)
    best = np.where(reached, rows["steps"].to_numpy(dtype=float), np.nan)
    budget = rows["budget"].to_numpy(dtype=float) if "budget" in rows.columns else None
    return scatter_from_best_two(rows["batch_size"].to_numpy(dtype=float), best,
                                 rows["second_steps"].to_numpy(dtype=float), rows["n_trials"].to_numpy(dtype=float),
                                 budget)


def table_tuning(rows) -> tuple[list[StudyTuning] | None, list[int]]:
    """One :class:`~batchlab.analysis.tuning_flags.StudyTuning` per row of one group (space unknown;
    ``best_point`` the row's finite :data:`TUNED` values where reached), and the batch sizes whose
    ``n_trials`` or ``n_reached`` is empty. ``(None, [])`` without both columns; ``(None, [...])`` when a
    row lacks either."""
    if "n_trials" not in rows.columns or "n_reached" not in rows.columns:
        return None, []
    trials, got = rows["n_trials"].to_numpy(dtype=float), rows["n_reached"].to_numpy(dtype=float)
    sizes = rows["batch_size"].to_numpy().astype(np.int64)
    empty = ~(np.isfinite(trials) & np.isfinite(got))
    if empty.any():
        return None, sizes[empty].tolist()
    tuned = [c for c in TUNED if c in rows.columns]
    studies = []
    for (_, row), b, k, n in zip(rows.iterrows(), sizes, trials, got):
        point = {c: float(row[c]) for c in tuned if math.isfinite(float(row[c]))} if row["reached"] else None
        studies.append(StudyTuning(batch_size=int(b), steps=int(row["steps"]) if row["reached"] else None,
                                   n_reached=int(n), n_trials=int(k), best_point=point))
    return studies, []


def _finite_or_none(value):
    """``value``, or ``None`` where it is ``None`` or not finite (JSON-ready; whole numbers stay whole)."""
    return None if value is None or not math.isfinite(value) else value


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
