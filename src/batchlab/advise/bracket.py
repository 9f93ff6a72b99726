"""advise's "where to look": a first bracket of the critical batch size from the predictors.

Definition (docs/methods.md, "The first bracket of the critical batch size"). One reference run at the
tuned hyperparameters of advise's first study (batch size ``B``) is measured by
:func:`batchlab.probes.predict.predict`, restricted to two predictors:

* **B_simple** (``b_simple``; for :data:`batchlab.probes.reference.ADAM_LIKE` optimizers the Adam-metric
  variant ``b_simple_adam``, as ``batchlab predict`` reports it, falling back to the plain metric where it
  has no value) at the checkpoint ``steps_at`` (default: the protocol checkpoint
  :func:`batchlab.probes.predict.default_steps_at`), with its Fieller interval;
* the **branched** local critical batch size (:func:`batchlab.probes.branched.branched_critical_batch_size`,
  its default multipliers up to the largest batch that fits in memory) at the checkpoints
  ``steps_at // 4, steps_at // 2, steps_at`` (duplicates merged); its reading at ``steps_at`` is the
  predictor (the checkpoint its error was scored at), the others give ``branched_by_step`` and the
  batch-size warmup :func:`batchlab.probes.branched.warmup_schedule`.

Each reading is classified as a point, a bound or nothing (:func:`batchlab.probes.readings.classify`:
an interval open on one side is a bound) and **widened by that predictor's measured error factor** ``e``
(:data:`MEASURED_ERROR`): a point ``p`` gives ``[p / e, p x e]``, a lower bound ``L`` gives
``[L / e, inf)``, an upper bound ``U`` gives ``[0, U x e]``, no value gives nothing. The bracket is
the hull of the widened ranges (lowest low end, highest high end), intersected with the batch sizes
advise may measure that fit in memory, ``[smallest candidate, largest candidate <= largest_fitting]``,
and snapped outward to candidates (low: the largest candidate <= low; high: the smallest candidate >=
high). Without any reading: every fitting candidate (source ``"default"``).

**Compute** (``Bracket.examples``, training examples processed = optimizer updates x batch size):
the noise-scale reference run ``B x steps_at``, the noise-scale probe examples (one per-example
gradient each; twice for Adam-like optimizers, plain and Adam metric), and the branched measurement's
``examples_processed``: its own reference run ``B x steps_at`` (the branched estimate trains the same
reference run again: both are counted) plus every checkpoint's branches (the window's examples per
multiplier). Probe-loss evaluations (forward passes) are not counted. ``examples_parts`` keeps the
three terms.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from batchlab.errors import BatchlabError, checked_int, increasing_ints

__all__ = ["MEASURED_ERROR", "SOURCES", "Bracket", "bracket_from_readings", "given_bracket", "predictor_bracket",
           "snap_to_candidates", "widen"]

#: Each predictor's worst measured error factor max(ratio, 1 / ratio), ratio = predicted / measured
#: B_crit, over the point rows (``"kind": "point"``) of the scored units in
#: experiments/predictions/scores.jsonl (the committed scores of issue 21, measured by
#: ``OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE bash experiments/run_all.sh scores``):
#: b_simple's worst is mnist/fc_64_64_64/adam, ratio 0.1384 (1 / 0.1384338950384302);
#: branched's worst is the same unit, ratio 0.1795 (1 / 0.1794971750117555).
#: tests/advise/test_bracket.py recomputes both from that file. The Adam-metric B_simple uses b_simple's
#: factor (the larger; its own two scored points give 5.16).
MEASURED_ERROR = {"b_simple": 7.223664404749957, "branched": 5.571118319463851}

#: Where a bracket came from.
SOURCES = ("predictors", "given", "default")

_KINDS = ("point", "lower_bound", "upper_bound", "none")


def _finite(value: Any) -> float | None:
    """``float(value)`` if finite, else None (JSON-ready)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


# -------------------------------------------------------------------------------------------------------
# Result


@dataclass
class Bracket:
    """A first bracket ``[low, high]`` of the critical batch size (examples per batch), both candidates.

    ``source``: ``"predictors"``, ``"given"`` (``--bracket LO:HI``) or ``"default"`` (no predictor gave a
    value: every candidate that fits). ``predictors``: one dict per reading used, with ``name``,
    ``kind`` (``point``/``lower_bound``/``upper_bound``/``none``), ``value`` (the point or the bound, examples),
    ``low``/``high`` (its own interval; None: unbounded or absent), ``error_factor``,
    ``widened_low``/``widened_high`` (the widened range; ``widened_high`` None: unbounded; both None
    for ``none``), ``note``. ``reference``: the reference run (``batch_size``, ``hyperparameters``,
    ``steps_at``, ...). ``branched_by_step``: per branched checkpoint ``{step, examples (= step x
    batch_size), value, low, high}`` (``high`` None: every multiplier passed). ``warmup_schedule``:
    ``[[step, batch_size], ...]``. ``examples``: training examples the measurement processed (module
    docstring), ``examples_parts`` its terms. ``clipped_by``: what cut the widened range
    (``"memory: largest fitting batch N"``, ``"candidates"``, both joined by ``"; "``, or None).
    ``reason``: one line saying how the bracket was formed."""

    low: int
    high: int
    source: str
    predictors: list[dict] = field(default_factory=list)
    reference: dict = field(default_factory=dict)
    branched_by_step: list[dict] = field(default_factory=list)
    warmup_schedule: list[list[int]] = field(default_factory=list)
    examples: int = 0
    clipped_by: str | None = None
    reason: str = ""
    examples_parts: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (no infinities: an unbounded end is None)."""
        return {"low": int(self.low), "high": int(self.high), "source": self.source,
                "predictors": [dict(p) for p in self.predictors], "reference": dict(self.reference),
                "branched_by_step": [dict(b) for b in self.branched_by_step],
                "warmup_schedule": [[int(s), int(b)] for s, b in self.warmup_schedule],
                "examples": int(self.examples), "clipped_by": self.clipped_by, "reason": self.reason,
                "examples_parts": dict(self.examples_parts)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Bracket:
        """The inverse of :meth:`to_dict`."""
        return cls(low=int(data["low"]), high=int(data["high"]), source=str(data["source"]),
                   predictors=[dict(p) for p in data.get("predictors", [])], reference=dict(data.get("reference", {})),
                   branched_by_step=[dict(b) for b in data.get("branched_by_step", [])],
                   warmup_schedule=[[int(s), int(b)] for s, b in data.get("warmup_schedule", [])],
                   examples=int(data.get("examples", 0)), clipped_by=data.get("clipped_by"),
                   reason=str(data.get("reason", "")), examples_parts=dict(data.get("examples_parts", {})))

    def text(self) -> str:
        """One line: the bracket, where it came from, each reading widened, the clip and the compute."""
        words = f"B_crit bracket [{self.low}, {self.high}] ({self.source})"
        readings = [_reading_words(p) for p in self.predictors]
        if readings:
            words += ": " + "; ".join(readings)
        if self.clipped_by:
            words += f"; clipped by {self.clipped_by}"
        if self.source == "default" and self.reason:
            words += f"; {self.reason}"
        return words + f"; {self.examples:,} examples"


def _number(value: float) -> str:
    return f"{value:.3g}" if value < 1e4 else f"{value:.3e}"


def _reading_words(p: dict) -> str:
    kind, value = p.get("kind"), p.get("value")
    if kind == "none":
        return f"{p['name']} no value"
    shown = {"point": "", "lower_bound": ">= ", "upper_bound": "<= "}[kind] + _number(value)
    high = p.get("widened_high")
    widened = f"[{_number(p['widened_low'])}, {_number(high) + ']' if high is not None else 'inf)'}"
    return f"{p['name']} {shown} x/{p['error_factor']:.3g} -> {widened}"


# -------------------------------------------------------------------------------------------------------
# The arithmetic (pure functions)


def widen(kind: str, value: float | None, error_factor: float) -> tuple[float | None, float | None]:
    """The range a reading widened by its error factor ``e >= 1`` covers: ``point`` p -> ``(p / e, p x e)``,
    ``lower_bound`` L -> ``(L / e, inf)``, ``upper_bound`` U -> ``(0, U x e)``, ``none`` -> ``(None, None)``."""
    if kind not in _KINDS:
        raise BatchlabError(f"reading kind must be one of {', '.join(_KINDS)}, got {kind!r}")
    e = float(error_factor)
    if not (math.isfinite(e) and e >= 1):
        raise BatchlabError(f"error factor must be a finite number >= 1, got {error_factor!r}")
    if kind == "none":
        return None, None
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise BatchlabError(f"a {kind} reading needs a finite value > 0, got {value!r}")
    if kind == "point":
        return v / e, v * e
    if kind == "lower_bound":
        return v / e, math.inf
    return 0.0, v * e


def _fitting(candidates: Any, largest_fitting: Any) -> tuple[list[int], list[int], int | None]:
    """``(candidates, those <= largest_fitting, largest_fitting)`` validated (largest_fitting None: all fit)."""
    cands = increasing_ints("candidates", candidates, 1, item="batch size")
    limit = None if largest_fitting is None else checked_int("largest fitting batch", largest_fitting, 1)
    fitting = [c for c in cands if limit is None or c <= limit]
    if not fitting:
        raise BatchlabError(f"no candidate batch size fits in memory: the largest fitting batch is {limit}, the "
                            f"smallest candidate {cands[0]}")
    return cands, fitting, limit


def snap_to_candidates(low: float, high: float, candidates: Any,
                       largest_fitting: Any) -> tuple[int, int, str | None]:
    """``(low, high, clipped_by)``: ``[low, high]`` (``high`` may be ``inf``) intersected with
    ``[smallest candidate, largest candidate <= largest_fitting]`` and snapped outward to candidates
    (low -> the largest candidate <= low, high -> the smallest candidate >= high). ``clipped_by``:
    ``"memory: largest fitting batch N"`` when the high end was cut and candidates above it do not fit,
    ``"candidates"`` when an end lies outside the candidates' range, both joined by ``"; "``, or None.
    A range wholly outside the fitting candidates collapses onto the nearest one (low == high).
    ``candidates``: strictly increasing integers >= 1; ``largest_fitting``: an integer >= 1 or None."""
    cands, fitting, limit = _fitting(candidates, largest_fitting)
    lo_raw, hi_raw = float(low), float(high)
    if math.isnan(lo_raw) or math.isnan(hi_raw) or lo_raw > hi_raw:
        raise BatchlabError(f"a bracket needs low <= high, got [{low}, {high}]")
    causes = []
    if hi_raw > fitting[-1]:
        causes.append(f"memory: largest fitting batch {limit}" if len(fitting) < len(cands) else "candidates")
    if lo_raw < fitting[0]:
        causes.append("candidates")
    lo = min(max(lo_raw, fitting[0]), fitting[-1])
    hi = min(max(hi_raw, fitting[0]), fitting[-1])
    snapped_low = max(c for c in fitting if c <= lo)
    snapped_high = min(c for c in fitting if c >= hi)
    return snapped_low, snapped_high, "; ".join(dict.fromkeys(causes)) or None


def bracket_from_readings(readings: list[dict], candidates: Any, largest_fitting: Any, *,
                          reference: dict | None = None, branched_by_step: list[dict] | None = None,
                          warmup_schedule: list | None = None, examples: int = 0,
                          examples_parts: dict | None = None) -> Bracket:
    """The bracket of the module docstring from readings ``{"name", "kind", "value", "low", "high",
    "error_factor", "note"}`` (``value``: the point or the bound, examples). Each reading gets
    ``widened_low``/``widened_high`` (:func:`widen`; an unbounded end None); the hull of the widened
    ranges is snapped by :func:`snap_to_candidates`. No reading with a value: every fitting candidate,
    source ``"default"``, the readings' notes in ``reason``."""
    cands, fitting, limit = _fitting(candidates, largest_fitting)
    out, lows, highs = [], [], []
    for r in readings:
        lo, hi = widen(r["kind"], r.get("value"), r["error_factor"])
        out.append({"name": r["name"], "kind": r["kind"], "value": _finite(r.get("value")), "low": _finite(r.get("low")),
                    "high": _finite(r.get("high")), "error_factor": float(r["error_factor"]), "widened_low": _finite(lo),
                    "widened_high": _finite(hi), "note": str(r.get("note", ""))})
        if lo is not None:
            lows.append(lo)
            highs.append(hi)
    common = {"predictors": out, "reference": dict(reference or {}), "branched_by_step": list(branched_by_step or []),
              "warmup_schedule": [list(p) for p in (warmup_schedule or [])], "examples": int(examples),
              "examples_parts": dict(examples_parts or {})}
    if not lows:
        why = "; ".join(f"{r['name']}: {r['note'] or 'no value'}" for r in out) or "no predictor measured"
        clipped = f"memory: largest fitting batch {limit}" if len(fitting) < len(cands) else None
        return Bracket(low=fitting[0], high=fitting[-1], source="default", clipped_by=clipped,
                       reason=f"no predictor gave a value ({why}): every candidate that fits", **common)
    hull_low, hull_high = min(lows), max(highs)
    low, high, clipped = snap_to_candidates(hull_low, hull_high, cands, limit)
    hull = f"[{_number(hull_low)}, {_number(hull_high) + ']' if math.isfinite(hull_high) else 'inf)'}"
    reason = (f"hull of the readings widened by their measured error, {hull}, within the fitting candidates "
              f"[{fitting[0]}, {fitting[-1]}], snapped outward to [{low}, {high}]")
    if low == high:
        side = "above" if hull_low > fitting[-1] else "below" if hull_high < fitting[0] else "at"
        reason += f" (the widened range lies {side} the candidates that fit: one batch size)"
    return Bracket(low=low, high=high, source="predictors", clipped_by=clipped, reason=reason, **common)


# -------------------------------------------------------------------------------------------------------
# Given bracket


_GIVEN = re.compile(r"\s*(\d+)\s*:\s*(\d+)\s*")


def given_bracket(text: Any, candidates: Any, largest_fitting: Any) -> Bracket:
    """``--bracket LO:HI``: integers ``1 <= LO < HI``, snapped and clipped as :func:`snap_to_candidates`
    does; source ``"given"``, no compute (``examples`` 0).

    Raises:
        BatchlabError: one line for text that is not ``LO:HI`` with integers ``1 <= LO < HI``, bad
            candidates, or no candidate that fits.
    """
    match = _GIVEN.fullmatch(text) if isinstance(text, str) else None
    lo = hi = 0
    if match:
        lo, hi = int(match.group(1)), int(match.group(2))
    if not match or not 1 <= lo < hi:
        raise BatchlabError(f"--bracket must be LO:HI with integers 1 <= LO < HI, got {text!r}")
    low, high, clipped = snap_to_candidates(lo, hi, candidates, largest_fitting)
    return Bracket(low=low, high=high, source="given", clipped_by=clipped,
                   reason=f"given --bracket {lo}:{hi}, snapped outward to the candidates that fit: [{low}, {high}]")


# -------------------------------------------------------------------------------------------------------
# Measured bracket


def _reading(p: dict, error_factor: float, note: str = "") -> dict:
    """A predictor dict of :func:`batchlab.probes.predict.predict` as a reading (its protocol kind)."""
    from batchlab.probes.readings import classify

    estimate = classify(p["critical_batch_size"], p["low"], p["high"], bool(p["interval_method"]))
    return {"name": p["predictor"], "kind": estimate.kind, "value": estimate.value, "low": p["low"],
            "high": p["high"], "error_factor": error_factor,
            "note": "; ".join(x for x in (p.get("note") or "", note) if x)}


def predictor_bracket(workload: Any, optimizer: str, *, hyperparameters: dict, batch_size: int, candidates: Any,
                      largest_fitting: Any, steps_at: int | None = None, device: str = "auto", seed: int = 0,
                      train_examples: int | None = None, progress: Any = None) -> Bracket:
    """The first bracket of the critical batch size from the predictors (module docstring).

    ``workload``: what ``sweep`` accepts; ``optimizer``: a batchlab optimizer; ``hyperparameters``: the
    tuned reference (the best trial's of advise's first study, at ``batch_size``; ``learning_rate``
    absent: the optimizer's default); ``candidates``: the batch sizes advise may measure (strictly
    increasing); ``largest_fitting``: the largest batch that fits in memory (None: every candidate
    fits; branches at ``k x batch_size`` above it are not run); ``steps_at``: the checkpoint (updates of
    the reference run; default :func:`batchlab.probes.predict.default_steps_at`); ``train_examples``:
    the first ``n`` training examples only; ``progress(message)`` before each measurement.

    A measurement that fails with a BatchlabError (the reference run diverges before ``steps_at``, or
    refuses the hyperparameters) gives the ``"default"`` bracket with the error as reason; its compute is counted as the reference run's ``batch_size x
    steps_at`` (it may have stopped earlier).

    Raises:
        BatchlabError (one line), before anything trains: unknown workload or optimizer, bad candidates,
            ``batch_size`` not an integer in ``1..largest_fitting``, ``steps_at`` not an integer >= 0.
    """
    from batchlab.optim import optimizer_defaults
    from batchlab.probes.branched import DEFAULT_MULTIPLIERS
    from batchlab.probes.predict import default_steps_at, predict
    from batchlab.probes.reference import ADAM_LIKE
    from batchlab.workloads import resolve_workload

    w = resolve_workload(workload)
    defaults = optimizer_defaults(optimizer)
    cands, fitting, limit = _fitting(candidates, largest_fitting)
    batch = checked_int("reference batch size", batch_size, 1)
    if limit is not None and batch > limit:
        raise BatchlabError(f"the reference batch size {batch} does not fit in memory (largest fitting batch {limit})")
    step = default_steps_at(w) if steps_at is None else steps_at
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise BatchlabError(f"steps_at must be one integer >= 0 (the checkpoint's step), got {steps_at!r}")
    hp = dict(hyperparameters or {})
    learning_rate = float(hp.get("learning_rate") if hp.get("learning_rate") is not None else defaults["learning_rate"])
    hp["learning_rate"] = learning_rate
    branched_at = sorted({step // 4, step // 2, step})
    multipliers = [k for k in DEFAULT_MULTIPLIERS if limit is None or k * batch <= limit]
    adam = optimizer in ADAM_LIKE
    names = ("b_simple", "b_simple_adam", "branched") if adam else ("b_simple", "branched")
    probe_batch = None if 2 * batch <= 1024 else 512  # the noise scale needs two probe batches of 1024 examples
    reference = {"batch_size": batch, "hyperparameters": hp, "steps_at": step, "branched_at": branched_at,
                 "multipliers": multipliers, "seed": int(seed), "train_examples": train_examples,
                 "protocol_steps_at": default_steps_at(w)}
    try:
        result = predict(workload, optimizer, steps_at=step, batch_size=batch, learning_rate=learning_rate,
                         hyperparameters=hp, seed=seed, train_examples=train_examples, probe_batch_size=probe_batch,
                         device=device, progress=progress, only=names, branched_at=branched_at,
                         multipliers=multipliers)
    except BatchlabError as exc:
        spent = batch * step
        return Bracket(low=fitting[0], high=fitting[-1], source="default", reference=reference, examples=spent,
                       examples_parts={"reference_run": spent},
                       clipped_by=f"memory: largest fitting batch {limit}" if len(fitting) < len(cands) else None,
                       reason=f"the predictors' measurement failed ({exc}): every candidate that fits")
    by_name = {p["predictor"]: p for p in result["predictors"]}
    settings = result["settings"]
    reference.update({"probe_examples": settings["probe_examples"], "probe_batch_size": settings["probe_batch_size"],
                      "device": device})
    plain = _reading(by_name["b_simple"], MEASURED_ERROR["b_simple"])
    simple = plain
    if adam:
        simple = _reading(by_name["b_simple_adam"], MEASURED_ERROR["b_simple"])
        if simple["kind"] == "none" and plain["kind"] != "none":
            plain["note"] = "; ".join(x for x in (plain["note"], f"b_simple_adam: {simple['note'] or 'no value'}; "
                                                   "the plain metric instead") if x)
            simple = plain
    branched = by_name["branched"]
    readings = [simple, _reading(branched, MEASURED_ERROR["branched"])]

    ref_examples = int(settings["reference_examples"])
    noise_examples = max(int(by_name[n]["examples"]) for n in names if n != "branched"
                         and by_name[n]["examples"] is not None) - ref_examples
    branched_examples = branched["examples"]
    if branched_examples is None:  # failed: count its reference run in full (it may have stopped earlier)
        branched_examples = batch * branched_at[-1]
    parts = {"reference_run": ref_examples, "noise_scale_probes": noise_examples, "branched": int(branched_examples)}
    by_step = [{"step": int(c["step"]), "examples": int(c["step"]) * batch, "value": c["critical_batch_size"],
                "low": c["low"], "high": c["high"]} for c in branched.get("checkpoints", [])]
    return bracket_from_readings(readings, cands, limit, reference=reference, branched_by_step=by_step,
                                 warmup_schedule=branched.get("warmup_schedule", []), examples=sum(parts.values()),
                                 examples_parts=parts)
