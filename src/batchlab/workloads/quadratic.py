"""The built-in workload ``nqm/quadratic``: a noisy quadratic whose expected training curve the exact NQM gives.

The model (docs/methods.md, "The noisy quadratic workload"). Parameters ``theta in R^d`` (one
``nn.Parameter`` of shape ``(d,)``, ``d = DIMENSION = 1024``), curvatures ``h_i = 1/ceil(i / 16)`` (the
power law ``1/k``, ``k = 1..64``, of :func:`batchlab.nqm.problem.zhang2019`, each level repeated 16
times so that the realised loss concentrates on its expectation), and the per-example loss of an
example ``x_j in R^d``::

    l_j(theta) = 1/2 sum_i h_i (theta_i - x_ji)^2.

The training set is ``N = TRAIN_EXAMPLES`` examples drawn ``x ~ N(0, H^-1)`` from the seed
``DATA_SEED`` and then *centred and whitened exactly*: their mean is 0 and their covariance (divisor
N) is exactly ``H^-1``. So the training loss is ``L(theta) = mean_j l_j = 1/2 sum_i h_i theta_i^2 +
d/2`` exactly, and the per-example gradient ``h * (theta - x_j)`` has mean ``H theta`` and covariance
exactly ``C = H`` over the training set (Zhang et al.'s choice ``C = H``). A batch of B distinct
examples drawn uniformly has gradient noise of covariance ``(C / B) (N - B) / (N - 1)``; the model is
initialised ``theta_0 ~ N(0, I)`` from the trial's seed (the NQM's ``s0 = 1``). SGD on this workload is
therefore the NQM :func:`nqm_problem` up to the finite-population factor and the within-epoch
correlations of sampling without replacement, which :func:`finite_set_expected_excess_loss` gives
exactly and which are negligible at the goal (below 1% of the expected loss; the tests check this).

The goal metric ``val/excess_loss`` is ``L(theta) - L(0) = 1/2 sum_i h_i theta_i^2``, measured exactly
from ``theta``: the validation split is the single example ``x = 0`` with target 0, on which the
metric's value *is* the closed form (no pass over data). Targets of training examples are
``y_j = l_j(0) = 1/2 sum_i h_i x_ji^2``, so the training loss a trial reports (the batch mean of
``l_j(theta) - l_j(0)``) is an unbiased estimate of the excess loss, with the same gradient as the
batch mean of ``l_j``; ``train/excess_loss`` is the same estimate on the fixed training subset of
the evaluation.

Public: :func:`quadratic_workload` (the registered workload), :func:`nqm_problem` (its exact NQM),
:func:`nqm_truth` (the known answer: tuned steps to the goal per batch size and the exact curve's
critical batch size), :func:`finite_set_expected_excess_loss` (the workload's exact expected curve
with its finite training set), :func:`excess_loss_sd` (the NQM's standard deviation of the realised
excess loss).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np
import torch
from torch import nn

from batchlab.errors import BatchlabError
from batchlab.workloads.base import Workload
from batchlab.workloads.tasks import custom_task

__all__ = [
    "DIMENSION", "TRAIN_EXAMPLES", "DATA_SEED", "GOAL", "NAME", "SEARCH_SPACES",
    "QuadraticModel", "quadratic_workload", "make_data", "nqm_problem", "nqm_truth",
    "nqm_expected_excess_loss", "finite_set_expected_excess_loss", "excess_loss_sd",
]

NAME = "nqm/quadratic"
LEVELS = 64
"""Distinct curvatures: ``1, 1/2, ..., 1/LEVELS``."""
MULTIPLICITY = 16
"""Directions per curvature (the NQM's ``counts``): repeating each level makes the realised loss
concentrate on its expectation (relative sd ``sqrt(2 / d_eff)``, ``d_eff`` about 16 times that of one
copy), which a plain ``1/i`` spectrum does not (its ``d_eff`` is about 23 at any d)."""
DIMENSION = LEVELS * MULTIPLICITY
"""d: number of parameters (and of curvature directions), 1024."""
TRAIN_EXAMPLES = 2**14
"""N: training examples (centred and whitened exactly; see the module docstring)."""
DATA_SEED = 20191024
"""Seed of the training examples (numpy ``default_rng``); the same in every process."""
GOAL = 3.8
"""The goal: ``val/excess_loss < GOAL``, 10% of the initial expected excess loss ``1/2 sum_i h_i = 37.95``."""
DEFAULT_STEPS = 1000
DEFAULT_BATCH_SIZE = 16
SEARCH_SPACES = {"sgd": {"learning_rate": {"type": "DOUBLE", "min_value": 0.08, "max_value": 2.0, "scale": "LOG_SCALE"}}}
"""SGD's searched learning rates: bracket the exact NQM's optimal rates at every batch size 1..4096
(:func:`nqm_truth`; checked by tests/workloads/test_quadratic.py)."""

SUPPORTED_OPTIMIZERS = ("sgd", "momentum")


def curvatures() -> np.ndarray:
    """``h_i = 1 / ceil(i / MULTIPLICITY)`` for ``i = 1..d`` (float64, shape ``(d,)``): the power law
    ``1/k`` of :func:`batchlab.nqm.problem.zhang2019` over ``k = 1..LEVELS``, each level repeated."""
    return np.repeat(1.0 / np.arange(1, LEVELS + 1, dtype=np.float64), MULTIPLICITY)


class QuadraticModel(nn.Module):
    """``theta`` (a ``(d,)`` parameter, initialised ``N(0, I)`` from the global torch seed, which
    :meth:`Workload.build_model` sets) and the fixed buffer ``sqrt(h)``.

    ``forward(x)`` maps inputs ``(B, d)`` to the scaled residuals ``sqrt(h) * (theta - x)`` of shape
    ``(B, d)``, whose half squared norm is the per-example loss ``l_j(theta)``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.theta = nn.Parameter(torch.randn(DIMENSION))
        self.register_buffer("sqrt_h", torch.as_tensor(np.sqrt(curvatures()), dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.theta - x) * self.sqrt_h


def make_model() -> nn.Module:
    """The ``nqm/quadratic`` model (see :class:`QuadraticModel`)."""
    return QuadraticModel()


def excess_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Batch mean of ``l_j(theta) - l_j(0)``: outputs ``(B, d)`` scaled residuals, targets ``(B,)`` = ``l_j(0)``."""
    return 0.5 * outputs.square().sum(dim=-1).mean() - targets.to(outputs.dtype).mean()


def excess_loss_sums(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, tuple]:
    """``excess_loss``: the float64 sum over the batch of ``l_j(theta) - l_j(0)`` and the number of examples."""
    per_example = 0.5 * outputs.double().square().sum(dim=-1) - targets.double()
    return {"excess_loss": (per_example.sum().cpu(), int(per_example.numel()))}


def quadratic_task():
    """The task: loss :func:`excess_loss`, metric ``excess_loss`` (:func:`excess_loss_sums`)."""
    return custom_task(excess_loss, excess_loss_sums, name="noisy_quadratic", metric_names=("excess_loss",),
                       default_metric="excess_loss")


def whitened_examples(num_examples: int, h: np.ndarray, seed: int) -> torch.Tensor:
    """``(num_examples, d)`` float32 examples of mean 0 and covariance (divisor N) ``diag(1/h)``, exact up
    to float32 rounding (relative error below 1e-5; tests/workloads/test_quadratic.py).

    Drawn ``N(0, I)`` (torch generator seeded with ``seed``), centred, then mapped by ``S^-1/2 H^-1/2``
    with ``S`` their covariance: ``A^T S A = H^-1`` for ``A = S^-1/2 H^-1/2``. Costs two ``N x d x d``
    float32 products (a few seconds on one core), once per process.
    """
    generator = torch.Generator().manual_seed(int(seed))
    x = torch.randn(num_examples, h.size, generator=generator)
    x -= x.double().mean(dim=0).float()
    cov = (x.T @ x).double().numpy() / num_examples
    values, vectors = np.linalg.eigh(cov)
    transform = (vectors / np.sqrt(values)) @ vectors.T / np.sqrt(h)[None, :]
    out = x @ torch.from_numpy(transform.astype(np.float32))
    return out - out.double().mean(dim=0).float()


def _prepared_arrays() -> dict:
    h = curvatures()
    x = whitened_examples(TRAIN_EXAMPLES, h, DATA_SEED)
    y = 0.5 * (x.double().square() @ torch.from_numpy(h))
    return {"x": x.numpy(), "y": y.float().numpy()}


def make_data() -> dict:
    """The splits: train ``(N, d)`` float32 whitened examples with float32 targets ``l_j(0)``; val the single
    example 0 with target 0.

    The training arrays are kept in batchlab's data cache (:func:`batchlab.data.cache.cached_arrays`,
    ``nqm_quadratic_*.npz``, 64 MiB) after the first process generates them; generated in memory
    when the cache directory cannot be used.
    """
    from batchlab.data.cache import cached_arrays

    name = f"nqm_quadratic_d{DIMENSION}_n{TRAIN_EXAMPLES}_seed{DATA_SEED}_v1.npz"
    try:
        arrays = cached_arrays(name, _prepared_arrays)
    except (BatchlabError, OSError):
        arrays = _prepared_arrays()
    x, y = torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"])
    return {"train": (x, y), "val": (torch.zeros(1, DIMENSION), torch.zeros(1))}


def quadratic_workload() -> Workload:
    """The registered workload ``nqm/quadratic`` (see the module docstring)."""
    return Workload(
        name=NAME,
        summary=(f"noisy quadratic, d = {DIMENSION}, h_i = 1/ceil(i/{MULTIPLICITY}), per-example gradient noise covariance C = H: "
                 "the exact NQM of Zhang et al. (2019) in expectation"),
        make_model=make_model,
        data=make_data,
        task=quadratic_task(),
        metric="val/excess_loss",
        goal=GOAL,
        default_steps=DEFAULT_STEPS,
        default_batch_size=DEFAULT_BATCH_SIZE,
        split_sizes={"train": TRAIN_EXAMPLES, "val": 1},
        input_shape=(DIMENSION,),
        eval_examples={"train": 2000, "val": None, "test": None},
        search_spaces=SEARCH_SPACES,
        data_notes=(f"generated (seed {DATA_SEED}): {TRAIN_EXAMPLES} examples x ~ N(0, H^-1), centred and whitened "
                    "exactly (mean 0, covariance H^-1); val = the single example x = 0, on which excess_loss is "
                    "1/2 sum h theta^2 exactly"),
    )


# ----------------------------------------------------------------------------------------------------
# The known answer


@lru_cache(maxsize=1)
def nqm_problem():
    """The exact NQM of the workload (a :class:`batchlab.nqm.problem.Problem`): curvatures and per-example
    noise ``h_k = c_k = 1/k`` for ``k = 1..LEVELS``, each with ``counts = MULTIPLICITY`` directions, ``s0 = 1``
    (``D = d``; initial expected excess loss ``MULTIPLICITY/2 sum_k 1/k``)."""
    from batchlab.nqm.problem import Problem

    levels = 1.0 / np.arange(1, LEVELS + 1, dtype=np.float64)
    return Problem(curvature=levels, noise=levels.copy(), counts=np.full(LEVELS, float(MULTIPLICITY)),
                   initial_second_moment=np.ones(LEVELS), name=f"{NAME} (1/k, k = 1..{LEVELS}, x{MULTIPLICITY})")


def _check_optimizer(optimizer: str) -> str:
    if optimizer not in SUPPORTED_OPTIMIZERS:
        raise BatchlabError(f"nqm/quadratic's exact NQM covers optimizer {optimizer!r} not; allowed: "
                            + ", ".join(SUPPORTED_OPTIMIZERS))
    return optimizer


def _per_direction_variance(lr: float, batch_size: float, steps: np.ndarray, h: np.ndarray,
                            num_train: int | None, momentum: float = 0.0) -> np.ndarray:
    """``E[theta_i(t)^2]`` of SGD (``momentum`` 0) at ``steps`` (shape ``(T, d)``).

    ``num_train=None``: the NQM (independent noise ``h / B`` per step). Otherwise the workload's sampler
    over N examples: within an epoch of ``N // B`` updates, batch noises have variance
    ``h (N - B) / (B (N - 1))`` and two distinct batches covariance ``-h / (N - 1)``; across epochs none.
    """
    if momentum:
        raise BatchlabError("the per-direction closed form is for SGD (momentum 0)")
    a = 1.0 - lr * h  # (d,)
    steps = np.asarray(steps, dtype=np.int64)
    out = np.empty((steps.size, h.size))
    for k, t in enumerate(steps):
        t = int(t)
        if t == 0:
            out[k] = 1.0
            continue
        s = np.arange(t)
        w = a[None, :] ** (t - 1 - s)[:, None]  # (t, d): weight of the noise at step s on theta_t
        if num_train is None:
            noise = (h / batch_size) * (w**2).sum(0)
        else:
            n, b = float(num_train), float(batch_size)
            per_epoch = max(int(num_train) // int(batch_size), 1)
            same = h * (n - b) / (b * (n - 1.0))
            cross = -h / (n - 1.0)
            epoch = s // per_epoch
            sums = np.zeros((int(epoch.max()) + 1, h.size))
            np.add.at(sums, epoch, w)
            squares = (w**2).sum(0)
            noise = same * squares + cross * ((sums**2).sum(0) - squares)
        out[k] = a ** (2 * t) + lr**2 * noise
    return out


def nqm_expected_excess_loss(learning_rate: float, batch_size: float, steps: Sequence[int]) -> np.ndarray:
    """The exact NQM's expected excess loss ``1/2 sum_i h_i E[theta_i(t)^2]`` of SGD at ``steps`` (updates), shape ``(T,)``."""
    from batchlab.nqm.dynamics import Algorithm, losses_at_steps, moment_recurrence

    rec = moment_recurrence(nqm_problem(), Algorithm("sgd"), np.array([float(learning_rate)]))
    return np.asarray(losses_at_steps(rec, float(batch_size), [int(s) for s in steps]), dtype=float).reshape(-1)


def finite_set_expected_excess_loss(learning_rate: float, batch_size: int, steps: Sequence[int],
                                    num_train: int = TRAIN_EXAMPLES) -> np.ndarray:
    """The workload's exact expected ``val/excess_loss`` under SGD at ``steps`` (shape ``(T,)``): the NQM
    with the finite training set's sampling (``num_train`` examples, epochs of ``num_train // batch_size``
    updates without replacement, as :mod:`batchlab.train.sampling`; see :func:`_per_direction_variance`).
    Exact in real arithmetic given the centred, whitened training set (whatever its draw)."""
    if isinstance(batch_size, bool) or int(batch_size) != batch_size or not 1 <= batch_size <= num_train:
        raise BatchlabError(f"batch_size must be an integer in [1, {num_train}], got {batch_size!r}")
    h = curvatures()
    v = _per_direction_variance(float(learning_rate), float(batch_size), np.asarray(steps), h, int(num_train))
    return 0.5 * v @ h


def excess_loss_sd(learning_rate: float, batch_size: float, steps: Sequence[int]) -> np.ndarray:
    """The NQM's standard deviation of the realised excess loss under SGD at ``steps`` (shape ``(T,)``).

    In the NQM every ``theta_i(t)`` is Gaussian with mean 0, independent across directions, so
    ``Var[1/2 sum h_i theta_i^2] = 1/2 sum_i h_i^2 E[theta_i^2]^2``: relative sd ``sqrt(2 / d_eff)`` with
    ``d_eff = (sum h_i v_i)^2 / sum (h_i v_i)^2``.
    """
    h = curvatures()
    v = _per_direction_variance(float(learning_rate), float(batch_size), np.asarray(steps), h, None)
    return np.sqrt(0.5 * ((h[None, :] * v) ** 2).sum(1))


def _best_of_rates(problem, algorithm, batch_size: float, rates, goal: float, max_steps: int):
    """``(steps, learning_rate, momentum)`` of the best of ``rates`` (momentum: x the tuner's momentum grid)."""
    from batchlab.nqm.dynamics import moment_recurrence
    from batchlab.nqm.steps import best_candidates, certify
    from batchlab.nqm.tuning import official_grid

    lrs = np.asarray(rates, dtype=float).ravel()
    if lrs.size == 0 or not np.all(np.isfinite(lrs)) or np.any(lrs <= 0):
        raise BatchlabError(f"learning_rates must be finite numbers > 0, got {lrs.tolist()}")
    if algorithm.name == "momentum":
        mom = official_grid(algorithm)["momentum"]
        grid_lr, grid_mu = (g.ravel() for g in np.meshgrid(lrs, mom, indexing="ij"))
    else:
        grid_lr, grid_mu = lrs, None
    rec = moment_recurrence(problem, algorithm, grid_lr, momentum=grid_mu)
    index, candidate = best_candidates(rec, [batch_size], goal, max_steps)
    k = int(index[0])
    mu = None if grid_mu is None else np.array([grid_mu[k]])
    single = moment_recurrence(problem, algorithm, np.array([grid_lr[k]]), momentum=mu)
    result = certify(single, float(batch_size), goal, int(candidate[0]), max_steps)
    return result.steps, float(grid_lr[k]), None if mu is None else float(mu[0])


def nqm_truth(batch_sizes, *, optimizer: str = "sgd", learning_rates=None, goal: float = GOAL) -> dict:
    """The known answer for ``nqm/quadratic``: the exact NQM's expected steps to the goal, tuned per batch size.

    Steps are the first passage of the exact expected excess loss below ``goal`` (the smallest number of
    updates ``t`` with ``E[L(t)] - L(0) < goal``; :mod:`batchlab.nqm.steps`), minimised over the learning
    rate (``optimizer="momentum"``: and the momentum) at each batch size: with ``learning_rates=None`` by
    :func:`batchlab.nqm.tuning.tune` (the notebook's grid refined twice around the optimum), else over the
    given learning rates only (momentum is then the tuner's grid): one sequence for every batch size,
    or a mapping ``batch size -> sequence`` (for example the rates a sweep's trials drew at each batch
    size: the exact expected answer of that search, which a 4-point search of a wide space misses by
    up to 1.5x at large batch sizes, where steps fall as ``1/lr`` up to the edge of stability). The critical batch size is that of the
    exact curve: ``S(B) = S_min + E_min / B`` fitted by :func:`batchlab.analysis.fit_steps_curve` to the
    tuned steps, ``b_crit = E_min / S_min`` (McCandlish et al.'s definition; ``mccandlish_b_crit``).

    Returns ``{"problem", "optimizer", "goal", "batch_sizes", "steps", "learning_rates", "momenta",
    "examples", "s_min", "e_min", "b_crit"}`` (lists in the order of ``batch_sizes``; ``steps`` None where
    the goal is not reached in 10^6 updates; the fit fields None when fewer than two batch sizes reach it).
    """
    from batchlab.nqm.dynamics import Algorithm
    from batchlab.nqm.tuning import tune

    optimizer = _check_optimizer(optimizer)
    sizes = [float(b) for b in np.atleast_1d(np.asarray(batch_sizes, dtype=float))]
    if not sizes or any(not (math.isfinite(b) and b >= 1) for b in sizes):
        raise BatchlabError(f"batch sizes must be numbers >= 1, got {list(np.atleast_1d(batch_sizes))}")
    problem = nqm_problem()
    algorithm = Algorithm(optimizer)
    max_steps = 10**6
    if learning_rates is None:
        points = tune(problem, algorithm, sizes, goal, grid="auto", max_steps=max_steps)
        rows = [(p.result.steps, p.learning_rate, p.momentum) for p in points]
    else:
        if isinstance(learning_rates, Mapping):
            given = {float(b): v for b, v in learning_rates.items()}
            missing = [b for b in sizes if b not in given]
            if missing:
                raise BatchlabError(f"learning_rates names no rates for batch size {missing[0]:g}; given for: "
                                    + ", ".join(f"{b:g}" for b in sorted(given)))
            per_size = [given[b] for b in sizes]
        else:
            per_size = [learning_rates] * len(sizes)
        rows = [_best_of_rates(problem, algorithm, b, rates, goal, max_steps) for b, rates in zip(sizes, per_size)]
    steps = [None if s is None else int(s) for s, _, _ in rows]
    out = {
        "problem": problem.name, "optimizer": optimizer, "goal": float(goal),
        "batch_sizes": [int(b) if b.is_integer() else b for b in sizes],
        "steps": steps, "learning_rates": [lr for _, lr, _ in rows], "momenta": [mu for _, _, mu in rows],
        "examples": [None if s is None else s * b for s, b in zip(steps, sizes)],
        "s_min": None, "e_min": None, "b_crit": None,
    }
    reached = [(b, s) for b, s in zip(sizes, steps) if s is not None]
    if len(reached) >= 2:
        from batchlab.analysis.critical_batch_size import fit_steps_curve
        from batchlab.analysis.curve import StepsCurve

        fit = fit_steps_curve(StepsCurve.from_points(reached, label=f"{NAME} exact NQM"))
        out.update(s_min=float(fit.s_min), e_min=float(fit.e_min), b_crit=float(fit.b_crit))
    return out
