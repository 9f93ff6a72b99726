"""NQM problems: a curvature spectrum, a per-example gradient-noise spectrum and initial second moments.

A :class:`Problem` is diagonal. Each entry ``j`` stands for ``counts[j]`` identical directions (one for an
exact spectrum, many for a binned one) with curvature ``h_j``, per-example noise variance ``c_j`` (a batch
of ``B`` examples has gradient-noise variance ``c_j / B``) and initial second moment ``s0_j = E[x_j(0)^2]``.
The expected loss is ``1/2 sum_j counts_j h_j E[x_j^2]`` (docs/methods.md, "The model").

Presets:

* ``zhang2019``: ``h_i = 1/i``, ``D = 10^4``, ``c = h``, ``x0 ~ N(0, I)``; initial loss 4.8938.
* ``zhang2019-binned``: the official notebook's 100 geometric bins ``b_j = 10^(-4 j / 99)``; each ``1/i`` is
  rounded *down* to the nearest bin value (``bin(i) = min{j : b_j <= 1/i}``); empty bins dropped (84 left);
  initial loss 4.7025.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from batchlab.errors import BatchlabError, unknown_name_error

_PRESET_BUILDERS = {"zhang2019": lambda: zhang2019(), "zhang2019-binned": lambda: zhang2019_binned()}
PRESETS = tuple(_PRESET_BUILDERS)


@dataclass(frozen=True, eq=False)
class Problem:
    """A diagonal noisy quadratic problem (arrays of equal length J, one entry per direction or bin).

    Attributes:
        curvature: ``h_j > 0``.
        noise: per-example gradient-noise variance ``c_j >= 0`` (a batch of B gives ``c_j / B``).
        counts: number of directions ``n_j >= 1`` each entry stands for.
        initial_second_moment: ``s0_j = E[x_j(0)^2] >= 0``.
        name: a label for tables and figures.
    """

    curvature: np.ndarray
    noise: np.ndarray
    counts: np.ndarray
    initial_second_moment: np.ndarray
    name: str = "custom"
    metadata: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        arrays = {}
        for key in ("curvature", "noise", "counts", "initial_second_moment"):
            value = np.atleast_1d(np.asarray(getattr(self, key), dtype=float))
            if value.ndim != 1:
                raise BatchlabError(f"problem {self.name!r}: {key} must be one-dimensional, got shape {value.shape}")
            arrays[key] = value
        h = arrays["curvature"]
        if h.size == 0:
            raise BatchlabError(f"problem {self.name!r}: the spectrum is empty; give at least one eigenvalue")
        for key, value in arrays.items():
            if value.shape != h.shape:
                raise BatchlabError(f"problem {self.name!r}: {key} has {value.size} entries, curvature has {h.size}")
            if not np.all(np.isfinite(value)):
                raise BatchlabError(f"problem {self.name!r}: {key} must be finite")
        if np.any(h <= 0):
            raise BatchlabError(f"problem {self.name!r}: curvatures must be > 0, got min {h.min():g}")
        if np.any(arrays["noise"] < 0):
            raise BatchlabError(f"problem {self.name!r}: noise variances must be >= 0")
        if np.any(arrays["counts"] < 1):
            raise BatchlabError(f"problem {self.name!r}: counts must be >= 1")
        if np.any(arrays["initial_second_moment"] < 0):
            raise BatchlabError(f"problem {self.name!r}: initial second moments must be >= 0")
        for key, value in arrays.items():
            value.setflags(write=False)
            object.__setattr__(self, key, value)

    @property
    def dimension(self) -> int:
        """Number of directions D (the sum of the counts; the lower bound uses D, not the bin count)."""
        return int(round(float(self.counts.sum())))

    @property
    def loss_weights(self) -> np.ndarray:
        """``counts * h / 2``: the expected loss is ``loss_weights @ E[x^2]``."""
        return 0.5 * self.counts * self.curvature

    def initial_loss(self) -> float:
        """Expected loss at step 0."""
        return float(self.loss_weights @ self.initial_second_moment)

    def describe(self) -> dict:
        """JSON-ready summary."""
        return {
            "name": self.name,
            "entries": int(self.curvature.size),
            "dimension": self.dimension,
            "curvature_max": float(self.curvature.max()),
            "curvature_min": float(self.curvature.min()),
            "initial_loss": self.initial_loss(),
            **self.metadata,
        }


def zhang2019(dimension: int = 10_000) -> Problem:
    """The exact NQM of Zhang et al. (2019): ``h_i = 1/i``, ``c = h``, ``s0 = 1``."""
    return power_law(1.0, 1.0, dimension, name="zhang2019")


def zhang2019_binned(dimension: int = 10_000, bins: int = 100) -> Problem:
    """The official notebook's binned NQM (docs/methods.md, "The model"): ``1/i`` rounded down onto ``geomspace(1, 1e-4, bins)``."""
    _check_dimension(dimension)
    values = np.geomspace(1.0, 1e-4, bins)
    h = 1.0 / np.arange(1, dimension + 1)
    index = np.searchsorted(-values, -h, side="left")
    if np.any(index >= bins):  # 1/i below the smallest bin value has no bin to round down to
        raise BatchlabError(f"binned NQM: dimension {dimension} has curvatures below the smallest bin 1e-4; use <= 10000")
    counts = np.bincount(index, minlength=bins).astype(float)
    keep = counts > 0
    return Problem(
        curvature=values[keep],
        noise=values[keep],
        counts=counts[keep],
        initial_second_moment=np.ones(int(keep.sum())),
        name="zhang2019-binned",
        metadata={"bins": int(bins), "non_empty_bins": int(keep.sum())},
    )


def power_law(a: float, b: float, dimension: int, name: str | None = None) -> Problem:
    """``h_i = i^-a`` and ``c_i = i^-b`` for ``i = 1..D``, ``s0 = 1`` (one entry per direction)."""
    _check_dimension(dimension)
    for label, value in (("a", a), ("b", b)):
        if not np.isfinite(value) or value < 0:
            raise BatchlabError(f"power law: exponent {label} must be a finite number >= 0, got {value}")
    try:  # only the allocations: Problem's own checks keep their messages
        i = np.arange(1, dimension + 1, dtype=float)
        ones = np.ones(dimension)
    except (MemoryError, ValueError) as exc:  # numpy refuses an array this large, or cannot allocate it
        raise BatchlabError(f"power law: dimension {dimension} needs more memory than this machine has ({exc}); "
                            "use a smaller --dim or a binned --spectrum") from None
    return Problem(
        curvature=i**-a,
        noise=i**-b,
        counts=ones,
        initial_second_moment=ones.copy(),
        name=name or f"power-law a={a:g} b={b:g} D={dimension}",
    )


def from_eigenvalues(eigenvalues, noise=None, name: str = "spectrum") -> Problem:
    """A problem with the given curvature eigenvalues, noise ``c = h`` unless given, ``s0 = 1``."""
    h = np.asarray(eigenvalues, dtype=float).ravel()
    if h.size == 0:
        raise BatchlabError(f"spectrum {name!r} is empty; give at least one eigenvalue")
    if not np.all(np.isfinite(h)) or np.any(h <= 0):
        bad = h[~(np.isfinite(h) & (h > 0))][0]
        raise BatchlabError(f"spectrum {name!r}: eigenvalues must be finite and > 0, got {bad:g}")
    c = h.copy() if noise is None else np.asarray(noise, dtype=float).ravel()
    return Problem(curvature=h, noise=c, counts=np.ones(h.size), initial_second_moment=np.ones(h.size), name=name)


def spectrum_from_file(path: str | Path) -> Problem:
    """Read eigenvalues from a UTF-8 text file: one eigenvalue per line, ``#`` comments and blank lines allowed.

    Every line has either one number ``h`` (then ``c = h``) or two numbers ``h c`` (curvature and
    per-example noise variance), separated by whitespace or a comma; all lines have the same form.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BatchlabError(f"cannot read spectrum file {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise BatchlabError(f"spectrum file {str(path)!r} is not a UTF-8 text file of numbers") from None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.replace(",", " ").split()
        try:
            values = [float(v) for v in fields]
        except ValueError:
            raise BatchlabError(f"spectrum file {str(path)!r} line {number}: not a number: {line!r}") from None
        if len(values) > 2:
            raise BatchlabError(f"spectrum file {str(path)!r} line {number}: expected 'h' or 'h c', got {len(values)} numbers")
        rows.append(values)
    if not rows:
        raise BatchlabError(f"spectrum file {str(path)!r} is empty; give one eigenvalue per line")
    if len({len(r) for r in rows}) != 1:
        raise BatchlabError(f"spectrum file {str(path)!r}: mix of 1- and 2-column lines; use 'h' or 'h c' throughout")
    array = np.asarray(rows, dtype=float)
    noise = array[:, 1] if array.shape[1] == 2 else None
    if noise is not None and (not np.all(np.isfinite(noise)) or np.any(noise < 0)):
        raise BatchlabError(f"spectrum file {str(path)!r}: noise variances must be finite and >= 0")
    return from_eigenvalues(array[:, 0], noise, name=path.name)


def preset(name: str) -> Problem:
    """A named preset (``zhang2019`` or ``zhang2019-binned``)."""
    if name not in _PRESET_BUILDERS:
        raise unknown_name_error("preset", name, PRESETS)
    return _PRESET_BUILDERS[name]()


def information_lower_bound(problem: Problem, target: float, batch_size) -> np.ndarray:
    """Information-theoretic lower bound on steps, ``D / (2 C B)`` (docs/methods.md, "The model"; uses D, not bins)."""
    return problem.dimension / (2.0 * float(target) * np.asarray(batch_size, dtype=float))


def _check_dimension(dimension: int) -> None:
    if int(dimension) != dimension or dimension < 1:
        raise BatchlabError(f"dimension must be a positive integer, got {dimension}")


def select_problem(
    preset_name: str = "zhang2019-binned",
    power_law_exponents: str | tuple[float, float] | None = None,
    dim: int | None = None,
    spectrum: str | Path | None = None,
) -> Problem:
    """The problem chosen by ``batchlab nqm``'s problem options: a power law (``"A,B"`` or ``(A, B)`` with
    ``dim``), else a spectrum file, else the named preset. At most one of ``power_law_exponents`` and
    ``spectrum``; ``dim`` only with a power law. Bad combinations are one-line errors naming the options."""
    chosen = [name for name, value in (("--power-law", power_law_exponents), ("--spectrum", spectrum)) if value is not None]
    if len(chosen) > 1:
        raise BatchlabError("give at most one of --power-law and --spectrum")
    if power_law_exponents is not None:
        try:
            parts = power_law_exponents.split(",") if isinstance(power_law_exponents, str) else power_law_exponents
            a, b = (float(v) for v in parts)
        except (TypeError, ValueError):
            raise BatchlabError(f"--power-law must be 'A,B' (two numbers), got {power_law_exponents!r}") from None
        if dim is None:
            raise BatchlabError("--power-law needs --dim D")
        return power_law(a, b, dim)
    if dim is not None:
        raise BatchlabError("--dim only applies with --power-law")
    if spectrum is not None:
        return spectrum_from_file(spectrum)
    return preset(preset_name)


@contextmanager
def fits_in_memory(problem: Problem):
    """Context manager: running out of memory on a too-large ``problem`` becomes a one-line user error."""
    try:
        yield
    except MemoryError:
        raise BatchlabError(
            f"problem {problem.name!r} ({problem.curvature.size} eigenvalues) needs more memory than this machine has; "
            "use a smaller --dim or a binned --spectrum"
        ) from None
