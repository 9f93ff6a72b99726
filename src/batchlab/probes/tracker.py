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
denominator are averaged over steps *separately* (an exponential moving average with decay ``beta``,
bias-corrected, or with ``beta=None`` the plain mean of all steps) and divided only when read:
``b_simple = trace_sigma / grad_norm_sq``. Steps are folded into the running sums in chunks
(:mod:`batchlab.probes.running_moments`): :meth:`update` only records the step's norms, every
``FOLD_EVERY`` measured steps (and at a change of the step's shape) they are folded at once, and a
reading folds a copy of the steps since then without committing it, so when and how often the loop
reads (or saves a checkpoint, which holds the unfolded steps too) does not change a bit of any later
value. Scaling the loss by a constant c (dividing each micro-batch loss by k, a GradScaler's scale)
scales both by c^2 and leaves B_simple unchanged; pass ``grad_scale=c`` to :meth:`update` to get
|G|^2 and tr(Sigma) of the unscaled mean loss.

**Interval** (:meth:`~NoiseScaleTracker.b_simple_interval`, :meth:`~NoiseScaleTracker.reading`):
Fieller's interval for the ratio of the weighted means of the per-step (tr Sigma_t, |G|^2_t), the
steps as independent replicates with the EMA's weights and n_eff - 1 Student degrees of freedom
(:class:`batchlab.probes.running_moments.RatioMoments`; the formulas, what drift does to it and its
measured coverage: docs/methods.md, "NoiseScaleTracker"). Without a finite upper end (|G|^2 not
significantly above 0) the estimate is only a lower bound: the reading is not ``resolved``.

**FSDP2.** Autograd delivers gradients to the unsharded parameters FSDP2 swaps onto the modules
for the forward and backward passes, not to the sharded ones: the tracker moves each sharded
parameter's tensor hook onto the unsharded one it sees in a forward pre-hook
(:mod:`batchlab.probes.sharded_parameters`). Tensor parallelism (a ``DTensor`` parameter that no
forward pass swaps) is not supported.

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
size. A parameter tensor without a ``.grad`` at the step (``None``: no backward pass reached it) is
left out of that step: each tensor keeps its own EMA weight or count, so its running values average
the steps it had a gradient in. One with a ``.grad`` is measured, and a backward pass of the step
that did not reach it (a mixture-of-experts route, LayerDrop) delivered it a zero gradient, which is
counted as such (``zero_grad(set_to_none=False)`` so makes an unused tensor a measured zero). Under
DDP and FSDP2 every rank calls :meth:`update` at the same steps (it may all-reduce; a rank that has
nothing to measure still takes part, and then every rank raises, instead of leaving the others
waiting in the collective); the optional ``sync`` all-reduces the small norms (one number per
parameter tensor) over ``process_group`` (default: the world; give the data-parallel group under
pipeline or tensor parallelism) so every rank holds the same estimate. To leave a step out (a
skipped optimizer step, unequal micro-batches), call :meth:`discard` instead of :meth:`update`: it
drops what was recorded since the last update.

Cost. Per backward pass, a Python call per parameter tensor (the hooks) and the norms of the
gradients the pass delivered: taken in each hook on the CPU, and under DDP or FSDP2 on any device
(so no gradient copy is held); in one process on an accelerator, kept to the end of the pass and
normed in one fused ``torch._foreach_norm`` kernel, a tensor's first gradient of the step read from
``.grad`` instead (``.grad`` was ``None``, so it is exactly that gradient, and autograd moves it
there without a copy). A pass that does not accumulate into ``.grad`` (``torch.autograd.grad``) is
counted like any other on the CPU and, on an accelerator, not when it comes before the step's first
``backward()``; keep it out of the steps. Per update: one fused norm of ``.grad``
(``grad_at="backward"``: one per backward pass) and, without collectives, no host-side arithmetic
until the next fold. On small models ``every=N`` measures one step in N and costs almost nothing on
the others (``benchmarks/probe_cost.py``; docs/methods.md, "NoiseScaleTracker", **Overhead**).
"""

from __future__ import annotations

import math
import numpy as np
import torch
from torch import nn

from batchlab.errors import BatchlabError
from batchlab.probes.noise_scale import INTERVAL_METHOD, Interval, moments_from_norms, per_layer_table, ratio
from batchlab.probes.recorded_steps import (
    RecordedSteps,
    RunningState,
    device_row,
    folded,
    host_matrix,
    host_row,
    running_state,
)
from batchlab.probes.running_moments import RatioMoments, TensorSums
from batchlab.probes.sharded_parameters import ShardedParameters, sharded_indices
from batchlab.probes.step_collectives import reduced_norms

STATE_VERSION = 3
GRAD_AT = ("update", "backward")
FOLD_EVERY = 64  # measured steps recorded before they are folded into the running sums at once
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


class NoiseScaleTracker:
    """Running B_simple of a training loop from micro-batch (or local) and step gradients, with its interval.

    ``model_or_params``: a module (a ``DistributedDataParallel`` or ``fully_shard`` one included),
    an iterable of parameters, or of ``(name, parameter)`` (FSDP2 needs the module); hooks are
    registered on its trainable parameters at construction (``None``: at the first :meth:`update`,
    which then has no small gradients and only registers). ``beta``: the EMA decay per step (``None``:
    the plain mean over all steps). ``sync``: under an initialized ``torch.distributed`` with more than
    one worker, average the small norms over the workers of ``process_group`` (default: the world).
    ``every``: measure one step in ``every`` (the update calls 0, every, 2 every, ...; the hooks are
    off in between, so unmeasured steps cost nothing but the call); ``beta`` then applies per
    measured step. ``grad_at``: where the big gradient (``.grad``) is read, ``"update"`` (at
    :meth:`update`) or ``"backward"`` (at the end of the last backward pass before it, before
    clipping can rewrite ``.grad``). ``steps`` counts measured steps, ``calls`` all update calls. See
    the module docstring for the arithmetic, the interval and the calling contract.
    """

    def __init__(self, model_or_params=None, *, beta: float | None = 0.99, sync: bool = True, every: int = 1,
                 grad_at: str = "update", process_group=None):
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
        self.process_group = process_group
        self.calls = 0  # update() calls, measured or not
        self._removed = False
        self.names: list[str] = []
        self._params: list[torch.Tensor] = []
        self._targets: list[torch.Tensor] = []  # per parameter: the tensor autograd delivers its gradient to
        self._natural: list[int] = []  # the parameter order, 0..n-1 (a pass's hook order, when they agree)
        self._handles: dict[int, object] = {}
        self._sharded: ShardedParameters | None = None  # FSDP2
        self._pending: list[tuple[list[int], list[torch.Tensor]]] = []  # per backward: (indices, norms)
        self._seen: list[tuple[int, torch.Tensor]] = []  # the backward pass in progress
        self._big: tuple[list[int], list[torch.Tensor]] | None = None  # grad_at="backward": the last pass's read
        self._queued = False
        self._source = None
        # the committed running state (folded steps) and the measured steps recorded since
        self._sums: TensorSums | None = None
        self._moments = RatioMoments()
        self._steps = 0
        # measured steps whose |G|^2 or tr(Sigma) came out non-finite (an overflowed mixed-precision step):
        # left out, as the optimizer (a GradScaler) leaves them out, instead of poisoning every later reading
        self._nonfinite = 0
        self._last: dict | None = None
        self._recorded: RecordedSteps | None = None
        self._folded: RunningState | None = None  # the reading state, until the next change
        self._host = True  # the parameters are on the CPU: norms leave torch as Python floats at once
        self._rows_checked = True  # every recorded step is known to be finite (host rows are checked when recorded)
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
        if self._sums is not None and len(self._sums.weight) != len(names):
            raise BatchlabError(f"NoiseScaleTracker state has {len(self._sums.weight)} parameter tensors, "
                                f"the model {len(names)}")
        self.names = names
        self._source = model_or_params
        self._params = [p for _, p in named]
        self._targets = list(self._params)
        self._natural = list(range(len(self._params)))  # the hook order of a pass equal to parameter order
        self._pending = []
        self._seen = []
        self._big = None
        self._queued = False
        if self._sums is None:
            self._sums = TensorSums.empty(len(named))
        self._folded = None
        indices = sharded_indices(self._params)
        if indices:
            self._sharded = ShardedParameters(model_or_params, self._params, self.names, indices, self._retarget)
        self._host = all(t.device.type == "cpu" for t in self._params)
        self._read_first = self._may_read_first()
        # and under DDP or FSDP2 on any device: keeping a pass's gradients to its end would hold a full
        # (under FSDP2: unsharded) gradient copy alive, the memory data parallelism exists to save
        self._norm_in_hook = self._host or bool(indices) or _world_size(self.process_group) > 1
        # A tensor hook on each parameter sees its incoming gradient before it is added to .grad (and,
        # under DDP, before the all-reduce). Where it does not norm it (above), the hook only keeps a
        # reference; the norms of all of a backward pass's gradients are taken together, in one fused
        # kernel, by a callback queued on the autograd engine for the end of that pass (what DDP itself
        # uses to finalize a backward): measured, this costs ~1/20 of a norm per hook
        # (torch.autograd.graph.register_multi_grad_hook, the public alternative, costs a third of a
        # small model's backward pass).
        self._sync_hooks()

    def _retarget(self, i: int, tensor: torch.Tensor) -> None:
        """FSDP2: parameter ``i``'s gradient is delivered to ``tensor`` (its unsharded parameter)."""
        if tensor is self._targets[i]:
            return
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
        if self._sharded is not None or _world_size(self.process_group) > 1:
            return False
        if type(self._source).__name__ in ("DistributedDataParallel", "FullyShardedDataParallel"):
            return False
        return all(getattr(t, "_post_accumulate_grad_hooks", None) is None for t in self._targets)

    def _hook(self, i: int):
        target = self._targets[i]
        # a dense gradient of full precision is normed directly (the hook runs per tensor and pass)
        plain = target.layout == torch.strided and target.dtype not in _LOW_PRECISION
        vector_norm = torch.linalg.vector_norm

        def hook(grad: torch.Tensor) -> None:
            if not self._queued:
                self._queued = True
                try:
                    torch.autograd.Variable._execution_engine.queue_callback(self._flush)
                except (AttributeError, RuntimeError):  # no engine callback: measure at update()
                    self._read_first = False
            if self._norm_in_hook:
                if plain and not grad.requires_grad and grad.layout == torch.strided:
                    self._seen.append((i, vector_norm(grad)))
                else:
                    self._seen.append((i, _norm(grad)))
            elif self._read_first and target.grad is None:
                # the step's first gradient of this tensor: .grad is exactly it at the end of the pass
                self._seen.append((i, None))
            else:
                self._seen.append((i, grad))

        return hook

    def _flush(self) -> None:
        """End of a backward pass: the norms of the gradients it delivered (a tensor's first of the
        step read from its ``.grad``, see ``_read_first``); with ``grad_at="backward"`` it queues the
        read of ``.grad`` behind the callbacks already queued (DDP's and FSDP2's reductions)."""
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
        if self._sharded is not None:
            for i in self._sharded.indices:
                if grads[i] is not None:
                    grads[i] = grads[i].to_local()
        if all(g is not None for g in grads):
            return self._natural, _norms(grads)
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
        if self._sharded is not None:
            self._sharded.remove()
        self._sync_hooks()

    # -- the step -----------------------------------------------------------------------------------

    def update(self, model_or_params=None, *, batch_size: int, world_size: int | None = None,
               grad_scale: float = 1.0) -> None:
        """Record this step: the small gradients recorded since the last call and ``.grad``.

        ``batch_size``: examples in the step's ``.grad`` (over all micro-batches and workers);
        ``world_size``: data-parallel workers averaged into ``.grad`` (default: the size of the
        initialized ``torch.distributed`` ``process_group``, else 1); ``grad_scale``: the factor the
        back-propagated loss carries relative to a micro-batch's mean loss (see the module
        docstring). Returns nothing: read :attr:`b_simple` or :meth:`reading` when needed (a reading
        folds the recorded steps; the step itself does no host-side arithmetic).
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
        group_size = _world_size(self.process_group)
        if world_size is None:
            world_size = group_size
        if self._read_first and world_size > 1 and group_size > 1:
            self._read_first = False  # torch.distributed started after the tracker (from the next step)
        if not (isinstance(batch_size, int) and batch_size > 0) or not (isinstance(world_size, int) and world_size >= 1):
            raise BatchlabError(f"batch_size and world_size must be positive integers, got {batch_size}, {world_size}")
        if not (isinstance(grad_scale, (int, float)) and math.isfinite(grad_scale) and grad_scale > 0):
            raise BatchlabError(f"grad_scale must be a positive finite number, got {grad_scale!r}")
        measured = self.calls % self.every == 0
        self.calls += 1
        try:
            if not measured:
                self._pending, self._seen, self._big = [], [], None
                return None
            self._measure(batch_size, world_size, float(grad_scale), group_size)
        finally:
            self._sync_hooks()
        return None

    def _local_problem(self, pending, big) -> str | None:
        """Why this rank has nothing to measure at this step, or None."""
        if not pending:
            return "NoiseScaleTracker.update: no gradients since the last update; call it after backward()"
        if self._sharded is not None:
            unswapped = self._sharded.unswapped(self._targets)
            if unswapped:
                return (f"NoiseScaleTracker: sharded parameter {unswapped[0]!r} was never replaced by an unsharded one "
                        "in a forward pass; allowed sharding: FSDP2 (fully_shard), not tensor parallelism")
        if self.grad_at == "backward" and big is None:
            return ("NoiseScaleTracker(grad_at='backward') saw no end of a backward pass since the last update; "
                    "call update() after backward()")
        return None

    def _collective(self, world_size: int, group_size: int) -> bool:
        """Whether this step all-reduces (the same answer on every rank)."""
        return (self.sync and world_size > 1 and group_size == world_size) or (
            self._sharded is not None and bool(self._sharded.groups))

    def _measure(self, batch_size: int, world_size: int, grad_scale: float, group_size: int) -> None:
        if self._seen:  # a backward pass whose end-of-pass callback did not run
            self._flush()
        pending, self._pending = self._pending, []
        big, self._big = self._big, None
        k = len(pending)  # backward passes in the step
        collective = self._collective(world_size, group_size)
        problem = self._local_problem(pending, big)
        if problem is not None and not collective:
            raise BatchlabError(problem)
        if problem is None and self.grad_at == "update":
            big = self._read_big()
        big_b = float(batch_size)
        if problem is None and big_b / (world_size * k) >= big_b:
            raise BatchlabError(
                "one gradient of one batch size per step gives no noise-scale estimate; split the step into >= 2 "
                "micro-batches (gradient accumulation) or run data parallel (world_size > 1)"
            )
        n = len(self._params)
        if problem is None:
            big_index, big_norms = big
            order = pending[0][0]
            regular = len(big_index) == n and all(len(present) == n and present == order for present, _ in pending)
            if regular and not collective:  # the usual step: recorded, folded later
                self._record(k, order, [v for _, values in pending for v in values] + list(big_norms),
                             (big_b, big_b / (world_size * k), grad_scale * grad_scale))
                return
        self._commit()
        if problem is None:
            small, big_sq, used = self._step_norms(pending, big, n)
        else:  # take part in the collectives, then fail with every other rank
            small, big_sq, used = np.zeros(n), np.zeros(n), None
        if collective:
            small, big_sq, failed = reduced_norms(
                small, big_sq, world_size=world_size, sync=self.sync and world_size > 1 and group_size == world_size,
                process_group=self.process_group, device=self._params[0].device, failed=problem is not None,
                shard_groups=self._sharded.groups if self._sharded is not None else [])
            if problem is not None:
                raise BatchlabError(problem)
            if failed:
                raise BatchlabError(f"NoiseScaleTracker.update: {failed} other worker(s) had nothing to measure at this "
                                    "step (see their error); every worker calls update() after its backward passes")
        if used is not None and len(used) == 0:
            raise BatchlabError("NoiseScaleTracker.update: no parameter has both micro-batch gradients and a .grad")
        scale2 = grad_scale * grad_scale
        small, big_sq = small / scale2, big_sq / (k * k * scale2)
        b = big_b / (world_size * k)
        if used is None:
            g2, s = moments_from_norms(small, big_sq, b, big_b)
        else:
            g2, s = moments_from_norms(small[used], big_sq[used], b, big_b)
        if not (np.all(np.isfinite(g2)) and np.all(np.isfinite(s))):
            self._nonfinite += 1  # after the step's collectives: a rank leaving it out cannot hang the others
            self._folded = None
            return
        if used is None:
            self._sums = self._sums.folded(g2[None], s[None], self.beta)
        else:
            self._sums = self._sums.folded_some(used, g2, s, self.beta)
        self._fold_totals(np.array([float(np.sum(s))]), np.array([float(np.sum(g2))]), [(big_b, b)])

    def _step_norms(self, pending, big, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """One step's per-tensor mean squared small norm and squared ``.grad`` norm (parameter order),
        and the tensors measured (None: all). A tensor with a ``.grad`` is measured; a pass that did
        not reach it delivered it a zero gradient."""
        big_index, big_norms = big
        k = len(pending)  # a pass that did not reach a tensor delivered it a zero gradient
        norms = [v for _, vs in pending for v in vs] + list(big_norms)
        values = np.array(host_row(norms)) if self._host else host_matrix([device_row(norms)])[0]
        values *= values
        n_small = sum(len(present) for present, _ in pending)
        index = np.array([i for present, _ in pending for i in present], dtype=int)
        small = np.bincount(index, weights=values[:n_small], minlength=n) / k
        big_sq = np.zeros(n)
        big_sq[list(big_index)] = values[n_small:]
        counts = np.bincount(index, minlength=n)
        if len(big_index) == n and bool((counts > 0).all()):
            return small, big_sq, None
        return small, big_sq, np.array([i for i in big_index if counts[i] > 0], dtype=int)

    # -- folding ------------------------------------------------------------------------------------

    def _record(self, k: int, order: list[int], norms: list, sizes: tuple[float, float, float]) -> None:
        """Keep a usual step's norms until the next fold (``FOLD_EVERY`` steps, a change of shape, a reading)."""
        recorded = self._recorded
        if recorded is not None and (recorded.micro_batches != k or recorded.order != order):
            self._commit()
            recorded = None
        if self._host:
            row = host_row(norms)
            if not math.isfinite(sum(row)):  # norms are >= 0: the sum is finite exactly when each one is
                self._nonfinite += 1
                self._folded = None
                return
        else:
            row = device_row(norms)
            self._rows_checked = False  # its finiteness is known when it is folded
        if recorded is None:
            recorded = self._recorded = RecordedSteps(k, list(order), [], [])
        recorded.rows.append(row)
        recorded.sizes.append(sizes)
        self._folded = None
        if len(recorded.rows) >= FOLD_EVERY:
            self._commit()

    def _commit(self) -> None:
        """Fold the recorded steps into the running state."""
        if self._recorded is None:
            return
        state = self._state()  # a reading since the last change folded exactly these steps already
        self._sums, self._moments, self._steps = state.sums, state.moments, state.steps
        self._nonfinite, self._last = state.nonfinite_steps, state.last
        self._recorded = None
        self._rows_checked = True

    def _committed(self) -> RunningState:
        return running_state(self._sums, self._moments, self._steps, self._nonfinite, self._last, self.beta)

    def _fold_totals(self, x: np.ndarray, y: np.ndarray, sizes: list[tuple[float, float]]) -> None:
        """Commit one eagerly folded step's totals: the interval's moments, the count, ``last``."""
        self._moments = self._moments.folded(x, y, self.beta)
        self._steps += len(x)
        self._last = {"step": self._steps, "small_batch_size": sizes[-1][1], "batch_size": int(sizes[-1][0]),
                      "grad_norm_sq": float(y[-1]), "trace_sigma": float(x[-1])}
        self._folded = None

    def _state(self) -> RunningState:
        """The state readings use: the committed one with the recorded steps folded in (a copy)."""
        if self._folded is None:
            self._folded = self._committed()
            if self._recorded is not None:
                self._folded = folded(self._folded, self._recorded, self._natural, self.beta)
        return self._folded

    # -- readings -----------------------------------------------------------------------------------

    @property
    def steps(self) -> int:
        """Measured steps folded into the estimate (a non-finite one is not counted)."""
        if self._recorded is None:
            return self._steps
        if self._rows_checked:  # every recorded step is finite: no fold needed to count them
            return self._steps + len(self._recorded.rows)
        return self._state().steps

    @property
    def nonfinite_steps(self) -> int:
        """Measured steps left out because their |G|^2 or tr(Sigma) was not finite (an overflowed step)."""
        return self._nonfinite if self._recorded is None or self._rows_checked else self._state().nonfinite_steps

    @property
    def last(self) -> dict | None:
        """The last measured step's own values: ``step``, ``small_batch_size`` (b), ``batch_size`` (B),
        ``grad_norm_sq`` and ``trace_sigma`` (its totals over parameter tensors); None before one."""
        last = self._state().last
        return None if last is None else dict(last)

    @property
    def grad_norm_sq(self) -> float:
        """Running |G|^2 (bias-corrected EMA or mean over steps; NaN before the first step)."""
        state = self._state()
        return state.totals[1] if state.steps else math.nan

    @property
    def trace_sigma(self) -> float:
        """Running tr(Sigma) of the per-example gradient (NaN before the first step)."""
        state = self._state()
        return state.totals[0] if state.steps else math.nan

    @property
    def b_simple(self) -> float:
        """``trace_sigma / grad_norm_sq`` in examples: NaN before the first step, ``inf`` while the
        running |G|^2 is <= 0 (the gradient cannot be told from noise yet)."""
        state = self._state()
        if state.steps == 0:
            return math.nan
        return ratio(*state.totals)

    @property
    def effective_steps(self) -> float:
        """n_eff = (sum w)^2 / sum w^2 of the steps' weights (``beta=None``: ``steps``)."""
        return self._state().moments.effective_steps

    def b_simple_interval(self, level: float = 0.9) -> Interval:
        """Fieller's interval for ``b_simple`` at the two-sided ``level`` (module docstring): the
        steps as weighted replicates, ``high=None`` when unbounded above (``b_simple`` is then only
        a lower bound), both ``None`` before two steps (or with ``beta=0``: one step's weight)."""
        if not 0 < level < 1:
            raise BatchlabError(f"level must be in (0, 1), got {level}")
        state = self._state()
        n_eff = state.moments.effective_steps
        method = (f"{INTERVAL_METHOD} ({state.steps} steps)" if self.beta is None
                  else f"{INTERVAL_METHOD}, EMA-weighted ({n_eff:.1f} effective of {state.steps} steps)")
        if state.steps < 2:
            return Interval(None, None, level, method)
        return state.moments.interval(state.totals[0], state.totals[1], level, method)

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
        state = self._state()
        if state.sums is None or state.steps == 0:
            nan = np.full(len(self.names), math.nan)
            return per_layer_table(self.names, nan, nan)
        return per_layer_table(self.names, *state.sums.corrected(self.beta))

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
        """Plain Python state (``torch.save``/JSON-able): the folded sums and the measured steps
        recorded since (``recorded``), so a restored tracker folds them where this one would;
        ``steps`` and ``nonfinite_steps`` count both. Call
        between steps: gradients of a step in progress are not part of it."""
        recorded = self._recorded
        sums = self._sums
        return {
            "version": STATE_VERSION,
            "beta": self.beta,
            "grad_at": self.grad_at,
            "steps": self.steps,
            "calls": self.calls,
            "nonfinite_steps": self.nonfinite_steps,
            "every": self.every,
            "weight": None if sums is None else sums.weight.tolist(),
            "names": list(self.names),
            "grad_norm_sq": None if sums is None else sums.grad_norm_sq.tolist(),
            "trace_sigma": None if sums is None else sums.trace_sigma.tolist(),
            "interval": self._moments.to_state(),
            "last": None if self._last is None else dict(self._last),
            "recorded": None if recorded is None else recorded.to_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output, settings included (``beta``, ``every`` and ``grad_at``
        replace the constructor's: a resumed run goes on as the saved one); the parameter tensors must
        match in number (and in name where this tracker already knows them). Version 2 states
        (before the recorded steps) load with none recorded; version 1 states (before the interval) are
        refused: their per-step spread was not kept."""
        version = state.get("version")
        if version == 1:
            raise BatchlabError("NoiseScaleTracker state version 1 has no interval statistics (added in version 2); "
                                "start a new tracker")
        if version not in (2, STATE_VERSION):
            raise BatchlabError(f"NoiseScaleTracker state version {version!r}; known: 2, {STATE_VERSION}")
        if state.get("grad_at", "update") not in GRAD_AT:
            raise BatchlabError(f"NoiseScaleTracker state grad_at {state.get('grad_at')!r}; known: {', '.join(GRAD_AT)}")
        names = list(state["names"])
        if self.names and names and len(names) != len(self.names):
            raise BatchlabError(f"NoiseScaleTracker state has {len(names)} parameter tensors, the model {len(self.names)}")
        if self.names and names != self.names:
            raise BatchlabError("NoiseScaleTracker state names other parameters than the tracked model's")
        try:
            moments = RatioMoments.from_state(state["interval"])
        except (KeyError, TypeError, ValueError) as error:
            raise BatchlabError(f"NoiseScaleTracker state: bad interval entry ({error})") from None
        self.beta = state["beta"]
        self.grad_at = state.get("grad_at", "update")
        self._steps = int(state["steps"])
        self.calls = int(state.get("calls", self._steps))
        self._nonfinite = int(state.get("nonfinite_steps", 0))
        self.every = int(state.get("every", 1))
        weight = state["weight"]
        if weight is None or isinstance(weight, (int, float)):  # a tracker of one common weight
            size = len(state["grad_norm_sq"]) if state["grad_norm_sq"] is not None else len(names or self.names)
            weight = None if weight is None else [float(weight)] * size
        self.names = names or self.names
        if weight is None or state["grad_norm_sq"] is None or state["trace_sigma"] is None:
            self._sums = None if not self.names else TensorSums.empty(len(self.names))
        else:
            self._sums = TensorSums(np.array(weight, dtype=float), np.array(state["grad_norm_sq"], dtype=float),
                                    np.array(state["trace_sigma"], dtype=float))
        self._moments = moments
        self._last = None if state["last"] is None else dict(state["last"])
        recorded = state.get("recorded")
        self._recorded = None if recorded is None else RecordedSteps.from_state(recorded)
        bad = 0 if recorded is None else self._recorded.nonfinite_rows()
        if recorded is not None:  # the counts include the recorded steps (a non-finite one: on an accelerator)
            self._steps -= len(self._recorded.rows) - bad
            self._nonfinite -= bad
        self._rows_checked = bad == 0
        self._folded = None
        if self._params:
            self._sync_hooks()
        else:  # restored before it knows the model: readings fold in the state's parameter order
            self._natural = list(range(len(self.names)))


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _world_size(group=None) -> int:
    """Workers in ``group`` (default: the world) of an initialized ``torch.distributed``, else 1."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group)
    return 1


__all__ = ["FOLD_EVERY", "GRAD_AT", "NoiseScaleTracker"]
