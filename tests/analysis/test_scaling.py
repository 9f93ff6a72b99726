"""Scaling across groups (batchlab.analysis.scaling): B_crit and S_min against size as power laws, with known truth."""

import json

import numpy as np
import pytest
from scipy.stats import norm

from batchlab.analysis.scaling import fit_scaling_table, power_law_fit
from batchlab.errors import BatchlabError

EXPONENT, S_MIN_EXPONENT = 0.5, 0.2
SIZES = (1e6, 4e6, 1.6e7, 6.4e7, 2.56e8)


def b_crit_at(size):
    return 0.1 * size**EXPONENT


def write_table(path, seed=0, sizes=SIZES, noise=0.2, batch_sizes=tuple(2**k for k in range(2, 16)), extra=None):
    """Steps tables of groups with B_crit = 0.1 x^0.5 and S_min = 2000 (x / 1e6)^0.2, each step count
    the hyperbola times exp(noise * N(0, 1)) (seeded); ``extra`` adds one group's rows as they are."""
    rng = np.random.default_rng(seed)
    lines = ["model,params,batch_size,steps"]
    for k, size in enumerate(sizes):
        s_min = 2000.0 * (size / 1e6) ** S_MIN_EXPONENT
        for b in batch_sizes:
            steps = s_min * (1 + b_crit_at(size) / b) * np.exp(noise * rng.standard_normal())
            lines.append(f"m{k},{size:g},{b},{round(steps)}")
    lines += extra or []
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_exponents_interval_covers_the_truth_and_extrapolation_is_labelled(tmp_path):
    path = write_table(tmp_path / "scaling.csv")
    result = fit_scaling_table(path, "model", "params", at=[3e7, 1e10])
    json.dumps(result)  # JSON-ready
    b_crit, s_min = result["fits"]["mccandlish_b_crit"], result["fits"]["s_min"]
    for fit, truth in ((b_crit, EXPONENT), (s_min, S_MIN_EXPONENT)):
        assert fit["error"] is None and fit["n_groups"] == 5 and fit["dof"] == 3
        assert fit["exponent"]["low"] < truth < fit["exponent"]["high"]
        assert fit["bootstrap"]["exponent_low"] < truth < fit["bootstrap"]["exponent_high"]
        assert fit["x_range"] == [1e6, 2.56e8]
        assert [p["extrapolated"] for p in fit["predictions"]] == [False, True]
        assert fit["prefactor"]["extrapolated"] and any("x = 1" in w for w in fit["warnings"])
    inside = b_crit["predictions"][0]
    assert inside["low"] < b_crit_at(3e7) < inside["high"]
    # every group's own interval is what the fit weighs (and what its table row shows)
    groups = {g["group"]: g for g in result["groups"]}
    assert set(groups) == {f"m{k}" for k in range(5)} and groups["m0"]["x"] == 1e6
    assert all(g["mccandlish_b_crit"]["low"] < g["mccandlish_b_crit"]["value"] < g["mccandlish_b_crit"]["high"]
               for g in groups.values())


def groups_with_known_errors(rng, se, exponent=0.5, sizes=SIZES, level=0.9):
    """Groups whose log B_crit is the power law plus N(0, se^2), each with its level-interval from se."""
    z = norm.ppf(0.5 + level / 2)
    out = []
    for k, (size, s) in enumerate(zip(sizes, se)):
        log_q = np.log(0.1) + exponent * np.log(size) + s * rng.standard_normal()
        out.append({"group": k, "x": size, "error": None,
                    "b": {"value": np.exp(log_q), "low": np.exp(log_q - z * s), "high": np.exp(log_q + z * s)}})
    return out


@pytest.mark.parametrize("se_scale, seed", [(1.0, 7), (0.5, 8), (3.0, 9)])
def test_the_weighted_fits_coverage_is_nominal_whatever_the_groups_common_error_scale(se_scale, seed):
    """Known truth: 400 seeded sets of 5 groups with unequal standard errors (intervals from the stated
    se, the actual errors se_scale times it: the intervals right, too wide, too narrow), each scale its
    own seed. The exponent's 90% interval covers 0.5 in 0.85-0.95 of them: the t quantile on the
    residual-scaled covariance does not depend on the common scale. The same fit trusting the stated
    weights (the residual scaling undone, the normal quantile) is right only at scale 1: it
    over-covers when the intervals are too wide and under-covers when they are too narrow."""
    rng = np.random.default_rng(seed)
    se = np.array([0.05, 0.1, 0.2, 0.1, 0.3])
    hits = trusted_hits = 0
    for _ in range(400):
        groups = groups_with_known_errors(rng, se * se_scale)
        for g in groups:  # the stated intervals stay those of se
            centre = np.log(g["b"]["value"])
            g["b"]["low"], g["b"]["high"] = np.exp(centre - 1.645 * se[g["group"]]), np.exp(centre + 1.645 * se[g["group"]])
        fit = power_law_fit(groups, "b", "B_crit", n_boot=10)
        hits += fit["exponent"]["low"] <= 0.5 <= fit["exponent"]["high"]
        half = (fit["exponent"]["high"] - fit["exponent"]["value"]) / fit["quantile"] / np.sqrt(fit["residual_scale"])
        trusted_hits += abs(fit["exponent"]["value"] - 0.5) <= norm.ppf(0.95) * half
    assert 0.85 <= hits / 400 <= 0.95
    trusted = trusted_hits / 400
    assert {1.0: 0.85 <= trusted <= 0.95, 0.5: trusted > 0.98, 3.0: trusted < 0.6}[se_scale], trusted


def test_groups_that_all_share_one_size_are_a_one_line_error(tmp_path, capsys):
    groups = [{"group": g, "x": 1e6, "error": None, "b": {"value": v, "low": 0.8 * v, "high": 1.3 * v}}
              for g, v in (("a", 100.0), ("b", 120.0), ("c", 110.0))]
    with pytest.raises(BatchlabError, match=r"^B_crit: the groups used \(a, b, c\) all have size 1e\+06: a power law "
                                            r"needs at least two distinct sizes$"):
        power_law_fit(groups, "b", "B_crit")
    path = write_table(tmp_path / "one_size.csv", sizes=(1e6, 1e6))  # groups m0 and m1, both of size 1e6
    with pytest.raises(BatchlabError, match=r"all have params 1e\+06: a power law needs at least two distinct sizes"):
        fit_scaling_table(path, "model", "params")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
    from cli_runner import run

    code, out, err = run(capsys, "analyze", "scaling", "--steps-table", path, "--group-by", "model", "--x", "params")
    assert (code, out) == (2, "") and err.count("\n") == 1 and "Traceback" not in err
    assert "the groups (model=m0, model=m1) all have params 1e+06" in err


def test_two_groups_fit_through_both_with_a_warning_and_the_normal_quantile():
    groups = groups_with_known_errors(np.random.default_rng(0), [0.1, 0.1], sizes=(1e6, 1e8))
    fit = power_law_fit(groups, "b", "B_crit", n_boot=100)
    assert fit["dof"] == 0 and fit["residual_scale"] is None and fit["quantile"] == pytest.approx(1.6449, abs=1e-4)
    assert fit["chi2"] == pytest.approx(0, abs=1e-9) and any("two groups" in w for w in fit["warnings"])
    # two points with se 0.1 each, log x 4.6 apart: sd of b = sqrt(2) * 0.1 / 4.605
    half = fit["exponent"]["high"] - fit["exponent"]["value"]
    assert half == pytest.approx(norm.ppf(0.95) * np.sqrt(2) * 0.1 / np.log(100), rel=1e-9)


def test_a_group_whose_b_crit_interval_is_unbounded_enters_as_a_bound_and_is_stated(tmp_path):
    """A group whose batch sizes all lie far below its B_crit shows no plateau: its B_crit interval is
    unbounded above, so it is a lower bound (B_crit > low), checked against the law, not a fit point."""
    size = 1e10  # B_crit 1e4; batch sizes 1..16: steps halve with every doubling, with 10-15% scatter
    extra = [f"big,{size:g},{b},{round(5000 * (1 + b_crit_at(size) / b) * f)}"
             for b, f in zip((1, 2, 4, 8, 16), (1.1, 0.9, 1.15, 0.85, 1.05))]
    path = write_table(tmp_path / "scaling.csv", extra=extra)
    result = fit_scaling_table(path, "model", "params")
    big = next(g for g in result["groups"] if g["group"] == "big")
    assert big["mccandlish_b_crit"]["high"] is None and big["mccandlish_b_crit"]["low"] > 0
    fit = result["fits"]["mccandlish_b_crit"]
    assert "big" not in fit["groups_used"] and fit["n_groups"] == 5
    (bound,) = fit["bounds"]
    assert bound["group"] == "big" and bound["kind"] == "lower" and bound["consistent"] and bound["extrapolated"]
    assert any("group big enters as a bound only" in w for w in fit["warnings"])


def test_too_few_bounded_groups_is_said_per_quantity_not_fitted():
    groups = groups_with_known_errors(np.random.default_rng(0), [0.1, 0.1], sizes=(1e6, 1e8))
    groups[1]["b"]["high"] = None
    with pytest.raises(BatchlabError, match=r"need at least 2 groups with a B_crit interval bounded on both sides.*"
                                            r"got 1 \(1: B_crit > "):
        power_law_fit(groups, "b", "B_crit")


@pytest.mark.parametrize(
    "extra, x, fragment",
    [
        (None, "size", "unknown --x column 'size'; allowed: ['model', 'params', 'batch_size', 'steps']"),
        (["m9,big,4,100", "m9,big,8,60"], "params", "size column 'params' must be numeric (a model or data size), "
                                                     "got ['big', 'big'] in row(s) 71, 72"),
        (["m9,0,4,100", "m9,0,8,60"], "params", "size column 'params' must be > 0 (power laws are fitted in log x), "
                                                "got [0.0, 0.0] in row(s) 71, 72"),
        (["m9,-5,4,100"], "params", "must be > 0"),
        (["m9,,4,100"], "params", "size column 'params' has empty or infinite values in row(s) 71"),
        (["m4,1e9,4,100"], "params", "size column 'params' is not constant within group(s) model=m4 (2.56e+08, 1e+09)"),
    ],
)
def test_bad_size_columns_are_one_line_errors(tmp_path, extra, x, fragment):
    path = write_table(tmp_path / "bad.csv", extra=extra)
    with pytest.raises(BatchlabError) as info:
        fit_scaling_table(path, "model", x)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_one_group_is_refused(tmp_path):
    path = write_table(tmp_path / "one.csv", sizes=(1e6,))
    with pytest.raises(BatchlabError, match=r"need at least 2 groups to fit a power law across groups, got 1 "
                                            r"\(model=m0\)"):
        fit_scaling_table(path, "model", "params")


def test_groups_whose_own_b_crit_is_extrapolated_are_named(tmp_path):
    """Batch sizes 4..512: the two largest groups' B_crit (800, 1600) lie beyond them; the exponent
    still covers the truth, and a warning names the groups it leans on."""
    path = write_table(tmp_path / "scaling.csv", batch_sizes=tuple(2**k for k in range(2, 10)))
    result = fit_scaling_table(path, "model", "params")
    assert [g["extrapolated"] for g in result["groups"]] == [False, False, False, True, True]
    fit = result["fits"]["mccandlish_b_crit"]
    assert fit["exponent"]["low"] < EXPONENT < fit["exponent"]["high"]
    assert any("group(s) m3, m4 lies outside their measured batch sizes" in w for w in fit["warnings"])
    full = fit_scaling_table(write_table(tmp_path / "full.csv"), "model", "params")["fits"]["mccandlish_b_crit"]
    assert not any("outside their measured batch sizes" in w for w in full["warnings"])


@pytest.mark.parametrize("options, fragment", [
    ({"n_boot": 0}, "n_boot must be a positive integer, got 0"),
    ({"seed": -1}, "seed must be an integer >= 0, got -1"),
    ({"level": 1.0}, "level must be in (0, 1), got 1.0"),
    ({"at": [float("inf")]}, "sizes to predict at must be finite numbers > 0, got [inf]"),
])
def test_bad_options_are_raised_not_recorded_as_a_fit_error(tmp_path, options, fragment):
    with pytest.raises(BatchlabError) as info:
        fit_scaling_table(write_table(tmp_path / "t.csv"), "model", "params", **options)
    assert fragment in str(info.value)
