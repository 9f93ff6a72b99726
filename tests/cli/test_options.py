"""batchlab.cli.options: the shared options are declared once, so every command spells and explains
them the same way; the parsers turn option text into library values."""

from __future__ import annotations

import pytest
import typer.main

from batchlab.cli import app
from batchlab.cli.options import parse_csv, parse_max_trials, parse_studies, unit_selections
from batchlab.errors import BatchlabError

SHARED = ("--store", "--metric", "--maximize", "--max-trials", "--status", "--study", "--mix-studies",
          "--tolerance", "--device", "--resolution", "--refine", "--train-examples", "--eval-budget")


def _commands(group=None, prefix=""):
    group = group or typer.main.get_command(app)
    for name, command in getattr(group, "commands", {}).items():
        if getattr(command, "commands", None):
            yield from _commands(command, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", command


def test_shared_options_have_one_declaration():
    seen: dict[str, dict[str, list[str]]] = {}
    for path, command in _commands():
        if path.startswith(("nqm", "store", "import", "export")):  # other helpers' command groups
            continue
        for param in command.params:
            for flag in param.opts:
                if flag in SHARED:
                    seen.setdefault(flag, {}).setdefault(param.help or "", []).append(path)
    for flag in ("--max-trials", "--status", "--study", "--mix-studies", "--maximize"):
        assert len(seen[flag]) == 1, (flag, seen[flag])  # one help text: one declaration
        assert len(next(iter(seen[flag].values()))) >= 8  # analyze (2) and plot (6) commands
    for flag, commands in (("--device", ["advise", "predict", "probe branched", "probe noise-scale", "probe spectrum", "study",
                                         "sweep", "train"]),
                           ("--refine", ["study", "train"]),
                           ("--eval-budget", ["study", "train"])):
        assert len(seen[flag]) == 1 and sorted(next(iter(seen[flag].values()))) == commands, seen[flag]


def test_parsers():
    assert parse_max_trials("auto") == "auto" and parse_max_trials("7") == 7 and parse_max_trials(None) is None
    with pytest.raises(BatchlabError, match="positive integer, 'all' or 'auto'"):
        parse_max_trials("0")
    assert parse_studies(["a,b", "a"]) == ("a", "b") and parse_studies(None) is None
    assert parse_csv("8, 16", "--batch-sizes", int) == [8, 16] and parse_csv(None, "--x") is None
    with pytest.raises(BatchlabError, match="--batch-sizes must be a comma-separated list of integers"):
        parse_csv("8,x", "--batch-sizes", int)
    from batchlab.analysis.units import Unit

    # metric, goal and direction given: no default is looked up in a store
    (selection,) = unit_selections(None, [Unit("w/m/sgd", "sweep s", "", ("s1", "s2"))], "val/error", 0.1, False,
                                   max_trials="5")
    assert selection.max_trials == 5 and selection.studies == ("s1", "s2") and selection.workload == "w/m/sgd"
    assert selection.statuses == ("COMPLETE", "STOPPED_AT_GOAL", "RACED")


def test_default_statuses_are_the_schemas_own():
    # options.py keeps a literal (importing the store schema at start-up would load pyarrow)
    from batchlab.cli.options import DEFAULT_STATUSES
    from batchlab.store.schema import DEFAULT_ANALYSIS_STATUSES

    assert list(DEFAULT_STATUSES) == list(DEFAULT_ANALYSIS_STATUSES)
