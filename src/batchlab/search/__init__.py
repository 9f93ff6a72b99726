"""batchlab.search: search spaces in the batch_science form and their quasi-random points.

``SearchSpace.from_batch_science(parameter_configs)`` / ``to_batch_science()``,
``space.sample(n, seed)``, ``space.point(index, seed)`` and ``default_search_space(optimizer, ...)``.
"""

from batchlab.search.defaults import default_search_space
from batchlab.search.space import SCALES, TYPES, Parameter, SearchSpace

__all__ = ["SCALES", "TYPES", "Parameter", "SearchSpace", "default_search_space"]
