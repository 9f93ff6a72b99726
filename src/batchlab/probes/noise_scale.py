"""The gradient noise scale of a model at its current parameters: B_simple and B_noise.

Definitions (McCandlish et al. 2018; docs/methods.md, "Probes"). At parameters theta, with l_i the
loss of example i and L = E_i l_i the expected loss: G = grad L (the true gradient), Sigma =
Cov_i[grad l_i] (the covariance of one example's gradient), H = the Hessian of L. Then

* ``B_simple = tr(Sigma) / |G|^2`` and
* ``B_noise = tr(H Sigma) / (G^T H G)``,

both in **examples** (a batch of B examples has gradient covariance Sigma / B).

Estimators. A mean gradient G_b over b examples drawn at the same theta has ``E|G_b|^2 = |G|^2 +
tr(Sigma)/b`` and, for any fixed matrix M, ``E[G_b^T M G_b] = G^T M G + tr(M Sigma)/b``. Two batch
sizes b < B at the same theta therefore give unbiased estimates (:func:`moments_from_norms`)::

    |G|^2     = (B |G_B|^2 - b |G_b|^2) / (B - b)
    tr(Sigma) = (|G_b|^2 - |G_B|^2) / (1/b - 1/B)

Each is unbiased; their ratio is not, so numerators and denominators are averaged separately over
all pairs and divided once at the end. Each batch of ``batches`` is one pair:

* ``method="per_example"``: the small gradients are the batch's per-example gradients (b = 1, by
  ``torch.func.vmap(grad)``), the big one is the batch mean (B = the batch size); |G_b|^2 is the mean
  of the per-example squared norms. Lowest variance.
* ``method="two_batch"``: the batch (shuffled with ``seed``) is cut into ``micro_batches`` equal
  micro-batches of b = B // micro_batches examples (a remainder is left out); the small gradients are
  the micro-batch mean gradients, the big one is their mean. This is what a training loop with
  gradient accumulation or data parallelism has for free (:class:`batchlab.probes.tracker.NoiseScaleTracker`).

B_noise uses the quadratic form of the Hessian in place of the squared norm, with Hessian-vector
products (``torch.func.jvp`` of ``torch.func.grad``, forward over reverse). The Hessian applied to a
batch's gradients is the Hessian of the mean loss of *another* batch (batches are paired 0-1, 2-3, ...
and each uses its partner's), so that the matrix is independent of the vectors; the same batch's
Hessian would correlate them and bias G^T H G upwards (for linear regression with white inputs by
about 2 (parameters + 2) / B relative). A batch left without a partner (an odd count)
does not enter B_noise. Cost: one HVP per small gradient and one per batch.

Preconditioned variant. Given a diagonal preconditioner P (an update ``theta -= lr * P * g``), the
noise scale in P's metric is the plain one after the change of variables theta = P^(1/2) phi:
``B_simple = tr(P Sigma) / (G^T P G)``, ``B_noise = tr(H P Sigma P) / (G^T P H P G)``. For Adam,
P = 1 / (sqrt(v_hat) + eps) from the optimizer's second-moment state (:func:`adam_preconditioner`).

Per layer. The squared norms split by parameter tensor, so tr(Sigma) and |G|^2 (plain or
preconditioned) are sums over layers of the same estimators restricted to each layer's parameters;
``per_layer`` groups parameters by the module that owns them (``"0.weight"`` and ``"0.bias"`` -> ``"0"``).

Intervals. Fieller's interval for a ratio of means, with the batches (B_noise: the batch pairs) as
independent replicates: the set of R with ``(mean_num - R mean_den)^2 <= t^2 var(mean_num - R mean_den)``,
t the Student quantile with (replicates - 1) degrees of freedom at the two-sided ``level``. It is
exact for normal replicate means and stays honest when |G|^2 cannot be told from 0: then the upper
end is ``None`` (unbounded). Values are restricted to >= 0.

Models run in their current mode (train/eval). Per-example gradients treat each example alone, so
``per_example`` refuses a model with batch-norm in training mode (use ``two_batch``, or ``eval()``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from batchlab.errors import BatchlabError

METHODS = ("per_example", "two_batch")
INTERVAL_METHOD = "fieller"


@dataclass(frozen=True)
class Interval:
    """A confidence interval: ``low``/``high`` (``None`` = unbounded on that side), its two-sided
    ``level`` and the ``method`` that made it (see the module docstring)."""

    low: float | None
    high: float | None
    level: float
    method: str


@dataclass(frozen=True)
class NoiseScale:
    """One noise-scale measurement at one set of parameters (module docstring for the estimators).

    ``b_simple`` and ``b_noise`` are in examples (``inf`` where the |G|^2 or G^T H G estimate is <= 0).
    ``trace_sigma`` and ``grad_norm_sq`` are tr(Sigma) and |G|^2 of the per-example loss (in the
    preconditioner's metric when ``preconditioner`` is set); ``trace_h_sigma`` and ``grad_h_grad`` the
    B_noise numerator and denominator. ``per_layer``: module name -> ``{"b_simple", "trace_sigma",
    "grad_norm_sq"}``; traces and squared norms add up to the totals. ``examples``: examples whose
    gradients entered; ``batches``: pairs averaged; ``small_batch_size``/``batch_size``: b and B of
    the pairs; ``gradients``/``hvps``: per-example or micro-batch gradients and Hessian-vector
    products computed (the cost).
    """

    b_simple: float
    b_simple_interval: Interval
    trace_sigma: float
    grad_norm_sq: float
    b_noise: float | None
    b_noise_interval: Interval | None
    per_layer: dict[str, dict]
    method: str
    examples: int
    preconditioner: str | None
    batches: int = 0
    small_batch_size: int = 1
    batch_size: int | None = None
    trace_h_sigma: float | None = None
    grad_h_grad: float | None = None
    gradients: int = 0
    hvps: int = 0

    def to_dict(self) -> dict:
        """JSON-ready: the fields as a dict, non-finite numbers as ``None``."""
        return _finite(asdict(self))


def _finite(value):
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# ---------------------------------------------------------------------------------------------------
# Pure arithmetic, shared with the tracker and the tests


def moments_from_norms(small_sq, big_sq, small_batch_size, big_batch_size):
    """Unbiased ``(|G|^2, tr Sigma)`` from mean squared norms of gradients at two batch sizes.

    ``small_sq``: the mean of |G_b|^2 over gradients of ``small_batch_size`` = b examples each;
    ``big_sq``: |G_B|^2 of a gradient of ``big_batch_size`` = B > b examples, all at the same
    parameters. Works elementwise on floats or numpy arrays (e.g. one entry per layer). With a
    quadratic form u -> u^T M u in place of the squared norm it returns ``(G^T M G, tr(M Sigma))``.
    """
    b, big_b = float(small_batch_size), float(big_batch_size)
    if not 0 < b < big_b:
        raise BatchlabError(
            f"the two batch sizes must satisfy 0 < small < big, got small={small_batch_size}, big={big_batch_size}"
        )
    small_sq, big_sq = np.asarray(small_sq, dtype=float), np.asarray(big_sq, dtype=float)
    grad_norm_sq = (big_b * big_sq - b * small_sq) / (big_b - b)
    trace_sigma = (small_sq - big_sq) / (1.0 / b - 1.0 / big_b)
    if grad_norm_sq.ndim == 0:
        return float(grad_norm_sq), float(trace_sigma)
    return grad_norm_sq, trace_sigma


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator`` for a noise scale: ``inf`` where the denominator estimate is <= 0."""
    return numerator / denominator if denominator > 0 else math.inf


def fieller_weighted(mean_num: float, mean_den: float, var_num: float, var_den: float, cov: float, dof: float,
                     level: float, method: str) -> Interval:
    """Fieller's interval for ``mean_num / mean_den`` from the two means' (co)variances and Student dof.

    The set ``{R >= 0 : (mean_num - R mean_den)^2 <= t^2 Var(mean_num - R mean_den)}`` with
    ``Var(mean_num - R mean_den) = var_num - 2 R cov + R^2 var_den`` and t Student's quantile at the
    two-sided ``level`` with ``dof`` degrees of freedom: ``high=None`` when unbounded above, both
    ``None`` when no non-negative ratio fits or ``dof <= 0``. The one quadratic solve behind
    :func:`ratio_interval` (plain means) and
    :meth:`batchlab.probes.tracker.NoiseScaleTracker.b_simple_interval` (weighted means).
    """
    from scipy import special

    if not dof > 0:
        return Interval(None, None, level, method)
    # scipy.stats.t.ppf(q, dof) is special.stdtrit(dof, q) behind ~60 us of argument handling
    t2 = float(special.stdtrit(dof, 0.5 + level / 2)) ** 2
    # {R : a R^2 + b R + c <= 0}
    a = mean_den * mean_den - t2 * var_den
    b = -2.0 * (mean_num * mean_den - t2 * cov)
    c = mean_num * mean_num - t2 * var_num
    disc = max(b * b - 4 * a * c, 0.0)
    if a > 0:
        r1, r2 = (-b - math.sqrt(disc)) / (2 * a), (-b + math.sqrt(disc)) / (2 * a)
        if r2 < 0:  # only negative ratios fit: nothing to say about a non-negative noise scale
            return Interval(None, None, level, method)
        return Interval(float(max(r1, 0.0)), float(r2), level, method)
    if a == 0 or disc == 0:
        return Interval(0.0, None, level, method)
    r1, r2 = sorted(((-b - math.sqrt(disc)) / (2 * a), (-b + math.sqrt(disc)) / (2 * a)))
    # a < 0: the set is (-inf, r1] U [r2, inf); its part >= 0, as one interval
    return Interval(0.0 if r1 >= 0 else float(max(r2, 0.0)), None, level, method)


def ratio_interval(numerators, denominators, level: float = 0.9) -> Interval:
    """Fieller's interval for ``mean(numerators) / mean(denominators)``, replicates independent.

    Restricted to values >= 0; ``high=None`` when the denominator's mean is not significantly above 0
    at this level (the ratio is unbounded above), both ``None`` with fewer than two replicates.
    (:func:`fieller_weighted` with the plain means' sample covariance / n and n - 1 dof.)
    """
    if not 0 < level < 1:
        raise BatchlabError(f"level must be in (0, 1), got {level}")
    x, y = np.asarray(numerators, dtype=float), np.asarray(denominators, dtype=float)
    n = len(x)
    method = f"{INTERVAL_METHOD} ({n} replicates)"
    if n < 2:
        return Interval(None, None, level, method)
    cov = np.cov(x, y, ddof=1) / n
    return fieller_weighted(float(x.mean()), float(y.mean()), float(cov[0, 0]), float(cov[1, 1]), float(cov[0, 1]),
                            n - 1, level, method)


def layer_name(parameter_name: str) -> str:
    """The per-layer group of a parameter: its owning module's name (``"0.weight"`` -> ``"0"``); a
    parameter of the root module itself is its own group (``"weight"``)."""
    return parameter_name.rsplit(".", 1)[0] if "." in parameter_name else parameter_name


def per_layer_table(names, trace_sigma, grad_norm_sq) -> dict[str, dict]:
    """Group per-parameter tr(Sigma) and |G|^2 estimates by layer (:func:`layer_name`), in order."""
    out: dict[str, dict] = {}
    for name, s, g in zip(names, trace_sigma, grad_norm_sq):
        entry = out.setdefault(layer_name(name), {"trace_sigma": 0.0, "grad_norm_sq": 0.0})
        entry["trace_sigma"] += float(s)
        entry["grad_norm_sq"] += float(g)
    for entry in out.values():
        entry["b_simple"] = ratio(entry["trace_sigma"], entry["grad_norm_sq"])
    return out


# ---------------------------------------------------------------------------------------------------
# Preconditioners


def adam_preconditioner(optimizer, model: nn.Module) -> dict[str, torch.Tensor]:
    """Adam's diagonal P = 1 / (sqrt(v / (1 - beta2^t)) + eps), by parameter name of ``model``.

    ``optimizer``: an Adam-like ``torch.optim.Optimizer`` (state ``exp_avg_sq`` and ``step``, group
    ``betas`` and ``eps``: Adam, AdamW, NAdam, ...) over ``model``'s parameters, or its
    ``state_dict()``, whose parameter indices are taken in the order of ``model``'s trainable
    parameters (how batchlab builds optimizers). P is what multiplies the gradient in Adam's update
    (bias-corrected like ``torch.optim.Adam``; the momentum is left out).
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if isinstance(optimizer, torch.optim.Optimizer):
        by_id = {id(p): n for n, p in named}
        entries = [(by_id.get(id(p)), optimizer.state.get(p, {}), g) for g in optimizer.param_groups for p in g["params"]]
        label = type(optimizer).__name__
    elif isinstance(optimizer, Mapping) and "state" in optimizer and "param_groups" in optimizer:
        names = [n for n, _ in named]
        entries = [(names[i] if i < len(names) else None, optimizer["state"].get(i, {}), g)
                   for g in optimizer["param_groups"] for i in g["params"]]
        label = "the optimizer state"
    else:
        raise BatchlabError("preconditioner must be an Adam-like torch optimizer, its state_dict(), or a mapping "
                            "of parameter name to a diagonal tensor")
    out = {}
    for name, state, group in entries:
        if name is None:
            continue
        if "exp_avg_sq" not in state:
            raise BatchlabError(
                f"{label} has no second-moment estimate (exp_avg_sq) for parameter {name!r}; allowed: an Adam-like "
                "optimizer (adam, adamw) after at least one step"
            )
        step = float(state["step"])
        beta2 = group["betas"][1]
        v_hat = state["exp_avg_sq"].detach() / (1.0 - beta2**step)
        out[name] = 1.0 / (v_hat.sqrt() + group["eps"])
    missing = [n for n, _ in named if n not in out]
    if missing:
        raise BatchlabError(f"{label} does not cover parameters {missing[:3]}; build it over the model's parameters")
    return out


def _resolve_preconditioner(preconditioner, model, named) -> tuple[list[torch.Tensor] | None, str | None]:
    if preconditioner is None:
        return None, None
    if isinstance(preconditioner, torch.optim.Optimizer) or (
        isinstance(preconditioner, Mapping) and "state" in preconditioner and "param_groups" in preconditioner
    ):
        diag, label = adam_preconditioner(preconditioner, model), "adam"
    elif isinstance(preconditioner, Mapping):
        diag, label = dict(preconditioner), "diagonal"
    else:
        raise BatchlabError("preconditioner must be None, an Adam-like torch optimizer, its state_dict(), or a mapping "
                            "of parameter name to a diagonal tensor")
    out = []
    for name, p in named:
        if name not in diag:
            raise BatchlabError(f"preconditioner has no entry for parameter {name!r}; known: {', '.join(diag)}")
        d = torch.as_tensor(diag[name]).detach().to(device=p.device, dtype=p.dtype)
        if d.shape != p.shape:
            raise BatchlabError(f"preconditioner for {name!r} has shape {tuple(d.shape)}, the parameter {tuple(p.shape)}")
        if bool((d <= 0).any()):
            raise BatchlabError(f"preconditioner for {name!r} must be positive")
        out.append(d)
    return out, label


# ---------------------------------------------------------------------------------------------------
# The measurement


def _has_training_batch_norm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training for m in model.modules())


class _Functional:
    """The model's loss as a pure function of its trainable parameters (torch.func)."""

    def __init__(self, model: nn.Module, loss_fn: Callable):
        from torch.func import functional_call, grad, jvp, vjp, vmap

        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not self.named:
            raise BatchlabError("the model has no trainable parameters")
        self.names = [n for n, _ in self.named]
        self.params = tuple(p.detach() for _, p in self.named)
        frozen = {n: p.detach() for n, p in model.named_parameters() if not p.requires_grad}
        buffers = {n: b.detach() for n, b in model.named_buffers()}
        names = self.names
        self.training_batch_norm = _has_training_batch_norm(model)

        def loss(params, x, y):
            # fresh copies of the buffers on each call: a batch-norm layer in training mode updates its
            # running statistics in place, which a grad transform refuses on captured tensors, and the
            # probe must leave the model as it found it
            state = {n: b.clone() for n, b in buffers.items()} if self.training_batch_norm else buffers
            out = functional_call(model, ({**frozen, **dict(zip(names, params))}, state), (x,))
            return loss_fn(out, y)

        def one_example(params, x, y):
            return loss(params, x.unsqueeze(0), y.unsqueeze(0))

        self.grad = grad(loss)
        self.per_example_grads = vmap(grad(one_example), in_dims=(None, 0, 0), randomness="different")
        self.micro_batch_grads = vmap(grad(loss), in_dims=(None, 0, 0), randomness="different")

        def forward_hvps(vectors, x, y, chunk_size):
            """H(x, y) v for each stacked v (tuple of (m, *shape)) by jvp of grad (forward over reverse)."""
            params = self.params

            def one(v):
                return jvp(lambda p: grad(loss)(p, x, y), (params,), (v,))[1]

            if self.training_batch_norm:  # batch statistics do not vmap: one vector at a time
                parts = [one(tuple(v[i] for v in vectors)) for i in range(len(vectors[0]))]
                return tuple(torch.stack(t) for t in zip(*parts))
            return vmap(one, randomness="different", chunk_size=chunk_size)(vectors)

        def reverse_hvps(vectors, x, y, chunk_size):
            """The same products by reverse mode only: H v as the pullback of the gradient (H is symmetric)."""
            _, pullback = vjp(lambda p: grad(loss)(p, x, y), self.params)
            if self.training_batch_norm:
                parts = [pullback(tuple(v[i] for v in vectors))[0] for i in range(len(vectors[0]))]
                return tuple(torch.stack(t) for t in zip(*parts))
            return vmap(lambda v: pullback(v)[0], randomness="different", chunk_size=chunk_size)(vectors)

        def hvps(vectors, x, y, chunk_size):
            """Forward over reverse (the faster) until a layer has no forward-mode AD (torch 2.13: the CPU
            LSTM's mkldnn kernel); then reverse over reverse, the same matrix (as
            :class:`batchlab.probes.spectrum.CurvatureOperator`)."""
            if self.forward_mode:
                try:
                    return forward_hvps(vectors, x, y, chunk_size)
                except (NotImplementedError, RuntimeError) as exc:
                    from batchlab.probes.spectrum import missing_forward_ad

                    if not missing_forward_ad(exc):
                        raise
                    self.forward_mode = False
            return reverse_hvps(vectors, x, y, chunk_size)

        self.forward_mode = True
        self.hvps = hvps
        self.size = sum(p.numel() for p in self.params)


def _sq_norms(vectors, precond) -> np.ndarray:
    """(m, layers) squared norms of m stacked gradients, per parameter tensor, in P's metric."""
    cols = []
    for i, v in enumerate(vectors):
        v2 = v.flatten(1).square()
        if precond is not None:
            v2 = v2 * precond[i].flatten()
        cols.append(v2.sum(1))
    return torch.stack(cols, 1).double().cpu().numpy()


def _quadratic(fn: _Functional, vectors, precond, hessian_batch) -> np.ndarray:
    """(m,) values u^T H u with u = P v for m stacked vectors v (H of the mean loss on ``hessian_batch``)."""
    # HVPs per vmap call: each holds the activations of a forward over the Hessian batch; ~2**20
    # input entries per call keeps that to a few hundred MB for the workloads' models
    chunk_size = max(1, min(len(vectors[0]), 2**20 // max(hessian_batch[0].numel(), 1)))
    if precond is not None:
        vectors = tuple(v * d for v, d in zip(vectors, precond))
    hv = fn.hvps(vectors, hessian_batch[0], hessian_batch[1], chunk_size)
    total = sum((a.flatten(1) * b.flatten(1)).sum(1) for a, b in zip(vectors, hv))
    return total.double().cpu().numpy()


def _batch_pair(fn, x, y, method, micro_batches, generator, precond, hessian_batch, chunk):
    """One batch's pair: small and big squared norms per layer, and the quadratic forms if asked."""
    n = len(x)
    if method == "per_example":
        b, big_b = 1, n
        small_sum = 0.0
        total = None
        q_small = []
        for start in range(0, n, chunk):
            g = fn.per_example_grads(fn.params, x[start : start + chunk], y[start : start + chunk])
            small_sum = small_sum + _sq_norms(g, precond).sum(0)
            s = tuple(v.sum(0) for v in g)
            total = s if total is None else tuple(a + c for a, c in zip(total, s))
            if hessian_batch is not None:
                q_small.append(_quadratic(fn, g, precond, hessian_batch))
            del g
        small_sq = small_sum / n
        mean = tuple(v / n for v in total)
        units = n
    else:
        k = micro_batches
        b = n // k
        if b < 1:
            raise BatchlabError(f"a batch of {n} examples cannot be cut into micro_batches={k}; use batches of at least {k}")
        big_b = k * b
        perm = torch.randperm(n, generator=generator)[:big_b].to(x.device)
        xs, ys = x.index_select(0, perm), y.index_select(0, perm)
        xs, ys = xs.reshape(k, b, *x.shape[1:]), ys.reshape(k, b, *y.shape[1:])
        if fn.training_batch_norm:
            # batch-norm in training mode does not vmap (batch statistics): one micro-batch at a time
            parts = [fn.grad(fn.params, xs[i], ys[i]) for i in range(k)]
            g = tuple(torch.stack(t) for t in zip(*parts))
        else:
            g = fn.micro_batch_grads(fn.params, xs, ys)
        small_sq = _sq_norms(g, precond).mean(0)
        mean = tuple(v.mean(0) for v in g)
        q_small = [_quadratic(fn, g, precond, hessian_batch)] if hessian_batch is not None else []
        units = k
    big_sq = _sq_norms(tuple(v.unsqueeze(0) for v in mean), precond)[0]
    out = {"small_sq": small_sq, "big_sq": big_sq, "b": b, "B": big_b, "units": units}
    if hessian_batch is not None:
        out["q_small"] = float(np.concatenate(q_small).mean())
        out["q_big"] = float(_quadratic(fn, tuple(v.unsqueeze(0) for v in mean), precond, hessian_batch)[0])
    return out


def noise_scale(
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    method: str = "per_example",
    hessian: bool = False,
    preconditioner=None,
    level: float = 0.9,
    seed: int = 0,
    micro_batches: int = 16,
    preconditioner_label: str | None = None,
) -> NoiseScale:
    """Measure B_simple (and with ``hessian=True`` B_noise) of ``model`` at its current parameters.

    ``loss_fn(outputs, targets)`` returns the mean loss of a batch (a per-example loss is the mean
    over one example); ``batches`` yields ``(inputs, targets)`` with the examples along dim 0, all
    drawn independently at these parameters (equal sizes are best: each batch is one replicate).
    ``method``: ``"per_example"`` or ``"two_batch"`` (``micro_batches`` micro-batches per batch);
    ``preconditioner``: None, an Adam-like optimizer or its ``state_dict()`` (Adam's metric,
    :func:`adam_preconditioner`), or a mapping of parameter name to a positive diagonal tensor of the
    parameter's shape. ``level``: the intervals' two-sided level; ``seed``: the shuffle that cuts
    batches into micro-batches (``two_batch``; ``per_example`` is deterministic). ``hessian`` needs
    at least two batches. ``preconditioner_label`` names the metric in the result (default ``"adam"``
    for an optimizer or its state, ``"diagonal"`` for a mapping; e.g. ``"adam"`` for a mapping made by
    :func:`adam_preconditioner`). The model's parameters and mode are not changed. See the module
    docstring.
    """
    if method not in METHODS:
        raise BatchlabError(f"unknown noise-scale method {method!r}; known: {', '.join(METHODS)}")
    if method == "two_batch" and (not isinstance(micro_batches, int) or micro_batches < 2):
        raise BatchlabError(f"micro_batches must be an integer >= 2, got {micro_batches!r}")
    if method == "per_example" and _has_training_batch_norm(model):
        raise BatchlabError(
            "per-example gradients are undefined under batch-norm in training mode; allowed: method='two_batch', "
            "or put the model in eval() mode"
        )
    fn = _Functional(model, loss_fn)
    precond, label = _resolve_preconditioner(preconditioner, model, fn.named)
    if precond is not None and preconditioner_label is not None:
        label = str(preconditioner_label)
    generator = torch.Generator().manual_seed(seed)
    chunk = max(1, 2**25 // max(fn.size, 1))  # examples per vmap call: ~2**25 gradient entries in memory

    def pair(x, y, partner):
        return _batch_pair(fn, x, y, method, micro_batches, generator, precond, partner, chunk)

    results, pending = [], None
    for x, y in batches:
        if len(x) != len(y):
            raise BatchlabError(f"a batch has {len(x)} inputs but {len(y)} targets")
        if not hessian:
            results.append(pair(x, y, None))
        elif pending is None:
            pending = (x, y)
        else:
            results.append(pair(*pending, (x, y)))
            results.append(pair(x, y, pending))
            results[-1]["pair"] = results[-2]["pair"] = len(results) // 2 - 1
            pending = None
    if pending is not None:  # an odd batch out: B_simple only
        results.append(pair(*pending, None))
    if not results:
        raise BatchlabError("no batches to measure the noise scale on")
    if hessian and len(results) < 2:
        raise BatchlabError("hessian=True needs at least two batches (each uses its partner's Hessian)")

    layer_g2, layer_s = [], []
    for r in results:
        g2, s = moments_from_norms(r["small_sq"], r["big_sq"], r["b"], r["B"])
        layer_g2.append(g2)
        layer_s.append(s)
    layer_g2, layer_s = np.array(layer_g2), np.array(layer_s)  # (batches, parameters)
    g2_j, s_j = layer_g2.sum(1), layer_s.sum(1)
    grad_norm_sq, trace_sigma = float(g2_j.mean()), float(s_j.mean())
    b_noise = b_noise_interval = trace_h_sigma = grad_h_grad = None
    hvps = 0
    if hessian:
        paired = [r for r in results if "pair" in r]
        pairs = max(r["pair"] for r in paired) + 1
        q = np.zeros((pairs, 2))
        for r in paired:
            ghg, thg = moments_from_norms(r["q_small"], r["q_big"], r["b"], r["B"])
            q[r["pair"]] += (ghg / 2, thg / 2)
            hvps += r["units"] + 1
        grad_h_grad, trace_h_sigma = float(q[:, 0].mean()), float(q[:, 1].mean())
        b_noise = ratio(trace_h_sigma, grad_h_grad)
        b_noise_interval = ratio_interval(q[:, 1], q[:, 0], level)
    batch_sizes = {r["B"] for r in results}
    return NoiseScale(
        b_simple=ratio(trace_sigma, grad_norm_sq),
        b_simple_interval=ratio_interval(s_j, g2_j, level),
        trace_sigma=trace_sigma,
        grad_norm_sq=grad_norm_sq,
        b_noise=b_noise,
        b_noise_interval=b_noise_interval,
        per_layer=per_layer_table(fn.names, layer_s.mean(0), layer_g2.mean(0)),
        method=method,
        examples=sum(r["B"] for r in results),
        preconditioner=label,
        batches=len(results),
        small_batch_size=min(r["b"] for r in results),
        batch_size=batch_sizes.pop() if len(batch_sizes) == 1 else None,
        trace_h_sigma=trace_h_sigma,
        grad_h_grad=grad_h_grad,
        gradients=sum(r["units"] for r in results),
        hvps=hvps,
    )


__all__ = [
    "Interval",
    "NoiseScale",
    "adam_preconditioner",
    "fieller_weighted",
    "layer_name",
    "moments_from_norms",
    "noise_scale",
    "per_layer_table",
    "ratio",
    "ratio_interval",
]
