"""The reference run is batchlab's own trial; probe batches are fixed training examples."""

import torch
import pytest

from batchlab.errors import BatchlabError
from batchlab.probes.reference import probe_batches, reference_checkpoints
from batchlab.train.trial import TrialSpec, prepare_trial, run_prepared

WORKLOAD = "mnist/fc_64_64_64"
EXAMPLES = 256


def trained(optimizer, hyperparameters, steps, seed):
    """The parameters of the trial ``batchlab train`` runs (data seed = seed) after ``steps`` updates."""
    prepared = prepare_trial(TrialSpec(WORKLOAD, optimizer, 32, hyperparameters, steps=steps, train_examples=EXAMPLES,
                                       seed=seed, data_seed=seed, stop_at_goal=False, device="cpu"))
    run_prepared(prepared)
    return [p.detach().clone() for p in prepared.model.parameters()]


@pytest.mark.parametrize("optimizer, hyperparameters", [("momentum", {"learning_rate": 0.05, "momentum": 0.9}),
                                                        ("adam", {"learning_rate": 1e-3})])
def test_checkpoints_are_the_trial_parameters_at_those_steps(optimizer, hyperparameters):
    checkpoints = reference_checkpoints(WORKLOAD, optimizer, 32, hyperparameters, [0, 3, 10], seed=2,
                                        train_examples=EXAMPLES, device="cpu")
    assert checkpoints.run.steps == 3000 and checkpoints.run.batch_size == 32  # the workload's budget
    seen = []
    for checkpoint in checkpoints:
        seen.append(checkpoint.step)
        params = [p.detach() for p in checkpoint.model.parameters()]
        if checkpoint.step == 0:
            initial = get_initial(optimizer, hyperparameters)
            assert all(torch.equal(a, b) for a, b in zip(params, initial))
            assert checkpoint.batch_loss is None and checkpoint.preconditioner is None
            continue
        expected = trained(optimizer, hyperparameters, checkpoint.step, seed=2)
        assert all(torch.equal(a, b) for a, b in zip(params, expected)), f"step {checkpoint.step} differs"
        assert checkpoint.batch_loss > 0
        if optimizer == "adam":  # Adam's metric, one positive tensor per parameter
            names = [n for n, _ in checkpoint.model.named_parameters()]
            assert list(checkpoint.preconditioner) == names
            assert all((p > 0).all() for p in checkpoint.preconditioner.values())
        else:
            assert checkpoint.preconditioner is None
        # the checkpoint is a copy: changing it leaves the run alone (the next step still matches)
        with torch.no_grad():
            for p in checkpoint.model.parameters():
                p.add_(1.0)
    assert seen == [0, 3, 10]


def get_initial(optimizer, hyperparameters):
    prepared = prepare_trial(TrialSpec(WORKLOAD, optimizer, 32, hyperparameters, steps=1, train_examples=EXAMPLES,
                                       seed=2, data_seed=2, device="cpu"))
    return [p.detach().clone() for p in prepared.model.parameters()]


def dropout_workload():
    """mnist/fc_64_64_64's data and loss with a model that draws from torch's generator (dropout)."""
    import dataclasses

    from batchlab.workloads import get_workload

    def make_model():
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                                   torch.nn.Linear(32, 10))

    return dataclasses.replace(get_workload(WORKLOAD), name="mnist/dropout_probe_test", make_model=make_model)


def test_in_loop_randomness_is_the_trials_and_the_consumers_draws_do_not_change_it():
    workload = dropout_workload()
    prepared = prepare_trial(TrialSpec(workload, "sgd", 32, {"learning_rate": 0.1}, steps=4, train_examples=EXAMPLES,
                                       seed=1, data_seed=1, stop_at_goal=False, device="cpu"))
    run_prepared(prepared)
    checkpoints = []
    for checkpoint in reference_checkpoints(workload, "sgd", 32, {"learning_rate": 0.1}, [2, 4], seed=1,
                                            train_examples=EXAMPLES, device="cpu"):
        torch.rand(1000)  # the consumer draws from the global generator between checkpoints
        checkpoints.append(checkpoint)
    assert all(torch.equal(p, q) for p, q in zip(prepared.model.parameters(), checkpoints[-1].model.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(checkpoints[0].model.parameters(), checkpoints[1].model.parameters()))


@pytest.mark.parametrize("steps_at, message", [
    ([-1, 5], "integers >= 0"),
    ([5, 2], "strictly increasing"),
    ([0, 3, 3], "strictly increasing"),
    ([], "at least one step"),
    ([1.5], "integers >= 0"),
])
def test_bad_steps_are_errors_before_any_training(steps_at, message):
    with pytest.raises(BatchlabError, match=message):
        reference_checkpoints(WORKLOAD, "sgd", 32, {"learning_rate": 0.1}, steps_at, train_examples=EXAMPLES)


def test_bad_run_settings_are_errors_before_any_training():
    with pytest.raises(BatchlabError, match="unknown optimizer 'adma'"):
        reference_checkpoints(WORKLOAD, "adma", 32, {"learning_rate": 0.1}, [0], train_examples=EXAMPLES)
    with pytest.raises(BatchlabError, match="unknown workload"):
        reference_checkpoints("mnist/fc_9", "sgd", 32, {"learning_rate": 0.1}, [0])
    with pytest.raises(BatchlabError, match="last requested step 50"):
        reference_checkpoints(WORKLOAD, "sgd", 32, {"learning_rate": 0.1}, [0, 50], steps=20, train_examples=EXAMPLES)


def test_a_diverging_run_is_an_error():
    checkpoints = reference_checkpoints(WORKLOAD, "sgd", 32, {"learning_rate": 1e4}, [0, 30], train_examples=EXAMPLES,
                                        device="cpu")
    assert next(checkpoints).step == 0
    with pytest.raises(BatchlabError, match="diverged"):
        next(checkpoints)


def test_probe_batches_are_fixed_training_examples_with_the_workload_loss():
    probes = probe_batches(WORKLOAD, 100, 32, seed=4, train_examples=EXAMPLES, data_seed=2)
    assert [len(y) for _, y in probes] == [32, 32, 32, 4] and probes.examples == 100 and len(probes) == 4
    assert len(set(probes.indices.tolist())) == 100 and max(probes.indices.tolist()) < EXAMPLES
    again = probe_batches(WORKLOAD, 100, 32, seed=4, train_examples=EXAMPLES, data_seed=2)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(probes, again))
    other = probe_batches(WORKLOAD, 100, 32, seed=5, train_examples=EXAMPLES, data_seed=2)
    assert not torch.equal(other.indices, probes.indices)
    x, y = probes.batches[0]
    logits = torch.zeros(len(y), 10)
    assert probes.loss_fn(logits, y).item() == pytest.approx(torch.log(torch.tensor(10.0)).item())
    with pytest.raises(BatchlabError, match=r"probe examples must be in 1\.\.256"):
        probe_batches(WORKLOAD, 300, 32, train_examples=EXAMPLES)
    with pytest.raises(BatchlabError, match="probe batch size must be an integer >= 1"):
        probe_batches(WORKLOAD, 10, 0, train_examples=EXAMPLES)
