"""The classification loss and metrics, and the streaming evaluation every workload uses.

Streaming evaluation (:func:`evaluate_split`) runs a split through the model in consecutive batches
under ``torch.inference_mode`` and reports ``total / count`` per metric from per-batch sums
accumulated in float64 (integers stay integers), so a metric is an exact mean over the split. The
default evaluation batch is :func:`default_eval_batch_size` (a rule on the model's activation
memory); :func:`check_goal_split` is the same pass stopped as soon as a goal comparison on a
*bounded* metric is decided, returning a bound instead of the value (docs/methods.md, "Evaluation
schedule and resolution").

Conventions:

- Logits are ``(N, K)`` for classifiers and ``(N, L, K)`` for language models (K = vocabulary size);
  targets are ``(N,)`` or ``(N, L)`` int64. Language-model losses and metrics are per token.
- Cross entropy is in nats (per example, or per token for language models).
- **Label smoothing follows Shallue et al.** (docs/methods.md, "Optimizers, schedules and search spaces"): a smoothing ``ls`` removes mass ``ls``
  from the true class and gives ``ls / (K - 1)`` to each other class. This equals the common
  ``(1 - eps) * onehot + eps / K`` used by :func:`torch.nn.functional.cross_entropy` with
  ``eps = ls * K / (K - 1)``, which is how it is computed here.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from batchlab.errors import BatchlabError
from batchlab.workloads.data import SPLITS


def torch_label_smoothing(label_smoothing: float, num_classes: int) -> float:
    """Return torch's ``eps`` for a Shallue-convention smoothing ``label_smoothing`` over ``num_classes``.

    Allowed: ``0 <= label_smoothing <= (K - 1) / K`` (the upper end gives the uniform distribution).
    """
    limit = (num_classes - 1) / num_classes
    ls = float(label_smoothing)
    if not 0.0 <= ls <= limit:
        raise BatchlabError(f"label_smoothing must be in [0, {limit:.4g}] for {num_classes} classes, got {label_smoothing!r}")
    return min(1.0, ls * num_classes / (num_classes - 1))


def flatten_logits(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(logits (M, K), targets (M,))`` with every position of a sequence as one row."""
    return logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)


def cross_entropy_loss(logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Return the mean cross entropy (nats; per token for sequences) with Shallue label smoothing."""
    flat_logits, flat_targets = flatten_logits(logits, targets)
    eps = torch_label_smoothing(label_smoothing, flat_logits.shape[-1])
    return F.cross_entropy(flat_logits, flat_targets, label_smoothing=eps)


def check_split(split: str) -> str:
    """Return ``split`` if it is one of train/val/test, else raise BatchlabError."""
    if split not in SPLITS:
        raise BatchlabError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
    return split


def fixed_subset(num_examples: int, max_examples: int | None) -> torch.Tensor | None:
    """Return the sorted indices of a fixed evaluation subset, or None to use every example.

    The subset is the first ``max_examples`` entries of a permutation drawn with seed 0, so the same
    examples are evaluated at every step of every trial.
    """
    if max_examples is None or num_examples <= max_examples:
        return None
    generator = torch.Generator().manual_seed(0)
    return torch.randperm(num_examples, generator=generator)[:max_examples].sort().values


@torch.inference_mode()
def evaluate_classifier(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    split: str = "val",
    batch_size: int | None = 1000,
    max_examples: int | None = None,
) -> dict[str, float]:
    """Return ``{"<split>/cross_entropy_error": nats, "<split>/classification_error": fraction}``.

    Both are means over examples (over tokens for sequence targets), without label smoothing, with
    the model in eval mode (its mode is restored afterwards), under ``torch.inference_mode``, in
    batches of ``batch_size`` (``None``: :func:`default_eval_batch_size`), on at most
    ``max_examples`` examples (a :func:`fixed_subset`).
    """
    check_split(split)
    if len(x) != len(y) or len(x) == 0:
        raise BatchlabError(f"evaluation needs as many inputs as targets and at least one, got {len(x)} and {len(y)}")
    subset = fixed_subset(len(x), max_examples)
    if subset is not None:
        x, y = x[subset], y[subset]
    if batch_size is None:
        batch_size = default_eval_batch_size(model, x[:1])
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total_loss = torch.zeros((), dtype=torch.float64)
    total_errors = 0
    total_count = 0
    try:
        for start in range(0, len(x), batch_size):
            xb = x[start : start + batch_size].to(device)
            yb = y[start : start + batch_size].to(device)
            logits, targets = flatten_logits(model(xb), yb)
            total_loss += F.cross_entropy(logits.float(), targets, reduction="sum").double().cpu()
            total_errors += int((logits.argmax(dim=-1) != targets).sum())
            total_count += targets.numel()
    finally:
        model.train(was_training)
    return {
        f"{split}/cross_entropy_error": float(total_loss) / total_count,
        f"{split}/classification_error": total_errors / total_count,
    }


def classification_sums(logits: torch.Tensor, targets: torch.Tensor) -> dict[str, tuple]:
    """One batch's ``cross_entropy_error`` (float64 sum of nats, no smoothing) and
    ``classification_error`` (number of wrong argmax predictions), each with the number of targets
    (tokens for sequences): the arithmetic of :func:`evaluate_classifier`."""
    flat_logits, flat_targets = flatten_logits(logits, targets)
    count = flat_targets.numel()
    return {
        "cross_entropy_error": (F.cross_entropy(flat_logits.float(), flat_targets, reduction="sum").double().cpu(), count),
        "classification_error": (int((flat_logits.argmax(dim=-1) != flat_targets).sum()), count),
    }


def _model_device(model: torch.nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return torch.device("cpu")


#: The activation memory (bytes) one evaluation batch may take on the CPU under the default rule
#: (:func:`default_eval_batch_size`). Measured on 1 CPU thread (32 MiB L3), 5,000 MNIST validation
#: images: the Simple CNNs were fastest at 36-72 MB of activations per batch (narrow: batch 200,
#: base: 200, wide: 50-100; 1.5-1.8x faster than batch 1000), the fc networks within noise of their
#: best from batch 1000 up.
EVAL_ACTIVATION_BYTES = 48 * 2**20
#: The largest default evaluation batch. Larger batches gain nothing measurable on fc networks, and a
#: goal check (:func:`check_goal_split`) can stop only between batches.
MAX_EVAL_BATCH = 1000

_BATCH_RULE: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def _tensor_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_tensor_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    return 0


def activation_bytes(model: torch.nn.Module, example) -> int:
    """Bytes of ``example`` (one example's input, with its batch dimension) plus the outputs of every
    leaf module (a module without children) in one forward pass of it: the activation memory one
    example takes in an evaluation batch (intermediate buffers inside a module, e.g. a convolution's
    unfolded input, are not seen).

    Eval mode (restored), ``torch.inference_mode``, torch's random state untouched; depends only on
    the architecture and the input's shape, not on the weights.
    """
    seen = [_tensor_bytes(example)]
    hooks = [m.register_forward_hook(lambda _m, _i, out: seen.append(_tensor_bytes(out)))
             for m in model.modules() if next(m.children(), None) is None]
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), torch.random.fork_rng(devices=[]):
            model(example)
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    return sum(seen)


def default_eval_batch_size(model: torch.nn.Module, example) -> int:
    """The evaluation batch of a workload that sets no ``eval_batch_size`` (the default rule).

    On the CPU: the largest batch whose activations (:func:`activation_bytes` of ``example``, one
    example of the split) fit in :data:`EVAL_ACTIVATION_BYTES`, at least 1 and at most
    :data:`MAX_EVAL_BATCH`; on any other device :data:`MAX_EVAL_BATCH`. The rule depends only on the
    model's architecture, the input's shape and the device, never on timing, so the same trial
    evaluates in the same batches (hence gives the same numbers) every time; it is computed once
    per model object and input shape. The batch changes only float rounding (each batch's sums are
    exact up to it; the totals accumulate in float64).
    """
    if _model_device(model).type != "cpu":
        return MAX_EVAL_BATCH
    key = (tuple(example.shape[1:]), example.dtype) if isinstance(example, torch.Tensor) else None
    known = _BATCH_RULE.setdefault(model, {})
    if key is None or key not in known:
        per_example = max(1, activation_bytes(model, example))
        batch = max(1, min(MAX_EVAL_BATCH, EVAL_ACTIVATION_BYTES // per_example))
        if key is None:
            return batch
        known[key] = batch
    return known[key]


def _first_input(data):
    return data.batch(torch.arange(1))[0]


def accumulate_sums(totals: dict, counts: dict, batch: dict) -> None:
    """Add one batch's ``{name: (sum, count)}`` (:meth:`batchlab.workloads.tasks.Task.batch_sums`) to
    ``totals`` and ``counts``: floating tensors in float64, integers as integers."""
    for name, (total, count) in batch.items():
        if isinstance(total, torch.Tensor) and total.is_floating_point() and total.dtype != torch.float64:
            total = total.double()
        totals[name] = totals.get(name, 0) + total
        counts[name] = counts.get(name, 0) + count


def split_means(totals: dict, counts: dict, split: str) -> dict[str, float]:
    """``{"<split>/<metric>": total / count}`` of accumulated sums (:func:`accumulate_sums`; NaN for a
    zero count)."""
    return {f"{split}/{name}": float(totals[name]) / counts[name] if counts[name] else math.nan for name in totals}


def prepared_split(data, split: str, max_examples: int | None):
    """``data`` (a :class:`batchlab.workloads.data.DataSplit`) as a streaming evaluation measures it:
    ``split`` checked (:func:`check_split`), at least one example, at most ``max_examples`` of them
    (a :func:`fixed_subset`)."""
    check_split(split)
    if len(data) == 0:
        raise BatchlabError(f"evaluation needs at least one example; the {split} split is empty")
    subset = fixed_subset(len(data), max_examples)
    return data if subset is None else data.subset(subset)


# the names the evaluation passes below use
_accumulate, _means, _prepared = accumulate_sums, split_means, prepared_split


def _batch_sums(model: torch.nn.Module, data, sums: Callable, batch_size: int) -> Iterator[tuple[int, dict]]:
    """``(examples, sums(outputs, targets))`` of each consecutive batch of ``data``, on the model's device."""
    device = _model_device(model)
    for xb, yb in data.batches(batch_size):
        xb, yb = xb.to(device), yb.to(device)
        yield len(yb), sums(model(xb), yb)


@torch.inference_mode()
def evaluate_split(model: torch.nn.Module, data, sums, split: str = "val", batch_size: int | None = None,
                   max_examples: int | None = None) -> dict[str, float]:
    """Return ``{"<split>/<metric>": total / count}`` over the batches of ``data`` (a
    :class:`batchlab.workloads.data.DataSplit`), where ``sums(outputs, targets)`` gives each batch's
    ``{metric: (sum, count)}`` (:meth:`batchlab.workloads.tasks.Task.batch_sums`).

    In eval mode (restored afterwards), under ``torch.inference_mode``, on the model's device, in
    consecutive batches of ``batch_size`` (``None``: :func:`default_eval_batch_size`), on at most
    ``max_examples`` examples (a :func:`fixed_subset`). Floating sums accumulate in float64, integer
    sums as integers. For a classification task this is :func:`evaluate_classifier`, operation for
    operation (at the same batch size).
    """
    data = _prepared(data, split, max_examples)
    if batch_size is None:
        batch_size = default_eval_batch_size(model, _first_input(data))
    was_training = model.training
    model.eval()
    totals: dict[str, object] = {}
    counts: dict[str, object] = {}
    try:
        for _, batch in _batch_sums(model, data, sums, batch_size):
            _accumulate(totals, counts, batch)
    finally:
        model.train(was_training)
    return _means(totals, counts, split)


#: The flags of a bounded value (:func:`check_goal_split`): the true value is >= the one returned
#: (a lower bound) or <= it (an upper bound).
LOWER_BOUND, UPPER_BOUND = 1.0, -1.0


def _finite_state(model: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in (*model.parameters(), *model.buffers()) if t.is_floating_point())


def _count(value) -> int | None:
    """``value`` as an int if it is a finite whole number (a count of terms), else None."""
    number = value.item() if isinstance(value, torch.Tensor) else value
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number) or number != int(number):
        return None
    return int(number)


def goal_decision(hits: int, seen: int, total: int, goal: float, maximize: bool) -> tuple[float, float] | None:
    """Whether a bounded metric beats ``goal``, known from part of a split: ``(value, flag)`` once
    decided, else ``None``.

    ``hits`` terms equal to 1 among the ``seen`` terms so far, of ``total`` in the split (whole
    numbers, ``0 <= hits <= seen <= total``, ``total > 0``): the mean over the split lies in
    ``[lower, upper] = [float(hits) / total, float(hits + total - seen) / total]``, the same
    arithmetic as the mean itself (``float(count) / total``, monotone in the count). "Beats" is
    strict, as :func:`batchlab.train.evaluation.goal_reached`: ``v < goal`` (``v > goal`` when
    maximizing), so a value equal to the goal is not met. Decided when every value in the interval
    beats the goal or none does; ``value`` is the end of the interval that decides it and ``flag``
    says which end (:data:`LOWER_BOUND` ``+1.0``: the true value is >= ``value``; :data:`UPPER_BOUND`
    ``-1.0``: <=), so comparing ``value`` to the goal gives the true value's outcome: minimizing, met
    -> the upper bound (``< goal``), not met -> the lower bound (``>= goal``); maximizing, met -> the
    lower bound (``> goal``), not met -> the upper bound (``<= goal``). Usable by any pass that counts
    per model (e.g. several models evaluated together).
    """
    lower, upper = float(hits) / total, float(hits + total - seen) / total

    def beats(v: float) -> bool:
        return v > goal if maximize else v < goal

    (worst, worst_flag), (best, best_flag) = (((lower, LOWER_BOUND), (upper, UPPER_BOUND)) if maximize
                                              else ((upper, UPPER_BOUND), (lower, LOWER_BOUND)))
    if beats(worst):  # even the least favourable end beats it: met
        return worst, worst_flag
    if not beats(best):  # even the most favourable end does not: not met
        return best, best_flag
    return None


@torch.inference_mode()
def check_goal_split(model: torch.nn.Module, data, sums, metric: str, goal: float, maximize: bool, split: str = "val",
                     batch_size: int | None = None, max_examples: int | None = None) -> tuple[dict[str, float], dict[str, float]]:
    """:func:`evaluate_split`, stopped as soon as ``<split>/<metric>`` beating ``goal`` is decided.

    Returns ``(metrics, bounds)``. If the pass ran to its end: ``metrics`` is exactly
    :func:`evaluate_split`'s (same batches, same arithmetic) and ``bounds`` is ``{}``. If it stopped
    early: ``metrics = {"<split>/<metric>": b}`` alone (the split's other metrics were not fully
    computed and are dropped) and ``bounds = {"<split>/<metric>": flag}``, ``flag`` being
    :data:`LOWER_BOUND` (``+1.0``: the true value is >= ``b``) or :data:`UPPER_BOUND` (``-1.0``: <=).

    The goal comparison is strict (``value < goal``, ``> goal`` when maximizing: the goal is met
    only when beaten, a value equal to it is not met), and ``b`` is the bound that decides it, so
    comparing ``b`` to the goal the same way gives the same outcome as comparing the true value
    (:func:`goal_decision`).

    Precondition (the caller's): ``metric`` is a *bounded* metric
    (:attr:`batchlab.workloads.tasks.Task.bounded_metrics`): each term of its mean lies in ``[0, 1]``
    and its batch sum counts them (``classification_error``: wrong predictions). After each batch,
    with ``S`` the count so far, ``C`` the split's total count and ``R`` the terms not yet seen, the
    true mean lies in ``[S / C, (S + R) / C]`` (float divisions of exact integers, monotone, so the
    true value computed as ``float(total) / C`` lies between them too). The pass stops early only
    when all of these hold, and otherwise runs to the end (an exact result):

    * ``data`` is an in-memory :class:`batchlab.workloads.data.TensorSplit`, so ``C`` is known
      before the pass: the number of target elements, and every batch's count of the metric must
      equal its number of target elements;
    * every batch sum of ``metric`` is a whole number between 0 and the batch's count;
    * the model's parameters and buffers are finite, and every metric of every batch seen so far is
      finite (a non-finite model output makes the full pass's row non-finite, which the trial
      treats as infeasible: such a pass runs to the end and returns it).

    The examples are visited in a fixed order (the :func:`fixed_subset`'s, in consecutive batches of
    ``batch_size`` exactly as :func:`evaluate_split`), so a call stops after the same examples every
    time. Limit: a model with finite weights whose outputs overflow to non-finite values only on
    examples the pass did not reach is not seen (the full pass would have recorded a non-finite row).
    """
    from batchlab.workloads.data import TensorSplit

    data = _prepared(data, split, max_examples)
    if batch_size is None:
        batch_size = default_eval_batch_size(model, _first_input(data))
    name, goal, maximize = f"{split}/{metric}", float(goal), bool(maximize)
    total_count = data.y.numel() if isinstance(data, TensorSplit) else 0
    was_training = model.training
    model.eval()
    bounded = total_count > 0 and _finite_state(model)
    totals: dict[str, object] = {}
    counts: dict[str, object] = {}
    errors = seen = examples = 0
    try:
        for size, batch in _batch_sums(model, data, sums, batch_size):
            _accumulate(totals, counts, batch)
            examples += size
            if not bounded or examples >= len(data):
                continue
            pair = batch.get(metric)
            count = None if pair is None else _count(pair[1])
            wrong = None if pair is None else _count(pair[0])
            yb_count = total_count * size // len(data)  # uniform per example in a tensor split
            if (count is None or wrong is None or count != yb_count or not 0 <= wrong <= count
                    or not all(math.isfinite(float(total)) for total, _ in batch.values())):
                bounded = False
                continue
            errors, seen = errors + wrong, seen + count
            decided = goal_decision(errors, seen, total_count, goal, maximize)
            if decided is not None:
                return {name: decided[0]}, {name: decided[1]}
    finally:
        model.train(was_training)
    return _means(totals, counts, split), {}
