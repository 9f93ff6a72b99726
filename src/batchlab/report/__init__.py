"""``batchlab report``: one self-contained HTML page (and a CSV beside it) from a measurement store.

* :mod:`batchlab.report.units`: which trials each analysed curve (unit) rests on;
* :mod:`batchlab.report.content`: the numbers and figures of each unit, comparisons, NQM, steps tables;
* :mod:`batchlab.report.verdict`: the learning-rate scaling-rule verdict;
* :mod:`batchlab.report.html` and :mod:`batchlab.report.csv`: the page and the table;
* :mod:`batchlab.report.build`: :func:`build_report`, checks, analysis and atomic writes.

docs/methods.md, "The report", defines every quantity the page shows.
"""
