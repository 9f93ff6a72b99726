"""The run-to-run scatter of a study's best-of-K steps, estimated from its own trials.

Definitions and the model are in docs/methods.md ("The S(B) fit", "The trials' scatter").

Model
-----
A study at one batch size runs K trials (its search points); each trial's first qualifying step,
in log space, is ``log S(B) + E`` with ``E`` exponentially distributed with a *tail scale* ``theta``
(the model tests/analysis/test_coverage.py simulates). Then

* the best of K is ``log S + E_(1)``, ``E_(1) ~ Exponential(theta / K)``: its run-to-run standard
  deviation (a rerun of the same study with fresh trials) is ``theta / K``;
* the gap between the best two trials, ``E_(2) - E_(1)``, is ``Exponential(theta / (K - 1))``, so the
  *normalised spacing* ``(K - 1) * (log s_2 - log s_1)`` is ``Exponential(theta)`` under this model
  (the memoryless lower tail: given the best, the other ``K - 1`` exceed it by independent
  ``Exponential(theta)`` amounts).

A study whose best trial reached the goal but whose second did not (not reached within its budget
``c``, or raced and known only to be at least ``c``) has a *censored* spacing: it is at least
``(K - 1) log(c / s_1)``. Dropping such studies would keep only the small spacings (a tight budget
cuts the large ones) and bias the tail scale low. The tail scale is instead the censored-exponential
maximum-likelihood estimate: every study with a reached best contributes its *exposure*,
``(K - 1) log(s_2 / s_1)`` when its second reached (an *event*) or ``(K - 1) log(c / s_1)`` when the
second is censored at ``c`` (no event), and ``theta_hat = total exposure / number of events``. Without
censoring this is the mean spacing (``2 n theta_hat / theta`` is chi-square with ``2 n`` degrees of
freedom for ``n`` studies); with censoring it is consistent, not unbiased. A study whose second is
censored but whose ``c`` is unknown (no budget given) is left out, and the method text says how many
were. Each batch size's best-of-K sd is then ``theta_hat / K`` with its own K (studies with fewer
trials scatter more). ``dof`` is the degrees of freedom of the *variance* ``(theta_hat / K)**2`` read
as a chi-square variance estimate, from the number of events ``n``: with ``theta_hat`` a
Gamma(n, theta / n) variable (exact without censoring) its relative variance is
``(4n + 6) / (n (n + 1))``, which a ``chi2(d) / d`` variance has for ``d = n (n + 1) / (2n + 3)``
(about ``n / 2``).

*Assumption* (not derived from the model): a floating-point perturbation of the same trials (another
CPU type) changes each trial's steps by at most as much as a fresh seed would (the perturbed path
decorrelates from the original, at worst into an independent draw for the same search point). Under it,
by the law of total variance the best-of-K's scatter under such a perturbation, averaged over studies,
is at most its scatter under a complete rerun, which ``theta_hat / K`` estimates
(tests/analysis/test_scatter.py checks this consequence on one assumed perturbation, a Gaussian copula
that keeps each trial's distribution; it does not test the assumption).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from batchlab.errors import BatchlabError

METHOD = ("tail scale from the gap between each study's best two trials (normalised spacing (K-1) log(s2/s1), "
          "exponential lower tail; censored-exponential MLE: a second trial not reached within the budget c, or "
          "raced, adds exposure (K-1) log(c/s1) and no event), {n} events over {m} studies{dropped}; "
          "best-of-K sd = scale / K")


@dataclass(frozen=True)
class ScatterEstimate:
    """The trials' own run-to-run scatter of a curve's best-of-K steps (log space).

    Attributes:
        tau: root-mean-square of the best-of-K sd ``tail_scale / K`` over the contributing studies
            (a summary; the fit uses each batch size's own value, :meth:`sd_at`).
        dof: degrees of freedom of ``tau**2`` as a variance estimate (:func:`variance_dof`).
        n_studies: events: studies with two determined reached trials (the dof count these).
        method: how it was estimated, in words.
        tail_scale: the pooled tail scale ``theta`` of one trial's log-steps.
        by_batch_size: ``((batch_size, sd of its best of K), ...)`` for every batch size with trials.
        n_censored: studies with a reached best whose second is censored (exposure, no event).
        n_dropped: studies with a reached best and a censored second whose censoring step is unknown
            (left out).
    """

    tau: float
    dof: float
    n_studies: int
    method: str
    tail_scale: float
    by_batch_size: tuple[tuple[int, float], ...] = ()
    n_censored: int = 0
    n_dropped: int = 0

    def sd_at(self, batch_sizes) -> np.ndarray:
        """Best-of-K sd at each of ``batch_sizes`` (``tau`` where a batch size has no trials)."""
        table = dict(self.by_batch_size)
        return np.array([table.get(int(b), self.tau) for b in np.atleast_1d(batch_sizes)], dtype=float)

    def to_dict(self) -> dict:
        """JSON-ready fields (``by_batch_size`` as ``{batch_size: sd}``)."""
        return {"tau": self.tau, "dof": self.dof, "n_studies": self.n_studies, "method": self.method,
                "tail_scale": self.tail_scale, "by_batch_size": {str(b): s for b, s in self.by_batch_size},
                "n_censored": self.n_censored, "n_dropped": self.n_dropped}


def kth_smallest(values: np.ndarray, k: int, unknown_from: np.ndarray | None = None) -> float | None:
    """The k-th smallest of ``values`` (1-based), or ``None`` when it is not determined.

    ``values``: first steps, ``inf`` = not reached, ``NaN`` = unknown (a raced trial; its true value
    is at least its entry in ``unknown_from``, aligned with ``values``). Without unknowns this is the
    plain order statistic (possibly ``inf``). With unknowns it is determined only when the k-th
    smallest known value is finite and no larger than every unknown's ``unknown_from`` (no unknown
    then lies below it: the k-th smallest value is the same whatever they are);
    ``unknown_from=None`` leaves it undetermined.
    """
    values = np.asarray(values, dtype=float)
    unknown = np.isnan(values)
    known = np.sort(values[~unknown])
    if known.size < k:
        return None
    value = float(known[k - 1])
    if not unknown.any():
        return value
    if unknown_from is None or not np.isfinite(value):
        return None
    bounds = np.asarray(unknown_from, dtype=float)[unknown]
    if np.isnan(bounds).any() or value > bounds.min():
        return None
    return value


def variance_dof(n_studies):
    """Degrees of freedom of the best-of-K variance estimated from ``n_studies`` spacings:
    ``n (n + 1) / (2n + 3)`` (the chi-square variance with the same relative variance)."""
    n = np.asarray(n_studies, dtype=float)
    return n * (n + 1) / (2 * n + 3)


def pooled_tail_scale(best, second, n_trials, censored_at=None) -> tuple[np.ndarray, np.ndarray]:
    """Tail scale ``theta`` pooled over the last axis (vectorised over curves): the censored-exponential MLE.

    Args:
        best, second: (..., n) steps of each study's best and second-best trial (NaN or inf where
            not determined or not reached).
        n_trials: (..., n) or (n,) trials per study (K).
        censored_at: ``None`` or (..., n) / (n,): where ``best`` is reached and ``second`` is not
            finite, the step ``c`` the second is known to exceed (NaN: unknown, the study does not
            contribute). ``None``: no study is censored (those studies do not contribute).

    Returns:
        ``(theta, n_events)`` of shape (...): total exposure over the number of events, the exposure
        of a study with ``K >= 2`` and a finite positive ``best`` being ``(K - 1) log(s2 / s1)`` when
        ``second`` is finite (an event) and ``(K - 1) log(max(c, s1) / s1)`` when it is censored at
        ``c`` (no event); ``theta`` is NaN where there is no event.
    """
    best = np.asarray(best, dtype=float)
    second = np.asarray(second, dtype=float)
    k = np.broadcast_to(np.asarray(n_trials, dtype=float), best.shape)
    cens = np.full(best.shape, np.nan) if censored_at is None else np.broadcast_to(
        np.asarray(censored_at, dtype=float), best.shape)
    has_best = np.isfinite(best) & (best > 0) & (k >= 2)
    event = has_best & np.isfinite(second) & (second >= best)
    censored = has_best & ~np.isfinite(second) & np.isfinite(cens)
    top = np.where(event, second, np.where(censored, np.maximum(cens, best), 1.0))
    ratio = np.where(event | censored, top / np.where(has_best, best, 1.0), 1.0)
    exposure = np.where(event | censored, (k - 1) * np.log(ratio), 0.0)
    n = event.sum(axis=-1)
    theta = np.where(n > 0, exposure.sum(axis=-1) / np.maximum(n, 1), np.nan)
    return theta, n


def scatter_from_best_two(batch_sizes, best, second, n_trials, budget=None) -> ScatterEstimate | None:
    """:class:`ScatterEstimate` from each batch size's best and second-best steps and trial count.

    For callers that hold only those numbers (a report CSV or steps table: the best trial's ``steps``
    and ``second_steps``, with ``n_trials``). ``None``/NaN/inf: not reached or unknown. ``budget``:
    ``None`` or one value per batch size, the step the second-best trial is known to exceed where it
    is not finite (the study's step budget, the step its unreached trials ran to); a study with a
    reached best, ``K >= 2`` and no finite second is censored there (:func:`pooled_tail_scale`), and
    left out (counted in ``n_dropped``) where its budget is unknown. Returns ``None`` when no study
    has two reached trials.
    """
    b = np.asarray(batch_sizes, dtype=float)
    clean = lambda x: np.array([np.nan if v is None else float(v) for v in x], dtype=float)  # noqa: E731
    s1, s2 = clean(best), clean(second)
    c = np.full(s1.shape, np.nan) if budget is None else clean(budget)
    k = np.asarray(n_trials, dtype=float)
    if not (b.shape == s1.shape == s2.shape == k.shape == c.shape):
        raise BatchlabError(f"batch_sizes, best, second, n_trials and budget must align, got lengths {b.size}, "
                            f"{s1.size}, {s2.size}, {k.size}, {c.size}")
    theta, n = pooled_tail_scale(s1, s2, k, c)
    n = int(n)
    if n == 0:
        return None
    theta = float(theta)
    has = k >= 1
    sd = theta / np.where(has, k, 1.0)
    reached_best = np.isfinite(s1) & (s1 > 0) & (k >= 2)
    contributing = reached_best & (np.isfinite(s2) | np.isfinite(c))
    n_censored = int((reached_best & ~np.isfinite(s2) & np.isfinite(c)).sum())
    n_dropped = int((reached_best & ~np.isfinite(s2) & ~np.isfinite(c)).sum())
    dropped = "" if not n_dropped else (f"; {n_dropped} studies with a censored second trial and no known budget "
                                        "left out")
    tau = float(np.sqrt(np.mean(sd[contributing] ** 2)))
    return ScatterEstimate(tau=tau, dof=float(variance_dof(n)), n_studies=n,
                           method=METHOD.format(n=n, m=int(contributing.sum()), dropped=dropped), tail_scale=theta,
                           by_batch_size=tuple((int(bb), float(s)) for bb, s, h in zip(b, sd, has) if h),
                           n_censored=n_censored, n_dropped=n_dropped)


def second_censored_at(values, best: float, unknown_from=None, budget: float | None = None) -> float:
    """The step a study's second-best trial is known to exceed when it is not determined (NaN: unknown).

    ``values``: the study's trials' first steps (as :func:`kth_smallest`), ``best`` its determined
    finite best. The other trials each give a lower bound on their first step: a known reached value
    itself, a raced unknown its ``unknown_from``, an unreached one ``budget`` (the step it ran to);
    the second exceeds the smallest (a known reached value above an unknown's bound only makes it
    interval-censored; its upper end is not used). NaN where a needed bound is missing.
    """
    values = np.asarray(values, dtype=float)
    bounds = np.full(values.size, np.nan) if unknown_from is None else np.asarray(unknown_from, dtype=float)
    others = np.ones(values.size, dtype=bool)
    others[int(np.flatnonzero(values == best)[0])] = False
    budget = np.nan if budget is None else float(budget)
    lower = np.where(np.isnan(values), bounds, np.where(np.isinf(values), budget, values))[others]
    if lower.size == 0 or np.isnan(lower).any():
        return float("nan")
    return float(lower.min())


def scatter_from_trials(trial_steps: Mapping[int, np.ndarray],
                        unknown_from: Mapping[int, np.ndarray] | None = None,
                        budget: Mapping[int, float | None] | None = None) -> ScatterEstimate | None:
    """:class:`ScatterEstimate` from every study's trials.

    ``trial_steps``: ``{batch_size: each trial's first qualifying step}`` (``inf`` = not reached,
    ``NaN`` = raced, unknown; ``unknown_from`` as in :func:`kth_smallest`). ``budget``:
    ``{batch_size: the step the study's unreached trials ran to}`` (the smallest last evaluated step
    among them; missing or ``None``: unknown). A study contributes an event when its best two trials
    are determined and reached, and censored exposure when its best is determined and reached but its
    second is not determined (:func:`second_censored_at`); such a study without the bounds it needs
    is left out (``n_dropped``). ``None`` when no study has two reached trials.
    """
    batch_sizes = sorted(int(b) for b in trial_steps)
    best, second, k, censor = [], [], [], []
    for b in batch_sizes:
        values = np.asarray(trial_steps[b], dtype=float)
        bounds = None if unknown_from is None else unknown_from.get(b)
        pair = [kth_smallest(values, j, bounds) if values.size >= j else None for j in (1, 2)]
        c = float("nan")
        if values.size >= 2 and pair[0] is not None and np.isfinite(pair[0]) and not (
                pair[1] is not None and np.isfinite(pair[1])):
            c = second_censored_at(values, pair[0], bounds, None if budget is None else budget.get(b))
        best.append(pair[0])
        second.append(pair[1])
        k.append(values.size)
        censor.append(c)
    return scatter_from_best_two(batch_sizes, best, second, k, censor)
