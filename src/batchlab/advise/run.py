"""The whole of ``batchlab advise`` (docs/methods.md, "Advise"): measure just enough of one workload to
recommend a batch size and its metaparameters, at a stated cost.

Flow of :func:`advise`:

1. Everything a user can get wrong is checked before anything trains or is written: the objective,
   the budget, the target ratio, the trials, and the sweep settings (:func:`batchlab.sweep.runner.prepare_sweep`
   of the first study). Bad input is one line (:class:`~batchlab.errors.BatchlabError`), the store unchanged.
2. *Throughput* (:mod:`batchlab.advise.throughput`): step times and the largest batch that fits, on
   the device the studies train on, over the candidate batch sizes (the ``--config`` file's
   ``batch_sizes``, else the powers of two up to :data:`LARGEST_CANDIDATE` and the training set).
3. *Reference* (round 0): one study at the fitting candidate nearest the workload's default batch
   size; its best trial is the tuned reference run of the predictors.
4. *Bracket* (:mod:`batchlab.advise.bracket`): the predictors' bracket of B_crit, or ``--bracket LO:HI``.
5. *Rounds* (:mod:`batchlab.advise.rounds`): round 1 spans the bracket with up to four candidates; then
   one study a round, the one expected to narrow B_crit's interval most per example, until the interval's
   ``high / low`` is at most the target ratio, the budget is spent, or no study is expected to help.
6. *Recommendation* (:mod:`batchlab.advise.recommend`) for the objective, then *check*
   (:mod:`batchlab.advise.check`): one more trial of it with a fresh seed, unless ``check=False``.

Every round is a sweep (:func:`batchlab.sweep.runner.run_sweep`) with one set of sweep settings (only
batch sizes and trial counts change, which do not change the sweep id), so all of advise's studies are
one unit of the store, analysed, reported and resumed like any sweep; the advice record
(:mod:`batchlab.advise.record`) keeps the throughput, bracket, each round's decision and the answer.

Budget (compute counted in training examples: updates x batch size; evaluations not counted): the
spend is every trial of the unit (whoever ran it) plus the throughput probe, the predictors and the
check. A round starts only while the spend is below the budget, and round 1 admits its studies in
order only while their examples bounds fit in what is left (its first study always, when anything is
left), so the budget is never exceeded by more than one study. ``budget_hours`` counts wall-clock
seconds of advise's own runs, and bounds a study by ``trials x budget steps x`` the measured seconds
per step; it is therefore not reproducible across runs, where the examples budget is.

Resume: a killed advice re-run with the same arguments finds its record (same id), re-uses its
throughput and bracket measurements, and replays its rounds: each is a sweep whose published trials
are skipped, and the decisions are deterministic given the store's trials, so it takes the same
decisions and gives the same answer.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from batchlab.errors import BatchlabError

#: The objectives of a recommendation.
OBJECTIVES = ("time", "examples")
DEFAULT_TARGET_RATIO = 1.5
#: Trials per new study unless told otherwise (racing needs two that reach the goal).
DEFAULT_TRIALS = 4
#: The largest default candidate batch size (a ``--config`` file's ``batch_sizes`` replace the defaults).
LARGEST_CANDIDATE = 2**14
#: Rounds after round 1 at most (each is one study): a guard, never reached in the measured runs.
MAX_ROUNDS = 30
#: Updates per candidate of the throughput probe (the first PROBE_WARMUP untimed), and the most of an
#: examples budget the probe may take (its candidates, ascending, while their updates x B fit).
PROBE_UPDATES, PROBE_WARMUP, PROBE_SHARE = 13, 3, 0.1
#: The seed offset of the check run: its trial's seed is ``seed + CHECK_SEED_OFFSET``, which no study
#: trial uses (their seeds are digests of their keys, batchlab.sweep.keys.trial_seed).
CHECK_SEED_OFFSET = 1_000_003


@dataclass
class Advice:
    """The finished (or stopped) advice: its record (docs/methods.md, "The advice record") and where it is."""

    record: dict
    path: Path

    def lines(self) -> list[str]:
        """The answer as printed by ``batchlab advise``."""
        r = self.record
        out = [f"advise {r['settings']['store_workload']} ({r['unit'] or 'no study run'}): stopped: {r['stop']['text']}"]
        rec = r.get("recommendation")
        if rec:
            out += list(rec.get("lines") or [])
        elif r["rounds"]:
            out.append("no recommendation: no measured batch size reached the goal; the answer is bounded: steps to "
                       "the goal exceed each measured budget")
        else:
            out.append("no recommendation: stopped before any study")
        check = r.get("check")
        if check:
            out.append(check.get("text") or "")
        spent, full = r["spent"], r["full_protocol"]
        share = f" = {spent['total'] / full['examples']:.3g} of the full protocol's {full['examples']:,}" if full.get("examples") else ""
        out.append(f"compute: {spent['total']:,} examples (studies {spent['studies']:,}, throughput {spent['throughput']:,}, "
                   f"predictors {spent['predictors']:,}, check {spent['check']:,}){share}; "
                   f"{spent['seconds']:.0f} s of advise's runs")
        out.append(f"record: {self.path}")
        return out


def check_options(objective: str, target_ratio: float, budget_examples: Any, budget_hours: Any, trials: Any,
                  max_trials: Any, level: float) -> None:
    """One line (:class:`BatchlabError`) for the first bad option: the values allowed are named."""
    from batchlab.finite import finite_real

    if objective not in OBJECTIVES:
        raise BatchlabError(f"unknown objective {objective!r}; allowed: {', '.join(OBJECTIVES)}")
    if not finite_real(target_ratio) or not target_ratio > 1:
        raise BatchlabError(f"--target-ratio must be a finite number > 1 (B_crit's interval high / low), got {target_ratio!r}")
    if budget_examples is not None and budget_hours is not None:
        raise BatchlabError("give one budget: --budget-examples N or --budget-hours H, not both")
    if budget_examples is not None and (isinstance(budget_examples, bool) or not isinstance(budget_examples, int)
                                        or budget_examples < 1):
        raise BatchlabError(f"--budget-examples must be an integer >= 1 (training examples), got {budget_examples!r}")
    if budget_hours is not None and (not finite_real(budget_hours) or not budget_hours > 0):
        raise BatchlabError(f"--budget-hours must be a finite number > 0, got {budget_hours!r}")
    for name, value in (("--trials", trials), ("--study-trials", max_trials)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= 1024):
            raise BatchlabError(f"{name} must be an integer from 2 to 1024 (racing needs two trials), got {value!r}")
    if trials is not None and max_trials is not None and max_trials < trials:
        raise BatchlabError(f"--study-trials ({max_trials}) must be at least --trials ({trials})")
    if not finite_real(level) or not 0 < level < 1:
        raise BatchlabError(f"--level must lie in (0, 1), got {level!r}")


def advise(workload: Any, optimizer: str, *, store: str | Path, budget_examples: int | None = None,
           budget_hours: float | None = None, objective: str = "time", target_ratio: float = DEFAULT_TARGET_RATIO,
           device: str = "auto", workers: int | None = None, dask: bool = False, scheduler: str | None = None,
           config: str | Path | None = None, search_space: str | Path | None = None, trials: int | None = None,
           max_trials: int | None = None, bracket: str | None = None, check: bool = True, seed: int = 0,
           level: float = 0.9, train_examples: int | None = None, goal: float | None = None,
           memory_limit_bytes: int | None = None, progress: Callable[[str], None] | None = None,
           executor_factory: Callable[..., Any] | None = None) -> Advice:
    """Advise a batch size and metaparameters for ``workload`` with ``optimizer`` (module docstring).

    ``workload``: what ``batchlab sweep`` accepts (a name, ``module:function``, ``file.py:function``, a
    Workload). ``config``: a sweep TOML whose settings (budgets, search spaces, evaluations, goal,
    training examples, trials, racing) the studies use, and whose ``batch_sizes`` are the candidates;
    ``search_space``: a ``--search-space`` file. ``trials``: trials of a new study (default the config's,
    else :data:`DEFAULT_TRIALS`); ``max_trials``: most trials a study may be grown to (default 4x).
    ``bracket``: ``"LO:HI"`` instead of the predictors. ``executor_factory``: as for
    :func:`batchlab.sweep.runner.run_sweep` (tests run studies in-process).

    Returns the :class:`Advice`; its record is in ``<store>/advice/``.

    Raises:
        BatchlabError (one line), before anything is written: a bad option (see :func:`check_options`),
            an unknown workload or optimizer, a sweep setting the sweep refuses, a bad ``--bracket``.
    """
    from batchlab.advise.record import advice_id, read_record
    from batchlab.sweep.plan import sweep_id, sweep_settings
    from batchlab.sweep.runner import prepare_sweep
    from batchlab.workloads import get_workload

    say = progress or (lambda message: None)
    check_options(objective, target_ratio, budget_examples, budget_hours, trials, max_trials, level)
    base, candidates = _base_config(workload, optimizer, store, config, search_space, trials, seed, device, workers,
                                    dask, scheduler, train_examples, goal)
    k = base.trials
    check_options(objective, target_ratio, budget_examples, budget_hours, k, max_trials, level)  # a config's trials too
    k_max = max_trials if max_trials is not None else 4 * k  # check_options refused max_trials < k
    if bracket is not None:
        from batchlab.advise.bracket import given_bracket

        given_bracket(bracket, candidates, max(candidates))  # its form, before anything runs
    prepare_sweep(_config_at(base, [candidates[0]], k), str(store))  # every sweep check; writes nothing
    w = get_workload(base.workloads[0])
    from batchlab.train.device import device_type

    settings = {"workload": base.workloads[0], "store_workload": f"{w.name}/{optimizer}", "optimizer": optimizer,
                "objective": objective, "target_ratio": float(target_ratio),
                "budget": {"examples": budget_examples, "hours": budget_hours}, "device": device_type(base.device),
                "trials": k, "max_trials": k_max, "level": level, "seed": seed,
                "sweep": sweep_id(sweep_settings(base)), "candidates": candidates,
                "bracket_rule": "predictors" if bracket is None else f"given {bracket}"}
    identifier = advice_id(settings)
    record = read_record(store, identifier)
    from batchlab.store import Store

    Store.open_or_create(store)  # the record lives in the store, beside the studies
    state = _State(base=base, store=str(store), settings=settings, say=say, executor_factory=executor_factory,
                   record=record or _new_record(identifier, settings), level=level, k=k, k_max=k_max,
                   budget_examples=budget_examples, budget_seconds=None if budget_hours is None else 3600.0 * budget_hours)
    state.run(w, bracket, memory_limit_bytes, check)
    return Advice(record=state.record, path=state.path)


def _base_config(workload, optimizer, store, config, search_space, trials, seed, device, workers, dask, scheduler,
                 train_examples, goal):
    """The sweep settings of every study of the advice, and the candidate batch sizes (ascending)."""
    from batchlab.sweep.config import check_names, sweep_config_from_options

    options = {"trials": trials, "store": str(store), "device": device, "workers": workers,
               "executor": "dask" if dask else None, "scheduler": scheduler, "train_examples": train_examples,
               "goal": goal}
    if config is None:
        options.update(optimizers=[optimizer], batch_sizes=[1], trials=trials or DEFAULT_TRIALS, seed=seed, race=True,
                       batch_order="shared", stop_at_goal=True)
    cfg = sweep_config_from_options(workload, config=config, options=options, search_space=search_space)
    # the file's optimizers replaced after loading, so its search spaces (which enter the sweep id) stay whole:
    # advise on a sweep's own config continues that sweep's unit
    cfg = cfg.model_copy(update={"optimizers": [optimizer]})
    if not cfg.stop_at_goal:
        raise BatchlabError("advise needs stop_at_goal = true in --config (steps to the goal are what it measures)")
    # advise's own choices replace budget growth and refined search (neither enters the sweep id): a
    # study's cost stays bounded by its budget, and more trials are advise's decision
    cfg = cfg.model_copy(update={"grow_budget": False, "refine_search": None})
    check_names(cfg, "advise")
    from batchlab.workloads import get_workload

    w = get_workload(cfg.workloads[0])
    num_train = min(cfg.train_examples or int(w.split_sizes["train"]), int(w.split_sizes["train"]))
    if config is not None:
        candidates = sorted(b for b in cfg.batch_sizes if b <= num_train)
    else:
        candidates = [2**i for i in range(0, 31) if 2**i <= min(num_train, LARGEST_CANDIDATE)]
    if not candidates:
        raise BatchlabError(f"no candidate batch size fits the {num_train} training examples")
    return cfg, candidates


def _config_at(base, batch_sizes, trials):
    """``base`` at ``batch_sizes`` with ``trials`` per study (the sweep id does not change)."""
    return base.model_copy(update={"batch_sizes": sorted(int(b) for b in batch_sizes), "trials": int(trials),
                                   "refine_search": None})


def _new_record(identifier: str, settings: dict) -> dict:
    from batchlab.advise.record import FORMAT, VERSION

    return {"format": FORMAT, "version": VERSION, "advice_id": identifier, "status": "running", "settings": settings,
            "unit": None, "throughput": None, "bracket": None, "rounds": [], "spent": {}, "full_protocol": {},
            "stop": None, "recommendation": None, "check": None, "seconds": {}}


@dataclass
class _State:
    """One advice as it runs: its settings, record and spend."""

    base: Any
    store: str
    settings: dict
    say: Callable[[str], None]
    executor_factory: Any
    record: dict
    level: float
    k: int
    k_max: int
    budget_examples: int | None
    budget_seconds: float | None

    @property
    def path(self) -> Path:
        from batchlab.advise.record import record_path

        return record_path(self.store, self.record["advice_id"])

    def save(self) -> None:
        from batchlab.advise.record import write_record

        write_record(self.store, self.record)

    # -- the flow --------------------------------------------------------------------------------------

    def run(self, w, bracket_text, memory_limit_bytes, check) -> None:
        """The flow (module docstring). The recorded rounds are replayed first, in order, exactly as
        recorded (their sweeps skip what is published; no decision and no budget gate), so a resumed
        advice continues from the decision the killed one was about to take."""
        from batchlab.advise.bracket import Bracket

        recorded = list(self.record.get("rounds") or [])
        self.record["status"] = "running"
        self.save()  # a store that cannot be written fails here, before anything trains (one line)
        self.record["rounds"] = []
        self.fits = self._throughput(memory_limit_bytes)
        if self.record.get("bracket") is not None:
            self.bracket = Bracket.from_dict(self.record["bracket"])
        for entry in recorded:
            self._run_round(entry, replay=True)
        done = {r["round"] for r in self.record["rounds"]}
        reference = min(self.fits, key=lambda b: (abs(math.log(b / w.default_batch_size)), b))
        stop = None
        if 0 not in done:
            stop = self._budget_stop()
            if stop is None:
                self._run_round(self._entry(0, "reference", [reference], self.k, "the fitting candidate nearest the "
                                            f"workload's default batch size {w.default_batch_size}"))
        if stop is None and getattr(self, "bracket", None) is None:
            stop = self._budget_stop()
            if stop is None:
                self._bracket(w, bracket_text, reference)
        if stop is None:
            stop = self._rounds(span=1 not in done)
        self.record["stop"] = stop
        self._recommend(stop)
        if check and self.record["recommendation"]:
            if self._checked():
                pass  # measured before this resume
            elif self._can_start():
                self._check()
            else:
                self.record["check"] = {"skipped": True, "text": f"check: not run, the budget is spent ({self._spent_text()})"}
        self._account()
        self.record["status"] = "done"
        self.save()

    def _budget_stop(self) -> dict | None:
        """The stop when the budget is spent (nothing more may start), else ``None``."""
        if self._can_start():
            return None
        return {"reason": "budget", "text": f"the budget is spent ({self._spent_text()})"}

    def _throughput(self, memory_limit_bytes) -> list[int]:
        """The throughput probe (re-used from the record on resume); the candidates that fit."""
        from batchlab.advise.throughput import Throughput, measure_throughput

        if self.record.get("throughput") is None:
            probed, cost = [], 0
            for b in self.settings["candidates"]:  # ascending; an examples budget caps the probe at PROBE_SHARE
                if probed and self.budget_examples is not None and cost + PROBE_UPDATES * b > PROBE_SHARE * self.budget_examples:
                    break
                probed.append(b)
                cost += PROBE_UPDATES * b
            self.say(f"throughput: step times and the memory probe over {len(probed)} batch sizes")
            started = time.perf_counter()
            probe = measure_throughput(self.base.workloads[0], self.settings["optimizer"], probed,
                                       device=self.base.device, train_examples=self.base.train_examples,
                                       seed=self.settings["seed"], memory_limit_bytes=memory_limit_bytes,
                                       warmup_steps=PROBE_WARMUP, timed_steps=PROBE_UPDATES - PROBE_WARMUP)
            self.record["throughput"] = probe.to_dict()
            self.record["seconds"]["throughput"] = time.perf_counter() - started
            self.save()
        self.throughput = Throughput.from_dict(self.record["throughput"])
        largest = self.throughput.memory.largest_fitting
        if largest is None:
            raise BatchlabError(f"no candidate batch size fits in memory on {self.throughput.device} "
                                f"(the smallest, {self.settings['candidates'][0]}, does not)")
        return sorted(t.batch_size for t in self.throughput.step_times)  # timed: exactly the probed ones that fit

    def _bracket(self, w, bracket_text, reference) -> None:
        from batchlab.advise.bracket import Bracket, given_bracket, predictor_bracket

        if self.record.get("bracket") is None:
            largest = self.fits[-1]
            if bracket_text is not None:
                found = given_bracket(bracket_text, self.fits, largest)
            else:
                points = self._points()
                best = next((p for p in points.points if p["batch_size"] == reference and p["reached"]), None)
                if best is None:
                    found = Bracket(low=self.fits[0], high=largest, source="default", predictors=[],
                                    reference={"batch_size": reference}, branched_by_step=[], warmup_schedule=[],
                                    examples=0, clipped_by=None,
                                    reason=f"the reference study at B = {reference} did not reach the goal, so there is "
                                           "no tuned reference run for the predictors: the whole fitting range")
                else:
                    self.say(f"bracket: the predictors' reference run at B = {reference} (tuned: trial {best['best_trial_id']})")
                    started = time.perf_counter()
                    found = predictor_bracket(self.base.workloads[0], self.settings["optimizer"],
                                              hyperparameters=best["best_hyperparameters"], batch_size=reference,
                                              candidates=self.fits, largest_fitting=largest, device=self.base.device,
                                              seed=self.settings["seed"], train_examples=self.base.train_examples)
                    self.record["seconds"]["predictors"] = time.perf_counter() - started
            self.record["bracket"] = found.to_dict()
            self.save()
        self.bracket = Bracket.from_dict(self.record["bracket"])

    def _rounds(self, span: bool) -> dict:
        """Round 1 (when ``span``: not recorded yet) and the adaptive rounds; the stop (``{"reason", "text"}``)."""
        from batchlab.advise.rounds import next_study, spanning_batch_sizes

        if span:
            points = self._points()
            measured = {p["batch_size"] for p in points.points}
            wanted = [b for b in spanning_batch_sizes(self.bracket.low, self.bracket.high, self.fits) if b not in measured]
            admitted, left = [], self._left()
            for b in wanted:  # in order, while their bounds fit in what is left (the first whenever anything is)
                bound = self._bound(b, self.k)
                if not (left is None or (not admitted and left > 0) or bound <= left):
                    break
                admitted.append(b)
                left = None if left is None else left - bound
            self._run_round(self._entry(
                1, "span bracket", admitted, self.k,
                f"up to 4 candidates spanning the bracket [{self.bracket.low}, {self.bracket.high}]"
                + (f" ({len(wanted) - len(admitted)} left out by the budget)" if len(admitted) < len(wanted) else "")
                + ("" if wanted else ": every one measured already")))
        number = max(r["round"] for r in self.record["rounds"]) + 1
        while number <= MAX_ROUNDS + 1:
            points = self._points()
            ratio, b_crit = self._ratio(points)
            if ratio <= self.settings["target_ratio"]:
                return {"reason": "target", "text": f"B_crit's interval [{b_crit['low']:.4g}, {b_crit['high']:.4g}] is "
                                                    f"{ratio:.3g}x wide, within the target {self.settings['target_ratio']}x"}
            if not any(p["reached"] for p in points.points):
                return {"reason": "unreached", "text": "no trial reached the goal at any measured batch size (B = "
                                                       f"{', '.join(str(p['batch_size']) for p in points.points)}); "
                                                       "the answer is bounded: steps to the goal exceed each budget"}
            if not self._can_start():
                return {"reason": "budget", "text": f"the budget is spent ({self._spent_text()}); B_crit's interval is "
                                                    f"{_ratio_text(ratio)}, the target {self.settings['target_ratio']}x"}
            measured = {p["batch_size"]: p["trials_run"] for p in points.points}  # every stored trial, diverged too
            step = next_study(points.fit_inputs, measured, self.fits, trials=self.k, max_trials=self.k_max,
                              budget_steps=self._budget_steps, level=self.level,
                              resolution=float(self.base.resolution))
            if step is None:
                return {"reason": "candidates", "text": "no further study is expected to narrow B_crit's interval "
                                                        f"({_ratio_text(ratio)}, the target {self.settings['target_ratio']}x)"}
            before = points.trials
            self._run_round(self._entry(number, step.action, [step.batch_size], step.trials, step.reason,
                                        bound=step.examples_bound))
            if self._points().trials == before:  # nothing new was stored: the same decision would repeat
                return {"reason": "candidates", "text": f"round {number} added no trial ({step.reason}); no other study "
                                                        "is chosen"}
            number += 1
        return {"reason": "rounds", "text": f"the most rounds ({MAX_ROUNDS + 1}) ran"}

    def _entry(self, number: int, action: str, batch_sizes: list[int], trials: int, reason: str,
               bound: int | None = None) -> dict:
        """A round's record, written before it runs: ``examples_bound`` is the cost bound of its new
        trials (every new trial run to its whole budget)."""
        from batchlab.advise.rounds import examples_bound

        if bound is None:
            bound = sum(examples_bound(b, trials, self._budget_steps(b)) for b in batch_sizes)
        return {"round": number, "action": action, "batch_sizes": sorted(int(b) for b in batch_sizes),
                "trials": int(trials), "reason": reason, "examples_bound": int(bound)}

    def _run_round(self, entry: dict, replay: bool = False) -> None:
        """Record the round (status ``started``), run its sweep (nothing when it has no batch size),
        then record its outcome (status ``done``)."""
        from batchlab.sweep.runner import prepare_sweep, run_sweep

        entry = {k: entry[k] for k in ("round", "action", "batch_sizes", "trials", "reason", "examples_bound")}
        number = entry["round"]
        self.record["rounds"].append(dict(entry, status="started"))
        self.save()
        if entry["batch_sizes"]:
            self.say(f"round {number} ({entry['action']}{', replayed' if replay else ''}): B = "
                     f"{', '.join(map(str, entry['batch_sizes']))}, {entry['trials']} trials: {entry['reason']}")
            started = time.perf_counter()
            plan = prepare_sweep(_config_at(self.base, entry["batch_sizes"], entry["trials"]), self.store)
            run_sweep(plan, executor_factory=self.executor_factory)
            seconds = time.perf_counter() - started
            self._cached_points, self._studied = None, True
        else:
            seconds = 0.0
        points = self._points()
        ratio, b_crit = self._ratio(points)
        previous = self.record.setdefault("seconds", {}).setdefault("rounds", {})
        previous.setdefault(str(number), seconds)  # a replayed round keeps the time it first took
        if points.unit:
            self.record["unit"] = points.unit
        self.record["rounds"][-1] = dict(entry, status="done", examples_after=points.examples_spent, b_crit=b_crit,
                                         ratio=None if math.isinf(ratio) else ratio, seconds=previous[str(number)])
        self._account()
        self.save()

    def _recommend(self, stop: dict) -> None:
        from batchlab.advise.recommend import recommend

        points = self._points()
        if not any(p["reached"] for p in points.points):
            self.record["recommendation"] = None
            return
        rec = recommend(points, self.throughput, self.settings["objective"], level=self.level,
                        bracket=getattr(self, "bracket", None),
                        largest_fitting=self.fits[-1], stop=stop)
        self.record["recommendation"] = rec.to_dict()
        self.recommendation = rec

    def _checked(self) -> bool:
        """Whether the record holds a check run of the recommendation (batch size and metaparameters)."""
        rec, done = self.record["recommendation"], self.record.get("check")
        return bool(done and not done.get("skipped") and done.get("batch_size") == rec["batch_size"]
                    and done.get("hyperparameters") == rec["hyperparameters"])

    def _check(self) -> None:
        from batchlab.advise.check import check_recommendation
        from batchlab.advise.recommend import check_interval

        rec = self.record["recommendation"]
        low, high = check_interval(self.recommendation, level=self.level)
        b = int(rec["batch_size"])
        if high is not None:  # the check trial stops at its budget: a prediction beyond it is the budget
            high = min(high, float(self._budget_steps(b)))
        self.say(f"check: one more trial at B = {b} with a fresh seed")
        started = time.perf_counter()
        result = check_recommendation(self.base.workloads[0], self.settings["optimizer"], b, rec["hyperparameters"],
                                      steps=self._budget_steps(b), predicted_low=low, predicted_high=high,
                                      seed=self.settings["seed"] + CHECK_SEED_OFFSET, device=self.base.device,
                                      train_examples=self.base.train_examples, goal=self.base.goal,
                                      evaluations=self.base.evaluations, resolution=float(self.base.resolution))
        self.record["check"] = result.to_dict()
        self.record["seconds"]["check"] = time.perf_counter() - started
        self.save()

    # -- reading the unit, the budget ----------------------------------------------------------------------

    def _points(self):
        """The unit's points and fit (:func:`~batchlab.advise.recommend.unit_points`), read again only
        after a round changed the store."""
        from batchlab.advise.recommend import unit_points

        from batchlab.advise.unit_points import UnitPoints

        if getattr(self, "_cached_points", None) is None:
            if not getattr(self, "_studied", False):  # before round 0 the store may hold no trial of the sweep
                return UnitPoints(unit="", goal={}, points=[])
            self._cached_points = unit_points(self.store, workload=self.settings["store_workload"],
                                              sweep=self.settings["sweep"], device=self.settings["device"],
                                              level=self.level, seed=self.settings["seed"])
        return self._cached_points

    def _budget_steps(self, batch_size: int) -> int:
        from batchlab.sweep.config import steps_from_rule
        from batchlab.workloads import get_workload

        return steps_from_rule(self.base.budget_rule(get_workload(self.base.workloads[0])), batch_size)

    def _ratio(self, points) -> tuple[float, dict]:
        from batchlab.advise.rounds import interval_ratio

        b = points.b_crit or {"value": None, "low": None, "high": None}
        return interval_ratio(b.get("low"), b.get("high")), dict(b)

    def _account(self) -> None:
        """The record's ``spent`` and ``full_protocol`` from the store and the probes."""
        points = self._points()
        check = self.record.get("check") or {}
        spent = {"studies": int(points.examples_spent), "throughput": int(self.throughput.examples),
                 "predictors": int(self.bracket.examples) if getattr(self, "bracket", None) else 0,
                 "check": int(check.get("examples") or 0)}
        spent["total"] = sum(spent.values())
        seconds = self.record.get("seconds", {})
        spent["seconds"] = float(sum(seconds.get("rounds", {}).values()) + seconds.get("throughput", 0.0)
                                 + seconds.get("predictors", 0.0) + seconds.get("check", 0.0))
        self.record["spent"] = spent
        measured = sorted(p["batch_size"] for p in points.points)
        if measured:
            sizes = [b for b in self.settings["candidates"] if measured[0] <= b <= measured[-1]]
            self.record["full_protocol"] = {
                "examples": sum(self.k * self._budget_steps(b) * b for b in sizes), "batch_sizes": sizes,
                "trials": self.k,
                "rule": (f"every candidate from B = {measured[0]} to {measured[-1]} ({len(sizes)} batch sizes), {self.k} "
                         "trials each, every trial run to its whole step budget (no racing, no stop at the goal)")}

    def _bound(self, batch_size: int, trials: int) -> float:
        """A study's bound in the budget's unit: examples, or (an hours budget) seconds of training at the
        measured seconds per step (evaluations not included)."""
        from batchlab.advise.rounds import examples_bound

        steps = self._budget_steps(batch_size)
        if self.budget_seconds is None:
            return examples_bound(batch_size, trials, steps)
        return trials * steps * (self.throughput.seconds_per_step(batch_size) or 0.0)

    def _left(self) -> float | None:
        """Examples (or seconds) left in the budget; ``None`` without a budget."""
        self._account()
        if self.budget_examples is not None:
            return self.budget_examples - self.record["spent"]["total"]
        if self.budget_seconds is not None:
            return self.budget_seconds - self.record["spent"]["seconds"]
        return None

    def _can_start(self) -> bool:
        left = self._left()
        return left is None or left > 0

    def _spent_text(self) -> str:
        spent = self.record["spent"]
        if self.budget_examples is not None:
            return f"{spent['total']:,} of {self.budget_examples:,} examples"
        return f"{spent['seconds']:.0f} of {self.budget_seconds:.0f} s"


def _ratio_text(ratio: float) -> str:
    return "open on a side" if math.isinf(ratio) else f"{ratio:.3g}x wide"
