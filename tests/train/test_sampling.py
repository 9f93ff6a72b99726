import numpy as np
import pytest
import torch

from batchlab.errors import BatchlabError
from batchlab.train.sampling import batch_indices, updates_per_epoch


def test_an_epoch_visits_distinct_examples_and_batches_have_the_right_size():
    num_train, batch_size = 103, 10
    per_epoch = updates_per_epoch(num_train, batch_size)
    assert per_epoch == 10
    seen = torch.cat([batch_indices(num_train, batch_size, seed=3, step=s) for s in range(per_epoch)])
    assert seen.dtype == torch.int64 and len(seen) == 100
    assert len(set(seen.tolist())) == 100  # no repeats within an epoch
    assert seen.min() >= 0 and seen.max() < num_train


def test_deterministic_given_seed_and_reshuffled_each_epoch():
    a = [batch_indices(64, 16, seed=7, step=s) for s in range(12)]
    b = [batch_indices(64, 16, seed=7, step=s) for s in range(12)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    epoch0, epoch1 = torch.cat(a[:4]), torch.cat(a[4:8])
    assert sorted(epoch0.tolist()) == list(range(64)) == sorted(epoch1.tolist())
    assert not torch.equal(epoch0, epoch1)
    other_seed = torch.cat([batch_indices(64, 16, seed=8, step=s) for s in range(4)])
    assert not torch.equal(epoch0, other_seed)


def test_random_access_matches_sequential_and_result_is_owned_by_the_caller():
    late = batch_indices(50, 7, seed=0, step=1000)
    late[:] = -1  # must not corrupt the cached permutation
    again = batch_indices(50, 7, seed=0, step=1000)
    assert again.min() >= 0 and len(again) == 7


def test_full_batch_sees_every_example():
    batch = batch_indices(20, 20, seed=0, step=5)
    assert sorted(batch.tolist()) == list(range(20))


def test_numpy_integers_are_accepted():
    assert len(batch_indices(np.int64(30), np.int64(3), seed=np.int64(1), step=np.int64(2))) == 3


@pytest.mark.parametrize(
    "args, fragment",
    [
        ((10, 11, 0, 0), "batch size 11 is out of range; allowed: 1 to 10"),
        ((10, 0, 0, 0), "batch size 0 is out of range"),
        ((10, 2, 0, -1), "step must be >= 0"),
        ((10, 2, -1, 0), "seed must be >= 0"),
        ((10, 2.5, 0, 0), "batch size must be an integer"),
        ((0, 1, 0, 0), "training set is empty"),
    ],
)
def test_bad_input_is_a_one_line_error(args, fragment):
    with pytest.raises(BatchlabError, match=fragment) as err:
        batch_indices(*args)
    assert "\n" not in str(err.value)


def test_batch_sampler_gives_batch_indices_in_any_order():
    from batchlab.train.sampling import BatchSampler

    sampler = BatchSampler(103, 10, seed=4)
    steps = list(range(35)) + [3, 0, 21, 1000, 20]  # across epochs, backwards (a replay), far ahead
    for step in steps:
        assert torch.equal(sampler.indices(step), batch_indices(103, 10, seed=4, step=step)), step
    assert sampler.per_epoch == 10 and sampler.indices(0).dtype == torch.int64
    view = sampler.indices(7)
    view[:] = 0  # the sampler's own copy of the epoch; the shared cache is untouched
    assert not torch.equal(batch_indices(103, 10, seed=4, step=7), view)
    assert torch.equal(BatchSampler(103, 10, seed=4).indices(7), batch_indices(103, 10, seed=4, step=7))


@pytest.mark.parametrize(
    "args, fragment",
    [((10, 11, 0), "batch size 11 is out of range"), ((10, 2, -1), "seed must be >= 0"), ((0, 1, 0), "training set is empty")],
)
def test_batch_sampler_bad_input_is_a_one_line_error(args, fragment):
    from batchlab.train.sampling import BatchSampler

    with pytest.raises(BatchlabError, match=fragment) as err:
        BatchSampler(*args)
    assert "\n" not in str(err.value)
    with pytest.raises(BatchlabError, match="step must be >= 0"):
        BatchSampler(10, 2, 0).indices(-1)
