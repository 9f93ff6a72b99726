"""The units of a report: which trials of a store each analysed curve rests on (docs/methods.md, "The report").

A unit is one store workload under one study group; the grouping is the analysis' own
(:mod:`batchlab.analysis.units`, shared with ``batchlab analyze`` and ``batchlab plot``), re-exported
here for the report's modules.
"""

from batchlab.analysis.units import SETTINGS_KEYS, Unit, find_units, restricted, unit_examples, unit_goal

__all__ = ["SETTINGS_KEYS", "Unit", "find_units", "restricted", "unit_examples", "unit_goal"]
