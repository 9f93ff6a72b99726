"""What ``batchlab advise`` spends to find the critical batch size, against the committed full sweeps.

For each entry (a workload and optimizer with a committed full sweep, ``ENTRIES``) this runs
:func:`batchlab.advise.advise` with ``config=`` the committed sweep's TOML (so the same budgets, search
spaces, goal, evaluation schedule, racing and batch order; its ``batch_sizes`` are advise's candidates),
the committed config's trials per study, a budget of a tenth of the full protocol (``--budget-examples``),
objective ``time``, the default target ratio 1.5, the check on, one
worker, into a resumable store ``runs/advise_cost/<name>`` (re-running resumes from the store). Then it
compares, per entry (protocol: experiments/advise/README.md; definitions: docs/methods.md, "Measuring
advise against full sweeps"):

- advise's ``mccandlish_b_crit`` [low, high] (its last round's fit, 90%) against the full sweep's: the
  row of the committed report's ``refit.jsonl`` whose group is that workload/optimizer (the current
  statistics' refit of the full sweep); whether advise's point lies inside the full sweep's interval
  and whether the intervals overlap;
- advise's compute (the record's ``spent.total``: every trial of its unit, the throughput probe, the
  predictors and the check, in training examples = updates x B) against the full protocol of the
  committed config: sum over its ``batch_sizes`` of its ``trials`` x its ``[budgets]`` steps x B (every
  trial to its whole budget, at the config's budgets before any growth). The committed sweep itself was
  raced and stopped at the goal, so it spent less; its CSVs do not record how much. Printed: the
  fraction advise / full and the ratio full / advise (the claim: >= 10);
- the stop reason, the recommendation (B, learning rate), the check (reached, steps, within the
  predicted interval).

Goal (issue 22): B_crit inside the full sweep's interval on every entry, at 10x less compute or better.
Every miss is printed with the reasons the record shows.

Written: ``experiments/advise/advise_cost.txt`` (what is printed) and ``advise_cost.jsonl`` (one object
per entry; ``--only`` replaces that entry's line and keeps the others).

Run (hours of CPU on 2 shared cores): ``OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE .venv/bin/python
benchmarks/advise_cost.py``; ``--dry-run`` prints the entries and their full-protocol compute without
training; ``--only NAME`` runs one entry; ``--check-after`` runs, for every finished entry whose check the
budget skipped, that check outside advise's budget (reported as ``check_after``, never in advise's examples).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import tomllib  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: The claim: advise's compute at most this fraction of the full protocol's.
GOAL_RATIO = 10.0
TARGET_RATIO = 1.5
#: advise's budget: this fraction of each entry's full protocol (``budget_examples``), so the compute
#: side of the goal holds unless a study runs past the budget (at most one study may).
BUDGET_FRACTION = 0.1


@dataclass(frozen=True)
class Entry:
    """One comparison: advise on ``workload`` / ``optimizer`` with ``config``, against the committed
    full sweep's refit in ``reports/<report>/refit.jsonl`` (the row of group ``<group>/<optimizer>``)."""

    name: str
    config: str
    workload: str
    group: str  # the store workload (dataset/model) of the refit's group
    optimizer: str
    report: str


ENTRIES = [
    Entry("fc64_sgd", "experiments/fc64_optimizers_race.toml", "mnist/fc_64_64_64", "mnist/fc_64_64_64", "sgd",
          "fc64_optimizers"),
    Entry("fc64_momentum", "experiments/fc64_optimizers_race.toml", "mnist/fc_64_64_64", "mnist/fc_64_64_64",
          "momentum", "fc64_optimizers"),
    Entry("fc64_adam", "experiments/fc64_optimizers_race.toml", "mnist/fc_64_64_64", "mnist/fc_64_64_64", "adam",
          "fc64_optimizers"),
    Entry("fc128_sgd", "experiments/fc128_sgd_momentum_race.toml", "mnist/fc_128_128_128", "mnist/fc_128_128_128",
          "sgd", "fc128_race"),
    Entry("cnn_tiny_adam", "experiments/cnn_tiny_race.toml", "experiments/workloads.py:mnist_simple_cnn_tiny",
          "mnist/simple_cnn_tiny", "adam", "cnn_tiny"),
]


def full_protocol(config: str) -> dict:
    """The committed config's full protocol: every batch size, its trials, every trial to its whole
    ``[budgets]`` step budget; examples = sum over B of trials x steps(B) x B."""
    settings = tomllib.loads((ROOT / config).read_text())
    budgets = {int(b): int(s) for b, s in settings["budgets"].items()}
    sizes = sorted(int(b) for b in settings["batch_sizes"])
    missing = [b for b in sizes if b not in budgets]
    if missing:
        raise SystemExit(f"{config}: no [budgets] entry for B = {missing}")
    trials = int(settings["trials"])
    return {"examples": sum(trials * budgets[b] * b for b in sizes), "batch_sizes": sizes, "trials": trials,
            "raced": bool(settings.get("race")), "grow_budget": bool(settings.get("grow_budget"))}


def advise_settings(entry: Entry) -> tuple[int, int]:
    """advise's trials per study (the committed config's own ``trials``) and its examples budget
    (``BUDGET_FRACTION`` of the full protocol, rounded down)."""
    full = full_protocol(entry.config)
    return full["trials"], int(full["examples"] * BUDGET_FRACTION)


def full_sweep_b_crit(entry: Entry) -> dict:
    """The full sweep's ``mccandlish_b_crit`` and interval from the committed report's refit."""
    path = ROOT / "experiments" / "reports" / entry.report / "refit.jsonl"
    want = f"{entry.group}/{entry.optimizer}"
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["group"].split(" [")[0] == want:
            interval = (row.get("intervals") or {}).get("mccandlish_b_crit") or {}
            return {"group": row["group"], "value": row.get("mccandlish_b_crit"), "low": interval.get("low"),
                    "high": interval.get("high"), "batch_size_range": row.get("batch_size_range"),
                    "source": str(path.relative_to(ROOT))}
    raise SystemExit(f"{path}: no row of group {want}")


def _num(x) -> float:
    return math.nan if x is None else float(x)


def compare(entry: Entry, record: dict, seconds: float) -> dict:
    """The comparison of one advice record with its committed full sweep (module docstring)."""
    full = full_protocol(entry.config)
    sweep = full_sweep_b_crit(entry)
    last = (record.get("rounds") or [{}])[-1].get("b_crit") or {}
    value, low, high = _num(last.get("value")), _num(last.get("low")), _num(last.get("high"))
    f_low, f_high = _num(sweep["low"]), _num(sweep["high"])
    f_high_eff = math.inf if math.isnan(f_high) else f_high
    # a null end of an interval that has a point is an open end (0 below, infinity above)
    low_eff = 0.0 if math.isnan(low) else low
    high_eff = math.inf if math.isnan(high) else high
    inside = bool(math.isfinite(value) and f_low <= value <= f_high_eff)
    overlap = bool(math.isfinite(value) and low_eff <= f_high_eff and f_low <= high_eff)
    spent = record.get("spent") or {}
    total = int(spent.get("total") or 0)
    rec = record.get("recommendation") or {}
    check = record.get("check") or {}
    measured = sorted({b for r in record.get("rounds") or [] for b in r.get("batch_sizes") or []})
    bracket = record.get("bracket") or {}
    row = {
        "name": entry.name, "workload": entry.workload, "optimizer": entry.optimizer, "config": entry.config,
        "unit": record.get("unit"), "advice_id": record.get("advice_id"), "status": record.get("status"),
        "b_crit": {"value": last.get("value"), "low": last.get("low"), "high": last.get("high")},
        "full_b_crit": sweep, "inside": inside, "overlap": overlap,
        "examples": total, "spent": spent, "full_protocol": full,
        "fraction": total / full["examples"] if full["examples"] else None,
        "full_over_advise": full["examples"] / total if total else None,
        "advise_full_protocol": record.get("full_protocol"),
        "stop": record.get("stop"), "bracket": {k: bracket.get(k) for k in ("low", "high", "source", "reason")},
        "batch_sizes_measured": measured,
        "points": [{k: t.get(k) for k in ("batch_size", "n_trials", "n_reached", "steps", "censored_at")}
                   for t in rec.get("table") or []],
        "rounds": [{k: r.get(k) for k in ("round", "action", "batch_sizes", "trials", "b_crit", "ratio",
                                           "examples_after", "seconds")} for r in record.get("rounds") or []],
        "recommendation": {"batch_size": rec.get("batch_size"),
                           "learning_rate": (rec.get("hyperparameters") or {}).get("learning_rate"),
                           "hyperparameters": rec.get("hyperparameters")} if rec else None,
        "check": {k: check.get(k) for k in ("reached", "steps", "steps_lower", "predicted_low", "predicted_high",
                                            "within", "skipped", "text")} if check else None,
        "seconds": seconds,
    }
    row["misses"] = misses(row)
    return row


def misses(row: dict) -> list[str]:
    """Every way the entry misses the goal, with the reasons its record shows."""
    out = []
    b, f = row["b_crit"], row["full_b_crit"]
    stop = row["stop"] or {}
    if not row["inside"]:
        why = []
        if b.get("value") is None:
            why.append("advise has no B_crit")
        elif b["value"] < f["low"]:
            why.append(f"advise's B_crit {b['value']:.4g} is below the full sweep's interval")
        else:
            why.append(f"advise's B_crit {b['value']:.4g} is above the full sweep's interval")
        why.append("the intervals overlap" if row["overlap"] else "the intervals do not overlap")
        br = row["bracket"]
        if br.get("low") is not None:
            cover = br["low"] <= (f["value"] or 0) <= br["high"]
            why.append(f"bracket [{br['low']}, {br['high']}] ({br['source']}) "
                       + ("contains" if cover else "misses") + f" the full sweep's B_crit {f['value']:.4g}")
        m = row.get("points") or []
        if m:
            why.append("reached/trials per measured B: " + ", ".join(
                f"{t['batch_size']} {t['n_reached']}/{t['n_trials']}" for t in m))
        elif row["batch_sizes_measured"]:
            why.append(f"advise measured B = {', '.join(map(str, row['batch_sizes_measured']))}")
        out.append("B_crit outside the full sweep's interval: " + "; ".join(why) + f"; stop {stop.get('reason')}: "
                   f"{stop.get('text')}")
    ratio = row["full_over_advise"]
    if ratio is None or ratio < GOAL_RATIO:
        parts = {k: v for k, v in (row["spent"] or {}).items() if k in ("studies", "throughput", "predictors", "check")}
        total = max(1, row["examples"])
        where = ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]))
        out.append(f"compute {row['examples']:,} examples = 1/{ratio:.3g} of the full protocol (goal 1/{GOAL_RATIO:g}):"
                   f" {where}; {len(row['rounds'])} rounds, stop {stop.get('reason')}"
                   if ratio else "compute: nothing spent")
    return out


def _interval(d: dict) -> str:
    def one(x):
        return "open" if x is None else f"{x:.0f}"

    if d.get("value") is None:
        return "-"
    return f"{d['value']:.0f} [{one(d.get('low'))}, {one(d.get('high'))}]"


def table(rows: list[dict]) -> list[str]:
    """The printed table, the goal and every miss."""
    out = [f"{'entry':<15}{'advise B_crit':>20}{'full B_crit':>20}{'in':>4}{'ovl':>5}{'examples':>13}"
           f"{'fraction':>10}{'full/adv':>9}  {'stop':<11}{'recommend':<18}{'check':<16}{'min':>6}"]
    for r in rows:
        rec = r["recommendation"]
        lr = rec and rec.get("learning_rate")
        rec_text = "-" if not rec else f"B={rec['batch_size']} lr={lr:.3g}" if lr else f"B={rec['batch_size']}"
        c = r["check"] or {}
        after = c.get("skipped") and r.get("check_after")
        if after:
            c = after
        if not c:
            check_text = "-"
        elif c.get("skipped"):
            check_text = "skipped"
        elif not c.get("reached"):
            check_text = "not reached"
        else:
            check_text = f"{c['steps']} " + {True: "within", False: "outside", None: "no pred."}[c.get("within")]
        if after:
            check_text += "*"
        out.append(f"{r['name']:<15}{_interval(r['b_crit']):>20}{_interval(r['full_b_crit']):>20}"
                   f"{'y' if r['inside'] else 'n':>4}{'y' if r['overlap'] else 'n':>5}{r['examples']:>13,}"
                   f"{r['fraction']:>10.3f}{r['full_over_advise'] or 0:>9.2f}  {(r['stop'] or {}).get('reason', '-'):<11}"
                   f"{rec_text:<18}{check_text:<16}{(r['spent'] or {}).get('seconds', 0.0) / 60:>6.1f}")
    out.append("B_crit: mccandlish_b_crit [90% interval]; advise's from its last round, the full sweep's from the committed "
               "report's refit.jsonl (open: the interval is unbounded on that side, null in the record). in: advise's point "
               "inside the full sweep's interval; ovl: the intervals overlap.")
    out.append("examples: advise's spent.total (studies, throughput, predictors, check); fraction = examples / the "
               "committed config's full protocol (its batch sizes x its trials x its budgets x B, every trial to its "
               "budget); the committed sweeps were raced and stopped at the goal, so spent less (not recorded in "
               "their CSVs). min: minutes of advise's runs (the record's spent.seconds: throughput, rounds, predictors, check, "
               "summed over resumed calls).")
    met = [r for r in rows if r["inside"] and (r["full_over_advise"] or 0) >= GOAL_RATIO]
    out.append(f"goal: B_crit inside the full sweep's interval on every entry at >= {GOAL_RATIO:g}x less compute: "
               f"met on {len(met)} of {len(rows)} entries")
    for r in rows:
        for m in r["misses"]:
            out.append(f"miss {r['name']}: {m}")
        c = r["check"] or {}
        if c.get("text"):
            out.append(f"check {r['name']}: {c['text']}")
        if (r.get("check_after") or {}).get("text"):
            out.append(f"check after advise (*: outside its budget, not in its examples) {r['name']}: "
                       f"{r['check_after']['text']}")
    return out


def run_entry(entry: Entry, store_root: Path) -> dict:
    """Run (or resume) advise for one entry; its comparison row."""
    from batchlab.advise import advise

    started = time.time()

    def say(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {entry.name}: {message}", flush=True)

    trials, budget = advise_settings(entry)
    say(f"advise {entry.workload} --optimizer {entry.optimizer} --config {entry.config} --study-trials {trials} "
        f"--budget-examples {budget} --store {store_root / entry.name}")
    result = advise(entry.workload, entry.optimizer, store=store_root / entry.name, config=ROOT / entry.config,
                    trials=trials, budget_examples=budget, objective="time", target_ratio=TARGET_RATIO, workers=1, check=True, seed=0,
                    progress=say)
    seconds = time.time() - started
    for line in result.lines():
        say(line)
    return compare(entry, result.record, seconds)


def check_after(entry: Entry, store_root: Path) -> dict | None:
    """The check advise skips when its budget is spent, run after it, outside its budget: one fresh trial
    of the record's recommendation exactly as advise's own check step runs it (the same seed offset, step
    budget, goal, evaluations and predicted interval capped at the budget). ``None`` when the record's own
    check ran (or there is no recommendation). Its examples are reported beside advise's, never in them."""
    from batchlab.advise.check import check_recommendation
    from batchlab.advise.run import CHECK_SEED_OFFSET, _base_config  # the settings advise's own studies ran with
    from batchlab.sweep.config import steps_from_rule
    from batchlab.workloads import get_workload

    record = finished_record(entry, store_root) or {}
    rec, own = record.get("recommendation"), record.get("check") or {}
    if not rec or not own.get("skipped"):
        return None
    trials, _ = advise_settings(entry)
    cfg, _ = _base_config(entry.workload, entry.optimizer, store=store_root / entry.name, config=ROOT / entry.config,
                          search_space=None, trials=trials, seed=record["settings"]["seed"], device="auto", workers=1,
                          dask=False, scheduler=None, train_examples=None, goal=None)
    b = int(rec["batch_size"])
    steps = steps_from_rule(cfg.budget_rule(get_workload(cfg.workloads[0])), b)
    low, high = (rec.get("check") or {}).get("low"), (rec.get("check") or {}).get("high")
    if high is not None:
        high = min(float(high), float(steps))
    result = check_recommendation(cfg.workloads[0], entry.optimizer, b, rec["hyperparameters"], steps=steps,
                                  predicted_low=low, predicted_high=high, seed=record["settings"]["seed"] + CHECK_SEED_OFFSET,
                                  device=cfg.device, train_examples=cfg.train_examples, goal=cfg.goal,
                                  evaluations=cfg.evaluations, resolution=float(cfg.resolution))
    return dict(result.to_dict(), outside_budget=True)


def write(rows: list[dict], out: Path) -> None:
    """Merge ``rows`` into ``out/advise_cost.jsonl`` (by name) and rewrite ``advise_cost.txt``."""
    import fcntl

    out.mkdir(parents=True, exist_ok=True)
    path = out / "advise_cost.jsonl"
    with open(out / ".advise_cost.lock", "w") as lock:  # two runs with --only may finish at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        _merge(rows, out, path)


def _merge(rows: list[dict], out: Path, path: Path) -> None:
    kept = rows_by_name(out)
    kept.update({r["name"]: r for r in rows})
    order = [e.name for e in ENTRIES]
    merged = sorted(kept.values(), key=lambda r: order.index(r["name"]) if r["name"] in order else len(order))
    _write_atomic(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in merged))
    _write_atomic(out / "advise_cost.txt", "\n".join(table(merged)) + "\n")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def rewrite(entries: list[Entry], store_root: Path, out: Path) -> list[dict]:
    """The comparison rows of ``entries`` recomputed from their stores' finished advice records, with
    the minutes measured when they ran and any ``check_after`` (from ``out/advise_cost.jsonl``)."""
    kept = rows_by_name(out)
    rows = []
    for e in entries:
        record = finished_record(e, store_root)
        if record is not None and e.name in kept:
            row = compare(e, record, kept[e.name]["seconds"])
            if kept[e.name].get("check_after"):
                row["check_after"] = kept[e.name]["check_after"]
            rows.append(row)
    return rows


def rows_by_name(out: Path) -> dict[str, dict]:
    """The rows of ``out/advise_cost.jsonl`` by entry name (empty when there is none)."""
    path = out / "advise_cost.jsonl"
    if not path.exists():
        return {}
    return {row["name"]: row for row in map(json.loads, filter(str.strip, path.read_text().splitlines()))}


def finished_record(entry: Entry, store_root: Path) -> dict | None:
    """The entry's store's one finished advice record, else ``None``."""
    records = [json.loads(p.read_text()) for p in sorted((store_root / entry.name / "advice").glob("*.json"))]
    done = [r for r in records if r.get("status") == "done"]
    return done[0] if len(done) == 1 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=[e.name for e in ENTRIES],
                        help="run only this entry (repeatable)")
    parser.add_argument("--dry-run", action="store_true", help="print the entries and full-protocol compute; train nothing")
    parser.add_argument("--store-root", type=Path, default=ROOT / "runs" / "advise_cost")
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "advise")
    parser.add_argument("--rewrite", action="store_true",
                        help="recompute the comparison from the stores' finished advice records (the minutes from "
                             "the results file); train nothing")
    parser.add_argument("--check-after", action="store_true",
                        help="for each finished entry whose check the budget skipped, run that check now, outside "
                             "advise's budget, and add it to the entry's results (check_after)")
    args = parser.parse_args()
    entries = [e for e in ENTRIES if not args.only or e.name in args.only]
    if args.check_after:
        kept = rows_by_name(args.out)
        rows = []
        for e in entries:
            if e.name in kept and not kept[e.name].get("check_after"):
                print(f"[{time.strftime('%H:%M:%S')}] {e.name}: the check, after advise, outside its budget", flush=True)
                result = check_after(e, args.store_root)
                if result is not None:
                    rows.append(dict(kept[e.name], check_after=result))
        write(rows, args.out)
        print((args.out / "advise_cost.txt").read_text(), flush=True)
        return
    if args.rewrite:
        rows = rewrite(entries, args.store_root, args.out)
        write(rows, args.out)
        print("\n".join(table(rows)), flush=True)
        return
    if args.dry_run:
        print(f"{'entry':<15}{'workload':<48}{'optimizer':<10}{'full B_crit':>20}{'full protocol':>16}  rule")
        for e in entries:
            full, sweep = full_protocol(e.config), full_sweep_b_crit(e)
            trials, budget = advise_settings(e)
            print(f"{e.name:<15}{e.workload:<48}{e.optimizer:<10}{_interval(sweep):>20}{full['examples']:>16,}  "
                  f"{len(full['batch_sizes'])} batch sizes {full['batch_sizes'][0]}..{full['batch_sizes'][-1]} x "
                  f"{full['trials']} trials x {e.config} budgets x B; advise: {trials} trials a study, budget "
                  f"{budget:,} examples")
        print(f"advise settings: objective time, target ratio {TARGET_RATIO}, check on, workers 1, "
              f"stores {args.store_root}/<entry>")
        return
    args.store_root.mkdir(parents=True, exist_ok=True)  # the sweep wants a store's parent to exist
    rows = []
    for e in entries:
        try:
            rows.append(run_entry(e, args.store_root))
        except Exception:
            import traceback

            print(f"[{time.strftime('%H:%M:%S')}] {e.name}: FAILED", flush=True)
            traceback.print_exc()
            sys.stdout.flush()
            continue
        write(rows, args.out)
        print("\n".join(table(rows)), flush=True)
    if rows:
        write(rows, args.out)
        print("\n".join(table(rows)), flush=True)


if __name__ == "__main__":
    main()
