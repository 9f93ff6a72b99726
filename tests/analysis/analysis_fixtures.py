"""Small hand-written stores for the analysis, plot and CLI tests: the four view tables from a list of trials."""

import json

import pandas as pd


def trial(workload, batch_size, trial_id, rows, status="COMPLETE", study=None, source="test", **parameters):
    """One trial: ``rows`` is a list of ``(step, {metric: value})``; ``study`` its study id (None: none recorded)."""
    return {
        "workload": workload,
        "batch_size": batch_size,
        "trial_id": trial_id,
        "status": status,
        "study": study,
        "source": source,
        "parameters": parameters,
        "rows": rows,
    }


def tables_from_trials(trials, extra_studies=(), definitions=None):
    """The four view tables for ``trials`` (plus empty studies ``(workload, batch_size)``).

    ``definitions``: ``{study_id: definition dict}`` for the studies rows (``{}`` when absent)."""
    definitions = definitions or {}
    workload_names = sorted({t["workload"] for t in trials} | {w for w, _ in extra_studies})
    workloads = pd.DataFrame(
        [
            {"workload": w, "dataset": w.split("/")[0], "model": w.split("/")[1], "optimizer": w.split("/")[2], "tags": "{}"}
            for w in workload_names
        ]
    )
    study_keys = sorted({(t["workload"], t["batch_size"], t.get("study") or "") for t in trials}
                        | {(w, b, "") for w, b in extra_studies})
    studies = pd.DataFrame(
        [
            {"workload": w, "batch_size": b, "study_id": s or None, "search_space": "{}", "train_steps": 100,
             "early_stopping": False, "definition": json.dumps(definitions.get(s, {})) if s else None}
            for w, b, s in study_keys
        ],
        columns=["workload", "batch_size", "study_id", "search_space", "train_steps", "early_stopping", "definition"],
    ).astype({"study_id": "object", "definition": "object"})
    trial_rows, measurement_rows = [], []
    for t in trials:
        steps = max((step for step, _ in t["rows"]), default=0)
        trial_rows.append(
            {
                "workload": t["workload"],
                "batch_size": t["batch_size"],
                "trial_id": t["trial_id"],
                "trial_key": f"{t['workload']}/{t['batch_size']}/{t['trial_id']}",
                "study_id": t.get("study"),
                "parameters": json.dumps(t["parameters"]),
                "status": t["status"],
                "steps": steps,
                "seed": 0,
                "source": t.get("source", "test"),
            }
        )
        for step, metrics in t["rows"]:
            for metric, value in metrics.items():
                measurement_rows.append(
                    {
                        "workload": t["workload"],
                        "batch_size": t["batch_size"],
                        "trial_id": t["trial_id"],
                        "step": step,
                        "metric": metric,
                        "value": float(value),
                    }
                )
    trials_df = pd.DataFrame(trial_rows).astype(
        {"batch_size": "int64", "trial_id": "int64", "steps": "int64", "study_id": "object"})
    measurements = pd.DataFrame(measurement_rows).astype({"batch_size": "int64", "trial_id": "int64", "step": "int64"})
    return {"workloads": workloads, "studies": studies, "trials": trials_df, "measurements": measurements}


def write_release(root, trials, train_steps=100, parameter_configs=None):
    """Write ``trials`` as a batch_science release tree under ``root`` (docs/methods.md, "The batch_science release").

    ``<dataset>/<model>/<optimizer>/<batch_size>/study.json`` and
    ``<batch_size>/<trial_id>/{metadata.json, measurements.csv}`` (``step`` then one column per
    metric, rows in step order). Every trial of a study must measure the same metrics.
    """
    from pathlib import Path

    root = Path(root)
    configs = parameter_configs or {
        "learning_rate": {"type": "DOUBLE", "min_value": 1e-4, "max_value": 10.0, "scale": "LOG_SCALE"},
    }
    for t in trials:
        dataset, model, optimizer = t["workload"].split("/")
        study_dir = root / dataset / model / optimizer / str(t["batch_size"])
        study_dir.mkdir(parents=True, exist_ok=True)
        study = {
            "batch_size": t["batch_size"],
            "dataset": dataset,
            "model": model,
            "optimizer": optimizer,
            "early_stopping": False,
            "train_steps": train_steps,
            "parameter_configs": configs,
        }
        (study_dir / "study.json").write_text(json.dumps(study))
        trial_dir = study_dir / str(t["trial_id"])
        trial_dir.mkdir()
        steps = max((step for step, _ in t["rows"]), default=0)
        metadata = {"parameters": t["parameters"], "status": t["status"], "steps": steps, "trial_id": t["trial_id"]}
        (trial_dir / "metadata.json").write_text(json.dumps(metadata))
        metrics = sorted({m for _, values in t["rows"] for m in values})
        lines = [",".join(["step", *metrics])]
        for step, values in sorted(t["rows"], key=lambda row: row[0]):
            lines.append(",".join([str(step), *(repr(float(values[m])) for m in metrics)]))
        (trial_dir / "measurements.csv").write_text("\n".join(lines) + "\n")
    return root


def race_trials(trials, metric, goal, keep=2, maximize=False):
    """What racing with ``keep`` leaves of a full-protocol ``trials`` list (batchlab.train.race).

    Per (workload, batch size), the bound is the ``keep``-th smallest key ``(first step meeting the
    goal, trial id)`` (strictly, as the analysis counts it); a trial not among the ``keep`` best stops
    after the first of its evaluations at step ``s`` that has not met the goal and whose next
    evaluation ``e`` has ``(e, trial id) > bound``: its rows end at ``s`` and its status becomes
    ``RACED`` (the most aggressive stop racing can make: the live race's bound only decreases to this
    final one). Batch sizes where fewer than ``keep`` trials reach the goal are not raced. Returns new
    trial dicts (the input is left unchanged)."""
    import math

    def first(t):
        hits = [s for s, values in t["rows"] if metric in values and math.isfinite(values[metric])
                and (values[metric] > goal if maximize else values[metric] < goal)]
        return min(hits, default=math.inf)

    groups = {}
    for t in trials:
        groups.setdefault((t["workload"], t["batch_size"]), []).append(t)
    out = []
    for group in groups.values():
        order = sorted(group, key=lambda t: (first(t), t["trial_id"]))
        bound = (first(order[keep - 1]), order[keep - 1]["trial_id"]) if len(order) >= keep else (math.inf, 0)
        kept = {t["trial_id"] for t in order[:keep]}
        for t in group:
            t = dict(t)
            steps = sorted(s for s, _ in t["rows"])
            if math.isfinite(bound[0]) and t["trial_id"] not in kept:
                cut = next((s for s, e in zip(steps, steps[1:]) if s < first(t) and (e, t["trial_id"]) > bound), None)
                if cut is not None:
                    t["rows"] = [(s, v) for s, v in t["rows"] if s <= cut]
                    t["status"] = "RACED"
            out.append(t)
    return out


def publish_store(path, trials, definitions):
    """A new store at ``path`` holding ``trials`` (each trial's ``study`` names one of ``definitions``,
    ``{name: make_study_definition(...)}``); returns ``{name: study id}``."""
    from batchlab.store import Store
    from batchlab.store.studies import study_id
    from batchlab.store.writer import TrialRecord, publish_trials

    store = Store.open(path, create=True)
    publish_trials(store, [
        TrialRecord(
            workload=t["workload"], batch_size=t["batch_size"], trial_id=t["trial_id"],
            trial_key=f"{t['workload']}/{t['batch_size']}/{t['trial_id']}", parameters=t["parameters"],
            status=t["status"], steps=max(s for s, _ in t["rows"]),
            measurements=[(s, m, float(v)) for s, values in t["rows"] for m, v in values.items()],
            study_definition=definitions[t["study"]],
        )
        for t in trials
    ])
    return {name: study_id(d) for name, d in definitions.items()}
