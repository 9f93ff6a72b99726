"""The branched critical batch size from a user's own checkpoints (batchlab.integrations.branched).

The "user's run" is a tiny MLP on random data trained by a plain loop (:func:`train_users_run`); its
adapter lives in a module written to tmp_path (:data:`ADAPTER_SOURCE`), so spawned pool and Dask
workers import it again by file path.
"""

import json
import math
import os
import re
import sys

import pytest
import torch

from batchlab.errors import BatchlabError
from batchlab.integrations import branched as ib
from batchlab.integrations.branched import (
    batch_size_schedule,
    branched_from_checkpoints,
    resolve_adapter,
)
from batchlab.integrations.schedule import BatchSizeSchedule
from batchlab.probes.branched import BranchedResult, _summarize

B = 16
WINDOW = 64  # 4 reference updates; 1 update at k = 4
KS = [1, 2, 4]

ADAPTER_SOURCE = '''
"""A tiny user's run: an MLP on 512 random examples, its adapter and its training loop."""

import collections

import torch

N, DIM, CLASSES = 512, 8, 3


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, DIM, generator=g)
    y = (x @ torch.randn(DIM, CLASSES, generator=g)).argmax(1)
    order = torch.randperm(N, generator=g)
    return x, y, order


class TinyAdapter:
    """optimizer "sgd" (momentum 0.9, constant lr 0.1) or "adam" (lr 0.01 decaying linearly over 100 steps)."""

    def __init__(self, optimizer="sgd", fail=None, limit=None):
        self.optimizer, self.fail, self.limit = optimizer, fail, limit
        self.x, self.y, self.order = data()
        self.calls = collections.Counter()

    def _maybe_fail(self, method):
        self.calls[method] += 1
        if self.fail == method:
            raise RuntimeError(f"{method} broke\\non two lines")

    def rate(self, step):
        return 0.1 if self.optimizer == "sgd" else 0.01 * (1 - step / 100)

    def build(self):
        self._maybe_fail("build")
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(DIM, 16), torch.nn.Tanh(), torch.nn.Linear(16, CLASSES))
        if self.optimizer == "sgd":
            opt = torch.optim.SGD(model.parameters(), lr=self.rate(0), momentum=0.9)
        else:
            opt = torch.optim.Adam(model.parameters(), lr=self.rate(0))
        return model, opt

    def load(self, path, model, optimizer):
        self._maybe_fail("load")
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    def batches(self, step, batch_size):
        self._maybe_fail("batches")
        s = step
        while self.limit is None or s < step + self.limit:
            idx = self.order[torch.arange(s * batch_size, (s + 1) * batch_size) % N]
            yield self.x[idx], self.y[idx]
            s += 1

    def loss(self, model, batch):
        self._maybe_fail("loss")
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x), y)

    def probe_batches(self):
        self._maybe_fail("probe_batches")
        return [(self.x[:64], self.y[:64]), (self.x[64:128], self.y[64:128])]



class SGDAdapter(TinyAdapter):
    """The constant-rate SGD run: no learning_rates (the loaded optimizer's rate is used)."""


class AdamAdapter(TinyAdapter):
    """The Adam run with its decaying schedule, which the adapter gives by learning_rates."""

    def __init__(self, **kw):
        super().__init__(optimizer="adam", **kw)

    def learning_rates(self, step):
        return self.rate(step)


def failing_load():
    """A factory: the adapter whose load raises."""
    return SGDAdapter(fail="load")


class NoLoss:
    def build(self): ...
    def load(self, path, model, optimizer): ...
    def batches(self, step, batch_size): ...
    def probe_batches(self): ...


def train_users_run(adapter, steps, save_at, directory, batch_size=16):
    """The user's own loop: checkpoints {step: path} at the steps of save_at (before update `step`)."""
    model, opt = adapter.build()
    paths = {}
    stream = iter(adapter.batches(0, batch_size))
    for step in range(steps + 1):
        if step in save_at:
            paths[step] = str(directory / f"step{step}.pt")
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, paths[step])
        if step == steps:
            break
        for group in opt.param_groups:
            group["lr"] = adapter.rate(step)
        opt.zero_grad()
        adapter.loss(model, next(stream)).backward()
        opt.step()
    return paths
'''


def write_user_run(tmp_path, monkeypatch):
    """The adapter module (importable as ``tiny_adapter`` and by file path) and the SGD and Adam runs'
    checkpoints at steps 0, 4 and 8: ``(module, {"sgd": paths, "adam": paths}, file)``; ``monkeypatch``
    undoes the import path and the module afterwards."""
    source = tmp_path / "tiny_adapter.py"
    source.write_text(ADAPTER_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delitem(sys.modules, "tiny_adapter", raising=False)
    import tiny_adapter

    monkeypatch.setitem(sys.modules, "tiny_adapter", tiny_adapter)  # removed again on undo
    runs = {}
    for name, cls in (("sgd", tiny_adapter.SGDAdapter), ("adam", tiny_adapter.AdamAdapter)):
        directory = tmp_path / name
        directory.mkdir()
        runs[name] = tiny_adapter.train_users_run(cls(), 8, {0, 4, 8}, directory)
    return tiny_adapter, runs, source


@pytest.fixture()
def user_run(tmp_path, monkeypatch):
    return write_user_run(tmp_path, monkeypatch)


def checkpoint_probe_loss(adapter, path):
    model, opt = adapter.build()
    adapter.load(path, model, opt)
    return ib.default_probe_loss(adapter, model)


def measure(adapter, paths, **kw):
    kw = {"multipliers": KS, "window": WINDOW, **kw}
    return branched_from_checkpoints(adapter, paths, B, **kw)


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_reference_branch_is_the_users_run_continued(user_run, kind):
    module, runs, _ = user_run
    cls = module.SGDAdapter if kind == "sgd" else module.AdamAdapter
    result = measure(cls(), runs[kind], rule="sqrt" if kind == "adam" else "linear")
    assert [c.step for c in result.checkpoints] == [0, 4, 8]
    for point, later in zip(result.checkpoints, [4, 8]):
        # same path (the user's loss, batches and optimizer step at the loaded rate): bitwise
        assert point.reference_loss == checkpoint_probe_loss(cls(), runs[kind][later])
    # the checkpoint's learning rate: loaded (sgd) or the adapter's schedule at the checkpoint (adam)
    expected = [0.1] * 3 if kind == "sgd" else [0.01 * (1 - s / 100) for s in (0, 4, 8)]
    assert [c.learning_rate for c in result.checkpoints] == expected


def test_result_follows_the_branched_definitions(user_run):
    module, runs, _ = user_run
    result = measure(module.SGDAdapter(), runs["sgd"], tolerance=0.005)
    assert result.examples_processed == 3 * len(KS) * WINDOW and result.computed == 9
    for point in result.checkpoints:
        assert [(b.multiplier, b.batch_size, b.steps, b.examples, b.factor) for b in point.branches] == [
            (1, 16, 4, 64, 1.0), (2, 32, 2, 64, 2.0), (4, 64, 1, 64, 4.0)]
        for b in point.branches:
            assert b.passed == (math.isfinite(b.loss) and b.loss <= 1.005 * point.reference_loss)
            assert b.learning_rate == pytest.approx(0.1 * b.factor)
        passing = [b.batch_size for b in point.branches if b.passed]
        first_fail = next((b.batch_size for b in point.branches if not b.passed), None)
        assert point.high == first_fail and point.low == point.critical_batch_size
        assert point.critical_batch_size == max(p for p in passing if first_fail is None or p < first_fail)
    s = result.settings
    assert s["adapter"] == "tiny_adapter:SGDAdapter" and s["checkpoints_at"] == [0, 4, 8]
    assert s["rule"] == "linear" and s["window"] == WINDOW and s["executor"] == "inline"
    json.dumps(result.to_dict())  # serialisable, the warmup included


def test_a_k_branch_is_the_concatenated_large_batch(user_run):
    module, runs, _ = user_run
    adapter = module.SGDAdapter()
    result = measure(adapter, {4: runs["sgd"][4]}, multipliers=[1, 2])
    # by hand: 2 updates at 2·B on the concatenation of reference batches 4..7, at lr 0.1·2
    model, opt = adapter.build()
    adapter.load(runs["sgd"][4], model, opt)
    stream = iter(adapter.batches(4, B))
    for _ in range(2):
        (x1, y1), (x2, y2) = next(stream), next(stream)
        for g in opt.param_groups:
            g["lr"] = 0.2
        opt.zero_grad()
        adapter.loss(model, (torch.cat([x1, x2]), torch.cat([y1, y2]))).backward()
        opt.step()
    expected = ib.default_probe_loss(adapter, model)
    got = result.checkpoints[0].branches[1].loss
    # accumulated (mean of two batch means) vs one mean over 32 examples: the same gradient summed in
    # another order, so equal up to float32 rounding
    assert got == pytest.approx(expected, rel=1e-5) and got != result.checkpoints[0].reference_loss


def test_resume_loads_and_recomputes_nothing(user_run, tmp_path):
    module, runs, _ = user_run
    out = tmp_path / "out"
    first_adapter = module.SGDAdapter()
    first = measure(first_adapter, runs["sgd"], out=out)
    assert first.computed == 9 and first_adapter.calls["load"] == 9
    again = module.SGDAdapter()
    second = measure(again, runs["sgd"], out=out)
    assert second.computed == 0 and sum(again.calls.values()) == 0  # not one adapter call
    assert second.to_dict() == first.to_dict() | {"computed": 0}
    cache = json.loads((out / "branched.json").read_text())
    assert set(cache["checkpoints"]) == {"0", "4", "8"} and len(cache["branches"]) == 9
    # another rule computes only its own factors (sqrt(2) at k=2, 2 at k=4), the reference comes from the cache
    third = module.SGDAdapter()
    result = measure(third, runs["sgd"], out=out, rule="sqrt")
    assert result.computed == 3 * 2 and third.calls["load"] == 6
    assert [c.reference_loss for c in result.checkpoints] == [c.reference_loss for c in first.checkpoints]


def test_resume_refuses_other_settings_and_changed_checkpoints(user_run, tmp_path):
    module, runs, _ = user_run
    out = tmp_path / "out"
    measure(module.SGDAdapter(), {0: runs["sgd"][0]}, out=out)
    with pytest.raises(BatchlabError, match="different measurement .other adapter or adapter source file, batch size"):
        measure(module.SGDAdapter(), {0: runs["sgd"][0]}, out=out, window=2 * WINDOW)
    with pytest.raises(BatchlabError, match="different measurement"):
        measure(module.AdamAdapter(), {0: runs["sgd"][0]}, out=out)
    stat = os.stat(runs["sgd"][0])
    os.utime(runs["sgd"][0], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(BatchlabError, match="checkpoint step 0 .* is not the file whose branches"):
        measure(module.SGDAdapter(), {0: runs["sgd"][0]}, out=out)
    # a new checkpoint is added to the same cache
    added = measure(module.SGDAdapter(), {4: runs["sgd"][4]}, out=out)
    assert added.computed == 3


def test_resume_refuses_an_edited_adapter(user_run, tmp_path):
    """The cache records the SHA-256 of the adapter's source file: the same reference after an edit of
    that file is another adapter (its branches would mix with the old ones), refused in one line."""
    _, runs, source = user_run
    out = tmp_path / "out"
    reference = f"{source}:SGDAdapter"
    measure(reference, {0: runs["sgd"][0]}, out=out)
    assert measure(reference, {0: runs["sgd"][0]}, out=out).computed == 0
    cache = json.loads((out / "branched.json").read_text())
    assert len(cache["settings"]["adapter_source"]) == 64
    source.write_text(source.read_text() + "\n# edited\n")
    with pytest.raises(BatchlabError, match="adapter source file") as info:
        measure(reference, {0: runs["sgd"][0]}, out=out)
    assert "\n" not in str(info.value)


@pytest.mark.slow  # starts spawned workers and a Dask LocalCluster (seconds of imports each on a loaded machine)
def test_workers_and_dask_give_the_inline_results(user_run):
    _, runs, source = user_run
    reference = f"{source}:SGDAdapter"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # pool workers run one thread: the guarantee is bitwise at equal thread counts
    try:
        inline = measure(reference, runs["sgd"])
    finally:
        torch.set_num_threads(threads)
    pooled = measure(reference, runs["sgd"], workers=2)
    assert pooled.settings["executor"] == "local"
    assert [c.to_dict() for c in pooled.checkpoints] == [c.to_dict() for c in inline.checkpoints]
    pytest.importorskip("distributed")
    on_dask = measure("tiny_adapter:SGDAdapter", {8: runs["sgd"][8]}, dask=True, workers=1)
    assert on_dask.settings["executor"] == "dask"
    assert on_dask.checkpoints[0].to_dict() == inline.checkpoints[2].to_dict()


@pytest.mark.slow  # starts spawned workers
def test_a_worker_reports_the_adapter_error_in_one_line(user_run, tmp_path):
    _, runs, _ = user_run
    (tmp_path / "failing.py").write_text(f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
                                         "from tiny_adapter import SGDAdapter\n\n"
                                         "def adapter():\n    return SGDAdapter(fail='loss')\n")
    with pytest.raises(BatchlabError) as info:
        measure(f"{tmp_path / 'failing.py'}:adapter", {4: runs["sgd"][4]}, workers=2)
    message = str(info.value)
    assert "\n" not in message and "loss raised RuntimeError: loss broke on two lines" in message
    assert "checkpoint step 4" in message and "step4.pt" in message


@pytest.mark.parametrize("method", ["build", "load", "batches", "loss", "probe_batches"])
def test_an_adapter_that_raises_is_one_line_naming_method_checkpoint_and_error(user_run, method):
    module, runs, _ = user_run
    with pytest.raises(BatchlabError) as info:
        measure(module.SGDAdapter(fail=method), {4: runs["sgd"][4]})
    message = str(info.value)
    assert "\n" not in message and message.startswith("adapter tiny_adapter:SGDAdapter: ")
    assert f"{method} broke on two lines" in message and "RuntimeError" in message
    assert f"checkpoint step 4, {runs['sgd'][4]}" in message


def test_bad_input_is_one_line(user_run, tmp_path):
    module, runs, _ = user_run
    good = runs["sgd"]
    cases = [
        (lambda: measure(module.SGDAdapter(), {0: str(tmp_path / "nope.pt")}), r"step 0: .*nope.pt' does not exist"),
        (lambda: measure(module.SGDAdapter(), {"4": good[4]}), r"checkpoint step '4' must be an integer >= 0"),
        (lambda: measure(module.SGDAdapter(), {-1: good[4]}), r"checkpoint step -1 must be an integer >= 0"),
        (lambda: measure(module.SGDAdapter(), {}), r"non-empty mapping"),
        (lambda: measure("no_such_module_xyz:A", good), r"module 'no_such_module_xyz' not found"),
        (lambda: measure(f"{tmp_path}/missing.py:A", good), r"file not found"),
        (lambda: measure("tiny_adapter:Nothing", good), r"adapter reference 'tiny_adapter:Nothing': no attribute 'Nothing' in module 'tiny_adapter'; found: .*SGDAdapter"),
        (lambda: measure("tiny_adapter", good), r"bad adapter reference 'tiny_adapter'"),
        (lambda: measure("tiny_adapter:NoLoss", good), r"lacks loss; an adapter defines build\(\)"),
        (lambda: measure(module.SGDAdapter(), good, workers=2), r"workers > 1 and Dask need the adapter as a reference"),
        (lambda: measure(module.SGDAdapter(limit=2), {4: good[4]}), r"batches\(4, 16\) ended after 2 batches; the window needs 4"),
        (lambda: measure(module.SGDAdapter(), good, multipliers=[1, 4, 2]), r"strictly increasing"),
        (lambda: measure(module.SGDAdapter(), good, window=32), r"less than one update at the largest batch size 64"),
        (lambda: measure(module.SGDAdapter(), good, rule="cubic"), r"unknown learning-rate rule 'cubic'"),
        (lambda: measure(module.SGDAdapter(), good, learning_rate=-1.0), r"learning rate must be a number > 0"),
        (lambda: measure(module.SGDAdapter(), good, workers=0), r"workers must be an integer >= 1"),
    ]
    for call, pattern in cases:
        with pytest.raises(BatchlabError) as info:
            call()
        assert "\n" not in str(info.value) and re.search(pattern, str(info.value)), (pattern, str(info.value))


def test_resolve_adapter_forms(user_run):
    module, _, source = user_run
    assert isinstance(resolve_adapter("tiny_adapter:SGDAdapter"), module.SGDAdapter)  # a class: instantiated
    by_file = resolve_adapter(f"{source}:AdamAdapter")
    assert by_file.optimizer == "adam" and ib.default_rule(f"{source}:AdamAdapter") == "sqrt"
    assert ib.default_rule("tiny_adapter:SGDAdapter") == "linear"
    assert ib.adapter_reference(f"{source.name}:X") == f"{os.path.abspath(source.name)}:X"


def summarized(steps_and_losses, batch=16, ks=(1, 2, 4, 8)):
    """A BranchedResult from given losses ``{step: [loss per k]}`` (the schedule's arithmetic only)."""
    points = [_summarize(s, 0.1, batch, list(ks), 8 * batch, 0.01, {(k, float(k)): v for k, v in zip(ks, losses)})
              for s, losses in steps_and_losses.items()]
    return BranchedResult(points, {"batch_size": batch}, 0)


def test_schedule_in_examples_tokens_and_olmo_core_form(tmp_path):
    # critical: step 0 -> 16 (k=2 fails), step 10 -> 64, step 20 -> 32 (running max stays 64), step 30 -> 128
    result = summarized({0: [1.0, 2.0, 2.0, 2.0], 10: [1.0, 1.0, 1.0, 2.0], 20: [1.0, 1.0, 2.0, 2.0],
                         30: [1.0, 1.0, 1.0, 1.0]})
    schedule = batch_size_schedule(result)
    assert schedule == BatchSizeSchedule(((0, 16), (160, 64), (480, 128)))  # step t of B=16 -> 16·t examples
    assert schedule.batch_size_at(159) == 16 and schedule.batch_size_at(160) == 64
    path = schedule.save(tmp_path / "schedule.json")
    assert BatchSizeSchedule.load(path) == schedule
    tokens = batch_size_schedule(result, tokens_per_example=128)
    assert tokens.unit == "tokens" and tokens.points == ((0, 2048), (20480, 8192), (61440, 16384))
    assert tokens.to_olmo_core() == schedule.to_olmo_core(sequence_length=128) == {
        "batch_sizes": [2048, 8192, 16384],
        "schedule": [{"value": 0, "unit": "tokens"}, {"value": 20480, "unit": "tokens"},
                     {"value": 61440, "unit": "tokens"}]}
    # the first checkpoint at step 0 above B replaces B; a later first checkpoint at B adds nothing
    assert batch_size_schedule(summarized({0: [1.0, 1.0, 2.0, 2.0]})).points == ((0, 32),)
    assert batch_size_schedule(summarized({5: [1.0, 2.0, 2.0, 2.0], 9: [1.0, 1.0, 1.0, 1.0]})).points == (
        (0, 16), (144, 128))
    with pytest.raises(BatchlabError, match="tokens per example must be an integer >= 1"):
        batch_size_schedule(result, tokens_per_example=0)


@pytest.mark.slow  # a fresh interpreter training the guide's example (about 10 s)
def test_the_documented_example_runs(tmp_path):
    """docs/integrations.md's example of this section, run as a script (the guide's blocks also run in
    the documentation test once integrations.md is listed there)."""
    import subprocess
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "integrations.md").read_text()
    section = text.split("## Branched critical batch size from your checkpoints", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 1
    (tmp_path / "example.py").write_text(blocks[0])
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "schedule: ((0, 8), (400, 16), (3200, 32))" in done.stdout  # the numbers the guide quotes
    assert BatchSizeSchedule.load(tmp_path / "schedule.json").points == ((0, 8), (400, 16), (3200, 32))


def test_an_explicit_learning_rate_replaces_the_checkpoints(user_run):
    module, runs, _ = user_run
    given = measure(module.AdamAdapter(), {4: runs["adam"][4]}, learning_rate=0.01, multipliers=[1, 2])
    point = given.checkpoints[0]
    assert point.learning_rate == 0.01 and [b.learning_rate for b in point.branches] == [0.01, 0.02]
    scheduled = measure(module.AdamAdapter(), {4: runs["adam"][4]}, multipliers=[1, 2]).checkpoints[0]
    assert scheduled.learning_rate == pytest.approx(0.0096) and scheduled.reference_loss != point.reference_loss


def test_every_branch_reads_the_same_examples_from_a_stream_shuffled_by_the_global_generator(user_run):
    """An adapter whose batches() shuffles with torch's global generator (a DataLoader(shuffle=True)
    without its own generator does): the stream is made and its first batch drawn under a seed that does
    not depend on k, so the branches at k = 1 and k = 2 read the same examples in the same order."""
    module, runs, _ = user_run

    class GlobalShuffle(module.SGDAdapter):
        def __init__(self):
            super().__init__()
            self.orders = []

        def batches(self, step, batch_size):
            def stream():
                order = torch.randperm(module.N)  # drawn at the first next(), from the global generator
                self.orders.append(order)
                for s in range(0, module.N, batch_size):
                    idx = order[s:s + batch_size]
                    yield self.x[idx], self.y[idx]
            return stream()

    adapter = GlobalShuffle()
    measure(adapter, {4: runs["sgd"][4]}, multipliers=[1, 2])
    assert len(adapter.orders) == 2 and torch.equal(adapter.orders[0], adapter.orders[1])


def test_a_subclass_of_the_base_class_lacking_required_methods_is_refused_naming_them():
    """CheckpointAdapter defines no required method: a subclass that leaves them out is refused, one
    line naming what it lacks, before anything runs."""

    class OnlyBuild(ib.CheckpointAdapter):
        def build(self):
            return None, None

    with pytest.raises(BatchlabError) as exc:
        resolve_adapter(OnlyBuild())
    message = str(exc.value)
    assert "\n" not in message
    assert all(name in message for name in ("load", "batches", "loss", "probe_loss or probe_batches"))
    assert "lacks load, batches, loss, probe_loss or probe_batches;" in message  # build is defined
