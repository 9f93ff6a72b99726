"""The measured example of issue 23: fixed small batch, fixed large batch, and a batch-size warmup from
the branched critical batch size, on a small character-level Transformer (PROTOCOL.md, beside this file).

Run from the repository root:

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python experiments/integrations/run_warmup_experiment.py

Resumable: the branched measurement keeps every finished branch in results/branched/branched.json (the
probe's own cache); each finished training run is written atomically to results/runs/<arm>_seed<s>.json
and skipped on a rerun (a run stopped midway starts again from its beginning). The summary
(results/summary.json, results/table.md) is recomputed from the finished runs at the end of every
invocation, labelled partial while runs are missing. ``--analyse-only`` recomputes it without training.

Reruns of a subset (e.g. the same runs under another ATen CPU capability, ``ATEN_CPU_CAPABILITY=avx2``):
``--results-dir DIR`` (default: results/ beside this file), ``--arms small,warmup`` (default: all three),
``--seeds 0,1,2`` (default: the protocol's five) and ``--schedule FILE`` (a saved ``BatchSizeSchedule``,
e.g. the committed results/warmup_schedule.json, used instead of running the branched measurement; it
is copied to DIR/warmup_schedule.json). A results directory other than the default needs ``--schedule``:
the branched measurement's cache lives in the default one. The analysis of a subset uses the chosen
arms and seeds (its target tau is then 1.01 x the small arm's mean over those seeds; comparisons and the
verdict need both of their arms). A finished run file whose recorded ATen CPU capability differs from
the running process's is an error, not a skip, so that one directory never mixes capabilities.

Counting: an *update* is one optimizer step; *examples* are training sequences of 64 characters
(each with 64 next-character targets), counted over completed updates; the validation loss is the
mean per-character cross entropy in nats on the workload's fixed 1,024-sequence val subset.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from batchlab.atomic import write_stream_atomic
from batchlab.errors import BatchlabError
from batchlab.integrations.schedule import (BatchSizeSchedule, accumulation_steps, examples_lr_schedule,
                                            rescaled_learning_rate)
from batchlab.optim import build_training_algorithm
from batchlab.train.sampling import BatchSampler
from batchlab.workloads import resolve_workload

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = HERE / "results"
WORKLOAD = f"{HERE / 'workload.py'}:char_transformer_w64"
WORKLOAD_CLI = "experiments/integrations/workload.py:char_transformer_w64"

# --- the protocol's fixed settings (PROTOCOL.md) -------------------------------------------------------
BASE_BATCH = 32
BASE_LR = 0.003
MICRO_BATCH = 32
TOTAL_EXAMPLES = 65_536  # 2,048 updates at B = 32
END_FACTOR = 0.1
LR_RULE = "sqrt"
EVAL_EVERY = 1_024  # examples
SEEDS = (0, 1, 2, 3, 4)
ARMS = ("small", "large", "warmup")
FALLBACK_LARGE = 256
TARGET_SLACK = 0.01
STEPS_AT = (0, 64, 128, 256, 512, 1024, 1536)

BRANCHED_COMMAND = [
    "probe", "branched", WORKLOAD_CLI, "--optimizer", "adam", "--batch-size", str(BASE_BATCH),
    "--learning-rate", str(BASE_LR), "--hparam", f"learning_rate_decay_steps={TOTAL_EXAMPLES // BASE_BATCH}",
    "--hparam", f"end_learning_rate_factor={END_FACTOR}", "--steps", str(TOTAL_EXAMPLES // BASE_BATCH),
    "--steps-at", ",".join(map(str, STEPS_AT)), "--rule", LR_RULE, "--noise-repeats", "2", "--seed", "0",
    "--out", "experiments/integrations/results/branched", "--device", "cpu", "--json",
]


def write_json(path: Path, data) -> None:
    payload = (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_stream_atomic(path, lambda handle: handle.write(payload))


def environment() -> dict:
    return {"torch": torch.__version__, "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "machine": platform.machine(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}


# --- (1) the branched measurement and the warmup it suggests --------------------------------------------


def branched_measurement() -> list[dict]:
    """Run (or resume: the probe's cache recomputes nothing finished) the branched measurement through the
    CLI and return its per-checkpoint JSON objects (also kept in results/branched.jsonl)."""
    out = RESULTS / "branched.jsonl"
    if out.exists():
        return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    batchlab = Path(sys.executable).with_name("batchlab")
    start = time.perf_counter()
    done = subprocess.run([str(batchlab), *BRANCHED_COMMAND], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"batchlab probe branched failed ({done.returncode}): {done.stderr.strip()}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    payload = ("\n".join(lines) + "\n").encode()
    write_stream_atomic(out, lambda handle: handle.write(payload))
    write_json(RESULTS / "branched_meta.json", {"command": "batchlab " + " ".join(BRANCHED_COMMAND),
                                                "wall_seconds_this_call": time.perf_counter() - start,
                                                "environment": environment()})
    return [json.loads(line) for line in lines]


def warmup_from(checkpoints: list[dict]) -> BatchSizeSchedule:
    """The probe's warmup (``warmup_batch_size`` from each checkpoint's reference step on) in examples:
    reference step t of the B = 32 run begins after 32·t examples; equal neighbours merged."""
    points: list[tuple[int, int]] = []
    for c in sorted(checkpoints, key=lambda c: c["step"]):
        size = int(c["warmup_batch_size"])
        if not points or points[-1][1] != size:
            points.append((BASE_BATCH * int(c["step"]), size))
    return BatchSizeSchedule(tuple(points), unit="examples")


def arm_schedule(arm: str, warmup: BatchSizeSchedule) -> BatchSizeSchedule:
    if arm == "small":
        return BatchSizeSchedule(((0, BASE_BATCH),))
    if arm == "large":
        largest = warmup.batch_sizes[-1]
        return BatchSizeSchedule(((0, largest if largest > BASE_BATCH else FALLBACK_LARGE),))
    return warmup


# --- (2) one training run ---------------------------------------------------------------------------------


def train_run(arm: str, seed: int, schedule: BatchSizeSchedule, workload, data) -> dict:
    """Train one arm at one seed (PROTOCOL.md, "Training") and return its record."""
    model = workload.build_model(seed=seed)
    model.train()
    algorithm = build_training_algorithm("adam", model, workload.loss, hyperparameters={"learning_rate": BASE_LR})
    optimizer = algorithm.optimizer
    lr_factor = examples_lr_schedule("linear", TOTAL_EXAMPLES, 0, END_FACTOR)
    sampler = BatchSampler(len(data.train), MICRO_BATCH, seed)

    def val_loss() -> float:
        return float(workload.evaluate(model, data.val)["val/cross_entropy_error"])

    consumed, updates, micro = 0, 0, 0
    curve = [{"examples": 0, "updates": 0, "val_loss": val_loss()}]
    next_eval = EVAL_EVERY
    diverged = False
    start = time.perf_counter()
    while consumed < TOTAL_EXAMPLES:
        batch = schedule.batch_size_at(consumed)
        k = accumulation_steps(batch, MICRO_BATCH)
        lr = rescaled_learning_rate(BASE_LR, BASE_BATCH, batch, LR_RULE) * lr_factor(consumed)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(k):
            x, y = data.train.batch(sampler.indices(micro))
            micro += 1
            loss = workload.loss(model(x), y) / k
            loss.backward()
            total += float(loss.detach())
        if not math.isfinite(total):
            diverged = True
            break
        optimizer.step()
        consumed += batch
        updates += 1
        if consumed >= next_eval:
            curve.append({"examples": consumed, "updates": updates, "val_loss": val_loss(), "batch_size": batch,
                          "learning_rate": lr})
            while next_eval <= consumed:
                next_eval += EVAL_EVERY
    return {"arm": arm, "seed": seed, "schedule": schedule.to_dict(), "diverged": diverged,
            "examples": consumed, "updates": updates, "final_val_loss": math.inf if diverged else curve[-1]["val_loss"],
            "curve": curve, "wall_seconds": time.perf_counter() - start, "environment": environment()}


# --- (3) the analysis (PROTOCOL.md, "Target and measurements", "Tests") ------------------------------------


def to_target(run: dict, tau: float) -> tuple[int | None, int | None]:
    for point in run["curve"]:
        if point["val_loss"] <= tau:
            return point["updates"], point["examples"]
    return None, None


def t_interval(values: list[float], level: float = 0.95) -> dict:
    from scipy import stats

    v = np.asarray(values, dtype=float)
    n = len(v)
    mean = float(v.mean()) if n else None  # None, not NaN: summary.json stays strict JSON
    if n < 2 or not np.all(np.isfinite(v)):
        return {"n": n, "mean": mean, "low": None, "high": None, "values": v.tolist()}
    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * v.std(ddof=1) / math.sqrt(n))
    return {"n": n, "mean": mean, "low": mean - half, "high": mean + half, "level": level,
            "positive": int((v > 0).sum()), "negative": int((v < 0).sum()), "values": v.tolist()}


def analyse(runs: dict[tuple[str, int], dict], warmup: BatchSizeSchedule | None,
            arms: tuple[str, ...] = ARMS, planned: tuple[int, ...] = SEEDS) -> dict:
    """The summary over ``planned`` seeds that have every arm in ``arms`` finished (defaults: the protocol's
    arms and seeds). The target needs the small arm; a comparison needs both of its arms."""
    seeds = [s for s in planned if all((a, s) in runs for a in arms)]
    partial = len(seeds) < len(planned)
    small_final = [runs[("small", s)]["final_val_loss"] for s in seeds] if "small" in arms else []
    summary: dict = {"partial": partial, "seeds_complete": seeds, "planned_seeds": list(planned),
                     "runs_finished": sorted(f"{a}_seed{s}" for a, s in runs),
                     "warmup_schedule": None if warmup is None else warmup.to_dict(), "environment": environment()}
    if not seeds or not small_final:
        return summary
    tau = (1.0 + TARGET_SLACK) * float(np.mean(small_final))
    summary["target_val_loss"] = tau
    rows = []
    for a in arms:
        for s in seeds:
            r = runs[(a, s)]
            steps, examples = to_target(r, tau)
            rows.append({"arm": a, "seed": s, "batch_sizes": [p["batch_size"] for p in r["schedule"]["points"]],
                         "updates_total": r["updates"], "examples_total": r["examples"],
                         "updates_to_target": steps, "examples_to_target": examples,
                         "final_val_loss": r["final_val_loss"], "diverged": r["diverged"],
                         "wall_seconds": r["wall_seconds"]})
    summary["runs"] = rows
    by = {(r["arm"], r["seed"]): r for r in rows}
    tests = {}
    for treat, ref in (("warmup", "small"), ("large", "small"), ("warmup", "large")):
        if treat not in arms or ref not in arms:
            continue
        reached = [s for s in seeds if by[(treat, s)]["updates_to_target"] is not None
                   and by[(ref, s)]["updates_to_target"] is not None]
        saving = [1.0 - by[(treat, s)]["updates_to_target"] / by[(ref, s)]["updates_to_target"] for s in reached]
        example_ratio = [by[(treat, s)]["examples_to_target"] / by[(ref, s)]["examples_to_target"] for s in reached]
        diff = [by[(treat, s)]["final_val_loss"] - by[(ref, s)]["final_val_loss"] for s in seeds]
        tests[f"{treat}_vs_{ref}"] = {
            "seeds_both_reached_target": reached,
            "step_saving_to_target": t_interval(saving),
            "examples_to_target_ratio": t_interval(example_ratio),
            "final_loss_difference": t_interval(diff),
            "total_update_saving": 1.0 - by[(treat, seeds[0])]["updates_total"] / by[(ref, seeds[0])]["updates_total"],
        }
    summary["tests"] = tests
    summary["exploratory"] = exploratory(runs, seeds, arms)
    if "warmup_vs_small" not in tests:
        return summary
    w = tests["warmup_vs_small"]
    mean_small = float(np.mean(small_final))
    s_int, d_int = w["step_saving_to_target"], w["final_loss_difference"]
    every_reached = len(w["seeds_both_reached_target"]) == len(seeds)
    holds = bool(every_reached and s_int["low"] is not None and s_int["low"] > 0
                 and d_int["high"] is not None and d_int["high"] < TARGET_SLACK * mean_small)
    summary["verdict"] = {
        "every_warmup_seed_reached_target": every_reached,
        "saving_interval_above_zero": s_int["low"] is not None and s_int["low"] > 0,
        "final_loss_not_worse_than_1pct": d_int["high"] is not None and d_int["high"] < TARGET_SLACK * mean_small,
        "final_loss_better": d_int["high"] is not None and d_int["high"] < 0,
        "merrill_43pct_inside_saving_interval": (s_int["low"] is not None and s_int["low"] <= 0.43 <= s_int["high"]),
        "holds": holds, "partial": partial,
    }
    return summary


EXPLORATORY_AT = (4096, 8192, 16384, 32768, 49152, 65536)


def exploratory(runs: dict[tuple[str, int], dict], seeds: list[int], arms: tuple[str, ...] = ARMS) -> dict:
    """Descriptive, NOT part of the protocol's tests (added after the results were seen): each arm's mean
    validation loss at the warmup's switch points and a few others (examples consumed), with its
    95% t-interval over seeds; and, per seed, the updates and examples the small arm needs to reach the
    same seed's warmup-arm final loss (a looser, post-hoc target)."""
    def at(run: dict, examples: int) -> float:
        return next(p["val_loss"] for p in run["curve"] if p["examples"] >= examples)

    curves = {a: {str(e): t_interval([at(runs[(a, s)], e) for s in seeds]) for e in EXPLORATORY_AT} for a in arms}
    if "warmup" not in arms:
        return {"note": "post hoc, descriptive; not among the protocol's tests", "val_loss_at_examples": curves}
    gaps = {str(e): t_interval([at(runs[("warmup", s)], e) - at(runs[("small", s)], e) for s in seeds])
            for e in EXPLORATORY_AT}
    looser = []
    for s in seeds:
        level = runs[("warmup", s)]["final_val_loss"]
        steps, examples = to_target(runs[("small", s)], level)
        looser.append({"seed": s, "warmup_final_val_loss": level, "warmup_updates": runs[("warmup", s)]["updates"],
                       "warmup_examples": runs[("warmup", s)]["examples"],
                       "small_updates_to_it": steps, "small_examples_to_it": examples})
    reached = [r for r in looser if r["small_updates_to_it"] is not None]
    return {"note": "post hoc, descriptive; not among the protocol's tests",
            "val_loss_at_examples": curves, "warmup_minus_small_at_examples": gaps,
            "small_arm_to_warmup_final_loss": looser,
            "step_saving_at_warmup_final_loss": t_interval([1 - r["warmup_updates"] / r["small_updates_to_it"]
                                                             for r in reached]),
            "examples_ratio_at_warmup_final_loss": t_interval([r["warmup_examples"] / r["small_examples_to_it"]
                                                                for r in reached])}


def table(summary: dict, arms: tuple[str, ...] = ARMS) -> str:
    lines = [f"# Results{' (PARTIAL: seeds ' + str(summary['seeds_complete']) + ' of ' + str(summary['planned_seeds']) + ')' if summary['partial'] else ''}", ""]
    if "runs" not in summary:
        if arms == ARMS:
            return "\n".join(lines + ["No seed has all three arms finished yet.", ""])
        return "\n".join(lines + [f"No table: no seed has all of {', '.join(arms)} finished, or the small arm "
                                   "(which sets the target) is not among them.", ""])
    lines += [f"Target validation loss tau = {summary['target_val_loss']:.4f} nats/char "
              f"(1.01 x mean final loss of the small arm). Warmup schedule (examples consumed -> batch size): "
              + ", ".join(f"{p['start']} -> {p['batch_size']}" for p in summary["warmup_schedule"]["points"]), "",
              "| arm | seed | batch sizes | updates (total) | updates to tau | examples to tau | final val loss |",
              "|---|---|---|---|---|---|---|"]
    for r in summary["runs"]:
        fmt = (lambda v: "not reached" if v is None else str(v))
        lines.append(f"| {r['arm']} | {r['seed']} | {'/'.join(map(str, r['batch_sizes']))} | {r['updates_total']} | "
                     f"{fmt(r['updates_to_target'])} | {fmt(r['examples_to_target'])} | {r['final_val_loss']:.4f} |")
    lines += ["", "| comparison | quantity | mean | 95% t-interval | per seed |", "|---|---|---|---|---|"]
    for name, t in summary["tests"].items():
        for q in ("step_saving_to_target", "examples_to_target_ratio", "final_loss_difference"):
            i = t[q]
            interval = "n/a" if i["low"] is None else f"[{i['low']:.4f}, {i['high']:.4f}]"
            mean = "n/a (n = 0)" if i["mean"] is None else f"{i['mean']:.4f}"
            lines.append(f"| {name} | {q} | {mean} | {interval} | {', '.join(f'{v:.4f}' for v in i['values'])} |")
        lines.append(f"| {name} | total_update_saving (schedule) | {t['total_update_saving']:.4f} | exact | |")
    if "verdict" in summary:
        lines += ["", "Verdict (PROTOCOL.md): " + json.dumps(summary["verdict"]), ""]
    x = summary["exploratory"]
    if "warmup_minus_small_at_examples" not in x:
        return "\n".join(lines + [""])
    fmt_interval = (lambda i: f"{i['mean']:.4f} [n/a]" if i["low"] is None else
                    f"{i['mean']:.4f} [{i['low']:.4f}, {i['high']:.4f}]")
    lines += ["## Exploratory (post hoc, descriptive; not among the protocol's tests)", "",
              "Mean validation loss over seeds at equal examples consumed (95% t-interval):", "",
              "| examples | " + " | ".join(arms) + " | warmup - small |", "|---" * (len(arms) + 2) + "|"]
    for e in EXPLORATORY_AT:
        cells = [fmt_interval(x['val_loss_at_examples'][a][str(e)]) for a in arms]
        g = x["warmup_minus_small_at_examples"][str(e)]
        gap = f"{g['mean']:+.4f} [n/a]" if g["low"] is None else f"{g['mean']:+.4f} [{g['low']:+.4f}, {g['high']:+.4f}]"
        lines.append(f"| {e} | " + " | ".join(cells) + f" | {gap} |")
    lines += ["", "The small arm to the same seed's warmup-arm final loss (a looser, post-hoc target):", "",
              "| seed | warmup final loss | warmup updates / examples | small updates / examples to it |", "|---|---|---|---|"]
    for r in x["small_arm_to_warmup_final_loss"]:
        lines.append(f"| {r['seed']} | {r['warmup_final_val_loss']:.4f} | {r['warmup_updates']} / {r['warmup_examples']} | "
                     f"{r['small_updates_to_it']} / {r['small_examples_to_it']} |")
    for name in ("step_saving_at_warmup_final_loss", "examples_ratio_at_warmup_final_loss"):
        i = x[name]
        interval = "n/a" if i["low"] is None else f"[{i['low']:.4f}, {i['high']:.4f}]"
        mean = "n/a" if i["mean"] is None else f"{i['mean']:.4f}"
        lines.append(f"\n{name}: mean {mean}, 95% t-interval {interval} (n = {i['n']})")
    lines.append("")
    return "\n".join(lines)


def load_runs(results: Path = RESULTS) -> dict[tuple[str, int], dict]:
    runs = {}
    for path in sorted((results / "runs").glob("*.json")):
        r = json.loads(path.read_text())
        runs[(r["arm"], r["seed"])] = r
    return runs


def fail(message: str) -> None:
    """Bad input: one line on stderr naming the problem and the allowed values, exit status 2, no traceback."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def choice_list(text: str, allowed: tuple, kind, name: str) -> tuple:
    """``text`` split at commas, each converted by ``kind`` and checked against ``allowed``; returned in the
    order of ``allowed`` (the protocol's run order), duplicates removed."""
    allowed_text = ",".join(map(str, allowed))
    try:
        chosen = {kind(v.strip()) for v in text.split(",") if v.strip()}
    except ValueError:
        chosen = set()
    if not chosen or not chosen <= set(allowed):
        fail(f"--{name} {text!r}: a comma-separated list of {allowed_text}")
    return tuple(v for v in allowed if v in chosen)


def check_capability(path: Path) -> None:
    """A finished run file in this directory must come from the running process's ATen CPU capability."""
    recorded = json.loads(path.read_text())["environment"]["aten_cpu_capability"]
    current = torch.backends.cpu.get_cpu_capability()
    if recorded != current:
        fail(f"{path} was run under ATen CPU capability {recorded}, this process has {current}; "
                         "use another --results-dir or the same ATEN_CPU_CAPABILITY")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--analyse-only", action="store_true", help="recompute the summary from finished runs")
    parser.add_argument("--deadline", default=None, help="UTC time HH:MM after which no new run starts")
    parser.add_argument("--results-dir", type=Path, default=RESULTS,
                        help=f"where runs and the summary go (default {RESULTS}); other than the default needs --schedule")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {','.join(ARMS)} (default all)")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)),
                        help=f"comma-separated subset of {','.join(map(str, SEEDS))} (default all)")
    parser.add_argument("--schedule", type=Path, default=None,
                        help="a saved BatchSizeSchedule (e.g. results/warmup_schedule.json) used instead of the "
                             "branched measurement")
    args = parser.parse_args()
    arms = choice_list(args.arms, ARMS, str, "arms")
    seeds = choice_list(args.seeds, SEEDS, int, "seeds")
    results = args.results_dir.resolve()
    if args.schedule is not None and not args.schedule.is_file():
        fail(f"--schedule {args.schedule}: no such file (a batchlab.batch_size_schedule JSON file)")
    if results != RESULTS and args.schedule is None and not args.analyse_only:
        fail(f"--results-dir {args.results_dir} needs --schedule FILE (the branched measurement's "
                         f"cache is in {RESULTS})")
    warmup = None
    if not args.analyse_only and args.schedule is not None:
        try:
            warmup = BatchSizeSchedule.load(args.schedule)
        except BatchlabError as error:
            fail(f"--schedule: {error}")
        if warmup.unit != "examples":
            fail(f"--schedule {args.schedule}: unit {warmup.unit!r}, allowed: 'examples'")
    results.mkdir(parents=True, exist_ok=True)
    if not args.analyse_only:
        if warmup is None:
            warmup = warmup_from(branched_measurement())
        warmup.save(results / "warmup_schedule.json")
        print("warmup schedule (examples -> batch size):", warmup.points, flush=True)
        workload = resolve_workload(WORKLOAD)
        data = workload.load_data()
        for seed in seeds:
            for arm in arms:
                path = results / "runs" / f"{arm}_seed{seed}.json"
                if path.exists():
                    check_capability(path)
                    continue
                if args.deadline and time.strftime("%H:%M", time.gmtime()) >= args.deadline:
                    print(f"deadline {args.deadline} UTC reached: stopping before {arm} seed {seed}", flush=True)
                    break
                record = train_run(arm, seed, arm_schedule(arm, warmup), workload, data)
                write_json(path, record)
                print(f"{arm} seed {seed}: {record['updates']} updates, final val loss {record['final_val_loss']:.4f}, "
                      f"{record['wall_seconds']:.0f} s", flush=True)
            else:
                continue
            break
    elif (results / "warmup_schedule.json").exists():
        warmup = BatchSizeSchedule.load(results / "warmup_schedule.json")
    summary = analyse(load_runs(results), warmup, arms, seeds)
    write_json(results / "summary.json", summary)
    text = table(summary, arms).encode()
    write_stream_atomic(results / "table.md", lambda handle: handle.write(text))
    print(table(summary, arms))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
