"""batchlab.search: search spaces in the batch_science form and their quasi-random points.

``SearchSpace.from_batch_science(parameter_configs)`` / ``to_batch_science()``,
``space.sample(n, seed)``, ``space.point(index, seed)``, ``default_search_space(optimizer, ...)``,
``study_search_space(optimizer, given, workload, ...)`` (which space a study searches) and
``search_spaces_from_file(path, optimizers)`` (``--search-space FILE``).
"""

from batchlab.search.defaults import default_search_space, study_search_space
from batchlab.search.files import search_spaces_from_file
from batchlab.search.space import SCALES, TYPES, Parameter, SearchSpace

__all__ = ["SCALES", "TYPES", "Parameter", "SearchSpace", "default_search_space", "search_spaces_from_file",
           "study_search_space"]
