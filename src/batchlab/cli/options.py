"""The command-line options that several commands share, each declared once.

Every command declares its parameters as ``name: Option = default`` with the ``Annotated`` types
below, so a flag has one spelling, one help text and one parse everywhere (the selection options of
``analyze`` and ``plot``, the trial options of ``train``, ``study`` and ``sweep``, ``--device``,
``--workers``/``--dask``/``--scheduler``, ``--json``). A command-specific option is declared in its command with the same ``Annotated`` style.

Parsing that turns option text into library values lives here too (:func:`parse_max_trials`,
:func:`parse_studies`, :func:`parse_csv`, :func:`store_units`, :func:`unit_selections`); deciding what the values mean is
the library's (:class:`batchlab.analysis.selection.Selection`, :mod:`batchlab.sweep.config`,
:func:`batchlab.train.device.check_device`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from batchlab.errors import BatchlabError
from batchlab.finite import INT64_MAX

# --- the selection options of ``analyze`` and ``plot`` -----------------------------------------------

Store = Annotated[Path, typer.Option("--store", help="Store directory.")]
StoreOrTable = Annotated[Optional[Path], typer.Option("--store", help="Store directory (or give --steps-table).")]
WORKLOAD_OPTION_HELP = ("Workload: DATASET/MODEL with --optimizer (without it: every optimizer of it the store holds), "
                        "or the store's DATASET/MODEL/OPTIMIZER.")
StoreWorkload = Annotated[str, typer.Option("--workload", help=WORKLOAD_OPTION_HELP)]
StoreWorkloadOrTable = Annotated[Optional[str], typer.Option(
    "--workload", help=WORKLOAD_OPTION_HELP + " Or give --steps-table.")]
WorkloadFilter = Annotated[Optional[str], typer.Option(
    "--workload", help="Only this workload: " + WORKLOAD_OPTION_HELP[len("Workload: "):])]
StoreOptimizer = Annotated[Optional[str], typer.Option(
    "--optimizer", help="Optimizer of a DATASET/MODEL --workload (comma-separate for several; default: every "
                        "optimizer of it the store holds).")]
Metric = Annotated[Optional[str], typer.Option(
    "--metric", help="Metric name, e.g. val/classification_error (default: the studies' recorded stop rule, else "
                     "the registered workload's goal).")]
Goal = Annotated[Optional[float], typer.Option(
    "--goal", help="Goal the metric must strictly beat (default: the studies' recorded stop rule, else the "
                   "registered workload's goal).")]
Maximize = Annotated[Optional[bool], typer.Option(
    "--maximize/--minimize",
    help="Higher (--maximize) or lower (--minimize) is better (default: the direction of the studies' stop rule "
         "or the workload's goal on that metric, else lower).")]
MaxTrials = Annotated[str, typer.Option(
    "--max-trials", metavar="N|all|auto",
    help="Use only the first N trials (trial-id order) per batch size; 'all': every trial; 'auto' (default): "
         "the paper's first 100 COMPLETE trials (50 for lm1b/lstm, common_crawl/transformer_base and "
         "lm1b/transformer_shallow/sgd) for imported release workloads, refusing a batch size with fewer, "
         "and every trial otherwise (docs/methods.md, \"Trial counts\").")]
StepBudget = Annotated[Optional[int], typer.Option(
    "--step-budget", min=1, max=INT64_MAX, help="Keep measurements with step <= N.")]
ExampleBudget = Annotated[Optional[int], typer.Option(
    "--example-budget", min=1, max=INT64_MAX, help="Keep measurements with batch_size * step <= N.")]
#: The most resampling replicates ``--bootstrap`` takes (each one resamples every batch size's trials).
MAX_BOOTSTRAP = 100_000
#: ``--seed`` of the resampling commands (checked by :func:`check_seed`, used or not).
Seed = Annotated[int, typer.Option("--seed", help="Resampling seed (an integer >= 0).")]
Statuses = Annotated[list[str], typer.Option(
    "--status",
    help="Trial statuses to analyse (repeat to add); default COMPLETE and STOPPED_AT_GOAL (trials stopped at "
         "their study's stop goal answer only that goal or looser ones).")]
Studies = Annotated[Optional[list[str]], typer.Option(
    "--study", metavar="ID",
    help="Use only trials of this study id or sweep id (repeat or comma-separate for several), as one result; "
         "default: one result per study group (a sweep, or studies with the same settings; docs/methods.md, "
         "\"Units\"), refusing a batch size whose chosen trials come from more than one study definition.")]
MixStudies = Annotated[bool, typer.Option(
    "--mix-studies", help="Pool the trials of every study (or of the --study ones) of a workload as one result, "
                          "different study definitions at one batch size included (reported as mixed_studies).")]
Tolerance = Annotated[float, typer.Option(
    "--tolerance",
    help="Tolerance of the regimes read from the data, in (0, 1) (docs/methods.md, \"Regimes read from the data\").")]
Level = Annotated[float, typer.Option("--level", help="Interval coverage, in (0, 1).")]


def check_seed(seed: int) -> int:
    """``--seed`` if it is >= 0; BatchlabError (one line) otherwise, also where no resampling uses it."""
    if seed < 0:
        raise BatchlabError(f"seed must be an integer >= 0, got {seed}")
    return seed


def check_level(level: float) -> float:
    """``--level`` if it lies in (0, 1); BatchlabError (one line) otherwise."""
    if not 0 < level < 1:
        raise BatchlabError(f"--level must be in (0, 1), got {level}")
    return level


B0 = Annotated[Optional[float], typer.Option(
    "--b0", help="Batch size perfect scaling is measured from (a reached one; default: the smallest reached). "
                 "Give the same B0 to optimizers you compare.")]
FigureOut = Annotated[Path, typer.Option("--out", help="Figure file to write (.png, .pdf or .svg).")]
Fit = Annotated[bool, typer.Option("--fit/--no-fit", help="Draw the fitted S(B) = S_min + E_min / B.")]

#: ``--search-space FILE`` of ``study`` and ``sweep`` (read by :func:`batchlab.search.search_spaces_from_file`).
SearchSpaceFile = Annotated[Optional[Path], typer.Option(
    "--search-space", metavar="FILE",
    help="The search space, in the batch_science parameter_configs form (JSON or TOML: one space, or spaces keyed "
         "by optimizer name), instead of the workload's or the optimizer's default (docs/methods.md, "
         "\"Search-space files\").")]

Race = Annotated[bool, typer.Option(
    "--race/--no-race",
    help="Stop each trial as soon as it can no longer be among its study's two best (status RACED): the same "
         "steps to result, bracket, best trial and steps interval as the full protocol, for less compute "
         "(docs/methods.md, 'Racing'). Needs stopping at the goal.")]

#: The default of ``--status`` (the analysis' default statuses).
DEFAULT_STATUSES = ["COMPLETE", "STOPPED_AT_GOAL", "RACED"]

# --- output ----------------------------------------------------------------------------------------

Json = Annotated[bool, typer.Option("--json", help="Print JSON, one object per line (non-finite numbers as null).")]


def json_option(help: str) -> Any:
    """The ``--json`` flag with a command's own description of what it prints."""
    return Annotated[bool, typer.Option("--json", help=help)]


# --- training: ``train``, ``study``, ``sweep`` -------------------------------------------------------

WORKLOAD_HELP = ("Workload: a registered name (dataset/model, e.g. mnist/fc_128_128_128; see batchlab workloads), "
                 "package.module:function or path/to/file.py:function returning a batchlab Workload "
                 "(docs/workloads.md).")
Workload = Annotated[str, typer.Argument(help=WORKLOAD_HELP, metavar="WORKLOAD")]
Device = Annotated[str, typer.Option(
    "--device", metavar="auto|cpu|cuda|cuda:N|mps",
    help="Where trials train: auto (default: a GPU when one is present, else cpu; a sweep's pool then runs one "
         "worker per GPU), cpu, cuda, cuda:N or mps. Results are bitwise reproducible only on one machine, torch build and CPU capability (docs/methods.md, \"Devices and reproducibility\").")]
Optimizer = Annotated[str, typer.Option("--optimizer", help="Optimizer name (see batchlab optimizers).")]
BatchSize = Annotated[int, typer.Option("--batch-size", help="Examples per update.")]
Steps = Annotated[Optional[int], typer.Option("--steps", help="Step budget (default: the workload's).")]
TrainExamples = Annotated[Optional[int], typer.Option(
    "--train-examples", help="Train on a random subset of N examples.")]
StopAtGoal = Annotated[bool, typer.Option(
    "--stop-at-goal/--no-stop-at-goal",
    help="Stop a trial at its first evaluation that beats the goal (status STOPPED_AT_GOAL; the default "
         "everywhere, see batchlab.train.TrialSpec).")]
EvalBudget = Annotated[Optional[float], typer.Option(
    "--eval-budget", help="Keep evaluation within this fraction F of training, counted in examples (e.g. 0.1): "
                          "thins the schedule and evaluation subsets (batchlab.train.evaluation.budgeted_plan).")]
TrainEvalExamples = Annotated[Optional[int], typer.Option(
    "--train-eval-examples", help="Measure train/* metrics on a fixed subset of at most N training examples.")]
Resolution = Annotated[float, typer.Option(
    "--resolution", help="Relative spacing R of the goal-metric evaluations, in (0, 1): consecutive evaluation "
                         "steps within a factor 1+R, every step while 1/R is larger; steps to the goal are read to "
                         "within that (docs/methods.md, 'Evaluation schedule and resolution').")]
Refine = Annotated[str, typer.Option(
    "--refine", help="How the goal metric is measured at the resolution steps: replay (default: only in the "
                     "bracket where the goal is first met, by retraining a copy kept at the previous full "
                     "evaluation) or dense (at every resolution step as the trial runs).")]


# --- where the work runs: ``sweep``, ``advise``, ``probe branched`` -----------------------------------

Workers = Annotated[Optional[int], typer.Option("--workers", help="Worker processes (default: cores).")]
Dask = Annotated[bool, typer.Option("--dask", help="Run on a Dask LocalCluster of --workers processes on 127.0.0.1.")]
Scheduler = Annotated[Optional[str], typer.Option(
    "--scheduler", metavar="ADDR", help="Run on the running Dask scheduler at ADDR (tcp://HOST:PORT).")]


# --- parsing ----------------------------------------------------------------------------------------

def parse_max_trials(value: Any) -> int | str | None:
    """``--max-trials`` as :class:`~batchlab.analysis.selection.Selection` takes it: a positive int,
    ``"all"``, ``"auto"`` or ``None`` (every trial). BatchlabError (one line) for anything else."""
    if value is None or isinstance(value, int) and not isinstance(value, bool):
        if value is not None and not 1 <= value <= INT64_MAX:
            raise BatchlabError(f"--max-trials must be a positive integer, 'all' or 'auto', got {value!r}")
        return value
    text = str(value).strip().lower()
    if text in ("all", "auto"):
        return text
    try:
        number = int(text)
    except ValueError:
        number = 0
    if not 1 <= number <= INT64_MAX:
        raise BatchlabError(f"--max-trials must be a positive integer, 'all' or 'auto' (at most 2^63 - 1), got {str(value)!r}")
    return number


def parse_studies(values: Any) -> tuple[str, ...] | None:
    """``--study`` values (repeated and/or comma-separated) as a tuple of ids; ``None`` when none given."""
    if not values:
        return None
    if isinstance(values, str):
        values = [values]
    ids = tuple(dict.fromkeys(part.strip() for value in values for part in str(value).split(",") if part.strip()))
    if not ids:
        raise BatchlabError("--study needs a study id or sweep id")
    return ids


def parse_csv(value: str | None, flag: str, cast: Any = str) -> list | None:
    """A comma-separated option (``--optimizer sgd,adam``, ``--batch-sizes 16,64``) as a list; ``None``
    when not given. BatchlabError (one line) for an empty list, an empty item (``4,,8``), an item
    ``cast`` refuses, or an item given twice (never dropped silently)."""
    if value is None:
        return None
    items = [v.strip() for v in value.split(",")]
    if not any(items):
        raise BatchlabError(f"{flag} needs a comma-separated list, got {value!r}")
    if not all(items):
        raise BatchlabError(f"{flag} has an empty item in {value!r}; allowed: items separated by single commas")
    try:
        values = [cast(v) for v in items]
    except ValueError:
        kind = {int: "integers", float: "numbers"}.get(cast, "values")
        raise BatchlabError(f"{flag} must be a comma-separated list of {kind}, got {value!r}") from None
    repeated = sorted({f"{v:g}" if isinstance(v, float) else str(v) for v in values if values.count(v) > 1})
    if repeated:
        raise BatchlabError(f"{flag} must be distinct, got {', '.join(repeated)} more than once in {value!r}")
    return values


def store_units(con, workload: str, optimizer: str | None = None, studies: Any = None, mix_studies: bool = False):
    """The units (:class:`batchlab.analysis.units.Unit`) that ``--workload``, ``--optimizer``,
    ``--study`` and ``--mix-studies`` select in the store behind ``con``: one result each
    (:func:`batchlab.analysis.units.select_units`). BatchlabError (one line) for a workload the
    store does not hold (naming those it holds), or one without trials."""
    from batchlab.analysis.selection import store_workloads
    from batchlab.analysis.units import select_units

    names = store_workloads(con, workload, parse_csv(optimizer, "--optimizer"))
    units = select_units(con, names, parse_studies(studies), mix_studies)
    if not units:
        raise BatchlabError(f"workload {', '.join(names)}: the store holds no trials of it")
    return units


def unit_selections(con, units, metric: str | None, goal: float | None, maximize: bool | None = None,
                    max_trials: Any = None, step_budget: int | None = None, example_budget: int | None = None,
                    statuses: Any = None, mix_studies: bool = False) -> list:
    """One :class:`~batchlab.analysis.selection.Selection` per unit (same order), from the selection
    options; an omitted ``--metric``, ``--goal`` or direction is the unit's own goal
    (:func:`batchlab.analysis.units.unit_selection`)."""
    from batchlab.analysis.units import unit_selection

    extra = {} if statuses is None else {"statuses": tuple(statuses)}
    return [unit_selection(con, unit, metric, goal, maximize, max_trials=parse_max_trials(max_trials),
                           step_budget=step_budget, example_budget=example_budget, mix_studies=mix_studies, **extra)
            for unit in units]


def connect_store(store: Path):
    """A DuckDB connection with the four store views (BatchlabError if ``store`` is not a store)."""
    from batchlab.store import Store

    return Store.open(store, create=False).connect()


def open_store(path: str | Path):
    """Open the store at ``path`` for writing, creating it when missing and saying so on stderr
    (:meth:`batchlab.store.Store.open_or_create`: a path whose parent directory does not exist is a
    one-line error, and nothing is created)."""
    from batchlab.cli.output import note
    from batchlab.store import Store

    store, created = Store.open_or_create(path)
    if created:
        note(f"created a new store at {path}")
    return store
