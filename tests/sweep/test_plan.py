"""The plan of a sweep: each study searches its own quasi-random points (docs/methods.md, "Sweeps")."""

from __future__ import annotations

import numpy as np

from batchlab.search import SearchSpace, default_search_space, study_points_seed
from batchlab.sweep.config import parse_sweep_config
from batchlab.sweep.plan import plan_studies
from batchlab.sweep.runner import part_of, prepare_sweep
from sweep_helpers import tiny_config

CONFIG = {"workloads": ["mnist/fc_64_64_64"], "optimizers": ["sgd", "momentum"], "batch_sizes": [8, 32, 128],
          "trials": 4, "steps": 50}


def test_every_study_searches_its_own_points_and_the_same_ones_on_every_plan():
    """Before: every study of a sweep got space.sample(trials, seed=config.seed), so the 3 batch sizes of
    an optimizer searched the same 4 learning rates."""
    studies = plan_studies(parse_sweep_config(CONFIG))
    for optimizer in ("sgd", "momentum"):
        rates = [tuple(p["learning_rate"] for p in s.points) for s in studies if s.optimizer == optimizer]
        assert len(rates) == 3 and len(set(rates)) == 3  # three batch sizes, three point sets
        assert not set(rates[0]) & set(rates[1]) and not set(rates[1]) & set(rates[2])
    again = plan_studies(parse_sweep_config(CONFIG))
    assert [s.points for s in studies] == [s.points for s in again]  # the same study: the same points
    # a sweep narrowed to one batch size, or extended by one, plans that study's points unchanged
    narrowed = plan_studies(parse_sweep_config({**CONFIG, "batch_sizes": [32]}))
    extended = plan_studies(parse_sweep_config({**CONFIG, "batch_sizes": [8, 32, 128, 512]}))
    by_place = {(s.optimizer, s.batch_size): s.points for s in studies}
    assert all(by_place[(s.optimizer, s.batch_size)] == s.points for s in narrowed)
    assert all(by_place[(s.optimizer, s.batch_size)] == s.points for s in extended if s.batch_size != 512)
    # more trials re-use the first points (a study's sequence, index-addressed)
    more = plan_studies(parse_sweep_config({**CONFIG, "trials": 6}))
    assert all(m.points[:4] == s.points for m, s in zip(more, studies))
    # the points are the study's scrambled Halton sequence
    sgd32 = next(s for s in studies if (s.optimizer, s.batch_size) == ("sgd", 32))
    space = SearchSpace.from_batch_science(sgd32.search_space)
    assert list(sgd32.points) == space.sample(4, seed=study_points_seed(0, "mnist/fc_64_64_64", "sgd", 32))


def test_part_of_a_plan_and_a_resumed_plan_keep_every_trial_key_and_point(tmp_path):
    config = tiny_config()
    whole = prepare_sweep(config, str(tmp_path / "store"))
    part = part_of(whole, batch_sizes=[64])
    (alone,) = part.studies
    (same,) = [s for s in whole.studies if s.batch_size == 64]
    assert [(t.key, t.hyperparameters, t.seed) for t in alone.trial_plans()] == [
        (t.key, t.hyperparameters, t.seed) for t in same.trial_plans()]


def test_per_study_points_cover_the_space():
    """Each study's points are a scrambled Halton sequence of its own: 256 points of one study fill every
    one of 16 equal bins of the unit learning-rate coordinate (a low-discrepancy sequence puts 16 in
    each, within a few), and the first points of 64 studies are spread as uniform draws are."""
    space = default_search_space("sgd")
    (lr,) = space.parameters
    lo, hi = np.log(lr.min_value), np.log(lr.max_value)

    def unit(points):
        return (np.log([p["learning_rate"] for p in points]) - lo) / (hi - lo)

    counts = np.histogram(unit(space.sample(256, seed=study_points_seed(0, "w/m", "sgd", 64))), 16, (0, 1))[0]
    assert counts.min() >= 12 and counts.max() <= 20
    firsts = unit([space.sample(1, seed=study_points_seed(0, "w/m", "sgd", b))[0] for b in range(1, 65)])
    assert len(set(firsts.tolist())) == 64
    from scipy.stats import kstest

    assert kstest(firsts, "uniform").pvalue > 0.001


def test_a_store_made_when_studies_shared_their_points_keeps_its_trials_and_gets_new_studies(tmp_path, monkeypatch):
    """A store written before each study had its own points (every study at ``config.seed``'s points,
    no ``points`` in the sweep settings): re-running the sweep neither re-uses nor loses its trials; the
    sweep is another sweep (its id enters every study id and trial key), its studies take new id blocks,
    and its table rests on its own trials only."""
    import batchlab.search
    import batchlab.sweep.plan as plan_module
    from batchlab.store import Store
    from batchlab.sweep.config import MAX_TRIALS_PER_STUDY
    from batchlab.sweep.executors import InlineExecutor
    from batchlab.sweep.runner import run_sweep

    def inline(fn, **kw):
        return InlineExecutor(fn)

    path = str(tmp_path / "store")
    with monkeypatch.context() as old:  # the rule before this change
        settings = plan_module.sweep_settings
        old.setattr(plan_module, "sweep_settings", lambda c: {k: v for k, v in settings(c).items() if k != "points"})
        old.setattr(batchlab.search, "study_points_seed", lambda seed, *identity: seed)
        old_plan = prepare_sweep(tiny_config(), path)
        assert old_plan.studies[0].points == old_plan.studies[1].points
        run_sweep(old_plan, executor_factory=inline)
    before = {r["trial_key"]: (r["trial_id"], r["parameters"]) for r in Store.open(path).table("trials").to_pylist()}
    assert len(before) == 6
    new_plan = prepare_sweep(tiny_config(), path)
    assert new_plan.sweep_id != old_plan.sweep_id
    summary = run_sweep(new_plan, executor_factory=inline)
    assert summary.trials_skipped == 0 and summary.trials_run == 6
    after = {r["trial_key"]: (r["trial_id"], r["parameters"]) for r in Store.open(path).table("trials").to_pylist()}
    assert len(after) == 12 and all(after[k] == v for k, v in before.items())  # kept, none twice
    new_ids = sorted(after[k][0] for k in set(after) - set(before))
    assert new_ids == sorted([MAX_TRIALS_PER_STUDY + i for i in (1, 2, 3)] * 2)  # at B = 8 and at B = 64
    assert all(i > MAX_TRIALS_PER_STUDY for i in new_ids)  # new id blocks, the old trials keep block 0
    assert all(r.n_trials == 3 for r in summary.results["mnist/fc_64_64_64/momentum"])  # its own trials only
    assert run_sweep(prepare_sweep(tiny_config(), path), executor_factory=inline).trials_skipped == 6  # resumes
