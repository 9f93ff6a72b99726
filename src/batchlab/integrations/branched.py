"""The branched critical batch size from the user's own checkpoints, through a small adapter.

:func:`branched_from_checkpoints` is :func:`batchlab.probes.branched.branched_critical_batch_size` for a
run batchlab did not train: the reference run (batch size ``B``) is the user's, its checkpoints are the
user's files (``{step: path}``, ``step`` = updates of the reference run when the checkpoint was saved),
and a :class:`CheckpointAdapter` tells batchlab how to build, load, feed and score the model. The
definitions (branches, rules, window, probe loss, pass/fail, local critical batch size, bracket
interval, warmup) are :mod:`batchlab.probes.branched`'s, computed by the same functions
(:func:`batchlab.probes.branched._summarize`; the result is a :class:`~batchlab.probes.branched.BranchedResult`).
docs/methods.md, "Branched critical batch size from your own checkpoints".

**A branch** at checkpoint step ``t``, multiplier ``k`` and learning-rate factor ``f`` (the rule's):

1. ``model, optimizer = adapter.build()``; ``adapter.load(path, model, optimizer)`` (the model's and
   optimizer's state at step ``t``);
2. the data: ``adapter.batches(t, B)`` yields the reference run's own training batches for its
   updates ``t, t + 1, ...`` (``B`` examples each; the examples from ``t·B`` on, the same for every
   branch of the checkpoint). Branch update ``j`` at ``k·B`` consumes the next ``k`` of them, the
   reference batches ``t + j·k, ..., t + j·k + k - 1``: its gradient is the mean of their ``k`` losses'
   gradients, accumulated one reference batch at a time (``(loss_i / k).backward()``; at ``k = 1`` the
   loss itself). With ``loss(model, batch)`` the mean over a batch's examples that is the gradient of
   the mean loss over the ``k·B`` examples (the concatenated batch of
   :mod:`batchlab.probes.branched`), up to floating-point rounding, at the memory of one reference
   batch; layers that mix examples (batch norm) see batches of ``B``, not ``k·B``;
3. the learning rate of update ``j``: ``f`` times each parameter group's base rate, which is the
   ``learning_rate`` argument when given, else ``adapter.learning_rates(t + j·k)`` when the adapter
   defines it (the reference run's schedule at the step where the update's examples begin: a decaying
   schedule decays in examples), else the group's ``lr`` as loaded (constant over the window);
4. ``optimizer.zero_grad(set_to_none=True)``, the ``k`` backward passes, ``adapter.before_update(model,
   optimizer)`` when defined (gradient clipping), ``optimizer.step()``; a non-finite training loss ends
   the branch with an infinite probe loss (diverged);
5. the probe loss after ``window // (k·B)`` updates: ``adapter.probe_loss(model)`` when defined, else
   the mean of ``float(loss(model, b))`` over ``adapter.probe_batches()`` in eval mode without gradients
   (:func:`default_probe_loss`; the same batches for every branch and checkpoint).

The ``k = 1`` branch is therefore the user's run continued: it runs the user's own ``loss`` on the
user's own batches with the loaded optimizer at the loaded rate (``1.0·lr`` is ``lr`` exactly), so when
the user's loop does the same (``zero_grad``, ``loss.backward()``, optional ``before_update``,
``step``) its parameters after the window are bitwise those of the user's run ``window / B`` updates
later, on the same device and thread count (tests/integrations/test_checkpoint_branches.py). The
``batches`` stream is made and its first batch drawn under a seed of ``(seed, t)`` alone (a stream
shuffled by torch's global generator gives every branch the same examples); random numbers drawn
while training (dropout) come from torch's generators seeded by ``(seed, t, k)``; all inside a forked
random state (the caller's state is restored).

**Results do not depend on the executor.** Every branch is a function of the adapter, the checkpoint
file, ``k``, ``f``, ``B``, the window, the learning-rate setting and ``seed`` only: it builds and loads
its own model, so ``workers=1`` (in this process), ``workers=N`` (a pool of spawned processes, one torch
thread each) and Dask give bitwise the same losses when the processes compute the same way (same
torch build and machine, the driver also at one thread: ``OMP_NUM_THREADS=1``); otherwise they agree
up to the rounding of multi-threaded reductions.

**Resumable.** With ``out`` each finished branch's loss goes into ``out/branched.json`` exactly as in
:mod:`batchlab.probes.branched` (same file, keys and atomic rewrite), beside the settings that define
the branches (the adapter's reference and the SHA-256 of the source file defining it, ``B``, the
window, the learning-rate setting, ``seed``) and,
per checkpoint step, the checkpoint file's identity (its size and modification time; for a directory,
a SHA-256 digest of every file's relative path, size and modification time). A rerun with the same
settings computes only the missing branches and calls the adapter for nothing else; other settings,
or a checkpoint whose file changed, are refused. Checkpoints may be added between runs.

**Cost** (``examples_processed``): the branches' training examples, ``window // (k·B)·k·B`` per branch
(times the tuned factors), per checkpoint; the user's own run and the probe evaluations are not
counted. Every branch also loads its checkpoint once.

**Bad input and failing adapters**: one :class:`~batchlab.errors.BatchlabError` line; an exception in
an adapter method is reported as ``adapter REF: METHOD raised TYPE: MESSAGE (checkpoint step T, PATH)``.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from batchlab.errors import BatchlabError, one_line
from batchlab.probes.branched import (
    DEFAULT_MULTIPLIERS,
    DEFAULT_TOLERANCE,
    BranchedResult,
    _branch_examples,
    _Cache,
    _summarize,
    checked_settings,
    learning_rate_factors,
    warmup_schedule,
)
from batchlab.references import ReferenceKind

__all__ = ["REQUIRED_METHODS", "CheckpointAdapter", "CheckpointAdapterProtocol", "adapter_reference", "adapter_source_digest",
           "batch_size_schedule", "branched_from_checkpoints", "check_checkpoints", "checkpoint_identity", "default_probe_loss",
           "default_rule", "resolve_adapter"]

#: The methods every adapter defines (besides ``probe_loss`` or ``probe_batches``).
REQUIRED_METHODS = ("build", "load", "batches", "loss")
#: The optional methods batchlab calls when an adapter defines them.
OPTIONAL_METHODS = ("probe_loss", "probe_batches", "learning_rates", "before_update")
#: How many times a branch whose worker process died is run again before the measurement stops.
LOST_RETRIES = 2


# ---------------------------------------------------------------------------------------------------------
# The adapter


@runtime_checkable
class CheckpointAdapterProtocol(Protocol):
    """What an adapter must define (:class:`CheckpointAdapter` documents each method)."""

    def build(self) -> tuple[Any, Any]: ...

    def load(self, path: str, model: Any, optimizer: Any) -> None: ...

    def batches(self, step: int, batch_size: int) -> Iterable[Any]: ...

    def loss(self, model: Any, batch: Any) -> Any: ...


class CheckpointAdapter:
    """Base class of an adapter between the user's training code and :func:`branched_from_checkpoints`.

    Subclassing is optional (any object with these methods works); the base class documents the
    contract and supplies the optional methods' defaults. For ``workers > 1`` or Dask the adapter is
    given as a reference ``package.module:attribute`` or ``path/to/file.py:attribute`` that worker
    processes import again: the attribute is an adapter object, or a class or function called without
    arguments that returns one.

    Required:

    * :meth:`build` -> ``(model, optimizer)``: a fresh ``torch.nn.Module`` and a ``torch.optim.Optimizer``
      over its parameters, on the device the adapter wants (the batches must be on it too);
    * :meth:`load` ``(path, model, optimizer)``: restore the checkpoint at ``path`` (the user's format) into
      both, in place: the model's parameters and buffers and the optimizer's state (momentum, Adam's
      moments and step count) and learning rate at that step;
    * :meth:`batches` ``(step, batch_size)``: an iterable of the reference run's training batches for its
      updates ``step, step + 1, ...`` (``batch_size`` = ``B`` examples each, the examples from
      ``step·batch_size`` on), the same on every call; batchlab takes ``window // B`` of them;
    * :meth:`loss` ``(model, batch)``: the scalar training loss of one batch (a differentiable 0-d
      tensor, the mean over the batch's examples), with the model in train mode.

    Optional: :meth:`probe_loss` (the default here: :func:`default_probe_loss`, the mean loss over
    ``probe_batches()``, which the adapter then defines: the fixed probe batches, the same on every
    call), :meth:`learning_rates`, :meth:`before_update`. The base class defines no required method:
    an adapter lacking one is refused, naming it, before anything runs (:func:`resolve_adapter`).
    """

    def probe_loss(self, model: Any) -> float:
        """The probe loss of ``model`` after a branch: by default :func:`default_probe_loss`."""
        return default_probe_loss(self, model)


def _defined(adapter: Any, name: str) -> bool:
    """Whether ``adapter`` has its own method ``name`` (one inherited from :class:`CheckpointAdapter` does
    not count: ``probe_loss`` there is the default, which needs ``probe_batches``)."""
    if not callable(getattr(adapter, name, None)):
        return False
    return not (isinstance(adapter, CheckpointAdapter)
                and getattr(type(adapter), name, None) is getattr(CheckpointAdapter, name, object()))


def _missing_methods(adapter: Any) -> list[str]:
    missing = [m for m in REQUIRED_METHODS if not _defined(adapter, m)]
    if not _defined(adapter, "probe_loss") and not _defined(adapter, "probe_batches"):
        missing.append("probe_loss or probe_batches")
    return missing


def default_probe_loss(adapter: Any, model: Any) -> float:
    """The mean of ``float(adapter.loss(model, b))`` over ``adapter.probe_batches()``, in eval mode without
    gradients (the model's mode is restored); ``inf`` when not finite. Each batch counts once: with
    probe batches of equal size it is the mean loss over the probe examples."""
    import torch

    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        with torch.no_grad():
            for batch in adapter.probe_batches():
                total += float(adapter.loss(model, batch))
                count += 1
    finally:
        model.train(was_training)
    if count == 0:
        raise BatchlabError("probe_batches() yielded no batch; it must yield at least one fixed probe batch")
    value = total / count
    return value if math.isfinite(value) else math.inf


# ---------------------------------------------------------------------------------------------------------
# Finding the adapter

#: Adapter references: errors ``adapter reference 'REF': ...``, files imported as ``batchlab_user_adapter_*``.
ADAPTER_REFERENCE = ReferenceKind("adapter", "attribute", "batchlab_user_adapter")

_RESOLVED: dict[str, tuple[Any, Any]] = {}  # normalised reference -> (its module, the adapter), per process


def adapter_reference(adapter: Any) -> str:
    """The identity of ``adapter`` in the cache and the results: a reference string normalised (a file
    path made absolute), or for an object ``module:QualifiedClassName`` of its class."""
    if isinstance(adapter, str):
        return ADAPTER_REFERENCE.normalize(adapter)
    return f"{type(adapter).__module__}:{type(adapter).__qualname__}"


def resolve_adapter(adapter: Any) -> Any:
    """The adapter object for ``adapter``: an object with the adapter's methods (returned as is, after
    the check), or a reference ``package.module:attribute`` / ``path/to/file.py:attribute`` whose
    attribute is an adapter object or a class or function called without arguments that returns one
    (cached per process; made again when its module was imported anew). The reference is imported
    by :mod:`batchlab.references`' rules.

    Raises:
        BatchlabError: a bad reference (missing file, module or attribute, an exception while importing
            or constructing), or an adapter lacking a required method (one line naming them).
    """
    if isinstance(adapter, str):
        name = adapter_reference(adapter)
        module, obj = ADAPTER_REFERENCE.attribute_of(adapter, name, offered=lambda v: callable(getattr(v, "build", None)))
        held = _RESOLVED.get(name)
        if held is None or held[0] is not module:  # first use, or the module was imported anew
            if isinstance(obj, type) or (callable(obj) and not callable(getattr(obj, "build", None))):
                obj = ADAPTER_REFERENCE.call(adapter, ADAPTER_REFERENCE.split(name)[1], obj)
            _check_methods(adapter, obj)
            _RESOLVED[name] = (module, obj)
        return _RESOLVED[name][1]
    _check_methods(adapter_reference(adapter), adapter)
    return adapter


def adapter_source_digest(adapter: Any) -> str | None:
    """SHA-256 of the source file that defines ``adapter`` (the module its reference names, or its
    class's module), so that a cache of branches is not continued by an edited adapter; None when
    the adapter has no source file (defined interactively). Other files it imports are not covered."""
    import sys

    if isinstance(adapter, str):
        held = _RESOLVED.get(adapter_reference(adapter))
        module = None if held is None else held[0]
    else:
        module = sys.modules.get(type(adapter).__module__)
    path = getattr(module, "__file__", None)
    if not path:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _check_methods(name: Any, adapter: Any) -> None:
    missing = _missing_methods(adapter)
    if missing:
        raise BatchlabError(f"adapter {name!s} lacks {', '.join(missing)}; an adapter defines build(), load(path, model, "
                            "optimizer), batches(step, batch_size), loss(model, batch) and probe_loss(model) or "
                            "probe_batches() (docs/integrations.md)")


def default_rule(adapter: Any) -> str:
    """``"sqrt"`` when the optimizer the adapter builds is Adam-like (``torch.optim.Adam``, ``AdamW``, or a
    class whose name contains "adam"), else ``"linear"`` (the command's default rule; builds once)."""
    import torch

    resolved = resolve_adapter(adapter)
    name = adapter_reference(adapter)
    model, optimizer = _built(resolved, name, None, None)
    del model
    adam = isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)) or "adam" in type(optimizer).__name__.lower()
    return "sqrt" if adam else "linear"


# ---------------------------------------------------------------------------------------------------------
# Checkpoints


def checkpoint_identity(path: str | Path) -> dict[str, Any]:
    """What identifies a checkpoint's contents in the cache without reading them: a file's ``size``
    (bytes) and ``mtime_ns``; a directory's number of ``files`` and the ``sha256`` of every file's
    relative path, size and modification time (sorted)."""
    p = Path(path)
    if p.is_dir():
        digest = hashlib.sha256()
        count = 0
        for child in sorted(q for q in p.rglob("*") if q.is_file()):
            stat = child.stat()
            digest.update(f"{child.relative_to(p).as_posix()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
            count += 1
        return {"kind": "directory", "files": count, "sha256": digest.hexdigest()}
    stat = p.stat()
    return {"kind": "file", "size": int(stat.st_size), "mtime_ns": int(stat.st_mtime_ns)}


def check_checkpoints(checkpoints: Any) -> dict[int, str]:
    """``{step: path}`` with integer steps >= 0 (sorted) and paths that exist; else one line."""
    if not isinstance(checkpoints, Mapping) or not checkpoints:
        raise BatchlabError("checkpoints must be a non-empty mapping {step: path} (step: updates of the reference run "
                            "when the checkpoint was saved)")
    out: dict[int, str] = {}
    for step, path in checkpoints.items():
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise BatchlabError(f"checkpoint step {step!r} must be an integer >= 0 (updates of the reference run)")
        if not isinstance(path, (str, os.PathLike)):
            raise BatchlabError(f"checkpoint for step {int(step)}: expected a path, got {type(path).__name__}")
        if not Path(path).expanduser().exists():
            raise BatchlabError(f"checkpoint for step {int(step)}: {str(path)!r} does not exist")
        out[int(step)] = str(Path(path).expanduser().resolve())
    return dict(sorted(out.items()))


# ---------------------------------------------------------------------------------------------------------
# One branch


@dataclass(frozen=True)
class _Task:
    """One branch (picklable for pool and Dask workers): the adapter's reference, the checkpoint
    ``step`` and ``path``, multiplier, learning-rate factor, ``steps`` updates, the reference batch size,
    the learning-rate setting (``None``: from the adapter or the loaded optimizer) and the seed."""

    adapter: str
    step: int
    path: str
    multiplier: int
    factor: float
    steps: int
    batch_size: int
    learning_rate: float | None
    seed: int

    @property
    def key(self) -> str:
        return f"branch-{self.step}-{self.multiplier}-{self.factor!r}"


def _failure(name: str, method: str, step: Any, path: Any, exc: BaseException) -> BatchlabError:
    where = "" if step is None else f" (checkpoint step {step}, {path})"
    message = one_line(exc) or "(no message)"
    return BatchlabError(f"adapter {name}: {method} raised {type(exc).__name__}: {message}{where}")


def _call(adapter: Any, name: str, method: str, step: Any, path: Any, *args: Any) -> Any:
    try:
        return getattr(adapter, method)(*args)
    except Exception as exc:
        raise _failure(name, method, step, path, exc) from exc


def _built(adapter: Any, name: str, step: Any, path: Any) -> tuple[Any, Any]:
    import torch

    built = _call(adapter, name, "build", step, path)
    if (not isinstance(built, (tuple, list)) or len(built) != 2 or not isinstance(built[0], torch.nn.Module)
            or not isinstance(built[1], torch.optim.Optimizer)):
        raise BatchlabError(f"adapter {name}: build returned {type(built).__name__}; it must return (model, optimizer): "
                            "a torch.nn.Module and a torch.optim.Optimizer over its parameters")
    return built[0], built[1]


def _base_rates(adapter: Any, name: str, task: _Task, groups: list, loaded: list[float]) -> Callable[[int], list[float]]:
    """The base learning rate of every parameter group for the update at reference step ``s``."""
    if task.learning_rate is not None:
        constant = [float(task.learning_rate)] * len(groups)
        return lambda s: constant
    if _defined(adapter, "learning_rates"):
        def rates(s: int) -> list[float]:
            value = _call(adapter, name, "learning_rates", task.step, task.path, s)
            values = [float(value)] * len(groups) if np.isscalar(value) else [float(v) for v in value]
            if len(values) != len(groups) or not all(math.isfinite(v) and v >= 0 for v in values):
                raise BatchlabError(f"adapter {name}: learning_rates({s}) returned {value!r}; it must return a rate >= 0, "
                                    f"or one per parameter group ({len(groups)}) (checkpoint step {task.step}, {task.path})")
            return values
        return rates
    return lambda s: loaded


def _branch_seed(seed: int, step: int, k: int) -> int:
    return int(np.random.SeedSequence([int(seed), int(step), int(k)]).generate_state(1)[0])


def _run_branch(adapter: Any, task: _Task) -> tuple[float, float]:
    """Train one branch (module docstring) in this process: ``(probe loss or inf, base learning rate at
    the checkpoint of the first parameter group)``."""
    import torch

    name, t, k, path = task.adapter, task.step, task.multiplier, task.path
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=cuda):  # the caller's random state is restored, whatever the adapter draws
        model, optimizer = _built(adapter, name, t, path)
        _call(adapter, name, "load", t, path, path, model, optimizer)
        groups = optimizer.param_groups
        loaded = [float(g["lr"].item()) if torch.is_tensor(g["lr"]) else float(g["lr"]) for g in groups]
        rates = _base_rates(adapter, name, task, groups, loaded)
        base = rates(t)[0]
        hook = _defined(adapter, "before_update")
        # the data stream is made and its first batch drawn under a seed that does not depend on k: a
        # DataLoader(shuffle=True) without its own generator draws its order from torch's global generator
        # (at iter() and at the first next()), so every branch of the checkpoint reads the same examples;
        # only then the branch's own stream (dropout and the like) is seeded by (seed, t, k)
        torch.manual_seed(_branch_seed(task.seed, t, 0))
        model.train()
        stream = iter(_call(adapter, name, "batches", t, path, t, task.batch_size))
        try:
            first = [next(stream)]
        except StopIteration:
            first = []
        except Exception as exc:
            raise _failure(name, "batches", t, path, exc) from exc
        stream = itertools.chain(first, stream)
        torch.manual_seed(_branch_seed(task.seed, t, k))
        taken = 0
        for j in range(task.steps):
            for group, rate in zip(groups, rates(t + j * k)):
                if torch.is_tensor(group["lr"]):  # capturable / fused optimizers keep lr as a tensor
                    group["lr"].fill_(task.factor * rate)
                else:
                    group["lr"] = task.factor * rate  # factor 1.0: the very float of the reference run
            optimizer.zero_grad(set_to_none=True)
            for _ in range(k):
                try:
                    batch = next(stream)
                except StopIteration:
                    raise BatchlabError(f"adapter {name}: batches({t}, {task.batch_size}) ended after {taken} batches; "
                                        f"the window needs {task.steps * k} (checkpoint step {t}, {path})") from None
                except Exception as exc:
                    raise _failure(name, "batches", t, path, exc) from exc
                taken += 1
                loss = _call(adapter, name, "loss", t, path, model, batch)
                if not torch.is_tensor(loss) or loss.numel() != 1:
                    raise BatchlabError(f"adapter {name}: loss returned {type(loss).__name__}; it must return a scalar "
                                        f"tensor (checkpoint step {t}, {path})")
                if not math.isfinite(float(loss.detach())):
                    return math.inf, base
                try:
                    (loss if k == 1 else loss / k).backward()
                except Exception as exc:
                    raise _failure(name, "the backward pass of loss", t, path, exc) from exc
            if hook:
                _call(adapter, name, "before_update", t, path, model, optimizer)
            try:
                optimizer.step()
            except Exception as exc:  # e.g. a checkpoint of another optimizer than build() makes
                raise _failure(name, f"the step of the {type(optimizer).__name__} from build (after load)", t, path,
                               exc) from exc
        if _defined(adapter, "probe_loss"):
            value = _call(adapter, name, "probe_loss", t, path, model)
        else:
            try:
                value = default_probe_loss(adapter, model)
            except BatchlabError as exc:
                raise BatchlabError(f"adapter {name}: {exc} (checkpoint step {t}, {path})") from None
            except Exception as exc:
                raise _failure(name, "probe_batches/loss", t, path, exc) from exc
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise BatchlabError(f"adapter {name}: probe_loss returned {type(value).__name__}, not a number "
                            f"(checkpoint step {t}, {path})") from None
    return (value if math.isfinite(value) else math.inf), base


def _run_task(task: _Task) -> tuple[float, float]:
    """A worker's branch: the adapter re-imported from its reference (pool and Dask workers)."""
    return _run_branch(resolve_adapter(task.adapter), task)


# ---------------------------------------------------------------------------------------------------------
# The measurement


def branched_from_checkpoints(adapter: Any, checkpoints: Mapping[int, str | os.PathLike], batch_size: int,
                              learning_rate: float | None = None, multipliers: Sequence[int] = DEFAULT_MULTIPLIERS,
                              rule: str = "linear", window: int | None = None, tolerance: float = DEFAULT_TOLERANCE,
                              out: str | Path | None = None, workers: int = 1, dask: bool = False,
                              scheduler: str | None = None, seed: int = 0,
                              progress: Callable[[int, int, float, float], None] | None = None) -> BranchedResult:
    """The branched critical batch size at each of the user's ``checkpoints`` (module docstring).

    Args:
        adapter: a :class:`CheckpointAdapter`-like object, or its reference ``package.module:attribute`` /
            ``path/to/file.py:attribute`` (needed for ``workers > 1`` and Dask).
        checkpoints: ``{step: path}``; ``step`` is the reference run's update count at the checkpoint.
        batch_size: the reference run's batch size ``B`` (examples per update).
        learning_rate: the base rate of every parameter group, constant (the rule scales it); ``None``:
            the adapter's ``learning_rates(step)`` when defined, else each group's loaded ``lr``.
        multipliers, rule, window, tolerance: as :func:`batchlab.probes.branched.branched_critical_batch_size`
            (``window`` in examples, default ``64·B``; the interval is the bracket).
        out: directory of the resumable cache ``out/branched.json``.
        workers: ``1`` runs the branches in this process; ``N > 1`` in a pool of ``N`` spawned processes.
        dask, scheduler: run the branches on Dask: ``dask=True`` a ``LocalCluster`` of ``workers``
            processes on 127.0.0.1, ``scheduler`` the address of a running scheduler
            (:class:`batchlab.sweep.executors.DaskExecutor`).
        seed: seeds the branches' random streams (dropout), by ``(seed, step, k)``.
        progress: ``progress(step, k, factor, loss)`` after each computed branch.

    Returns:
        A :class:`~batchlab.probes.branched.BranchedResult` whose settings hold ``adapter``, ``checkpoints``
        (``{step: path}``), ``batch_size``, ``learning_rate`` (``None``: from the optimizer),
        ``multipliers``, ``rule``, ``window``, ``tolerance``, ``seed``, ``checkpoints_at``, ``workers``
        and ``executor`` (``inline``, ``local`` or ``dask``).

    Raises:
        BatchlabError: bad settings (as the workload path), a checkpoint step that is not an integer >= 0,
            a missing checkpoint path, an adapter that cannot be imported or lacks a method, an
            adapter method that raised (one line naming the method, the checkpoint and the error),
            ``workers > 1`` or Dask with an adapter object, a cache of another measurement or of a
            changed checkpoint file, a diverged reference branch.
    """
    batch, ks, rule, tol, size = checked_settings(batch_size, multipliers, rule, tolerance, window, workers)
    if learning_rate is not None:
        try:
            rate = float(learning_rate)
        except (TypeError, ValueError):
            rate = math.nan
        if not (math.isfinite(rate) and rate > 0):
            raise BatchlabError(f"learning rate must be a number > 0 (or None: read from the optimizer), got {learning_rate!r}")
        learning_rate = rate
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise BatchlabError(f"seed must be an integer, got {seed!r}")
    remote = workers > 1 or dask or scheduler is not None
    if remote and not isinstance(adapter, str):
        raise BatchlabError("workers > 1 and Dask need the adapter as a reference (package.module:attribute or "
                            "path/to/file.py:attribute), which worker processes import again")
    paths = check_checkpoints(checkpoints)
    resolved = resolve_adapter(adapter)  # importable and complete before anything runs
    name = adapter_reference(adapter)
    settings = {"kind": "checkpoints", "adapter": name, "adapter_source": adapter_source_digest(adapter),
                "batch_size": batch, "window": size, "learning_rate": learning_rate, "seed": int(seed)}
    cache = _Cache(out, settings, mismatch="other adapter or adapter source file, batch size, window, learning rate "
                                           "or seed")
    identities = {s: checkpoint_identity(p) for s, p in paths.items()}
    for s, identity in identities.items():
        held = cache.checkpoints.get(str(s))
        if held is not None and held.get("identity") != identity:
            raise BatchlabError(f"checkpoint step {s} ({paths[s]}) is not the file whose branches "
                                f"{str(cache.path)!r} holds (its size or modification time differ); "
                                "use another --out directory")
    wanted = {s: [(k, f) for k in ks for f in learning_rate_factors(k, rule)] for s in paths}
    tasks = [_Task(name, s, paths[s], k, float(f), size // (k * batch), batch, learning_rate, int(seed))
             for s, items in wanted.items() for k, f in items if cache.get(s, k, f) is None]
    computed = 0

    def record(task: _Task, loss: float, base: float) -> None:
        nonlocal computed
        cache.checkpoints[str(task.step)] = {"path": task.path, "identity": identities[task.step]}
        cache.put(task.step, task.multiplier, task.factor, loss, base)
        computed += 1
        if progress is not None:
            progress(task.step, task.multiplier, task.factor, loss)

    executor_kind = "inline"
    if tasks and not remote:
        for task in tasks:
            record(task, *_run_branch(resolved, task))
    elif tasks:
        from batchlab.sweep.executors import make_executor

        executor = make_executor(_run_task, workers=workers, dask=bool(dask), scheduler=scheduler, device="cpu")
        executor_kind = executor.kind
        lost: dict[str, int] = {}
        try:
            for task in tasks:
                executor.submit(task)
            for outcome in executor.outcomes():
                task = outcome.task
                if outcome.lost:
                    lost[task.key] = lost.get(task.key, 0) + 1
                    if lost[task.key] > LOST_RETRIES:
                        raise BatchlabError(f"the worker running branch k={task.multiplier} at checkpoint step "
                                            f"{task.step} ({task.path}) died {lost[task.key]} times (out of memory?)")
                    executor.submit(task)
                elif outcome.error is not None:
                    exc = outcome.error
                    if isinstance(exc, BatchlabError):
                        raise BatchlabError(str(exc)) from None
                    raise _failure(name, "a branch", task.step, task.path, exc)
                else:
                    record(task, *outcome.result)
        except BaseException:
            executor.abort()
            raise
        finally:
            executor.close()
    elif remote:
        executor_kind = "dask" if (dask or scheduler is not None) else "local"
    points = []
    for s, items in wanted.items():
        losses = {(k, f): cache.get(s, k, f) for k, f in items}
        base = cache.learning_rates.get(str(s), float("nan"))
        points.append(_summarize(s, base, batch, ks, size, tol, losses))
    result_settings = {**settings, "checkpoints": {str(s): p for s, p in paths.items()}, "multipliers": ks,
                       "rule": rule, "tolerance": tol, "checkpoints_at": list(paths), "workers": workers,
                       "executor": executor_kind if remote else "inline"}
    total = len(points) * _branch_examples(ks, rule, size, batch)
    return BranchedResult(points, result_settings, int(total), computed=computed)


# ---------------------------------------------------------------------------------------------------------
# The schedule


def batch_size_schedule(result: BranchedResult, tokens_per_example: int | None = None) -> Any:
    """The suggested warmup (:func:`batchlab.probes.branched.warmup_schedule`) as a
    :class:`batchlab.integrations.schedule.BatchSizeSchedule` counted in examples (or tokens).

    A warmup entry ``(t, b)`` (batch size ``b`` from the reference run's update ``t``) starts at
    ``t·B`` examples, the examples the reference run had consumed at its step ``t``; before the first
    entry the batch size is ``B``. Consecutive equal batch sizes merge, so the points are strictly
    increasing in both start and batch size. With ``tokens_per_example = L`` (fixed-length sequences)
    starts and batch sizes are multiplied by ``L`` and the unit is ``"tokens"``.
    """
    from batchlab.integrations.schedule import BatchSizeSchedule

    batch = int(result.settings["batch_size"])
    scale = 1
    if tokens_per_example is not None:
        if isinstance(tokens_per_example, bool) or not isinstance(tokens_per_example, (int, np.integer)) \
                or tokens_per_example < 1:
            raise BatchlabError(f"tokens per example must be an integer >= 1, got {tokens_per_example!r}")
        scale = int(tokens_per_example)
    points: list[tuple[int, int]] = [(0, batch)]
    for step, size in warmup_schedule(result):
        start = int(step) * batch
        if size == points[-1][1]:
            continue
        if start == points[-1][0]:
            points[-1] = (start, int(size))
        else:
            points.append((start, int(size)))
    return BatchSizeSchedule(tuple((s * scale, b * scale) for s, b in points),
                             unit="examples" if tokens_per_example is None else "tokens")

