"""batchlab.plots: matplotlib figures (no pyplot state), written atomically.

* :mod:`batchlab.plots.shallue`: the Shallue et al. figure types from a store (steps to result with
  resolution brackets, censored batch sizes, the fit and the regimes read from the data; optimal
  metaparameters with search-edge marks; the learning-rate/momentum plane; best measurement by budget).
* :mod:`batchlab.plots.nqm`: the noisy quadratic model's figures.

Definitions of everything drawn: docs/methods.md ("Steps-to-result figures", "Search-edge warnings").
"""
