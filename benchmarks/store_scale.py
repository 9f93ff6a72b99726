"""Store at release scale: import throughput, steps to result for all 35 workloads, peak memory.

Generates a synthetic batch_science release shaped by ``benchmarks/data/shallue_studies.csv`` (the
release's 454 studies: workload, batch size and trial counts by status; trial counts times
``--scale``; about 71.6M measurements at scale 1, irregular evaluation steps), imports it with
``batchlab.store``, answers steps to result (docs/methods.md, "Steps to result": first N COMPLETE
trials by id, strict comparison, first qualifying step, ties to the lower trial id) for every
workload, and compares with a baseline run in this process on a subset of studies: the original
loader's pandas method (read each CSV into pandas, concatenate, filter, group).

    .venv/bin/python benchmarks/store_scale.py --scale 0.05
    .venv/bin/python benchmarks/store_scale.py --scale 1 --workdir /work/tmp/scale   # full size

Goals on 2 cores: import >= 1M measurements/s, steps to result for all workloads < 5 s, peak
memory < 4 GB. Prints one JSON object at the end (``--json`` prints only that).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from batchlab.store import Store  # noqa: E402
from batchlab.store.batch_science_import import find_studies, import_batch_science  # noqa: E402
from batchlab.store.synthetic_release import (  # noqa: E402
    generate_release,
    read_study_shapes,
    workload_metrics,
)

STUDIES_CSV = Path(__file__).resolve().parent / "data" / "shallue_studies.csv"  # in the repository
SMALL_N = ("lm1b/lstm/", "common_crawl/transformer_base/", "lm1b/transformer_shallow/sgd")


def max_trials(workload: str) -> int:
    """Shallue et al.'s N: 100 COMPLETE trials per study, 50 for the three expensive workloads."""
    return 50 if workload.startswith(SMALL_N) else 100


def selections(workloads: list[str]) -> list[tuple[str, str, float, bool, int]]:
    """(workload, metric, goal, maximize, N) for every workload."""
    return [(w, *workload_metrics(w)[1:], max_trials(w)) for w in workloads]


# Per-trial first qualifying step over all trials first (one scan joined to the small selection
# table), then keep the first N COMPLETE trials: aggregating before the semi-join halves the work.
STEPS_SQL = """
WITH chosen AS (
    SELECT t.workload, t.batch_size, t.trial_id
    FROM trials t JOIN _sel s USING (workload)
    WHERE t.status = 'COMPLETE'
    QUALIFY row_number() OVER (PARTITION BY t.workload, t.batch_size ORDER BY t.trial_id)
        <= any_value(s.n) OVER (PARTITION BY t.workload)
),
first_steps AS (
    SELECT m.workload, m.batch_size, m.trial_id, min(m.step) AS first_step
    FROM measurements m JOIN _sel s ON m.workload = s.workload AND m.metric = s.metric
    WHERE isfinite(m.value) AND CASE WHEN s.maximize THEN m.value > s.goal ELSE m.value < s.goal END
    GROUP BY ALL
)
SELECT workload, batch_size, min([first_step, trial_id]) AS best
FROM first_steps SEMI JOIN chosen USING (workload, batch_size, trial_id)
GROUP BY ALL ORDER BY ALL
"""


def steps_to_result_sql(con, sels) -> dict[tuple[str, int], tuple[int, int]]:
    """{(workload, batch_size): (steps, trial_id)} for batch sizes where the goal is reached."""
    import pyarrow as pa

    table = pa.table({
        "workload": [s[0] for s in sels], "metric": [s[1] for s in sels],
        "goal": [float(s[2]) for s in sels], "maximize": [s[3] for s in sels],
        "n": [s[4] for s in sels],
    })
    con.register("_sel", table)
    rows = con.execute(STEPS_SQL).fetchall()
    con.unregister("_sel")
    return {(w, b): (best[0], best[1]) for w, b, best in rows}


def steps_to_result_analysis(con, sels):
    """The same through ``batchlab.analysis`` (the analysis package), or None if it is absent."""
    try:
        from batchlab.analysis.selection import Selection
        from batchlab.analysis.steps_to_result import steps_to_result_many
    except ImportError:
        return None
    results = steps_to_result_many(con, [
        Selection(workload=w, metric=m, goal=g, maximize=mx, max_trials=n) for w, m, g, mx, n in sels
    ])
    return {(r.workload, r.batch_size): (r.steps, r.trial_id)
            for per in results for r in per if r.steps is not None}


def pandas_baseline(studies, sels) -> tuple[dict, float, float]:
    """The original loader's method on ``studies``: every CSV into pandas, concat, filter, group.

    Returns (answers, seconds to load, seconds to filter and group)."""
    import pandas as pd

    goal_of = {s[0]: s[1:] for s in sels}
    start = time.perf_counter()
    frames = []
    for study in studies:
        for trial_dir in sorted((p for p in study.path.iterdir() if p.is_dir()), key=lambda p: int(p.name)):
            meta = json.loads((trial_dir / "metadata.json").read_text())
            frame = pd.read_csv(trial_dir / "measurements.csv")
            frame["workload"] = study.workload
            frame["batch_size"] = study.batch_size
            frame["trial_id"] = int(trial_dir.name)
            frame["status"] = meta["status"]
            frames.append(frame)
    data = pd.concat(frames, ignore_index=True)
    loaded = time.perf_counter()
    answers = {}
    for (workload, batch_size), group in data[data.status == "COMPLETE"].groupby(["workload", "batch_size"]):
        metric, goal, maximize, n = goal_of[workload]
        first_ids = sorted(group.trial_id.unique())[:n]
        g = group[group.trial_id.isin(first_ids)]
        hit = g[(g[metric] > goal) if maximize else (g[metric] < goal)]
        if len(hit):
            per_trial = hit.groupby("trial_id").step.min().reset_index()
            best = per_trial.sort_values(["step", "trial_id"]).iloc[0]
            answers[(workload, batch_size)] = (int(best.step), int(best.trial_id))
    done = time.perf_counter()
    return answers, loaded - start, done - loaded


def peak_rss_gb() -> dict:
    """Peak resident memory (GB) of this process and of its (waited-for) children."""
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"self": round(self_kb / 2**20, 3), "children": round(children_kb / 2**20, 3)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.05, help="trial counts x this (1 = full release)")
    parser.add_argument("--workdir", type=Path, default=None, help="where to write the tree and store")
    parser.add_argument("--jobs", type=int, default=2, help="import worker processes")
    parser.add_argument("--baseline-studies", type=int, default=12, help="studies in the pandas subset")
    parser.add_argument("--keep", action="store_true", help="keep the generated tree and store")
    parser.add_argument("--json", action="store_true", help="print only the JSON summary")
    args = parser.parse_args(argv)
    say = (lambda *a: None) if args.json else (lambda *a: print(*a, flush=True))

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="store_scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    release, store_dir = workdir / "batch_science", workdir / "store"
    for path in (release, store_dir):
        shutil.rmtree(path, ignore_errors=True)
    result: dict = {"scale": args.scale, "jobs": args.jobs, "cpus": os.cpu_count()}
    try:
        shapes = read_study_shapes(STUDIES_CSV)
        t = time.perf_counter()
        written = generate_release(release, shapes, scale=args.scale)
        result["generated"] = dict(written, seconds=round(time.perf_counter() - t, 1))
        say(f"generated {written} in {result['generated']['seconds']} s")

        store = Store.open(store_dir, create=True)
        cpu_before = os.times()
        report = import_batch_science(store, release, jobs=args.jobs)
        cpu_after = os.times()
        cpu = sum(getattr(cpu_after, f) - getattr(cpu_before, f)
                  for f in ("user", "system", "children_user", "children_system"))
        assert report.measurements_added == written["measurements"], (report.measurements_added, written)
        result["import"] = {
            "measurements": report.measurements_added, "trials": report.trials_added,
            "seconds": round(report.seconds, 2),
            "measurements_per_second": round(report.measurements_added / report.seconds),
            "cpu_seconds_all_processes": round(cpu, 2),
            "measurements_per_cpu_second": round(report.measurements_added / cpu),
        }
        say(f"import: {result['import']}")
        result["store_bytes"] = sum(p.stat().st_size for p in store_dir.rglob("*") if p.is_file())

        con = store.connect()
        workloads = [r[0] for r in con.execute("SELECT workload FROM workloads ORDER BY 1").fetchall()]
        sels = selections(workloads)
        t, c = time.perf_counter(), time.process_time()
        sql_answers = steps_to_result_sql(con, sels)
        sql_seconds, sql_cpu = time.perf_counter() - t, time.process_time() - c
        t, c = time.perf_counter(), time.process_time()  # process_time counts DuckDB's threads
        analysis_answers = steps_to_result_analysis(store.connect(), sels)
        analysis_seconds, analysis_cpu = time.perf_counter() - t, time.process_time() - c
        if analysis_answers is not None:
            assert analysis_answers == sql_answers, "batchlab.analysis and the SQL disagree"
        result["steps_to_result"] = {
            "workloads": len(workloads), "batch_sizes_reached": len(sql_answers),
            "sql_seconds": round(sql_seconds, 3), "sql_cpu_seconds": round(sql_cpu, 3),
            "analysis_seconds": round(analysis_seconds, 3) if analysis_answers is not None else None,
            "analysis_cpu_seconds": round(analysis_cpu, 3) if analysis_answers is not None else None,
        }
        say(f"steps to result: {result['steps_to_result']}")
        result["peak_rss_gb_after_import_and_analysis"] = peak_rss_gb()

        # Baseline on a subset, in this process: the pandas method vs the store on the same studies.
        studies = find_studies(release)
        step = max(1, len(studies) // args.baseline_studies)
        subset = studies[::step][: args.baseline_studies]
        answers, load_s, group_s = pandas_baseline(subset, sels)
        sub_store = Store.open(workdir / "subset_store", create=True)
        sub_report = import_batch_science(sub_store, release, studies=subset, jobs=1)
        sub_con = sub_store.connect()
        t = time.perf_counter()
        sub_answers = steps_to_result_sql(sub_con, [s for s in sels if s[0] in {x.workload for x in subset}])
        sub_query_s = time.perf_counter() - t
        assert sub_answers == answers, "pandas baseline and store disagree"
        n_values = sub_report.measurements_added  # the same files, so the same values
        pandas_rate = n_values / load_s
        result["baseline_subset"] = {
            "studies": len(subset), "measurements": n_values,
            "pandas_load_seconds": round(load_s, 3), "pandas_filter_group_seconds": round(group_s, 3),
            "pandas_load_measurements_per_second": round(pandas_rate),
            "store_import_seconds_1_job": round(sub_report.seconds, 3),
            "store_query_seconds": round(sub_query_s, 3),
            "same_answers": True,
        }
        full_rate = result["import"]["measurements_per_second"]
        result["ratios"] = {
            "import_vs_pandas_load_throughput": round(full_rate / pandas_rate, 2),
            "subset_import_vs_pandas_load": round(load_s / sub_report.seconds, 2),
            "subset_query_vs_pandas_filter_group": round(group_s / sub_query_s, 2),
            "pandas_load_and_group_estimate_seconds_at_this_scale": round(written["measurements"] / pandas_rate
                                                        + group_s * written["measurements"] / n_values, 1),
        }
        result["peak_rss_gb_final"] = peak_rss_gb()
        result["load_average"] = os.getloadavg()
        result["goals"] = {
            "import_at_least_1M_per_s": full_rate >= 1_000_000,
            "steps_to_result_under_5_s": (analysis_seconds if analysis_answers is not None else sql_seconds) < 5,
            "peak_memory_under_4_GB": max(result["peak_rss_gb_after_import_and_analysis"].values()) < 4,
        }
        say(f"baseline: {result['baseline_subset']}")
        say(f"ratios: {result['ratios']}")
        print(json.dumps(result), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(release, ignore_errors=True)
            shutil.rmtree(store_dir, ignore_errors=True)
            shutil.rmtree(workdir / "subset_store", ignore_errors=True)
            if args.workdir is None:
                shutil.rmtree(workdir, ignore_errors=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
