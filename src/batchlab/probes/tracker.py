"""A running gradient-noise-scale estimate inside a user's own PyTorch training loop.

:class:`NoiseScaleTracker` estimates B_simple = tr(Sigma) / |G|^2 (examples; definitions in
:mod:`batchlab.probes.noise_scale`) from gradients the loop computes anyway, at two batch sizes and
the same parameters:

* **small**: every gradient that back-propagation delivers to a parameter between two
  :meth:`~NoiseScaleTracker.update` calls, seen by a tensor hook *before* it is added to ``.grad``:
  one per micro-batch under gradient accumulation, and, under ``DistributedDataParallel``, the
  worker's *local* gradient (DDP all-reduces after accumulation into ``.grad``, so the hook sees the
  unreduced one);
* **big**: ``.grad`` when :meth:`~NoiseScaleTracker.update` is called, the mean over all
  micro-batches and (all-reduced) over all workers.

With ``batch_size`` = B examples in the step, ``world_size`` = n workers and k backward passes per
worker in the step, the small gradients have b = B / (n k) examples each. The loop's ``.grad`` is
the sum of its k increments h_m (averaged over workers), so in the units of one increment the small
gradients are h_m and the big one is ``.grad / k``; then, per parameter tensor,

    small = mean_m |h_m|^2 (averaged over workers when ``sync``), big = |.grad / k|^2
    |G|^2 = (B big - b small) / (B - b),  tr(Sigma) = (small - big) / (1/b - 1/B)

(:func:`batchlab.probes.noise_scale.moments_from_norms`), unbiased at each step. Numerator and
denominator are averaged over steps *separately* (an exponential moving average with decay
``beta``, bias-corrected, or with ``beta=None`` the plain mean of all steps) and divided only when
read: ``b_simple = trace_sigma / grad_norm_sq``. Scaling the loss by a constant c (dividing each
micro-batch loss by k, a GradScaler's scale) scales both by c^2 and leaves B_simple unchanged; pass
``grad_scale=c`` to :meth:`update` to get |G|^2 and tr(Sigma) of the unscaled mean loss.

A loop with one backward pass of one batch per step on one worker gives only one batch size: split
the step into >= 2 micro-batches (``benchmarks/probe_cost.py`` measures what that costs), or run data
parallel. Use::

    tracker = NoiseScaleTracker(model)              # registers the hooks
    for inputs, targets in loader:
        optimizer.zero_grad()
        for x, y in zip(inputs.chunk(4), targets.chunk(4)):
            (loss_fn(model(x), y) / 4).backward()
        tracker.update(model, batch_size=len(inputs))  # after backward, before clipping or step
        optimizer.step()
    print(tracker.b_simple)

Under ``DistributedDataParallel`` (each of n workers back-propagates its own B/n examples)::

    tracker = NoiseScaleTracker(ddp_model)
    loss_fn(ddp_model(x), y).backward()                 # the hooks see this worker's local gradient
    tracker.update(ddp_model, batch_size=global_batch)  # .grad is the all-reduced mean; n read from
                                                        # torch.distributed

Contract: call :meth:`update` once per optimizer step, after the last ``backward()`` and before
anything rewrites ``.grad`` (gradient clipping, an unscale); every backward pass in between counts
as one micro-batch (a gradient penalty's extra backward would too); micro-batches are assumed equal
in size; parameters that received no gradient in the step are left out of that step (each parameter tensor
keeps its own EMA weight or count, so its running values average the steps it had a gradient in). Under DDP the
optional ``sync`` all-reduces the small norms (one tensor of one number per parameter tensor) so
every rank holds the same estimate; FSDP (sharded ``.grad``) is not supported. The cost is one
fused norm kernel (all parameter tensors) per backward pass and one per update, a Python call per
parameter tensor per backward pass (the hooks), a few dozen small host-side operations and one
device-to-host copy per update; a backward pass's gradients are kept alive until its end (not
beyond). On small models, where that is a visible share of a step, ``every=N`` measures one step in
N and costs nothing on the others (``benchmarks/probe_cost.py``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from batchlab.errors import BatchlabError
from batchlab.probes.noise_scale import moments_from_norms, per_layer_table, ratio

STATE_VERSION = 1


def _named(model_or_params) -> list[tuple[str, torch.Tensor]]:
    if isinstance(model_or_params, nn.Module):
        return [(n, p) for n, p in model_or_params.named_parameters() if p.requires_grad]
    params = list(model_or_params)
    if params and isinstance(params[0], tuple):
        return [(str(n), p) for n, p in params if p.requires_grad]
    return [(str(i), p) for i, p in enumerate(params) if p.requires_grad]


def _norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Euclidean norms of many tensors: ``torch._foreach_norm`` (what ``clip_grad_norm_`` uses; one
    fused kernel on GPUs) since the tracker runs once per backward pass, else one norm per tensor
    (sparse gradients)."""
    try:
        return list(torch._foreach_norm(tensors))
    except (AttributeError, RuntimeError, TypeError):
        return [torch.linalg.vector_norm(t.coalesce().values() if t.is_sparse else t) for t in tensors]


def _to_numpy(tensors: list[torch.Tensor]) -> np.ndarray:
    """One device-to-host copy for many 0-d tensors, as float64."""
    if not tensors:
        return np.zeros(0)
    try:
        return np.array(torch.stack(tensors).tolist(), dtype=float)
    except RuntimeError:  # mixed dtypes or devices
        return np.array([float(t) for t in tensors])


class NoiseScaleTracker:
    """Running B_simple of a training loop from micro-batch (or local) and step gradients.

    ``model_or_params``: a module, an iterable of parameters, or of ``(name, parameter)``; hooks are
    registered on its trainable parameters at construction (``None``: at the first :meth:`update`,
    which then has no small gradients and only registers). ``beta``: the EMA decay per step (``None``:
    the plain mean over all steps). ``sync``: under an initialized ``torch.distributed`` with more than
    one worker, average the small norms over workers. ``every``: measure one step in ``every`` (the
    update calls 0, every, 2 every, ...; the hooks are off in between, so unmeasured steps cost
    nothing but the call); ``beta`` then applies per measured step. ``steps`` counts measured steps,
    ``calls`` all update calls. See the module docstring for the arithmetic and the calling contract.
    """

    def __init__(self, model_or_params=None, *, beta: float | None = 0.99, sync: bool = True, every: int = 1):
        if beta is not None and not 0.0 <= beta < 1.0:
            raise BatchlabError(f"beta must be in [0, 1) or None (the plain mean), got {beta}")
        if not (isinstance(every, int) and every >= 1):
            raise BatchlabError(f"every must be a positive integer (measure one step in every), got {every!r}")
        self.beta = beta
        self.sync = sync
        self.every = every
        self.calls = 0  # update() calls, measured or not
        self._removed = False
        self.names: list[str] = []
        self._params: list[torch.Tensor] = []
        self._handles: list = []
        self._pending: list[tuple[list[int], list[torch.Tensor]]] = []  # per backward: (indices, norms)
        self._seen: list[tuple[int, torch.Tensor]] = []  # the backward pass in progress
        self._queued = False
        self._source = None
        self._b_simple = math.nan  # as of the last measured step
        self.steps = 0
        self._g2: np.ndarray | None = None  # per parameter tensor: running |G|^2 (not bias-corrected)
        self._s: np.ndarray | None = None  # per parameter tensor: running tr(Sigma)
        # per parameter tensor, over the steps that measured it (a tensor without a gradient in a step
        # is left out of that step): EMA 1 - beta^n, plain mean n
        self._weight: np.ndarray | None = None
        self.last: dict | None = None
        if model_or_params is not None:
            self._attach(model_or_params)

    # -- hooks --------------------------------------------------------------------------------------

    def _attach(self, model_or_params) -> None:
        named = _named(model_or_params)
        if not named:
            raise BatchlabError("NoiseScaleTracker: no trainable parameters to track")
        names = [n for n, _ in named]
        if self._g2 is not None and len(self._g2) != len(names):
            raise BatchlabError(f"NoiseScaleTracker state has {len(self._g2)} parameter tensors, the model {len(names)}")
        self.names = names
        self._source = model_or_params
        self._params = [p for _, p in named]
        self._pending = []
        self._seen = []
        self._queued = False
        if self._g2 is None:
            self._g2, self._s = np.zeros(len(named)), np.zeros(len(named))
        if self._weight is None:
            self._weight = np.zeros(len(named))
        # A tensor hook on each parameter sees its incoming gradient before it is added to .grad (and,
        # under DDP, before the all-reduce). The hook only keeps a reference; the norms of all of a
        # backward pass's gradients are taken together, in one fused kernel, by a callback queued on
        # the autograd engine for the end of that pass (what DDP itself uses to finalize a backward):
        # measured, this costs ~1/20 of a norm per hook (torch.autograd.graph.register_multi_grad_hook,
        # the public alternative, costs a third of a small model's backward pass).
        self._sync_hooks()

    def _sync_hooks(self) -> None:
        """Hooks on exactly while the next step is one to measure (every ``every``-th update call)."""
        measure_next = self.calls % self.every == 0 and not self._removed
        if measure_next and not self._handles:
            self._handles = [p.register_hook(self._hook(i)) for i, p in enumerate(self._params)]
        elif not measure_next and self._handles:
            for handle in self._handles:
                handle.remove()
            self._handles = []
            # a parameter whose hook dictionary is left empty still calls into Python on every
            # backward pass (measured: half the cost of a no-op hook); clearing it removes that
            for p in self._params:
                try:
                    if p._backward_hooks is not None and len(p._backward_hooks) == 0:
                        p._backward_hooks = None
                except (AttributeError, RuntimeError, TypeError):
                    pass

    def _hook(self, i: int):
        def hook(grad: torch.Tensor) -> None:
            if not self._queued:
                self._queued = True
                try:
                    torch.autograd.Variable._execution_engine.queue_callback(self._flush)
                except (AttributeError, RuntimeError):  # no engine callback: measure at update()
                    pass
            self._seen.append((i, grad))

        return hook

    def _flush(self) -> None:
        """End of a backward pass: the squared norms of the gradients it delivered."""
        seen, self._seen, self._queued = self._seen, [], False
        if seen:
            self._pending.append(([i for i, _ in seen], _norms([g for _, g in seen])))

    def remove(self) -> None:
        """Remove the hooks for good (the estimates stay readable)."""
        self._removed = True
        self._sync_hooks()

    # -- the step -----------------------------------------------------------------------------------

    def update(self, model_or_params=None, *, batch_size: int, world_size: int | None = None,
               grad_scale: float = 1.0) -> float | None:
        """Fold in this step: the small gradients recorded since the last call and ``.grad``.

        ``batch_size``: examples in the step's ``.grad`` (over all micro-batches and workers);
        ``world_size``: data-parallel workers averaged into ``.grad`` (default: the initialized
        ``torch.distributed`` world size, else 1); ``grad_scale``: the factor the back-propagated
        loss carries relative to a micro-batch's mean loss (see the module docstring). Returns the
        running ``b_simple``, or ``None`` on the call that only registered the hooks.
        """
        if not self._params:
            if model_or_params is None:
                raise BatchlabError("NoiseScaleTracker.update needs the model (or parameters) on its first call")
            self._attach(model_or_params)
            return None
        if model_or_params is not None and model_or_params is not self._source:
            if len(_named(model_or_params)) != len(self._params):
                raise BatchlabError("NoiseScaleTracker.update got a different model from the one it tracks")
            self._source = model_or_params
        if world_size is None:
            world_size = _world_size()
        if not (isinstance(batch_size, int) and batch_size > 0) or world_size < 1:
            raise BatchlabError(f"batch_size and world_size must be positive integers, got {batch_size}, {world_size}")
        measured = self.calls % self.every == 0
        self.calls += 1
        try:
            if not measured:
                self._pending, self._seen = [], []
                return self._b_simple
            return self._measure(batch_size, world_size, grad_scale)
        finally:
            self._sync_hooks()

    def _measure(self, batch_size: int, world_size: int, grad_scale: float) -> float:
        if self._seen:  # a backward pass whose end-of-pass callback did not run
            self._flush()
        pending, self._pending = self._pending, []
        if not pending:
            raise BatchlabError("NoiseScaleTracker.update: no gradients since the last update; call it after backward()")
        n_params = len(self._params)
        grads = [p.grad for p in self._params]
        k = len(pending)
        if all(len(present) == n_params for present, _ in pending) and all(g is not None for g in grads):
            # the usual step: every parameter in every backward pass (hooks fire in a fixed order per
            # pass, so each pass is put back in parameter order)
            norms = [t for _, ts in pending for t in ts] + _norms(grads)
            values = _to_numpy(norms) ** 2
            first = pending[0][0]
            small_sum = np.empty(n_params)
            if all(present == first for present, _ in pending):  # the same hook order in every pass
                small_sum[first] = values[: k * n_params].reshape(k, n_params).sum(0)
            else:
                small_sum = np.bincount([i for present, _ in pending for i in present],
                                        weights=values[: k * n_params], minlength=n_params)
            used = slice(None)
            big_sq = values[k * n_params :]
        else:
            index = np.array([i for present, _ in pending for i in present])
            big_index = [i for i, g in enumerate(grads) if g is not None]
            values = _to_numpy([t for _, ts in pending for t in ts] + _norms([grads[i] for i in big_index])) ** 2
            small_sum = np.bincount(index, weights=values[: len(index)], minlength=n_params)
            counts = np.bincount(index, minlength=n_params)
            big_full = np.zeros(n_params)
            big_full[big_index] = values[len(index) :]
            k = int(counts.max())
            # a tensor seen in fewer backward passes than the others has a different b: left out this step
            used = np.array([i for i in big_index if counts[i] == k], dtype=int)
            if len(used) == 0:
                raise BatchlabError("NoiseScaleTracker.update: no parameter has both micro-batch gradients and a .grad")
            small_sum, big_sq = small_sum[used], big_full[used]
        big_b = float(batch_size)
        b = big_b / (world_size * k)
        if b >= big_b:
            raise BatchlabError(
                "one gradient of one batch size per step gives no noise-scale estimate; split the step into >= 2 "
                "micro-batches (gradient accumulation) or run data parallel (world_size > 1)"
            )
        small = small_sum / k
        if self.sync and world_size > 1 and _world_size() == world_size:
            import torch.distributed as dist

            try:  # gloo reduces on the CPU, nccl on the parameters' device
                device = torch.device("cpu") if dist.get_backend() == "gloo" else self._params[0].device
            except (RuntimeError, ValueError):
                device = torch.device("cpu")
            local = torch.as_tensor(small, dtype=torch.float64, device=device)
            dist.all_reduce(local)
            small = local.cpu().numpy() / world_size
        scale2 = grad_scale * grad_scale
        small, big = small / scale2, big_sq / (k * k * scale2)
        g2, s = moments_from_norms(small, big, b, big_b)
        self._fold(used, g2, s)
        self.last = {"step": self.steps, "small_batch_size": b, "batch_size": batch_size,
                     "grad_norm_sq": float(np.sum(g2)), "trace_sigma": float(np.sum(s))}
        self._b_simple = self.b_simple
        return self._b_simple

    def _fold(self, index: np.ndarray, g2: np.ndarray, s: np.ndarray) -> None:
        self.steps += 1
        if self.beta is None:
            self._weight[index] += 1.0
            self._g2[index] += (g2 - self._g2[index]) / self._weight[index]
            self._s[index] += (s - self._s[index]) / self._weight[index]
        else:
            self._weight[index] = 1.0 - (1.0 - self._weight[index]) * self.beta
            self._g2[index] = self.beta * self._g2[index] + (1.0 - self.beta) * g2
            self._s[index] = self.beta * self._s[index] + (1.0 - self.beta) * s

    # -- readings -----------------------------------------------------------------------------------

    def _corrected(self, values: np.ndarray | None) -> np.ndarray:
        if values is None or self.steps == 0:
            return np.full(len(self.names), math.nan)
        # a tensor never measured yet is left out of the sums (0); each other one is corrected by its own
        # weight, so a tensor without a gradient at some steps is averaged over the steps it had one
        measured = self._weight > 0
        out = np.zeros(len(values))
        if self.beta is None:
            out[measured] = values[measured]
        else:
            out[measured] = values[measured] / self._weight[measured]
        return out

    @property
    def grad_norm_sq(self) -> float:
        """Running |G|^2 (bias-corrected EMA or mean over steps; NaN before the first step)."""
        return float(self._corrected(self._g2).sum())

    @property
    def trace_sigma(self) -> float:
        """Running tr(Sigma) of the per-example gradient (NaN before the first step)."""
        return float(self._corrected(self._s).sum())

    @property
    def b_simple(self) -> float:
        """``trace_sigma / grad_norm_sq`` in examples: NaN before the first step, ``inf`` while the
        running |G|^2 is <= 0 (the gradient cannot be told from noise yet)."""
        if self.steps == 0:
            return math.nan
        return ratio(self.trace_sigma, self.grad_norm_sq)

    @property
    def per_layer(self) -> dict[str, dict]:
        """Module name -> ``{"trace_sigma", "grad_norm_sq", "b_simple"}`` (running; they add up)."""
        return per_layer_table(self.names, self._corrected(self._s), self._corrected(self._g2))

    def to_dict(self) -> dict:
        """The running estimates, JSON-ready (non-finite as ``None``)."""
        def f(x):
            return x if math.isfinite(x) else None

        return {"b_simple": f(self.b_simple), "trace_sigma": f(self.trace_sigma), "grad_norm_sq": f(self.grad_norm_sq),
                "steps": self.steps, "beta": self.beta}

    # -- checkpoints --------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Plain Python state (``torch.save``/JSON-able). Call between steps: gradients recorded since
        the last :meth:`update` are not part of it."""
        return {
            "version": STATE_VERSION,
            "beta": self.beta,
            "steps": self.steps,
            "calls": self.calls,
            "every": self.every,
            "weight": None if self._weight is None else self._weight.tolist(),
            "names": list(self.names),
            "grad_norm_sq": None if self._g2 is None else self._g2.tolist(),
            "trace_sigma": None if self._s is None else self._s.tolist(),
            "last": None if self.last is None else dict(self.last),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output; the parameter tensors must match in number (and in
        name where this tracker already knows them)."""
        if state.get("version") != STATE_VERSION:
            raise BatchlabError(f"NoiseScaleTracker state version {state.get('version')!r}; known: {STATE_VERSION}")
        names = list(state["names"])
        if self.names and names and len(names) != len(self.names):
            raise BatchlabError(f"NoiseScaleTracker state has {len(names)} parameter tensors, the model {len(self.names)}")
        if self.names and names != self.names:
            raise BatchlabError("NoiseScaleTracker state names other parameters than the tracked model's")
        self.beta = state["beta"]
        self.steps = int(state["steps"])
        self.calls = int(state.get("calls", self.steps))
        self.every = int(state.get("every", 1))
        weight = state["weight"]
        if weight is None or isinstance(weight, (int, float)):  # a tracker of one common weight
            size = len(state["grad_norm_sq"]) if state["grad_norm_sq"] is not None else len(names or self.names)
            weight = None if weight is None else [float(weight)] * size
        self._weight = None if weight is None else np.array(weight, dtype=float)
        self.names = names or self.names
        self._g2 = None if state["grad_norm_sq"] is None else np.array(state["grad_norm_sq"], dtype=float)
        self._s = None if state["trace_sigma"] is None else np.array(state["trace_sigma"], dtype=float)
        self.last = None if state["last"] is None else dict(state["last"])
        self._b_simple = self.b_simple
        if self._params:
            self._sync_hooks()


def _world_size() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


__all__ = ["NoiseScaleTracker"]
