"""`make test` keeps the tests of one xdist_group on one worker (--dist loadgroup): the session's Kubernetes
rehearsal and the container images are made once, by the worker that runs their group. A pytest and pytest-xdist
that cannot do that spread the group over every worker without a word (pytest 9.2 with pytest-xdist 3.8), each
worker then starting its own API server: this holds it on the versions installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

GROUPED = """\
import os
import pytest

pytestmark = pytest.mark.xdist_group("together")


@pytest.mark.parametrize("i", range(6))
def test_one_of_a_group(i):
    with open(os.environ["SEEN"], "a") as seen:
        seen.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")


@pytest.mark.parametrize("i", range(6))
def test_apart(i):
    pass
"""


def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    seen = tmp_path / "seen.txt"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup", "-p", "no:cacheprovider", "-q"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "SEEN": str(seen)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    workers = seen.read_text().split()
    assert len(workers) == 6 and len(set(workers)) == 1, workers
