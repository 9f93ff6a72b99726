"""Exact second-moment recurrences of the NQM, for every algorithm, vectorised over grids and bins.

Per eigen-direction every algorithm is a linear stochastic update of a small state ``w`` (``(x)`` for SGD,
``(x, v)`` for heavy-ball and Nesterov momentum, plus ``x_ema`` when an EMA of iterates is kept)::

    w_{t+1} = A w_t + b eps_t,      eps_t ~ N(0, c / B) independent of w_t,

composed optax-style: a base update (``sgd``, ``momentum``, ``nesterov``) and an ``ema`` wrapper that adds
one state component. Which algorithm has which base update and wrapper is declared once, in the registry
:mod:`batchlab.nqm.algorithms`. Preconditioning ``P^-1 = H^-p`` enters through ``z = lr h^(1-p)`` (curvature step) and
``a = lr h^-p`` (noise gain), docs/methods.md, "Algorithms, exactly".

The second moments ``S = E[w w^T]`` evolve affinely, ``S' = A S A^T + (c / B) b b^T``. On the vector ``u`` of
the ``m = n (n + 1) / 2`` distinct entries of ``S`` this is ``u' = T u + g / B`` with ``g = c b b^T``. Powers
``T^k`` and the accumulated noise ``G_k g = sum_{i<k} T^i g`` are built by repeated squaring of the
augmented map ``[[T, g], [0, 1]]``: no eigendecomposition, so the result is exact (to rounding) for
defective or critically damped ``T`` and cannot produce negative variances from cancellation. Neither
depends on B (noise enters linearly as ``g / B``), so one power table serves every batch size.

Layout (component first, for fast elementwise numpy): a recurrence over ``G`` grid points and ``J`` bins
stores ``T`` as ``(m, m, G, 1, J)``, ``g`` as ``(m, G, 1, J)``; states are ``(m, G, nB, J)`` with one slot per
batch size. The expected loss is ``sum_{k, j} rho[k, j] u[k, ..., j]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from batchlab.errors import BatchlabError
from batchlab.nqm.algorithms import (  # Algorithm is re-exported: the engine's name for a registry entry + p
    Algorithm,
    get_base_update,
    get_nqm_algorithm,
    nqm_algorithm_names,
)
from batchlab.nqm.problem import Problem


def check_momentum(value, what: str = "momentum") -> np.ndarray:
    """Validate momentum or EMA decay values: each must lie in [0, 1)."""
    array = np.asarray(value, dtype=float)
    if not np.all(np.isfinite(array)) or np.any(array < 0) or np.any(array >= 1):
        bad = array[~(np.isfinite(array) & (array >= 0) & (array < 1))].ravel()[0]
        raise BatchlabError(f"{what} must be in [0, 1), got {bad:g}")
    return array


def check_learning_rate(value) -> np.ndarray:
    array = np.asarray(value, dtype=float)
    if not np.all(np.isfinite(array)) or np.any(array <= 0):
        raise BatchlabError("learning rate must be a finite number > 0")
    return array


def linear_update(base: str, z, a, momentum=0.0, ema_decay=None):
    """Per-direction linear update ``w' = A w + b eps`` of one algorithm.

    Args:
        base: the name of a base update (:data:`batchlab.nqm.algorithms.BASE_UPDATES`: ``sgd``,
            ``momentum``, ``nesterov``).
        z, a: curvature step ``lr h^(1-p)`` and noise gain ``lr h^-p`` (broadcastable arrays).
        momentum: heavy-ball / Nesterov coefficient mu (ignored for ``sgd``).
        ema_decay: gamma of an EMA of iterates ``x_ema' = gamma x_ema + (1 - gamma) x'``, or None.

    Returns:
        ``(A, b, readout, init)``: ``A[i][k]`` and ``b[i]`` are arrays (or scalars); ``readout`` is the
        vector e with evaluated iterate ``e . w``; ``init`` is f with ``w_0 = f x_0``.
    """
    one = np.ones_like(z)
    A, b, readout, init = get_base_update(base).linear(z, a, momentum, one)
    if ema_decay is None:
        return A, b, readout, init
    # EMA wrapper: x_ema' = gamma x_ema + (1 - gamma) x', with x' the first row of the base update.
    gamma = ema_decay
    n = len(A)
    A = [row + [0.0 * one] for row in A] + [[(1.0 - gamma) * A[0][k] for k in range(n)] + [gamma * one]]
    b = b + [(1.0 - gamma) * b[0]]
    return A, b, [0.0] * n + [1.0], init + [1.0]


def _pairs(n: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(n) for j in range(i, n)]


@dataclass(frozen=True, eq=False)
class MomentRecurrence:
    """``u_{t+1} = T u_t + g / B`` over ``G`` grid points and ``J`` bins; loss ``sum rho * u``.

    Attributes:
        transition: ``(m, m, G, 1, J)``.
        noise: ``(m, G, 1, J)``, the per-step noise injection at batch size 1.
        initial: ``(m, 1, 1, J)``, ``u_0``.
        readout: ``(m, J)``, loss weights per moment component (``counts h / 2`` folded in).
        shared: optional dict: the same maps over the distinct hyperparameter combinations only
            (``reduced``, one grid point each, unit noise), the combination of every ``(grid point, bin)``
            (``index``, ``(G, J)``) and its noise scale ``a^2 c`` (``scale``, ``(G, 1, J)``), plus the
            per-pair readout/initial factors; power tables are then built once per combination
            (:class:`PowerLevels`).
    """

    transition: np.ndarray
    noise: np.ndarray
    initial: np.ndarray
    readout: np.ndarray
    shared: tuple | None = None

    @property
    def size(self) -> int:
        return self.transition.shape[0]

    @property
    def grid_size(self) -> int:
        return self.transition.shape[2]

    def loss(self, u: np.ndarray) -> np.ndarray:
        """Expected loss of states ``u`` (``(m, ..., J)``) -> shape ``u.shape[1:-1]``."""
        total = u[0] @ self.readout[0]
        for k in range(1, self.size):
            total = total + u[k] @ self.readout[k]
        return total

    def initial_state(self, n_batch: int = 1) -> np.ndarray:
        """``u_0`` broadcast to ``(m, G, n_batch, J)``."""
        m, _, _, J = self.initial.shape
        return np.broadcast_to(self.initial, (m, self.grid_size, n_batch, J)).copy()

    def select(self, index) -> "MomentRecurrence":
        """The recurrence restricted to grid points ``index`` (array of ints)."""
        index = np.atleast_1d(np.asarray(index))
        return MomentRecurrence(
            np.take(self.transition, index, axis=2), np.take(self.noise, index, axis=1), self.initial, self.readout
        )

    def step_map(self):
        """``(T, g)`` of one step."""
        return self.transition, self.noise


def moment_recurrence(
    problem: Problem, algorithm: Algorithm, learning_rate, momentum=None, ema_decay=None, notebook_fudge: bool = False
):
    """Build the exact moment recurrence for grid points ``(learning_rate, momentum, ema_decay)``.

    The three arguments broadcast to one flat grid of G points (scalars give G = 1). ``momentum`` is
    required for momentum/Nesterov algorithms and ``ema_decay`` for EMA ones; the other is ignored.

    ``notebook_fudge=True`` (plain SGD only) reproduces the official notebook bit for bit: it adds
    ``1e-8`` to ``1 - beta`` in the SGD steady state ``s* = a^2 sigma^2 / (1 - beta)``. Since
    ``s_k = beta^k s_0 + s* (1 - beta^k)``, that equals scaling the per-step noise by
    ``(1 - beta) / (1 - beta + 1e-8)``. It is *not* the NQM (it lowers the noise floor of the flattest
    directions at small learning rates, by up to ~0.3% in steps at target 0.001); off by default.
    """
    lr = check_learning_rate(learning_rate)
    mu = check_momentum(0.0 if momentum is None else momentum, "momentum")
    gamma = check_momentum(0.0 if ema_decay is None else ema_decay, "EMA decay")
    if algorithm.uses_momentum and momentum is None:
        raise BatchlabError(f"optimizer {algorithm.name!r} needs a momentum value in [0, 1)")
    if algorithm.uses_ema and ema_decay is None:
        raise BatchlabError(f"optimizer {algorithm.name!r} needs an EMA decay value in [0, 1)")
    lr, mu, gamma = (x.ravel()[:, None] for x in np.broadcast_arrays(lr, mu, gamma))
    p = float(algorithm.precondition)
    h, c = problem.curvature, problem.noise
    # Grids repeat each learning rate (once per momentum / decay value): the per-(learning rate, bin)
    # numbers are computed once per distinct learning rate, then indexed (the same numbers).
    if lr.shape[0] > 1:
        lr_values, lr_index = np.unique(lr[:, 0], return_inverse=True)
        lr_values = lr_values[:, None]
    else:
        lr_values, lr_index = lr, np.zeros(1, dtype=np.intp)
    # z is rounded to 14 significant digits so that grid points with the same curvature step (the
    # geometric LR grids times geometric bins hit the same z many times) share one power table; the
    # recurrence is then exact for that z (a relative change below 1e-13, far below any reported digit).
    z_rows = _round_significant(lr_values * h ** (1.0 - p))  # (distinct lr, J)
    noise_scale = ((lr_values * h ** (-p)) ** 2 * c)[lr_index]  # a^2 c: g = noise_scale * d d^T, d = b / a
    G, J = lr.shape[0], h.shape[0]
    ema = algorithm.uses_ema
    n = len(linear_update(algorithm.base, np.zeros(1), np.ones(1), 0.0, 0.0 if ema else None)[2])
    m = n * (n + 1) // 2
    T = None
    shared = None
    if m >= 3 and not notebook_fudge and G * J >= 64:
        distinct, first, inverse = _distinct_combinations(z_rows, lr_index, mu[:, 0], gamma[:, 0])
        if distinct.size < 0.5 * G * J:
            rows, bins = np.divmod(first, J)
            pick = lambda x: np.broadcast_to(x, (G, J))[rows, bins][:, None]  # noqa: E731
            T_u, d_u, e, f = _moment_maps(algorithm.base, z_rows[lr_index[rows], bins][:, None], pick(mu),
                                          pick(gamma) if ema else None)
            # Every (grid point, bin) takes its combination's maps: the numbers a full evaluation gives.
            flat = inverse.ravel()
            T = np.take(T_u[..., 0], flat, axis=2).reshape(m, m, G, J)
            direction = np.take(d_u[..., 0], flat, axis=1).reshape(m, G, J)
            reduced = MomentRecurrence(T_u[..., None, :], d_u[..., None, :], np.zeros((m, 1, 1, 1)), np.zeros((m, 1)))
            pairs_ = _pairs(len(e))
            shared = {
                "reduced": reduced,
                "index": inverse.reshape(G, J),
                "scale": noise_scale[:, None, :],
                "pair_readout": np.array([(1.0 if i == j else 2.0) * e[i] * e[j] for i, j in pairs_]),
                "pair_initial": np.array([f[i] * f[j] for i, j in pairs_]),
                "weights": problem.loss_weights,
                "initial": problem.initial_second_moment,
            }
    if T is None:
        T, direction, e, f = _moment_maps(algorithm.base, z_rows[lr_index], mu, gamma if ema else None)
    g = direction * noise_scale
    T = T[:, :, :, None, :]
    g = g[:, :, None, :]
    if notebook_fudge:
        if not algorithm.entry.notebook_fudge:
            raise BatchlabError(f"the notebook's 1e-8 steady-state fudge applies to {_fudge_names()} only")
        one_minus_beta = 1.0 - T[0, 0]
        g = g * one_minus_beta / (one_minus_beta + 1e-8)
    pairs = _pairs(len(e))
    u0 = np.empty((m, 1, 1, J))
    rho = np.empty((m, J))
    w = problem.loss_weights
    for r, (i, j) in enumerate(pairs):
        u0[r, 0, 0] = f[i] * f[j] * problem.initial_second_moment
        rho[r] = (1.0 if i == j else 2.0) * e[i] * e[j] * w
    return MomentRecurrence(T, g, u0, rho, shared)


def _fudge_names() -> str:
    return ", ".join(n for n in nqm_algorithm_names() if get_nqm_algorithm(n).notebook_fudge)


def _distinct_combinations(z_rows: np.ndarray, row_index: np.ndarray, mu: np.ndarray, gamma: np.ndarray):
    """Distinct ``(z, mu, gamma)`` over a ``(G, J)`` grid ``z = z_rows[row_index]`` and per-grid-point
    ``mu``, ``gamma`` (``(G,)``).

    Returns ``(keys, representative, inverse)`` like ``np.unique(key, return_index=True,
    return_inverse=True)`` on a combined integer key, except that ``representative`` is *some* flat
    ``(G, J)`` index of each combination (all of them carry identical values). One sort of the distinct
    rows of ``z`` only: the combined key is ranked with a presence table when its range is small (the
    usual case).
    """
    G, J = row_index.size, z_rows.shape[1]
    z_values, z_code = np.unique(z_rows.ravel(), return_inverse=True)
    z_code = z_code.reshape(z_rows.shape)[row_index]
    mu_values, mu_code = np.unique(mu, return_inverse=True)
    gamma_values, gamma_code = np.unique(gamma, return_inverse=True)
    per_point = mu_values.size * gamma_values.size
    point_code = (mu_code * gamma_values.size + gamma_code)[:, None]
    key = (z_code.astype(np.int64).reshape(G, J) * per_point + point_code).ravel()
    space = z_values.size * per_point
    if space > 8 * key.size:
        return np.unique(key, return_index=True, return_inverse=True)
    present = np.zeros(space, dtype=bool)
    present[key] = True
    keys = np.flatnonzero(present)
    inverse = (np.cumsum(present) - 1)[key]
    representative = np.empty(keys.size, dtype=np.int64)
    representative[inverse] = np.arange(key.size)
    return keys, representative, inverse


def _round_significant(x: np.ndarray, digits: int = 14) -> np.ndarray:
    scale = 10.0 ** np.floor(np.log10(np.abs(x)))
    return np.round(x / scale, digits - 1) * scale


def _moment_maps(base: str, z: np.ndarray, mu, gamma):
    """Second-moment transition ``T`` (``(m, m) + z.shape``) and unit noise direction ``d d^T`` (``(m,) + shape``)."""
    A, d, e, f = linear_update(base, z, np.ones_like(z), mu, gamma)
    pairs = _pairs(len(A))
    m = len(pairs)
    shape = z.shape
    T = np.empty((m, m) + shape)
    for r, (i, j) in enumerate(pairs):
        for s, (k, l) in enumerate(pairs):
            term = np.asarray(A[i][k]) * np.asarray(A[j][l])
            if k != l:
                term = term + np.asarray(A[i][l]) * np.asarray(A[j][k])
            T[r, s] = np.broadcast_to(term, shape)
    direction = np.empty((m,) + shape)
    for r, (i, j) in enumerate(pairs):
        direction[r] = np.broadcast_to(np.asarray(d[i]) * np.asarray(d[j]), shape)
    return T, direction, e, f



ROW_WISE_ELEMENTS = 4096
"""Grid size (elements per matrix entry) from which :func:`compose` and :func:`apply` work one row at a
time: numpy iterates a product that broadcasts over the row axis with that short axis innermost, which
is slow for large grids; row by row every operation runs over the contiguous grid."""


def apply(P: np.ndarray, g: np.ndarray, u: np.ndarray, inv_batch) -> np.ndarray:
    """``P u + g * inv_batch`` for component-first arrays (``inv_batch`` broadcasts over the batch axis)."""
    m = P.shape[0]
    if P.shape[2:] == u.shape[1:] and u[0].size >= ROW_WISE_ELEMENTS and np.size(inv_batch) == 1:
        return _apply_rows(P, g, u, np.reshape(inv_batch, ()))
    shape = np.broadcast_shapes(u.shape, g.shape)
    with np.errstate(over="ignore", invalid="ignore"):  # unstable configurations overflow to inf: fine
        # All rows i at once, the same elementwise operations in the same order (k = 0..m-1, then the
        # noise) as one row at a time: bit-identical, with m + 1 array operations instead of m (m + 1).
        acc = P[:, 0] * u[0]
        for k in range(1, m):
            acc += P[:, k] * u[k]
        acc += g * inv_batch
    if acc.shape == shape and acc.dtype == np.float64:
        return acc
    out = np.empty(shape)
    out[...] = acc
    return out


def _apply_rows(P, g, u, inv_batch):
    """:func:`apply` row by row over flat grids (``P`` and ``u`` of one grid shape, one batch size): the
    same elementwise operations in the same order, each over a whole contiguous row."""
    shape = u.shape
    m, n = P.shape[0], u[0].size
    P, u, g = P.reshape(m, m, n), u.reshape(m, n), np.broadcast_to(g, shape).reshape(m, n)
    out = np.empty((m, n))
    scratch = np.empty(n)
    with np.errstate(over="ignore", invalid="ignore"):  # unstable configurations overflow to inf: fine
        for i in range(m):
            row = out[i]
            np.multiply(P[i, 0], u[0], out=row)
            for k in range(1, m):
                row += np.multiply(P[i, k], u[k], out=scratch)
            row += np.multiply(g[i], inv_batch, out=scratch)
    return out.reshape(shape)


def compose(first, second):
    """The map of applying ``first = (P1, g1)`` then ``second = (P2, g2)``: ``(P2 P1, P2 g1 + g2)``."""
    P1, g1 = first
    P2, g2 = second
    m = P1.shape[0]
    P = np.empty((m, m) + np.broadcast_shapes(P1.shape[2:], P2.shape[2:]))
    g = np.empty((m,) + np.broadcast_shapes(g1.shape[1:], g2.shape[1:]))
    scratch = np.empty(P.shape[2:])
    with np.errstate(over="ignore", invalid="ignore"):
        _compose_into(P, g, P1, g1, P2, g2, scratch)
    return P, g


def _compose_into(P, g, P1, g1, P2, g2, scratch):
    m = P.shape[0]
    if P1.shape == P2.shape == P.shape and g1.shape == g2.shape == g.shape and scratch.size >= ROW_WISE_ELEMENTS:
        # Row by row over flat grids: the same elementwise operations in the same order (k = 0..m-1,
        # then g2) as below, so bit-identical, each over whole contiguous rows.
        n = scratch.size
        P, P1, P2 = P.reshape(m, m, n), P1.reshape(m, m, n), P2.reshape(m, m, n)  # P: a view (new array)
        g, g1, g2 = g.reshape(m, n), g1.reshape(m, n), g2.reshape(m, n)
        rows = np.empty((m, n))
        for i in range(m):
            np.multiply(P2[i, 0], P1[0], out=P[i])
            for k in range(1, m):
                P[i] += np.multiply(P2[i, k], P1[k], out=rows)
        np.multiply(P2[:, 0], g1[0], out=g)
        for k in range(1, m):
            g += np.multiply(P2[:, k], g1[k], out=rows)
        g += g2
        return
    if P1.ndim == P2.ndim and g1.ndim == g2.ndim == P2.ndim - 1:
        # All (i, j) at once: the same elementwise operations in the same order (k = 0..m-1, then g2) as
        # the loop below, so bit-identical, with 2 (m + 1) array operations instead of m (m + 1) (m + 1).
        np.multiply(P2[:, 0, None], P1[None, 0], out=P)
        np.multiply(P2[:, 0], g1[0], out=g)
        for k in range(1, m):
            P += P2[:, k, None] * P1[None, k]
            g += P2[:, k] * g1[k]
        g += g2
        return
    for i in range(m):
        gi = g[i]
        np.multiply(P2[i, 0], g1[0], out=gi)
        for k in range(1, m):
            np.multiply(P2[i, k], g1[k], out=scratch)
            gi += scratch
        gi += g2[i]
        for j in range(m):
            acc = P[i, j]
            np.multiply(P2[i, 0], P1[0, j], out=acc)
            for k in range(1, m):
                np.multiply(P2[i, k], P1[k, j], out=scratch)
                acc += scratch


def select_table(table, index):
    """A power table restricted to grid points ``index``."""
    index = np.asarray(index)
    return [(np.take(P, index, axis=2), np.take(g, index, axis=1)) for P, g in table]


def power_table(rec: MomentRecurrence, levels: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``[(T^(2^j), G_(2^j) g) for j in range(levels)]`` by repeated squaring (independent of B)."""
    if rec.shared is not None:
        return PowerLevels(rec, levels).table()
    table = [rec.step_map()]
    with np.errstate(over="ignore", invalid="ignore"):  # unstable configurations overflow to inf: fine
        for _ in range(1, levels):
            table.append(compose(table[-1], table[-1]))
    return table


class PowerLevels:
    """Powers ``T^(2^j)``, ``G_(2^j) g`` of a recurrence, with the loss terms every search needs.

    ``drift[j, G]`` is the loss of ``T^(2^j) u_0`` and ``noise[j, G]`` that of ``G_(2^j) g`` (so the loss at
    ``t = 2^j`` and batch size B is ``drift + noise / B``). With shared maps (``rec.shared``) the powers are
    built once per distinct hyperparameter combination and expanded only for the grid points asked for.
    """

    def __init__(self, rec: MomentRecurrence, levels: int):
        self.rec, self.levels = rec, levels
        with np.errstate(over="ignore", invalid="ignore"):
            if rec.shared is None:
                self._table = power_table(rec, levels)
                u0 = rec.initial_state(1)
                zero = np.zeros((rec.size, 1, 1, 1))
                self.drift = np.stack([rec.loss(apply(P, zero, u0, 0.0))[:, 0] for P, _ in self._table])
                self.noise = np.stack([rec.loss(g)[:, 0] for _, g in self._table])
            else:
                sh = rec.shared
                self._reduced = power_table(sh["reduced"], levels)
                index, scale = sh["index"], sh["scale"][:, 0, :]
                start_weight = sh["weights"] * sh["initial"]  # (J,)
                noise_weight = scale * sh["weights"]  # (G, J)
                drift, noise = [], []
                for P, g in self._reduced:
                    q_drift = np.einsum("r,rsu,s->u", sh["pair_readout"], P[:, :, :, 0, 0], sh["pair_initial"])
                    q_noise = sh["pair_readout"] @ g[:, :, 0, 0]
                    drift.append(q_drift[index] @ start_weight)
                    noise.append((q_noise[index] * noise_weight).sum(1))
                self.drift, self.noise = np.stack(drift), np.stack(noise)

    def table(self, subset=None, levels: int | None = None):
        """The power table (first ``levels`` levels) for grid points ``subset`` (all when None)."""
        levels = self.levels if levels is None else levels
        if self.rec.shared is None:
            table = self._table[:levels]
            return table if subset is None else select_table(table, subset)
        sh = self.rec.shared
        index, scale = sh["index"], sh["scale"]
        if subset is not None:
            index, scale = index[subset], scale[subset]
        m, (G, J) = self.rec.size, index.shape
        flat = index.ravel()
        with np.errstate(over="ignore", invalid="ignore"):
            return [
                (np.take(P, flat, axis=2).reshape(m, m, G, 1, J), np.take(g, flat, axis=1).reshape(m, G, 1, J) * scale)
                for P, g in self._reduced[:levels]
            ]


def map_power(rec: MomentRecurrence, k: int, table=None):
    """``(T^k, G_k g)``: the map of ``k`` steps, by binary powering (``k >= 0``)."""
    k = int(k)
    levels = max(k.bit_length(), 1)
    table = table if table is not None and len(table) >= levels else power_table(rec, levels)
    m = rec.size
    P = np.zeros_like(rec.transition)
    for i in range(m):
        P[i, i] = 1.0
    result = (P, np.zeros_like(rec.noise))
    for j in range(levels):
        if (k >> j) & 1:
            result = compose(result, table[j])
    return result


def losses_at_steps(rec: MomentRecurrence, batch_size, steps) -> np.ndarray:
    """Expected loss after each of ``steps`` (non-decreasing ints >= 0) updates at one batch size.

    Exact: advances between requested steps with binary powers of the augmented map. Returns ``(G, len(steps))``.
    """
    steps = np.asarray(steps, dtype=np.int64)
    if steps.size and (np.any(np.diff(steps) < 0) or steps[0] < 0):
        raise BatchlabError("steps must be non-decreasing and >= 0")
    inv_b = 1.0 / float(batch_size)
    top = int(steps.max()) if steps.size else 0
    table = power_table(rec, max(top.bit_length(), 1))
    u = rec.initial_state(1)
    out = np.empty((rec.grid_size, steps.size))
    t = 0
    for index, target in enumerate(steps):
        delta = int(target) - t
        j = 0
        while delta:
            if delta & 1:
                u = apply(*table[j], u, inv_b)
            delta >>= 1
            j += 1
        t = int(target)
        out[:, index] = rec.loss(u)[:, 0]
    return out


def dense_losses(rec: MomentRecurrence, batch_size, last_step: int, block: int | None = None) -> np.ndarray:
    """Expected loss after every step ``0..last_step`` for each grid point, shape ``(G, last_step + 1)``.

    Exact and vectorised in blocks (see :func:`iter_dense_losses`).
    """
    return np.concatenate([losses for _, losses in iter_dense_losses(rec, batch_size, last_step, block)], axis=1)


def iter_dense_losses(
    rec: MomentRecurrence, batch_size, last_step: int, block: int | None = None, group: int = 256
):
    """Yield ``(first_step, losses)`` chunks covering every step ``0..last_step``; ``losses`` is ``(G, n)``.

    The readout rows ``rho T^i`` and noise sums for ``i < block`` are built once by doubling, block starts
    are advanced with ``T^block``, and ``group`` blocks at a time are one matrix product (bounded memory,
    and a caller looking for the first step below a target can stop early).
    """
    last_step = int(last_step)
    n = last_step + 1
    m, G, J = rec.size, rec.grid_size, rec.readout.shape[1]
    if block is None:
        # Building the rows costs ~block, advancing the block starts ~n / block Python-level steps: balance
        # them with a power of two near sqrt(16 n), between 64 and 8192, and keep the rows (G J m block
        # numbers) under 32 MB for large problems.
        block = 1 << int(np.clip(round(0.5 * np.log2(16.0 * n)), 6, 13))
        block = max(1, min(block, 1 << int(np.log2(max(4_000_000 // (G * J * m), 1)))))
    block = max(1, min(block, 1 << max(n - 1, 1).bit_length()))
    inv_b = 1.0 / float(batch_size)
    T, g = rec.step_map()
    # rows[g, j, i, :] = (rho T^i)[:, j] as (G, J, i, m) ; q[g, i] = rho . G_i g (noise accumulated over
    # i steps). Doubling: rho T^(i + len) = (rho T^i) T^len, one batched (i x m) @ (m x m) product per bin.
    rows = np.broadcast_to(rec.readout.T[None, :, None, :], (G, J, 1, m)).copy()
    q = np.zeros((G, 1))
    power = (T, g)  # T^len(rows), G_len g
    with np.errstate(over="ignore", invalid="ignore"):
        while rows.shape[2] < block:
            P, gp = power
            P_bins = P[:, :, :, 0, :].transpose(2, 3, 0, 1)  # (G, J, m, m)
            g_bins = gp[:, :, 0, :].transpose(1, 2, 0)[..., None]  # (G, J, m, 1)
            # rho T^i (G_len g) + rho G_i g = rho G_(i+len) g
            shift = np.matmul(rows, g_bins)[..., 0].sum(1)  # (G, i)
            q = np.concatenate([q, q + shift], axis=1)
            rows = np.concatenate([rows, np.matmul(rows, P_bins)], axis=2)
            if rows.shape[2] < block:
                power = compose(power, power)
    # (G, J m, block): the readout rows as one matrix per grid point, so each group is a single GEMM.
    rows = np.ascontiguousarray(rows[:, :, :block].transpose(0, 1, 3, 2)).reshape(G, J * m, block)
    q = q[:, :block]
    P_block, g_block = map_power(rec, block)
    n_blocks = -(-n // block)
    u = rec.initial_state(1)
    # Advancing u by one block is apply(P_block, g_block, u, inv_b), written out for these small states
    # (the same operations in the same order, without its per-call set-up).
    columns = [P_block[:, k] for k in range(m)]
    with np.errstate(over="ignore", invalid="ignore"):
        noise = g_block * inv_b
    for first_block in range(0, n_blocks, group):
        count = min(group, n_blocks - first_block)
        starts = np.empty((m, G, count, J))
        with np.errstate(over="ignore", invalid="ignore"):
            for index in range(count):
                starts[:, :, index] = u[:, :, 0]
                advanced = columns[0] * u[0]
                for k in range(1, m):
                    advanced += columns[k] * u[k]
                advanced += noise
                u = advanced
        # loss[g, blk, i] = sum_{k,j} rho T^i[k, j] starts[k, g, blk, j] + q[g, i] / B
        starts = starts.transpose(1, 2, 3, 0).reshape(G, count, J * m)
        with np.errstate(over="ignore", invalid="ignore"):
            out = np.matmul(starts, rows) + (q * inv_b)[:, None, :]
        first_step = first_block * block
        yield first_step, out.reshape(G, count * block)[:, : n - first_step]
