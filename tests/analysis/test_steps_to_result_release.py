"""Steps to result end to end: a release-format tree written here, imported into a Store, analysed."""

import pytest

from analysis_fixtures import trial, write_release
from batchlab.analysis.budgets import best_measurement
from batchlab.analysis.steps_to_result import steps_to_result
from batchlab.cli import main
from batchlab.errors import BatchlabError
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


def test_imported_release_brackets_and_studies(con):
    results = {r.batch_size: r for r in steps_to_result(con, W, E, 0.01)}
    # three trials reach at 1999, evaluated before at 130, 7 and 5: the bracket is (5, 1999]
    assert (results[2].steps, results[2].steps_lower, results[2].censored_at) == (1999, 5, None)
    assert (results[8].steps, results[8].steps_lower) == (400, 100)
    assert (results[32].steps, results[32].steps_lower, results[32].censored_at) == (None, None, 300)
    # one study per batch size, with a recorded id; not mixed
    assert all(len(r.study_ids) == 1 and not r.mixed_studies for r in results.values())


def test_imported_release_auto_trial_count_refuses_too_few(con):
    with pytest.raises(BatchlabError, match=r"batch size 2 has 3 trials .*the paper's first 100.*--max-trials all"):
        steps_to_result(con, W, E, 0.01, max_trials="auto")


@pytest.fixture(scope="module")
def synthetic_release(tmp_path_factory):
    """A synthetic release (batchlab.store.synthetic_release) of two workloads whose paper N differ:
    the LSTM (N = 50) with 60 and 55 COMPLETE trials, and an MNIST CNN (N = 100) with 104 and 40."""
    from batchlab.store.synthetic_release import StudyShape, generate_release

    shapes = [
        StudyShape("lm1b/lstm/nesterov_momentum", 16, 60, 3, 4),
        StudyShape("lm1b/lstm/nesterov_momentum", 64, 55, 0, 2),
        StudyShape("mnist/simple_cnn_base/sgd", 32, 104, 2, 2),
        StudyShape("mnist/simple_cnn_base/sgd", 128, 40, 0, 1),
    ]
    root = tmp_path_factory.mktemp("synthetic") / "batch_science"
    generate_release(root, shapes, total_measurements=60_000)
    path = tmp_path_factory.mktemp("store") / "store"
    main(["import", "batch-science", str(root), "--store", str(path), "--json"])
    connection = Store.open(path).connect()
    yield connection
    connection.close()


def test_synthetic_release_first_n_complete_trials_like_the_paper(synthetic_release):
    from batchlab.store.synthetic_release import workload_metrics

    con = synthetic_release
    lstm = "lm1b/lstm/nesterov_momentum"
    _, metric, goal, maximize = workload_metrics(lstm)
    results = steps_to_result(con, lstm, metric, goal, maximize=maximize, max_trials="auto")
    assert [(r.batch_size, r.n_trials, r.max_trials) for r in results] == [(16, 50, 50), (64, 50, 50)]
    # the first 50 COMPLETE trials by id: the same as asking for 50 explicitly, with COMPLETE only
    explicit = steps_to_result(con, lstm, metric, goal, maximize=maximize, max_trials=50, statuses=("COMPLETE",))
    assert [(r.steps, r.trial_id, r.steps_lower) for r in results] == [(r.steps, r.trial_id, r.steps_lower) for r in explicit]
    for r in results:
        assert r.steps is None or 0 <= r.steps_lower < r.steps
    cnn = "mnist/simple_cnn_base/sgd"
    _, metric, goal, maximize = workload_metrics(cnn)
    with pytest.raises(BatchlabError, match=r"batch size 128 has 40 trials .*first 100"):
        steps_to_result(con, cnn, metric, goal, maximize=maximize, max_trials="auto")
    results = steps_to_result(con, cnn, metric, goal, maximize=maximize, max_trials="all")
    assert [(r.batch_size, r.n_trials, r.max_trials) for r in results] == [(32, 104, None), (128, 40, None)]
