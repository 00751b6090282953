"""`make test`'s `--dist loadgroup`: the tests of one xdist_group run on one worker (the
SLURM tests' promise), through tests/xdist_groups.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from helpers import ROOT, seconds

GROUPED = """
import pytest

pytestmark = pytest.mark.xdist_group({mark})


@pytest.mark.parametrize("i", range(4))
def test_grouped(i):
    pass
"""

LOOSE = """
import pytest


@pytest.mark.parametrize("i", range(4))
def test_loose(i):
    pass
"""


def test_the_tests_of_a_group_run_on_one_worker(tmp_path, request):
    assert request.config.pluginmanager.has_plugin("xdist_groups")  # this suite's conftest
    # the group spans two files, as the SLURM tests do, each mark spelt its own way
    (tmp_path / "test_a.py").write_text(GROUPED.format(mark='"cluster"'))
    (tmp_path / "test_b.py").write_text(GROUPED.format(mark='name="cluster"'))
    (tmp_path / "test_c.py").write_text(LOOSE)
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["xdist_groups"]\n')
    path = os.pathsep.join([str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])])
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadgroup", "-v"],
        cwd=tmp_path, capture_output=True, text=True, timeout=seconds(120),
        env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    ran = re.findall(r"\[(gw\d)\] .*PASSED (test_\w)\.py::test_\w+\[\d\](@\w+)?", result.stdout)
    assert len(ran) == 12, result.stdout[-3000:]
    grouped = {(worker, suffix) for worker, file, suffix in ran if file in ("test_a", "test_b")}
    assert len(grouped) == 1 and grouped.pop()[1] == "@cluster", ran
    assert all(suffix == "" for _, file, suffix in ran if file == "test_c"), ran  # no group
