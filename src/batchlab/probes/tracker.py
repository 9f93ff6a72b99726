"""A running gradient-noise-scale estimate, with its interval, inside a user's own PyTorch training loop.

:class:`NoiseScaleTracker` estimates B_simple = tr(Sigma) / |G|^2 (examples; definitions in
:mod:`batchlab.probes.noise_scale`) from gradients the loop computes anyway, at two batch sizes and
the same parameters:

* **small**: every gradient that back-propagation delivers to a parameter between two
  :meth:`~NoiseScaleTracker.update` calls, seen by a tensor hook *before* it is added to ``.grad``:
  one per micro-batch under gradient accumulation, and, under ``DistributedDataParallel`` or FSDP2
  (``torch.distributed.fsdp.fully_shard``), the worker's *local*, unreduced gradient (DDP
  all-reduces after accumulation into ``.grad``; FSDP2 reduce-scatters the gradient of its
  unsharded parameters, which is where the hooks sit, see below);
* **big**: ``.grad``, the mean over all micro-batches and (all-reduced) over all workers, read at
  :meth:`~NoiseScaleTracker.update` (``grad_at="update"``) or at the end of the last backward pass
  before it (``grad_at="backward"``). Under FSDP2 ``.grad`` is a sharded ``DTensor``: its squared
  norm is the sum of the local shards' squared norms over the mesh dimensions the parameter is
  sharded on (HSDP: the shard dimension only, not the replicate one), one all-reduce of one number
  per parameter tensor.

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

**Interval** (:meth:`~NoiseScaleTracker.b_simple_interval`, :meth:`~NoiseScaleTracker.reading`).
Each measured step t gives one replicate (x_t, y_t) = (the step's tr(Sigma), its |G|^2, summed
over parameter tensors), from its own batch. The running values are weighted means of them,
weights w_t = beta^(steps - t) (``beta=None``: 1). Fieller's interval for the ratio of the two
weighted means is the set of R >= 0 with ``(x_bar - R y_bar)^2 <= t^2 Var(x_bar - R y_bar)``, where
x_bar, y_bar are the tracker's running ``trace_sigma`` and ``grad_norm_sq`` (so ``b_simple`` is
always inside it), ``Var`` of a weighted mean of independent replicates is ``s^2 sum w^2 /
(sum w)^2`` with s^2 the reliability-weighted (co)variance of the replicates ``sum w (x - x_bar)^2
/ (sum w - sum w^2 / sum w)``, and t is Student's quantile at the two-sided ``level`` with
n_eff - 1 degrees of freedom, n_eff = (sum w)^2 / sum w^2 (``beta=None``: the number of steps,
and this is exactly :func:`~batchlab.probes.noise_scale.ratio_interval` over the steps; an EMA:
about (1 + beta) / (1 - beta) steps). The weighted sums are kept in O(1) state (weighted
Welford updates), not a buffer. It treats steps as independent replicates, which holds for
different batches at fixed parameters; when the parameters drift, it is the interval of the ratio
of the weighted means of the drifting per-step values, and their drift adds to the spread. Without
a finite upper end (|G|^2 not significantly above 0) the estimate is only a lower bound: the reading
is not ``resolved``.

**FSDP2.** Autograd does not deliver gradients to the sharded parameters: it delivers them to the
unsharded parameters that FSDP2 all-gathers and swaps onto the modules (``module._parameters``) for
the forward and backward passes, and then reduce-scatters their ``.grad`` into the sharded
``.grad``. The tracker therefore puts a forward pre-hook on each module owning a sharded parameter
(after FSDP2's own, which all-gathers) that moves the parameter's tensor hook onto whatever tensor
the module holds in that slot during the forward pass (FSDP2 keeps that unsharded parameter object
from the first all-gather on, so this happens once). Tensor parallelism (a ``DTensor`` parameter
that no forward pass swaps) is not supported.

**Where the big gradient is read.** ``grad_at="update"``: ``.grad`` when :meth:`update` is called,
which must come before anything rewrites ``.grad`` (clipping, an unscale). ``grad_at="backward"``:
at the end of each backward pass, after DDP's and FSDP2's own end-of-pass work (their reductions
into ``.grad``), before any code after ``backward()`` (``clip_grad_norm_``, a trainer's clipping
before its callbacks) runs; the last backward pass before :meth:`update` counts. The autograd
engine runs the callbacks queued for the end of a pass in order, including callbacks queued by
callbacks: the tensor hooks queue the tracker's end-of-pass callback during the pass, and that one
queues the read of ``.grad``, which so runs after every callback DDP and FSDP2 queued during the
pass (checked with real DDP and FSDP2 processes in tests/integrations/test_tracker_distributed.py).

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
    print(tracker.reading())

Under ``DistributedDataParallel`` or ``fully_shard`` (each of n workers back-propagates its own B/n
examples)::

    tracker = NoiseScaleTracker(ddp_model)
    loss_fn(ddp_model(x), y).backward()                 # the hooks see this worker's local gradient
    tracker.update(ddp_model, batch_size=global_batch)  # .grad is the reduced mean; n read from
                                                        # torch.distributed

Contract: call :meth:`update` once per optimizer step, after the last ``backward()`` and (with
``grad_at="update"``) before anything rewrites ``.grad``; every backward pass in between counts as
one micro-batch (a gradient penalty's extra backward would too); micro-batches are assumed equal in
size; parameters that received no gradient in the step are left out of that step (each parameter
tensor keeps its own EMA weight or count, so its running values average the steps it had a gradient
in). Under DDP and FSDP2 every rank calls :meth:`update` at the same steps (it may all-reduce);
the optional ``sync`` all-reduces the small norms (one number per parameter tensor) so every rank
holds the same estimate. To leave a step out (a skipped optimizer step, unequal micro-batches), call
:meth:`discard` instead of :meth:`update`: it drops what was recorded since the last update.

Cost. Per backward pass, a Python call per parameter tensor (the hooks) and the norms of the
gradients the pass delivered: on the CPU, and under DDP or FSDP2 on any device (where keeping them
would hold a full, under FSDP2 unsharded, gradient copy), each is taken in its hook, while the
gradient is still in the cache, and the gradient is not kept; in one process on other devices the
hooks keep the gradients and one fused
``torch._foreach_norm`` kernel norms them at the end of the pass, except a tensor's first gradient
of the step, which in one process without DDP or FSDP2 is read from ``.grad`` at the end of the pass
instead (``.grad`` was ``None``, so it is exactly that gradient; keeping it would stop autograd from
moving it into ``.grad`` without a copy). A pass that does not accumulate into ``.grad``
(``torch.autograd.grad``) is counted like any other on the CPU and, on other devices, not counted
when it comes before the step's first ``backward()`` (there is no ``.grad`` to read); keep it out
of the steps. Per update: one fused norm of ``.grad`` (``grad_at="backward"``: one per backward
pass), a few dozen small host-side operations and one device-to-host copy. On small models, where
that is a visible share of a step, ``every=N`` measures one step in N and costs nothing on the
others (``benchmarks/probe_cost.py``; docs/methods.md, "NoiseScaleTracker", **Overhead**).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from batchlab.errors import BatchlabError
from batchlab.probes.noise_scale import (
    INTERVAL_METHOD,
    Interval,
    fieller_weighted,
    moments_from_norms,
    per_layer_table,
    ratio,
)

STATE_VERSION = 2
GRAD_AT = ("update", "backward")
_LOW_PRECISION = (torch.float16, torch.bfloat16)


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
    if not tensors:
        return []
    if any(t.requires_grad for t in tensors):  # backward(create_graph=True): no graph for the norms
        tensors = [t.detach() for t in tensors]
    try:
        if any(t.dtype in _LOW_PRECISION for t in tensors):
            # half-precision gradients (AMP, FSDP2's param_dtype): accumulate and return in float32,
            # a bfloat16 norm has 3 significant digits and tr(Sigma) is a difference of two of them
            return list(torch._foreach_norm(tensors, 2, dtype=torch.float32))
        return list(torch._foreach_norm(tensors))
    except (AttributeError, RuntimeError, TypeError, NotImplementedError):
        return [_norm(t) for t in tensors]


def _norm(tensor: torch.Tensor) -> torch.Tensor:
    """The Euclidean norm of one tensor, as :func:`_norms` takes it (float32 for half precision)."""
    if tensor.requires_grad:  # backward(create_graph=True): no graph for the norm
        tensor = tensor.detach()
    if tensor.is_sparse:
        tensor = tensor.coalesce().values()
    if tensor.dtype in _LOW_PRECISION:
        return torch.linalg.vector_norm(tensor, dtype=torch.float32)
    return torch.linalg.vector_norm(tensor)


def _to_numpy(tensors: list[torch.Tensor]) -> np.ndarray:
    """One device-to-host copy for many 0-d tensors, as float64."""
    if not tensors:
        return np.zeros(0)
    try:
        return np.array(torch.stack(tensors).tolist(), dtype=float)
    except RuntimeError:  # mixed dtypes or devices
        return np.array([float(t) for t in tensors])


def _dtensor_type():
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without torch.distributed
        return None
    return DTensor


def _all_reduce_sum(values: np.ndarray, device: torch.device, group=None) -> np.ndarray:
    """Sum a float64 vector over ``group`` (default: the world), on the device its backend reduces on:
    the CPU for gloo, else ``device`` (the parameters' device: this rank's accelerator)."""
    import torch.distributed as dist

    try:
        backend = dist.get_backend(group)
        device = torch.device("cpu") if backend == "gloo" else device
    except (AttributeError, RuntimeError, ValueError):
        device = torch.device("cpu")
    tensor = torch.as_tensor(values, dtype=torch.float64).to(device)
    dist.all_reduce(tensor, group=group)
    return tensor.cpu().numpy()


class NoiseScaleTracker:
    """Running B_simple of a training loop from micro-batch (or local) and step gradients, with its interval.

    ``model_or_params``: a module (a ``DistributedDataParallel`` or ``fully_shard`` one included),
    an iterable of parameters, or of ``(name, parameter)`` (FSDP2 needs the module); hooks are
    registered on its trainable parameters at construction (``None``: at the first :meth:`update`,
    which then has no small gradients and only registers). ``beta``: the EMA decay per step (``None``:
    the plain mean over all steps). ``sync``: under an initialized ``torch.distributed`` with more than
    one worker, average the small norms over workers. ``every``: measure one step in ``every`` (the
    update calls 0, every, 2 every, ...; the hooks are off in between, so unmeasured steps cost
    nothing but the call); ``beta`` then applies per measured step. ``grad_at``: where the big
    gradient (``.grad``) is read, ``"update"`` (at :meth:`update`) or ``"backward"`` (at the end of
    the last backward pass before it, before clipping can rewrite ``.grad``). ``steps`` counts
    measured steps, ``calls`` all update calls. See the module docstring for the arithmetic, the
    interval and the calling contract.
    """

    def __init__(self, model_or_params=None, *, beta: float | None = 0.99, sync: bool = True, every: int = 1,
                 grad_at: str = "update"):
        if beta is not None and not 0.0 <= beta < 1.0:
            raise BatchlabError(f"beta must be in [0, 1) or None (the plain mean), got {beta}")
        if not (isinstance(every, int) and every >= 1):
            raise BatchlabError(f"every must be a positive integer (measure one step in every), got {every!r}")
        if grad_at not in GRAD_AT:
            raise BatchlabError(f"grad_at must be one of {', '.join(GRAD_AT)}, got {grad_at!r}")
        self.beta = beta
        self.sync = sync
        self.every = every
        self.grad_at = grad_at
        self.calls = 0  # update() calls, measured or not
        # measured steps whose |G|^2 or tr(Sigma) came out non-finite (an overflowed mixed-precision step):
        # left out, as the optimizer (a GradScaler) leaves them out, instead of poisoning every later reading
        self.nonfinite_steps = 0
        self._removed = False
        self.names: list[str] = []
        self._params: list[torch.Tensor] = []
        self._targets: list[torch.Tensor] = []  # per parameter: the tensor autograd delivers its gradient to
        self._handles: dict[int, object] = {}
        self._slot_handles: list = []  # FSDP2: forward pre-hooks that find the unsharded parameters
        self._sharded: list[int] = []  # indices of sharded (DTensor) parameters
        self._shard_groups: list[tuple[np.ndarray, list]] = []  # (indices, process groups to sum over)
        self._pending: list[tuple[list[int], list[torch.Tensor]]] = []  # per backward: (indices, norms)
        self._seen: list[tuple[int, torch.Tensor]] = []  # the backward pass in progress
        self._big: tuple[list[int], list[torch.Tensor]] | None = None  # grad_at="backward": the last pass's read
        self._queued = False
        self._source = None
        self._b_simple = math.nan  # as of the last measured step
        self.steps = 0
        self._g2: np.ndarray | None = None  # per parameter tensor: running |G|^2 (not bias-corrected)
        self._s: np.ndarray | None = None  # per parameter tensor: running tr(Sigma)
        # per parameter tensor, over the steps that measured it (a tensor without a gradient in a step
        # is left out of that step): EMA 1 - beta^n, plain mean n
        self._weight: np.ndarray | None = None
        # the interval's weighted moments of the per-step totals (tr Sigma_t, |G|^2_t): sum of weights,
        # sum of squared weights, weighted means and the weighted sums of squared deviations (2 x 2)
        # (Python floats: a few scalar operations per step, cheaper than numpy's per-call cost)
        self._iw = 0.0
        self._iw2 = 0.0
        self._imean = [0.0, 0.0]
        self._im2 = [[0.0, 0.0], [0.0, 0.0]]
        self.last: dict | None = None
        # the running (trace_sigma, grad_norm_sq), recomputed when the sums change; every tensor measured
        # at least once (then the weights stay > 0 and the correction needs no mask)
        self._totals = (math.nan, math.nan)
        self._all_measured = False
        # read a tensor's first gradient of a step from .grad at the end of its backward pass instead of
        # keeping the incoming tensor (which would stop autograd from moving it into .grad without a
        # copy): only where nothing else rewrites .grad during the pass (one process, no DDP, no FSDP2,
        # no post-accumulate-grad hooks) and the engine runs end-of-pass callbacks
        self._read_first = False
        # on the CPU, each incoming gradient's norm is taken in its hook, while the gradient is still in
        # the cache and without keeping it (one norm call per tensor instead of one fused kernel per
        # pass, which only pays where kernel launches are dear: accelerators)
        self._norm_in_hook = False
        if model_or_params is not None:
            self._attach(model_or_params)

    # -- hooks --------------------------------------------------------------------------------------

    def _attach(self, model_or_params) -> None:
        named = _named(model_or_params)
        if not named:
            raise BatchlabError("NoiseScaleTracker: the model has no trainable parameters (requires_grad=True) to track")
        names = [n for n, _ in named]
        if self._g2 is not None and len(self._g2) != len(names):
            raise BatchlabError(f"NoiseScaleTracker state has {len(self._g2)} parameter tensors, the model {len(names)}")
        self.names = names
        self._source = model_or_params
        self._params = [p for _, p in named]
        self._targets = list(self._params)
        self._natural = list(range(len(self._params)))  # the hook order of a pass equal to parameter order
        self._pending = []
        self._seen = []
        self._big = None
        self._queued = False
        if self._g2 is None:
            self._g2, self._s = np.zeros(len(named)), np.zeros(len(named))
        if self._weight is None:
            self._weight = np.zeros(len(named))
        dtensor = _dtensor_type()
        self._sharded = [i for i, p in enumerate(self._params) if dtensor is not None and isinstance(p, dtensor)]
        if self._sharded:
            self._watch_sharded(model_or_params)
        self._all_measured = False
        self._refresh_totals()
        self._read_first = self._may_read_first()
        # and under DDP or FSDP2 on any device: keeping a pass's gradients to its end would hold a full
        # (under FSDP2: unsharded) gradient copy alive, the memory data parallelism exists to save
        self._norm_in_hook = (all(t.device.type == "cpu" for t in self._params) or bool(self._sharded)
                              or _world_size() > 1)
        # A tensor hook on each parameter sees its incoming gradient before it is added to .grad (and,
        # under DDP, before the all-reduce). The hook only keeps a reference; the norms of all of a
        # backward pass's gradients are taken together, in one fused kernel, by a callback queued on
        # the autograd engine for the end of that pass (what DDP itself uses to finalize a backward):
        # measured, this costs ~1/20 of a norm per hook (torch.autograd.graph.register_multi_grad_hook,
        # the public alternative, costs a third of a small model's backward pass).
        self._sync_hooks()

    def _watch_sharded(self, model) -> None:
        """FSDP2: the reduction groups of each sharded ``.grad`` and the hooks that find the unsharded
        parameters (module docstring)."""
        if not isinstance(model, nn.Module):
            raise BatchlabError("NoiseScaleTracker: sharded (DTensor) parameters need the fully_shard module itself, "
                                "not an iterable of its parameters")
        groups: dict[tuple, list[int]] = {}
        meshes = {}
        for i in self._sharded:
            p = self._params[i]
            if any(placement.is_partial() for placement in p.placements):
                raise BatchlabError(f"NoiseScaleTracker: parameter {self.names[i]!r} has a partial placement; "
                                    "allowed: sharded (Shard) or replicated (Replicate) mesh dimensions")
            dims = tuple(d for d, placement in enumerate(p.placements) if placement.is_shard())
            key = (id(p.device_mesh), dims)
            meshes[key] = p.device_mesh
            groups.setdefault(key, []).append(i)
        self._shard_groups = [(np.array(index), [meshes[key].get_group(d) for d in key[1]])
                              for key, index in groups.items() if key[1]]
        index_of = {id(self._params[i]): i for i in self._sharded}
        for module in model.modules():
            owned = [(index_of[id(t)], name) for name, t in module._parameters.items()
                     if t is not None and id(t) in index_of]
            if owned:
                self._slot_handles.append(module.register_forward_pre_hook(self._slot_hook(owned)))

    def _slot_hook(self, owned: list[tuple[int, str]]):
        def hook(module, args) -> None:
            slots = module._parameters
            for i, name in owned:
                t = slots.get(name)
                if t is not None and t is not self._targets[i] and t is not self._params[i]:
                    self._retarget(i, t)

        return hook

    def _retarget(self, i: int, tensor: torch.Tensor) -> None:
        self._targets[i] = tensor
        handle = self._handles.pop(i, None)
        if handle is not None:
            handle.remove()
            self._handles[i] = tensor.register_hook(self._hook(i))

    def _sync_hooks(self) -> None:
        """Hooks on exactly while the next step is one to measure (every ``every``-th update call)."""
        measure_next = self.calls % self.every == 0 and not self._removed
        if measure_next and not self._handles:
            self._handles = {i: t.register_hook(self._hook(i)) for i, t in enumerate(self._targets)}
        elif not measure_next and self._handles:
            for handle in self._handles.values():
                handle.remove()
            self._handles = {}
            # a parameter whose hook dictionary is left empty still calls into Python on every
            # backward pass (measured: half the cost of a no-op hook); clearing it removes that
            for p in self._targets:
                try:
                    if p._backward_hooks is not None and len(p._backward_hooks) == 0:
                        p._backward_hooks = None
                except (AttributeError, RuntimeError, TypeError):
                    pass

    def _may_read_first(self) -> bool:
        """Whether a tensor's first gradient of a step may be read from ``.grad`` at the end of its pass
        (``.grad`` is then exactly that gradient): one process, no DDP wrapper, no sharded parameter,
        no post-accumulate-grad hook (which may consume ``.grad`` during the pass)."""
        if self._sharded or _world_size() > 1:
            return False
        if type(self._source).__name__ in ("DistributedDataParallel", "FullyShardedDataParallel"):
            return False
        return all(getattr(t, "_post_accumulate_grad_hooks", None) is None for t in self._targets)

    def _hook(self, i: int):
        target = self._targets[i]

        def hook(grad: torch.Tensor) -> None:
            if not self._queued:
                self._queued = True
                try:
                    torch.autograd.Variable._execution_engine.queue_callback(self._flush)
                except (AttributeError, RuntimeError):  # no engine callback: measure at update()
                    self._read_first = False
            if self._norm_in_hook:
                self._seen.append((i, _norm(grad)))
            elif self._read_first and target.grad is None:
                # the step's first gradient of this tensor: .grad is exactly it at the end of the pass
                self._seen.append((i, None))
            else:
                self._seen.append((i, grad))

        return hook

    def _flush(self) -> None:
        """End of a backward pass: the squared norms of the gradients it delivered (a tensor's first
        of the step read from its ``.grad``, see ``_read_first``); with ``grad_at="backward"`` it queues
        the read of ``.grad`` behind the callbacks already queued (DDP's and FSDP2's reductions)."""
        seen, self._seen, self._queued = self._seen, [], False
        if seen and self._norm_in_hook:
            self._pending.append(([i for i, _ in seen], [n for _, n in seen]))
        elif seen:
            targets = self._targets
            grads = [targets[i].grad if g is None else g for i, g in seen]
            if any(g is None for g in grads):  # a pass that did not accumulate (torch.autograd.grad)
                seen = [(i, g) for (i, _), g in zip(seen, grads) if g is not None]
                grads = [g for _, g in seen]
            if seen:
                self._pending.append(([i for i, _ in seen], _norms(grads)))
        if self.grad_at == "backward":
            try:
                torch.autograd.Variable._execution_engine.queue_callback(self._read_big_at_end)
            except (AttributeError, RuntimeError):  # not inside a backward pass (update's own flush)
                pass

    def _read_big_at_end(self) -> None:
        self._big = self._read_big()

    def _read_big(self) -> tuple[list[int], list[torch.Tensor]]:
        """Indices of the parameters with a ``.grad`` and the norms of their local ``.grad`` (a
        sharded one's local shard)."""
        grads = [p.grad for p in self._params]
        for i in self._sharded:
            if grads[i] is not None:
                grads[i] = grads[i].to_local()
        index = [i for i, g in enumerate(grads) if g is not None]
        return index, _norms([grads[i] for i in index])

    def discard(self) -> None:
        """Leave the current step out: drop the gradients recorded since the last :meth:`update`
        (and, with ``grad_at="backward"``, the ``.grad`` read at the end of the last pass). ``calls``
        and ``steps`` are unchanged and the hooks stay as they are, so the next step is measured
        when this one would have been. Call it between backward passes, not inside one."""
        self._pending, self._seen, self._big = [], [], None

    def remove(self) -> None:
        """Remove the hooks for good (the estimates stay readable)."""
        self._removed = True
        for handle in self._slot_handles:
            handle.remove()
        self._slot_handles = []
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
        if self._read_first and world_size > 1 and _world_size() > 1:
            self._read_first = False  # torch.distributed started after the tracker (from the next step)
        if not (isinstance(batch_size, int) and batch_size > 0) or world_size < 1:
            raise BatchlabError(f"batch_size and world_size must be positive integers, got {batch_size}, {world_size}")
        measured = self.calls % self.every == 0
        self.calls += 1
        try:
            if not measured:
                self._pending, self._seen, self._big = [], [], None
                return self._b_simple
            return self._measure(batch_size, world_size, grad_scale)
        finally:
            self._sync_hooks()

    def _measure(self, batch_size: int, world_size: int, grad_scale: float) -> float:
        if self._seen:  # a backward pass whose end-of-pass callback did not run
            self._flush()
        pending, self._pending = self._pending, []
        big, self._big = self._big, None
        if not pending:
            raise BatchlabError("NoiseScaleTracker.update: no gradients since the last update; call it after backward()")
        unswapped = [self.names[i] for i in self._sharded if self._targets[i] is self._params[i]]
        if unswapped:
            raise BatchlabError(
                f"NoiseScaleTracker: sharded parameter {unswapped[0]!r} was never replaced by an unsharded one in a "
                "forward pass; allowed sharding: FSDP2 (fully_shard), not tensor parallelism"
            )
        if self.grad_at == "update":
            big = self._read_big()
        elif big is None:
            raise BatchlabError("NoiseScaleTracker(grad_at='backward') saw no end of a backward pass since the last "
                                "update; call update() after backward()")
        big_index, big_norms = big
        n_params = len(self._params)
        k = len(pending)
        values = _to_numpy([t for _, ts in pending for t in ts] + big_norms) ** 2
        n_small = sum(len(present) for present, _ in pending)
        small_values, big_values = values[:n_small], values[n_small:]
        if len(big_index) == n_params and all(len(present) == n_params for present, _ in pending):
            # the usual step: every parameter in every backward pass (hooks fire in a fixed order per
            # pass, so each pass is put back in parameter order)
            first = pending[0][0]
            small_sum = np.empty(n_params)
            if all(present == first for present, _ in pending):  # the same hook order in every pass
                if first == self._natural:
                    small_sum = small_values.reshape(k, n_params).sum(0)
                else:
                    small_sum[first] = small_values.reshape(k, n_params).sum(0)
            else:
                small_sum = np.bincount([i for present, _ in pending for i in present], weights=small_values,
                                        minlength=n_params)
            small = small_sum / k
            big_sq = big_values
            used = None
        else:
            index = np.array([i for present, _ in pending for i in present])
            small_sum = np.bincount(index, weights=small_values, minlength=n_params)
            counts = np.bincount(index, minlength=n_params)
            big_sq = np.zeros(n_params)
            big_sq[big_index] = big_values
            k = int(counts.max())
            small = small_sum / k
            # a tensor seen in fewer backward passes than the others has a different b: left out this step
            used = np.array([i for i in big_index if counts[i] == k], dtype=int)
        big_b = float(batch_size)
        b = big_b / (world_size * k)
        if b >= big_b:
            raise BatchlabError(
                "one gradient of one batch size per step gives no noise-scale estimate; split the step into >= 2 "
                "micro-batches (gradient accumulation) or run data parallel (world_size > 1)"
            )
        small, big_sq = self._reduce(small, big_sq, world_size)
        if used is not None:
            if len(used) == 0:
                raise BatchlabError("NoiseScaleTracker.update: no parameter has both micro-batch gradients and a .grad")
            small, big_sq = small[used], big_sq[used]
        scale2 = grad_scale * grad_scale
        small, big = small / scale2, big_sq / (k * k * scale2)
        if used is None:  # moments_from_norms's arithmetic, without its argument conversion
            g2, s = (big_b * big - b * small) / (big_b - b), (small - big) / (1.0 / b - 1.0 / big_b)
        else:
            g2, s = moments_from_norms(small, big, b, big_b)
        if not (np.all(np.isfinite(g2)) and np.all(np.isfinite(s))):
            self.nonfinite_steps += 1  # after the step's collectives: a rank leaving it out cannot hang the others
            return self._b_simple
        self._fold(slice(None) if used is None else used, g2, s)
        self.last = {"step": self.steps, "small_batch_size": b, "batch_size": batch_size,
                     "grad_norm_sq": float(np.sum(g2)), "trace_sigma": float(np.sum(s))}
        self._fold_interval(self.last["trace_sigma"], self.last["grad_norm_sq"])
        self._refresh_totals()
        self._b_simple = self.b_simple
        return self._b_simple

    def _reduce(self, small: np.ndarray, big_sq: np.ndarray, world_size: int) -> tuple[np.ndarray, np.ndarray]:
        """The collectives of a step, the same on every rank: the small norms' mean over the world
        (``sync``) and each sharded ``.grad``'s squared norm summed over its shard groups."""
        sync = self.sync and world_size > 1 and _world_size() == world_size
        if not sync and not self._shard_groups:
            return small, big_sq
        import torch.distributed as dist

        n = len(small)
        big_sq = big_sq.copy()
        groups = [(index, list(process_groups)) for index, process_groups in self._shard_groups]
        if sync and len(groups) == 1 and len(groups[0][1]) == 1 and dist.get_world_size(groups[0][1][0]) == _world_size():
            # plain FSDP2 on the whole world: one all-reduce for the small and the big norms together
            index, _ = groups.pop()
            total = _all_reduce_sum(np.concatenate([small, big_sq[index]]), self._params[0].device)
            small = total[:n] / world_size
            big_sq[index] = total[n:]
        elif sync:
            small = _all_reduce_sum(small, self._params[0].device) / world_size
        for index, process_groups in groups:
            part = big_sq[index]
            for group in process_groups:
                part = _all_reduce_sum(part, self._params[0].device, group)
            big_sq[index] = part
        return small, big_sq

    def _fold(self, index, g2: np.ndarray, s: np.ndarray) -> None:
        self.steps += 1
        if isinstance(index, slice):  # every tensor (the same arithmetic, without the indexing)
            if self.beta is None:
                self._weight += 1.0
                self._g2 += (g2 - self._g2) / self._weight
                self._s += (s - self._s) / self._weight
            else:
                self._weight = 1.0 - (1.0 - self._weight) * self.beta
                self._g2 = self.beta * self._g2 + (1.0 - self.beta) * g2
                self._s = self.beta * self._s + (1.0 - self.beta) * s
            return
        if self.beta is None:
            self._weight[index] += 1.0
            self._g2[index] += (g2 - self._g2[index]) / self._weight[index]
            self._s[index] += (s - self._s[index]) / self._weight[index]
        else:
            self._weight[index] = 1.0 - (1.0 - self._weight[index]) * self.beta
            self._g2[index] = self.beta * self._g2[index] + (1.0 - self.beta) * g2
            self._s[index] = self.beta * self._s[index] + (1.0 - self.beta) * s

    def _fold_interval(self, trace_sigma: float, grad_norm_sq: float) -> None:
        """Weighted Welford update of the per-step totals' moments: earlier weights times ``beta``,
        the new step weight 1."""
        m2 = self._im2
        if self.beta is not None:
            beta = self.beta
            self._iw *= beta
            self._iw2 *= beta * beta
            m2 = [[m2[0][0] * beta, m2[0][1] * beta], [m2[1][0] * beta, m2[1][1] * beta]]
        self._iw += 1.0
        self._iw2 += 1.0
        x, y = float(trace_sigma), float(grad_norm_sq)
        bx, by = x - self._imean[0], y - self._imean[1]
        mean = [self._imean[0] + bx / self._iw, self._imean[1] + by / self._iw]
        ax, ay = x - mean[0], y - mean[1]
        self._imean = mean
        self._im2 = [[m2[0][0] + bx * ax, m2[0][1] + bx * ay], [m2[1][0] + by * ax, m2[1][1] + by * ay]]

    # -- readings -----------------------------------------------------------------------------------

    def _refresh_totals(self) -> None:
        """Recompute the running (trace_sigma, grad_norm_sq) after the sums changed."""
        if self._s is None or self._g2 is None or self.steps == 0:
            self._totals = (math.nan, math.nan)
            return
        if not self._all_measured:
            self._all_measured = bool(self._weight is not None and len(self._weight) and (self._weight > 0).all())
        if self._all_measured:  # the same numbers as _corrected(...).sum(), without its mask
            if self.beta is None:
                self._totals = (float(self._s.sum()), float(self._g2.sum()))
            else:
                self._totals = (float((self._s / self._weight).sum()), float((self._g2 / self._weight).sum()))
        else:
            self._totals = (float(self._corrected(self._s).sum()), float(self._corrected(self._g2).sum()))

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
        return self._totals[1]

    @property
    def trace_sigma(self) -> float:
        """Running tr(Sigma) of the per-example gradient (NaN before the first step)."""
        return self._totals[0]

    @property
    def b_simple(self) -> float:
        """``trace_sigma / grad_norm_sq`` in examples: NaN before the first step, ``inf`` while the
        running |G|^2 is <= 0 (the gradient cannot be told from noise yet)."""
        if self.steps == 0:
            return math.nan
        return ratio(self.trace_sigma, self.grad_norm_sq)

    @property
    def effective_steps(self) -> float:
        """n_eff = (sum w)^2 / sum w^2 of the steps' weights (``beta=None``: ``steps``)."""
        return self._iw * self._iw / self._iw2 if self._iw2 > 0 else 0.0

    def b_simple_interval(self, level: float = 0.9) -> Interval:
        """Fieller's interval for ``b_simple`` at the two-sided ``level`` (module docstring): the
        steps as weighted replicates, ``high=None`` when unbounded above (``b_simple`` is then only
        a lower bound), both ``None`` before two steps (or with ``beta=0``: one step's weight)."""
        if not 0 < level < 1:
            raise BatchlabError(f"level must be in (0, 1), got {level}")
        n_eff = self.effective_steps
        method = (f"{INTERVAL_METHOD} ({self.steps} steps)" if self.beta is None
                  else f"{INTERVAL_METHOD}, EMA-weighted ({n_eff:.1f} effective of {self.steps} steps)")
        if self.steps < 2 or n_eff - 1.0 <= 1e-9:
            return Interval(None, None, level, method)
        w, w2 = self._iw, self._iw2
        # Var(weighted mean) = s^2 sum w^2 / (sum w)^2, s^2 = M2 / (sum w - sum w^2 / sum w)
        factor, denominator = w2 / (w * w), w - w2 / w
        m2 = self._im2
        return fieller_weighted(self.trace_sigma, self.grad_norm_sq, m2[0][0] * factor / denominator,
                                m2[1][1] * factor / denominator, m2[0][1] * factor / denominator, n_eff - 1.0,
                                level, method)

    def reading(self, level: float = 0.9) -> dict:
        """The estimate with its interval, JSON-ready.

        Keys: ``b_simple`` (examples; ``None`` when not resolved), ``b_simple_low`` and
        ``b_simple_high`` (the interval at ``level``; ``high=None``: no upper end, so the noise scale
        is only known to be >= ``b_simple_low``; both ``None`` before two measured steps),
        ``trace_sigma`` and ``grad_norm_sq`` (the running values; ``None`` before the first step),
        ``steps`` (measured steps), ``resolved`` (the interval has a finite upper end and the running
        |G|^2 is > 0) and ``level``.
        """
        interval = self.b_simple_interval(level)
        resolved = interval.high is not None and self.grad_norm_sq > 0
        return {"b_simple": self.b_simple if resolved else None, "b_simple_low": interval.low,
                "b_simple_high": interval.high, "trace_sigma": _finite(self.trace_sigma),
                "grad_norm_sq": _finite(self.grad_norm_sq), "steps": self.steps, "resolved": resolved,
                "level": level}

    @property
    def per_layer(self) -> dict[str, dict]:
        """Module name -> ``{"trace_sigma", "grad_norm_sq", "b_simple"}`` (running; they add up)."""
        return per_layer_table(self.names, self._corrected(self._s), self._corrected(self._g2))

    def to_dict(self, level: float = 0.9) -> dict:
        """The running estimates and the interval at ``level``, JSON-ready (non-finite as ``None``):
        ``b_simple`` (the running ratio, resolved or not), ``trace_sigma``, ``grad_norm_sq``,
        ``steps``, ``beta``, and :meth:`reading`'s ``b_simple_low``, ``b_simple_high``,
        ``resolved``, ``level``."""
        reading = self.reading(level)
        return {"b_simple": _finite(self.b_simple), "trace_sigma": reading["trace_sigma"],
                "grad_norm_sq": reading["grad_norm_sq"], "steps": self.steps, "beta": self.beta,
                "b_simple_low": reading["b_simple_low"], "b_simple_high": reading["b_simple_high"],
                "resolved": reading["resolved"], "level": level}

    # -- checkpoints --------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Plain Python state (``torch.save``/JSON-able). Call between steps: gradients recorded since
        the last :meth:`update` are not part of it."""
        return {
            "version": STATE_VERSION,
            "beta": self.beta,
            "grad_at": self.grad_at,
            "steps": self.steps,
            "calls": self.calls,
            "nonfinite_steps": self.nonfinite_steps,
            "every": self.every,
            "weight": None if self._weight is None else self._weight.tolist(),
            "names": list(self.names),
            "grad_norm_sq": None if self._g2 is None else self._g2.tolist(),
            "trace_sigma": None if self._s is None else self._s.tolist(),
            "interval": {"weight": self._iw, "weight_sq": self._iw2, "mean": [float(v) for v in self._imean],
                         "m2": [[float(v) for v in row] for row in self._im2]},
            "last": None if self.last is None else dict(self.last),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output; the parameter tensors must match in number (and in
        name where this tracker already knows them). Version 1 states (before the interval) are
        refused: their per-step spread was not kept."""
        version = state.get("version")
        if version == 1:
            raise BatchlabError("NoiseScaleTracker state version 1 has no interval statistics (added in version 2); "
                                "start a new tracker")
        if version != STATE_VERSION:
            raise BatchlabError(f"NoiseScaleTracker state version {version!r}; known: {STATE_VERSION}")
        if state.get("grad_at", "update") not in GRAD_AT:
            raise BatchlabError(f"NoiseScaleTracker state grad_at {state.get('grad_at')!r}; known: {', '.join(GRAD_AT)}")
        names = list(state["names"])
        if self.names and names and len(names) != len(self.names):
            raise BatchlabError(f"NoiseScaleTracker state has {len(names)} parameter tensors, the model {len(self.names)}")
        if self.names and names != self.names:
            raise BatchlabError("NoiseScaleTracker state names other parameters than the tracked model's")
        self.beta = state["beta"]
        self.grad_at = state.get("grad_at", "update")
        self.steps = int(state["steps"])
        self.calls = int(state.get("calls", self.steps))
        self.nonfinite_steps = int(state.get("nonfinite_steps", 0))
        self.every = int(state.get("every", 1))
        weight = state["weight"]
        if weight is None or isinstance(weight, (int, float)):  # a tracker of one common weight
            size = len(state["grad_norm_sq"]) if state["grad_norm_sq"] is not None else len(names or self.names)
            weight = None if weight is None else [float(weight)] * size
        self._weight = None if weight is None else np.array(weight, dtype=float)
        self.names = names or self.names
        self._g2 = None if state["grad_norm_sq"] is None else np.array(state["grad_norm_sq"], dtype=float)
        self._s = None if state["trace_sigma"] is None else np.array(state["trace_sigma"], dtype=float)
        interval = state["interval"]
        self._iw, self._iw2 = float(interval["weight"]), float(interval["weight_sq"])
        self._imean = [float(v) for v in interval["mean"]]
        self._im2 = [[float(v) for v in row] for row in interval["m2"]]
        if len(self._imean) != 2 or len(self._im2) != 2 or any(len(row) != 2 for row in self._im2):
            raise BatchlabError("NoiseScaleTracker state: interval mean must have 2 entries and m2 be 2 x 2")
        self.last = None if state["last"] is None else dict(state["last"])
        self._all_measured = False
        self._refresh_totals()
        self._b_simple = self.b_simple
        if self._params:
            self._sync_hooks()


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _world_size() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


__all__ = ["GRAD_AT", "NoiseScaleTracker", "fieller_weighted"]
