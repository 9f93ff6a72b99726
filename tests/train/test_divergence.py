import math

from batchlab.train.divergence import DIVERGENCE_FACTOR, DivergenceMonitor


def test_non_finite_loss_diverges_at_once():
    for bad in (math.nan, math.inf, -math.inf):
        monitor = DivergenceMonitor()
        assert not monitor.diverged(2.3)
        assert monitor.diverged(bad)


def test_single_spike_is_tolerated_but_sustained_growth_is_not():
    monitor = DivergenceMonitor()
    assert not monitor.diverged(2.3)
    assert not any(monitor.diverged(0.5) for _ in range(50))
    assert not monitor.diverged(2.3 * DIVERGENCE_FACTOR * 2)  # one unlucky batch
    assert not any(monitor.diverged(0.5) for _ in range(50))
    steps = 0
    while not monitor.diverged(2.3 * DIVERGENCE_FACTOR * 3):
        steps += 1
        assert steps < 20


def test_small_start_loss_is_floored():
    monitor = DivergenceMonitor()
    assert not monitor.diverged(1e-4)
    assert not any(monitor.diverged(0.5) for _ in range(100))  # 5000x the start, yet below 10 nats
    assert monitor.threshold == DIVERGENCE_FACTOR * 1.0
