"""batchlab.sweep.progress: the critical batch size table reads the one definitions registry; progress
lines off a terminal; counts on resume."""

from __future__ import annotations

from types import SimpleNamespace

from batchlab.analysis.critical_batch_size import REGISTRY
from batchlab.sweep.progress import RichReporter
from batchlab.sweep.runner import StudyProgress, SweepSummary


def _summary(named: dict) -> SweepSummary:
    fit = {"fit": {"s_min": 10.0, "e_min": 100.0}, "critical_batch_sizes": named, "warnings": []}
    return SweepSummary(store_path="s", wall_time_s=1.0, trials_run=2, trials_skipped=0, workers_lost=0, grown=[],
                        results={}, fits={"w/m/sgd": fit}, fit_errors={}, executor="inline", workers=1,
                        goals={"w/m/sgd": {"metric": "val/error", "goal": 0.1, "maximize": False}}, sweep_id="abc")


def test_critical_batch_size_table_lists_every_registered_definition(capsys):
    first = REGISTRY[0]
    RichReporter(terminal=False).finish(_summary({first.name: {"value": 64.0, "source": first.source}}))
    out = capsys.readouterr().out
    lines = out.splitlines()
    for d in REGISTRY:  # every definition, in the registry's order, each with its one-line definition
        assert any(d.name in line and "w/m/sgd" in line for line in lines), d.name
        assert f"  {d.name}: {d.definition}" in out
    rows = [line for line in lines if "w/m/sgd" in line and any(d.name in line for d in REGISTRY)]
    assert "not computed" in rows[-1] and "64" in rows[0]


def test_progress_lines_off_a_terminal_count_finished_trials_once(capsys):
    study = SimpleNamespace(store_workload="w/m/sgd", batch_size=8)
    entries = [StudyProgress(study=study, total=4, done=2, skipped=2)]  # 2 finished before this run
    plan = SimpleNamespace(warnings=[])
    reporter = RichReporter(terminal=False)
    reporter.start(plan, entries, {"executor": "inline", "workers": 1, "store": "s", "finished_before": 2})
    for _ in range(2):
        entries[0].done += 1
        reporter.trial(entries[0], SimpleNamespace(), {})
    reporter.close()
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("progress:")]
    assert lines[0].startswith("progress: 3/4 trials done") and lines[-1].startswith("progress: 4/4 trials done")
    assert len(lines) == 2 and "(2 already in the store)" in err


def test_a_sweep_without_any_fit_prints_no_empty_critical_batch_size_table(capsys):
    summary = _summary({})
    summary.fits, summary.fit_errors = {"w/m/sgd": None}, {"w/m/sgd": "need at least 2 batch sizes"}
    RichReporter(terminal=False).finish(summary)
    out = capsys.readouterr().out
    assert "no fit for w/m/sgd: need at least 2 batch sizes" in out
    assert "critical batch sizes" not in out and "targets and methods below" not in out
