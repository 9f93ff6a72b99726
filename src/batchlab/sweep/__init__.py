"""batchlab.sweep: whole batch-size studies in parallel, resumable, with progress and vectorized trials.

>>> from batchlab.sweep import load_sweep_config, prepare_sweep, run_sweep
>>> plan = prepare_sweep(load_sweep_config("sweep.toml"))   # validates everything, writes nothing
>>> summary = run_sweep(plan)                                # runs what is not yet in the store

``SweepConfig(workloads=[...])`` takes registered names, references (``package.module:function``,
``path/to/file.py:function``) and :class:`~batchlab.workloads.Workload` objects; pool and Dask
workers re-import the reference (a workload registered only in this process is refused with one
line; run it with ``executor_factory=InlineExecutor``). Ctrl-C raises :class:`SweepInterrupted`.

Modules: ``config`` (pydantic model, TOML, the step-budget rule), ``keys`` (sweep ids, stable trial
keys, id blocks, seeds), ``plan`` (studies and their study definitions, trials, tasks), ``executors``
(local process pool, Dask, inline), ``worker`` (what a worker runs), ``vectorized`` (K trials as one
torch.func computation), ``budget`` (the growth rule), ``claims`` (trial claims: concurrent drivers share the work), ``runner`` (the driver and the summary of the
sweep's own trials), ``progress`` (rich display and JSON lines). The command line is ``batchlab
sweep``; docs/methods.md ("Sweeps") defines the budget rule, budget growth and what the table reports.
"""

from batchlab.sweep.config import SweepConfig, load_sweep_config, parse_sweep_config, sweep_config_from_options
from batchlab.sweep.runner import SweepInterrupted, SweepSummary, prepare_sweep, run_sweep

__all__ = ["SweepConfig", "SweepInterrupted", "SweepSummary", "load_sweep_config", "parse_sweep_config",
           "prepare_sweep", "run_sweep", "sweep_config_from_options"]
