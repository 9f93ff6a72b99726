"""The report's table of numbers: one CSV, long format, written beside the page.

Columns: ``unit`` (``dataset/model/optimizer [group]``, or a steps table's name), ``section``
(``steps_to_result``, ``critical_batch_size``, ``fit``, ``metaparameters``, ``verdict``,
``lr_momentum``, ``best_measurement``, ``comparison``, ``nqm``, ``steps_table``, ``tuning_flags``: one
row per tuning flag and the B_crit with and without the flagged batch sizes), ``batch_size`` (empty
where the number is not per batch size), ``quantity``, ``value``, ``lower``, ``upper`` (an interval or
bracket; empty where none or unbounded) and ``note``. Numbers are written with full precision.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable

COLUMNS = ("unit", "section", "batch_size", "quantity", "value", "lower", "upper", "note")


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if not math.isfinite(value):
            return "" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return repr(value) if not value.is_integer() else str(int(value))
    if hasattr(value, "item"):
        return _cell(value.item())
    return str(value)


def csv_text(rows: Iterable) -> str:
    """The CSV text of :class:`batchlab.report.content.Row` rows, header first."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for r in rows:
        writer.writerow([_cell(getattr(r, c)) for c in COLUMNS])
    return buffer.getvalue()
