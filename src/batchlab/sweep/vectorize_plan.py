"""Which studies of a sweep run vectorized, and how a forced vectorization that is not exact is recorded.

The vectorization rule: a study runs its trials K at a time (``vectorize_trials``) as one batched
computation when its optimizer is vectorizable (sgd, momentum, nesterov, adam), no trial uses
``ema_decay`` or a differing ``label_smoothing``, and ``vectorize`` is ``"always"``, or ``"auto"``
and the worker measures that it is exact and pays
(:func:`batchlab.sweep.vectorize_choice.vectorization_pays`: a self-check finds the vectorized trials
bit-identical to sequential ones on this machine, and a few steps and one evaluation batch of both
paths timed on copies find it cheaper; cached per kind of task), so ``auto`` never changes a result:
where the check finds a difference the trials run one at a time. Under ``auto`` on the CPU only
fully connected models, the only ones that can pass the check, go to workers as vectorized tasks.
``"always"`` forces the vectorized path; the driver (:func:`batchlab.sweep.runner.prepare_sweep`,
before it allocates trial ids, as the mark changes study ids) runs the same self-check in the
driver (one torch thread, as the workers run) on each such study's first ``vectorize_trials``
trials, and where it finds a difference the study's definition records it
(:data:`batchlab.sweep.plan.INEXACT_VECTORIZED`: its own study id, never pooled with sequential
trials) and :attr:`batchlab.sweep.runner.SweepPlan.warnings` says so in one line, which the
reporters print on stderr (:func:`mark_inexact_vectorization`). :func:`should_vectorize` decides
which studies go to workers as vectorized tasks.
"""

from __future__ import annotations

from dataclasses import replace

from batchlab.sweep.config import SweepConfig
from batchlab.sweep.plan import StudyPlan, TrialTask
from batchlab.sweep.worker import trial_spec

__all__ = ["mark_inexact_vectorization", "should_vectorize"]


def should_vectorize(config: SweepConfig, study: StudyPlan) -> bool:
    """Whether ``study``'s trials go to workers as vectorized tasks (the rule in the module docstring;
    under ``vectorize = "auto"`` the worker still measures whether it pays).

    Under ``"auto"`` a study the worker could never choose to vectorize stays one trial per task (so
    the work splits across workers, and a lost worker re-runs one trial): on the CPU
    (``study.device_type``) only an MLP's trials can be chosen (the exact fused path:
    :func:`batchlab.sweep.vectorize_choice.vectorization_pays`), so a workload whose model is not one
    (:func:`batchlab.sweep.fused_mlp.mlp_workload`, built once per workload key) is not vectorized."""
    from batchlab.optim import get_optimizer

    if config.vectorize == "never" or study.trials < 2 or get_optimizer(study.optimizer).vectorized is None:
        return False
    points = study.points
    if any(p.get("ema_decay") is not None for p in points):
        return False
    if len({float(p.get("label_smoothing") or 0.0) for p in points}) > 1:
        return False
    if config.vectorize == "auto" and study.device_type == "cpu":
        from batchlab.sweep.fused_mlp import mlp_workload

        return mlp_workload(study.workload)  # the worker decides by measured cost (TrialTask.choose)
    return True  # "always"; with "auto" on an accelerator the worker decides by measured cost


def mark_inexact_vectorization(config: SweepConfig, studies: list[StudyPlan]) -> tuple[list[StudyPlan], list[str]]:
    """``studies``, those whose trials ``vectorize = "always"`` forces vectorized although they are not
    bit-identical to sequential trials on this machine marked ``inexact_vectorized`` (their definitions
    record it, :data:`batchlab.sweep.plan.INEXACT_VECTORIZED`), and the warnings saying so (one line
    naming them; none when every study is identical, or ``vectorize`` is not ``"always"``).

    Per study that goes to workers vectorized (:func:`should_vectorize`): the exactness self-check
    (:func:`batchlab.sweep.vectorize_choice.vectorized_identical`) on its first ``vectorize_trials``
    trials (every stack size the run can reach as trials stop, up to a bound), with one torch thread
    as in the workers; a few seconds per study (its trials are built and trained a few steps). Trials
    that cannot run vectorized (the worker runs them one at a time) are not marked. On the driver's
    machine: a Dask worker on another machine may differ, which the definition cannot record.
    """
    if config.vectorize != "always":
        return studies, []
    from batchlab.sweep.vectorize_choice import vectorized_identical

    marked, inexact = [], {}
    for study in studies:
        if should_vectorize(config, study):
            k = min(config.vectorize_trials, study.trials)
            task = TrialTask(study, tuple(study.trial_plans()[:k]), True, k)
            try:
                identical = vectorized_identical([trial_spec(task, i) for i in range(k)], threads=1)
            except Exception:  # NotVectorizable (the worker runs them one at a time), or a user's model
                identical = True  # failing on copies (the worker reports it, per task)
            if not identical:
                study = replace(study, inexact_vectorized=True)
                inexact.setdefault(study.store_workload, []).append(str(study.batch_size))
        marked.append(study)
    if not inexact:
        return marked, []
    where = "; ".join(f"{workload} at batch sizes {', '.join(sizes)}" for workload, sizes in inexact.items())
    warning = (f'vectorize = "always": on this machine vectorized trials are not bit-identical to sequential '
               f'ones ({where}); they run vectorized, as their own studies (the study definition records '
               f'"vectorized": {{"bit_identical_to_sequential": false}}), never pooled with sequential trials')
    return marked, [warning]
