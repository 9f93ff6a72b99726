"""Workloads the experiments define through batchlab's extension point (a ``file.py:function``
reference in a sweep config; docs/methods.md, "Workloads"), where the built-in ones are too costly for a
2-core machine.

``mnist_simple_cnn_tiny``: the Simple CNN of Shallue et al. (two 5x5 'same' convolutions with ReLU
and 2x2 max-pooling, a dense ReLU layer, a linear output) at a quarter of the narrow model's widths:
8 and 16 channels, 128 dense units (105,194 parameters against 821,706 for mnist/simple_cnn_narrow),
about 1/30 of its multiply-adds per example. The data, splits and metric are those of the built-in MNIST
CNNs; the goal is 2% validation error (the built-in CNNs' 1% needs the larger models and many more
steps).
"""

from __future__ import annotations

from dataclasses import replace

from batchlab.workloads import get_workload
from batchlab.workloads.models.simple_cnn import simple_cnn


def _tiny_cnn(input_shape=(1, 28, 28), num_classes=10):
    return simple_cnn((8, 16), 128, input_shape=input_shape, num_classes=num_classes)


def mnist_simple_cnn_tiny():
    """mnist/simple_cnn_tiny: the built-in mnist/simple_cnn_narrow with the tiny model and goal 0.02."""
    base = get_workload("mnist/simple_cnn_narrow")
    return replace(
        base,
        name="mnist/simple_cnn_tiny",
        summary="MNIST, Simple CNN conv5x5(8) > pool > conv5x5(16) > pool > FC 128 > 10",
        make_model=_tiny_cnn,
        goal=0.02,
    )
