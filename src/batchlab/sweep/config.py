"""The sweep definition: a pydantic model, loaded from TOML or built from command-line options.

A sweep is the product workloads x optimizers x batch sizes; each (workload, optimizer, batch size)
is one *study* with ``trials`` quasi-random points of its optimizer's search space and one step
budget. Everything is validated here, before any trial runs: a bad value becomes one
:class:`~batchlab.errors.BatchlabError` line naming the field and the allowed values.
:func:`sweep_config_from_options` is the command line's way in (it holds the defaults of
``batchlab sweep`` and combines WORKLOAD, ``--config`` and ``--search-space``, the command line
winning); :func:`load_sweep_config` reads a TOML file (UTF-8); :class:`SweepConfig` takes Python
values (``workloads`` may hold :class:`~batchlab.workloads.Workload` objects).

TOML layout (all keys top level; ``search_spaces`` and ``budgets`` are tables; README.md, "Sweep
config files", documents every key, with ``src/batchlab/sweep/examples/mnist_fc128_sgd_momentum.toml``)::

    workloads = ["mnist/fc_128_128_128"]   # names, package.module:function or path/to/file.py:function
    optimizers = ["sgd", "momentum"]
    batch_sizes = [16, 64, 256]
    trials = 16
    store = "runs/fc128"
    # Step budget per batch size B (docs/methods.md, "Sweeps"), the first that applies:
    # [budgets] table > steps (the same budget at every B) > budget_epochs > the workload's default:
    #   steps(B) = min(max_steps, max(min_steps, ceil(examples / B)))
    # with examples = budget_epochs x training examples, or, by default, the workload's
    # default_steps x default_batch_size; min_steps defaults to the workload's default_steps.
    # steps = 2000             # a fixed budget at every batch size
    # budget_epochs = 8.0      # a fixed number of epochs at small B ...
    # min_steps = 3000         # ... with a floor of steps at large B
    # max_steps = 100000       # an optional cap (small B may then be censored)
    train_examples = 10000     # absent: the whole training set
    seed = 0
    stop_at_goal = true        # the default (as for batchlab train and study)
    race = false               # stop trials that can no longer be among a study's two best (status RACED)
    batch_order = "trial"      # "trial": each trial its own batch order; "shared": one order per study
    grow_budget = false        # raise the budget of studies whose trials all ran out of steps
    # grow_factor = 2.0        # ... by this factor (decay and warmup steps stretch with the budget)
    # max_budget_growths = 2   # ... at most this many times
    # refine_search = 4        # after the sweep's trials, up to 4 more trials around the best trial of
    #                          # each study a tuning flag fires for (a recorded search round 1)
    # schedule = "constant"    # default search spaces: "constant" or "linear" (decay over [T/2, T])
    # resolution = 0.05        # evaluation steps within a factor 1 + resolution of each other
    executor = "local"         # or "dask" (with workers = K: a LocalCluster on 127.0.0.1)
    # scheduler = "tcp://10.0.0.1:8786"   # an existing Dask scheduler
    workers = 2                # absent: the number of cores
    device = "auto"            # "auto" | "cpu" | "cuda" | "cuda:N" | "mps"
    vectorize = "auto"         # "auto" | "always" | "never"
    # vectorize_trials = 16    # trials per vectorized task
    # evaluations = 20         # regular evaluations of every metric per trial (absent: the workload's);
    #                          # the goal metric is also evaluated at the resolution steps
    # goal = 0.1               # goal on the workload's metric (absent: the workload's): trials stop at it
    #                          # with stop_at_goal, resolve its bracket, and the table and growth rule use it

    [budgets]                  # per-batch-size step budgets (override ``steps``)
    16 = 4000

    [search_spaces.momentum.learning_rate]   # batch_science parameter_configs, per optimizer (absent: the
                                             # workload's declared space, else the optimizer's default)
    type = "DOUBLE"
    min_value = 1e-3
    max_value = 10.0
    scale = "LOG_SCALE"
"""

from __future__ import annotations

import math
import numbers
import os
import re
from typing import Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, field_validator,
                      model_validator)

from batchlab.errors import BatchlabError
from batchlab.store.studies import TRIAL_ID_BLOCK

#: Trials stop at their first evaluation that beats the goal unless told otherwise: the one default of
#: ``SweepConfig.stop_at_goal``, ``batchlab sweep``, ``batchlab train`` and ``batchlab study``.
DEFAULT_STOP_AT_GOAL = True

#: The optimizers of a sweep given on the command line without ``--optimizer``.
DEFAULT_OPTIMIZERS = ("sgd",)

#: The device of a sweep's trials unless told otherwise (batchlab.train.device.resolve_device).
DEFAULT_DEVICE = "auto"

#: The largest number of trials per study: each study definition of a sweep owns one block of this
#: many trial ids (batchlab.store.studies.TRIAL_ID_BLOCK).
MAX_TRIALS_PER_STUDY = TRIAL_ID_BLOCK


class SweepConfig(BaseModel):
    """A validated sweep definition (see the module docstring for the meaning of each field)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workloads: list[str] = Field(min_length=1)
    optimizers: list[str] = Field(min_length=1)
    batch_sizes: list[StrictInt] = Field(min_length=1)
    trials: StrictInt = Field(ge=1, le=MAX_TRIALS_PER_STUDY)
    store: str | None = None
    steps: StrictInt | None = Field(default=None, ge=1)
    budget_epochs: float | None = Field(default=None, gt=0.0, le=1e6)
    min_steps: StrictInt | None = Field(default=None, ge=1)
    max_steps: StrictInt | None = Field(default=None, ge=1)
    budgets: dict[int, StrictInt] = Field(default_factory=dict)
    train_examples: StrictInt | None = Field(default=None, ge=1)
    seed: StrictInt = Field(default=0, ge=0, lt=2**31)
    stop_at_goal: StrictBool = DEFAULT_STOP_AT_GOAL
    grow_budget: StrictBool = False
    grow_factor: float = Field(default=2.0, gt=1.0, le=100.0)
    max_budget_growths: StrictInt = Field(default=2, ge=0, le=10)
    refine_search: int | None = None
    executor: Literal["local", "dask"] = "local"
    workers: StrictInt | None = Field(default=None, ge=1, le=4096)
    scheduler: str | None = None
    evaluations: StrictInt | None = Field(default=None, ge=1, le=10_000)
    resolution: float = Field(default=0.05, gt=0.0, lt=1.0)
    schedule: Literal["constant", "linear"] = "constant"
    goal: float | None = None
    device: str = DEFAULT_DEVICE
    vectorize: Literal["auto", "always", "never"] = "auto"
    vectorize_trials: StrictInt = Field(default=16, ge=1, le=1024)
    race: StrictBool = False
    batch_order: Literal["trial", "shared"] = "trial"
    search_spaces: dict[str, dict[str, dict[str, Any]]] = Field(default_factory=dict)

    # Counts and switches are strict (TOML ``true`` is not the batch size 1, ``"yes"`` is not a switch);
    # the two real-valued fields take ints and floats but neither booleans nor non-finite values.
    @field_validator("goal", "grow_factor", "budget_epochs", "resolution", mode="before")
    @classmethod
    def _finite_real(cls, value: Any) -> Any:
        if value is None:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"must be a finite number, got {value!r}")
        return value

    @field_validator("refine_search", mode="before")
    @classmethod
    def _refine_budget(cls, value: Any) -> Any:
        """A positive integer (extra trials per flagged study, at most MAX_TRIALS_PER_STUDY), or absent:
        no refined search."""
        if value is None:
            return value
        try:
            return refine_budget(value, "the refine budget")
        except BatchlabError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("workloads", mode="before")
    @classmethod
    def _workload_keys(cls, value: Any) -> Any:
        """Workload objects (the Python API) become the key that resolves them in any process
        (:func:`batchlab.workloads.workload_key`; registered here first)."""
        if not isinstance(value, (list, tuple)):
            return value
        if all(isinstance(v, str) for v in value):
            return list(value)
        from batchlab.workloads import Workload

        out = []
        for item in value:
            if isinstance(item, Workload):
                from batchlab.workloads import register_workload, workload_key

                register_workload(item)
                item = workload_key(item)
            out.append(item)
        return out

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        """The name's form only (as :func:`batchlab.train.device.check_device` reads it: stripped, lower
        case); whether this machine has the device is :func:`check_names`' question."""
        text = value.strip().lower()
        if not re.fullmatch(r"auto|cpu|cuda|cuda:\d+|mps", text):
            raise ValueError(f"unknown device {value!r}; allowed: auto, cpu, cuda, cuda:N, mps")
        return text

    @field_validator("batch_sizes")
    @classmethod
    def _positive_unique_batch_sizes(cls, value: list[int]) -> list[int]:
        if any(b < 1 for b in value):
            raise ValueError(f"batch sizes must be positive integers, got {value}")
        if len(set(value)) != len(value):
            raise ValueError(f"batch sizes must be distinct, got {value}")
        return sorted(value)

    @field_validator("workloads", "optimizers")
    @classmethod
    def _distinct_names(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"names must be distinct, got {value}")
        return value

    @field_validator("scheduler")
    @classmethod
    def _scheduler_address(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"(tcp|tls|inproc|ucx)://[^\s/:]+(:\d+)?", value):
            raise ValueError(f"scheduler must look like tcp://HOST:PORT, got {value!r}")
        return value

    @model_validator(mode="after")
    def _cross_field_checks(self) -> "SweepConfig":
        unknown = sorted(set(self.budgets) - set(self.batch_sizes))
        if unknown:
            raise ValueError(
                f"budgets: batch sizes {unknown} are not in batch_sizes; allowed: {self.batch_sizes}"
            )
        bad = {b: s for b, s in self.budgets.items() if s < 1}
        if bad:
            raise ValueError(f"budgets: step budgets must be >= 1, got {bad}")
        if self.race and not self.stop_at_goal:
            raise ValueError("race needs trials that stop at the goal; allowed: race = true with stop_at_goal = true")
        if self.steps is not None and self.budget_epochs is not None:
            raise ValueError("steps (a fixed budget) and budget_epochs (an epoch budget) exclude each other; "
                             "allowed: one of them")
        for name in ("min_steps", "max_steps"):
            if self.steps is not None and getattr(self, name) is not None:
                raise ValueError(f"{name} bounds the epoch budget and cannot be combined with steps (a fixed "
                                 "budget); allowed: steps alone, or budget_epochs with min_steps/max_steps")
        if self.min_steps is not None and self.max_steps is not None and self.min_steps > self.max_steps:
            raise ValueError(f"min_steps {self.min_steps} exceeds max_steps {self.max_steps}; allowed: "
                             "min_steps <= max_steps")
        extra = sorted(set(self.search_spaces) - set(self.optimizers))
        if extra:
            raise ValueError(f"search_spaces: optimizers {extra} are not in optimizers; allowed: {self.optimizers}")
        return self

    @property
    def uses_dask(self) -> bool:
        """True when trials run on Dask (``executor = "dask"`` or a ``scheduler`` address)."""
        return self.executor == "dask" or self.scheduler is not None

    def budget_rule(self, workload: Any) -> dict[str, Any]:
        """The step-budget rule of ``workload``'s studies, as recorded in their study definitions.

        ``{"rule": "fixed", "steps": S}`` with ``steps``; else ``{"rule": "examples", "examples": X,
        "min_steps": S, "max_steps": M, "basis": ...}``: ``steps(B) = min(M, max(S, ceil(X / B)))``,
        where ``X`` is ``budget_epochs`` x the training examples (basis ``"epochs"``) or the workload's
        ``default_steps x default_batch_size`` (basis ``"workload"``). A ``budgets`` table (per batch
        size) overrides either and is recorded under ``"budgets"``.
        """
        if self.steps is not None:
            rule: dict[str, Any] = {"rule": "fixed", "steps": int(self.steps)}
        else:
            if self.budget_epochs is not None:
                available = int(workload.split_sizes["train"])
                num_train = min(self.train_examples or available, available)
                examples = int(math.ceil(float(self.budget_epochs) * num_train))
                basis = {"basis": "epochs", "epochs": float(self.budget_epochs), "train_examples": num_train}
            else:
                examples = int(workload.default_steps) * int(workload.default_batch_size)
                basis = {"basis": "workload", "default_steps": int(workload.default_steps),
                         "default_batch_size": int(workload.default_batch_size)}
            rule = {"rule": "examples", "examples": examples,
                    "min_steps": int(self.min_steps if self.min_steps is not None else workload.default_steps),
                    "max_steps": None if self.max_steps is None else int(self.max_steps), **basis}
        if self.budgets:
            rule["budgets"] = {str(b): int(s) for b, s in sorted(self.budgets.items())}
        return rule

    def study_steps(self, workload: Any, batch_size: int) -> int:
        """The step budget of the study of ``workload`` at ``batch_size`` (before any growth)."""
        return steps_from_rule(self.budget_rule(workload), batch_size)

    def resolved_workers(self) -> int:
        """Number of worker processes: ``workers`` or the number of usable cores."""
        if self.workers is not None:
            return self.workers
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # pragma: no cover - not Linux
            return max(1, os.cpu_count() or 1)


def steps_from_rule(rule: dict[str, Any], batch_size: int) -> int:
    """The step budget at ``batch_size`` under a :meth:`SweepConfig.budget_rule`."""
    table = rule.get("budgets") or {}
    if str(int(batch_size)) in table:
        return int(table[str(int(batch_size))])
    if rule["rule"] == "fixed":
        return int(rule["steps"])
    steps = max(int(rule["min_steps"]), math.ceil(rule["examples"] / int(batch_size)))
    if rule.get("max_steps") is not None:
        steps = min(steps, int(rule["max_steps"]))
    return int(steps)


def parse_sweep_config(data: dict[str, Any], source: str = "sweep config") -> SweepConfig:
    """Validate ``data`` into a :class:`SweepConfig`, checking workload, optimizer and search-space names.

    Raises:
        BatchlabError: one line naming ``source``, the field and the allowed values.
    """
    try:
        config = SweepConfig.model_validate(data)
    except ValidationError as exc:
        raise BatchlabError(f"{source}: {_one_line(exc)}") from None
    check_names(config, source)
    return config


def load_sweep_config(path: str | os.PathLike, overrides: dict[str, Any] | None = None) -> SweepConfig:
    """Read a TOML sweep file, apply command-line ``overrides`` (non-None values win), validate.

    Overriding ``optimizers`` also drops the file's ``search_spaces`` of the optimizers it leaves out.

    Raises:
        BatchlabError: the file is missing, unreadable, not UTF-8, not TOML, or invalid (one line naming
            the field).
    """
    from batchlab.search.files import parse_toml, read_text

    data = parse_toml(read_text(path, "sweep config"), str(path))
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    spaces = data.get("search_spaces")
    if "optimizers" in given and isinstance(spaces, dict):
        data["search_spaces"] = {k: v for k, v in spaces.items() if k in given["optimizers"]}
    data.update(given)
    return parse_sweep_config(data, source=str(path))


def sweep_config_from_options(workload: Any = None, config: str | os.PathLike | None = None,
                              options: dict[str, Any] | None = None,
                              search_space: str | os.PathLike | None = None) -> SweepConfig:
    """The sweep ``batchlab sweep`` describes: ``WORKLOAD`` with options, ``--config FILE`` with options
    overriding the file (``None`` values are not given), or both (``WORKLOAD`` replaces the file's
    ``workloads``).

    Without a file, ``optimizers`` defaults to :data:`DEFAULT_OPTIMIZERS` and ``batch_sizes``,
    ``trials`` and ``store`` are required; every other default is :class:`SweepConfig`'s.
    ``search_space`` is a ``--search-space`` file (:func:`batchlab.search.search_spaces_from_file`, for
    the sweep's optimizers): its spaces replace those of the same optimizers in ``search_spaces``.

    Raises:
        BatchlabError: neither ``workload`` nor ``config``, a missing required option, a bad search-space
            file, or anything :func:`parse_sweep_config` refuses.
    """
    given = {k: v for k, v in (options or {}).items() if v is not None}
    if workload is not None:
        given["workloads"] = [workload]
    if config is not None:
        settings = load_sweep_config(config, given)
    elif workload is None:
        raise BatchlabError("missing WORKLOAD (e.g. mnist/fc_128_128_128) or --config FILE")
    else:
        data = {"optimizers": list(DEFAULT_OPTIMIZERS), **given}
        missing = [flag for flag, key in (("--batch-sizes", "batch_sizes"), ("--trials", "trials"),
                                          ("--store", "store")) if key not in data]
        if missing:
            raise BatchlabError(f"missing {', '.join(missing)} (required without --config)")
        settings = parse_sweep_config(data, source="sweep options")
    if search_space is None:
        return settings
    from batchlab.search.files import search_spaces_from_file

    spaces = {**settings.search_spaces, **search_spaces_from_file(search_space, settings.optimizers)}
    return settings.model_copy(update={"search_spaces": spaces})  # every space validated already


def check_names(config: SweepConfig, source: str = "sweep config") -> None:
    """Check workload and optimizer names against the registries, the device against this machine
    (:func:`batchlab.train.device.check_device`) and parse every search space."""
    from batchlab.optim import get_optimizer
    from batchlab.workloads import get_workload

    from batchlab.train.device import check_device

    try:
        check_device(config.device)
    except BatchlabError as exc:
        raise BatchlabError(f"{source}: field 'device': {exc}") from None

    for name in config.workloads:
        try:
            get_workload(name)
        except BatchlabError as exc:
            raise BatchlabError(f"{source}: field 'workloads': {exc}") from None
    for name in config.optimizers:
        try:
            get_optimizer(name)  # one entry (point) at a time: a broken unrelated plugin cannot block a sweep
        except BatchlabError as exc:
            raise BatchlabError(f"{source}: field 'optimizers': {exc}") from None
    if config.search_spaces:
        from batchlab.search import SearchSpace

        for optimizer, configs in config.search_spaces.items():
            try:
                SearchSpace.from_batch_science(configs)
            except BatchlabError as exc:
                raise BatchlabError(f"{source}: field 'search_spaces.{optimizer}': {exc}") from None


def _one_line(exc: ValidationError) -> str:
    """The first validation error as ``field 'a.b': message; allowed ...`` on one line."""
    error = exc.errors()[0]
    loc = ".".join(str(part) for part in error["loc"]) or "(top level)"
    if error["type"] == "extra_forbidden":
        allowed = ", ".join(SweepConfig.model_fields)
        return f"unknown field {loc!r}; allowed fields: {allowed}"
    if error["type"] == "missing":
        return f"field {loc!r} is required"
    message = str(error["msg"]).replace("\n", " ")
    message = message.removeprefix("Value error, ")
    return f"field {loc!r}: {message}"


def refine_budget(value: Any, what: str = "--refine-search BUDGET") -> int:
    """``value`` as a refine budget: extra trials per flagged study, an integer from 1 to
    :data:`MAX_TRIALS_PER_STUDY` (a string of ASCII digits, from the command
    line, is read as one). BatchlabError (one line naming ``what`` and the allowed values) otherwise."""
    text = value.strip() if isinstance(value, str) else value
    digits = text[1:] if isinstance(text, str) and text.startswith("+") else text
    if isinstance(digits, str) and digits.isascii() and digits.isdigit():  # not "²": isdigit() alone takes it
        text = int(digits)
    if (isinstance(text, bool) or not isinstance(text, numbers.Integral) or text < 1
            or text > MAX_TRIALS_PER_STUDY):
        raise BatchlabError(f"{what} must be a positive integer, 1 to {MAX_TRIALS_PER_STUDY} (more trials per "
                            f"flagged study; at most one id block), got {value!r:.40}")
    return int(text)
