"""Curvature at one point of training: the top eigenvalues of the Hessian or the Gauss-Newton matrix,
and the spectral density of either, from matrix-vector products alone.

Contract (docs/methods.md, "Probes"):

* **The loss.** ``L(theta) = sum_b n_b L_b(theta) / N`` over fixed ``batches`` ``(inputs, targets)``,
  where ``L_b = loss_fn(model(inputs_b), targets_b)`` is the batch's mean loss, ``n_b`` its number of
  examples (``inputs_b.shape[0]``) and ``N = sum_b n_b``: the mean loss over the ``N`` probe examples
  when ``loss_fn`` is a mean over examples (as every workload's loss is). The model is put in eval
  mode while it is probed (dropout off, so the matrix is the same at every product) and restored after.
* **The matrix** (``curvature``), of size ``P x P`` over the model's trainable parameters (in
  ``model.named_parameters()`` order):

  - ``"hessian"``: ``H = d^2 L / d theta^2``. Product ``H v`` by forward-over-reverse differentiation
    (``torch.func.jvp`` of ``torch.func.grad``), exact to rounding;
  - ``"ggn"``: the generalised Gauss-Newton matrix ``G = sum_b (n_b / N) J_b^T H_out,b J_b``, with
    ``J_b`` the Jacobian of the model's outputs in the parameters and ``H_out,b`` the Hessian of
    ``loss_fn`` in the outputs: positive semi-definite for a convex loss (cross entropy, squared
    error); equal to the Hessian when the model is linear in its parameters. Product ``G v`` by a
    Jacobian-vector product, a Hessian-vector product of the loss in the outputs and a
    vector-Jacobian product.

* **Cost.** One *matrix-vector product* (``matvecs``) is one product with the whole matrix: one pass
  over all ``N`` probe examples. A Hessian-vector product is a forward pass, a backward pass and their
  tangents (forward-over-reverse), a Gauss-Newton product a forward pass with tangents and a backward
  pass; measured on mnist/fc_64_64_64 with 512 examples on the CPU they cost 4.6 and 3.9 gradient
  evaluations on the same examples (docs/methods.md, "Probes"). Every
  result reports the number of products it used, counted as they are made.
* **Top eigenvalues** (:func:`top_eigenvalues`): the ``k`` algebraically largest eigenvalues by the
  implicitly restarted Lanczos method (``scipy.sparse.linalg.eigsh``, ``which="LA"``) on a
  ``LinearOperator`` of the products, starting from a seeded Gaussian vector (the same ``seed``, the
  same products, the same result); ``tol`` is ARPACK's relative accuracy of each eigenvalue.
* **Spectral density** (:func:`spectral_density`): stochastic Lanczos quadrature. For each of
  ``probes`` random unit vectors ``v`` (Rademacher entries, seeded), ``lanczos_steps`` steps of
  Lanczos give a tridiagonal ``T``; its eigenvalues are the quadrature *nodes* and the squared first
  components of its eigenvectors the *weights* (they sum to 1): ``sum_j w_j delta(lambda - node_j)``
  has, in expectation over ``v``, the moments ``v^T f(A) v`` of the spectral density
  ``(1/P) sum_i delta(lambda - lambda_i)`` up to degree ``2 * lanczos_steps - 1``. The density is the
  average over probes of these sums with each delta replaced by a Gaussian of width ``sigma``; it
  integrates to 1. Cost: ``probes * lanczos_steps`` products (fewer when Lanczos exhausts an
  invariant subspace early, which happens when the matrix has fewer distinct eigenvalues than steps).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from batchlab.errors import BatchlabError, checked_int, unknown_name_error

__all__ = [
    "CURVATURES", "CurvatureOperator", "SpectralDensity", "Spectrum", "lanczos_tridiagonal", "spectral_density",
    "top_eigenvalues",
]

#: The curvature matrices a probe can use (module docstring).
CURVATURES = ("hessian", "ggn")

LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Spectrum:
    """The top eigenvalues of a curvature matrix at one point.

    ``eigenvalues``: the converged ones among the ``k`` algebraically largest, in decreasing order (in
    units of the loss per parameter squared); ``curvature``: ``"hessian"`` or ``"ggn"``; ``matvecs``:
    matrix-vector products used (each one pass over ``examples`` probe examples; module docstring);
    ``parameters``: the matrix's size (trainable parameters); ``tol``: ARPACK's relative accuracy;
    ``converged``: whether all ``k`` converged within ARPACK's iteration limit; ``seconds``: wall time.
    """

    eigenvalues: tuple[float, ...]
    curvature: str
    matvecs: int
    examples: int
    parameters: int = 0
    k: int = 0
    tol: float = 0.0
    converged: bool = True
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every field, ``eigenvalues`` as a list."""
        return {"eigenvalues": [float(v) for v in self.eigenvalues], "curvature": self.curvature,
                "matvecs": int(self.matvecs), "examples": int(self.examples), "parameters": int(self.parameters),
                "k": int(self.k), "tol": float(self.tol), "converged": bool(self.converged),
                "seconds": round(float(self.seconds), 4)}


@dataclass(frozen=True)
class SpectralDensity:
    """A stochastic-Lanczos-quadrature estimate of a curvature matrix's spectral density.

    ``nodes[p]`` and ``weights[p]``: the quadrature of probe vector ``p`` (weights sum to 1);
    ``grid`` and ``density``: the smoothed density ``(1/probes) sum_p sum_j w_pj N(lambda; node_pj,
    sigma^2)`` on a regular grid covering every node by ``5 sigma``; ``matvecs``: matrix-vector
    products used (module docstring)."""

    nodes: tuple[tuple[float, ...], ...]
    weights: tuple[tuple[float, ...], ...]
    grid: np.ndarray = field(repr=False, compare=False)
    density: np.ndarray = field(repr=False, compare=False)
    sigma: float
    curvature: str
    matvecs: int
    examples: int
    parameters: int = 0
    lanczos_steps: int = 0
    probes: int = 0
    seconds: float = 0.0

    def mass(self, low: float, high: float) -> float:
        """The quadrature's mass in ``[low, high]`` (weights of the nodes inside, averaged over probes):
        an estimate of the fraction of eigenvalues in that interval."""
        total = sum(w for nodes, weights in zip(self.nodes, self.weights) for n, w in zip(nodes, weights)
                    if low <= n <= high)
        return float(total / len(self.nodes))

    def to_dict(self, grid: bool = False) -> dict[str, Any]:
        """JSON-ready: nodes, weights, sigma and the cost; ``grid=True`` adds ``grid`` and ``density``."""
        out = {"nodes": [list(map(float, n)) for n in self.nodes], "weights": [list(map(float, w)) for w in self.weights],
               "sigma": float(self.sigma), "curvature": self.curvature, "matvecs": int(self.matvecs),
               "examples": int(self.examples), "parameters": int(self.parameters),
               "lanczos_steps": int(self.lanczos_steps), "probes": int(self.probes),
               "seconds": round(float(self.seconds), 4)}
        if grid:
            out["grid"] = [float(v) for v in self.grid]
            out["density"] = [float(v) for v in self.density]
        return out


def _check_curvature(curvature: str) -> str:
    if curvature not in CURVATURES:
        raise unknown_name_error("curvature", str(curvature), CURVATURES)
    return curvature


_as_int = checked_int  # batchlab.errors.checked_int



def missing_forward_ad(exc: BaseException) -> bool:
    """Whether ``exc`` is torch saying a layer has no forward-mode derivative (torch 2.13: the CPU
    LSTM's mkldnn kernel), the error after which curvature products switch to reverse mode."""
    return "forward AD" in str(exc) or "forward-mode" in str(exc)

class CurvatureOperator:
    """The ``P x P`` curvature matrix of the mean loss over fixed batches, as products with vectors.

    ``op(v)`` multiplies a float64 numpy vector of length :attr:`size` (the trainable parameters
    flattened in ``model.named_parameters()`` order) and returns one; the product itself runs in the
    parameters' dtype and device. :attr:`matvecs` counts the products made. The model's parameters
    are read once, when the operator is made (later changes to the model are not seen).
    """

    def __init__(self, model: torch.nn.Module, loss_fn: LossFunction, batches: Iterable, curvature: str = "hessian"):
        from torch.func import functional_call

        self.curvature = _check_curvature(curvature)
        self.batches = [(x, y) for x, y in batches]
        if not self.batches:
            raise BatchlabError("a curvature probe needs at least one batch of examples")
        self.counts = [int(x.shape[0]) for x, _ in self.batches]
        self.examples = sum(self.counts)
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise BatchlabError("the model has no trainable parameters")
        self.names = [name for name, _ in named]
        self.params = {name: p.detach() for name, p in named}
        self.shapes = [p.shape for _, p in named]
        self.numels = [p.numel() for _, p in named]
        self.size = sum(self.numels)
        first = named[0][1]
        self.dtype, self.device = first.dtype, first.device
        self.buffers = {name: b.detach() for name, b in model.named_buffers()}
        self.model, self.loss_fn = model, loss_fn
        self.matvecs = 0

        def outputs(params: dict, x: torch.Tensor) -> torch.Tensor:
            return functional_call(model, (params, self.buffers), (x,))

        self._outputs = outputs

    def to_params(self, vector: np.ndarray) -> dict[str, torch.Tensor]:
        """A flat vector as a ``{name: tensor}`` dict shaped like the parameters."""
        flat = torch.as_tensor(np.asarray(vector).reshape(-1), dtype=self.dtype, device=self.device)
        return {name: part.view(shape) for name, part, shape in zip(self.names, flat.split(self.numels), self.shapes)}

    def to_vector(self, tensors: dict[str, torch.Tensor]) -> np.ndarray:
        """A ``{name: tensor}`` dict as a flat float64 numpy vector."""
        flat = torch.cat([tensors[name].reshape(-1) for name in self.names])
        return flat.detach().to("cpu", torch.float64).numpy()

    #: Forward-over-reverse products (the faster ones) until a model's layer has no forward-mode AD
    #: (torch 2.13: the CPU LSTM's mkldnn kernel); then reverse-over-reverse, the same matrix.
    forward_mode = True

    def _batch_product(self, x: torch.Tensor, y: torch.Tensor, v: dict) -> dict:
        if self.forward_mode:
            try:
                return self._forward_product(x, y, v)
            except (NotImplementedError, RuntimeError) as exc:
                if not missing_forward_ad(exc):
                    raise
                self.forward_mode = False
        return self._reverse_product(x, y, v)

    def _reverse_product(self, x: torch.Tensor, y: torch.Tensor, v: dict) -> dict:
        """The same product by reverse mode only: H v as the pullback of the gradient (H is symmetric);
        J v for Gauss-Newton as the pullback of the pullback (the transpose of J^T u in u)."""
        from torch.func import grad, vjp

        loss_fn, outputs = self.loss_fn, self._outputs
        if self.curvature == "hessian":
            _, pullback = vjp(grad(lambda p: loss_fn(outputs(p, x), y)), self.params)
            return pullback(v)[0]
        out, pull_params = vjp(lambda p: outputs(p, x), self.params)
        out = out.detach()
        _, pull_outputs = vjp(lambda u: pull_params(u)[0], torch.zeros_like(out))
        jv = pull_outputs(v)[0]
        _, pull_loss = vjp(grad(lambda o: loss_fn(o, y)), out)
        return pull_params(pull_loss(jv)[0])[0]

    def _forward_product(self, x: torch.Tensor, y: torch.Tensor, v: dict) -> dict:
        from torch.func import grad, jvp, vjp

        loss_fn, outputs = self.loss_fn, self._outputs
        if self.curvature == "hessian":
            gradient = grad(lambda p: loss_fn(outputs(p, x), y))
            return jvp(gradient, (self.params,), (v,))[1]
        # Gauss-Newton: J^T H_out J v
        out, jv = jvp(lambda p: outputs(p, x), (self.params,), (v,))
        out = out.detach()
        h_jv = jvp(grad(lambda o: loss_fn(o, y)), (out,), (jv,))[1]
        _, pullback = vjp(lambda p: outputs(p, x), self.params)
        return pullback(h_jv)[0]

    def __call__(self, vector: np.ndarray) -> np.ndarray:
        v = self.to_params(vector)
        total: dict[str, torch.Tensor] | None = None
        was_training = self.model.training
        self.model.eval()
        try:
            for (x, y), n in zip(self.batches, self.counts):
                product = self._batch_product(x, y, v)
                scale = n / self.examples
                if total is None:
                    total = {name: product[name].detach() * scale for name in self.names}
                else:
                    for name in self.names:
                        total[name] = total[name] + product[name].detach() * scale
        finally:
            self.model.train(was_training)
        self.matvecs += 1
        return self.to_vector(total)

    def linear_operator(self):
        """This operator as a ``scipy.sparse.linalg.LinearOperator`` (float64, symmetric)."""
        from scipy.sparse.linalg import LinearOperator

        return LinearOperator((self.size, self.size), matvec=lambda v: self(np.ravel(v)), rmatvec=lambda v: self(np.ravel(v)),
                              dtype=np.float64)


def top_eigenvalues(model: torch.nn.Module, loss_fn: LossFunction, batches: Iterable, k: int = 10,
                    curvature: str = "hessian", tol: float = 1e-3, seed: int = 0, maxiter: int | None = None) -> Spectrum:
    """The ``k`` algebraically largest eigenvalues of the Hessian (or Gauss-Newton matrix) of the mean
    loss over ``batches`` at the model's current parameters, by ``scipy.sparse.linalg.eigsh`` on
    products with the matrix (module docstring).

    ``loss_fn(outputs, targets)``: the batch's mean loss; ``batches``: ``(inputs, targets)`` pairs
    (read once, kept for the products); ``tol``: ARPACK's relative accuracy (0: machine precision);
    ``seed``: the starting vector; ``maxiter``: ARPACK's restart limit (``None``: its default). When
    ARPACK stops before all ``k`` converge, the converged ones are returned with ``converged=False``.

    Raises:
        BatchlabError: unknown ``curvature``, ``k`` outside ``1..P-1`` (``P`` trainable parameters),
            ``tol < 0``, no batches.
    """
    from scipy.sparse.linalg import ArpackNoConvergence, eigsh

    started = time.perf_counter()
    _check_curvature(curvature)
    k = _as_int("k", k, 1)
    if not (isinstance(tol, (int, float)) and not isinstance(tol, bool) and math.isfinite(tol) and tol >= 0):
        raise BatchlabError(f"tol must be a number >= 0, got {tol!r}")
    op = CurvatureOperator(model, loss_fn, batches, curvature)
    if k >= op.size:
        raise BatchlabError(f"k must be in 1..{op.size - 1} (fewer than the model's {op.size} parameters), got {k}")
    v0 = np.random.default_rng(seed).standard_normal(op.size)
    converged = True
    try:
        values = eigsh(op.linear_operator(), k=k, which="LA", tol=float(tol), v0=v0, maxiter=maxiter,
                       return_eigenvectors=False)
    except ArpackNoConvergence as exc:
        values, converged = np.asarray(exc.eigenvalues), False
    values = sorted((float(v) for v in np.real(values)), reverse=True)
    return Spectrum(eigenvalues=tuple(values), curvature=curvature, matvecs=op.matvecs, examples=op.examples,
                    parameters=op.size, k=k, tol=float(tol), converged=converged,
                    seconds=time.perf_counter() - started)


def lanczos_tridiagonal(matvec: Callable[[np.ndarray], np.ndarray], start: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """``steps`` steps of Lanczos with full reorthogonalisation from ``start``: the diagonal ``alpha``
    (length ``m``) and off-diagonal ``beta`` (length ``m - 1``) of the tridiagonal matrix ``T``, with
    ``m <= steps`` (fewer when an invariant subspace is exhausted: the next residual is below
    ``1e-10`` times the largest entry of ``T`` so far). ``matvec`` is called ``m`` times.

    Written here rather than taken from scipy, which exposes Lanczos only inside ``eigsh`` (no
    tridiagonal matrix, hence no quadrature weights); full reorthogonalisation keeps the nodes free of
    the spurious copies plain Lanczos produces in floating point, at ``O(m^2 P)`` extra arithmetic.
    """
    q = np.asarray(start, dtype=np.float64).reshape(-1)
    q = q / np.linalg.norm(q)
    basis = [q]
    alpha: list[float] = []
    beta: list[float] = []
    scale = 0.0
    for j in range(steps):
        w = matvec(basis[-1])
        a = float(basis[-1] @ w)
        alpha.append(a)
        w = w - a * basis[-1] - (beta[-1] * basis[-2] if beta else 0.0)
        for _ in range(2):  # two passes of classical Gram-Schmidt: orthogonal to rounding
            Q = np.stack(basis, axis=1)
            w = w - Q @ (Q.T @ w)
        b = float(np.linalg.norm(w))
        scale = max(scale, abs(a), b)
        if j == steps - 1 or b <= 1e-10 * scale:
            break
        beta.append(b)
        basis.append(w / b)
    return np.asarray(alpha), np.asarray(beta)


def spectral_density(model: torch.nn.Module, loss_fn: LossFunction, batches: Iterable, *, curvature: str = "hessian",
                     lanczos_steps: int = 30, probes: int = 4, num_points: int = 512, sigma: float | None = None,
                     seed: int = 0) -> SpectralDensity:
    """The spectral density of the Hessian (or Gauss-Newton matrix) of the mean loss over ``batches``
    by stochastic Lanczos quadrature (module docstring): ``probes`` Rademacher start vectors (seeded),
    ``lanczos_steps`` Lanczos steps each, Gaussians of width ``sigma`` (``None``: 1% of the span of
    all nodes; a hundredth of the largest node's magnitude, or 1e-3, when they coincide) on
    ``num_points`` grid points. Cost: at most ``probes * lanczos_steps`` matrix-vector products.

    Raises:
        BatchlabError: unknown ``curvature``, ``lanczos_steps``/``probes`` < 1, ``num_points`` < 2,
            ``sigma`` <= 0, no batches.
    """
    started = time.perf_counter()
    _check_curvature(curvature)
    steps = _as_int("lanczos_steps", lanczos_steps, 1)
    probes = _as_int("probes", probes, 1)
    num_points = _as_int("num_points", num_points, 2)
    if sigma is not None and not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0):
        raise BatchlabError(f"sigma must be a number > 0, got {sigma!r}")
    from scipy.linalg import eigh_tridiagonal

    op = CurvatureOperator(model, loss_fn, batches, curvature)
    rng = np.random.default_rng(seed)
    all_nodes, all_weights = [], []
    for _ in range(probes):
        start = rng.choice(np.array([-1.0, 1.0]), size=op.size)
        alpha, beta = lanczos_tridiagonal(op, start, min(steps, op.size))
        nodes, vectors = eigh_tridiagonal(alpha, beta) if len(alpha) > 1 else (alpha, np.ones((1, 1)))
        weights = vectors[0, :] ** 2
        all_nodes.append(tuple(float(v) for v in nodes))
        all_weights.append(tuple(float(w / weights.sum()) for w in weights))
    flat = np.concatenate([np.asarray(n) for n in all_nodes])
    lo, hi = float(flat.min()), float(flat.max())
    if sigma is None:
        sigma = 0.01 * (hi - lo) if hi > lo else max(0.01 * abs(hi), 1e-3)
    grid = np.linspace(lo - 5 * sigma, hi + 5 * sigma, num_points)
    density = np.zeros_like(grid)
    for nodes, weights in zip(all_nodes, all_weights):
        for n, w in zip(nodes, weights):
            density += w * np.exp(-0.5 * ((grid - n) / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))
    density /= probes
    return SpectralDensity(nodes=tuple(all_nodes), weights=tuple(all_weights), grid=grid, density=density,
                           sigma=float(sigma), curvature=curvature, matvecs=op.matvecs, examples=op.examples,
                           parameters=op.size, lanczos_steps=steps, probes=probes,
                           seconds=time.perf_counter() - started)
