"""FSDP2 (``torch.distributed.fsdp.fully_shard``) parameters as :class:`~batchlab.probes.tracker.NoiseScaleTracker` sees them.

Autograd does not deliver gradients to the sharded parameters (``DTensor``): it delivers them to the
unsharded parameters that FSDP2 all-gathers and swaps onto the modules (``module._parameters``) for
the forward and backward passes, and then reduce-scatters their ``.grad`` into the sharded
``.grad``. :class:`ShardedParameters` finds the tracked parameters that are sharded, puts a forward
pre-hook on each module owning one (after FSDP2's own, which all-gathers) that reports whatever
tensor the module holds in that slot during the forward pass (FSDP2 keeps that unsharded parameter
object from the first all-gather on, so this happens once), and groups the sharded parameters by
the process groups their ``.grad``'s squared norm is summed over: the mesh dimensions the parameter
is sharded on (HSDP: the shard dimension only, not the replicate one). Tensor parallelism (a
``DTensor`` parameter that no forward pass swaps) is not supported.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from batchlab.errors import BatchlabError


def dtensor_type():
    """``torch.distributed.tensor.DTensor``, or None for a torch without ``torch.distributed``."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return None
    return DTensor


def sharded_indices(params: list[torch.Tensor]) -> list[int]:
    """Indices of the ``DTensor`` parameters among ``params``."""
    dtensor = dtensor_type()
    return [] if dtensor is None else [i for i, p in enumerate(params) if isinstance(p, dtensor)]


class ShardedParameters:
    """The sharded parameters ``indices`` of a tracked model, their shard ``groups`` (``(indices,
    process groups to sum over)``) and the slot hooks. ``retarget(i, tensor)`` is called when a
    forward pass shows that parameter ``i``'s gradient is delivered to ``tensor``."""

    def __init__(self, model, params: list[torch.Tensor], names: list[str], indices: list[int],
                 retarget: Callable[[int, torch.Tensor], None]):
        if not isinstance(model, nn.Module):
            raise BatchlabError("NoiseScaleTracker: sharded (DTensor) parameters need the fully_shard module itself, "
                                "not an iterable of its parameters")
        self.indices = indices
        self._params = params
        self._names = names
        self._retarget = retarget
        self.groups = self._shard_groups()
        index_of = {id(params[i]): i for i in indices}
        self._handles = []
        for module in model.modules():
            owned = [(index_of[id(t)], name) for name, t in module._parameters.items()
                     if t is not None and id(t) in index_of]
            if owned:
                self._handles.append(module.register_forward_pre_hook(self._slot_hook(owned)))

    def _shard_groups(self) -> list[tuple[np.ndarray, list]]:
        groups: dict[tuple, list[int]] = {}
        meshes = {}
        for i in self.indices:
            p = self._params[i]
            if any(placement.is_partial() for placement in p.placements):
                raise BatchlabError(f"NoiseScaleTracker: parameter {self._names[i]!r} has a partial placement; "
                                    "allowed: sharded (Shard) or replicated (Replicate) mesh dimensions")
            dims = tuple(d for d, placement in enumerate(p.placements) if placement.is_shard())
            key = (id(p.device_mesh), dims)
            meshes[key] = p.device_mesh
            groups.setdefault(key, []).append(i)
        return [(np.array(index), [meshes[key].get_group(d) for d in key[1]]) for key, index in groups.items() if key[1]]

    def _slot_hook(self, owned: list[tuple[int, str]]):
        def hook(module, args) -> None:
            slots = module._parameters
            for i, name in owned:
                t = slots.get(name)
                if t is not None and t is not self._params[i]:
                    self._retarget(i, t)

        return hook

    def unswapped(self, targets: list[torch.Tensor]) -> list[str]:
        """Names of the sharded parameters no forward pass has replaced by an unsharded one yet."""
        return [self._names[i] for i in self.indices if targets[i] is self._params[i]]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


__all__ = ["ShardedParameters", "dtensor_type", "sharded_indices"]
