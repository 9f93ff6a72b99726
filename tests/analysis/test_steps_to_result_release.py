"""Steps to result end to end: a release-format tree written here, imported into a Store, analysed."""

import pytest

from analysis_fixtures import trial, write_release
from batchlab.analysis.budgets import best_measurement
from batchlab.analysis.steps_to_result import steps_to_result
from batchlab.cli import main
from batchlab.store import Store

W = "mnist/simple_cnn_base/nesterov_momentum"
OI = "open_images_v4/resnet_50/nesterov_momentum"
E = "val/classification_error"
AP = "val/average_precision"


def rows(pairs, metric=E):
    return [(step, {metric: value, "train/cross_entropy_error": 1.0}) for step, value in pairs]


TRIALS = [
    # B=2: strict comparison (0.01 is not < 0.01), uneven evaluation steps, ties to the lower id.
    trial(W, 2, 1, rows([(7, 0.5), (130, 0.01), (1999, 0.009)]), learning_rate=0.1, momentum=0.9),
    trial(W, 2, 3, rows([(7, 0.5), (1999, 0.002)]), learning_rate=0.3, momentum=0.99),
    trial(W, 2, 2, rows([(5, 0.5), (1999, 0.0095)]), learning_rate=0.2, momentum=0.5),
    # B=8: an INFEASIBLE trial that would be fastest and an INCOMPLETE one are ignored by default;
    # max_trials=1 keeps only trial 1 (the first COMPLETE by id).
    trial(W, 8, 0, rows([(10, 0.001), (20, float("nan"))]), status="INFEASIBLE", learning_rate=9.0, momentum=0.9),
    trial(W, 8, 1, rows([(100, 0.5), (600, 0.005)]), learning_rate=0.4, momentum=0.9),
    trial(W, 8, 2, rows([(50, 0.004)]), status="INCOMPLETE", learning_rate=0.5, momentum=0.9),
    trial(W, 8, 4, rows([(100, 0.5), (400, 0.005)]), learning_rate=0.6, momentum=0.9),
    # B=32: never reached.
    trial(W, 32, 1, rows([(100, 0.5), (300, 0.02)]), learning_rate=0.8, momentum=0.9),
    # Open Images: maximize average precision.
    trial(OI, 64, 1, rows([(100, 0.2), (200, 0.31), (300, 0.35)], AP), learning_rate=0.1, momentum=0.9),
    trial(OI, 64, 2, rows([(150, 0.32)], AP), learning_rate=0.2, momentum=0.9),
]


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    root = write_release(tmp_path_factory.mktemp("release") / "batch_science", TRIALS)
    path = tmp_path_factory.mktemp("store") / "store"
    main(["import", "batch-science", str(root), "--store", str(path), "--json"])  # the public import command
    connection = Store.open(path).connect()
    yield connection
    connection.close()


def steps(results):
    return {r.batch_size: (r.steps, r.trial_id) for r in results}


def test_imported_release_default_rules(con):
    results = steps_to_result(con, W, E, 0.01)
    assert steps(results) == {2: (1999, 1), 8: (400, 4), 32: (None, None)}
    assert results[0].parameters == {"learning_rate": 0.1, "momentum": 0.9}
    assert results[0].effective_learning_rate == pytest.approx(1.0)


def test_imported_release_options(con):
    assert steps(steps_to_result(con, W, E, 0.01, max_trials=1))[8] == (600, 1)
    assert steps(steps_to_result(con, W, E, 0.01, statuses=("COMPLETE", "INFEASIBLE")))[8] == (10, 0)
    assert steps(steps_to_result(con, W, E, 0.01, statuses=("COMPLETE", "INCOMPLETE")))[8] == (50, 2)
    assert steps(steps_to_result(con, W, E, 0.009))[2] == (1999, 3)  # 0.009 itself does not beat 0.009
    assert steps(steps_to_result(con, W, E, 0.01, step_budget=1000)) == {2: (None, None), 8: (400, 4), 32: (None, None)}
    assert steps(steps_to_result(con, W, E, 0.01, example_budget=3200))[8] == (400, 4)
    assert steps(steps_to_result(con, W, E, 0.01, example_budget=3199))[8] == (None, None)
    assert steps(steps_to_result(con, OI, AP, 0.31, maximize=True)) == {64: (150, 2)}


def test_imported_release_best_measurement(con):
    best = best_measurement(con, W, E, step_budget=1000)
    assert [(b.batch_size, b.value, b.step, b.trial_id) for b in best] == [
        (2, 0.01, 130, 1),
        (8, 0.005, 400, 4),
        (32, 0.02, 300, 1),
    ]
