"""A job rewrites its run directory while the runner reads it: `runner submit --local` and `runner status` take a
directory that is renamed and deleted under them as it is (any job's own writer: Orbax's atomic rename, a
ModelCheckpoint's rotation, TensorBoard, a user's script), and a runner that fails on its own while following does
not take the healthy job down without a word."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runner import contract
from runner.cli import app
from runner.watch.view import RunDirView
from tests.cli.test_cli import write_job
from tests.waiting import wait_for


def _following() -> bool:
    """Whether this is the follow loop's own poll (runner.watch.follow reads in a thread of this name), not the
    run's last read after it."""
    return threading.current_thread().name.startswith("follow-poll")


RUNNER = [sys.executable, "-m", "runner.cli"]
# Until the file named by its argument appears: make N.tmp/a/b/c, rename it to N, delete N-2; say every 50th round.
CHURN = """\
import os, pathlib, shutil, sys, time
directory, stop = pathlib.Path(os.environ["RUNNER_CHECKPOINT_DIR"]), pathlib.Path(sys.argv[1])
directory.mkdir(parents=True, exist_ok=True)
n = 0
while not stop.exists():
    tmp = directory / f"{n}.tmp"
    (tmp / "a" / "b" / "c").mkdir(parents=True)
    (tmp / "a" / "b" / "c" / "state").write_text(str(n))
    os.rename(tmp, directory / str(n))
    shutil.rmtree(directory / str(n - 2), ignore_errors=True)
    if n % 50 == 0:
        print(f"renamed {n}", flush=True)
    n += 1
    time.sleep(0.001)  # a polite writer on a shared machine: still hundreds of renames a second
print("stopped", flush=True)
"""


def churn_job(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "churn.py").write_text(CHURN)
    stop = tmp_path / "stop"
    job = write_job(
        tmp_path,
        f"""\
        name: churn
        image: trainer:test
        command: [{json.dumps(sys.executable)}, {json.dumps(str(tmp_path / "churn.py"))}, {json.dumps(str(stop))}]
        storage: {tmp_path / "store"}
        """,
    )
    return job, stop


def run_dir_of(store: Path) -> Path:
    return wait_for(lambda: next((store / "runs").glob("*/"), None), "the run directory")


def renames(run_dir: Path) -> int:
    """The job's rounds so far, from the last count in its log."""
    log = run_dir / contract.log_key(0)
    found = re.findall(r"^renamed (\d+)$", log.read_text() if log.exists() else "", re.M)
    return int(found[-1]) if found else -1


def test_submit_and_status_read_a_run_whose_job_renames_and_deletes_its_checkpoints(tmp_path: Path) -> None:
    job, stop = churn_job(tmp_path)
    submit = subprocess.Popen(
        [*RUNNER, "submit", str(job), "--local", "--process"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
    )
    try:
        run_dir = run_dir_of(tmp_path / "store")
        seen = wait_for(lambda: renames(run_dir) >= 100 and renames(run_dir), "the job's first 100 renames")
        for as_json in (False, True, False, True, False):
            status = subprocess.run(
                [*RUNNER, "status", run_dir.name, *(["--json"] if as_json else [])],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert status.returncode == 0, status.stdout + status.stderr
            assert "Traceback" not in status.stderr
            if as_json:
                assert json.loads(status.stdout)["state"] == "running"
            else:
                assert re.search(r"^state\s+running$", status.stdout, re.M), status.stdout
            # the job kept renaming meanwhile: the next read overlaps its writes too
            seen = wait_for(lambda: renames(run_dir) > seen + 100 and renames(run_dir), "100 more renames")  # noqa: B023
            assert submit.poll() is None, submit.communicate()[0]  # submit is still following, undisturbed
    finally:
        stop.touch()
        out, _ = submit.communicate(timeout=180)
    assert submit.returncode == 0, out
    assert "Traceback" not in out and "warning: reading the run directory failed" not in out
    assert re.search(r"^state\s+succeeded$", out, re.M), out
    assert renames(run_dir) > 600


def test_an_unexpected_read_failure_is_said_and_following_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One read that fails with what no storage raises (a fault of the runner's reading): said, read again, and
    the run followed to its end."""
    real = RunDirView.poll
    failures: list[int] = []

    def flaky(self: RunDirView, **kwargs: bool) -> object:
        if not failures and _following():
            failures.append(1)
            raise FileNotFoundError(2, "No such file or directory", "checkpoints/32")
        return real(self, **kwargs)

    monkeypatch.setattr(RunDirView, "poll", flaky)
    monkeypatch.chdir(tmp_path)
    job = write_job(
        tmp_path,
        f"""\
        name: once
        image: trainer:test
        command: [{json.dumps(sys.executable)}, "-c", "print('trained')"]
        storage: {tmp_path / "store"}
        """,
    )
    result = CliRunner().invoke(app, ["submit", str(job), "--local", "--process"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert failures == [1]
    assert (
        "warning: reading the run directory failed (FileNotFoundError: [Errno 2] No such file or directory: "
        "'checkpoints/32' (test_job_writes_while_read.py:" in result.output
    )
    assert re.search(r"^state\s+succeeded$", result.output, re.M)


def test_a_runner_that_fails_while_following_leaves_the_job_running_and_says_how_to_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = RunDirView.poll

    def broken(self: RunDirView, **kwargs: bool) -> object:
        if _following():
            raise KeyError("a reader's bug")
        return real(self, **kwargs)

    job, stop = churn_job(tmp_path)
    monkeypatch.setattr(RunDirView, "poll", broken)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["submit", str(job), "--local", "--process"], catch_exceptions=False)
    run_dir = run_dir_of(tmp_path / "store")
    run_id = run_dir.name
    assert result.exit_code == 1, result.output
    assert result.output.count('warning: reading the run directory failed (KeyError: "a reader\'s bug"') == 2
    assert (
        f'this runner failed on run {run_id} (KeyError: "a reader\'s bug" (test_job_writes_while_read.py:'
        in result.output
    )
    assert "That is the runner's fault, not the job's: the job is left running" in " ".join(result.output.split())
    hint = " ".join(result.output[result.output.index("hint:") :].split())
    assert hint.startswith(
        f"hint: follow it: `runner logs {run_id} -f`; stop it: `runner down {run_id}`; its state: `runner status "
        f"{run_id}`. RUNNER_DEBUG=1 shows the runner's traceback"
    )
    # The job was not stopped: it goes on renaming, and ends when it is done, recorded as it ended.
    seen = renames(run_dir)
    wait_for(lambda: renames(run_dir) > seen + 100, "the job renaming on after the runner ended")
    events = [json.loads(line) for line in (run_dir / contract.events_key("runner")).read_text().splitlines()]
    assert {"event": "runner_failed", "job": "left running"}.items() <= events[-1].items()
    stop.touch()
    wait_for(lambda: (run_dir / contract.exit_key(0)).exists(), "the job's exit record")
    status = CliRunner().invoke(app, ["status", run_id, "--json"], catch_exceptions=False)
    assert status.exit_code == 0, status.output
    assert json.loads(status.stdout)["state"] == "succeeded"
