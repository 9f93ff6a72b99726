"""The collectives of one measured :class:`~batchlab.probes.tracker.NoiseScaleTracker` step under ``torch.distributed``.

Every rank runs the same collectives at the same steps: the small norms' sum over the data-parallel
group (``sync``), and each FSDP2-sharded ``.grad``'s squared norm summed over its shard groups
(:mod:`batchlab.probes.sharded_parameters`). Each all-reduced vector carries one more entry, the
count of ranks that have nothing to measure at the step, so such a rank takes part instead of
leaving the others waiting in the collective, and every rank learns that it must raise.
"""

from __future__ import annotations

import numpy as np
import torch


def all_reduce_sum(values: np.ndarray, device: torch.device, group=None) -> np.ndarray:
    """Sum a float64 vector over ``group`` (default: the world), on the device its backend reduces on:
    the CPU for gloo, else ``device`` (the parameters' device: this rank's accelerator)."""
    import torch.distributed as dist

    try:
        backend = dist.get_backend(group)
        device = torch.device("cpu") if backend == "gloo" else device
    except (AttributeError, RuntimeError, ValueError):
        device = torch.device("cpu")
    tensor = torch.as_tensor(values, dtype=torch.float64).to(device)
    dist.all_reduce(tensor, group=group)
    return tensor.cpu().numpy()


def reduced_norms(small: np.ndarray, big_sq: np.ndarray, *, world_size: int, sync: bool, process_group,
                  shard_groups: list, device: torch.device, failed: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """``(small, big_sq, others)`` after the step's collectives.

    ``small``: per tensor, this rank's mean squared small norm, averaged over the ``world_size``
    ranks of ``process_group`` when ``sync``; ``big_sq``: per tensor, the squared ``.grad`` norm, a
    sharded one's summed over its ``shard_groups`` entry ``(indices, process groups)``; ``failed``:
    this rank has nothing to measure (its vectors are zeros); ``others``: how many other ranks had
    nothing to measure."""
    import torch.distributed as dist

    n = len(small)
    flag = 1.0 if failed else 0.0
    failures = 0.0
    big_sq = big_sq.copy()
    groups = [(index, list(process_groups)) for index, process_groups in shard_groups]
    if (sync and process_group is None and len(groups) == 1 and len(groups[0][1]) == 1
            and dist.get_world_size(groups[0][1][0]) == world_size):
        # plain FSDP2 on the whole world: one all-reduce for the small and the big norms together
        index, _ = groups.pop()
        total = all_reduce_sum(np.concatenate([small, big_sq[index], [flag]]), device)
        small, big_sq[index], failures = total[:n] / world_size, total[n:-1], total[-1]
    elif sync:
        total = all_reduce_sum(np.concatenate([small, [flag]]), device, process_group)
        small, failures = total[:n] / world_size, total[-1]
    for index, process_groups in groups:
        part = np.concatenate([big_sq[index], [flag]])
        for group in process_groups:
            part = all_reduce_sum(part, device, group)
        big_sq[index], failures = part[:-1], max(failures, part[-1])
    return small, big_sq, int(round(failures)) - (1 if failed else 0)


__all__ = ["all_reduce_sum", "reduced_norms"]
