import re

import numpy as np
import pytest

from batchlab.errors import BatchlabError
from batchlab.nqm.problem import (
    Problem,
    from_eigenvalues,
    information_lower_bound,
    power_law,
    preset,
    spectrum_from_file,
    zhang2019_binned,
)


def test_presets_initial_loss_and_bins():
    binned = zhang2019_binned()
    assert binned.initial_loss() == pytest.approx(4.7025, abs=5e-5)
    assert binned.curvature.size == 84 and binned.dimension == 10_000
    assert preset("zhang2019").initial_loss() == pytest.approx(4.8938, abs=5e-5)
    # the rounding rule: every direction's curvature is rounded *down* onto a bin value
    values = np.geomspace(1, 1e-4, 100)
    assert set(np.round(binned.curvature, 12)) <= set(np.round(values, 12))
    assert binned.counts[0] == 1  # only h = 1 maps to the top bin


def test_power_law_and_bound():
    problem = power_law(2.0, 1.0, 50)
    assert problem.curvature[1] == pytest.approx(0.25) and problem.noise[1] == pytest.approx(0.5)
    assert information_lower_bound(zhang2019_binned(), 0.01, 4) == pytest.approx(10_000 / (2 * 0.01 * 4))


def test_unknown_preset_suggests():
    with pytest.raises(BatchlabError, match="did you mean 'zhang2019-binned'"):
        preset("zhang2019-bined")


@pytest.mark.parametrize(
    "text, message",
    [("", "empty"), ("# only a comment\n", "empty"), ("1\n-2\n", "> 0"), ("1\nabc\n", "not a number"), ("0\n", "> 0"),
     ("1 2 3\n", "expected"), ("1\n1 1\n", "mix")],
)
def test_spectrum_file_errors(tmp_path, text, message):
    path = tmp_path / "eig.txt"
    path.write_text(text)
    with pytest.raises(BatchlabError, match=message) as info:
        spectrum_from_file(path)
    assert "\n" not in str(info.value)


def test_spectrum_file_that_is_not_text_is_a_user_error(tmp_path):
    path = tmp_path / "eig.bin"
    path.write_bytes(b"\xff\xfe\x00\x01")
    with pytest.raises(BatchlabError, match="not a UTF-8 text file"):
        spectrum_from_file(path)


def test_spectrum_file_reads_one_or_two_columns(tmp_path):
    path = tmp_path / "eig.txt"
    path.write_text("1.0\n0.5  # comment\n0.25\n")
    problem = spectrum_from_file(path)
    assert problem.curvature.tolist() == [1.0, 0.5, 0.25] and problem.noise.tolist() == [1.0, 0.5, 0.25]
    path.write_text("1.0 2.0\n0.5 0.1\n")
    assert spectrum_from_file(path).noise.tolist() == [2.0, 0.1]
    with pytest.raises(BatchlabError, match="cannot read"):
        spectrum_from_file(tmp_path / "missing.txt")


def test_validation():
    with pytest.raises(BatchlabError):
        from_eigenvalues([])
    with pytest.raises(BatchlabError):
        Problem(curvature=[1.0, 0.0], noise=[1, 1], counts=[1, 1], initial_second_moment=[1, 1])
    with pytest.raises(BatchlabError):
        Problem(curvature=[1.0], noise=[-1], counts=[1], initial_second_moment=[1])
    with pytest.raises(BatchlabError):
        power_law(1.0, 1.0, 0)


def test_nqm_never_imports_torch():
    import subprocess
    import sys

    code = (
        "import sys, batchlab.nqm, batchlab.nqm.figures, batchlab.nqm.montecarlo, batchlab.nqm.schedules;"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_select_problem_chooses_one_source_and_refuses_bad_combinations(tmp_path):
    from batchlab.nqm.problem import fits_in_memory, select_problem

    assert select_problem().name == "zhang2019-binned" and select_problem("zhang2019").dimension == 10_000
    assert select_problem(power_law_exponents="1,0.5", dim=7).noise.tolist() == select_problem(
        power_law_exponents=(1.0, 0.5), dim=7).noise.tolist()
    spectrum = tmp_path / "eig.txt"
    spectrum.write_text("1\n0.5\n")
    assert select_problem(spectrum=spectrum).curvature.tolist() == [1.0, 0.5]
    for kwargs, fragment in [
        ({"power_law_exponents": "1,1", "spectrum": spectrum}, "at most one of --power-law and --spectrum"),
        ({"power_law_exponents": "1"}, "--power-law must be 'A,B'"),
        ({"power_law_exponents": "1,1"}, "--power-law needs --dim"),
        ({"dim": 5}, "--dim only applies with --power-law"),
        ({"preset_name": "zhang"}, "unknown preset 'zhang'"),
    ]:
        with pytest.raises(BatchlabError, match=re.escape(fragment)):
            select_problem(**kwargs)
    with pytest.raises(BatchlabError, match=r"\(7 eigenvalues\) needs more memory"):
        with fits_in_memory(select_problem(power_law_exponents="1,1", dim=7)):
            raise MemoryError
