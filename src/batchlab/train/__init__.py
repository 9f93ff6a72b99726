"""batchlab.train: one trial (the loop, evaluation schedule, divergence, measurements) and one study.

``TrialSpec``/``run_trial`` run one training run and record it into a store, with steps to the goal
bracketed at a stated resolution (docs/methods.md, "Evaluation schedule and resolution");
``batchlab.train.sampling.BatchSampler`` (``batch_indices``) defines which examples each update sees;
``batchlab.train.core`` is the loop, evaluation bookkeeping and replay shared with vectorized trials;
``batchlab.train.device`` names and checks devices;
``run_study`` runs a study's quasi-random trials one after another.
"""

from batchlab.train.study import StudyResult, best_final_trial, best_trial, run_study
from batchlab.train.trial import (
    PreparedTrial,
    TrialResult,
    TrialSpec,
    default_study_definition,
    prepare_trial,
    run_prepared,
    run_trial,
    stop_rule,
)

__all__ = [
    "StudyResult", "best_trial", "best_final_trial", "run_study", "TrialSpec", "TrialResult", "PreparedTrial",
    "default_study_definition", "prepare_trial", "run_prepared", "run_trial", "stop_rule",
]
