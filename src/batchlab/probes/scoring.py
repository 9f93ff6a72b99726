"""Scoring predictors of the critical batch size against measured ones, by a protocol fixed in advance.

The protocol (docs/methods.md, "Scoring predictors"), decided before any measured value was looked at:

1. **Reference run** (what :func:`batchlab.probes.predict.predict` trains): with a store, at the tuned
   hyperparameters (the best trial's) of the measured batch size nearest the reference batch size in
   log B; without one, at the optimizer's default learning rate. ``settings.reference`` records which.
   The scorer counts each rule; it does not refuse records made under another one (files written
   before this protocol), and says how many there are.
2. **Checkpoint**: a prediction is scored only at the *protocol checkpoint*, the step ``batchlab
   predict`` takes by default: a quarter of the workload's default step budget
   (:func:`batchlab.probes.predict.default_steps_at`), recorded as ``settings.protocol_steps_at`` (for
   records without it, the workload's own default, resolved by name or by a ``workload_refs`` entry).
   Predictions at any other step are counted, never scored, and never the best of several.
3. **Measured value**: the unit's measured ``mccandlish_b_crit`` point estimate and its interval, the
   fit's own (a report CSV, :func:`read_measured_csv`, or the report's own units). ``ratio`` =
   predicted / measured. A *hit* (within 2x): ``1/2 <= ratio <= 2``. *Consistent*: the predicted
   point lies in the measured interval widened by 2x, ``[low / 2, 2 * high]`` (an unbounded end stays
   unbounded).
4. **Unresolved estimates are bounds** (:func:`classify`): an estimate whose recorded interval is open
   above (``low`` finite, ``high`` unbounded: a B_simple whose |G|^2 interval includes 0, a branched
   estimate where every multiplier passed) is a lower bound ``low``; open below, an upper bound
   ``high``; no value and no finite positive end, *none*. A bound is never scored as a point: it is excluded
   from the ratio, the within-2x share and the geometric error, and counted apart, *consistent* when
   it allows a value within 2x of the measured point (lower bound ``L <= 2 M``, upper bound
   ``U >= M / 2``). A point with no interval at all (the calibrated NQM's) is a point.
5. **Scores, per predictor on its own**, across every *scored unit* (a measured unit with a finite
   point estimate that at least one prediction record matches at the protocol checkpoint): the units
   it has a point for, the share within 2x with its exact (Clopper-Pearson) interval, the geometric
   error ``exp(mean |ln ratio|)`` (a factor: 1 is perfect, 2 is a factor two off on average), the
   consistent count, the bounds and how many are consistent, and units with no value. Beside them two
   *naive baselines* on the same scored units: the workload's default batch size, and the geometric
   mean ``sqrt(B_min * B_max)`` of the unit's swept batch sizes. Never a union over predictors or
   checkpoints.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from batchlab.errors import BatchlabError
from batchlab.finite import finite_or_none
from batchlab.probes.readings import LOWER, NONE, POINT, UPPER, Estimate, classify  # noqa: F401 (re-exported)

__all__ = ["BASELINES", "CONSISTENT_WIDENING", "WITHIN", "Estimate", "MeasuredUnit", "PredictorScore", "Scoreboard",
           "UnitScore", "classify", "protocol_step", "read_measured", "read_measured_csv", "read_measured_refit",
           "score_estimates", "score_records", "store_workload_of"]

#: A hit: predicted / measured in [1 / WITHIN, WITHIN].
WITHIN = 2.0
#: Consistent: the predicted point in [low / CONSISTENT_WIDENING, CONSISTENT_WIDENING * high] of the measured interval.
CONSISTENT_WIDENING = 2.0
#: The naive baselines, in the order reported.
BASELINES = ("baseline: default batch size", "baseline: swept geometric mean")


@dataclass(frozen=True)
class MeasuredUnit:
    """A unit's measured critical batch size: ``value`` (``mccandlish_b_crit``, examples; None when the
    fit gives none) and its interval ``low``/``high`` (None: unbounded), ``batch_sizes``: the swept
    batch sizes (every batch size with trials, reached or not), ``source``: where it was read."""

    unit: str
    value: float | None
    low: float | None
    high: float | None
    batch_sizes: tuple[float, ...] = ()
    source: str = ""

    @property
    def workload(self) -> str:
        """The unit's store workload ``dataset/model/optimizer`` (its name before `` [group]``)."""
        return store_workload_of(self.unit)

    @property
    def scorable(self) -> bool:
        return self.value is not None and math.isfinite(self.value) and self.value > 0


def store_workload_of(unit: str) -> str:
    """``dataset/model/optimizer`` of a unit name ``dataset/model/optimizer [group]``."""
    return unit.split(" [", 1)[0]


def _csv_number(text: str, where: str, name: str) -> float | None:
    text = (text or "").strip()
    if text in ("", "inf", "-inf", "nan"):
        return None
    try:
        return finite_or_none(float(text))
    except ValueError:
        raise BatchlabError(f"{where}: {name} must be a number or empty, got {text!r}") from None


def read_measured(paths: Iterable) -> dict[str, MeasuredUnit]:
    """The measured units of ``--measured`` files, by unit name: a report CSV (``.csv``,
    :func:`read_measured_csv`) or the JSON lines of ``batchlab analyze critical-batch-size --steps-table
    FILE --group-by unit --json`` (``.jsonl``, :func:`read_measured_refit`), each by its extension.

    Raises:
        BatchlabError: another extension, or what the reader of that kind raises; one unit given two
            different values by two files.
    """
    out: dict[str, MeasuredUnit] = {}
    for path in paths:
        suffix = Path(path).suffix.lower()
        if suffix not in (".csv", ".jsonl"):
            raise BatchlabError(f"--measured {str(path)!r}: unknown kind {suffix or '(none)'!r}; allowed: .csv (a report.csv "
                                "of batchlab report), .jsonl (batchlab analyze critical-batch-size --steps-table --json)")
        found = read_measured_csv([path]) if suffix == ".csv" else read_measured_refit([path])
        for unit, m in found.items():
            old = out.get(unit)
            if old is not None and (old.value, old.low, old.high) != (m.value, m.low, m.high):
                raise BatchlabError(f"unit {unit!r} has two measured values: {old.value} in {old.source!r} and "
                                    f"{m.value} in {m.source!r}")
            out[unit] = m
    return out


def _refit_number(value, where: str, name: str) -> float | None:
    """A number of a refit line: ``None`` (JSON null) or a finite/infinite JSON number (infinite: None,
    unbounded); anything else (a string, a bool, a list) is refused."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BatchlabError(f"{where}: {name} is {value!r}; allowed: a number or null")
    return finite_or_none(value)


def read_measured_refit(paths: Iterable) -> dict[str, MeasuredUnit]:
    """The measured units of ``batchlab analyze critical-batch-size --steps-table FILE --group-by unit
    --json`` output (one JSON object per group), by group name: ``mccandlish_b_crit`` and its interval
    (``intervals.mccandlish_b_crit``: ``low``/``high``, ``None``: unbounded), and the table's batch sizes
    (``regimes`` rows, each an object with a numeric ``batch_size``). A group whose fit failed
    (``mccandlish_b_crit`` null) has no value.

    Raises:
        BatchlabError (one line naming the file and line): a missing file, a file without any record, a
            line that is not a JSON object with ``group`` and ``mccandlish_b_crit``, a non-numeric
            ``mccandlish_b_crit``/``low``/``high``/``batch_size`` (null allowed for the first three), an
            ``intervals`` that is not an object of objects, ``regimes`` that is not a list of objects, or
            one group given twice.
    """
    import json

    out: dict[str, MeasuredUnit] = {}
    for path in paths:
        path = Path(path).expanduser()
        if not path.is_file():
            raise BatchlabError(f"--measured {str(path)!r} does not exist or is not a file")
        text = path.read_bytes().decode("utf-8", errors="replace")
        seen: dict[str, int] = {}
        form = "the --json lines of batchlab analyze critical-batch-size --steps-table FILE --group-by unit"
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            where = f"--measured {str(path)!r} line {number}"
            try:
                entry = json.loads(line)
            except ValueError:
                raise BatchlabError(f"{where} is not JSON ({form})") from None
            if not isinstance(entry, dict) or "group" not in entry or "mccandlish_b_crit" not in entry:
                raise BatchlabError(f"{where}: needs the keys group and mccandlish_b_crit ({form})")
            intervals = entry.get("intervals") or {}
            interval = intervals.get("mccandlish_b_crit") if isinstance(intervals, dict) else None
            if not isinstance(intervals, dict) or not isinstance(interval or {}, dict):
                raise BatchlabError(f"{where}: intervals must be an object whose mccandlish_b_crit is an object "
                                    f"with low and high ({form})")
            interval = interval or {}
            regimes = entry.get("regimes") or []
            if not isinstance(regimes, list) or not all(isinstance(r, dict) for r in regimes):
                raise BatchlabError(f"{where}: regimes must be a list of objects with batch_size ({form})")
            sizes = []
            for r in regimes:
                if "batch_size" in r:
                    size = _refit_number(r["batch_size"], where, "regimes batch_size")
                    if size is None:
                        raise BatchlabError(f"{where}: regimes batch_size is {r['batch_size']!r}; allowed: a "
                                            "positive number")
                    sizes.append(size)
            unit = str(entry["group"])
            if unit in seen:
                raise BatchlabError(f"{where}: group {unit!r} is given twice in this file (also line {seen[unit]})")
            seen[unit] = number
            value = _refit_number(entry["mccandlish_b_crit"], where, "mccandlish_b_crit")
            low = _refit_number(interval.get("low"), where, "intervals.mccandlish_b_crit.low")
            high = _refit_number(interval.get("high"), where, "intervals.mccandlish_b_crit.high")
            m = MeasuredUnit(unit, value, low, high, tuple(sorted(sizes)), str(path))
            old = out.get(unit)
            if old is not None and (old.value, old.low, old.high) != (m.value, m.low, m.high):
                raise BatchlabError(f"unit {unit!r} has two measured values: {old.value} in {old.source!r} and "
                                    f"{m.value} in {m.source!r}")
            out[unit] = m
        if not seen:
            raise BatchlabError(f"--measured {str(path)!r} has no record ({form})")
    return out


def read_measured_csv(paths: Iterable) -> dict[str, MeasuredUnit]:
    """The measured units of report CSVs (``batchlab report``'s ``report.csv``, long format), by unit name.

    Per unit: the row of section ``critical_batch_size``, quantity ``mccandlish_b_crit`` (``value``, and
    ``lower``/``upper``: the fit's interval; empty or ``inf``: unbounded), and the swept batch sizes: every
    ``batch_size`` of its section ``steps_to_result`` rows of quantity ``n_trials``.

    Raises:
        BatchlabError (one line naming the file): a missing file, a CSV without the report's columns, a
            file without any ``mccandlish_b_crit`` row, a non-numeric number, or one unit given two
            different values by two files.
    """
    out: dict[str, MeasuredUnit] = {}
    for path in paths:
        path = Path(path).expanduser()
        if not path.is_file():
            raise BatchlabError(f"--measured {str(path)!r} does not exist or is not a file (a report.csv of batchlab report)")
        values: dict[str, tuple] = {}
        sizes: dict[str, set] = {}
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            need = {"unit", "section", "batch_size", "quantity", "value", "lower", "upper"}
            if not need <= set(reader.fieldnames or ()):
                raise BatchlabError(f"--measured {str(path)!r} is not a report CSV: it needs the columns "
                                    f"{', '.join(sorted(need))}")
            for number, row in enumerate(reader, 2):
                where = f"--measured {str(path)!r} line {number}"
                if row["section"] == "critical_batch_size" and row["quantity"] == "mccandlish_b_crit":
                    values[row["unit"]] = tuple(_csv_number(row[c], where, c) for c in ("value", "lower", "upper"))
                elif row["section"] == "steps_to_result" and row["quantity"] == "n_trials" and row["batch_size"]:
                    size = _csv_number(row["batch_size"], where, "batch_size")
                    if size is not None:
                        sizes.setdefault(row["unit"], set()).add(size)
        if not values:
            raise BatchlabError(f"--measured {str(path)!r} has no critical_batch_size,mccandlish_b_crit row "
                                "(a report.csv of batchlab report)")
        for unit, (value, low, high) in values.items():
            m = MeasuredUnit(unit, value, low, high, tuple(sorted(sizes.get(unit, ()))), str(path))
            old = out.get(unit)
            if old is not None and (old.value, old.low, old.high) != (value, low, high):
                raise BatchlabError(f"unit {unit!r} has two measured values: {old.value} in {old.source!r} and "
                                    f"{value} in {str(path)!r}")
            out[unit] = m
    return out


@dataclass(frozen=True)
class UnitScore:
    """One predictor on one unit: its :class:`Estimate` against the measured point and interval.

    ``ratio``: point / measured (None unless a point); ``within_2x``: the hit; ``consistent``: a point
    in the widened measured interval, or a bound that allows a value within 2x (None for ``none``)."""

    unit: str
    estimate: Estimate
    measured: float
    measured_low: float | None
    measured_high: float | None
    ratio: float | None
    within_2x: bool | None
    consistent: bool | None
    source: str = ""

    def to_dict(self) -> dict:
        return {"unit": self.unit, "kind": self.estimate.kind, "predicted": self.estimate.value,
                "measured": self.measured, "measured_low": self.measured_low, "measured_high": self.measured_high,
                "ratio": self.ratio, "within_2x": self.within_2x, "consistent": self.consistent, "source": self.source}


def score_unit(unit: MeasuredUnit, estimate: Estimate, source: str = "") -> UnitScore:
    """Score one estimate against one scorable measured unit (module docstring, items 3 and 4)."""
    m = float(unit.value)
    ratio = within = consistent = None
    if estimate.kind == POINT:
        ratio = float(estimate.value) / m
        within = bool(1 / WITHIN <= ratio <= WITHIN)
        lo = 0.0 if unit.low is None else unit.low / CONSISTENT_WIDENING
        hi = math.inf if unit.high is None else unit.high * CONSISTENT_WIDENING
        consistent = bool(lo <= estimate.value <= hi)
    elif estimate.kind == LOWER:
        consistent = bool(estimate.value <= WITHIN * m)
    elif estimate.kind == UPPER:
        consistent = bool(estimate.value >= m / WITHIN)
    return UnitScore(unit.unit, estimate, m, unit.low, unit.high, ratio, within, consistent, source)


@dataclass(frozen=True)
class PredictorScore:
    """One predictor (or baseline) across the units it was scored on (module docstring, item 5).

    ``within_interval``: the exact (Clopper-Pearson) ``level`` interval of the within-2x share over the
    points; ``geometric_error``: ``exp(mean |ln ratio|)`` over the points (None without points)."""

    predictor: str
    units: tuple[UnitScore, ...]
    baseline: bool = False
    level: float = 0.9

    def _count(self, kind=None, **flags) -> int:
        return sum(1 for u in self.units if (kind is None or u.estimate.kind == kind)
                   and all(getattr(u, k) is v for k, v in flags.items()))

    @property
    def n_units(self) -> int:
        return len(self.units)

    @property
    def n_points(self) -> int:
        return self._count(POINT)

    @property
    def n_within(self) -> int:
        return self._count(POINT, within_2x=True)

    @property
    def n_consistent(self) -> int:
        return self._count(POINT, consistent=True)

    @property
    def n_bounds(self) -> int:
        return self._count(LOWER) + self._count(UPPER)

    @property
    def n_bounds_consistent(self) -> int:
        return self._count(LOWER, consistent=True) + self._count(UPPER, consistent=True)

    @property
    def n_none(self) -> int:
        return self._count(NONE)

    @property
    def ratios(self) -> list[float]:
        return [u.ratio for u in self.units if u.ratio is not None]

    @property
    def within_share(self) -> float | None:
        return self.n_within / self.n_points if self.n_points else None

    @property
    def within_interval(self) -> tuple[float, float] | None:
        if not self.n_points:
            return None
        from scipy.stats import binomtest

        ci = binomtest(self.n_within, self.n_points).proportion_ci(confidence_level=self.level, method="exact")
        return float(ci.low), float(ci.high)

    @property
    def geometric_error(self) -> float | None:
        r = self.ratios
        return float(np.exp(np.mean(np.abs(np.log(r))))) if r else None

    @property
    def point_units(self) -> tuple[str, ...]:
        """The units where this row has a point (those its within-2x share and geometric error count)."""
        return tuple(u.unit for u in self.units if u.estimate.kind == POINT)

    def on_units(self, names: Iterable[str]) -> PredictorScore:
        """This row restricted to the units ``names`` (same order as :attr:`units`)."""
        keep = set(names)
        return PredictorScore(self.predictor, tuple(u for u in self.units if u.unit in keep), self.baseline,
                              self.level)

    def summary_dict(self) -> dict:
        """:meth:`to_dict` without the per-unit entries."""
        return {k: v for k, v in self.to_dict().items() if k != "units"}

    def to_dict(self) -> dict:
        return {"predictor": self.predictor, "baseline": self.baseline, "n_units": self.n_units,
                "n_points": self.n_points, "n_within_2x": self.n_within, "within_2x_share": self.within_share,
                "within_2x_interval": self.within_interval, "level": self.level,
                "geometric_error": self.geometric_error, "n_consistent": self.n_consistent, "n_bounds": self.n_bounds,
                "n_bounds_consistent": self.n_bounds_consistent, "n_none": self.n_none,
                "units": [u.to_dict() for u in self.units]}


def score_estimates(predictor: str, entries: Sequence[tuple[MeasuredUnit, Estimate, str]], *, baseline: bool = False,
                    level: float = 0.9) -> PredictorScore:
    """Score one predictor on its own: ``entries`` are ``(unit, estimate, source)``, one per unit
    (scorable units only; others are skipped)."""
    return PredictorScore(predictor, tuple(score_unit(u, e, s) for u, e, s in entries if u.scorable), baseline, level)


@dataclass
class Scoreboard:
    """Every predictor's :class:`PredictorScore` and the baselines over the scored units.

    ``units``: the scored unit names; ``off_checkpoint``: per predictor, the (unit, step) pairs of records
    at another step (not scored); ``reference_rules``: ``{rule: count}`` of the scored predictions'
    reference runs (``unrecorded``: files written before the protocol); ``warnings``: records matching no
    measured unit, units without a measured value."""

    predictors: list[PredictorScore]
    baselines: list[PredictorScore]
    units: list[str]
    off_checkpoint: dict[str, list[tuple[str, int | None]]] = field(default_factory=dict)
    reference_rules: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def rows(self) -> list[PredictorScore]:
        return self.predictors + self.baselines

    def baselines_on_points_of(self, predictor: PredictorScore) -> list[PredictorScore]:
        """Each baseline (in :data:`BASELINES` order) on the units where ``predictor`` has a point: the
        comparison on the same units (a predictor's share counts only its points, while the baseline
        rows count every scored unit)."""
        return [b.on_units(predictor.point_units) for b in self.baselines]

    def row_dicts(self) -> list[dict]:
        """One dict per row (:meth:`PredictorScore.to_dict`), predictors first; a predictor's carries
        ``baselines_on_these_units``: :meth:`baselines_on_points_of` as summary dicts."""
        return ([p.to_dict() | {"baselines_on_these_units": [b.summary_dict() for b in self.baselines_on_points_of(p)]}
                 for p in self.predictors] + [b.to_dict() for b in self.baselines])

    def to_dict(self) -> dict:
        rows = self.row_dicts()
        return {"units": self.units, "predictors": rows[:len(self.predictors)],
                "baselines": [b.to_dict() for b in self.baselines],
                "off_checkpoint": {k: [list(v) for v in vs] for k, vs in self.off_checkpoint.items()},
                "reference_rules": self.reference_rules, "warnings": self.warnings}


def _workload_defaults(record, refs: Mapping[str, str], cache: dict) -> tuple[int | None, float | None]:
    """``(protocol checkpoint, default batch size)`` of a record's workload: its settings' when recorded,
    else the resolved workload's (``refs``: workload name -> a reference ``sweep`` accepts); None where
    the workload cannot be resolved."""
    step, size = record.protocol_step, record.default_batch_size
    if step is not None and size is not None:
        return step, size
    if record.workload not in cache:
        from batchlab.probes.predict import default_steps_at
        from batchlab.workloads import resolve_workload

        try:
            w = resolve_workload(refs.get(record.workload, record.workload))
            cache[record.workload] = (default_steps_at(w), float(w.default_batch_size))
        except BatchlabError:
            cache[record.workload] = (None, None)
    cached = cache[record.workload]
    return (cached[0] if step is None else step), (cached[1] if size is None else size)


def protocol_step(record, refs: Mapping[str, str] | None = None, cache: dict | None = None) -> int | None:
    """The protocol checkpoint (an optimizer step) of a record's workload: its settings'
    ``protocol_steps_at`` when recorded, else the resolved workload's; None when unknown. ``cache``:
    a dict reused across calls (workload name -> defaults)."""
    return _workload_defaults(record, dict(refs or {}), {} if cache is None else cache)[0]


def resolve_workload_refs(refs: Iterable[str]) -> dict[str, str]:
    """``{workload name: reference}`` for workload references (``file.py:function`` or a registered name)
    given to resolve workloads the registry does not hold; BatchlabError (one line) for one that fails."""
    from batchlab.workloads import resolve_workload

    return {resolve_workload(ref).name: ref for ref in refs}


def score_records(records, measured: Mapping[str, MeasuredUnit], *, workload_refs: Mapping[str, str] | None = None,
                  level: float = 0.9, strict: bool = True) -> Scoreboard:
    """Score the prediction records (:class:`batchlab.report.predictions.Record`, noise-scale steps are
    ignored) against ``measured`` units by the protocol (module docstring).

    A record matches the unit it names, or, with no unit, every measured unit of its store workload.
    Per predictor and unit, the record at the protocol checkpoint is scored; records at other steps are
    listed in ``off_checkpoint``. Predictors are ordered as :data:`batchlab.probes.predict.PREDICTORS`,
    then any others in file order.

    Raises:
        BatchlabError (``strict`` only; otherwise a warning and the records skipped): a workload whose
            protocol checkpoint is unknown (not recorded, not resolvable: give ``workload_refs``), or two
            different predictions of one predictor for one unit at the protocol checkpoint.
    """
    from batchlab.probes.predict import PREDICTORS

    refs = dict(workload_refs or {})
    cache: dict = {}
    by_workload: dict[str, list[MeasuredUnit]] = {}
    for m in measured.values():
        by_workload.setdefault(m.workload, []).append(m)
    warnings: list[str] = []
    chosen: dict[tuple[str, str], object] = {}
    off: dict[str, list[tuple[str, int | None]]] = {}
    sizes: dict[str, float | None] = {}
    for rec in records:
        if rec.kind != "prediction":
            continue
        units = by_workload.get(rec.store_workload, [])
        if rec.unit is not None:
            units = [u for u in units if u.unit == rec.unit]
        if not units:
            warnings.append(f"predictions for {rec.unit or rec.store_workload}: no measured unit of that name")
            continue
        step, default_size = _workload_defaults(rec, refs, cache)
        if step is None:
            message = (f"the protocol checkpoint of workload {rec.workload!r} is unknown (its predictions' settings "
                       "do not record protocol_steps_at and the workload is not registered)")
            if strict:
                raise BatchlabError(f"{rec.where}: {message}; give its reference, e.g. --workload-ref FILE.py:FUNCTION")
            warnings.append(f"{message}: its predictions are not scored")
            continue
        for u in units:
            sizes[u.unit] = default_size
            if rec.step != step:
                off.setdefault(rec.predictor, []).append((u.unit, rec.step))
                continue
            old = chosen.get((rec.predictor, u.unit))
            if old is not None and old.key != rec.key:
                message = (f"two predictions of {rec.predictor} for unit {u.unit!r} at the protocol checkpoint "
                           f"(step {step}): {old.where} and {rec.where}; score one reference run per unit")
                if strict:
                    raise BatchlabError(message)
                warnings.append(message)
                continue
            chosen.setdefault((rec.predictor, u.unit), rec)
    unit_names = list(dict.fromkeys(u for _, u in chosen))
    for name in unit_names:
        if not measured[name].scorable:
            warnings.append(f"unit {name!r} has no finite measured mccandlish_b_crit: not scored")
    scored = [n for n in unit_names if measured[n].scorable]
    names = [p for p in PREDICTORS if any(k[0] == p for k in chosen)]
    names += [p for p in dict.fromkeys(k[0] for k in chosen) if p not in names]
    predictors, rules = [], {}
    for p in names:
        entries = []
        for n in scored:
            rec = chosen.get((p, n))
            if rec is None:
                continue
            entries.append((measured[n], classify(rec.value, rec.low, rec.high, rec.has_interval), rec.where))
            rule = rec.reference_rule or "unrecorded"
            rules[rule] = rules.get(rule, 0) + 1
        predictors.append(score_estimates(p, entries, level=level))
    baselines = [
        score_estimates(BASELINES[0], [(measured[n], classify(sizes.get(n), None, None, False),
                                        "the workload's default batch size") for n in scored], baseline=True,
                        level=level),
        score_estimates(BASELINES[1], [(measured[n], classify(_geometric_mean_range(measured[n].batch_sizes), None,
                                                              None, False), "sqrt(B_min * B_max) of the swept batch sizes")
                                       for n in scored], baseline=True, level=level),
    ]
    return Scoreboard(predictors, baselines, scored, off, rules, list(dict.fromkeys(warnings)))


def _geometric_mean_range(batch_sizes: Sequence[float]) -> float | None:
    """``sqrt(min * max)`` of the swept batch sizes; None without any."""
    return math.sqrt(min(batch_sizes) * max(batch_sizes)) if batch_sizes else None


def ratio_list(score: PredictorScore) -> str:
    """The per-unit readings of one row, in unit order: ratios as ``0.16x``, bounds as ``>= 4096`` /
    ``<= 12`` (with ``ok`` when consistent), ``-`` for no value."""
    parts = []
    for u in score.units:
        e = u.estimate
        if e.kind == POINT:
            parts.append(f"{u.ratio:.3g}x")
        elif e.kind in (LOWER, UPPER):
            parts.append(f"{'>=' if e.kind == LOWER else '<='} {e.value:.4g}" + (" ok" if u.consistent else " no"))
        else:
            parts.append("-")
    return ", ".join(parts)


SCORE_COLUMNS = ("predictor", "units", "points", "within 2x", "geometric error", "consistent", "bounds (consistent)",
                 "no value", "baseline (default B) on these units", "baseline (swept range) on these units", "per unit")


def _error_text(s: PredictorScore) -> str:
    return "-" if s.geometric_error is None else f"{s.geometric_error:.2f}x"


def same_units_text(baseline: PredictorScore) -> str:
    """A baseline on a predictor's point units, as ``k/n within 2x, error 1.50x`` (``-`` on no unit)."""
    if not baseline.n_points:
        return "-"
    return f"{baseline.n_within}/{baseline.n_points} within 2x, error {_error_text(baseline)}"


def score_table_rows(board: Scoreboard) -> list[list[str]]:
    """One text row per predictor, then per baseline (:data:`SCORE_COLUMNS`); a predictor's row carries
    both baselines on the units where it has a point (:meth:`Scoreboard.baselines_on_points_of`)."""
    rows = []
    for s in board.rows:
        ci = s.within_interval
        within = "-" if ci is None else (f"{s.n_within}/{s.n_points} ({s.within_share:.2f}, "
                                         f"{s.level:.0%} CI {ci[0]:.2f}-{ci[1]:.2f})")
        paired = ["-", "-"] if s.baseline else [same_units_text(b) for b in board.baselines_on_points_of(s)]
        rows.append([s.predictor, str(s.n_units), str(s.n_points), within, _error_text(s),
                     f"{s.n_consistent}/{s.n_points}" if s.n_points else "-",
                     f"{s.n_bounds} ({s.n_bounds_consistent})", str(s.n_none), *paired, ratio_list(s)])
    return rows


SCORE_NOTE = ("Each predictor on its own, at the protocol checkpoint (a quarter of the workload's default step "
              "budget), against each unit's measured mccandlish_b_crit point and interval. within 2x: points with "
              "1/2 <= predicted/measured <= 2, of the points, with the exact (Clopper-Pearson) interval of the "
              "share; geometric error: exp(mean |ln(predicted/measured)|) over the points; consistent: the point in "
              "the measured interval widened 2x each way. Unresolved estimates (an interval open on one side) are "
              "bounds, never points: counted apart, consistent when they allow a value within 2x. Baselines: the "
              "workload's default batch size, and sqrt(B_min * B_max) of the unit's swept batch sizes; their rows "
              "count every scored unit, while a predictor's share counts only its points, so each predictor's row "
              "also gives both baselines on the units where it has a point (k/n within 2x, geometric error): the "
              "same-units comparison.")
