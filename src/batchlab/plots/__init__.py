"""batchlab.plots: matplotlib figures (no pyplot state), written atomically.

* :mod:`batchlab.plots.shallue`: the steps-to-result figures of Shallue et al. from a store (resolution
  brackets, censored batch sizes, the fit and the regimes read from the data; curves compared
  across workloads and goals).
* :mod:`batchlab.plots.tuning`: the tuned metaparameters (optimal values with search-edge marks, the
  learning-rate/momentum plane, best measurement by budget).
* :mod:`batchlab.plots.predictions`: predicted against measured critical batch sizes, B_simple across
  training.
* :mod:`batchlab.plots.nqm`: the noisy quadratic model's figures.
* :mod:`batchlab.plots.axes`: what they share: atomic saving, readable log ticks, colours.

Definitions of everything drawn: docs/methods.md ("Steps-to-result figures", "Search-edge warnings").
"""
