"""batchlab.search: search spaces in the batch_science form and their quasi-random points.

``SearchSpace.from_batch_science(parameter_configs)`` / ``to_batch_science()``,
``space.sample(n, seed)``, ``space.point(index, seed)``, ``study_points_seed(seed, workload, optimizer,
batch_size)`` (each study's own sequence), ``default_search_space(optimizer, ...)``,
``study_search_space(optimizer, given, workload, ...)`` (which space a study searches) and
``search_spaces_from_file(path, optimizers)`` (``--search-space FILE``).
"""

from batchlab.search.defaults import default_search_space, study_search_space
from batchlab.search.files import search_spaces_from_file
from batchlab.search.space import POINTS_RULE, SCALES, TYPES, Parameter, SearchSpace, study_points_seed

__all__ = ["POINTS_RULE", "SCALES", "TYPES", "Parameter", "SearchSpace", "default_search_space",
           "search_spaces_from_file", "study_points_seed", "study_search_space"]
