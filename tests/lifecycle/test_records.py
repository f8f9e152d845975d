"""The local run record: written before anything else of a run (a $RUNNER_HOME that refuses it is said as what it
is, and nothing is started), and updated under a lock, so that what `runner down` wrote survives the follower's
next write."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.watch import runs
from runner.watch.runs import RunRecord
from runner.watch.state import RunState
from tests.cli.test_cli import command_job

RUNNER = [sys.executable, "-m", "runner.cli"]


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on a read-only file system (a tmpfs mounted ro), where this machine lets the test mount one."""
    where = tmp_path / "ro"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a read-only file system here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def test_a_read_only_runner_home_is_said_as_such_and_nothing_starts(tmp_path: Path, read_only_dir: Path) -> None:
    store = tmp_path / "store"
    job = command_job(tmp_path, "print('never runs')", storage=str(store))
    env = {**os.environ, "RUNNER_HOME": str(read_only_dir / "home")}
    done = subprocess.run([*RUNNER, "submit", str(job), "--local"], capture_output=True, text=True, env=env)
    said = done.stdout + done.stderr
    assert done.returncode == 4, said
    assert "read-only file system" in said and "free some space" not in said
    assert "point $RUNNER_HOME at a writable directory" in said
    assert not store.exists()  # no run directory that no `runner list` would know, and no job


def test_what_refuses_a_record_is_named(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "r.json"
    said = {code: runs._refused(path, OSError(code, "x")).message for code in (errno.EROFS, errno.EACCES)}
    assert "read-only file system" in said[errno.EROFS] and "not writable" in said[errno.EACCES]
    full = runs._refused(path, OSError(errno.ENOSPC, "x"))
    assert "the disk is full" in full.message and "free some space" in (full.hint or "")


def test_an_update_keeps_what_another_runner_wrote_meanwhile() -> None:
    """The follower's copy is older than the file: `runner down`'s stop (down_at, cancelled) is not undone by the
    follower's next write of its own fields."""
    mine = runs.save(RunRecord(run_id="r", job="j", backend="local", run_dir="/x", created_at=1.0))
    runs.update(mine, state=RunState.CANCELLED, down_at=5.0)  # `runner down`, from another shell
    after = runs.update(mine, handle={"pid": 1}, machines=[{"pid": 1}])  # the follower, from its old copy
    assert after.down_at == 5.0 and after.handle == {"pid": 1}
    assert runs.load("r").down_at == 5.0
