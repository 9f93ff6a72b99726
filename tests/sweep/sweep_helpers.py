"""Helpers for the sweep tests: the tiny sweep, running the CLI, reading a store's contents."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# A tiny sweep: 2 studies x 3 trials of 8 steps on 512 training examples.
TINY = ["mnist/fc_64_64_64", "--optimizer", "momentum", "--batch-sizes", "8,64", "--trials", "3", "--steps", "8",
        "--train-examples", "512", "--seed", "1", "--no-stop-at-goal", "--no-vectorize"]


def sweep_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "batchlab", "sweep", *args]


def child_env() -> dict:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    return env


def run_sweep_cli(*args: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, list[dict]]:
    result = subprocess.run(sweep_command(*args), capture_output=True, text=True, timeout=timeout, env=child_env())
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return result, events


def store_contents(path) -> tuple[list, list]:
    """(trials, measurements) of the store at ``path`` as sorted lists of tuples."""
    from batchlab.store import Store

    store = Store.open(path)
    trials = sorted(
        (r["workload"], r["batch_size"], r["trial_id"], r["trial_key"], r["status"], r["steps"], r["seed"],
         r["parameters"])
        for r in store.table("trials").to_pylist()
    )
    measurements = sorted(
        (r["workload"], r["batch_size"], r["trial_id"], r["step"], r["metric"], r["value"])
        for r in store.table("measurements").to_pylist()
    )
    return trials, measurements


def tiny_config():
    """The TINY sweep as a validated config (the same settings the CLI gets from TINY)."""
    from batchlab.sweep.config import parse_sweep_config

    return parse_sweep_config({
        "workloads": ["mnist/fc_64_64_64"], "optimizers": ["momentum"], "batch_sizes": [8, 64], "trials": 3,
        "steps": 8, "train_examples": 512, "seed": 1, "stop_at_goal": False, "vectorize": "never",
    })
