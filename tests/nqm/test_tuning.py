import numpy as np
import pytest

from batchlab.nqm.dynamics import Algorithm, moment_recurrence
from batchlab.nqm.problem import zhang2019_binned
from batchlab.nqm.steps import best_candidates, official_low
from batchlab.nqm.tuning import official_grid, tune

# docs/methods.md, "The model"0: SGD (p = 0), binned model, LR on logspace(-5, 0.5, 100), official `low` convention.
TABLE_D_TARGETS = (0.1, 0.03, 0.01, 0.003, 0.001)
TABLE_D = {
    4: (80753, 389129, 1507367, 6299850, 21999293),
    8: (40638, 195634, 751703, 3113949, 11163726),
    16: (20821, 98843, 379858, 1568278, 5508756),
    32: (11085, 49942, 189424, 782633, 2777058),
    64: (6477, 25847, 95759, 392072, 1384149),
    128: (4565, 14188, 49174, 199284, 692987),
    256: (3766, 8939, 25880, 99957, 352439),
    512: (3355, 6907, 14965, 51390, 175230),
    1024: (3073, 6178, 10609, 27854, 89360),
    2048: (2951, 5514, 9149, 16994, 46678),
    4096: (2893, 5254, 8117, 13088, 26471),
    8192: (2865, 5137, 7647, 11687, 18000),
    16384: (2851, 5081, 7447, 10608, 15364),
    32768: (2845, 5054, 7354, 10219, 13621),
    65536: (2841, 5040, 7309, 10047, 12922),
    131072: (2840, 5033, 7287, 9967, 12640),
    262144: (2839, 5030, 7276, 9927, 12511),
    524288: (2838, 5028, 7271, 9908, 12449),
    1048576: (2838, 5028, 7268, 9898, 12419),
    2097152: (2838, 5027, 7267, 9894, 12404),
}


def _official_table(notebook_fudge):
    problem = zhang2019_binned()
    batch_sizes = sorted(TABLE_D)
    rec = moment_recurrence(problem, Algorithm("sgd"), official_grid(Algorithm("sgd"))["learning_rate"],
                            notebook_fudge=notebook_fudge)
    table = {}
    for column, target in enumerate(TABLE_D_TARGETS):
        _, best = best_candidates(rec, batch_sizes, target, 10**9 - 1)
        for b, steps in zip(batch_sizes, best):
            table[(b, column)] = official_low(int(steps))
    return table


def test_table_d_exact_nqm_within_tolerance():
    ours = _official_table(notebook_fudge=False)
    errors = {key: abs(ours[key] - TABLE_D[key[0]][key[1]]) / TABLE_D[key[0]][key[1]] for key in ours}
    # The notebook adds 1e-8 to 1 - beta in the SGD steady state; that moves its target-0.001 values at
    # B = 4 and 8 by 0.31% and 0.12% (the exact NQM needs *more* steps there); everywhere else < 0.1%.
    fudge_cells = {(4, 4), (8, 4)}
    assert max(v for k, v in errors.items() if k not in fudge_cells) < 1e-3
    assert max(errors[k] for k in fudge_cells) < 4e-3


def test_table_d_bit_for_bit_with_the_notebook_fudge():
    ours = _official_table(notebook_fudge=True)
    assert all(ours[(b, c)] == TABLE_D[b][c] for b in TABLE_D for c in range(5))


def test_tune_official_matches_table_and_auto_is_never_worse():
    problem = zhang2019_binned()
    batch_sizes = [4, 256, 65536]
    official = tune(problem, Algorithm("sgd"), batch_sizes, 0.01, grid="official", notebook_fudge=True)
    assert [p.result.official_low for p in official] == [TABLE_D[b][2] for b in batch_sizes]
    for name, p in [("sgd", 0.0), ("momentum", 0.5), ("ema", 0.0), ("nesterov", 0.25)]:
        algorithm = Algorithm(name, p)
        off = tune(problem, algorithm, batch_sizes[::2], 0.01, grid="official")
        auto = tune(problem, algorithm, batch_sizes[::2], 0.01, grid="auto")
        for a, o in zip(auto, off):
            assert a.result.reached and o.result.reached
            assert a.result.steps <= o.result.steps
        assert any(a.result.steps < o.result.steps for a, o in zip(auto, off))


def test_official_grid_tie_rule_picks_first_strictly_better():
    # Among grid points with equal steps the first in lr-outer order wins (np.argmin semantics).
    problem = zhang2019_binned()
    algorithm = Algorithm("momentum")
    axes = official_grid(algorithm)
    assert axes["learning_rate"].size == 100 and axes["momentum"].size == 20
    assert axes["momentum"][0] == pytest.approx(0.99999) and axes["momentum"][-1] == 0.0
    point = tune(problem, algorithm, [1048576], 0.01, grid="official")[0]
    lrs, mus = np.meshgrid(axes["learning_rate"], axes["momentum"], indexing="ij")
    rec = moment_recurrence(problem, algorithm, lrs.ravel(), momentum=mus.ravel())
    from batchlab.nqm.steps import first_passage_candidates

    cands = first_passage_candidates(rec, [1048576], 0.01, 1 << 12)[:, 0]
    cands = np.where(cands < 0, 10**9, cands)
    first = int(np.argmin(cands))
    assert point.learning_rate == pytest.approx(lrs.ravel()[first]) and point.momentum == pytest.approx(mus.ravel()[first])
