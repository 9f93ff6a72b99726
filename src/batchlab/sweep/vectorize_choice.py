"""The automatic choice of vectorized trials: measured exactness, and measured cost.

:func:`vectorized_identical` answers whether one task's K trials, run as one stacked computation
(:class:`batchlab.sweep.vectorized.StackedTrials`), compute on this machine exactly what each computes
alone, to the bit: a self-check trains a few steps at every stack size the run can reach and compares
every result to the sequential one. A measurement, not a promise: batched and unbatched matrix
products are not bitwise equal on every CPU (instruction set, BLAS kernel, thread count) or GPU.
:func:`vectorization_pays` answers whether vectorizing them is exact here AND cheaper per trial
(timing a few steps and one evaluation batch of both paths on copies: :func:`vectorization_costs`,
:class:`VectorizationCost`, CPU seconds of this process on a CPU), never by a fixed threshold, so that
``vectorize = "auto"`` never changes a result. Answers are cached per kind of task in this process.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from batchlab.sweep.fused_mlp import mlp_layers
from batchlab.sweep.vectorized import (
    NotVectorizable,
    StackedTrials,
    eval_batch_size,
    shared_order_seed,
    vectorization_obstacle,
)
from batchlab.train import TrialSpec, prepare_trial
from batchlab.train.device import fork_rng
from batchlab.train.evaluation import measure
from batchlab.train.sampling import BatchSampler
from batchlab.train.trial import order_seed

@dataclass(frozen=True)
class VectorizationCost:
    """Estimated seconds per trial of one study's trials run one at a time (``sequential``) and as one
    vectorized computation (``vectorized``): training steps plus full evaluations (the goal-only and
    replay measurements cost the same on both paths and are left out); ``exact``: the exactness
    self-check (:func:`vectorization_costs`) found every stacked result equal to the sequential one,
    to the bit."""

    sequential: float
    vectorized: float
    exact: bool = False

    @property
    def ratio(self) -> float:
        """``sequential / vectorized``: above 1 vectorizing pays."""
        return self.sequential / self.vectorized if self.vectorized > 0 else math.inf


#: ``vectorization_pays`` answers, by (workload key, the model's parameter names, shapes and dtypes
#: and module classes, optimizer, batch size, K, device, shared order).
_PAYS: dict[tuple, bool] = {}

_TIMED_SECONDS = 0.02  # each timed run lasts about this long (at least 2 steps)
_CHECK_STEPS = 2  # training steps of the exactness self-check


def _clock(device: torch.device) -> Callable[[], float]:
    """CPU seconds of this process on a CPU (other processes sharing the cores do not count), wall
    seconds after a synchronisation on an accelerator (CUDA, MPS)."""
    if device.type == "cpu":
        return time.process_time

    def clock() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elif device.type == "mps":
            torch.mps.synchronize()
        return time.perf_counter()

    return clock


def _per_call(fn: Callable[[int], Any], clock: Callable[[], float], repeats: int = 3) -> float:
    """Seconds per call of ``fn(i)`` (``i`` = 0, 1, ...): the best of ``repeats`` timed runs, each
    about ``_TIMED_SECONDS`` long, after one warm-up call."""
    calls = 0

    def run(n: int) -> float:
        nonlocal calls
        start = clock()
        for _ in range(n):
            fn(calls)
            calls += 1
        return clock() - start

    run(1)
    once = max(run(1), 1e-6)
    n = max(2, min(200, int(_TIMED_SECONDS / once)))
    return min(run(n) for _ in range(repeats)) / n


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values (``torch.equal``), NaN where the other has NaN counting as equal."""
    return a.shape == b.shape and a.dtype == b.dtype and bool(((a == b) | (a.isnan() & b.isnan())).all())


def _same_number(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _same_metrics(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(_same_number(a[name], b[name]) for name in a)


def _stack_sizes(k: int) -> list[int]:
    """The numbers of stacked trials the exactness self-check runs, largest first: every one from 1 to
    ``min(K, 16)``, and ``K`` halved down to 16 (the stacked state shrinks as trials stop, and the
    kernel torch picks for a product may depend on its size)."""
    sizes, size = set(range(1, min(k, 16) + 1)), k
    while size > 16:
        sizes.add(size)
        size //= 2
    return sorted(sizes, reverse=True)


def _eval_batches(stack: StackedTrials, first: Any) -> list[tuple[torch.Tensor, dict]]:
    """One batch of every input shape a full evaluation of ``first``'s splits streams (each split's
    first batch and its last, partial one, on that split's own data; the first of equal shapes):
    ``(x, split)``, ``x`` the batch's inputs on the device and ``split`` ``{name: the batch as a
    split}``."""
    from batchlab.workloads.data import as_split
    from batchlab.workloads.metrics import prepared_split

    caps = first.workload.eval_examples or {}
    batches: dict[tuple, tuple[torch.Tensor, dict]] = {}
    for name, data in first.eval_splits.items():
        part = prepared_split(as_split(data, name), name, caps.get(name))
        size = eval_batch_size(first.workload, stack.eval_model, part, first.device)
        for begin in sorted({0, (len(part) - 1) // size * size}):
            one = part.subset(torch.arange(begin, min(len(part), begin + size)))
            x = one.batch(torch.arange(len(one)))[0].to(first.device)
            batches.setdefault(tuple(x.shape), (x, {name: one}))
    return list(batches.values())


def _exactness(stack: StackedTrials, prepared: list) -> bool:
    """The exactness self-check: whether what the stacked trials compute equals what each computes
    alone, to the bit (``torch.equal``; NaN equal to NaN).

    Runs ``_CHECK_STEPS`` training steps of every trial alone (its torch optimizer, as
    :func:`batchlab.train.run_trial`; this trains ``prepared``'s models) and of all K stacked from the
    initial stacked state, and one step of the first K' stacked for every other K' of
    :func:`_stack_sizes` (the stacked state shrinks as trials stop); compares each step's losses,
    raw gradients (before an update could round a difference away) and the parameters after it.
    Then, when full evaluations go through :func:`measure_stacked`, for every evaluation batch shape
    on each split's own data (:func:`_eval_batches`), each model's raw outputs alone and stacked
    (the first K' of the trained K, for every K' >= 2 of :func:`_stack_sizes`: a single trial is
    measured alone), and at K its metrics too (:func:`measure` against :func:`measure_stacked`)."""
    k, steps = len(prepared), range(_CHECK_STEPS)
    initial = stack.params, stack.buffers, stack.opt_state
    alone: list[list[tuple]] = []  # per trial, per step: (loss, gradients, parameters after the step)
    for i, p in enumerate(prepared):
        named = dict(p.model.named_parameters())
        record = []
        for step in steps:
            loss = p.algorithm.step(*stack.batch(stack.samplers[i].indices(step)))
            record.append((loss, {n: None if v.grad is None else v.grad.detach().clone() for n, v in named.items()},
                           {n: v.detach().clone() for n, v in named.items()}))
        alone.append(record)

    def train(size: int, count: int) -> tuple[dict, dict] | None:
        """``count`` steps of the first ``size`` trials stacked; their state, or None at a difference."""
        trials = list(range(size))
        params, buffers, opt_state = ({n: v[:size].clone() for n, v in initial[0].items()},
                                      {n: v[:size].clone() for n, v in initial[1].items()},
                                      {s: {n: v[:size].clone() for n, v in d.items()} for s, d in initial[2].items()})
        for step in range(count):
            gradients: list = []
            losses = stack.advance(params, buffers, opt_state, trials, step, gradients)
            for i in trials:
                loss, grads, after = alone[i][step]
                if not (_same_number(losses[i], loss)
                        and all(g is not None and _same_tensor(gradients[0][n][i], g) for n, g in grads.items())
                        and all(_same_tensor(params[n][i], v) for n, v in after.items())):
                    return None
        return params, buffers

    trained = train(k, len(steps))
    if trained is None or any(train(size, 1) is None for size in _stack_sizes(k) if size < k):
        return False
    params, buffers = trained
    evaluations = _eval_batches(stack, prepared[0]) if stack.evaluates_together() and prepared[0].full_steps else []
    for e, (x, one) in enumerate(evaluations):
        alone_outputs = []
        for p in prepared:
            was_training = p.model.training
            p.model.eval()
            try:
                with torch.inference_mode():
                    alone_outputs.append(p.model(x))
            finally:
                p.model.train(was_training)
        for size in (s for s in _stack_sizes(k) if s >= 2):
            with torch.inference_mode():
                outputs = stack.forward({n: v[:size] for n, v in params.items()},
                                        {n: v[:size] for n, v in buffers.items()}, x)
            if not all(_same_tensor(outputs[i], alone_outputs[i]) for i in range(size)):
                return False
        rows = stack.measure_rows(params, buffers, one)  # the metrics from equal outputs: once, at K
        if not all(_same_metrics(rows[i], measure(p.workload, p.model, one)) for i, p in enumerate(prepared)):
            return False
    return True


def vectorization_costs(specs: list[TrialSpec], check_exact: bool | str = True) -> VectorizationCost:
    """Measure what ``specs`` cost per trial one at a time and vectorized, and whether the vectorized
    results are exact (:class:`VectorizationCost`).

    On copies (the specs' own prepared trials, built and trained here and thrown away; in a forked
    RNG state, so nothing of any trial's run changes):

    * **exactness** (:func:`vectorized_identical`, on fresh copies; ``check_exact``: ``True``, always;
      ``False``, never, and ``exact`` is ``False``; ``"if cheaper"``, only when the vectorized path is
      measured cheaper, what :func:`vectorization_pays` asks, as the check costs about ``K / 2`` times
      the stacked steps it runs): a few training steps of every trial alone and of the trials stacked
      (for every number of stacked trials the run can reach as trials stop, up to a bound:
      :func:`_stack_sizes`), comparing their losses, raw gradients and parameters, and the raw
      outputs and metrics of every evaluation batch shape a full evaluation uses (each split's first
      and last batch, on its own data), with ``torch.equal`` (NaN equal to NaN): ``exact`` is all of
      them equal. A measurement, not an assumption: torch picks its CPU kernels by the products'
      sizes, the CPU's instruction set and the thread count, and for small products (``N x in x
      out`` below about 400 on torch 2.13), on some CPUs, or with several threads, the batched
      products round differently from ``torch.nn.Linear``'s. As kernels are chosen by shape, a
      difference shows on these shapes; equality on a few steps and batches is strong evidence, not
      a proof (the check's limit);
    * **cost**: a few training steps of one trial with its torch optimizer (what
      :func:`batchlab.train.run_trial` runs) against the same steps of all K stacked
      (:class:`StackedTrials`, the path :func:`run_trials_vectorized` takes: fused or ``vmap``, shared
      or own batch orders), and one evaluation batch of one model against the K together. Per trial:
      ``steps x step + full evaluation batches x batch``, the vectorized costs divided by K. CPU time
      on a CPU (robust to other processes), wall time on an accelerator.

    Raises:
        NotVectorizable: as :func:`run_trials_vectorized` (nothing trained).
        BatchlabError: a spec is invalid.
    """
    obstacle = vectorization_obstacle(specs)
    if obstacle is not None:
        raise NotVectorizable(f"cannot vectorize these trials: {obstacle}")
    from batchlab.workloads.data import as_split

    k = len(specs)
    with torch.random.fork_rng(devices=[]):
        prepared = [prepare_trial(spec) for spec in specs]
        first = prepared[0]
        with fork_rng(first.device):
            stack = StackedTrials(prepared)
            clock = _clock(first.device)
            params, buffers, opt_state = stack.params, stack.buffers, stack.opt_state
            sampler = BatchSampler(first.num_train, stack.batch_size, order_seed(first.spec))
            step_fn, batch, trials = first.algorithm.step, stack.batch, list(range(k))
            sequential_step = _per_call(lambda i: step_fn(*batch(sampler.indices(i))), clock)
            vectorized_step = _per_call(lambda i: stack.advance(params, buffers, opt_state, trials, i), clock)
            batches, sequential_eval, vectorized_eval = 0, 0.0, 0.0
            if stack.evaluates_together() and first.full_steps:
                name, data = next(iter(first.eval_splits.items()))
                part = as_split(data, name)
                size = eval_batch_size(first.workload, stack.eval_model, part, first.device)
                per_evaluation = sum(math.ceil(len(as_split(d, n)) / size) for n, d in first.eval_splits.items())
                batches = len(first.full_steps) * per_evaluation
                one = {name: part.subset(torch.arange(min(len(part), size)))}
                sequential_eval = _per_call(lambda i: measure(first.workload, first.model, one), clock)
                vectorized_eval = _per_call(lambda i: stack.measure_rows(params, buffers, one), clock)
            steps = first.steps
            cost = VectorizationCost(sequential=steps * sequential_step + batches * sequential_eval,
                                     vectorized=(steps * vectorized_step + batches * vectorized_eval) / k)
    if check_exact is True or (check_exact == "if cheaper" and cost.vectorized < cost.sequential):
        # on fresh copies (the timing trained these), whose model the timed stack already checked
        cost = replace(cost, exact=vectorized_identical(specs, check_model=False))
    return cost


@contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` torch threads (``None``: as they are), restored afterwards."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if threads is not None:
            torch.set_num_threads(before)


def vectorized_identical(specs: list[TrialSpec], threads: int | None = None, check_model: bool = True) -> bool:
    """Whether the trials ``specs``, run as one vectorized computation, compute on this machine what each
    computes alone, to the bit (the exactness self-check, :func:`_exactness`: a few training steps at
    every stack size the run can reach, and every evaluation batch shape, compared with
    ``torch.equal``).

    On fresh copies (the specs' own prepared trials, built, trained and thrown away here; in a forked
    RNG state, so nothing of any trial's run changes) and with ``threads`` torch threads (``None``: the
    caller's; a sweep's driver passes 1, the thread count of its workers,
    :func:`batchlab.sweep.executors.set_worker_threads`, as the blocking of a product, and so its
    rounding, may depend on it). What ``vectorize = "auto"`` requires before it vectorizes
    (:func:`vectorization_pays`), and what a sweep's driver asks before it forces
    ``vectorize = "always"`` (:func:`batchlab.sweep.runner.prepare_sweep`). ``check_model=False``
    skips the stack's model check (:class:`batchlab.sweep.vectorized.StackedTrials`), for a caller
    that already built a checked stack of these specs.

    Raises:
        NotVectorizable: as :func:`run_trials_vectorized` (the specs or their model cannot run
            vectorized).
        BatchlabError: a spec is invalid.
    """
    obstacle = vectorization_obstacle(specs)
    if obstacle is not None:
        raise NotVectorizable(f"cannot vectorize these trials: {obstacle}")
    with torch.random.fork_rng(devices=[]), _torch_threads(threads):
        fresh = [prepare_trial(spec) for spec in specs]
        with fork_rng(fresh[0].device):
            return _exactness(StackedTrials(fresh, check=check_model), fresh)


def _model_signature(model: nn.Module) -> tuple:
    """What of a built model keys the cached answers: its parameters' names, shapes and dtypes and its
    modules' classes (an edited workload that keeps its name gets a new key when its model changes)."""
    return (tuple((name, tuple(p.shape), str(p.dtype)) for name, p in model.named_parameters()),
            tuple(f"{type(m).__module__}.{type(m).__qualname__}" for m in model.modules()))


def vectorization_pays(specs: list[TrialSpec]) -> bool:
    """Whether running ``specs`` (the K trials of one task) as one vectorized computation costs less per
    trial than running them one at a time, by measurement (:func:`vectorization_costs`), not by a
    fixed threshold. ``False`` when they cannot be vectorized (fewer than 2 trials, an obstacle, a
    model that does not run vectorized, an invalid spec, any exception a user's model raises while
    built or measured here: the sequential path runs them and reports it).

    Changes no trial's results: it only chooses the path. It answers ``True`` only when the
    vectorized path is measured cheaper AND exact (``VectorizationCost.exact``: the exactness
    self-check, :func:`vectorized_identical`, run once it is cheaper, found the stacked results
    equal to the sequential ones, to the bit, on this machine), on every device, so that a trial's
    results stay a pure function of its spec and never depend on timing or on the path; on the CPU
    a model that is not an MLP (:func:`mlp_layers`; ``vmap``, which agrees only up to rounding) gets
    ``False`` without measuring. ``vectorize = "always"`` still forces the vectorized path (the
    worker does not ask; the sweep's driver runs the self-check and records a difference in the
    study definition: :func:`batchlab.sweep.runner.prepare_sweep`).

    Cached in this process per (workload key :func:`batchlab.workloads.workload_key`, the built
    model's parameter names, shapes and dtypes and module classes, optimizer, batch size, K, device,
    shared batch order or not), so a worker measures each kind of task once, and measures again when
    a workload it already saw changes its model under the same name.
    """
    from batchlab.train.device import resolve_device
    from batchlab.workloads import resolve_workload, workload_key

    if len(specs) < 2:
        return False
    first = specs[0]
    try:
        if vectorization_obstacle(specs) is not None:
            return False
        workload, device = resolve_workload(first.workload), resolve_device(first.device)
        model = workload.build_model(seed=0)
        key = (workload_key(workload), _model_signature(model), first.optimizer, int(first.batch_size), len(specs),
               str(device), shared_order_seed(specs) is not None)
        mlp = mlp_layers(model) is not None
    except Exception:  # an unknown workload, a model that fails to build: the sequential path reports it
        return False
    if key not in _PAYS:
        try:
            if device.type == "cpu" and not mlp:
                raise NotVectorizable("the vmap path is not exact, so timing does not choose it (docstring)")
            cost = vectorization_costs(specs, check_exact="if cheaper")
        except NotVectorizable:
            _PAYS[key] = False
        except Exception:  # an invalid spec, or a user's model failing: the sequential path reports it
            return False
        else:
            _PAYS[key] = cost.vectorized < cost.sequential and cost.exact
    return _PAYS[key]
