"""A noisy quadratic model calibrated on a real model's measurements at one checkpoint.

:func:`calibrated_problem` turns a measured curvature spectrum and gradient-noise measurements into a
:class:`batchlab.nqm.problem.Problem` for the exact engine; :func:`predict_steps` tunes it per batch size
for batchlab optimizers (mapped to NQM algorithms by :mod:`batchlab.report.nqm`) and reads the named
critical batch sizes of each tuned curve (:func:`batchlab.analysis.critical_batch_size.summarize_curve`).
Nothing of the engine is re-implemented here (docs/methods.md, "Probes", "Calibrated NQM").

Modelling choices, in order:

* **Curvature entries.** The quadratic is the model's loss around the checkpoint, diagonal in the
  eigenbasis of the measured curvature matrix (Hessian or Gauss-Newton). Given ``eigenvalues`` (the top
  ``k`` from :func:`batchlab.probes.spectrum.top_eigenvalues`) each positive one is an entry of count 1.
  Given a ``density`` (stochastic Lanczos quadrature, :class:`batchlab.probes.spectrum.SpectralDensity`)
  over ``P`` parameters, each node ``lambda_pj`` of probe ``p`` with weight ``w_pj`` stands for
  ``P w_pj / probes`` directions; with top eigenvalues as well, the density's nodes at or above the
  smallest top eigenvalue kept (above the floor below; less ``1e-6`` relative, for rounding) are
  replaced by the top eigenvalues (count 1 each), and the bulk's counts are scaled so that all counts
  add up to ``P`` less the dropped ones. Nodes are gathered into
  ``bins`` log-spaced bins (a bin's curvature is the count-weighted mean of its nodes, so ``n h`` and
  ``tr H`` are kept); a bin of fewer than one direction is merged into the next bin down (the engine
  needs counts >= 1). Eigenvalues or nodes at or below ``floor`` times the largest (default ``1e-6``;
  negative and zero ones always) are dropped: the NQM needs ``h > 0``, and directions that flat move too
  slowly to matter within any step budget. ``dropped_directions`` and ``dropped_trace_fraction`` say how
  much was dropped.
* **Noise** (per-example variance ``c_j`` along each entry). ``noise="hessian"`` (default): the NQM
  convention ``Sigma = kappa H`` (Zhang et al. 2019 take ``c = h``: near a minimum of a likelihood loss
  the per-example gradient covariance approaches the Fisher, which approaches the Hessian), with
  ``kappa = tr(Sigma) / sum_j n_j h_j`` so that the model's ``tr(Sigma)`` equals the measured
  ``trace_sigma`` (:attr:`batchlab.probes.noise_scale.NoiseScale.trace_sigma`). ``noise="isotropic"``:
  ``c_j = tr(Sigma) / D``. ``noise=array``: the per-entry variances ``c_j`` measured along the
  entries (e.g. ``u^T Sigma u`` for each eigenvector ``u``), used as given.
* **Start.** ``x_0`` is the displacement from the quadratic's minimum, ``E[x_0j^2] = sigma^2`` for every
  direction (the NQM's ``x_0 ~ N(0, sigma^2 I)``), with ``sigma^2 = |G|^2 / sum_j n_j h_j^2`` so that the
  model's expected squared gradient norm at the start equals the measured ``grad_norm_sq`` (the true
  gradient is ``G = H x_0``). The loss above the minimum at the start is then ``L0 = sigma^2 sum n h / 2``.
* **Units.** The engine's official tuning grids are made for curvatures up to 1, so the problem is
  normalised: curvatures are divided by ``h_max`` and second moments by ``sigma^2`` (noise by
  ``h_max^2 sigma^2``). Steps to a target are unchanged by this (the moment recurrences are the same
  after ``lr -> lr h_max^(1-p)``), losses scale by ``1 / (h_max sigma^2)``; batch sizes are the model's
  own examples, because ``c`` is a per-example variance. ``metadata`` keeps ``curvature_scale`` (``h_max``)
  and ``moment_scale`` (``sigma^2``); a tuned learning rate ``lr`` of the engine is ``lr / h_max^(1-p)``
  in the model's units (:func:`predict_steps` reports both).
* **Target.** "Steps to a matching loss": the target is ``target_fraction`` times the initial expected
  loss above the minimum (default :data:`DEFAULT_TARGET_FRACTION`, 0.01: the excess loss cut a
  hundredfold). :func:`matching_fraction` gives the fraction of a real run, ``(goal - floor) / (start -
  floor)`` from its loss at the checkpoint, its loss at the goal and an estimate of the lowest loss.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from batchlab.errors import BatchlabError

__all__ = ["DEFAULT_BATCH_SIZES", "DEFAULT_FLOOR", "DEFAULT_TARGET_FRACTION", "NOISE_MODELS", "CalibratedCurve",
           "calibrated_problem", "matching_fraction", "predict_steps", "target_loss"]

#: The default target: this fraction of the calibrated problem's initial expected loss (module docstring).
DEFAULT_TARGET_FRACTION = 0.01
#: Eigenvalues at or below this fraction of the largest are dropped (module docstring).
DEFAULT_FLOOR = 1e-6
#: Default log-spaced bins of a density.
DEFAULT_BINS = 64
#: The noise models (module docstring); an array of per-entry variances is accepted too.
NOISE_MODELS = ("hessian", "isotropic")
#: The batch grid the critical batch sizes are fitted on by default: B = 1, 4, ..., 4^10 (examples).
DEFAULT_BATCH_SIZES = tuple(4**k for k in range(0, 11))


def _positive(name: str, value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise BatchlabError(f"{name} must be a number > 0, got {value!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise BatchlabError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def _density_entries(density, parameters: int | None):
    """``(nodes, counts, P, probes)`` of a density: every probe's nodes, count ``P w / probes``."""
    if isinstance(density, dict):
        nodes, weights = density.get("nodes"), density.get("weights")
        p = parameters if parameters is not None else density.get("parameters")
    else:
        nodes, weights = getattr(density, "nodes", None), getattr(density, "weights", None)
        p = parameters if parameters is not None else getattr(density, "parameters", None)
    if not nodes or not weights or len(nodes) != len(weights):
        raise BatchlabError("the density needs nodes and weights per probe (batchlab.probes.spectrum.spectral_density)")
    if not p or int(p) < 1:
        raise BatchlabError("the density's number of parameters is unknown; give parameters=P")
    probes = len(nodes)
    flat_n = np.concatenate([np.asarray(n, dtype=float) for n in nodes])
    flat_w = np.concatenate([np.asarray(w, dtype=float) for w in weights])
    return flat_n, flat_w * int(p) / probes, int(p), probes


def _bin(nodes: np.ndarray, counts: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Gather nodes into ``bins`` log-spaced bins (count-weighted mean curvature), merging bins of fewer
    than one direction into the next bin down; the last (lowest) remainder joins the last bin kept."""
    if nodes.size == 0:
        return nodes, counts
    lo, hi = nodes.min(), nodes.max()
    edges = np.geomspace(lo, hi, bins + 1) if hi > lo else np.array([lo, hi])
    index = np.clip(np.searchsorted(edges, nodes, side="right") - 1, 0, len(edges) - 2)
    out_h, out_n = [], []
    acc_n = acc_nh = 0.0
    for b in range(len(edges) - 2, -1, -1):  # top down
        inside = index == b
        acc_n += float(counts[inside].sum())
        acc_nh += float((counts[inside] * nodes[inside]).sum())
        if acc_n >= 1.0:
            out_h.append(acc_nh / acc_n)
            out_n.append(acc_n)
            acc_n = acc_nh = 0.0
    if acc_n > 0:
        if out_n:
            total_n = out_n[-1] + acc_n
            out_h[-1] = (out_h[-1] * out_n[-1] + acc_nh) / total_n
            out_n[-1] = total_n
        else:
            out_h.append(acc_nh / acc_n)
            out_n.append(max(acc_n, 1.0))
    return np.asarray(out_h), np.asarray(out_n)


def calibrated_problem(eigenvalues: Sequence[float] | None = None, *, density=None, parameters: int | None = None,
                       trace_sigma: float | None = None, grad_norm_sq: float, noise="hessian",
                       floor: float = DEFAULT_FLOOR, bins: int = DEFAULT_BINS,
                       target_fraction: float = DEFAULT_TARGET_FRACTION, name: str = "calibrated"):
    """The calibrated NQM problem (module docstring), normalised to ``h_max = 1`` and ``sigma^2 = 1``.

    ``eigenvalues``: curvature eigenvalues (e.g. :attr:`Spectrum.eigenvalues`), each an entry of count 1;
    ``density``: a :class:`~batchlab.probes.spectrum.SpectralDensity` (or its ``to_dict()``) over
    ``parameters`` directions (default: the density's own ``parameters``); at least one of the two.
    ``trace_sigma`` (tr Sigma, per example) is needed by the ``"hessian"`` and ``"isotropic"`` noise models;
    ``noise`` may instead be an array of per-entry variances ``c_j`` (only with ``eigenvalues`` alone, one
    per eigenvalue, in the model's units). ``grad_norm_sq``: |G|^2 at the checkpoint (sets ``sigma^2``).

    Returns a :class:`batchlab.nqm.problem.Problem` whose ``metadata`` has ``curvature_scale``,
    ``moment_scale``, ``noise_model``, ``kappa`` (hessian model), ``target_fraction``,
    ``initial_loss_model_units`` (``L0`` in the model's loss units), ``dropped_directions``,
    ``dropped_trace_fraction``, ``directions`` and ``source``.

    Raises:
        BatchlabError (one line): no spectrum, no positive eigenvalue above the floor, an unknown noise
            model, a missing or non-positive ``trace_sigma``/``grad_norm_sq``, noise of the wrong length.
    """
    from batchlab.nqm.problem import Problem, from_eigenvalues

    if eigenvalues is None and density is None:
        raise BatchlabError("a calibrated NQM needs a curvature spectrum: top eigenvalues and/or a spectral density")
    if not 0 < float(floor) < 1:
        raise BatchlabError(f"floor must lie in (0, 1), got {floor!r}")
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise BatchlabError(f"bins must be an integer >= 1, got {bins!r}")
    fraction = float(target_fraction)
    if not 0 < fraction < 1:
        raise BatchlabError(f"target fraction must lie in (0, 1), got {target_fraction!r}")
    g2 = _positive("grad_norm_sq (|G|^2)", grad_norm_sq)
    top = None if eigenvalues is None else np.asarray(list(eigenvalues), dtype=float).ravel()
    if top is not None and (top.size == 0 or not np.all(np.isfinite(top))):
        raise BatchlabError("eigenvalues must be a non-empty list of finite numbers")
    explicit_noise = not isinstance(noise, str)
    if isinstance(noise, str) and noise not in NOISE_MODELS:
        from batchlab.errors import unknown_name_error

        raise unknown_name_error("noise model", noise, NOISE_MODELS)
    if explicit_noise and (density is not None or top is None):
        raise BatchlabError("per-entry noise variances go with eigenvalues alone (one per eigenvalue), not a density")

    largest = ([float(top.max())] if top is not None else []) + \
        ([float(np.max(_density_entries(density, parameters)[0]))] if density is not None else [])
    h_max_all = max(largest)
    if not h_max_all > 0:
        raise BatchlabError(f"the spectrum has no positive eigenvalue (largest {h_max_all:g}); the NQM needs h > 0")
    cut = float(floor) * h_max_all
    dropped_n = dropped_trace = total_trace = 0.0
    c_given = None
    if density is None:
        keep = top > cut
        dropped_n = float((~keep).sum())
        total_trace = float(np.abs(top).sum())
        dropped_trace = float(np.abs(top[~keep]).sum())
        h, n = top[keep], np.ones(int(keep.sum()))
        if explicit_noise:
            c_all = np.asarray(noise, dtype=float).ravel()
            if c_all.size != top.size or not np.all(np.isfinite(c_all)) or np.any(c_all < 0):
                raise BatchlabError(f"noise must hold {top.size} finite variances >= 0, one per eigenvalue")
            c_given = c_all[keep]
        source = f"{top.size} eigenvalues"
    else:
        nodes, counts, p, n_probes = _density_entries(density, parameters)
        total_trace = float(np.abs(nodes * counts).sum())
        if top is not None:
            top_keep = top[top > cut]
            # the kept top eigenvalues' own Ritz values, rounding included (a dropped top eigenvalue's stay in
            # the bulk, where the floor drops them too)
            upper = nodes >= top_keep.min() * (1 - 1e-6) if top_keep.size else np.zeros(nodes.shape, bool)
            bulk_nodes, bulk_counts = nodes[~upper], counts[~upper]
            positive = bulk_nodes > cut
            budget = max(p - top.size, 0)
            scale = budget / bulk_counts.sum() if bulk_counts.sum() > 0 else 0.0
            bulk_counts = bulk_counts * scale
            dropped_n = float(bulk_counts[~positive].sum()) + float((top <= cut).sum())
            # the trace as modelled (the top eigenvalues and the rescaled bulk), and what of it is dropped
            total_trace = float(np.abs(top).sum()) + float(np.abs(bulk_nodes * bulk_counts).sum())
            dropped_trace = (float(np.abs(bulk_nodes[~positive] * bulk_counts[~positive]).sum())
                             + float(np.abs(top[top <= cut]).sum()))
            bh, bn = _bin(bulk_nodes[positive], bulk_counts[positive], bins)
            h = np.concatenate([top_keep, bh])
            n = np.concatenate([np.ones(top_keep.size), bn])
            source = f"{top.size} eigenvalues and a {n_probes}-probe density over {p} parameters"
        else:
            positive = nodes > cut
            dropped_n = float(counts[~positive].sum())
            dropped_trace = float(np.abs(nodes[~positive] * counts[~positive]).sum())
            h, n = _bin(nodes[positive], counts[positive], bins)
            source = f"a {n_probes}-probe density over {p} parameters"
    if h.size == 0:
        raise BatchlabError(f"no eigenvalue of the spectrum lies above the floor {cut:g} (floor x largest); the NQM "
                            "needs h > 0")
    order = np.argsort(-h, kind="stable")
    h, n = h[order], n[order]
    if c_given is not None:
        c_given = c_given[order]
    h_max = float(h.max())
    sum_nh, sum_nh2 = float((n * h).sum()), float((n * h * h).sum())
    sigma2 = g2 / sum_nh2
    kappa = None
    if explicit_noise:
        c = c_given
        model = "measured"
    else:
        ts = _positive("trace_sigma (tr Sigma)", trace_sigma) if trace_sigma is not None else None
        if ts is None:
            raise BatchlabError(f"noise model {noise!r} needs the measured trace_sigma (tr Sigma)")
        if noise == "hessian":
            kappa = ts / sum_nh
            c = kappa * h
        else:
            c = np.full(h.shape, ts / float(n.sum()))
        model = noise
    initial_loss = 0.5 * sigma2 * sum_nh
    metadata = {
        "curvature_scale": h_max, "moment_scale": sigma2, "noise_model": model, "kappa": kappa,
        "target_fraction": fraction, "initial_loss_model_units": initial_loss,
        "dropped_directions": dropped_n, "dropped_trace_fraction": dropped_trace / total_trace if total_trace else 0.0,
        "directions": float(n.sum()), "source": source, "floor": float(floor),
        "trace_sigma_model": float((n * c).sum()), "grad_norm_sq_model": g2,
        "trace_h_sigma_model": float((n * h * c).sum()), "grad_h_grad_model": float(sigma2 * (n * h**3).sum()),
    }
    h_unit, c_unit = h / h_max, c / (h_max**2 * sigma2)
    if np.all(n == 1):
        problem = from_eigenvalues(h_unit, c_unit, name=name)
        return Problem(curvature=problem.curvature, noise=problem.noise, counts=problem.counts,
                       initial_second_moment=problem.initial_second_moment, name=name, metadata=metadata)
    return Problem(curvature=h_unit, noise=c_unit, counts=n, initial_second_moment=np.ones(h.size), name=name,
                   metadata=metadata)


def matching_fraction(start_loss: float, goal_loss: float, floor_loss: float = 0.0) -> float:
    """The target fraction that matches a real run: ``(goal - floor) / (start - floor)``, the share of the
    loss above ``floor_loss`` (an estimate of the lowest reachable loss) left at the goal."""
    start, goal, low = float(start_loss), float(goal_loss), float(floor_loss)
    if not (math.isfinite(start) and math.isfinite(goal) and math.isfinite(low)) or not low < goal < start:
        raise BatchlabError(f"a matching target needs floor < goal < start losses, got floor {floor_loss!r}, goal "
                            f"{goal_loss!r}, start {start_loss!r}")
    return (goal - low) / (start - low)


def target_loss(problem, fraction: float | None = None) -> float:
    """The target expected loss of ``problem`` (its own units): ``fraction`` (default the problem's
    ``target_fraction``, else :data:`DEFAULT_TARGET_FRACTION`) times its initial loss."""
    if fraction is None:
        fraction = problem.metadata.get("target_fraction", DEFAULT_TARGET_FRACTION)
    if not 0 < float(fraction) < 1:
        raise BatchlabError(f"target fraction must lie in (0, 1), got {fraction!r}")
    return float(fraction) * problem.initial_loss()


@dataclass(frozen=True)
class CalibratedCurve:
    """One optimizer's prediction on a calibrated problem.

    ``optimizer``: the batchlab name; ``nqm_algorithm``/``precondition``/``words``: its NQM model
    (:data:`batchlab.report.nqm.MAPPINGS`); ``rows``: one engine row per batch size (``batch_size``
    examples, ``steps`` first passage or None, ``learning_rate`` in the engine's normalised units,
    ``learning_rate_model`` in the model's units, ``momentum``, ``certified``, ...); ``summary``: the
    :func:`~batchlab.analysis.critical_batch_size.summarize_curve` dict (None when fewer than two
    batch sizes reached the target; ``reason`` says why); ``b_crit``: its ``mccandlish_b_crit``
    (examples; None when undefined or infinite); ``target``: the target loss in the problem's units."""

    optimizer: str
    nqm_algorithm: str
    precondition: float
    words: str
    rows: list[dict]
    summary: dict | None
    b_crit: float | None
    target: float
    reason: str = ""
    critical_batch_sizes: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"optimizer": self.optimizer, "nqm_algorithm": self.nqm_algorithm, "precondition": self.precondition,
                "algorithm": self.words, "target": self.target, "rows": self.rows, "b_crit": self.b_crit,
                "critical_batch_sizes": self.critical_batch_sizes,
                "extrapolated": None if self.summary is None else bool(self.summary["extrapolated"]),
                "warnings": [] if self.summary is None else list(self.summary["warnings"]), "reason": self.reason}


def predict_steps(problem, optimizers: Sequence[str], batch_sizes: Sequence[float] = DEFAULT_BATCH_SIZES,
                  target: float | None = None, *, grid: str | None = None,
                  max_steps: int | None = None) -> dict[str, CalibratedCurve]:
    """Tuned steps to ``target`` per batch size and the named critical batch sizes, per optimizer.

    Each batchlab optimizer is modelled as :data:`batchlab.report.nqm.MAPPINGS` says (sgd: SGD p = 0;
    momentum, nesterov: p = 0; adam, adamw, soap: heavy-ball momentum on ``H^-0.5 g``; kfac: p = 1) and
    tuned per batch size by :func:`batchlab.nqm.tuning.tune` on ``grid`` (default the report's,
    :data:`batchlab.report.nqm.GRID`); the curve's critical batch sizes come from
    :func:`batchlab.analysis.critical_batch_size.summarize_curve`. ``target``: the target loss in the
    problem's units (default :func:`target_loss`). Returns ``{optimizer: CalibratedCurve}``.

    Raises:
        BatchlabError (one line): an optimizer the NQM does not model (with the reason and the
            modelled names), bad batch sizes or target (the engine's checks).
    """
    from batchlab.analysis.critical_batch_size import summarize_curve
    from batchlab.nqm.algorithms import Algorithm
    from batchlab.nqm.tuning import steps_curve, tune
    from batchlab.report import nqm as report_nqm

    names = list(dict.fromkeys(optimizers))
    if not names:
        raise BatchlabError(f"give at least one optimizer; the NQM models {', '.join(report_nqm.MAPPINGS)}")
    for name in names:
        if report_nqm.mapping(name) is None:
            raise BatchlabError(f"optimizer {name!r} has no NQM model: {report_nqm.unsupported_reason(name)}")
    goal = target_loss(problem) if target is None else float(target)
    h_max = float(problem.metadata.get("curvature_scale", 1.0))
    cache: dict[tuple[str, float], tuple] = {}
    out = {}
    for name in names:
        entry = report_nqm.mapping(name)
        key = (entry.nqm_algorithm, float(entry.precondition))
        if key not in cache:
            points = tune(problem, Algorithm(*key), batch_sizes, goal, grid=grid or report_nqm.GRID,
                          max_steps=max_steps)
            rows = []
            for p in points:
                row = p.to_dict()
                row["learning_rate_model"] = p.learning_rate / h_max ** (1.0 - key[1])
                rows.append(row)
            summary, reason = None, ""
            try:
                summary = summarize_curve(steps_curve(points, label=f"calibrated {key[0]} p={key[1]:g}"))
            except BatchlabError as exc:  # fewer than two reached batch sizes
                reason = str(exc)
            cache[key] = (rows, summary, reason)
        rows, summary, reason = cache[key]
        named = {} if summary is None else {k: v.get("value") for k, v in summary["critical_batch_sizes"].items()}
        value = named.get("mccandlish_b_crit")
        b_crit = None if value is None or not math.isfinite(float(value)) else float(value)
        out[name] = CalibratedCurve(name, entry.nqm_algorithm, float(entry.precondition), entry.words, rows, summary,
                                    b_crit, goal, reason, named)
    return out
