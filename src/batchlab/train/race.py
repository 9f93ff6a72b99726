"""Racing: stop a study's trials as soon as they can no longer change its answer.

A study's steps to result is the minimum over its trials of the first step meeting the goal, ties to
the lower trial id (docs/methods.md, "Steps to result"); its one-sided steps interval reads the
``keep``-th best trial (:func:`batchlab.analysis.bootstrap.best_of_k_upper`, ``keep = 2`` at the
default 90% level for every study of 2 or more trials). Racing keeps those ``keep`` best trials exact
and stops the others early:

* A trial's *rank key* is ``(first step meeting the goal, trial id)``; the ``keep`` best are the
  ``keep`` smallest keys. :class:`Race` holds the keys of the trials that have met the goal so far;
  its *bound* is the ``keep``-th smallest (``None`` while fewer than ``keep`` have met it). The bound
  only decreases as trials meet the goal.
* After an evaluation at step ``k`` that does not meet the goal, the earliest step at which the trial
  could still first meet it is the next step after ``k`` that the protocol could report (the next
  evaluation step, or, with replay, the next resolution step inside the next bracket):
  :meth:`Racer.earliest`. If ``(earliest, trial id)`` is larger than the bound, the trial's final key
  is larger than the final bound, so it is not among the ``keep`` best and cannot change the steps,
  ``steps_lower``, best trial id or parameters, nor the steps interval. It stops there with status
  ``RACED`` (:data:`batchlab.train.core.RACED`): its measurements are exactly the full protocol's up
  to that step (the trial is deterministic), and its first step meeting the goal is unknown and later
  than its ``steps``.
* A trial is only ever stopped at an evaluation: between two evaluations a replay could still find
  the goal met earlier, so stopping mid-interval would not be exact.

The same rule serves one trial at a time (:func:`batchlab.train.study.run_study` and a sweep's
sequential tasks: each trial races against those before it), K trials together
(:mod:`batchlab.sweep.vectorized`: each evaluation races all of them), and a resumed study
(:class:`Race` starts from the published trials' keys).
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["DEFAULT_KEEP", "Race", "Racer", "race_definition"]

#: Trials kept exact by default: the order statistic of the default (90%) one-sided steps interval.
DEFAULT_KEEP = 2


def race_definition(keep: int = DEFAULT_KEEP) -> dict:
    """The ``race`` entry of a raced study's definition: ``{"keep": keep}``."""
    return {"keep": int(keep)}


class Race:
    """The ``keep`` best rank keys ``(first step meeting the goal, trial id)`` of one study so far.

    ``reached``: keys of trials that met the goal before (a resumed study's published trials).
    """

    def __init__(self, keep: int = DEFAULT_KEEP, reached: Iterable[tuple[int, int]] = ()) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an integer >= 1, got {keep!r}")
        self.keep = keep
        self._best: list[tuple[int, int]] = []  # sorted, at most ``keep`` keys
        for steps, trial_id in reached:
            self.met(trial_id, steps)

    def met(self, trial_id: int, steps: int) -> None:
        """Trial ``trial_id`` first met the goal at ``steps``."""
        bisect.insort(self._best, (int(steps), int(trial_id)))
        del self._best[self.keep:]

    @property
    def bound(self) -> tuple[int, int] | None:
        """The ``keep``-th smallest key so far, or ``None`` while fewer than ``keep`` trials met the goal."""
        return self._best[-1] if len(self._best) == self.keep else None

    def can_place(self, trial_id: int, earliest: int) -> bool:
        """Whether a trial that can first meet the goal no earlier than ``earliest`` may still be
        among the ``keep`` best."""
        bound = self.bound
        return bound is None or (int(earliest), int(trial_id)) < bound


@dataclass
class Racer:
    """A :class:`Race` applied to the trials of one run (one trial, or K vectorized trials).

    ``trial_ids``: the store trial id of each trial key of the run; ``steps``: every step at which
    the run can report a first step meeting the goal (its evaluation schedule and, with replay, the
    resolution steps), any order.
    """

    race: Race
    trial_ids: Mapping[Hashable, int]
    steps: Sequence[int]
    _sorted: list[int] = field(init=False, repr=False)
    _registered: set = field(init=False, repr=False, default_factory=set)

    def __post_init__(self) -> None:
        self._sorted = sorted(set(int(s) for s in self.steps))

    def earliest(self, step: int) -> int | None:
        """The first step after ``step`` at which a trial could first meet the goal (``None``: none left)."""
        i = bisect.bisect_right(self._sorted, int(step))
        return self._sorted[i] if i < len(self._sorted) else None

    def after_evaluation(self, step: int, trials: Iterable[tuple[Hashable, object]]) -> None:
        """Record the trials that met the goal at this evaluation, then stop (``progress.raced()``)
        every trial still searching that can no longer be among the ``keep`` best."""
        trials = list(trials)
        for key, progress in trials:
            if progress.steps_to_goal is not None and key not in self._registered:
                self._registered.add(key)
                self.race.met(self.trial_ids[key], progress.steps_to_goal)
        earliest = self.earliest(step)
        if earliest is None:  # the last step: a trial still running now ends COMPLETE, nothing to save
            return
        for key, progress in trials:
            if progress.searching and not self.race.can_place(self.trial_ids[key], earliest):
                progress.raced()


def published_keys(store, study_id: str, metric: str, goal: float, maximize: bool) -> list[tuple[int, int]]:
    """Rank keys ``(first step meeting the goal, trial id)`` of the trials of study ``study_id``
    already in ``store`` that met the goal (COMPLETE or STOPPED_AT_GOAL), for a resumed or continued
    study's :class:`Race`. The first step is read from the stored measurements (the replayed bracket
    included), as the analysis reads it."""
    op = ">" if maximize else "<"
    con = store.connect()
    try:
        rows = con.execute(
            f"""
            SELECT t.trial_id,
                   min(m.step) FILTER (WHERE m.metric = ? AND m.value {op} ? AND isfinite(m.value)) AS first
            FROM trials t JOIN measurements m
              ON m.workload = t.workload AND m.batch_size = t.batch_size AND m.trial_id = t.trial_id
            WHERE t.study_id = ? AND t.status IN ('COMPLETE', 'STOPPED_AT_GOAL')
            GROUP BY t.trial_id
            """,
            [metric, float(goal), study_id],
        ).fetchall()
    finally:
        con.close()
    return [(int(first), int(trial_id)) for trial_id, first in rows if first is not None]
