"""The one registry of named critical batch sizes, and everything that reads it."""

import numpy as np
import pytest

from batchlab.analysis import critical_batch_size
from batchlab.analysis.bootstrap import bootstrap_critical_batch_size
from batchlab.analysis.critical_batch_size import summarize_curve
from batchlab.analysis.curve import curve_from_arrays
from batchlab.analysis.definitions import (
    REGISTRY,
    CriticalBatchSizeDefinition,
    definition_names,
    get_definition,
    legend,
    named_definitions,
    named_values,
)
from batchlab.errors import BatchlabError


def hyperbola(s_min=1000.0, b_crit=64.0):
    b = 2.0 ** np.arange(0, 12)
    return curve_from_arrays(b, np.round(s_min * (1 + b_crit / b)), label="h")


def test_names_are_unique_and_ordered_and_there_is_no_parallel_list():
    names = definition_names()
    assert names == tuple(d.name for d in REGISTRY) and len(set(names)) == len(names)
    assert len({d.label for d in REGISTRY}) == len(REGISTRY)
    assert set(definition_names(headline_only=True)) < set(names)
    assert named_definitions(headline_only=True) == tuple(d for d in REGISTRY if d.headline)
    # the analysis module re-exports the registry itself; the old parallel structures are gone
    assert critical_batch_size.REGISTRY is REGISTRY
    assert not hasattr(critical_batch_size, "DEFINITIONS")
    assert not hasattr(critical_batch_size, "critical_batch_sizes")


def test_unknown_name_is_one_line_listing_the_known_ones():
    assert get_definition("overhead_20pct").label == "B_20%"
    with pytest.raises(BatchlabError) as info:
        get_definition("mccandlish_bcrit")
    message = str(info.value)
    assert "\n" not in message and "unknown critical batch size definition 'mccandlish_bcrit'" in message
    assert "did you mean 'mccandlish_b_crit'" in message and all(n in message for n in definition_names())


def test_every_summary_holds_exactly_the_registry_in_order():
    curve = hyperbola()
    summary = summarize_curve(curve)
    assert list(summary["critical_batch_sizes"]) == list(definition_names())
    for d in REGISTRY:
        entry = summary["critical_batch_sizes"][d.name]
        assert (entry["definition"], entry["source"]) == (d.definition, d.source)
    boot = bootstrap_critical_batch_size({int(b): np.array([s]) for b, s in zip(curve.batch_sizes, curve.steps)},
                                         n_boot=5, seed=0).to_dict()
    assert list(boot["critical_batch_sizes"]) == list(definition_names())
    # a fit-derived value's interval is B_crit's interval mapped through the entry's own function
    b_crit = boot["critical_batch_sizes"]["mccandlish_b_crit"]
    for d in REGISTRY:
        entry = boot["critical_batch_sizes"][d.name]
        if d.source == "fit" and b_crit["low"] is not None:
            assert entry["low"] == pytest.approx(d.from_b_crit(b_crit["low"], 0.1, boot["b0"]))
        if d.source == "data":
            assert entry["low"] is None and entry["high"] is None


def test_values_follow_the_entries_and_read_for_tables():
    summary = summarize_curve(hyperbola())
    fit = summary["fit"]
    values = named_values(summary)
    assert values["mccandlish_b_crit"] == pytest.approx(fit["e_min"] / fit["s_min"])
    assert values["overhead_20pct"] == pytest.approx(0.2 * fit["b_crit"] + 1.2 * summary["b0"])
    assert values["perfect_scaling_end"] == summary["data_regimes"]["perfect_scaling_end"]["value"]
    assert list(named_values(summary, headline_only=True)) == list(definition_names(headline_only=True))
    assert named_values({}) == {name: None for name in definition_names()}
    lines = legend()
    assert len(lines) == len(REGISTRY) and lines[0].startswith("B_crit = mccandlish_b_crit: E_min / S_min")


@pytest.mark.parametrize("fields, match", [
    (dict(source="guess", from_b_crit=lambda b, t, b0: b), "source must be one of fit, data"),
    (dict(source="fit"), "from_b_crit is required"),
    (dict(source="data", from_b_crit=lambda b, t, b0: b), "from_b_crit is required"),
    (dict(source="data"), "read_regimes"),
    (dict(source="fit", from_b_crit=lambda b, t, b0: b, definition="two\nlines"), "one non-empty line"),
    (dict(source="fit", from_b_crit=lambda b, t, b0: b, name=""), "name must be a non-empty word"),
    (dict(source="fit", from_b_crit=lambda b, t, b0: b, label="B crit"), "label must be a non-empty word"),
])
def test_a_malformed_entry_is_refused(fields, match):
    kw = dict(name="x", definition="a definition", label="x") | fields
    with pytest.raises(BatchlabError, match=match):
        CriticalBatchSizeDefinition(**kw)
