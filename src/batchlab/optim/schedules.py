"""Learning-rate schedules as multipliers of the base rate ``learning_rate``.

Steps count updates: the multiplier for step ``t`` is the one applied by update number ``t + 1``
(``t`` updates already taken).

* constant: 1.
* linear decay (Shallue et al., docs/methods.md, "Optimizers, schedules and search spaces"): ``1 - (1 - alpha) min(t, T) / T`` with
  ``T = learning_rate_decay_steps`` and ``alpha = end_learning_rate_factor``, i.e.
  ``eta_t = eta_0 - (1 - alpha) eta_0 min(t, T) / T``: eta_0 at t = 0, alpha eta_0 from t = T on.
* linear warmup over ``W = warmup_steps`` updates multiplies the above by ``min(1, (t + 1) / W)``,
  so the first update already moves (rate eta_0 / W) and update ``W`` runs at the full rate. The
  decay clock is not shifted by the warmup.
"""

from __future__ import annotations

from collections.abc import Callable


def learning_rate_multiplier(
    step: int, decay_steps: int | None = None, end_factor: float = 0.0, warmup_steps: int = 0
) -> float:
    """The factor on the base learning rate for the update taken after ``step`` updates."""
    factor = 1.0
    if decay_steps is not None:
        factor = 1.0 - (1.0 - end_factor) * min(step, decay_steps) / decay_steps
    if warmup_steps > 0 and step < warmup_steps:
        factor *= (step + 1) / warmup_steps
    return factor


def multiplier_function(
    decay_steps: int | None, end_factor: float, warmup_steps: int
) -> Callable[[int], float] | None:
    """The schedule as a function of the step for ``torch.optim.lr_scheduler.LambdaLR``;
    ``None`` for a constant rate (no scheduler needed, no per-step cost)."""
    if decay_steps is None and warmup_steps == 0:
        return None

    def multiplier(step: int) -> float:
        return learning_rate_multiplier(step, decay_steps, end_factor, warmup_steps)

    return multiplier
