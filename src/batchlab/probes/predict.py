"""Every predictor's critical batch size for one workload and optimizer, beside the measured one.

:func:`predict` trains one reference run (:func:`batchlab.probes.reference.reference_checkpoints`, the
run ``batchlab train`` makes with the same settings; with a store, at the tuned hyperparameters of the
measured batch size nearest the reference batch size, :func:`tuned_reference`, the scoring protocol of
:mod:`batchlab.probes.scoring`) to the checkpoint ``steps_at`` (default: the protocol checkpoint, a
quarter of the workload's default step budget, :func:`default_steps_at`) and measures there, on fixed probe
batches of training examples (:func:`batchlab.probes.reference.probe_batches`):

* ``b_simple``: B_simple = tr(Sigma) / |G|^2 (:func:`batchlab.probes.noise_scale.noise_scale`,
  per-example gradients, Fieller interval);
* ``b_simple_adam``: B_simple in Adam's preconditioned metric (adam/adamw after step 0 only);
* ``b_noise``: B_noise = tr(H Sigma) / (G^T H G), Hessian-vector products, Fieller interval;
* ``calibrated_nqm``: the ``mccandlish_b_crit`` of the calibrated NQM's tuned curve for this optimizer
  (:mod:`batchlab.probes.calibrated`: top eigenvalues and the spectral density of the Hessian, tr Sigma
  and |G|^2 of the noise-scale measurement); no interval (the engine is exact; the measurement's own
  noise is not propagated);
* ``branched``: the local critical batch size at the checkpoint
  (:func:`batchlab.probes.branched.branched_critical_batch_size`, its default multipliers up to the
  training examples, its rule for the optimizer: sqrt for adam/adamw, else linear) with its bracket
  interval, when :mod:`batchlab.probes.branched` can be imported (else a note).

With ``store`` the measured ``mccandlish_b_crit`` of every unit (:mod:`batchlab.report.units`) of the
store workload ``<workload name>/<optimizer>`` (``unit_id`` keeps the units whose group or study ids
contain it), by :func:`batchlab.analysis.bootstrap.critical_batch_size_with_intervals` with the
unit's goal (:func:`batchlab.report.units.unit_goal`), with its profile-likelihood interval. Then per
predictor and unit: ``ratio = predicted / measured`` (a point only: a prediction whose interval is open on
one side is a bound, ``kind``/``bound``, with no ratio; ``ratio_low``/``ratio_high``: the range of ratios
consistent with both intervals, ``low_pred / high_meas`` to ``high_pred / low_meas``, not itself a
confidence interval), and ``compute_fraction = examples / sweep_examples``.

**Compute, in examples processed** (one example through one forward and backward pass). Every
predictor includes the reference run, ``batch_size x steps_at``. B_simple: plus the probe examples
(one per-example gradient each); B_noise: plus two per example of every Hessian-vector product (an HVP
of the mean loss over n examples costs about two gradients over them); the calibrated NQM: B_simple's
cost plus two per probe example of every curvature product (top eigenvalues and density); branched:
its own ``examples_processed`` (its reference run and every branch's window). The measured sweep's
compute ``sweep_examples`` is the sum over every trial of the unit's analysed studies, whatever its
status (diverged and unreached trials cost compute too), of ``steps x batch_size`` (``steps``: the
updates the trial trained, the store's ``trials.steps``); trials of studies not analysed (earlier
budget rounds of a sweep) are counted separately in ``skipped_examples``.
"""

from __future__ import annotations

import math
from typing import Any

from batchlab.errors import BatchlabError

__all__ = ["PREDICTORS", "default_steps_at", "measured_units", "predict", "tuned_batch_sizes", "tuned_reference"]

#: The predictors, in the order they are reported.
PREDICTORS = ("b_simple", "b_simple_adam", "b_noise", "calibrated_nqm", "branched")
#: Default probe examples (capped by the training examples).
DEFAULT_EXAMPLES = 1024


def default_steps_at(workload) -> int:
    """The default checkpoint: a quarter of the workload's default step budget (at least 1): past the
    first transient, a small share of one run's compute."""
    return max(int(workload.default_steps) // 4, 1)


def _interval(low, high) -> tuple[float | None, float | None]:
    def f(v):
        return None if v is None or not math.isfinite(float(v)) else float(v)

    return f(low), f(high)


def measured_units(store, store_workload: str, unit_id: str | None = None, *, n_boot: int = 200, level: float = 0.9,
                   seed: int = 0) -> list[dict]:
    """The measured critical batch size of every unit of ``store_workload`` in ``store`` (module docstring).

    Returns one dict per unit: ``unit``, ``group``, ``goal``, ``b_crit``/``low``/``high`` (examples;
    None: undefined or unbounded), ``extrapolated``, ``level``, ``reason`` (why no value),
    ``trials``/``sweep_examples`` (the analysed studies' trials) and ``skipped_trials``/``skipped_examples``.

    Raises:
        BatchlabError: not a store, no trials of ``store_workload`` (the message lists the store's
            workloads), no unit matching ``unit_id``.
    """
    from batchlab.analysis.bootstrap import critical_batch_size_with_intervals
    from batchlab.analysis.selection import Selection
    from batchlab.report.units import find_units, restricted, unit_examples, unit_goal
    from batchlab.store import Store

    con = Store.open(store, create=False).connect()
    try:
        units = find_units(con)
        known = sorted({u.workload for u in units})
        mine = [u for u in units if u.workload == store_workload]
        if not mine:
            raise BatchlabError(f"store {str(store)!r} has no trials of workload {store_workload!r}; it has: "
                                f"{', '.join(known) or 'no trials'}")
        if unit_id is not None:
            mine = [u for u in mine if unit_id in u.group or unit_id in (u.study_ids or ())]
            if not mine:
                raise BatchlabError(f"no unit of {store_workload!r} in store {str(store)!r} matches --unit {unit_id!r}")
        out = []
        for unit in mine:
            entry: dict[str, Any] = {"unit": unit.name, "group": unit.group, "goal": None, "b_crit": None, "low": None,
                                     "high": None, "extrapolated": None, "level": level, "reason": "", "tuned": []}
            with restricted(con, unit):
                entry["trials"], entry["sweep_examples"] = unit_examples(con, unit)
                entry["goal_train_loss"], entry["goal_train_trials"] = goal_training_loss(con, unit.workload)
                goal, why = unit_goal(unit, con)
                if goal is None:
                    entry["reason"] = why
                else:
                    entry["goal"] = goal
                    estimate = None
                    for max_trials in ("auto", None):
                        selection = Selection(unit.workload, goal["metric"], goal["goal"], maximize=goal["maximize"],
                                              max_trials=max_trials)
                        try:
                            estimate = critical_batch_size_with_intervals(con, selection, n_boot=n_boot, level=level,
                                                                          seed=seed, tolerance=0.1)
                            break
                        except BatchlabError as exc:
                            if max_trials == "auto" and "the paper's first" in str(exc):
                                continue
                            entry["reason"] = f"no S(B) fit: {exc}"
                            break
                    entry["tuned"] = tuned_batch_sizes(con, unit.workload, goal)
                    if estimate is not None:
                        summary = estimate.to_dict()
                        named = summary["critical_batch_sizes"]["mccandlish_b_crit"]
                        entry["b_crit"] = named["value"]
                        entry["low"], entry["high"] = named["low"], named["high"]
                        entry["extrapolated"] = bool(summary["extrapolated"])
                        if named["value"] is None:
                            entry["reason"] = "the fit's B_crit is infinite or undefined"
            skipped = tuple(unit.skipped_studies)
            if skipped:
                n, e = con.execute(f"SELECT count(*), sum(steps * batch_size) FROM trials WHERE study_id IN "
                                   f"({', '.join('?' for _ in skipped)})", list(skipped)).fetchone()
            else:
                n, e = 0, 0
            entry["skipped_trials"], entry["skipped_examples"] = int(n), int(e or 0)
            out.append(entry)
        return out
    finally:
        con.close()


def tuned_batch_sizes(con, store_workload: str, goal: dict) -> list[dict]:
    """The tuned hyperparameters of every reached batch size of ``store_workload`` at ``goal``: one dict
    per batch size, increasing, with ``batch_size``, ``trial_id`` (the best trial: the one attaining the
    steps to result, ties to the lower id), ``steps``, ``study_ids`` and ``hyperparameters`` (that
    trial's parameters). The trial-count rule is ``auto``, else every trial (as for the fit); empty when
    neither selection can be analysed. ``con``: a store connection restricted to one unit."""
    from batchlab.analysis.selection import Selection
    from batchlab.analysis.steps_to_result import steps_to_result_many

    for max_trials in ("auto", None):
        selection = Selection(store_workload, goal["metric"], goal["goal"], maximize=goal["maximize"],
                              max_trials=max_trials)
        try:
            results = steps_to_result_many(con, [selection])[0]
        except BatchlabError:
            continue
        return [{"batch_size": int(r.batch_size), "trial_id": r.trial_id, "steps": r.steps,
                 "study_ids": list(r.study_ids), "hyperparameters": dict(r.parameters)}
                for r in results if r.reached and r.parameters]
    return []


def tuned_reference(measured: list[dict], batch_size: int) -> dict | None:
    """The reference run's tuned hyperparameters by the scoring protocol (docs/methods.md, "Scoring
    predictors"): those of the measured batch size nearest ``batch_size`` in log B (ties: the smaller)
    in the first unit of ``measured`` with a reached batch size. Returns ``{"rule": "tuned", "unit",
    "from_batch_size", "from_trial", "from_steps", "from_studies", "hyperparameters"}`` or None when no
    unit has one."""
    for m in measured:
        tuned = m.get("tuned") or []
        if tuned:
            best = min(tuned, key=lambda t: (abs(math.log(t["batch_size"] / batch_size)), t["batch_size"]))
            return {"rule": "tuned", "unit": m["unit"], "from_batch_size": best["batch_size"],
                    "from_trial": best["trial_id"], "from_steps": best["steps"], "from_studies": best["study_ids"],
                    "hyperparameters": dict(best["hyperparameters"])}
    return None


#: The training-loss metric a matched calibrated-NQM target reads from the store.
TRAIN_LOSS_METRIC = "train/cross_entropy_error"


def goal_training_loss(con, store_workload: str) -> tuple[float | None, int]:
    """``(median, n)``: the median over the ``n`` trials of ``store_workload`` that stopped at the goal
    (status STOPPED_AT_GOAL) of the :data:`TRAIN_LOSS_METRIC` at each one's last measurement of it (the
    evaluation that met the goal); ``(None, 0)`` when no such trial recorded it. ``con``: a store
    connection, restricted to one unit by the caller."""
    row = con.execute(
        "SELECT median(v), count(*) FROM (SELECT arg_max(m.value, m.step) AS v FROM measurements m JOIN trials t "
        "USING (workload, batch_size, trial_id) WHERE t.workload = ? AND t.status = 'STOPPED_AT_GOAL' "
        "AND m.metric = ? AND m.step <= t.steps GROUP BY m.batch_size, m.trial_id)",
        [store_workload, TRAIN_LOSS_METRIC]).fetchone()
    if not row or not row[1] or row[0] is None or not math.isfinite(float(row[0])):
        return None, 0
    return float(row[0]), int(row[1])


def _check_only(only) -> set[str]:
    """``only`` as a set of predictor names (module :data:`PREDICTORS`); else a one-line BatchlabError."""
    from batchlab.errors import unknown_name_error

    if isinstance(only, str):
        only = [only]
    names = set()
    for name in only:
        if name not in PREDICTORS:
            raise unknown_name_error("predictor", str(name), PREDICTORS)
        names.add(str(name))
    if not names:
        raise BatchlabError(f"only must name at least one predictor of {', '.join(PREDICTORS)}")
    return names


def _probe_loss(model, batches) -> float:
    """The model's mean loss over every probe example (no gradient)."""
    import torch

    total, count = 0.0, 0
    with torch.no_grad():
        for inputs, targets in batches:
            total += float(batches.loss_fn(model(inputs), targets)) * len(targets)
            count += len(targets)
    return total / count


def matched_target(checkpoint_loss: float, measured: list[dict]) -> tuple[float | None, str]:
    """The calibrated NQM's target fraction matched to the measured sweep: ``(fraction, words)``.

    ``goal`` is the median of the units' ``goal_train_loss`` (the training loss at which their trials
    met the goal); the fraction is :func:`batchlab.probes.calibrated.matching_fraction` of the
    checkpoint's probe loss, that goal and a floor of 0 (a cross-entropy's lowest value). None (with the
    reason) when no unit recorded the loss or the checkpoint is already at or below the goal's loss."""
    from batchlab.probes.calibrated import matching_fraction

    goals = [m["goal_train_loss"] for m in measured if m.get("goal_train_loss") is not None]
    if not goals:
        return None, f"the store's trials do not record {TRAIN_LOSS_METRIC} at the goal"
    goal = float(sorted(goals)[len(goals) // 2])
    if not 0.0 < goal < checkpoint_loss:
        return None, (f"the checkpoint's probe loss {checkpoint_loss:.4g} is not above the goal's training loss "
                      f"{goal:.4g}")
    fraction = matching_fraction(checkpoint_loss, goal, 0.0)
    return fraction, f"matched: goal training loss {goal:.4g} / checkpoint probe loss {checkpoint_loss:.4g}"


def _predictor(name: str, value, low=None, high=None, method: str = "", examples: int | None = None,
               note: str = "", **details) -> dict:
    low, high = _interval(low, high)
    v = None if value is None or not math.isfinite(float(value)) else float(value)
    return {"predictor": name, "critical_batch_size": v, "low": low, "high": high, "interval_method": method,
            "examples": examples, "note": note, **details}


def predict(workload: Any, optimizer: str, *, store=None, unit_id: str | None = None, steps_at: int | None = None,
            examples: int | None = None, batch_size: int | None = None, learning_rate: float | None = None,
            hyperparameters: dict | None = None, seed: int = 0, train_examples: int | None = None,
            probe_batch_size: int | None = None, k: int = 10, lanczos_steps: int = 30, probes: int = 4,
            target_fraction: float | None = None, branched: bool = True, level: float = 0.9, n_boot: int = 200,
            device: str = "cpu", progress=None, only=None, branched_at=None, multipliers=None) -> dict:
    """Every predictor's critical batch size, the measured one and their ratios (module docstring).

    ``workload``: what ``sweep`` accepts; ``optimizer``: a batchlab optimizer; the reference run uses
    ``batch_size`` (default the workload's) and, by the scoring protocol (:func:`tuned_reference`): with
    a store and no ``learning_rate``, the tuned hyperparameters (the best trial's) of the measured batch
    size nearest ``batch_size`` in log B, ``hyperparameters`` overriding them; else ``learning_rate``
    (default the optimizer's registered default) and ``hyperparameters``. ``settings.reference`` records
    the rule (``tuned``, ``given``, ``default``), the learning rate and, when tuned, the unit, batch
    size, trial and studies it came from; ``settings.protocol_steps_at`` the protocol checkpoint
    (:func:`default_steps_at`), ``checkpoint_rule`` (``protocol`` or ``given``) and
    ``default_batch_size`` the workload's. ``progress(message)`` is called before each measurement.

    ``only``: the names of :data:`PREDICTORS` to measure (default all); the others are left out of
    ``predictors`` and ``rows`` and cost nothing (B_simple's per-example gradients are always measured,
    as every noise-scale reading needs them; Hessian-vector products only for ``b_noise``, curvature only
    for ``calibrated_nqm``, branches only for ``branched``). ``branched_at``: the branched estimate's
    checkpoints (default ``[steps_at]``; ``steps_at`` is added when absent): the ``branched`` predictor
    is still its reading at ``steps_at``, and with ``branched_at`` it also carries ``checkpoints`` (one
    ``{"step", "critical_batch_size", "low", "high", "method"}`` per checkpoint, step order) and
    ``warmup_schedule`` (:func:`batchlab.probes.branched.warmup_schedule`, ``[[step, batch_size], ...]``);
    its ``examples`` count the reference run to the last checkpoint and every checkpoint's branches.
    ``multipliers``: the branched estimate's multipliers (default
    :data:`batchlab.probes.branched.DEFAULT_MULTIPLIERS`), in both cases those with ``k x batch size``
    above the training examples dropped.

    Returns ``{"workload", "store_workload", "optimizer", "settings", "predictors": [...], "measured":
    [...] (empty without a store), "rows": [...]}``; each row is one predictor against one measured unit
    (or alone): ``predictor``, ``critical_batch_size``, ``low``, ``high``, ``interval_method``,
    ``examples``, ``note``, ``kind`` and ``bound`` (:func:`batchlab.probes.scoring.classify`: a
    prediction whose interval is open on one side is a bound, never a point), ``unit``, ``measured``,
    ``measured_low``, ``measured_high``, ``ratio`` (points only), ``ratio_low``, ``ratio_high``,
    ``sweep_examples``, ``compute_fraction``.

    Raises:
        BatchlabError (one line), before anything trains: unknown workload or optimizer, a store
            without that workload, a checkpoint step < 0, bad probe settings, an unknown name in
            ``only``, ``branched_at`` or ``multipliers`` not strictly increasing integers (>= 0, >= 1).
    """
    from batchlab.optim import optimizer_defaults
    from batchlab.probes.calibrated import DEFAULT_TARGET_FRACTION, calibrated_problem, predict_steps
    from batchlab.probes.noise_scale import noise_scale
    from batchlab.probes.reference import ADAM_LIKE, probe_batches, reference_checkpoints
    from batchlab.probes.spectrum import spectral_density, top_eigenvalues
    from batchlab.report import nqm as report_nqm
    from batchlab.workloads import resolve_workload

    say = progress or (lambda message: None)
    w = resolve_workload(workload)
    defaults = optimizer_defaults(optimizer)  # unknown optimizer: one line naming the closest
    batch = w.default_batch_size if batch_size is None else int(batch_size)
    protocol_step = default_steps_at(w)
    step = protocol_step if steps_at is None else steps_at
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise BatchlabError(f"--steps-at must be one integer >= 0 (the checkpoint's step), got {steps_at!r}")
    fraction = DEFAULT_TARGET_FRACTION if target_fraction is None else float(target_fraction)
    if not 0 < fraction < 1:
        raise BatchlabError(f"--target-fraction must lie in (0, 1), got {target_fraction!r}")
    target_rule = "default" if target_fraction is None else "given"
    wanted = set(PREDICTORS) if only is None else _check_only(only)
    branched_steps = None
    if branched_at is not None:
        from batchlab.probes.reference import check_steps_at

        branched_steps = sorted(set(check_steps_at(branched_at)) | {step})
    if multipliers is not None:
        from batchlab.errors import increasing_ints

        multipliers = increasing_ints("multipliers", multipliers, 1)
    store_workload = f"{w.name}/{optimizer}"
    measured = measured_units(store, store_workload, unit_id, n_boot=n_boot, level=level, seed=seed) if store else []
    tuned = tuned_reference(measured, batch) if learning_rate is None else None
    if tuned is not None:  # the protocol's reference run: the nearest measured batch size's tuned values
        hp = {**tuned["hyperparameters"], **(hyperparameters or {})}
        hp.setdefault("learning_rate", defaults["learning_rate"])
        reference_info = {**tuned, "learning_rate": float(hp["learning_rate"])}
    else:
        hp = dict(hyperparameters or {})
        hp["learning_rate"] = defaults["learning_rate"] if learning_rate is None else float(learning_rate)
        rule = "given" if learning_rate is not None else "default"
        reference_info = {"rule": rule, "learning_rate": hp["learning_rate"],
                          "reason": "--learning-rate given" if rule == "given" else (
                              "the store has no reached batch size with hyperparameters" if store else "no store")}

    checkpoints = reference_checkpoints(w, optimizer, batch, hp, [step], seed=seed, train_examples=train_examples,
                                        device=device)
    n_probe = min(DEFAULT_EXAMPLES, checkpoints.num_train) if examples is None else int(examples)
    per_batch = batch if probe_batch_size is None else int(probe_batch_size)
    label_smoothing = float(hp.get("label_smoothing") or 0.0)
    batches = probe_batches(w, n_probe, per_batch, seed, train_examples=train_examples, data_seed=seed,
                            label_smoothing=label_smoothing, device=checkpoints.run.device)
    if len(batches) < 2:
        raise BatchlabError(f"B_noise needs at least two probe batches: --examples ({n_probe}) must be at least twice "
                            f"the probe batch size ({per_batch})")
    say(f"training the reference run to step {step}")
    (checkpoint,) = list(checkpoints)
    model, loss_fn = checkpoint.model, batches.loss_fn
    reference = batch * step
    probe_loss = _probe_loss(model, batches)
    target_words = f"target {fraction:g} x initial loss" + (" (default)" if target_rule == "default" else "")
    if target_fraction is None and measured:
        matched, why = matched_target(probe_loss, measured) if not label_smoothing else (
            None, "label smoothing changes the training loss")
        if matched is not None:
            fraction, target_rule, target_words = matched, "matched", f"target {matched:.3g} x initial loss ({why})"
        else:
            target_words += f"; not matched: {why}"
    predictors = []

    hessian = "b_noise" in wanted
    say("noise scale (per-example gradients and Hessian-vector products)" if hessian else
        "noise scale (per-example gradients)")
    noise_failure = ""
    try:
        ns = noise_scale(model, loss_fn, batches, hessian=hessian, level=level, seed=seed)
    except RuntimeError as exc:  # a model whose Hessian-vector products torch.func cannot vmap: B_simple only
        noise_failure = f"B_noise failed: {str(exc).splitlines()[0]}"
        ns = noise_scale(model, loss_fn, batches, hessian=False, level=level, seed=seed)
    simple_cost = reference + ns.examples
    if "b_simple" in wanted:
        predictors.append(_predictor("b_simple", ns.b_simple, ns.b_simple_interval.low, ns.b_simple_interval.high,
                                     ns.b_simple_interval.method, simple_cost, "tr(Sigma) / |G|^2"))
    if optimizer in ADAM_LIKE and "b_simple_adam" in wanted:
        if checkpoint.preconditioner is not None:
            pre = noise_scale(model, loss_fn, batches, preconditioner=checkpoint.preconditioner,
                              preconditioner_label="adam", level=level, seed=seed)
            predictors.append(_predictor("b_simple_adam", pre.b_simple, pre.b_simple_interval.low,
                                         pre.b_simple_interval.high, pre.b_simple_interval.method,
                                         reference + ns.examples + pre.examples, "B_simple in Adam's metric"))
        else:
            predictors.append(_predictor("b_simple_adam", None, note="no Adam state at step 0"))
    noise_cost = simple_cost + 2 * ns.hvps * per_batch
    if hessian:
        predictors.append(_predictor("b_noise", ns.b_noise, ns.b_noise_interval.low if ns.b_noise_interval else None,
                                     ns.b_noise_interval.high if ns.b_noise_interval else None,
                                     ns.b_noise_interval.method if ns.b_noise_interval else "",
                                     None if noise_failure else noise_cost, noise_failure or "tr(H Sigma) / (G^T H G)"))

    calibrated: dict[str, Any] = {}
    spectrum = density = None
    if "calibrated_nqm" in wanted and report_nqm.mapping(optimizer) is None:
        predictors.append(_predictor("calibrated_nqm", None, note=f"not modelled: {report_nqm.unsupported_reason(optimizer)}"))
    elif "calibrated_nqm" in wanted:
        say("curvature: top eigenvalues and spectral density")
        try:
            spectrum = top_eigenvalues(model, loss_fn, batches, k=min(k, max(w.num_parameters() - 1, 1)), seed=seed)
            density = spectral_density(model, loss_fn, batches, lanczos_steps=lanczos_steps, probes=probes, seed=seed)
        except RuntimeError as exc:  # a model whose curvature products torch cannot compute: no calibrated NQM
            spectrum = density = None
            predictors.append(_predictor("calibrated_nqm", None,
                                         note=f"curvature failed: {str(exc).splitlines()[0] if str(exc) else exc!r}"))
    if "calibrated_nqm" in wanted and report_nqm.mapping(optimizer) is not None and spectrum is not None:
        cost = simple_cost + 2 * (spectrum.matvecs + density.matvecs) * n_probe
        try:
            problem = calibrated_problem(spectrum.eigenvalues, density=density, trace_sigma=ns.trace_sigma,
                                         grad_norm_sq=ns.grad_norm_sq, target_fraction=fraction,
                                         name=f"calibrated {w.name} step {step}")
            say("tuning the calibrated NQM per batch size")
            curve = predict_steps(problem, [optimizer])[optimizer]
            calibrated = {"problem": problem.describe(), "curve": curve.to_dict()}
            note = (f"{curve.words}; {target_words}" + ("; extrapolated" if curve.summary and
                                                                             curve.summary["extrapolated"] else "")
                    + (f"; {curve.reason}" if curve.reason else ""))
            predictors.append(_predictor("calibrated_nqm", curve.b_crit, method="", examples=cost, note=note))
        except BatchlabError as exc:
            predictors.append(_predictor("calibrated_nqm", None, examples=cost, note=f"no prediction: {exc}"))

    if "branched" in wanted and branched:
        try:
            from batchlab.probes import branched as branched_module
        except ImportError as exc:
            predictors.append(_predictor("branched", None, note=f"skipped: batchlab.probes.branched is absent ({exc})"))
        else:
            ks = [m for m in (multipliers or branched_module.DEFAULT_MULTIPLIERS) if m * batch <= checkpoints.num_train]
            rule = "sqrt" if optimizer in ADAM_LIKE else "linear"
            say(f"branched: multipliers {','.join(map(str, ks))}, rule {rule}")
            try:
                result = branched_module.branched_critical_batch_size(
                    workload, optimizer, batch, hp, branched_steps or [step], multipliers=ks, rule=rule, seed=seed,
                    train_examples=train_examples, probe_examples=n_probe, probe_batch_size=per_batch, device=device)
                point = next(c for c in result.checkpoints if c.step == step)
                details = {} if branched_steps is None else {
                    "checkpoints": [{"step": c.step, "critical_batch_size": c.critical_batch_size, "low": c.low,
                                     "high": c.high, "method": c.method} for c in result.checkpoints],
                    "warmup_schedule": [list(p) for p in branched_module.warmup_schedule(result)]}
                predictors.append(_predictor("branched", point.critical_batch_size, point.low, point.high, point.method,
                                             int(result.examples_processed),
                                             f"rule {rule}, multipliers {','.join(map(str, ks))}"
                                             + ("; every multiplier passed (a lower bound)" if point.high is None else ""),
                                             **details))
            except (BatchlabError, TypeError) as exc:  # TypeError: an interface other than the documented one
                predictors.append(_predictor("branched", None, note=f"failed: {exc}"))
    elif "branched" in wanted:
        predictors.append(_predictor("branched", None, note="skipped (--no-branched)"))

    from batchlab.probes.readings import classify

    rows = []
    for p in predictors:
        estimate = classify(p["critical_batch_size"], p["low"], p["high"], bool(p["interval_method"]))
        for m in (measured or [None]):
            row = dict(p)
            row.update({"kind": estimate.kind, "bound": estimate.value if estimate.kind.endswith("bound") else None,
                        "unit": None, "measured": None, "measured_low": None, "measured_high": None, "ratio": None,
                        "ratio_low": None, "ratio_high": None, "sweep_examples": None, "compute_fraction": None})
            if m is not None:
                row.update({"unit": m["unit"], "measured": m["b_crit"], "measured_low": m["low"],
                            "measured_high": m["high"], "sweep_examples": m["sweep_examples"]})
                value, meas = p["critical_batch_size"], m["b_crit"]
                if estimate.kind == "point" and meas:  # a bound is never a point: no ratio
                    row["ratio"] = value / meas
                    if p["low"] is not None and m["high"]:
                        row["ratio_low"] = p["low"] / m["high"]
                    if p["high"] is not None and m["low"]:
                        row["ratio_high"] = p["high"] / m["low"]
                if p["examples"] is not None and m["sweep_examples"]:
                    row["compute_fraction"] = p["examples"] / m["sweep_examples"]
            rows.append(row)
    settings = {"workload": w.name, "optimizer": optimizer, "batch_size": batch, "hyperparameters": hp,
                "steps_at": step, "seed": seed, "train_examples": train_examples, "probe_examples": n_probe,
                "probe_batch_size": per_batch, "target_fraction": fraction, "target_rule": target_rule,
                "probe_loss": probe_loss, "level": level, "reference_examples": reference,
                "batch_loss": checkpoint.batch_loss, "trace_sigma": ns.trace_sigma, "grad_norm_sq": ns.grad_norm_sq,
                "reference": reference_info, "protocol_steps_at": protocol_step,
                "checkpoint_rule": "protocol" if step == protocol_step else "given",
                "default_batch_size": int(w.default_batch_size)}
    return {"workload": w.name, "store_workload": store_workload, "optimizer": optimizer, "settings": settings,
            "predictors": predictors, "measured": measured, "calibrated": calibrated, "rows": rows}
