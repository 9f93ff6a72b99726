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
  *normalised spacing* ``(K - 1) * (log s_2 - log s_1)`` is ``Exponential(theta)`` whatever the upper
  trials do (unreached trials, raced ones, a heavier upper tail): only the lower tail matters.

The tail scale is the mean of the normalised spacings over the studies of a curve that have two
determined reached trials (an unbiased estimate; ``2 n theta_hat / theta`` is chi-square with ``2 n``
degrees of freedom for ``n`` studies). Each batch size's best-of-K sd is then ``theta_hat / K`` with
its own K (studies with fewer trials scatter more). ``dof`` is the degrees of freedom of the
*variance* ``(theta_hat / K)**2`` read as a chi-square variance estimate: with ``theta_hat`` a
Gamma(n, theta / n) variable its relative variance is ``(4n + 6) / (n (n + 1))``, which a
``chi2(d) / d`` variance has for ``d = n (n + 1) / (2n + 3)`` (about ``n / 2``).

A floating-point perturbation of the same trials (another CPU type) changes each trial's steps by at
most as much as a fresh seed would (the perturbed path decorrelates from the original, at worst into
an independent draw for the same search point). By the law of total variance the best-of-K's
scatter under such a perturbation, averaged over studies, is at most its scatter under a complete
rerun, which ``theta_hat / K`` estimates (tests/analysis/test_scatter.py checks this on a
Gaussian-copula perturbation that keeps each trial's distribution).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from batchlab.errors import BatchlabError

METHOD = ("tail scale from the gap between each study's best two reached trials (normalised spacing "
          "(K-1) log(s2/s1), exponential lower tail), pooled over {n} studies; best-of-K sd = scale / K")


@dataclass(frozen=True)
class ScatterEstimate:
    """The trials' own run-to-run scatter of a curve's best-of-K steps (log space).

    Attributes:
        tau: root-mean-square of the best-of-K sd ``tail_scale / K`` over the contributing studies
            (a summary; the fit uses each batch size's own value, :meth:`sd_at`).
        dof: degrees of freedom of ``tau**2`` as a variance estimate (:func:`variance_dof`).
        n_studies: studies with two determined reached trials that entered the pool.
        method: how it was estimated, in words.
        tail_scale: the pooled tail scale ``theta`` of one trial's log-steps.
        by_batch_size: ``((batch_size, sd of its best of K), ...)`` for every batch size with trials.
    """

    tau: float
    dof: float
    n_studies: int
    method: str
    tail_scale: float
    by_batch_size: tuple[tuple[int, float], ...] = ()

    def sd_at(self, batch_sizes) -> np.ndarray:
        """Best-of-K sd at each of ``batch_sizes`` (``tau`` where a batch size has no trials)."""
        table = dict(self.by_batch_size)
        return np.array([table.get(int(b), self.tau) for b in np.atleast_1d(batch_sizes)], dtype=float)

    def to_dict(self) -> dict:
        """JSON-ready fields (``by_batch_size`` as ``{batch_size: sd}``)."""
        return {"tau": self.tau, "dof": self.dof, "n_studies": self.n_studies, "method": self.method,
                "tail_scale": self.tail_scale, "by_batch_size": {str(b): s for b, s in self.by_batch_size}}


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


def pooled_tail_scale(best, second, n_trials) -> tuple[np.ndarray, np.ndarray]:
    """Tail scale ``theta`` pooled over the last axis (vectorised over curves).

    Args:
        best, second: (..., n) steps of each study's best and second-best trial (NaN or inf where
            not determined or not reached: the study does not contribute).
        n_trials: (..., n) or (n,) trials per study (K).

    Returns:
        ``(theta, n_studies)`` of shape (...): the mean normalised spacing ``(K - 1) log(s2 / s1)``
        over the studies with ``K >= 2`` and both values finite and positive (``theta`` NaN where none).
    """
    best = np.asarray(best, dtype=float)
    second = np.asarray(second, dtype=float)
    k = np.broadcast_to(np.asarray(n_trials, dtype=float), best.shape)
    ok = np.isfinite(best) & np.isfinite(second) & (best > 0) & (second >= best) & (k >= 2)
    with np.errstate(invalid="ignore", divide="ignore"):
        spacing = np.where(ok, (k - 1) * np.log(np.where(ok, second / np.where(ok, best, 1.0), 1.0)), 0.0)
    n = ok.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        theta = np.where(n > 0, spacing.sum(axis=-1) / np.maximum(n, 1), np.nan)
    return theta, n


def scatter_from_best_two(batch_sizes, best, second, n_trials) -> ScatterEstimate | None:
    """:class:`ScatterEstimate` from each batch size's best and second-best steps and trial count.

    For callers that hold only those numbers (a report CSV: the best trial's ``steps`` and
    ``steps_upper_bound``, the second-best trial when ``n_trials >= 2``). ``None``/NaN/inf: not
    reached or unknown. Returns ``None`` when no study has two reached trials.
    """
    b = np.asarray(batch_sizes, dtype=float)
    clean = lambda x: np.array([np.nan if v is None else float(v) for v in x], dtype=float)  # noqa: E731
    s1, s2 = clean(best), clean(second)
    k = np.asarray(n_trials, dtype=float)
    if not (b.shape == s1.shape == s2.shape == k.shape):
        raise BatchlabError(f"batch_sizes, best, second and n_trials must align, got lengths {b.size}, {s1.size}, "
                            f"{s2.size}, {k.size}")
    theta, n = pooled_tail_scale(s1, s2, k)
    n = int(n)
    if n == 0:
        return None
    theta = float(theta)
    has = k >= 1
    sd = theta / np.where(has, k, 1.0)
    contributing = np.isfinite(s1) & np.isfinite(s2) & (k >= 2)
    tau = float(np.sqrt(np.mean(sd[contributing] ** 2)))
    return ScatterEstimate(tau=tau, dof=float(variance_dof(n)), n_studies=n, method=METHOD.format(n=n), tail_scale=theta,
                           by_batch_size=tuple((int(bb), float(s)) for bb, s, h in zip(b, sd, has) if h))


def scatter_from_trials(trial_steps: Mapping[int, np.ndarray],
                        unknown_from: Mapping[int, np.ndarray] | None = None) -> ScatterEstimate | None:
    """:class:`ScatterEstimate` from every study's trials.

    ``trial_steps``: ``{batch_size: each trial's first qualifying step}`` (``inf`` = not reached,
    ``NaN`` = raced, unknown; ``unknown_from`` as in :func:`kth_smallest`). A study contributes when
    its best two trials are determined and reached. ``None`` when none does.
    """
    batch_sizes = sorted(int(b) for b in trial_steps)
    best, second, k = [], [], []
    for b in batch_sizes:
        values = np.asarray(trial_steps[b], dtype=float)
        bounds = None if unknown_from is None else unknown_from.get(b)
        pair = [kth_smallest(values, j, bounds) if values.size >= j else None for j in (1, 2)]
        best.append(pair[0])
        second.append(pair[1])
        k.append(values.size)
    return scatter_from_best_two(batch_sizes, best, second, k)
