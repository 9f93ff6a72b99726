"""Command ``predict``: every predictor's critical batch size for a workload, beside the measured one.

``batchlab predict WORKLOAD --optimizer NAME [--store DIR] [--unit ID] [--steps-at N] [--examples N]
[--batch-size B] [--learning-rate LR] [--seed S] [--json]`` trains one reference run to step N and
measures there B_simple, B_noise (and B_simple in Adam's metric for adam/adamw), the calibrated NQM's
critical batch size and, unless ``--no-branched``, the branched local critical batch size; with
``--store`` each beside the measured ``mccandlish_b_crit`` of the store's sweep of that workload and
optimizer, with the ratio predicted / measured and each predictor's compute as a fraction of the
sweep's (docs/methods.md, "Probes", "Predicting the critical batch size"). The work is
:func:`batchlab.probes.predict.predict`. No ``from __future__ import annotations`` (typer reads the
annotations).

``batchlab predict --score FILE... --measured CSV [--measured CSV] [--workload-ref REF] [--json]`` scores
prediction files instead, each predictor on its own against the report CSVs' measured values, beside two
naive baselines (:mod:`batchlab.probes.scoring`; docs/methods.md, "Scoring predictors").
"""

from typing import Annotated, Optional

import typer

from batchlab.cli import options as opt
from batchlab.cli.output import emit_json, fmt, line, note, print_table
from batchlab.errors import BatchlabError

PREDICT_JSON = opt.json_option(
    "One JSON object per predictor (and per measured unit with --store): predictor, critical_batch_size, low, high, "
    "interval_method, examples, note, kind (point, lower_bound, upper_bound, none), bound, unit, measured, "
    "measured_low, measured_high, ratio (points only), ratio_low, ratio_high, "
    "sweep_examples, compute_fraction, workload, optimizer and the settings.")


def predict(
    arguments: Annotated[Optional[list[str]], typer.Argument(
        help=opt.WORKLOAD_HELP + " With --score: the prediction files (JSON lines of batchlab predict --json) instead.",
        metavar="WORKLOAD | FILE...", show_default=False)] = None,
    optimizer: Annotated[Optional[str], typer.Option(
        "--optimizer", help="The optimizer (see batchlab optimizers); required unless --score.")] = None,
    store: Annotated[Optional[str], typer.Option(
        "--store", help="A store holding a measured sweep of WORKLOAD with this optimizer: print the measured "
                        "critical batch size beside each prediction, with the ratio and the compute fraction.")] = None,
    unit_id: Annotated[Optional[str], typer.Option(
        "--unit", help="With --store: only the units whose group or study ids contain this id (a sweep id or "
                        "study id); default every unit of the workload.")] = None,
    steps_at: Annotated[Optional[int], typer.Option(
        "--steps-at", help="The reference run's step to measure at (default: a quarter of the workload's default "
                           "step budget).")] = None,
    examples: Annotated[Optional[int], typer.Option(
        "--examples", help="Probe examples (default: 1024, or every training example when fewer).")] = None,
    batch_size: Annotated[Optional[int], typer.Option(
        "--batch-size", help="The reference run's batch size (default: the workload's).")] = None,
    learning_rate: Annotated[Optional[float], typer.Option(
        "--learning-rate", help="The reference run's learning rate (default: with --store, the tuned hyperparameters of the "
                                "measured batch size nearest the reference batch size; else the optimizer's "
                                "registered default).")] = None,
    hparam: Annotated[Optional[list[str]], typer.Option(
        "--hparam", help="Another hyperparameter of the reference run, NAME=VALUE (repeatable).")] = None,
    target_fraction: Annotated[Optional[float], typer.Option(
        "--target-fraction", help="The calibrated NQM's target: this fraction of its initial loss (default: with "
                                  "--store, matched to the training loss at which the sweep's trials met the goal "
                                  "when they record train/cross_entropy_error; else 0.01).")] = None,
    branched: Annotated[bool, typer.Option(
        "--branched/--no-branched", help="Also the branched local critical batch size (trains short branches).")] = True,
    train_examples: Annotated[Optional[int], typer.Option(
        "--train-examples", help="The reference run trains on a random subset of N examples.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the reference run, the probe examples and vectors.")] = 0,
    level: opt.Level = 0.9,
    device: opt.Device = "auto",
    score: Annotated[bool, typer.Option(
        "--score", help="Instead of predicting: score the predictions in the FILEs (JSON lines of batchlab predict "
                        "--json) against --measured, each predictor on its own beside two naive baselines "
                        "(docs/methods.md, \"Scoring predictors\").")] = False,
    measured: Annotated[Optional[list[str]], typer.Option(
        "--measured", metavar="FILE", help="With --score: each unit's measured mccandlish_b_crit and interval, from a "
                                           "report.csv of batchlab report or a .jsonl of batchlab analyze "
                                           "critical-batch-size --steps-table FILE --group-by unit --json "
                                           "(repeatable).")] = None,
    workload_ref: Annotated[Optional[list[str]], typer.Option(
        "--workload-ref", metavar="REF", help="With --score: a workload reference (FILE.py:FUNCTION) for records of a "
                                              "workload the registry lacks whose settings do not record the protocol "
                                              "checkpoint (repeatable).")] = None,
    json_output: PREDICT_JSON = False,
) -> None:
    """Predict the critical batch size (noise scale, calibrated NQM, branched) and compare with a measured sweep;
    with --score, score prediction files against measured values."""
    from batchlab.cli.train import parse_hparams
    from batchlab.probes.predict import predict as run_predict
    from batchlab.train.device import check_device

    opt.check_level(level)
    arguments = list(arguments or [])
    if score:
        if not arguments or optimizer is not None:
            raise BatchlabError("batchlab predict --score needs prediction FILEs (batchlab predict --json lines) and "
                                "no --optimizer")
        given = {"--store": store, "--unit": unit_id, "--steps-at": steps_at, "--examples": examples,
                 "--batch-size": batch_size, "--learning-rate": learning_rate, "--hparam": hparam,
                 "--target-fraction": target_fraction, "--train-examples": train_examples,
                 "--no-branched": None if branched else True}
        refused = [name for name, value in given.items() if value is not None]
        if refused:
            raise BatchlabError(f"{', '.join(refused)} belong{'s' if len(refused) == 1 else ''} to predicting, not to "
                                "--score FILE... (allowed with --score: --measured, --workload-ref, --level, --json)")
        _score(arguments, measured or [], workload_ref or [], level, json_output)
        return
    if measured or workload_ref:
        raise BatchlabError("--measured and --workload-ref belong to --score FILE...")
    if len(arguments) != 1 or optimizer is None:
        raise BatchlabError("batchlab predict needs one WORKLOAD and --optimizer NAME (or --score FILE... "
                            f"--measured CSV); got {len(arguments)} arguments")
    (workload,) = arguments
    extra = parse_hparams(hparam)
    if "learning_rate" in extra:
        raise BatchlabError("set learning_rate with --learning-rate, not --hparam")
    result = run_predict(workload, optimizer, store=store, unit_id=unit_id, steps_at=steps_at, examples=examples,
                         batch_size=batch_size, learning_rate=learning_rate, hyperparameters=extra, seed=seed,
                         train_examples=train_examples, target_fraction=target_fraction, branched=branched, level=level,
                         device=check_device(device), progress=None if json_output else note)
    if json_output:
        for row in result["rows"]:
            emit_json({"workload": result["workload"], "optimizer": result["optimizer"], **row,
                       "settings": result["settings"]})
        return
    _table(result)


def _interval(low, high) -> str:
    if low is None and high is None:
        return ""
    return f"[{fmt(low) if low is not None else '-'}, {fmt(high) if high is not None else 'inf'}]"


def _table(result: dict) -> None:
    settings = result["settings"]
    rows = []
    several = len(result["measured"]) > 1
    for r in result["rows"]:
        rows.append(([r["unit"] or ""] if several else []) + [
            r["predictor"], fmt(r["critical_batch_size"]), _interval(r["low"], r["high"]),
            r["kind"].replace("_", " ") + (f" {fmt(r['bound'])}" if r["bound"] is not None else ""),
            fmt(r["measured"]) if result["measured"] else "", fmt(r["ratio"]),
            fmt(r["compute_fraction"]), fmt(r["examples"]), r["note"]])
    columns = (["unit"] if several else []) + ["predictor", "critical batch size", f"{settings['level']:g} interval",
                                               "reading", "measured", "ratio", "compute fraction", "examples", ("note", "left")]
    print_table(f"critical batch size (examples), {result['workload']} {result['optimizer']} B={settings['batch_size']} "
                f"step {settings['steps_at']}", columns, rows,
                caption="reading: a prediction whose interval is open on one side is a bound, never a point (no "
                        "ratio); ratio = predicted / measured mccandlish_b_crit; compute fraction = the predictor's examples "
                        "processed (reference run included) / the measured sweep's (sum of steps x batch size)")
    for m in result["measured"]:
        line(f"measured {m['unit']}: mccandlish_b_crit {fmt(m['b_crit'])} {_interval(m['low'], m['high'])}"
             + (" (extrapolated)" if m["extrapolated"] else "") + f", {m['trials']} trials, "
             f"{m['sweep_examples']} examples" + (f"; {m['reason']}" if m["reason"] else ""))


def _score(files: list[str], measured: list[str], refs: list[str], level: float, json_output: bool) -> None:
    """``--score``: the score table (:mod:`batchlab.probes.scoring`), or one JSON object per predictor and
    baseline row (:meth:`Scoreboard.row_dicts`: a predictor's with ``baselines_on_these_units``) with ``--json``."""
    from batchlab.probes.scoring import SCORE_COLUMNS, SCORE_NOTE, score_table_rows
    from batchlab.report.predictions import score_files

    board = score_files(files, measured, workload_refs=refs, level=level)
    if json_output:
        for row in board.row_dicts():
            emit_json(row)
        return
    print_table(f"predictor scores across {len(board.units)} units", [SCORE_COLUMNS[0]] + [
        (c, "left") if c == "per unit" else c for c in SCORE_COLUMNS[1:]], score_table_rows(board), caption=SCORE_NOTE)
    line("units, in the per-unit order: " + "; ".join(board.units))
    for predictor, pairs in board.off_checkpoint.items():
        line(f"not scored (off the protocol checkpoint): {predictor} " + ", ".join(
            f"{unit} step {step}" for unit, step in pairs))
    line("reference runs of the scored predictions: " + ", ".join(
        f"{n} {rule}" for rule, n in sorted(board.reference_rules.items())))
    for w in board.warnings:
        note(f"warning: {w}")


def register(app: typer.Typer) -> None:
    """Add the ``predict`` command to the main app."""
    app.command("predict")(predict)
