"""batchlab.analysis: from measurements (or NQM curves) to steps to result and critical batch sizes.

Modules (import what you need; this package imports nothing heavy on its own):

* ``curve``: :class:`StepsCurve`, the steps-to-result curve shared by the NQM and measured data.
* ``critical_batch_size``: the S(B) = S_min + E_min / B fit, named critical batch sizes, regimes.
* ``tables``: the four store views (workloads, studies, trials, measurements); ``connect_tables``
  builds them from pandas/Arrow tables.
* ``selection``: :class:`Selection` (workload, metric, goal, maximize, statuses, max_trials, budgets).
* ``steps_to_result``: steps to result per batch size with Shallue et al.'s exact rules, in DuckDB.
* ``budgets``: the best measurement under a step or example budget.
* ``metaparameters``: the best trials' learning rate / momentum / effective learning rate, the
  linear and square-root heuristics, and every trial's outcome for the (lr, 1 - momentum) scatter.
* ``bootstrap``: percentile intervals for the fit and named critical batch sizes by resampling trials.
"""
