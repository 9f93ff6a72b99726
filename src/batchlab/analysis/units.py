"""Units: which trials of a store each analysed curve rests on (docs/methods.md, "The report", "Units").

``batchlab analyze``, ``batchlab plot``, ``batchlab report`` and ``batchlab predict`` all answer per unit.

A *unit* is one store workload ``dataset/model/optimizer`` under one *study group*; its curve, fit and
figures use only the trials of the group's analysed studies. Different settings are never pooled:

* **Sweep studies** (the definition has a ``sweep`` key) form one group per (sweep id, device). As in
  the sweep's own table (docs/methods.md, "What the sweep's table reports, and from which trials"), at
  each batch size the study of the last budget round (largest ``budget_round``) is analysed, but with
  every stored trial of it (the sweep's table: only the points its config plans; a larger run of the
  same sweep may have stored more); earlier rounds are listed but not analysed.
* **Other studies** (``batchlab train``/``study``, imports) are grouped by their *settings*: source,
  ``train_examples``, evaluation rule, stop rule, device, race and batch order (everything but the
  batch size, the step budget, the search space and the seed). A settings group with at most one
  study at each batch size is one unit; one with two or more studies at a batch size is split into
  one unit per study id. Search rounds are not counted as studies here.
* A **search round** (``--refine-search``: ``search_round = 1`` and ``refine.study``) is analysed with
  the study it refines, in that study's unit: at most one per study (the smallest study id when a
  store holds several); any other is skipped, with the reason.
* A store written before study ids existed: one unit per workload with every trial.

:func:`restricted` makes the connection's ``trials`` and ``studies`` views show one unit's studies
only (as :func:`batchlab.sweep.summary.restrict_to_sweep` does for a sweep's trial keys), so every
analysis function, unchanged, sees exactly the unit's trials.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass, field

import duckdb

from batchlab.analysis.selection import Selection, is_search_round, refined_study_id
from batchlab.analysis.tables import view_columns
from batchlab.errors import BatchlabError

#: The keys of a non-sweep study definition that set what its trials measure (docs/methods.md, "The report").
SETTINGS_KEYS = ("source", "train_examples", "evaluation", "stop_rule", "device", "race", "batch_order")


@dataclass
class Unit:
    """One analysed curve: a store workload under one study group.

    Attributes:
        workload: ``dataset/model/optimizer``.
        group: a short id of the study group (``sweep <id>``, ``studies <hash>``, ``study <id>``,
            ``all trials``); units of one base workload with equal ``group`` are compared.
        rule: how the group was formed, in words (shown on the page).
        study_ids: the analysed studies: one per batch size (:attr:`batch_study`), plus at most one
            search round (``--refine-search``) of each, analysed with the study it refines.
        definitions: ``{study_id: definition}`` of the analysed studies.
        batch_study: ``{batch_size: study_id}`` of the analysed studies (not their search rounds).
        skipped_studies: ``{study_id: why}``: studies of the group not analysed (earlier budget rounds,
            search rounds of a study not analysed, a second search round of a study).
    """

    workload: str
    group: str
    rule: str
    study_ids: tuple[str, ...] | None
    definitions: dict[str, dict] = field(default_factory=dict)
    batch_study: dict[int, str] = field(default_factory=dict)
    skipped_studies: dict[str, str] = field(default_factory=dict)

    @property
    def base(self) -> str:
        """``dataset/model``."""
        return self.workload.rsplit("/", 1)[0]

    @property
    def optimizer(self) -> str:
        return self.workload.rsplit("/", 1)[1]

    @property
    def name(self) -> str:
        """``dataset/model/optimizer [group]``: unique in a report."""
        return f"{self.workload} [{self.group}]"

    def setting(self, key: str) -> list:
        """The distinct values of definition ``key`` over the analysed studies (JSON-comparable order)."""
        seen = {}
        for d in self.definitions.values():
            value = d.get(key)
            seen.setdefault(json.dumps(value, sort_keys=True, default=str), value)
        return list(seen.values())


def _settings_key(definition: dict) -> str:
    return json.dumps({k: definition.get(k) for k in SETTINGS_KEYS}, sort_keys=True, default=str)


def _short_hash(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:8]


def find_units(con: duckdb.DuckDBPyConnection) -> list[Unit]:
    """Every unit of the store behind ``con`` (see the module docstring), sorted by workload and group."""
    workloads = [r[0] for r in con.execute("SELECT DISTINCT workload FROM trials ORDER BY workload").fetchall()]
    has_ids = "study_id" in view_columns(con, "trials") and "study_id" in view_columns(con, "studies")
    units: list[Unit] = []
    for workload in workloads:
        if not has_ids:
            units.append(Unit(workload, "all trials", "store without study ids: every trial of the workload", None))
            continue
        definition_col = "definition" if "definition" in view_columns(con, "studies") else "CAST(NULL AS VARCHAR)"
        rows = con.execute(
            f"SELECT s.study_id, s.batch_size, any_value({definition_col}) FROM studies s "
            "WHERE s.workload = ? AND s.study_id IS NOT NULL AND s.study_id IN "
            "(SELECT DISTINCT study_id FROM trials WHERE workload = ?) GROUP BY ALL ORDER BY ALL",
            [workload, workload],
        ).fetchall()
        studies: dict[str, tuple[int, dict]] = {}
        for sid, batch_size, text in rows:
            try:
                definition = json.loads(text) if text else {}
            except (TypeError, ValueError):
                definition = {}
            studies[str(sid)] = (int(batch_size), definition if isinstance(definition, dict) else {})
        sweeps: dict[str, list[str]] = {}
        others: dict[str, list[str]] = {}
        for sid, (_, d) in studies.items():
            if d.get("sweep") is not None:
                sweeps.setdefault(f"{d['sweep']}|{d.get('device') or 'cpu'}", []).append(sid)
            else:
                others.setdefault(_settings_key(d), []).append(sid)
        for key, sids in sorted(sweeps.items()):
            sweep, device = key.split("|")
            unit = Unit(workload, f"sweep {sweep}" + ("" if device == "cpu" else f" {device}"),
                        f"sweep {sweep}" + ("" if device == "cpu" else f" on {device}") +
                        ": at each batch size the study of the last budget round, every stored trial of it",
                        ())
            last: dict[int, str] = {}
            rounds = [sid for sid in sids if is_search_round(studies[sid][1])]
            for sid in sids:
                b, d = studies[sid]
                if sid in rounds:
                    continue
                if b not in last or int(d.get("budget_round") or 0) > int(studies[last[b]][1].get("budget_round") or 0):
                    last[b] = sid
            for sid in sids:
                b, d = studies[sid]
                if sid not in rounds and last[b] != sid:
                    unit.skipped_studies[sid] = (f"B={b}: budget round {d.get('budget_round') or 0} "
                                                 f"(a later round, {studies[last[b]][1].get('budget_round')}, is analysed)")
            # a search round (--refine-search) is analysed with the study it refines: the same study, searched further
            refining = _attach_search_rounds(unit, rounds, set(last.values()), studies)
            _fill(unit, {sid: studies[sid] for sid in [*last.values(), *refining]})
            unit.batch_study = dict(sorted((b, sid) for b, sid in last.items()))
            units.append(unit)
        for key, sids in sorted(others.items()):
            # search rounds (--refine-search) are not studies of their own: each joins the study it refines
            rounds = [sid for sid in sids if is_search_round(studies[sid][1])]
            bases = [sid for sid in sids if sid not in rounds]
            per_batch: dict[int, list[str]] = {}
            for sid in bases:
                per_batch.setdefault(studies[sid][0], []).append(sid)
            if all(len(v) == 1 for v in per_batch.values()):
                source = studies[sids[0]][1].get("source") or "unknown source"
                unit = Unit(workload, f"studies {_short_hash(key)}",
                            f"{len(bases)} {source} stud{'y' if len(bases) == 1 else 'ies'} with the same settings, "
                            "one per batch size" + (" (with their search rounds)" if rounds else ""), ())
                refining = _attach_search_rounds(unit, rounds, set(bases), studies)
                _fill(unit, {sid: studies[sid] for sid in [*bases, *refining]})
                unit.batch_study = dict(sorted((studies[sid][0], sid) for sid in bases))
                units.append(unit)
            else:
                for sid in sorted(bases):
                    unit = Unit(workload, f"study {sid}",
                                "one study definition (its settings group has several studies at one batch size, "
                                "so each study is a unit of its own)", ())
                    refining = _attach_search_rounds(unit, [r for r in rounds if refined_study_id(studies[r][1]) == sid],
                                                     {sid}, studies)
                    _fill(unit, {s: studies[s] for s in [sid, *refining]})
                    unit.batch_study = {studies[sid][0]: sid}
                    units.append(unit)
    return units


def _attach_search_rounds(unit: Unit, rounds: list[str], analysed: set[str],
                          studies: dict[str, tuple[int, dict]]) -> list[str]:
    """The search rounds of ``rounds`` analysed with ``unit``: at most one per analysed study of
    ``analysed`` it refines (``refine.study``), ``search_round = 1``, the smallest study id when a store
    holds several (written before refine decisions were sticky). The others go to
    ``unit.skipped_studies`` with the reason."""
    taken: dict[str, str] = {}
    for sid in sorted(rounds):
        b, d = studies[sid]
        base = refined_study_id(d)
        if base not in analysed:
            unit.skipped_studies[sid] = (f"B={b}: search round {d.get('search_round')} of a study that is not "
                                         "analysed here")
        elif d.get("search_round") != 1:
            unit.skipped_studies[sid] = f"B={b}: search round {d.get('search_round')} (a study has only round 1)"
        elif base in taken:
            unit.skipped_studies[sid] = (f"B={b}: another search round of study {base} ({taken[base]}) is analysed "
                                         "(at most one per study)")
        else:
            taken[base] = sid
    return sorted(taken.values())


def _fill(unit: Unit, studies: dict[str, tuple[int, dict]]) -> None:
    unit.study_ids = tuple(sorted(studies))
    unit.definitions = {sid: d for sid, (_, d) in studies.items()}
    unit.batch_study = dict(sorted((b, sid) for sid, (b, _) in studies.items()))


@contextmanager
def restricted(con: duckdb.DuckDBPyConnection, unit: Unit):
    """Within the block, ``trials`` and ``studies`` of ``con`` show only ``unit``'s analysed studies
    (every study when ``unit.study_ids`` is None); the store's views are restored afterwards."""
    import pyarrow as pa

    names = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    if "_report_store_trials" not in names:
        con.execute("ALTER VIEW trials RENAME TO _report_store_trials")
        con.execute("ALTER VIEW studies RENAME TO _report_store_studies")
    try:
        if unit.study_ids is None:
            con.execute("CREATE OR REPLACE VIEW trials AS SELECT * FROM _report_store_trials")
            con.execute("CREATE OR REPLACE VIEW studies AS SELECT * FROM _report_store_studies")
        else:
            con.register("_report_unit_studies", pa.table({"study_id": pa.array(list(unit.study_ids), pa.string())}))
            con.execute("CREATE OR REPLACE VIEW trials AS SELECT t.* FROM _report_store_trials AS t "
                        "SEMI JOIN _report_unit_studies USING (study_id)")
            con.execute("CREATE OR REPLACE VIEW studies AS SELECT s.* FROM _report_store_studies AS s "
                        "SEMI JOIN _report_unit_studies USING (study_id)")
        yield con
    finally:
        con.execute("CREATE OR REPLACE VIEW trials AS SELECT * FROM _report_store_trials")
        con.execute("CREATE OR REPLACE VIEW studies AS SELECT * FROM _report_store_studies")


def unit_goal(unit: Unit, con: duckdb.DuckDBPyConnection) -> tuple[dict | None, str]:
    """The goal a unit is analysed at: ``({"metric", "goal", "maximize", "source"}, "")``, or
    ``(None, why)``. Its studies' stop rule (one rule for all of them), else the goal of the built-in
    workload ``dataset/model`` when the store measures its metric, else none."""
    rules = [r for r in unit.setting("stop_rule") if r]
    if len(rules) == 1 and isinstance(rules[0], dict) and rules[0].get("metric") is not None:
        rule = rules[0]
        return {"metric": rule["metric"], "goal": float(rule["goal"]), "maximize": bool(rule.get("maximize")),
                "source": "the studies' stop rule"}, ""
    if len(rules) > 1:
        return None, f"its studies have {len(rules)} different stop rules; no single goal"
    from batchlab.workloads.registry import builtin_workload

    registered = builtin_workload(unit.base)
    if registered is None:
        return None, (f"no stop rule in its studies and {unit.base!r} is not a built-in workload, so no goal is known")
    found = con.execute("SELECT 1 FROM measurements WHERE workload = ? AND metric = ? LIMIT 1",
                        [unit.workload, registered.metric]).fetchone()
    if found is None:
        return None, f"the workload's goal metric {registered.metric!r} is not measured in the store"
    return {"metric": registered.metric, "goal": float(registered.goal), "maximize": bool(registered.maximize),
            "source": f"the registered goal of {unit.base}"}, ""


def unit_examples(con: duckdb.DuckDBPyConnection, unit: Unit) -> tuple[int, int]:
    """``(trials, examples)`` of ``unit``'s sweep: the number of trials of its analysed studies and the
    sum of ``steps * batch_size`` over them, whatever their status (diverged and unreached trials cost
    compute too; ``steps`` is the store's ``trials.steps``, the updates a trial trained; a trial
    without steps counts 0 examples). The examples a sweep processed, against which ``batchlab predict``
    and the report's predictions section set a predictor's compute (docs/methods.md).

    Call it inside :func:`restricted` ``(con, unit)``: it reads the ``trials`` view as it stands.
    """
    trials, examples = con.execute("SELECT count(*), sum(steps * batch_size) FROM trials WHERE workload = ?",
                                   [unit.workload]).fetchone()
    return int(trials), int(examples or 0)


# --- the units an analysis command answers -----------------------------------------------------------


def select_units(con: duckdb.DuckDBPyConnection, workloads, studies=None, mix_studies: bool = False) -> list[Unit]:
    """The units ``batchlab analyze`` and ``batchlab plot`` answer for the store ``workloads``
    (``dataset/model/optimizer`` names the store holds), one result each, never pooled:

    * default: the units of :func:`find_units` of those workloads (one per workload and study group);
    * ``studies`` (``--study``: study ids or sweep ids): one unit per workload with exactly those
      studies (a workload none of them belongs to is left out; none at all is the one-line error of
      :func:`~batchlab.analysis.selection.resolve_study_names`);
    * ``mix_studies`` (``--mix-studies``): one unit per workload with every study (or those of
      ``studies``), pooled on purpose and reported as mixed.
    """
    from batchlab.analysis.selection import resolve_study_names, study_definitions

    workloads = list(workloads)
    if studies is None and not mix_studies:
        units = [u for u in find_units(con) if u.workload in workloads]
        return sorted(units, key=lambda u: (workloads.index(u.workload), u.group))
    units, first_error = [], None
    for workload in workloads:
        definitions = study_definitions(con, workload)
        try:
            ids = resolve_study_names(con, workload, studies)
        except BatchlabError as error:
            first_error = first_error or error
            continue
        if ids is None:
            group, rule = "all studies, mixed", "every study of the workload, pooled (--mix-studies)"
        else:
            group = ("study " if len(ids) == 1 else "studies ") + ", ".join(ids)
            rule = "the studies chosen with --study" + (", pooled (--mix-studies)" if mix_studies else "")
        unit = Unit(workload, group, rule, ids)
        unit.definitions = {sid: d for sid, d in definitions.items() if ids is None or sid in ids}
        units.append(unit)
    if not units and first_error is not None:
        raise first_error
    return units


def unit_selection(con: duckdb.DuckDBPyConnection, unit: Unit, metric: str | None = None, goal: float | None = None,
                   maximize: bool | None = None, **options) -> Selection:
    """The :class:`~batchlab.analysis.selection.Selection` that answers ``unit``: its studies, and the
    metric, goal and direction given, each defaulting to the unit's goal (:func:`unit_goal`: its
    studies' recorded stop rule, else the registered workload's goal). ``options`` are the other
    Selection fields (``max_trials``, budgets, ``statuses``, ``mix_studies``).

    Raises:
        BatchlabError: a default is needed and the unit has none (no stop rule and no registered goal,
            or studies with different stop rules: never pooled silently), or ``--goal`` is missing for
            a metric other than the unit's goal metric.
    """
    if metric is None or goal is None:
        default, why = unit_goal(unit, con)
        missing = " and ".join(f for f, v in (("--metric", metric), ("--goal", goal)) if v is None)
        if default is None:
            raise BatchlabError(f"{unit.name}: no default goal ({why}); give {missing}")
        if metric is not None and metric != default["metric"]:
            raise BatchlabError(f"{unit.name}: its goal is on {default['metric']} ({default['source']}), "
                                f"not {metric}; give --goal for {metric}")
        metric = default["metric"]
        goal = default["goal"] if goal is None else goal
        if maximize is None:
            maximize = default["maximize"]
    elif maximize is None:
        default, _ = unit_goal(unit, con)
        maximize = bool(default and default["metric"] == metric and default["maximize"])
    return Selection(workload=unit.workload, metric=metric, goal=goal, maximize=bool(maximize),
                     studies=unit.study_ids, **options)


def unit_label(unit: Unit) -> dict:
    """The JSON label of a unit's result: ``{"unit": "dataset/model/optimizer [group]", "study_group": group}``."""
    return {"unit": unit.name, "study_group": unit.group}
