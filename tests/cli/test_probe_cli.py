"""``batchlab probe noise-scale`` and ``batchlab probe spectrum`` on a tiny MNIST reference run."""

import json

import pytest

from tests.cli.cli_runner import run

TINY = ["mnist/fc_64_64_64", "--steps-at", "0,5", "--train-examples", "256", "--batch-size", "32", "--examples", "64",
        "--probe-batch-size", "32", "--device", "cpu"]
RUN_FIELDS = {"step", "workload", "optimizer", "batch_loss", "learning_rate", "settings"}
SETTINGS = {"workload", "optimizer", "batch_size", "learning_rate", "hyperparameters", "seed", "train_examples", "steps",
            "device", "probe_examples", "probe_batch_size", "probe_batches"}


def json_lines(text):
    return [json.loads(line) for line in text.strip().splitlines()]


def test_spectrum_prints_one_json_object_per_step(capsys):
    code, out, err = run(capsys, "probe", "spectrum", *TINY, "--k", "2", "--tol", "1e-2", "--json")
    assert code == 0, err
    rows = json_lines(out)
    assert [r["step"] for r in rows] == [0, 5]
    for row in rows:
        assert RUN_FIELDS | {"eigenvalues", "curvature", "matvecs", "examples", "parameters", "k", "tol", "converged",
                             "seconds", "density"} <= set(row)
        assert set(row["settings"]) == SETTINGS
        assert row["workload"] == "mnist/fc_64_64_64" and row["optimizer"] == "sgd" and row["curvature"] == "hessian"
        assert len(row["eigenvalues"]) == 2 and row["eigenvalues"][0] >= row["eigenvalues"][1] > 0
        assert row["matvecs"] > 2 and row["examples"] == 64 and row["parameters"] == 59210 and row["density"] is None
        assert row["settings"]["learning_rate"] == 0.1  # sgd's registered default
        assert row["settings"]["batch_size"] == 32 and row["settings"]["probe_batches"] == 2
    assert rows[0]["batch_loss"] is None and rows[1]["batch_loss"] > 0


def test_spectrum_ggn_with_density(capsys):
    code, out, err = run(capsys, "probe", "spectrum", *TINY, "--steps-at", "5", "--k", "1", "--tol", "1e-2",
                         "--curvature", "ggn", "--density", "--lanczos-steps", "4", "--probes", "1", "--json")
    assert code == 0, err
    (row,) = json_lines(out)
    assert row["curvature"] == "ggn" and row["eigenvalues"][0] > 0
    density = row["density"]
    assert density["matvecs"] <= 4 and len(density["nodes"]) == 1 and abs(sum(density["weights"][0]) - 1) < 1e-9
    assert max(density["nodes"][0]) <= row["eigenvalues"][0] * (1 + 1e-2) + 1e-6  # Ritz values below the top


def test_default_probe_examples_are_capped_by_the_training_examples(capsys):
    code, out, err = run(capsys, "probe", "spectrum", "mnist/fc_64_64_64", "--steps-at", "0", "--train-examples", "48",
                         "--batch-size", "16", "--k", "1", "--tol", "1e-1", "--device", "cpu", "--json")
    assert code == 0, err
    (row,) = json_lines(out)
    assert row["examples"] == 48 and row["settings"]["probe_examples"] == 48 and row["settings"]["probe_batches"] == 3


def test_spectrum_text_table(capsys):
    code, out, err = run(capsys, "probe", "spectrum", *TINY, "--steps-at", "0", "--k", "1", "--tol", "1e-2")
    assert code == 0, err
    assert "top hessian eigenvalues" in out and "matvecs" in out and "step 0: top eigenvalue" in err


def test_noise_scale_prints_one_json_object_per_step(capsys):
    code, out, err = run(capsys, "probe", "noise-scale", *TINY, "--optimizer", "adam", "--json")
    assert code == 0, err
    rows = json_lines(out)
    assert [r["step"] for r in rows] == [0, 5]
    for row in rows:
        assert RUN_FIELDS | {"b_simple", "b_simple_interval", "trace_sigma", "grad_norm_sq", "b_noise", "per_layer",
                             "method", "examples", "preconditioner", "preconditioned"} <= set(row)
        assert set(row["settings"]) == SETTINGS | {"level"}
        assert row["optimizer"] == "adam" and row["settings"]["learning_rate"] == 0.001 and row["examples"] == 64
        assert row["method"] == "per_example" and row["trace_sigma"] > 0 and row["b_noise"] is None
    assert rows[0]["preconditioned"] is None  # no second moments before the first update
    assert rows[1]["preconditioned"]["preconditioner"] is not None and rows[1]["preconditioned"]["trace_sigma"] > 0


@pytest.mark.parametrize("args, message", [
    (["spectrum", "mnist/fc_9"], "unknown workload"),
    (["spectrum", *TINY, "--steps-at", "5,0"], "strictly increasing"),
    (["spectrum", *TINY, "--steps-at", "0,x"], "--steps-at must be a comma-separated list of integers"),
    (["spectrum", *TINY, "--steps-at", "-3"], "integers >= 0"),
    (["spectrum", *TINY, "--optimizer", "adma"], "unknown optimizer 'adma'"),
    (["noise-scale", *TINY, "--optimizer", "adma"], "unknown optimizer 'adma'"),
    (["spectrum", *TINY, "--curvature", "fisher"], "unknown curvature 'fisher'"),
    (["spectrum", *TINY, "--k", "0"], "--k must be in 1..59209"),
    (["noise-scale", *TINY, "--method", "three_batch"], "unknown method 'three_batch'"),
    (["noise-scale", *TINY, "--examples", "32", "--hessian"], "--hessian needs at least two probe batches"),
    (["spectrum", *TINY, "--examples", "300"], r"probe examples must be in 1\.\.256"),
    (["spectrum", *TINY, "--hparam", "learning_rate=1"], "set learning_rate with --learning-rate"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    import re

    code, out, err = run(capsys, "probe", *args)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and re.search(message, err), err


def test_probe_is_listed_after_plot():
    from batchlab.cli import LAZY_COMMANDS

    names = list(LAZY_COMMANDS)
    assert LAZY_COMMANDS["probe"] == "batchlab.cli.probe" and names.index("probe") == names.index("plot") + 1
