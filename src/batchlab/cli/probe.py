"""Command group ``batchlab probe``: measurements at checkpoints of one reference run.

``noise-scale`` (the gradient noise scale, :mod:`batchlab.probes.noise_scale`), ``spectrum`` (top
Hessian or Gauss-Newton eigenvalues and, with ``--density``, the spectral density,
:mod:`batchlab.probes.spectrum`) and ``branched`` (the branched critical batch size: short branches at
k·B from each checkpoint, :mod:`batchlab.probes.branched`; resumable with ``--out DIR``; or, with
``--adapter MODULE:ATTR --checkpoint STEP=PATH`` instead of a workload, from the checkpoints of the
user's own run, :mod:`batchlab.integrations.branched`). All train one reference run with batchlab's own trial machinery
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
    from batchlab.probes.reference import (
        check_steps_at,
        probe_batches,
        reference_checkpoints,
    )
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
    "tried), warmup_batch_size (the suggested warmup from that step on), examples_processed and the settings; with "
    "--adapter also adapter (workload and optimizer null).")


WorkloadOrNone = Annotated[Optional[str], typer.Argument(
    help=opt.WORKLOAD_HELP + " Or give --adapter with --checkpoint instead (your own run's checkpoints).",
    metavar="WORKLOAD", show_default=False)]


def parse_checkpoints(values: Optional[list[str]]) -> dict[int, str]:
    """``--checkpoint STEP=PATH`` (repeatable) as ``{step: path}``; one line for a value without ``=``,
    a step that is not an integer >= 0, or a step given twice (the paths are checked by the library)."""
    found: dict[int, str] = {}
    for value in values or []:
        step, sep, path = value.partition("=")
        if not sep or not path:
            raise BatchlabError(f"--checkpoint {value!r}: expected STEP=PATH (STEP: updates of your run at the checkpoint)")
        try:
            number = int(step.strip())
        except ValueError:
            raise BatchlabError(f"--checkpoint {value!r}: STEP must be an integer >= 0 (updates of your run), "
                                f"got {step!r}") from None
        if number < 0:
            raise BatchlabError(f"--checkpoint {value!r}: STEP must be an integer >= 0 (updates of your run), got {number}")
        if number in found:
            raise BatchlabError(f"--checkpoint: step {number} given twice ({found[number]!r} and {path!r})")
        found[number] = path
    return found


@probe_app.command("branched")
def branched_command(
    workload: WorkloadOrNone = None,
    steps_at: Annotated[Optional[str], typer.Option(
        "--steps-at", metavar="T1,T2,...",
        help="Steps of the reference run to probe at (updates; increasing integers >= 0; default 0,100,1000). "
             "WORKLOAD only.")] = None,
    optimizer: Annotated[Optional[str], typer.Option(
        "--optimizer", help="The reference run's optimizer (see batchlab optimizers; default sgd). WORKLOAD only.")
    ] = None,
    batch_size: Annotated[Optional[int], typer.Option(
        "--batch-size", help="The reference run's batch size B (default: the workload's default batch size; "
                             "required with --adapter: your run's examples per update).")] = None,
    learning_rate: Annotated[Optional[float], typer.Option(
        "--learning-rate", help="The reference run's learning rate (default: the optimizer's registered default; with "
                                "--adapter: the adapter's learning_rates(step), else the rate in the checkpoint).")
    ] = None,
    hparam: Hparam = None,
    multipliers: Annotated[str, typer.Option(
        "--multipliers", metavar="K1,K2,...",
        help="Branch batch sizes k·B (strictly increasing integers >= 1; 1, the reference, is always measured).")
    ] = "1,2,4,8,16,32",
    rule: Annotated[Optional[str], typer.Option(
        "--rule", help="Learning rate of the k·B branch: linear (lr·k), sqrt (lr·sqrt(k)) or tuned (best of "
                       "lr·k^a, a in 0, 1/4, 1/2, 3/4, 1). Default: sqrt for adam/adamw (with --adapter: for an "
                       "Adam-like optimizer the adapter builds), else linear.")] = None,
    window: Annotated[Optional[int], typer.Option(
        "--window", help="Training examples every branch processes (the k·B branch takes window // (k·B) updates; "
                         "default: 64 reference steps' worth, 64·B).")] = None,
    tolerance: Annotated[float, typer.Option(
        "--tolerance", help="A branch passes when its probe loss is at most (1 + tolerance) times the reference's "
                            "(relative; default 0.01).")] = 0.01,
    examples: Examples = None,
    probe_batch_size: ProbeBatch = None,
    seed: Annotated[int, typer.Option(
        "--seed", help="Seed of the reference run (model, batch order, training subset), of the probe examples and of "
                       "the branches' random streams (with --adapter: only the branches' streams, e.g. dropout).")] = 0,
    train_examples: TrainExamples = None,
    steps: Budget = None,
    out: Annotated[Optional[str], typer.Option(
        "--out", metavar="DIR", help="Keep every finished branch in DIR/branched.json; a rerun resumes from it.")
    ] = None,
    workers: Annotated[int, typer.Option("--workers", help="Processes running branches in parallel.")] = 1,
    noise_repeats: Annotated[int, typer.Option(
        "--noise-repeats", help="Repeat the reference branch with N other batch orders: the interval becomes the "
                                "range of k·B consistent with that spread (seed_spread; 0: the bracket between the "
                                "last passing and first failing k·B). WORKLOAD only.")] = 0,
    device: opt.Device = None,  # None: auto; WORKLOAD only (an adapter places its model itself)
    adapter: Annotated[Optional[str], typer.Option(
        "--adapter", metavar="MODULE:ATTR",
        help="Your run's checkpoint adapter instead of a WORKLOAD: package.module:attribute or path/to/file.py:attribute "
             "(an adapter object, or a class or function returning one; docs/integrations.md).")] = None,
    checkpoint: Annotated[Optional[list[str]], typer.Option(
        "--checkpoint", metavar="STEP=PATH",
        help="A checkpoint of your run saved after STEP updates (repeatable; with --adapter).")] = None,
    dask: opt.Dask = False,  # --adapter only, as --scheduler
    scheduler: opt.Scheduler = None,
    schedule_out: Annotated[Optional[str], typer.Option(
        "--schedule-out", metavar="FILE",
        help="Write the suggested batch-size warmup as a batchlab batch-size schedule (JSON, in examples; in tokens "
             "with --tokens-per-example), the file the callbacks read.")] = None,
    olmo_core_out: Annotated[Optional[str], typer.Option(
        "--olmo-core-out", metavar="FILE",
        help="Write the warmup as OLMo-core BatchSizeSchedulerCallback arguments (JSON: batch_sizes and schedule, in "
             "tokens; needs --tokens-per-example).")] = None,
    tokens_per_example: Annotated[Optional[int], typer.Option(
        "--tokens-per-example", metavar="L",
        help="Tokens per example (fixed-length sequences): the schedule files count tokens.")] = None,
    json_output: BRANCHED_JSON = False,
) -> None:
    """The branched critical batch size (branches at k·B from checkpoints of one reference run) and a warmup.

    The reference run is WORKLOAD's (trained here), or your own: --adapter MODULE:ATTR with --checkpoint STEP=PATH
    (whose branches --dask or --scheduler can run on Dask)."""
    if olmo_core_out is not None and tokens_per_example is None:
        raise BatchlabError("--olmo-core-out needs --tokens-per-example L: OLMo-core counts its batch sizes in tokens")
    if tokens_per_example is not None and schedule_out is None and olmo_core_out is None:
        raise BatchlabError("--tokens-per-example counts the schedule files in tokens; give it with --schedule-out FILE "
                            "or --olmo-core-out FILE")
    if adapter is not None or checkpoint:
        if workload is not None:
            raise BatchlabError(f"give either a WORKLOAD ({workload!r}) or --adapter with --checkpoint, not both")
        given = [flag for flag, value in (("--steps-at", steps_at), ("--optimizer", optimizer), ("--hparam", hparam),
                                          ("--examples", examples), ("--probe-batch-size", probe_batch_size),
                                          ("--train-examples", train_examples), ("--steps", steps),
                                          ("--device", device)) if value is not None and value != []]
        if noise_repeats:
            given.append("--noise-repeats")
        if given:
            raise BatchlabError(f"{', '.join(given)} define a WORKLOAD's reference run; with --adapter your adapter and "
                                "checkpoints define it (allowed: --batch-size, --learning-rate, --multipliers, --rule, "
                                "--window, --tolerance, --seed, --out, --workers, --dask, --scheduler)")
        if adapter is None:
            raise BatchlabError("--checkpoint needs --adapter MODULE:ATTR (the adapter that builds, loads and feeds "
                                "your model)")
        if not checkpoint:
            raise BatchlabError("--adapter needs at least one --checkpoint STEP=PATH")
        if batch_size is None:
            raise BatchlabError("--adapter needs --batch-size B: your run's batch size (examples per update)")
        result = _branched_from_adapter(adapter, parse_checkpoints(checkpoint), batch_size, learning_rate, multipliers,
                                        rule, window, tolerance, seed, out, workers, dask, scheduler, json_output)
        label = {"workload": None, "optimizer": None, "adapter": result.settings["adapter"]}
    else:
        if workload is None:
            raise BatchlabError("give a WORKLOAD, or --adapter MODULE:ATTR with --checkpoint STEP=PATH for your own run's "
                                "checkpoints")
        if dask or scheduler is not None:
            raise BatchlabError("--dask and --scheduler run the branches of --adapter checkpoints; a WORKLOAD's branches "
                                "run with --workers")
        result = _branched_from_workload(workload, steps_at, optimizer, batch_size, learning_rate, hparam, multipliers,
                                         rule, window, tolerance, examples, probe_batch_size, seed, train_examples,
                                         steps, out, workers, noise_repeats, device, json_output)
        label = {"workload": result.settings["workload"], "optimizer": result.settings["optimizer"]}
    _branched_output(result, label, json_output)
    if schedule_out is not None or olmo_core_out is not None:
        _write_schedules(result, schedule_out, olmo_core_out, tokens_per_example)


def _progress(json_output: bool):
    def progress(step: int, k: int, factor: float, loss: float) -> None:
        if not json_output:
            note(f"step {step}: branch k={k} lr factor {fmt(factor)}: loss {fmt(loss)}")

    return progress


def _branched_from_workload(workload, steps_at, optimizer, batch_size, learning_rate, hparam, multipliers, rule, window,
                            tolerance, examples, probe_batch_size, seed, train_examples, steps, out, workers,
                            noise_repeats, device, json_output):
    """The existing path: the reference run of WORKLOAD, trained here."""
    from batchlab.cli.train import parse_hparams
    from batchlab.optim import optimizer_defaults
    from batchlab.probes.branched import branched_critical_batch_size
    from batchlab.probes.reference import ADAM_LIKE, check_steps_at
    from batchlab.train.device import check_device
    from batchlab.workloads import resolve_workload

    optimizer = DEFAULT_OPTIMIZER if optimizer is None else optimizer
    wanted = check_steps_at(opt.parse_csv(DEFAULT_STEPS_AT if steps_at is None else steps_at, "--steps-at", int))
    ks = opt.parse_csv(multipliers, "--multipliers", int)
    device = check_device("auto" if device is None else device)
    w = resolve_workload(workload)
    defaults = optimizer_defaults(optimizer)  # unknown optimizer: one line naming the closest
    extra = parse_hparams(hparam)
    if "learning_rate" in extra:
        raise BatchlabError("set learning_rate with --learning-rate, not --hparam")
    hyperparameters: dict[str, Any] = {"learning_rate": defaults["learning_rate"] if learning_rate is None
                                       else learning_rate, **extra}
    batch = w.default_batch_size if batch_size is None else batch_size
    chosen_rule = rule if rule is not None else ("sqrt" if optimizer in ADAM_LIKE else "linear")
    result = branched_critical_batch_size(
        workload, optimizer, batch, hyperparameters, wanted, multipliers=ks, rule=chosen_rule, window=window,
        tolerance=tolerance, seed=seed, train_examples=train_examples, steps=steps, probe_examples=examples,
        probe_batch_size=probe_batch_size, device=device, out=out, workers=workers, noise_repeats=noise_repeats,
        progress=_progress(json_output))
    result.settings["learning_rate"] = float(hyperparameters["learning_rate"])
    return result


def _branched_from_adapter(adapter, checkpoints, batch_size, learning_rate, multipliers, rule, window, tolerance, seed,
                           out, workers, dask, scheduler, json_output):
    """Your own run: the adapter and its checkpoints (:func:`batchlab.integrations.branched.branched_from_checkpoints`)."""
    from batchlab.integrations.branched import (
        branched_from_checkpoints,
        check_checkpoints,
        default_rule,
    )

    ks = opt.parse_csv(multipliers, "--multipliers", int)
    check_checkpoints(checkpoints)  # before default_rule builds the model
    chosen_rule = rule if rule is not None else default_rule(adapter)
    return branched_from_checkpoints(adapter, checkpoints, batch_size, learning_rate=learning_rate, multipliers=ks,
                                     rule=chosen_rule, window=window, tolerance=tolerance, out=out, workers=workers,
                                     dask=dask, scheduler=scheduler, seed=seed, progress=_progress(json_output))


def _branched_output(result: Any, label: dict, json_output: bool) -> None:
    """One JSON object per checkpoint, or the table."""
    from batchlab.probes.branched import warmup_schedule

    schedule = dict(warmup_schedule(result))
    settings = result.settings
    rows, current = [], None
    for point in result.checkpoints:
        current = schedule.get(point.step, current)
        row = {"step": point.step, **label, **point.to_dict(), "warmup_batch_size": current,
               "examples_processed": result.examples_processed, "computed": result.computed, "settings": settings}
        if json_output:
            emit_json(row)
        rows.append(row)
    if not json_output:
        _branched_table(rows, settings)


def _write_schedules(result: Any, schedule_out: Optional[str], olmo_core_out: Optional[str],
                     tokens_per_example: Optional[int]) -> None:
    """``--schedule-out`` (batchlab's schedule JSON) and ``--olmo-core-out`` (OLMo-core's arguments)."""
    import json

    from batchlab.atomic import os_error_text, write_stream_atomic
    from batchlab.integrations.branched import batch_size_schedule

    schedule = batch_size_schedule(result, tokens_per_example=tokens_per_example)
    if schedule_out is not None:
        schedule.save(schedule_out)
        note(f"batch-size schedule ({schedule.unit}): {schedule_out}")
    if olmo_core_out is not None:
        payload = (json.dumps(schedule.to_olmo_core(), indent=2) + "\n").encode()
        try:
            write_stream_atomic(olmo_core_out, lambda handle: handle.write(payload))
        except OSError as exc:
            raise BatchlabError(f"cannot write --olmo-core-out: {os_error_text(exc)}") from None
        note(f"OLMo-core batch_sizes (tokens): {olmo_core_out}")


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
    if settings.get("adapter"):
        rate = "per checkpoint" if settings["learning_rate"] is None else fmt(settings["learning_rate"])
        title = f"branched critical batch size, adapter {settings['adapter']} B={settings['batch_size']} lr={rate}"
        probes = "the adapter's probe loss"
    else:
        title = (f"branched critical batch size, {settings['workload']} {settings['optimizer']} B={settings['batch_size']} "
                 f"lr={fmt(settings['learning_rate'])}")
        probes = f"{settings['probe_examples']} probe examples"
    print_table(f"{title} rule={settings['rule']}", columns, table,
                caption=f"ratio = branch loss / reference loss after {settings['window']} examples on "
                        f"{probes} (x: above 1 + {fmt(settings['tolerance'])}); "
                        f"interval: {method}; "
                        f"{rows[0]['examples_processed'] if rows else 0} training examples processed")
