"""batchlab.analysis: from measurements (or NQM curves) to steps to result and critical batch sizes.

Modules (import what you need; this package imports nothing heavy on its own):

* ``curve``: :class:`StepsCurve`, the steps-to-result curve shared by the NQM and measured data.
* ``critical_batch_size``: the S(B) = S_min + E_min / B fit, its summary, regimes, intervals.
* ``definitions``: the one registry of named critical batch sizes (``REGISTRY``, ``definition_names``,
  ``get_definition``); every summary, table and interval iterates it.
* ``regimes``: Shallue et al.'s regimes read from the measured points.
* ``tables``: the four store views (workloads, studies, trials, measurements; their names are
  :mod:`batchlab.store.schema`'s); ``connect_tables`` builds them from pandas/Arrow tables.
* ``selection``: :class:`Selection` (workload, metric, goal, maximize, statuses, studies,
  mix_studies, max_trials, budgets) and the study rules (one study definition per batch size,
  stop-at-goal compatibility, the paper's trial counts) and ``store_workloads`` (what ``--workload``
  names).
* ``units``: the units every command answers (one workload under one study group: a sweep, or the
  studies with the same settings; ``find_units``, ``select_units``), each unit's goal (``unit_goal``)
  and its :class:`Selection` (``unit_selection``), shared by ``analyze``, ``plot``, ``report`` and
  ``predict``.
* ``steps_to_result``: steps to result per batch size with Shallue et al.'s exact rules, in DuckDB,
  with each value's resolution bracket (``steps_lower``, ``censored_at``) and studies.
* ``budgets``: the best measurement under a step or example budget.
* ``metaparameters``: the best trials' learning rate / momentum / effective learning rate, the
  linear and square-root heuristics, and every trial's outcome for the (lr, 1 - momentum) scatter.
* ``bootstrap``: intervals for steps to result, the fit and the named critical batch sizes
  (docs/methods.md says which quantity each interval is for and how its coverage was checked).
* ``steps_table``: the same fit for a plain table of steps per batch size (CSV or Parquet), per group.
"""
