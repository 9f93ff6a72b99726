"""The branched critical batch size: short branches at k·B from checkpoints of one reference run.

Definition (Merrill et al. 2025; docs/methods.md, "Probes", "Branched critical batch size"). A
reference run trains at batch size B with learning rate eta (its schedule included). At a checkpoint
after ``t`` updates, for each multiplier ``k`` of ``multipliers`` (strictly increasing integers >= 1;
``k = 1`` is always measured, it is the reference itself) a **branch** starts from the checkpoint's
model and optimizer state and trains at batch size ``k·B`` with the learning rate rescaled by ``rule``:

* ``linear``: ``eta·k`` (SGD-like optimizers);
* ``sqrt``: ``eta·sqrt(k)`` (Adam-like optimizers);
* ``tuned``: the best of ``eta·k^a`` for ``a`` in :data:`TUNED_EXPONENTS` (0, 1/4, 1/2, 3/4, 1: from no
  rescaling through the square-root rule to the linear rule), the lowest loss after the window wins;
  ``k = 1`` stays at ``eta``.

**Window, in examples.** Every branch processes the same number of training examples, ``window``
(default :data:`DEFAULT_WINDOW_STEPS` reference steps' worth, ``64·B``): the branch at ``k·B`` takes
``window // (k·B)`` updates (at least one, else a BatchlabError). With ``window`` a multiple of the
largest ``k·B`` (the default is, for the default multipliers) every branch sees exactly the same data.
**Data.** Branch update ``j`` at ``k·B`` takes the concatenation of the reference run's batches
``t + j·k, ..., t + j·k + k - 1`` (the run's own batch order, :class:`batchlab.train.sampling.BatchSampler`),
so all branches consume the same examples in the same order, and the ``k = 1`` branch **is** the
reference run continued: its parameters after the window are bitwise those of the reference run at step
``t + window // B`` (models that draw no random numbers while training; with dropout the branch draws
its own stream, seeded by ``(seed, t, k)``). The learning rate of branch update ``j`` is the rule's
factor times the reference schedule's rate at step ``t + j·k`` (the reference step where its examples
begin): a decaying schedule decays in examples, the same for every branch.

**Probe loss.** After the window each branch's live weights (not an EMA) are evaluated in eval mode
on fixed probe batches (:func:`batchlab.probes.reference.probe_batches`, the same for every branch and
checkpoint): the mean loss over the probe examples. ``ratio = loss_k / loss_1``; a branch **passes**
when its loss is finite and ``loss_k <= (1 + tolerance)·loss_1`` (default ``tolerance`` 0.01: 1% worse
than the reference).

**Local critical batch size** at the checkpoint: the largest ``k·B`` such that it and every smaller
multiplier pass (a pass after a failure is counted as noise and does not extend it). **Interval**,
method ``"bracket"`` (the default): ``[critical, first failing k·B)`` between the last passing and the
first failing multiplier (``high`` is ``None`` when every multiplier passes: then the critical batch
size is at least the largest ``k·B``); its resolution is the spacing of the multipliers (a factor 2 by
default). Method ``"seed_spread"`` (``noise_repeats = n >= 1``): the reference branch is repeated with
``n`` other batch orders (independent draws of the window's examples, each its own
:class:`batchlab.train.sampling.BatchSampler` seed), ``sigma`` is the sample standard deviation (ddof 1)
of the ``n + 1`` reference losses, and a branch *clearly passes* when ``loss_k <= (1 + tolerance)·loss_1
- 2·sigma`` and *clearly fails* when ``loss_k > (1 + tolerance)·loss_1 + 2·sigma``; ``low`` is the
largest ``k·B`` up to which every multiplier clearly passes (at least ``B``) and ``high`` the first
``k·B`` that clearly fails (``None``: none does). These are the batch sizes consistent with the
measurement given the data-order noise; with ``sigma = 0`` it is the bracket.

**Warmup suggestion** (:func:`warmup_schedule`): a piecewise-constant batch size that from each
checkpoint step on uses the running maximum of the local critical batch sizes so far (non-decreasing,
so it is capped at the largest measured value once that is reached).

**Cost** (:attr:`BranchedResult.examples_processed`): the reference run's ``B·t_last`` examples plus,
per checkpoint, ``window`` examples per branch (times the number of tuned factors for ``k > 1`` with
``rule="tuned"``) and ``window`` per repeated reference branch, plus the probe evaluations' forward
passes (not counted).

**Resumable, parallel.** With ``out`` each finished branch's loss goes into ``out/branched.json``
(written atomically by :mod:`batchlab.atomic`, after every branch), keyed by checkpoint step,
multiplier and learning-rate factor, beside the settings that define the branches; a rerun with the
same settings loads it and recomputes nothing that is there (and trains the reference run only up to
the last checkpoint with a missing branch); different settings are refused. ``workers > 1`` runs the
branches of a checkpoint in a pool of spawned processes (each rebuilds the model from the workload and
the checkpoint's state dicts, as ``sweep`` workers do); results do not depend on ``workers``.

The same measurement on the checkpoints of a run batchlab did not train (an adapter instead of a
workload) is :mod:`batchlab.integrations.branched`, which reuses :func:`_summarize` and :class:`_Cache`.

Optimizers whose state lives outside ``optimizer.state_dict()`` (K-FAC's curvature factors) restart
it in each branch. :func:`branched_on_nqm` is the same measurement on the exact noisy quadratic model
(expected losses, no noise), where the answer is known.
"""

from __future__ import annotations

import copy
import json
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from batchlab.errors import BatchlabError, increasing_ints, unknown_name_error

__all__ = ["DEFAULT_MULTIPLIERS", "DEFAULT_TOLERANCE", "DEFAULT_WINDOW_STEPS", "RULES", "TUNED_EXPONENTS", "Branch",
           "BranchedCheckpoint", "BranchedResult", "branched_critical_batch_size", "branched_on_nqm",
           "check_multipliers", "checked_settings", "learning_rate_factors", "warmup_schedule"]

RULES = ("linear", "sqrt", "tuned")
DEFAULT_MULTIPLIERS = (1, 2, 4, 8, 16, 32)
#: The default window: this many reference steps' worth of examples (``64·B``).
DEFAULT_WINDOW_STEPS = 64
DEFAULT_TOLERANCE = 0.01
#: ``rule="tuned"`` tries the learning rates ``eta·k^a`` for these exponents ``a``.
TUNED_EXPONENTS = (0.0, 0.25, 0.5, 0.75, 1.0)
#: The cache file under ``out``.
CACHE_NAME = "branched.json"
CACHE_VERSION = 1


# ---------------------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class Branch:
    """One multiplier's branch at one checkpoint.

    ``batch_size = k·B``; ``steps`` updates over ``examples = steps·k·B`` examples; ``factor``: the
    learning-rate factor used (for ``tuned``, the best one) and ``learning_rate`` the checkpoint's rate
    times it; ``loss``: the probe loss after the window (``inf`` when it diverged); ``ratio``:
    ``loss / reference loss``; ``passed``: ``loss <= (1 + tolerance)·reference loss``; ``tried``:
    ``{factor: loss}`` of every factor run (one entry unless ``tuned``)."""

    multiplier: int
    batch_size: int
    steps: int
    examples: int
    factor: float
    learning_rate: float
    loss: float
    ratio: float
    passed: bool
    tried: dict[float, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"multiplier": self.multiplier, "batch_size": self.batch_size, "steps": self.steps,
                "examples": self.examples, "factor": self.factor, "learning_rate": self.learning_rate,
                "loss": _json_float(self.loss), "ratio": _json_float(self.ratio), "passed": self.passed,
                "tried": [{"factor": f, "loss": _json_float(v)} for f, v in self.tried.items()]}


@dataclass(frozen=True)
class BranchedCheckpoint:
    """The measurement at one checkpoint: ``reference_loss`` (the ``k = 1`` branch's probe loss after the
    window), ``branches`` (one per multiplier, increasing), ``critical_batch_size`` (examples; module
    docstring) and its interval ``low``/``high`` (``high`` ``None``: unbounded above) by ``method``
    (``"bracket"`` or ``"seed_spread"``); ``reference_repeats``: the repeated reference branches' losses
    (other batch orders) and ``reference_sigma`` the standard deviation of all reference losses (``None``
    without repeats)."""

    step: int
    learning_rate: float
    reference_loss: float
    branches: list[Branch]
    critical_batch_size: int
    low: int
    high: int | None
    method: str = "bracket"
    reference_repeats: list[float] = field(default_factory=list)
    reference_sigma: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "learning_rate": self.learning_rate, "reference_loss": _json_float(self.reference_loss),
                "critical_batch_size": self.critical_batch_size,
                "interval": {"low": self.low, "high": self.high, "method": self.method},
                "reference_repeats": [_json_float(v) for v in self.reference_repeats],
                "reference_sigma": None if self.reference_sigma is None else _json_float(self.reference_sigma),
                "branches": [b.to_dict() for b in self.branches]}


@dataclass(frozen=True)
class BranchedResult:
    """Every checkpoint's measurement (step order) and the settings that define it.

    ``settings``: batch size ``B``, ``multipliers``, ``rule``, ``window`` (examples), ``tolerance`` and,
    for a real model, the reference run's and the probes' settings; ``examples_processed``: training
    examples the measurement processed (module docstring, "Cost"); ``computed``: branches computed by this
    call (the rest came from the cache)."""

    checkpoints: list[BranchedCheckpoint]
    settings: dict[str, Any]
    examples_processed: int
    computed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoints": [c.to_dict() for c in self.checkpoints], "settings": dict(self.settings),
                "examples_processed": self.examples_processed, "computed": self.computed,
                "warmup_schedule": [list(p) for p in warmup_schedule(self)]}


def _json_float(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def warmup_schedule(result: BranchedResult) -> list[tuple[int, int]]:
    """A batch-size warmup from the local critical batch sizes: ``[(step, batch_size), ...]``, meaning
    batch size ``batch_size`` from ``step`` (updates of the reference run) until the next entry's step.

    The batch size from each checkpoint on is the running maximum of the critical batch sizes measured
    so far (non-decreasing, capped at the largest value); consecutive equal entries are merged and the
    first entry starts at the first checkpoint's step."""
    schedule: list[tuple[int, int]] = []
    best = 0
    for point in result.checkpoints:
        best = max(best, int(point.critical_batch_size))
        if not schedule or schedule[-1][1] != best:
            schedule.append((int(point.step), best))
    return schedule


# ---------------------------------------------------------------------------------------------------------
# Validation and the arithmetic shared by the NQM and real-model paths


def check_multipliers(multipliers: Any) -> list[int]:
    """``multipliers`` as strictly increasing integers >= 1, with 1 (the reference) prepended when absent."""
    values = increasing_ints("multipliers", multipliers, 1)
    return values if values[0] == 1 else [1, *values]


def _check_rule(rule: Any) -> str:
    if rule not in RULES:
        raise unknown_name_error("learning-rate rule", str(rule), RULES)
    return str(rule)


def _check_tolerance(tolerance: Any) -> float:
    try:
        value = float(tolerance)
    except (TypeError, ValueError):
        raise BatchlabError(f"tolerance must be a number >= 0 (relative, 0.01 = 1%), got {tolerance!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise BatchlabError(f"tolerance must be a number >= 0 (relative, 0.01 = 1%), got {tolerance!r}")
    return value


def _check_window(window: Any, batch_size: int, multipliers: list[int]) -> int:
    """The window in examples (default ``DEFAULT_WINDOW_STEPS·B``); every branch must take >= 1 update."""
    if window is None:
        return DEFAULT_WINDOW_STEPS * batch_size
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise BatchlabError(f"window must be an integer >= 1 (training examples per branch), got {window!r}")
    largest = multipliers[-1] * batch_size
    if window < largest:
        raise BatchlabError(f"window {window} examples is less than one update at the largest batch size "
                            f"{largest} ({multipliers[-1]}·{batch_size}); use a window >= {largest}")
    return int(window)


def _check_batch_size(batch_size: Any) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise BatchlabError(f"batch size must be an integer >= 1, got {batch_size!r}")
    return int(batch_size)


def checked_settings(batch_size: Any, multipliers: Any, rule: Any, tolerance: Any, window: Any,
                     workers: Any) -> tuple[int, list[int], str, float, int]:
    """The settings every branched measurement shares, checked: ``(batch_size, multipliers, rule,
    tolerance, window)`` (the window in examples, its default filled in); ``workers`` must be an
    integer >= 1. Each bad value is a one-line :class:`BatchlabError`."""
    batch = _check_batch_size(batch_size)
    ks = check_multipliers(multipliers)
    checked_rule = _check_rule(rule)
    tol = _check_tolerance(tolerance)
    size = _check_window(window, batch, ks)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise BatchlabError(f"workers must be an integer >= 1, got {workers!r}")
    return batch, ks, checked_rule, tol, size


def learning_rate_factors(multiplier: int, rule: str) -> list[float]:
    """The learning-rate factors a branch at ``multiplier`` tries: ``[k]`` (linear), ``[sqrt(k)]``
    (sqrt), ``[k^a for a in TUNED_EXPONENTS]`` (tuned; ``[1.0]`` at ``k = 1``)."""
    k = int(multiplier)
    if k == 1:
        return [1.0]
    if rule == "linear":
        return [float(k)]
    if rule == "sqrt":
        return [math.sqrt(k)]
    return [float(k) ** a for a in TUNED_EXPONENTS]


def _summarize(step: int, learning_rate: float, batch_size: int, multipliers: list[int], window: int,
               tolerance: float, losses: dict[tuple[int, float], float],
               repeats: Sequence[float] = ()) -> BranchedCheckpoint:
    """One checkpoint's :class:`BranchedCheckpoint` from ``{(k, factor): loss}`` and the repeated
    reference losses (module docstring, "Interval")."""
    reference = losses[(1, 1.0)]
    if not (math.isfinite(reference) and reference > 0):
        # every ratio would be 0 or undefined: no tolerance can be read against a diverged reference
        raise BatchlabError(f"the reference branch (k = 1, B = {batch_size}) at step {step} ended with probe loss "
                            f"{reference:g} (diverged) at learning rate {learning_rate:g}: no local critical batch size "
                            "there; use a smaller learning rate or an earlier checkpoint")
    branches, critical, high, failed = [], batch_size, None, False
    for k in multipliers:
        tried = {f: v for (kk, f), v in losses.items() if kk == k}
        finite = {f: v for f, v in tried.items() if math.isfinite(v)}
        factor = min(finite, key=lambda f: (finite[f], f)) if finite else max(tried)
        loss = tried[factor] if math.isfinite(tried[factor]) else math.inf
        ratio = loss / reference if reference > 0 and math.isfinite(loss) else math.inf
        passed = bool(math.isfinite(loss) and loss <= (1.0 + tolerance) * reference)
        steps = window // (k * batch_size)
        branches.append(Branch(multiplier=k, batch_size=k * batch_size, steps=steps, examples=steps * k * batch_size,
                               factor=float(factor), learning_rate=float(learning_rate) * float(factor), loss=float(loss),
                               ratio=float(ratio), passed=passed, tried=dict(sorted(tried.items()))))
        if not failed:
            if passed:
                critical = k * batch_size
            else:
                failed, high = True, k * batch_size
    if not repeats:
        return BranchedCheckpoint(step=int(step), learning_rate=float(learning_rate), reference_loss=float(reference),
                                  branches=branches, critical_batch_size=int(critical), low=int(critical), high=high)
    values = np.array([reference, *repeats], dtype=float)
    sigma = float(np.std(values, ddof=1)) if np.all(np.isfinite(values)) else math.inf
    threshold = (1.0 + tolerance) * reference
    low, high, blocked = batch_size, None, False
    for b in branches[1:]:
        if not blocked and b.loss <= threshold - 2.0 * sigma:
            low = b.batch_size
        else:
            blocked = True
        if high is None and b.loss > threshold + 2.0 * sigma:
            high = b.batch_size
    return BranchedCheckpoint(step=int(step), learning_rate=float(learning_rate), reference_loss=float(reference),
                              branches=branches, critical_batch_size=int(critical), low=int(low), high=high,
                              method="seed_spread", reference_repeats=[float(v) for v in repeats],
                              reference_sigma=sigma)


def _branch_examples(multipliers: list[int], rule: str, window: int, batch_size: int) -> int:
    """Training examples the branches of one checkpoint process."""
    return sum(len(learning_rate_factors(k, rule)) * (window // (k * batch_size)) * k * batch_size for k in multipliers)


# ---------------------------------------------------------------------------------------------------------
# The exact NQM


def branched_on_nqm(problem: Any, learning_rate: float, batch_size: int, checkpoints_at: Sequence[int], *,
                    multipliers: Sequence[int] = DEFAULT_MULTIPLIERS, rule: str = "linear", window: int | None = None,
                    tolerance: float = DEFAULT_TOLERANCE, optimizer: str = "sgd", precondition: float = 0.0,
                    momentum: float | None = None) -> BranchedResult:
    """The branched measurement on the exact NQM (:mod:`batchlab.nqm`): expected losses, no sampling noise.

    The reference run is ``optimizer`` (an NQM algorithm: ``sgd``, ``momentum``, ...; ``precondition``
    the power ``p`` of ``H^-p``) at constant ``learning_rate`` and ``batch_size`` from the problem's
    initial second moments. Its state at each checkpoint (the second moments of ``(x, v, ...)`` after
    ``t`` updates) is advanced exactly (:func:`batchlab.nqm.dynamics.map_power`) by ``window // (k·B)``
    updates at batch size ``k·B`` and learning rate ``learning_rate·factor``; the probe loss is the
    expected loss ``1/2 sum h E[x^2]`` there. Everything else (window, rule, tolerance, critical batch
    size, bracket) is as in the module docstring. ``examples_processed`` counts the reference run's
    ``B·t_last`` examples and the branches'.
    """
    from batchlab.nqm.dynamics import Algorithm, apply, map_power, moment_recurrence

    batch = _check_batch_size(batch_size)
    ks = check_multipliers(multipliers)
    rule = _check_rule(rule)
    tol = _check_tolerance(tolerance)
    size = _check_window(window, batch, ks)
    from batchlab.probes.reference import check_steps_at

    steps_at = check_steps_at(checkpoints_at)
    algorithm = Algorithm(optimizer, precondition)

    def recurrence(lr: float):
        return moment_recurrence(problem, algorithm, lr, momentum=momentum)

    reference = recurrence(float(learning_rate))
    u = reference.initial_state(1)
    t = 0
    points = []
    for step in steps_at:
        u = apply(*map_power(reference, step - t), u, 1.0 / batch)
        t = step
        losses: dict[tuple[int, float], float] = {}
        for k in ks:
            n = size // (k * batch)
            for factor in learning_rate_factors(k, rule):
                rec = reference if factor == 1.0 else recurrence(float(learning_rate) * factor)
                with np.errstate(over="ignore", invalid="ignore"):
                    after = apply(*map_power(rec, n), u, 1.0 / (k * batch))
                    value = float(rec.loss(after)[0, 0])
                losses[(k, float(factor))] = value if math.isfinite(value) else math.inf
        points.append(_summarize(step, float(learning_rate), batch, ks, size, tol, losses))
    settings = {"problem": getattr(problem, "name", "custom"), "optimizer": optimizer, "precondition": float(precondition),
                "momentum": momentum, "learning_rate": float(learning_rate), "batch_size": batch, "multipliers": ks,
                "rule": rule, "window": size, "tolerance": tol, "checkpoints_at": steps_at}
    examples = batch * steps_at[-1] + len(steps_at) * _branch_examples(ks, rule, size, batch)
    return BranchedResult(points, settings, examples, computed=len(steps_at) * sum(len(learning_rate_factors(k, rule))
                                                                                  for k in ks))


# ---------------------------------------------------------------------------------------------------------
# Real models


@dataclass(frozen=True)
class _Context:
    """What a branch needs besides the checkpoint (picklable, for worker processes)."""

    workload: Any  # a reference string, or a resolved workload (in-process only)
    optimizer: str
    batch_size: int
    hyperparameters: dict
    total_steps: int
    seed: int
    data_seed: int
    train_examples: int | None
    probe_examples: int
    probe_batch_size: int
    probe_seed: int
    device: str

    def key(self) -> tuple:
        return (str(getattr(self.workload, "name", self.workload)), id(self.workload) if not isinstance(self.workload, str)
                else 0, self.optimizer, self.batch_size, json.dumps(self.hyperparameters, sort_keys=True, default=str),
                self.total_steps, self.seed, self.data_seed, self.train_examples, self.probe_examples,
                self.probe_batch_size, self.probe_seed, self.device)


@dataclass(frozen=True)
class _Task:
    """One branch: from checkpoint ``step`` (its model and optimizer state dicts), ``multiplier`` k,
    learning-rate ``factor``, ``steps`` updates; ``order`` 0: the reference run's batch order, ``r >= 1``:
    the ``r``-th repeat's own order (:func:`_repeat_seed`)."""

    context: _Context
    step: int
    multiplier: int
    factor: float
    steps: int
    model_state: dict
    optimizer_state: dict
    order: int = 0


#: Per-process cache of the loaded workload, data, batch order and probe batches (two most recent).
_PREPARED: OrderedDict = OrderedDict()


def _prepared(context: _Context) -> dict:
    key = context.key()
    hit = _PREPARED.get(key)
    if hit is not None:
        _PREPARED.move_to_end(key)
        return hit
    from batchlab.probes.reference import probe_batches
    from batchlab.train.core import batch_source, device_split
    from batchlab.train.device import resolve_device
    from batchlab.train.sampling import BatchSampler
    from batchlab.train.trial import _load_data
    from batchlab.workloads import resolve_workload

    workload = resolve_workload(context.workload)
    device = resolve_device(context.device)
    data = _load_data(workload, context.train_examples, context.data_seed, device)
    label_smoothing = float(context.hyperparameters.get("label_smoothing") or 0.0)
    probes = probe_batches(workload, context.probe_examples, context.probe_batch_size, context.probe_seed,
                           train_examples=context.train_examples, data_seed=context.data_seed,
                           label_smoothing=label_smoothing, device=device)
    from batchlab.train.trial import TrialSpec, order_seed

    spec = TrialSpec(workload=workload, optimizer=context.optimizer, batch_size=context.batch_size,
                     hyperparameters=dict(context.hyperparameters), seed=context.seed, data_seed=context.data_seed)
    hit = {"workload": workload, "device": device, "probes": probes,
           "batch": batch_source(device_split(data.train, device), device),
           "sampler": BatchSampler(int(data.num_train), context.batch_size, order_seed(spec)),
           "num_train": int(data.num_train), "order_seed": order_seed(spec)}
    _PREPARED[key] = hit
    while len(_PREPARED) > 2:
        _PREPARED.popitem(last=False)
    return hit


def probe_loss(model: Any, probes: Any) -> float:
    """The mean probe loss of ``model`` (eval mode, no gradients; the model's mode is restored):
    the example-weighted mean of the probe batches' mean losses, as a float (``inf`` if not finite)."""
    import torch

    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        with torch.no_grad():
            for x, y in probes:
                n = int(y.shape[0])
                total += float(probes.loss_fn(model(x), y)) * n
                count += n
    finally:
        model.train(was_training)
    value = total / max(count, 1)
    return value if math.isfinite(value) else math.inf


def _schedule_multiplier(hyperparameters: dict, total_steps: int):
    """The reference schedule's multiplier as :class:`batchlab.optim.algorithm.TrainingAlgorithm` builds it."""
    from batchlab.optim.schedules import multiplier_function

    h = hyperparameters
    decay = h.get("learning_rate_decay_steps")
    if decay is None and h.get("end_learning_rate_factor") is not None:
        decay = total_steps
    return multiplier_function(decay, h.get("end_learning_rate_factor") or 0.0, h.get("warmup_steps") or 0)


def _run_branch(task: _Task) -> float:
    """Train one branch (module docstring) and return its probe loss (``inf`` if it diverged)."""
    import torch

    from batchlab.optim import build_training_algorithm, resolve_hyperparameters
    from batchlab.train.device import fork_rng

    context = task.context
    ready = _prepared(context)
    workload, device, sampler, batch = ready["workload"], ready["device"], ready["sampler"], ready["batch"]
    if task.order:
        from batchlab.train.sampling import BatchSampler

        sampler = BatchSampler(ready["num_train"], context.batch_size, _repeat_seed(ready["order_seed"], task.order))
    model = workload.build_model(seed=context.seed)
    if device.type != "cpu":
        model = model.to(device)
    model.load_state_dict(task.model_state)
    model.train()
    label_smoothing = float(context.hyperparameters.get("label_smoothing") or 0.0)

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return workload.loss(outputs, targets, label_smoothing=label_smoothing)

    algorithm = build_training_algorithm(context.optimizer, model, loss_fn, hyperparameters=dict(context.hyperparameters),
                                         total_steps=context.total_steps)
    algorithm.optimizer.load_state_dict(copy.deepcopy(task.optimizer_state))
    multiplier = _schedule_multiplier(resolve_hyperparameters(context.optimizer, dict(context.hyperparameters)),
                                      context.total_steps)
    groups = algorithm.optimizer.param_groups
    base = [g.get("initial_lr", g["lr"]) if multiplier is not None else g["lr"] for g in groups]
    k, t = task.multiplier, task.step
    with fork_rng(device):
        torch.manual_seed(int(np.random.SeedSequence([context.seed, t, k]).generate_state(1)[0]))
        for j in range(task.steps):
            start = t + j * k
            for group, rate in zip(groups, base):
                # factor * (rate * m(s)): for factor 1 the very float LambdaLR gives the reference run
                group["lr"] = task.factor * (rate * multiplier(start) if multiplier is not None else rate)
            indices = sampler.indices(start) if k == 1 else torch.cat([sampler.indices(start + i) for i in range(k)])
            loss = algorithm.step(*batch(indices))
            if not math.isfinite(loss):
                return math.inf
    return probe_loss(model, ready["probes"])


#: The stream of the repeats' batch orders: ``SeedSequence([order seed, r, REPEAT_STREAM])`` ("repeat").
REPEAT_STREAM = 0x726570656174


def _repeat_seed(order_seed: int, repeat: int) -> int:
    """The batch-order seed of the ``repeat``-th repeated reference branch (independent of the run's)."""
    return int(np.random.SeedSequence([int(order_seed), int(repeat), REPEAT_STREAM]).generate_state(1)[0] >> 1)


def _branch_key(step: int, k: int, factor: float, order: int = 0) -> str:
    key = f"{int(step)}/{int(k)}/{float(factor)!r}"
    return key if not order else f"{key}/repeat{int(order)}"


class _Cache:
    """``out/branched.json``: ``{"version", "settings", "branches": {"step/k/factor": loss or null (diverged)},
    "learning_rates": {"step": rate}}``, rewritten atomically after every branch; plus ``"checkpoints":
    {"step": {...}}`` when :attr:`checkpoints` is not empty (the checkpoint files' identities of
    :mod:`batchlab.integrations.branched`; never written by :func:`branched_critical_batch_size`).

    ``mismatch``: the end of the error for a file of another measurement (what differs, in the caller's
    terms); the default names the workload path's settings."""

    def __init__(self, out: str | Path | None, settings: dict, mismatch: str | None = None) -> None:
        self.path = None if out is None else Path(out) / CACHE_NAME
        self.settings = json.loads(json.dumps(settings, default=str))
        self.branches: dict[str, float | None] = {}
        self.learning_rates: dict[str, float] = {}
        self.checkpoints: dict[str, Any] = {}
        if self.path is None:
            return
        if self.path.parent.exists() and not self.path.parent.is_dir():
            raise BatchlabError(f"--out {str(self.path.parent)!r} is a file, not a directory")
        if self.path.exists():
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise BatchlabError(f"cannot read the branch cache {str(self.path)!r}: {exc}") from None
            if data.get("version") != CACHE_VERSION or data.get("settings") != self.settings:
                raise BatchlabError(f"{str(self.path)!r} holds branches of a different measurement ("
                                    + (mismatch or "other reference run, window or probe settings")
                                    + "); use another --out directory")
            self.branches = dict(data.get("branches", {}))
            self.learning_rates = dict(data.get("learning_rates", {}))
            self.checkpoints = dict(data.get("checkpoints", {}))

    def get(self, step: int, k: int, factor: float, order: int = 0) -> float | None:
        key = _branch_key(step, k, factor, order)
        if key not in self.branches:
            return None
        value = self.branches[key]
        return math.inf if value is None else float(value)

    def put(self, step: int, k: int, factor: float, loss: float, learning_rate: float, order: int = 0) -> None:
        self.branches[_branch_key(step, k, factor, order)] = _json_float(loss)
        self.learning_rates[str(int(step))] = float(learning_rate)
        self.save()

    def save(self) -> None:
        """Rewrite the file (atomically) with everything held now; nothing without ``out``."""
        if self.path is None:
            return
        from batchlab.atomic import write_stream_atomic

        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {"version": CACHE_VERSION, "settings": self.settings, "branches": self.branches,
                "learning_rates": self.learning_rates}
        if self.checkpoints:
            data["checkpoints"] = self.checkpoints
        payload = json.dumps(data, indent=1, sort_keys=True).encode()
        write_stream_atomic(self.path, lambda handle: handle.write(payload), durable=False)


def branched_critical_batch_size(workload: Any, optimizer: str, batch_size: int, hyperparameters: dict[str, Any],
                                 checkpoints_at: Sequence[int], multipliers: Sequence[int] = DEFAULT_MULTIPLIERS,
                                 rule: str = "linear", window: int | None = None,
                                 tolerance: float = DEFAULT_TOLERANCE, seed: int = 0, *,
                                 train_examples: int | None = None, steps: int | None = None,
                                 probe_examples: int | None = None, probe_batch_size: int | None = None,
                                 device: str = "auto", out: str | Path | None = None, workers: int = 1,
                                 noise_repeats: int = 0, progress: Any = None) -> BranchedResult:
    """The branched critical batch size at each step of ``checkpoints_at`` of one reference run
    (module docstring).

    The reference run is :func:`batchlab.probes.reference.reference_checkpoints`' (``workload``,
    ``optimizer``, ``batch_size``, ``hyperparameters``, ``seed``, ``train_examples``, ``steps`` budget,
    ``device``); probe batches: ``probe_examples`` (default ``min(1024, training examples)``) training
    examples in batches of ``probe_batch_size`` (default ``batch_size``), seed ``seed``. ``out``: a
    directory for the resumable branch cache; ``workers``: processes running branches (needs ``workload``
    as a reference string when > 1); ``noise_repeats``: repeated reference branches with other batch
    orders for the ``"seed_spread"`` interval (0: the bracket); ``progress(step, k, factor, loss)``:
    called after each computed branch (a repeat reports ``k = 1`` and its factor 1).

    Raises:
        BatchlabError: multipliers not strictly increasing integers >= 1, an unknown rule, a window < 1 or
            shorter than one update at the largest ``k·B``, a negative tolerance, ``workers`` < 1, a
            cache of another measurement in ``out``, and whatever the reference run refuses (including
            a largest ``k·B`` above the training examples).
    """
    from batchlab.probes.reference import reference_checkpoints

    batch, ks, rule, tol, size = checked_settings(batch_size, multipliers, rule, tolerance, window, workers)
    if isinstance(noise_repeats, bool) or not isinstance(noise_repeats, int) or noise_repeats < 0:
        raise BatchlabError(f"noise repeats must be an integer >= 0 (0: the bracket interval), got {noise_repeats!r}")
    checkpoints = reference_checkpoints(workload, optimizer, batch, hyperparameters, checkpoints_at, seed=seed,
                                        train_examples=train_examples, steps=steps, device=device)
    run, num_train = checkpoints.run, checkpoints.num_train
    if ks[-1] * batch > num_train:
        raise BatchlabError(f"the largest branch batch size {ks[-1]}·{batch} = {ks[-1] * batch} exceeds the "
                            f"{num_train} training examples; use smaller multipliers")
    examples = min(1024, num_train) if probe_examples is None else probe_examples
    per_batch = batch if probe_batch_size is None else probe_batch_size
    reference_name = workload if isinstance(workload, str) else run.workload
    if workers > 1 and not isinstance(workload, str):
        raise BatchlabError("workers > 1 needs the workload as a reference string (name, module:function or "
                            "file.py:function), which worker processes resolve again")
    context = _Context(workload=workload if isinstance(workload, str) or workers == 1 else reference_name,
                       optimizer=run.optimizer, batch_size=batch, hyperparameters=dict(run.hyperparameters),
                       total_steps=run.steps, seed=run.seed, data_seed=run.data_seed, train_examples=train_examples,
                       probe_examples=int(examples), probe_batch_size=int(per_batch), probe_seed=int(seed),
                       device=run.device)
    _prepared(context)  # validates the probe settings before anything trains
    settings = {**run.to_dict(), "workload": run.workload, "window": size, "probe_examples": int(examples),
                "probe_batch_size": int(per_batch), "probe_seed": int(seed)}
    cache = _Cache(out, settings)
    wanted = {s: [(k, f, 0) for k in ks for f in learning_rate_factors(k, rule)]
              + [(1, 1.0, r) for r in range(1, noise_repeats + 1)] for s in checkpoints.steps_at}
    missing = {s: [(k, f, r) for k, f, r in items if cache.get(s, k, f, r) is None] for s, items in wanted.items()}
    computed = 0
    pool = None
    try:
        if workers > 1 and any(missing.values()):
            import concurrent.futures as cf
            import multiprocessing

            pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
        last_needed = max((s for s, m in missing.items() if m), default=None)
        if last_needed is not None:
            for checkpoint in checkpoints:
                todo = missing[checkpoint.step]
                if todo:
                    model_state = {n: v.detach().cpu().clone() for n, v in checkpoint.model.state_dict().items()}
                    tasks = [_Task(context, checkpoint.step, k, f, size // (k * batch), model_state,
                                   checkpoint.optimizer_state, r) for k, f, r in todo]
                    results = pool.map(_run_branch, tasks) if pool is not None else map(_run_branch, tasks)
                    for task, loss in zip(tasks, results):
                        cache.put(task.step, task.multiplier, task.factor, loss, checkpoint.learning_rate, task.order)
                        computed += 1
                        if progress is not None:
                            progress(task.step, task.multiplier, task.factor, loss)
                else:
                    cache.learning_rates.setdefault(str(checkpoint.step), float(checkpoint.learning_rate))
                if checkpoint.step >= last_needed:
                    break
    finally:
        if pool is not None:
            pool.shutdown()
    points = []
    for s, items in wanted.items():
        losses = {(k, f): cache.get(s, k, f) for k, f, r in items if not r}
        repeats = [cache.get(s, 1, 1.0, r) for k, f, r in items if r]
        rate = cache.learning_rates.get(str(s), float("nan"))
        points.append(_summarize(s, rate, batch, ks, size, tol, losses, repeats))
    settings.update({"multipliers": ks, "rule": rule, "tolerance": tol, "checkpoints_at": list(checkpoints.steps_at),
                     "workers": workers, "noise_repeats": noise_repeats})
    total = batch * checkpoints.steps_at[-1] + len(points) * (_branch_examples(ks, rule, size, batch)
                                                             + noise_repeats * (size // batch) * batch)
    return BranchedResult(points, settings, int(total), computed=computed)
