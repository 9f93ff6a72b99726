"""Small real stores for the report tests: synthetic trials published through the store API (fast).

Each trial of a (workload, batch size) study first meets the goal at ``hit = (S_min + E_min / B) *
penalty``, where the penalty grows with the distance of its effective learning rate from the
optimum ``opt(B) = 0.05 * min(B, b_crit) / 8`` (linear scaling up to ``b_crit``, then flat); it is
evaluated on a 5% geometric grid and stops at the goal (STOPPED_AT_GOAL), runs out of its budget
(COMPLETE, not reached) or diverges (INFEASIBLE) when its effective learning rate is over 30x the
optimum. ``race=True`` races each study with keep 2 (tests/analysis/analysis_fixtures.race_trials).
"""

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from analysis_fixtures import race_trials  # noqa: E402

E = "val/classification_error"
GOAL = 0.03
SWEEP = "abcdef012345"
SEARCH = {
    "learning_rate": {"type": "DOUBLE", "min_value": 1e-3, "max_value": 10.0, "scale": "LOG_SCALE"},
    "momentum": {"type": "DOUBLE", "min_value": 0.5, "max_value": 0.999, "scale": "REVERSE_LOG_SCALE"},
}


def _grid(budget):
    steps, s = [], 1.0
    while s <= budget:
        if not steps or int(s) > steps[-1]:
            steps.append(int(s))
        s *= 1.05
    if steps[-1] != budget:
        steps.append(budget)
    return steps


def unit_trials(workload, batch_sizes, b_crit, trials=6, budget=4000, s_min=60.0, reach=True):
    """Trial dicts (analysis_fixtures form) of one workload: ``trials`` per batch size."""
    momentum = not workload.endswith("/sgd")
    out = []
    for b in batch_sizes:
        best = 0.05 * min(b, b_crit) / 8
        for i in range(trials):
            lr = 10 ** (-3 + 4 * (i + 0.5) / trials) * (1.0 + 0.01 * (b % 7))
            mom = (0.5, 0.9, 0.99)[i % 3] if momentum else None
            eff = lr / (1 - mom) if momentum else lr
            params = {"learning_rate": lr} | ({"momentum": mom} if momentum else {})
            if eff > 30 * best:
                out.append({"workload": workload, "batch_size": b, "trial_id": i + 1, "status": "INFEASIBLE",
                            "parameters": params, "rows": [(1, {E: 0.9}), (2, {E: float("nan")})]})
                continue
            hit = (s_min + s_min * b_crit / b) * math.exp(0.3 * math.log(eff / best) ** 2)
            if not reach:
                hit = budget * 10
            rows, status = [], "COMPLETE"
            for s in _grid(budget):
                value = GOAL * (hit / s) ** 0.5 * (0.999 if s >= hit else 1.0)
                rows.append((s, {E: value}))
                if value < GOAL:
                    status = "STOPPED_AT_GOAL"
                    break
            out.append({"workload": workload, "batch_size": b, "trial_id": i + 1, "status": status,
                        "parameters": params, "rows": rows})
    return out


def publish(path, trials, *, race=False, budget=4000, sweep=SWEEP, stop_rule=True, source="batchlab"):
    """Publish ``trials`` into the store at ``path`` (created) under sweep-like study definitions."""
    from batchlab.store import Store, TrialRecord, publish_trials
    from batchlab.store.studies import make_study_definition

    if race:
        trials = race_trials(trials, E, GOAL, keep=2)
    store = Store.open(path, create=True) if not Path(path).exists() else Store.open(path)
    records = []
    for t in trials:
        extra = {"sweep": sweep, "budget_round": 0} if sweep else {}
        if race:
            extra["race"] = {"keep": 2}
        definition = make_study_definition(
            workload=t["workload"], batch_size=t["batch_size"], train_steps=budget,
            search_space={k: v for k, v in SEARCH.items() if k in t["parameters"]},
            evaluation={"rule": "geometric", "resolution": 0.05},
            stop_rule={"metric": E, "goal": GOAL, "maximize": False} if stop_rule else None,
            seed=0, source=source, **extra)
        steps = max(s for s, _ in t["rows"])
        records.append(TrialRecord(
            workload=t["workload"], batch_size=t["batch_size"], trial_id=t["trial_id"],
            trial_key=f"{t['workload']}|b={t['batch_size']}|point={t['trial_id'] - 1}|{sweep}|{race}",
            parameters=t["parameters"], status=t["status"], steps=steps, seed=t["trial_id"],
            measurements=[(s, m, v) for s, values in t["rows"] for m, v in values.items()],
            study_definition=definition))
    publish_trials(store, records)
    return Path(path)
