"""What one steps-to-result question selects: workload, metric, goal, studies, trials and budget.

A :class:`Selection` is the full set of choices of Shallue et al.'s protocol (docs/methods.md,
"Steps to result"):

* ``workload``: the store's ``dataset/model/optimizer`` name.
* ``metric`` and ``goal``: a row *reaches* the goal when ``value < goal`` (strictly), or
  ``value > goal`` with ``maximize=True``. Non-finite values (NaN, inf: diverged runs) never reach it.
* ``statuses``: the trial statuses analysed (default ``COMPLETE``, ``STOPPED_AT_GOAL`` and ``RACED``:
  trials that ran their step budget, trials stopped early because an evaluation met their study's
  stop rule, and trials stopped by racing; a stopped trial can only answer goals its stop rule
  covers, see :func:`stop_rule_problem`; docs/methods.md, "Racing in the analysis").
* ``studies``: the study ids (or sweep ids) whose trials are used; ``None`` uses every study.
  Trials of one batch size from more than one study definition are refused unless
  ``mix_studies=True`` (and then reported as mixed).
* ``max_trials``: keep only the first N trials of those statuses per batch size, in trial-id order.
  ``None`` or ``"all"``: every trial. ``"auto"``: the paper's rule for imported release workloads
  (trials with source ``batch_science``: the first :func:`paper_max_trials` trials, refusing a
  batch size with fewer), every trial for other workloads.
* ``step_budget``: keep measurement rows with ``step <= step_budget``.
* ``example_budget``: keep rows with ``batch_size * step <= example_budget`` (an epoch budget).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import duckdb

from batchlab.analysis.tables import DEFAULT_STATUSES, TRIAL_STATUSES, view_columns
from batchlab.store.schema import BOUND_SUFFIX  # "<metric>:bound": the flag row of a bounded value
from batchlab.errors import BatchlabError, unknown_name_error

MAX_TRIALS_WORDS = ("all", "auto")


# Source of trials imported from the batch_science release (batchlab.store.batch_science_import).
RELEASE_SOURCE = "batch_science"

# Workloads whose published figures use the first 50 COMPLETE trials per batch size (100 otherwise).
PAPER_N_50 = ("lm1b/lstm/", "common_crawl/transformer_base/", "lm1b/transformer_shallow/sgd")


def paper_max_trials(workload: str) -> int:
    """Shallue et al.'s N: the first 100 COMPLETE trials per batch size, 50 for LSTM/LM1B,
    Transformer/Common Crawl and Transformer-Shallow/SGD on LM1B."""
    small = any(workload.startswith(p) if p.endswith("/") else workload == p for p in PAPER_N_50)
    return 50 if small else 100


@dataclass(frozen=True)
class Selection:
    """One steps-to-result question (see the module docstring for every field's meaning)."""

    workload: str
    metric: str
    goal: float
    maximize: bool = False
    max_trials: int | str | None = None
    step_budget: int | None = None
    example_budget: int | None = None
    statuses: tuple[str, ...] = field(default=DEFAULT_STATUSES)
    studies: tuple[str, ...] | None = None
    mix_studies: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "statuses", tuple(self.statuses))
        if not isinstance(self.goal, (int, float)) or isinstance(self.goal, bool) or not math.isfinite(float(self.goal)):
            raise BatchlabError(f"goal must be a finite number, got {self.goal!r}")
        max_trials = self.max_trials
        if isinstance(max_trials, str):
            word = max_trials.strip().lower()
            if word not in MAX_TRIALS_WORDS:
                raise BatchlabError(f"max_trials must be a positive integer, 'all' or 'auto', got {max_trials!r}")
            object.__setattr__(self, "max_trials", word)
        for name in ("max_trials", "step_budget", "example_budget"):
            value = getattr(self, name)
            if name == "max_trials" and value in MAX_TRIALS_WORDS:
                continue
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                extra = ", 'all', 'auto'" if name == "max_trials" else ""
                raise BatchlabError(f"{name} must be a positive integer{extra} or None, got {value!r}")
        if not self.statuses:
            raise BatchlabError(f"statuses must name at least one of {', '.join(TRIAL_STATUSES)}")
        for status in self.statuses:
            if status not in TRIAL_STATUSES:
                raise unknown_name_error("trial status", str(status), TRIAL_STATUSES)
        if self.studies is not None:
            studies = (self.studies,) if isinstance(self.studies, str) else tuple(self.studies)
            studies = tuple(dict.fromkeys(str(s).strip() for s in studies if str(s).strip()))
            if not studies:
                raise BatchlabError("studies must name at least one study id or sweep id (or be None for all)")
            object.__setattr__(self, "studies", studies)
        object.__setattr__(self, "mix_studies", bool(self.mix_studies))

    @property
    def fixed_max_trials(self) -> int | None:
        """The N of ``max_trials`` when it is a number; ``None`` for every trial (``None``, "all")
        and for "auto" (resolved per workload by the query)."""
        return self.max_trials if isinstance(self.max_trials, int) else None

    def describe(self) -> dict:
        """JSON-ready description of the selection."""
        return {
            "workload": self.workload,
            "metric": self.metric,
            "goal": float(self.goal),
            "maximize": self.maximize,
            "max_trials": self.max_trials,
            "step_budget": self.step_budget,
            "example_budget": self.example_budget,
            "statuses": list(self.statuses),
            "studies": None if self.studies is None else list(self.studies),
            "mix_studies": self.mix_studies,
        }


def workload_names(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Every workload in the ``workloads`` view, sorted."""
    return [row[0] for row in con.execute("SELECT DISTINCT workload FROM workloads ORDER BY workload").fetchall()]


def unknown_workload_error(workload: str, known) -> BatchlabError:
    """The one-line error for a workload not in the store (saying so when the store has none)."""
    known = list(known)
    if not known:
        return BatchlabError(f"unknown workload {workload!r}: the store has no workloads yet (import or train some first)")
    return unknown_name_error("workload", workload, known)


def store_workloads(con: duckdb.DuckDBPyConnection, workload: str, optimizers=None) -> list[str]:
    """The store workloads (``dataset/model/optimizer``) that ``--workload`` and ``--optimizer`` name,
    the one meaning of ``--workload`` in every command that reads a store:

    * ``dataset/model/optimizer``: that workload (``optimizers``, if given, must include its optimizer);
    * ``dataset/model`` with ``optimizers`` (names): ``dataset/model/<name>`` for each;
    * ``dataset/model`` alone: every optimizer of it that the store holds.

    Raises:
        BatchlabError: a name the store does not hold; the message lists the workloads it holds
            (and the closest one).
    """
    known = workload_names(con)
    name = str(workload).strip().strip("/")
    optimizers = list(dict.fromkeys(optimizers or ()))
    if name in known:
        optimizer = name.rsplit("/", 1)[1]
        if optimizers and optimizer not in optimizers:
            raise BatchlabError(f"--workload {name} names optimizer {optimizer!r}, --optimizer says "
                                f"{', '.join(optimizers)}; give one of them")
        return [name]
    if optimizers:
        wanted = [f"{name}/{o}" for o in optimizers]
        for w in wanted:
            if w not in known:
                raise unknown_workload_error(w, known)
        return wanted
    found = [w for w in known if w.rsplit("/", 1)[0] == name]
    if not found:
        raise unknown_workload_error(name, known)
    return found


def metric_names(con: duckdb.DuckDBPyConnection, workload: str) -> list[str]:
    """Every metric measured for ``workload``, sorted (a scan of that workload's measurements); the
    bound flags ``<metric>:bound`` (:data:`BOUND_SUFFIX`) are not metrics and are left out."""
    rows = con.execute(
        "SELECT DISTINCT metric FROM measurements WHERE workload = ? AND NOT suffix(metric, ?) ORDER BY metric",
        [workload, BOUND_SUFFIX],
    ).fetchall()
    return [row[0] for row in rows]


def is_bound_flag(metric: str) -> bool:
    """Whether ``metric`` names the bound flags of another metric (``<metric>:bound``)."""
    return str(metric).endswith(BOUND_SUFFIX)


def check_selection(con: duckdb.DuckDBPyConnection, selection: Selection) -> None:
    """Raise a one-line :class:`BatchlabError` if the workload or metric is not in the store.

    The message lists the workloads (or the workload's metrics) that exist.
    """
    known = workload_names(con)
    if selection.workload not in known:
        raise unknown_workload_error(selection.workload, known)
    if is_bound_flag(selection.metric):
        metrics = metric_names(con, selection.workload)
        raise BatchlabError(f"metric {selection.metric!r} holds the bound flags of {selection.metric[:-len(BOUND_SUFFIX)]!r}, "
                            f"not a metric; allowed: {', '.join(metrics)}")
    found = con.execute(
        "SELECT 1 FROM measurements WHERE workload = ? AND metric = ? LIMIT 1", [selection.workload, selection.metric]
    ).fetchone()
    if found is None:
        metrics = metric_names(con, selection.workload)
        if not metrics:
            raise BatchlabError(f"workload {selection.workload!r} has no measurements")
        raise BatchlabError(f"workload {selection.workload!r}: {unknown_name_error('metric', selection.metric, metrics)}")


# --- studies -------------------------------------------------------------------------------------


def is_search_round(definition: dict) -> bool:
    """Whether a study definition is a search round added by ``--refine-search`` (``search_round`` > 0)."""
    try:
        return int(definition.get("search_round") or 0) > 0
    except (TypeError, ValueError):
        return False


def refined_study_id(definition: dict) -> str | None:
    """The id of the study a search round refines (its ``refine.study``), or ``None``."""
    refine = definition.get("refine")
    return str(refine["study"]) if isinstance(refine, dict) and refine.get("study") else None


def study_definitions(con: duckdb.DuckDBPyConnection, workload: str) -> dict[str, dict]:
    """``{study_id: definition}`` of every study of ``workload`` in the ``studies`` view.

    ``definition`` is the parsed JSON (``{}`` when the store has none for that study). A store
    written before study ids existed has no ``study_id`` column: the result is then empty.
    """
    columns = view_columns(con, "studies")
    if "study_id" not in columns:
        return {}
    definition = "definition" if "definition" in columns else "CAST(NULL AS VARCHAR)"
    rows = con.execute(
        f"SELECT study_id, any_value({definition}) FROM studies WHERE workload = ? AND study_id IS NOT NULL "
        "GROUP BY study_id ORDER BY study_id",
        [workload],
    ).fetchall()
    out = {}
    for study_id, text in rows:
        try:
            parsed = json.loads(text) if text else {}
        except (TypeError, ValueError):
            parsed = {}
        out[str(study_id)] = parsed if isinstance(parsed, dict) else {}
    return out


def describe_study(study_id: str, definition: dict) -> str:
    """A short one-line description of a study: ``id (B=64, 3000 steps, sweep s1, ...)``."""
    parts = []
    if definition.get("batch_size") is not None:
        parts.append(f"B={definition['batch_size']}")
    if definition.get("train_steps") is not None:
        parts.append(f"{definition['train_steps']} steps")
    if definition.get("train_examples") is not None:
        parts.append(f"{definition['train_examples']} train examples")
    evaluation = definition.get("evaluation")
    if isinstance(evaluation, dict) and evaluation.get("rule"):
        rule = evaluation["rule"]
        if evaluation.get("resolution") is not None:
            rule += f" {evaluation['resolution']:g}"
        parts.append(f"evaluation {rule}")
    stop = definition.get("stop_rule")
    if isinstance(stop, dict) and stop.get("metric") is not None:
        parts.append(f"stop at {stop['metric']} {'>' if stop.get('maximize') else '<'} {stop.get('goal')}")
    race = definition.get("race")
    if isinstance(race, dict):
        parts.append(f"raced, keep {race.get('keep')}")
    if definition.get("seed") is not None:
        parts.append(f"seed {definition['seed']}")
    if definition.get("sweep") is not None:
        parts.append(f"sweep {definition['sweep']}")
    if definition.get("source") is not None:
        parts.append(f"source {definition['source']}")
    return f"{study_id} ({', '.join(parts)})" if parts else study_id


def resolve_studies(con: duckdb.DuckDBPyConnection, selection: Selection) -> tuple[str, ...] | None:
    """The study ids ``selection.studies`` names (each a study id or a sweep id); ``None`` for all.

    Raises:
        BatchlabError: a name matches no study or sweep of the workload (the message lists them).
    """
    return resolve_study_names(con, selection.workload, selection.studies)


def resolve_study_names(con: duckdb.DuckDBPyConnection, workload: str, names) -> tuple[str, ...] | None:
    """The study ids that ``names`` (study ids or sweep ids) stand for at ``workload``; ``None`` for all.

    Raises:
        BatchlabError: a name matches no study or sweep of the workload (the message lists them).
    """
    if names is None:
        return None
    definitions = study_definitions(con, workload)
    ids: list[str] = []
    for name in names:
        matched = [sid for sid, d in definitions.items() if sid == name or str(d.get("sweep", "")) == name]
        if not matched:
            raise unknown_study_error(workload, name, definitions)
        ids.extend(m for m in matched if m not in ids)
    return tuple(ids)


def unknown_study_error(workload: str, name: str, definitions: dict[str, dict]) -> BatchlabError:
    """The one-line error for a ``--study`` that matches no study id or sweep id of ``workload``."""
    if not definitions:
        return BatchlabError(f"unknown study {name!r}: workload {workload!r} has no recorded study ids")
    sweeps = sorted({str(d["sweep"]) for d in definitions.values() if d.get("sweep") is not None})
    known = "; ".join(describe_study(sid, d) for sid, d in definitions.items())
    sweep_text = f"; sweeps: {', '.join(sweeps)}" if sweeps else ""
    return BatchlabError(f"unknown study {name!r} for workload {workload!r}; known studies: {known}{sweep_text}")


def too_few_trials_error(workload: str, batch_size: int, n_available: int, n: int, statuses) -> BatchlabError:
    """``max_trials="auto"``: a release batch size has fewer selected trials than the paper's first ``n``."""
    return BatchlabError(
        f"workload {workload!r} batch size {batch_size} has {n_available} trials ({' or '.join(statuses)}), "
        f"fewer than the paper's first {n} (the default for imported release workloads); "
        "pass --max-trials all to use every trial, or --max-trials N"
    )


def mixed_studies_error(selection: Selection, batch_size: int, study_ids, definitions: dict[str, dict]) -> BatchlabError:
    """The one-line error for trials of one batch size that come from several study definitions."""
    described = "; ".join(describe_study(sid, definitions.get(sid, {})) for sid in study_ids)
    return BatchlabError(
        f"workload {selection.workload!r} batch size {batch_size}: the selected trials come from "
        f"{len(study_ids)} studies: {described}; choose one with --study ID (a study id or sweep id), "
        "or pass --mix-studies to pool them"
    )


def stop_rule_problem(selection: Selection, stop_rule) -> str | None:
    """Why trials stopped by ``stop_rule`` cannot answer ``selection`` (``None`` if they can).

    A trial stopped at the first evaluation with ``metric < stop goal`` (``>`` with ``maximize``)
    answers an analysis of the same metric and direction whose goal is the stop goal or looser
    (``goal >= stop goal``, or ``<=`` with ``maximize``): every evaluation that beats such a goal
    up to the stop is recorded. A stricter goal, another metric or the other direction may have
    been reached only after the trial stopped.
    """
    if not isinstance(stop_rule, dict) or stop_rule.get("metric") is None or stop_rule.get("goal") is None:
        return "its study records no stop rule"
    sign = ">" if stop_rule.get("maximize") else "<"
    rule = f"{stop_rule['metric']} {sign} {float(stop_rule['goal']):g}"
    if stop_rule["metric"] != selection.metric:
        return f"they stopped at {rule}, another metric than {selection.metric}"
    if bool(stop_rule.get("maximize")) != bool(selection.maximize):
        return f"they stopped at {rule}, the other direction"
    stop_goal = float(stop_rule["goal"])
    stricter = selection.goal > stop_goal if selection.maximize else selection.goal < stop_goal
    if stricter:
        return f"they stopped at {rule}, and goal {float(selection.goal):g} is stricter"
    return None


def stop_rule_error(selection: Selection, batch_size: int, study_id: str, problem: str, stop_rule) -> BatchlabError:
    """The one-line error for STOPPED_AT_GOAL trials that cannot answer the selection."""
    if isinstance(stop_rule, dict) and stop_rule.get("goal") is not None and stop_rule.get("metric") is not None:
        looser = "<=" if stop_rule.get("maximize") else ">="
        direction = " with --maximize" if stop_rule.get("maximize") else ""
        allowed = (f"allowed: metric {stop_rule['metric']}{direction} and a goal {looser} "
                   f"{float(stop_rule['goal']):g} (the stop goal or looser)")
    else:
        allowed = "allowed: leave STOPPED_AT_GOAL out with --status COMPLETE"
    return BatchlabError(
        f"workload {selection.workload!r} batch size {batch_size}: trials of study {study_id} stopped at their "
        f"goal and cannot answer {selection.metric} {'>' if selection.maximize else '<'} {float(selection.goal):g}: "
        f"{problem}; {allowed}, or choose other studies with --study"
    )
