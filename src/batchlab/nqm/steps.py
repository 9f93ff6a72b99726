"""Steps to target: the first passage of the exact expected loss below a target.

Conventions:

* ``steps`` = the first-passage count, the smallest number of updates ``t`` with ``L(t) < target``
  (``L(0)`` is the initial loss, so a target must lie below it).
* ``official_low`` = ``steps - 1``: the official notebook's ``low`` convention (docs/methods.md, "Tuning per batch size"); SGD there
  also clamps to ``>= 1``, which :func:`official_low` applies when asked.
* A target not reached within ``max_steps`` updates gives ``reached=False, steps=None``.

Method (docs/methods.md, "Steps to target"). A *candidate* is found for every grid point and batch size at once by binary
lifting over the powers ``T^(2^j)`` (top bit first: advance by ``2^j`` while the loss there is still
``>= target``). When the loss is monotone the candidate is the first passage. It is then *certified*:

* ``laguerre``: single-moment dynamics (SGD, any p) have ``L(t) - C = const + sum_j c_j beta_j^t`` with
  ``beta_j >= 0``; by Laguerre's rule of signs such a sum has at most as many real zeros as sign changes of
  its coefficients ordered by ``beta``. One sign change means one crossing: the candidate is exact.
* ``dense``: otherwise (momentum, Nesterov, EMA, or SGD with more sign changes) the loss is evaluated
  exactly at *every* step up to the candidate (vectorised in blocks) and the first step below the target
  is returned; this corrects candidates that an oscillating loss placed after an earlier crossing.

Candidates that are never certified (tuning losers) are upper bounds on their first passage.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from batchlab.errors import BatchlabError
from batchlab.nqm.algorithms import get_nqm_algorithm
from batchlab.nqm.dynamics import (
    MomentRecurrence,
    PowerLevels,
    apply,
    iter_dense_losses,
    losses_at_steps,
    power_table,
    select_table,
)

DENSE_CERTIFY_LIMIT = 50_000_000
"""Largest candidate certified by dense evaluation (beyond it the result is marked ``uncertified``)."""

TABLE_ELEMENTS = 25_000_000
"""Most float64 entries of a power table held at once (200 MB); larger grids are processed in chunks."""


def default_max_steps(optimizer: str) -> int:
    """Default step budget of a registered NQM algorithm: the official ``high`` minus one (10^9 - 1 for SGD,
    10^7 - 1 otherwise; :attr:`batchlab.nqm.algorithms.NQMAlgorithm.official_high`)."""
    return get_nqm_algorithm(optimizer).default_max_steps


@dataclass(frozen=True)
class StepsResult:
    """First passage of one configuration at one batch size.

    Attributes:
        reached: whether ``L(t) < target`` for some ``t <= max_steps``.
        steps: the first-passage count (updates), ``None`` when not reached.
        final_loss: expected loss at ``steps`` (just below target) when reached, else at ``max_steps``.
        certified: how ``steps`` was established: ``laguerre``, ``dense``, ``trivial`` or ``uncertified``
            (a lifting candidate too long to verify, an upper bound; or, when not reached, a budget
            that only lifting searched).
    """

    reached: bool
    steps: int | None
    final_loss: float
    certified: str

    @property
    def official_low(self) -> int | None:
        """The notebook's ``low`` convention: first passage - 1 (``None`` when not reached)."""
        return None if self.steps is None else self.steps - 1

    def to_dict(self) -> dict:
        return {**asdict(self), "official_low": self.official_low}


def official_low(steps: int | None, optimizer: str = "sgd") -> int | None:
    """``steps - 1``, clamped to ``>= 1`` where the notebook does (SGD:
    :attr:`batchlab.nqm.algorithms.NQMAlgorithm.clamp_official_low`)."""
    if steps is None:
        return None
    return max(steps - 1, 1) if get_nqm_algorithm(optimizer).clamp_official_low else steps - 1


def check_target(target: float, initial_loss: float) -> float:
    target = float(target)
    if not np.isfinite(target) or target <= 0:
        raise BatchlabError(f"target must be > 0, got {target:g}")
    if target >= initial_loss:
        raise BatchlabError(f"target {target:g} must be below the initial loss {initial_loss:.6g}")
    return target


def check_batch_sizes(batch_sizes) -> np.ndarray:
    array = np.atleast_1d(np.asarray(batch_sizes, dtype=float))
    if array.size == 0 or not np.all(np.isfinite(array)) or np.any(array <= 0):
        raise BatchlabError(f"batch sizes must be > 0, got {array.tolist()}")
    return array


def check_max_steps(max_steps: int) -> int:
    if int(max_steps) != max_steps or max_steps < 1:
        raise BatchlabError(f"max steps must be a positive integer, got {max_steps}")
    return int(max_steps)


def first_passage_candidates(
    rec: MomentRecurrence,
    batch_sizes,
    target: float,
    max_steps: int,
    chunk_elements: int = 3_000_000,
    table=None,
    initial: np.ndarray | None = None,
) -> np.ndarray:
    """Binary-lifting candidates, shape ``(G, nB)``: first passage if the loss is monotone, -1 if not reached.

    ``initial`` (``(m, G or 1, 1, J)``) replaces ``u_0`` (to continue from a schedule segment's start).

    Cost: ``O(G * nB * J * m^2 * log2(max_steps))``; the power table (``O(G * J * m^3 * log2(max_steps))``)
    is shared by all batch sizes.
    """
    inv_b = 1.0 / check_batch_sizes(batch_sizes)
    max_steps = check_max_steps(max_steps)
    levels = max_steps.bit_length()
    G, nB, J = rec.grid_size, inv_b.size, rec.readout.shape[1]
    per_point = max(1, nB * J * rec.size)
    step = max(1, min(chunk_elements // per_point, TABLE_ELEMENTS // (J * rec.size * (rec.size + 1) * levels)))
    out = np.empty((G, nB), dtype=np.int64)
    inv_b = inv_b[None, :, None]
    for start in range(0, G, step):
        chunk = np.arange(start, min(G, start + step))
        sub = rec if chunk.size == G else rec.select(chunk)  # the whole grid: no copy
        if table is None:
            sub_table = power_table(sub, levels)
        else:
            sub_table = table[:levels] if chunk.size == G else select_table(table[:levels], chunk)
        if initial is None:
            u = sub.initial_state(nB)
        else:
            part = initial if initial.shape[1] == 1 else initial[:, chunk]
            u = np.broadcast_to(part, (part.shape[0], chunk.size, nB, part.shape[-1])).copy()
        with np.errstate(invalid="ignore", over="ignore"):
            start_below = sub.loss(u) < target
        t = np.zeros((sub.grid_size, nB), dtype=np.int64)
        for j in range(levels - 1, -1, -1):
            with np.errstate(invalid="ignore", over="ignore"):  # unstable points overflow: never "below"
                u_try = apply(*sub_table[j], u, inv_b)
                below = sub.loss(u_try) < target
            advance = ~below & (t + (1 << j) <= max_steps)
            t = np.where(advance, t + (1 << j), t)
            u = np.where(advance[None, :, :, None], u_try, u)
        with np.errstate(invalid="ignore", over="ignore"):
            next_below = sub.loss(apply(*sub_table[0], u, inv_b)) < target
        candidate = np.where(next_below & (t + 1 <= max_steps), t + 1, -1)
        out[start : start + sub.grid_size] = np.where(start_below, 0, candidate)
    return out


def best_candidates(
    rec: MomentRecurrence, batch_sizes, target: float, max_steps: int
) -> tuple[np.ndarray, np.ndarray]:
    """The grid point with the smallest lifting candidate at each batch size (ties: the first index).

    Returns ``(index, candidate)``, each of shape ``(nB,)``; ``candidate = -1`` (and index of the first
    grid point) when no grid point reaches the target within ``max_steps``.

    Pruning, exact for lifting candidates: the loss at ``t = 2^j`` is ``A_j + N_j / B`` with two
    B-independent numbers per grid point read off the power table. Lifting puts a grid point's candidate in
    ``(2^(k-1), 2^k]`` where ``k`` is the smallest level with the loss below target at ``2^i`` for every
    ``i >= k``; so the smallest candidate is among the points with the smallest ``k``, and only those are
    lifted, per batch size.
    """
    inv_b = 1.0 / check_batch_sizes(batch_sizes)
    max_steps = check_max_steps(max_steps)
    levels = max_steps.bit_length()
    G, J, m = rec.grid_size, rec.readout.shape[1], rec.size
    if rec.shared is not None or G * J * m * (m + 1) * levels <= TABLE_ELEMENTS:
        powers = PowerLevels(rec, levels)
        drift, noise = powers.drift, powers.noise
    else:  # a table too large for memory: loss terms chunk by chunk, tables rebuilt for the subsets
        powers = None
        step = max(1, TABLE_ELEMENTS // (J * m * (m + 1) * levels))
        drifts, noises = [], []
        for i in range(0, G, step):
            part = PowerLevels(rec.select(np.arange(i, min(G, i + step))), levels)
            drifts.append(part.drift)
            noises.append(part.noise)
            del part  # keep only the loss terms, not the table
        drift, noise = np.concatenate(drifts, axis=1), np.concatenate(noises, axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        below = (drift[:, :, None] + noise[:, :, None] * inv_b[None, None, :]) < target  # (levels, G, nB)
        start_below = rec.loss(rec.initial_state(1))[:, 0] < target
    # k = smallest level such that every level >= k is below (levels if the top level is not below).
    suffix = np.flip(np.cumprod(np.flip(below, 0), axis=0), 0).astype(bool)  # all levels >= j below
    k = np.where(suffix.any(0), np.argmax(suffix, axis=0), levels)  # (G, nB)
    index = np.zeros(inv_b.size, dtype=np.int64)
    best = np.full(inv_b.size, -1, dtype=np.int64)
    for b in range(inv_b.size):
        if np.any(start_below):
            index[b], best[b] = int(np.argmax(start_below)), 0
            continue
        k_min = int(k[:, b].min())
        subset = np.flatnonzero(k[:, b] == k_min)
        # Candidates of the subset lie in (2^(k_min-1), 2^k_min]: a budget of 2^k_min changes none of them.
        budget = min(max_steps, 1 << k_min)
        levels_needed = budget.bit_length()
        small = powers is not None and subset.size * J * m * (m + 1) * levels_needed <= TABLE_ELEMENTS
        found = first_passage_candidates(
            rec.select(subset),
            [1.0 / inv_b[b]],
            target,
            budget,
            table=powers.table(subset, levels_needed) if small else None,
        )[:, 0]
        ranked = np.where(found < 0, np.iinfo(np.int64).max, found)
        if ranked.min() == np.iinfo(np.int64).max:
            continue
        pick = int(np.argmin(ranked))
        index[b], best[b] = int(subset[pick]), int(found[pick])
    return index, best


def _laguerre_single_crossing(rec: MomentRecurrence, batch_size: float, target: float) -> bool:
    """True if a single-moment recurrence's ``L(t) - target`` (t >= 1) has at most one real zero."""
    if rec.size != 1 or rec.grid_size != 1:
        return False
    beta = rec.transition[0, 0, 0, 0]
    g = rec.noise[0, 0, 0] / batch_size
    if np.any(beta >= 1.0) or np.any(beta < 0):
        return False
    steady = g / (1.0 - beta)
    rho = rec.readout[0]
    coefficient = rho * (rec.initial[0, 0, 0] - steady)
    keep = beta > 0  # beta = 0 terms vanish for t >= 1
    values, inverse = np.unique(-beta[keep], return_inverse=True)  # ascending -beta = descending beta
    grouped = np.zeros(values.size)
    np.add.at(grouped, inverse, coefficient[keep])
    sequence = np.concatenate([[float(rho @ steady) - target], grouped])
    scale = np.abs(sequence).max()
    signs = np.sign(sequence[np.abs(sequence) > 1e-12 * scale])
    return int(np.count_nonzero(signs[1:] != signs[:-1])) <= 1


def certify(rec: MomentRecurrence, batch_size: float, target: float, candidate: int, max_steps: int) -> StepsResult:
    """Turn a lifting candidate of a single configuration (``rec.grid_size == 1``) into a certified result."""
    if candidate is None or candidate < 0:
        final = float(losses_at_steps(rec, batch_size, [max_steps])[0, 0])
        # With at most one real zero, L - C >= 0 at t = 0 and at the budget means no dip below in between.
        how = "laguerre" if final >= target and _laguerre_single_crossing(rec, batch_size, target) else "uncertified"
        return StepsResult(False, None, final, how)
    if candidate <= 1:
        final = float(losses_at_steps(rec, batch_size, [candidate])[0, 0])
        return StepsResult(True, int(candidate), final, "trivial")
    if _laguerre_single_crossing(rec, batch_size, target):
        final = float(losses_at_steps(rec, batch_size, [candidate])[0, 0])
        return StepsResult(True, int(candidate), final, "laguerre")
    if candidate > DENSE_CERTIFY_LIMIT:
        final = float(losses_at_steps(rec, batch_size, [candidate])[0, 0])
        return StepsResult(True, int(candidate), final, "uncertified")
    for first_step, losses in iter_dense_losses(rec, batch_size, candidate):
        below = np.flatnonzero(losses[0] < target)
        if below.size:
            first = int(below[0])
            return StepsResult(True, first_step + first, float(losses[0, first]), "dense")
    # unreachable in exact arithmetic (the candidate itself is below); keep the candidate
    final = float(losses_at_steps(rec, batch_size, [candidate])[0, 0])
    return StepsResult(True, int(candidate), final, "dense")


def steps_to_target(rec: MomentRecurrence, batch_size: float, target: float, max_steps: int) -> StepsResult:
    """Exact first passage of one configuration (``rec.grid_size == 1``) at one batch size."""
    if rec.grid_size != 1:
        raise BatchlabError("steps_to_target takes a single configuration; use tuning for grids")
    candidate = int(first_passage_candidates(rec, [batch_size], target, max_steps)[0, 0])
    return certify(rec, float(batch_size), target, candidate, max_steps)
