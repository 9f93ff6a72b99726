"""The (learning rate, 1 - momentum) scatter of a raced study: RACED trials are their own class."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from analysis_fixtures import race_trials, tables_from_trials, trial  # noqa: E402

from batchlab.analysis.metaparameters import trial_outcomes  # noqa: E402
from batchlab.analysis.selection import Selection  # noqa: E402
from batchlab.analysis.tables import connect_tables  # noqa: E402
from batchlab.plots.tuning import OUTCOME_STYLE, lr_momentum_scatter_figure  # noqa: E402

W = "mnist/fc_64_64_64/momentum"
M = "val/classification_error"
RACED_LABEL = "raced: stopped, could not beat the best"


def outcomes(raced):
    # at B=8 trials 1 and 2 meet the goal at 20 and 30; 3 (at 40) and 4 (never) are raced at 30;
    # trial 5 diverged
    errors = {1: [0.5, 0.04, 0.03, 0.02], 2: [0.5, 0.2, 0.04, 0.03], 3: [0.5, 0.3, 0.2, 0.04], 4: [0.6] * 4}
    trials = [trial(W, 8, t, [(s, {M: v}) for s, v in zip((10, 20, 30, 40), values)],
                    learning_rate=0.01 * t, momentum=1 - 0.1 ** t) for t, values in errors.items()]
    if raced:
        trials = race_trials(trials, M, 0.05, keep=2)
    trials.append(trial(W, 8, 5, [(10, {M: float("nan")})], status="INFEASIBLE", learning_rate=9.0, momentum=0.9))
    con = connect_tables(**tables_from_trials(trials))
    try:
        return trial_outcomes(con, Selection(W, M, 0.05))
    finally:
        con.close()


def counts(fig):
    ax = fig.axes[0]
    return {c.get_label(): len(c.get_offsets()) for c in ax.collections
            if c.get_label() in {style["label"] for style in OUTCOME_STYLE.values()} | {"best trial"}}


def test_raced_trials_get_their_own_marker_and_legend_entry():
    frame = outcomes(raced=True)
    assert list(frame["outcome"]) == ["reached", "reached", "raced", "raced", "diverged"]
    fig = lr_momentum_scatter_figure(frame)
    assert counts(fig) == {"goal reached": 2, "goal not reached": 0, RACED_LABEL: 2, "diverged": 1, "best trial": 1}
    (marks,) = [c for c in fig.axes[0].collections if c.get_gid() == "outcome_raced"]
    assert len(marks.get_offsets()) == 2
    assert RACED_LABEL in [t.get_text() for t in fig.legends[0].get_texts()]


def test_full_protocol_scatter_has_no_raced_class():
    frame = outcomes(raced=False)
    assert list(frame["outcome"]) == ["reached", "reached", "reached", "not_reached", "diverged"]
    fig = lr_momentum_scatter_figure(frame)
    assert RACED_LABEL not in counts(fig)
    assert RACED_LABEL not in [t.get_text() for t in fig.legends[0].get_texts()]
