"""Study definitions: what a set of trials was run under, and the id that names it.

A *study* is the trials of one workload and batch size run under one definition: step budget,
training examples, search space, evaluation schedule, stop rule, seed and source (docs/methods.md,
"Study definitions and ids"). The store keeps every definition under its own id, so trials run under
different definitions at the same workload and batch size (a 3000-step ``train`` and a 100-step
``sweep``, or the release and a re-run) are never pooled by accident.

>>> d = make_study_definition(workload="mnist/simple_cnn/sgd", batch_size=64, train_steps=1000)
>>> study_id(d)            # 12 hex digits of sha256 of the canonical JSON of ``d``
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
from collections.abc import Mapping
from typing import Any

from batchlab.errors import BatchlabError
from batchlab.store.schema import split_workload

#: The keys every definition has (``extra`` keys come on top).
DEFINITION_KEYS = (
    "workload", "batch_size", "train_steps", "train_examples", "search_space", "evaluation",
    "stop_rule", "seed", "source",
)
#: Trial ids come in blocks of this many: a sweep gives each of its study definitions a block of its
#: own (ids ``block * TRIAL_ID_BLOCK + 1 + point``, one-based like the release; :func:`id_block`), and
#: ``Store.next_trial_id`` never gives out an id inside a block that holds a sweep's trials, so a sweep
#: can always be extended by more trials.
TRIAL_ID_BLOCK = 100_000


def id_block(trial_id: int) -> int:
    """The id block trial id ``trial_id`` falls in: block ``k`` holds ids ``k * TRIAL_ID_BLOCK + 1`` to
    ``(k + 1) * TRIAL_ID_BLOCK`` (an id 0, written by a batchlab whose sweep ids started at 0, is in
    block -1)."""
    return (int(trial_id) - 1) // TRIAL_ID_BLOCK

#: Prefix of the id of a study written by a batchlab older than study definitions (no definition
#: stored): ``sha256("legacy:<workload>/<batch_size>")``, one such study per workload and batch size.
LEGACY_PREFIX = "legacy:"


def _plain(value: Any) -> Any:
    """JSON fallback for numpy scalars and arrays."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _jsonable(name: str, value: Any) -> Any:
    """``value`` round-tripped through JSON (tuples -> lists, numpy -> Python); BatchlabError if it
    is not JSON-able or holds NaN/infinity (a definition must hash the same everywhere)."""
    try:
        return json.loads(json.dumps(value, sort_keys=True, allow_nan=False, default=_plain))
    except (TypeError, ValueError) as exc:
        raise BatchlabError(f"study definition field {name!r} is not plain JSON ({exc})") from None


def _int_or_none(name: str, value: Any, minimum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise BatchlabError(f"study definition field {name!r} must be an integer >= {minimum} or null, got {value!r}")
    return int(value)


def _check_stop_rule(stop_rule: Any) -> dict | None:
    if stop_rule is None:
        return None
    if not isinstance(stop_rule, Mapping) or set(stop_rule) != {"metric", "goal", "maximize"}:
        raise BatchlabError(
            "study definition field 'stop_rule' must be null or an object with exactly the keys "
            f"metric, goal, maximize; got {stop_rule!r}"
        )
    metric, goal, maximize = stop_rule["metric"], stop_rule["goal"], stop_rule["maximize"]
    if not isinstance(metric, str) or not metric:
        raise BatchlabError(f"stop_rule metric must be a non-empty string, got {metric!r}")
    if isinstance(goal, bool) or not isinstance(goal, numbers.Real) or not math.isfinite(goal):
        raise BatchlabError(f"stop_rule goal must be a finite number, got {goal!r}")
    if not isinstance(maximize, (bool,)) and not (hasattr(maximize, "dtype") and maximize.dtype == bool):
        raise BatchlabError(f"stop_rule maximize must be true or false, got {maximize!r}")
    return {"metric": metric, "goal": float(goal), "maximize": bool(maximize)}


def make_study_definition(
    *,
    workload: str,
    batch_size: int,
    train_steps: int | None,
    train_examples: int | None = None,
    search_space: Mapping[str, Any] | None = None,
    evaluation: Mapping[str, Any] | None = None,
    stop_rule: Mapping[str, Any] | None = None,
    seed: int | None = None,
    source: str = "batchlab",
    device: str | None = None,
    **extra: Any,
) -> dict:
    """A validated, plain-JSON study definition: the keys of :data:`DEFINITION_KEYS` plus ``extra``.

    ``train_steps``: the step budget (updates) of each trial (None: unknown). ``train_examples``:
    training examples used (None: the whole training set, or unknown). ``search_space``: batch_science
    ``parameter_configs``. ``evaluation``: the evaluation schedule, e.g. ``{"rule": "geometric",
    "resolution": 0.05}``, ``{"rule": "steps", "steps": [...]}`` or ``{"rule": "release"}``.
    ``stop_rule``: None, or ``{"metric", "goal", "maximize"}``: trials stop at the first evaluation
    that meets the goal (status STOPPED_AT_GOAL). ``extra`` keys (``sweep``, ``budget_round``,
    ``learning_rate_decay``, ...) must be plain JSON. ``device``: the device type the trials ran on
    (``"cuda"``, ``"mps"``; an index as in ``"cuda:1"`` is dropped); it becomes the key ``device``
    only when given and not ``"cpu"``, so a CPU definition (and its id) is the same as before devices
    existed, and GPU studies are kept apart from CPU ones. BatchlabError names the first bad field.
    """
    if not isinstance(workload, str):
        raise BatchlabError(f"study definition field 'workload' must be a string, got {workload!r}")
    split_workload(workload)
    batch_size = _int_or_none("batch_size", batch_size, 1)
    if batch_size is None:
        raise BatchlabError("study definition field 'batch_size' must be an integer >= 1, got None")
    if not isinstance(source, str) or not source:
        raise BatchlabError(f"study definition field 'source' must be a non-empty string, got {source!r}")
    if search_space is not None and not isinstance(search_space, Mapping):
        raise BatchlabError(f"study definition field 'search_space' must be an object or null, got {search_space!r}")
    if evaluation is not None:
        if not isinstance(evaluation, Mapping) or not isinstance(evaluation.get("rule"), str):
            raise BatchlabError(
                "study definition field 'evaluation' must be null or an object with a string 'rule' "
                f"(geometric, steps, release, ...); got {evaluation!r}"
            )
    if device is not None and (not isinstance(device, str) or not device):
        raise BatchlabError(f"study definition field 'device' must be a non-empty string or null, got {device!r}")
    clash = sorted(set(extra) & set(DEFINITION_KEYS))
    if clash:
        raise BatchlabError(f"study definition extra keys {clash} repeat standard keys")
    definition = {
        "workload": workload,
        "batch_size": batch_size,
        "train_steps": _int_or_none("train_steps", train_steps, 0),
        "train_examples": _int_or_none("train_examples", train_examples, 1),
        "search_space": _jsonable("search_space", dict(search_space)) if search_space is not None else None,
        "evaluation": _jsonable("evaluation", dict(evaluation)) if evaluation is not None else None,
        "stop_rule": _check_stop_rule(stop_rule),
        "seed": _int_or_none("seed", seed, 0),
        "source": source,
    }
    if device is not None and device.split(":")[0] != "cpu":
        definition["device"] = device.split(":")[0]  # the type: cuda:0 and cuda:1 run one study
    for key, value in extra.items():
        definition[key] = _jsonable(key, value)
    return definition


def canonical_json(definition: Mapping[str, Any]) -> str:
    """The canonical JSON text of a definition (sorted keys, compact separators)."""
    return json.dumps(definition, sort_keys=True, separators=(",", ":"), allow_nan=False, default=_plain)


def study_id(definition: Mapping[str, Any]) -> str:
    """12 hex digits of the sha256 of :func:`canonical_json` of ``definition``."""
    return hashlib.sha256(canonical_json(definition).encode("utf-8")).hexdigest()[:12]


def legacy_study_id(workload: str, batch_size: int) -> str:
    """The id of the one study of (workload, batch_size) written before study definitions existed."""
    return hashlib.sha256(f"{LEGACY_PREFIX}{workload}/{int(batch_size)}".encode("utf-8")).hexdigest()[:12]


def early_stopping(definition: Mapping[str, Any]) -> bool:
    """Whether trials of the study may stop before their budget: a stop rule, or a definition that
    says so without one (the release's ``early_stopping`` flag)."""
    return definition.get("stop_rule") is not None or bool(definition.get("early_stopping", False))


def check_definition(definition: Mapping[str, Any], workload: str, batch_size: int) -> dict:
    """``definition`` re-validated through :func:`make_study_definition`; BatchlabError if it is not
    a definition or names another workload or batch size than the trial it is given with."""
    if not isinstance(definition, Mapping):
        raise BatchlabError(f"study_definition must be a dict from make_study_definition, got {definition!r}")
    missing = [k for k in ("workload", "batch_size") if k not in definition]
    if missing:
        raise BatchlabError(f"study_definition lacks {missing}; build it with make_study_definition")
    if definition["workload"] != workload or definition["batch_size"] != batch_size:
        raise BatchlabError(
            f"study_definition is for {definition['workload']} at batch size {definition['batch_size']}, "
            f"but the trial is {workload} at batch size {batch_size}"
        )
    fields = dict(definition)
    fields.setdefault("train_steps", None)
    return make_study_definition(**fields)
