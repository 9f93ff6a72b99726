"""Command group ``batchlab probe``: measurements at checkpoints of one reference run.

``noise-scale`` (the gradient noise scale, :mod:`batchlab.probes.noise_scale`), ``spectrum`` (top
Hessian or Gauss-Newton eigenvalues and, with ``--density``, the spectral density,
:mod:`batchlab.probes.spectrum`) and ``branched`` (the branched critical batch size: short branches at
k·B from each checkpoint, :mod:`batchlab.probes.branched`; resumable with ``--out DIR``). All train one reference run with batchlab's own trial machinery
(:func:`batchlab.probes.reference.reference_checkpoints`: the run ``batchlab train`` makes with the same
workload, optimizer, batch size, hyperparameters and seed) and measure at each ``--steps-at`` step on
fixed probe batches of training examples (:func:`batchlab.probes.reference.probe_batches`). Defaults:
optimizer ``sgd``, the workload's default batch size, the optimizer's registered default learning rate
(``batchlab optimizers``). WORKLOAD is what ``sweep`` accepts (a registered name,
``package.module:function`` or ``path/to/file.py:function``). Everything is checked before the run
trains; with ``--json`` one JSON object per step on stdout, otherwise a table. No ``from __future__
import annotations`` (typer reads the annotations; see :mod:`batchlab.cli`).
"""

from typing import Annotated, Any, Optional

import typer

from batchlab.cli import options as opt
from batchlab.cli.output import emit_json, fmt, note, print_table
from batchlab.errors import BatchlabError

probe_app = typer.Typer(help="Probes at checkpoints of one reference run: gradient noise scale, curvature spectrum, "
                             "branched critical batch size.",
                        no_args_is_help=True)

#: The default ``--steps-at`` and ``--optimizer``.
DEFAULT_STEPS_AT = "0,100,1000"
DEFAULT_OPTIMIZER = "sgd"
#: The default number of probe examples.
DEFAULT_EXAMPLES = 1024

StepsAt = Annotated[str, typer.Option(
    "--steps-at", metavar="T1,T2,...",
    help="Steps of the reference run to probe at (updates; increasing integers >= 0).")]
ProbeOptimizer = Annotated[str, typer.Option(
    "--optimizer", help="The reference run's optimizer (see batchlab optimizers); adam and adamw also give the "
                        "noise scale in Adam's preconditioned metric.")]
ProbeBatchSize = Annotated[Optional[int], typer.Option(
    "--batch-size", help="The reference run's batch size (default: the workload's default batch size).")]
LearningRate = Annotated[Optional[float], typer.Option(
    "--learning-rate", help="The reference run's learning rate (default: the optimizer's registered default).")]
Hparam = Annotated[Optional[list[str]], typer.Option(
    "--hparam", help="Another hyperparameter of the reference run, NAME=VALUE (repeatable).")]
Examples = Annotated[Optional[int], typer.Option(
    "--examples", help="Probe examples: fixed training examples measured at every step (default: 1024, or "
                       "every training example when fewer).")]
ProbeBatch = Annotated[Optional[int], typer.Option(
    "--probe-batch-size", help="Examples per probe batch (default: the reference run's batch size).")]
Seed = Annotated[int, typer.Option(
    "--seed", help="Seed of the reference run (model, batch order, training subset), of the probe examples and of "
                   "the probes' random vectors.")]
TrainExamples = Annotated[Optional[int], typer.Option(
    "--train-examples", help="The reference run trains on a random subset of N examples (probe examples come "
                             "from it too).")]
Budget = Annotated[Optional[int], typer.Option(
    "--steps", help="The reference run's step budget, the length of a decaying schedule (default: the workload's, "
                    "or the last --steps-at step when later).")]

NOISE_JSON = opt.json_option(
    "One JSON object per step: the noise-scale fields (b_simple, intervals, trace_sigma, grad_norm_sq, b_noise, "
    "per_layer, ...), 'preconditioned' (Adam's metric, adam/adamw after step 0; else null) and the run's settings.")
SPECTRUM_JSON = opt.json_option(
    "One JSON object per step: eigenvalues (decreasing), curvature, matvecs, examples, parameters, k, tol, "
    "converged, seconds, 'density' (with --density) and the run's settings.")


def _reference(workload: str, steps_at: str, optimizer: str, batch_size: Optional[int], learning_rate: Optional[float],
               hparam: Optional[list[str]], examples: Optional[int], probe_batch_size: Optional[int], seed: int,
               train_examples: Optional[int], steps: Optional[int], device: str) -> tuple:
    """Check the options, prepare the reference run and the probe batches: ``(checkpoints, probes, settings)``."""
    from batchlab.cli.train import parse_hparams
    from batchlab.optim import optimizer_defaults
    from batchlab.probes.reference import check_steps_at, probe_batches, reference_checkpoints
    from batchlab.train.device import check_device, resolve_device
    from batchlab.workloads import resolve_workload

    wanted = check_steps_at(opt.parse_csv(steps_at, "--steps-at", int))
    device = check_device(device)
    w = resolve_workload(workload)
    defaults = optimizer_defaults(optimizer)  # unknown optimizer: one line naming the closest
    hyperparameters: dict[str, Any] = {}
    extra = parse_hparams(hparam)
    if "learning_rate" in extra:
        raise BatchlabError("set learning_rate with --learning-rate, not --hparam")
    hyperparameters["learning_rate"] = defaults["learning_rate"] if learning_rate is None else learning_rate
    hyperparameters.update(extra)
    batch = w.default_batch_size if batch_size is None else batch_size
    checkpoints = reference_checkpoints(w, optimizer, batch, hyperparameters, wanted, seed=seed,
                                        train_examples=train_examples, steps=steps, device=device)
    if examples is None:
        examples = min(DEFAULT_EXAMPLES, checkpoints.num_train)
    if probe_batch_size is not None and probe_batch_size > examples:
        raise BatchlabError(f"--probe-batch-size ({probe_batch_size}) must not exceed the probe examples "
                            f"(--examples {examples})")
    per_batch = min(batch, examples) if probe_batch_size is None else probe_batch_size  # the size used
    label_smoothing = float(hyperparameters.get("label_smoothing") or 0.0)
    probes = probe_batches(w, examples, per_batch, seed, train_examples=train_examples, data_seed=seed,
                           label_smoothing=label_smoothing, device=resolve_device(device))
    settings = {"workload": w.name, "optimizer": optimizer, "batch_size": int(batch),
                "learning_rate": float(hyperparameters["learning_rate"]), "hyperparameters": hyperparameters,
                "seed": int(seed), "train_examples": train_examples, "steps": checkpoints.run.steps,
                "device": checkpoints.run.device, "probe_examples": int(examples), "probe_batch_size": int(per_batch),
                "probe_batches": len(probes)}
    return checkpoints, probes, settings


def _row(checkpoint: Any, settings: dict, measured: dict) -> dict:
    """One step's JSON object: ``step``, ``workload``, ``optimizer``, the measurement's fields, the
    reference run's ``batch_loss`` and ``learning_rate`` at that step, and ``settings`` (the run's and
    the probes')."""
    return {"step": checkpoint.step, "workload": settings["workload"], "optimizer": settings["optimizer"], **measured,
            "batch_loss": checkpoint.batch_loss, "learning_rate": checkpoint.learning_rate, "settings": settings}


@probe_app.command("noise-scale")
def noise_scale_command(
    workload: opt.Workload,
    steps_at: StepsAt = DEFAULT_STEPS_AT,
    optimizer: ProbeOptimizer = DEFAULT_OPTIMIZER,
    batch_size: ProbeBatchSize = None,
    learning_rate: LearningRate = None,
    hparam: Hparam = None,
    examples: Examples = None,
    probe_batch_size: ProbeBatch = None,
    method: Annotated[str, typer.Option(
        "--method", help="per_example (per-example gradients; default) or two_batch (micro-batch vs batch "
                         "gradients).")] = "per_example",
    hessian: Annotated[bool, typer.Option(
        "--hessian", help="Also B_noise = tr(H Sigma) / (G^T H G), by Hessian-vector products (needs two or more "
                          "probe batches).")] = False,
    level: opt.Level = 0.9,
    seed: Seed = 0,
    train_examples: TrainExamples = None,
    steps: Budget = None,
    device: opt.Device = "auto",
    json_output: NOISE_JSON = False,
) -> None:
    """The gradient noise scale (B_simple; B_noise with --hessian) at steps of one reference run."""
    from batchlab.errors import unknown_name_error
    from batchlab.probes.noise_scale import METHODS, noise_scale
    from batchlab.probes.reference import ADAM_LIKE

    if method not in METHODS:
        raise unknown_name_error("method", method, METHODS)
    opt.check_level(level)
    checkpoints, probes, settings = _reference(workload, steps_at, optimizer, batch_size, learning_rate, hparam,
                                               examples, probe_batch_size, seed, train_examples, steps, device)
    if hessian and len(probes) < 2:
        raise BatchlabError(f"--hessian needs at least two probe batches: --examples ({settings['probe_examples']}) must "
                            f"be at least twice --probe-batch-size ({settings['probe_batch_size']})")
    settings["level"] = float(level)
    rows = []
    for checkpoint in checkpoints:
        measured = noise_scale(checkpoint.model, probes.loss_fn, probes, method=method, hessian=hessian, level=level,
                               seed=seed)
        preconditioned = None
        if optimizer in ADAM_LIKE and checkpoint.preconditioner is not None:
            preconditioned = noise_scale(checkpoint.model, probes.loss_fn, probes, method=method, hessian=hessian,
                                         preconditioner=checkpoint.preconditioner, level=level, seed=seed).to_dict()
        row = _row(checkpoint, settings, {**measured.to_dict(), "preconditioned": preconditioned})
        if json_output:
            emit_json(row)
        else:
            note(f"step {checkpoint.step}: B_simple {fmt(measured.b_simple)}")
            rows.append(row)
    if not json_output:
        _noise_table(rows, settings)


def _interval(interval: Optional[dict]) -> str:
    if not interval:
        return ""
    low, high = interval.get("low"), interval.get("high")
    return f"[{fmt(low) if low is not None else '-inf'}, {fmt(high) if high is not None else 'inf'}]"


def _noise_table(rows: list[dict], settings: dict) -> None:
    columns = ["step", "batch loss", "B_simple", f"{settings['level']:g} interval", "tr Sigma", "|G|^2", "B_noise",
               "B_simple (Adam metric)"]
    table = []
    for r in rows:
        pre = r.get("preconditioned")
        table.append([r["step"], fmt(r["batch_loss"]), fmt(r["b_simple"]), _interval(r.get("b_simple_interval")),
                      fmt(r["trace_sigma"]), fmt(r["grad_norm_sq"]), fmt(r.get("b_noise")),
                      "" if pre is None else fmt(pre.get("b_simple"))])
    print_table(f"noise scale (examples), {settings['workload']} {settings['optimizer']} B={settings['batch_size']} "
                f"lr={fmt(settings['learning_rate'])}", columns, table,
                caption=f"{rows[0]['examples'] if rows else 0} probe examples, method {rows[0]['method'] if rows else ''}")


@probe_app.command("spectrum")
def spectrum_command(
    workload: opt.Workload,
    steps_at: StepsAt = DEFAULT_STEPS_AT,
    optimizer: ProbeOptimizer = DEFAULT_OPTIMIZER,
    batch_size: ProbeBatchSize = None,
    learning_rate: LearningRate = None,
    hparam: Hparam = None,
    examples: Examples = None,
    probe_batch_size: ProbeBatch = None,
    k: Annotated[int, typer.Option("--k", help="How many of the largest eigenvalues.")] = 10,
    curvature: Annotated[str, typer.Option(
        "--curvature", help="hessian (default) or ggn (the Gauss-Newton matrix).")] = "hessian",
    tol: Annotated[float, typer.Option(
        "--tol", help="Relative accuracy of each eigenvalue (ARPACK's tol; 0: machine precision).")] = 1e-3,
    density: Annotated[bool, typer.Option(
        "--density", help="Also the spectral density by stochastic Lanczos quadrature (nodes and weights).")] = False,
    lanczos_steps: Annotated[int, typer.Option(
        "--lanczos-steps", help="Lanczos steps per probe vector of the density.")] = 30,
    probes: Annotated[int, typer.Option("--probes", help="Random probe vectors of the density.")] = 4,
    seed: Seed = 0,
    train_examples: TrainExamples = None,
    steps: Budget = None,
    device: opt.Device = "auto",
    json_output: SPECTRUM_JSON = False,
) -> None:
    """Top eigenvalues of the Hessian (or Gauss-Newton matrix) at steps of one reference run."""
    from batchlab.errors import unknown_name_error
    from batchlab.probes.spectrum import CURVATURES, spectral_density, top_eigenvalues
    from batchlab.workloads import resolve_workload

    if curvature not in CURVATURES:
        raise unknown_name_error("curvature", curvature, CURVATURES)
    parameters = resolve_workload(workload).num_parameters()
    if not 1 <= k < parameters:
        raise BatchlabError(f"--k must be in 1..{parameters - 1} (fewer than the model's {parameters} parameters), got {k}")
    if not tol >= 0:
        raise BatchlabError(f"--tol must be >= 0, got {tol}")
    if density and (lanczos_steps < 1 or probes < 1):
        raise BatchlabError(f"--lanczos-steps and --probes must be >= 1, got {lanczos_steps} and {probes}")
    checkpoints, batches, settings = _reference(workload, steps_at, optimizer, batch_size, learning_rate, hparam,
                                                examples, probe_batch_size, seed, train_examples, steps, device)
    rows = []
    for checkpoint in checkpoints:
        spectrum = top_eigenvalues(checkpoint.model, batches.loss_fn, batches, k=k, curvature=curvature, tol=tol,
                                   seed=seed)
        row = _row(checkpoint, settings, {**spectrum.to_dict(), "density": None})
        if density:
            row["density"] = spectral_density(checkpoint.model, batches.loss_fn, batches, curvature=curvature,
                                              lanczos_steps=lanczos_steps, probes=probes, seed=seed).to_dict()
        if json_output:
            emit_json(row)
        else:
            note(f"step {checkpoint.step}: top eigenvalue {fmt(spectrum.eigenvalues[0]) if spectrum.eigenvalues else '-'}")
            rows.append(row)
    if not json_output:
        _spectrum_table(rows, settings)


def _spectrum_table(rows: list[dict], settings: dict) -> None:
    table = []
    for r in rows:
        values = ", ".join(fmt(v) for v in r["eigenvalues"])
        dens = r.get("density")
        table.append([r["step"], fmt(r["batch_loss"]), values, r["matvecs"], "yes" if r["converged"] else "no",
                      "" if dens is None else dens["matvecs"]])
    curvature = rows[0]["curvature"] if rows else ""
    print_table(f"top {curvature} eigenvalues, {settings['workload']} {settings['optimizer']} B={settings['batch_size']} "
                f"lr={fmt(settings['learning_rate'])}",
                ["step", "batch loss", ("eigenvalues (decreasing)", "left"), "matvecs", "converged", "density matvecs"],
                table, caption=f"{rows[0]['examples'] if rows else 0} probe examples; one matvec = one "
                               "curvature-vector product over all of them (a few gradients' cost: docs/methods.md, \"Probes\")")


def register(app: typer.Typer) -> None:
    """Add the ``probe`` command group to the main app."""
    app.add_typer(probe_app, name="probe")


BRANCHED_JSON = opt.json_option(
    "One JSON object per checkpoint: step, learning_rate, reference_loss, critical_batch_size, interval (low, high, "
    "method), reference_repeats, reference_sigma, branches (per multiplier: batch_size, steps, examples, factor, learning_rate, loss, ratio, passed, "
    "tried), warmup_batch_size (the suggested warmup from that step on), examples_processed and the settings.")


@probe_app.command("branched")
def branched_command(
    workload: opt.Workload,
    steps_at: StepsAt = DEFAULT_STEPS_AT,
    optimizer: ProbeOptimizer = DEFAULT_OPTIMIZER,
    batch_size: ProbeBatchSize = None,
    learning_rate: LearningRate = None,
    hparam: Hparam = None,
    multipliers: Annotated[str, typer.Option(
        "--multipliers", metavar="K1,K2,...",
        help="Branch batch sizes k·B (strictly increasing integers >= 1; 1, the reference, is always measured).")
    ] = "1,2,4,8,16,32",
    rule: Annotated[Optional[str], typer.Option(
        "--rule", help="Learning rate of the k·B branch: linear (lr·k), sqrt (lr·sqrt(k)) or tuned (best of "
                       "lr·k^a, a in 0, 1/4, 1/2, 3/4, 1). Default: sqrt for adam/adamw, else linear.")] = None,
    window: Annotated[Optional[int], typer.Option(
        "--window", help="Training examples every branch processes (the k·B branch takes window // (k·B) updates; "
                         "default: 64 reference steps' worth, 64·B).")] = None,
    tolerance: Annotated[float, typer.Option(
        "--tolerance", help="A branch passes when its probe loss is at most (1 + tolerance) times the reference's "
                            "(relative; default 0.01).")] = 0.01,
    examples: Examples = None,
    probe_batch_size: ProbeBatch = None,
    seed: Seed = 0,
    train_examples: TrainExamples = None,
    steps: Budget = None,
    out: Annotated[Optional[str], typer.Option(
        "--out", metavar="DIR", help="Keep every finished branch in DIR/branched.json; a rerun resumes from it.")
    ] = None,
    workers: Annotated[int, typer.Option("--workers", help="Processes running branches in parallel.")] = 1,
    noise_repeats: Annotated[int, typer.Option(
        "--noise-repeats", help="Repeat the reference branch with N other batch orders: the interval becomes the "
                                "range of k·B consistent with that spread (seed_spread; 0: the bracket between the "
                                "last passing and first failing k·B).")] = 0,
    device: opt.Device = "auto",
    json_output: BRANCHED_JSON = False,
) -> None:
    """The branched critical batch size (branches at k·B from checkpoints of one reference run) and a warmup."""
    from batchlab.cli.train import parse_hparams
    from batchlab.optim import optimizer_defaults
    from batchlab.probes.branched import branched_critical_batch_size, warmup_schedule
    from batchlab.probes.reference import ADAM_LIKE, check_steps_at
    from batchlab.train.device import check_device
    from batchlab.workloads import resolve_workload

    wanted = check_steps_at(opt.parse_csv(steps_at, "--steps-at", int))
    ks = opt.parse_csv(multipliers, "--multipliers", int)
    device = check_device(device)
    w = resolve_workload(workload)
    defaults = optimizer_defaults(optimizer)  # unknown optimizer: one line naming the closest
    extra = parse_hparams(hparam)
    if "learning_rate" in extra:
        raise BatchlabError("set learning_rate with --learning-rate, not --hparam")
    hyperparameters: dict[str, Any] = {"learning_rate": defaults["learning_rate"] if learning_rate is None
                                       else learning_rate, **extra}
    batch = w.default_batch_size if batch_size is None else batch_size
    chosen_rule = rule if rule is not None else ("sqrt" if optimizer in ADAM_LIKE else "linear")

    def progress(step: int, k: int, factor: float, loss: float) -> None:
        if not json_output:
            note(f"step {step}: branch k={k} lr factor {fmt(factor)}: loss {fmt(loss)}")

    result = branched_critical_batch_size(
        workload, optimizer, batch, hyperparameters, wanted, multipliers=ks, rule=chosen_rule, window=window,
        tolerance=tolerance, seed=seed, train_examples=train_examples, steps=steps, probe_examples=examples,
        probe_batch_size=probe_batch_size, device=device, out=out, workers=workers, noise_repeats=noise_repeats,
        progress=progress)
    schedule = dict(warmup_schedule(result))
    settings = {**result.settings, "learning_rate": float(hyperparameters["learning_rate"])}
    rows, current = [], None
    for point in result.checkpoints:
        current = schedule.get(point.step, current)
        row = {"step": point.step, "workload": settings["workload"], "optimizer": settings["optimizer"],
               **point.to_dict(), "warmup_batch_size": current, "examples_processed": result.examples_processed,
               "computed": result.computed, "settings": settings}
        if json_output:
            emit_json(row)
        rows.append(row)
    if not json_output:
        _branched_table(rows, settings)


def _branched_table(rows: list[dict], settings: dict) -> None:
    ks = settings["multipliers"]
    columns = ["step", "lr", "reference loss", *[f"k={k} ratio" for k in ks[1:]], "critical B", "interval", "warmup B"]
    table = []
    for r in rows:
        ratios = [("inf" if b["ratio"] is None else f"{b['ratio']:.4f}") + ("" if b["passed"] else " x")
                  for b in r["branches"][1:]]
        high = r["interval"]["high"]
        table.append([r["step"], fmt(r["learning_rate"]), fmt(r["reference_loss"]), *ratios, r["critical_batch_size"],
                      f"[{r['interval']['low']}, {'inf' if high is None else high})", r["warmup_batch_size"]])
    method = rows[0]["interval"]["method"] if rows else "bracket"
    print_table(f"branched critical batch size, {settings['workload']} {settings['optimizer']} B={settings['batch_size']} "
                f"lr={fmt(settings['learning_rate'])} rule={settings['rule']}", columns, table,
                caption=f"ratio = branch loss / reference loss after {settings['window']} examples on "
                        f"{settings['probe_examples']} probe examples (x: above 1 + {fmt(settings['tolerance'])}); "
                        f"interval: {method}; "
                        f"{rows[0]['examples_processed'] if rows else 0} training examples processed")
