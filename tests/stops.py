"""Stopping a trainer mid-epoch from a test: the job is frozen (SIGSTOP) where progress.json shows it, the stop is
sent, and the job thawed once the signal waits for it, so the signal lands mid-epoch however loaded the machine is.

progress.json trails the trainer by up to its rewrite interval (RUNNER_PROGRESS_S, 2 s by default: more than some of
these tests' epochs), so a run a test freezes writes it every PROGRESS_S (FAST_PROGRESS in $RUNNER_TIMINGS, or
contract.PROGRESS_S in a supervisor's environment), and the file is read again once the job is frozen: then it says
where the job stands, give or take that interval, which the half epoch a test asks for leaves room for."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner import contract
from tests.waiting import wait_for

PROGRESS_S = "0.1"
# $RUNNER_TIMINGS of a run whose job a test freezes: progress as above, and on several workers an agreement point
# every ~0.05 s of steps (1 s by default: an epoch of a few ms steps could have none mid-epoch, so a stop asked in
# its first half would be agreed only at its end)
FAST_PROGRESS = f"job_progress_s={PROGRESS_S},job_agree_s=0.05"


def job_pid(run_dir: Path, worker: int = 0) -> int | None:
    """The worker's job process (its job_started event), or None before it started."""
    try:
        lines = (run_dir / contract.events_key(f"worker-{worker}")).read_text().splitlines()
    except OSError:
        return None
    return next((int(e["pid"]) for e in map(json.loads, lines) if e["event"] == "job_started"), None)


def _status(path: Path, key: str) -> str:
    return next((line.split()[1] for line in path.read_text().splitlines() if line.startswith(key)), "")


def ended_unreaped(pid: int) -> bool:
    """The process has ended and its parent has not reaped it yet (a zombie)."""
    status = Path(f"/proc/{pid}/status")
    return status.exists() and _status(status, "State:") == "Z"


def sigterm_pending(pid: int) -> bool:
    """Whether SIGTERM waits for the (stopped) process: whoever stops it has sent it (to the process, or to one of
    its threads)."""
    bit = 1 << (signal.SIGTERM - 1)
    try:
        pending = [_status(Path(f"/proc/{pid}/status"), "ShdPnd:")]
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):  # a thread that ended between the listing and the read
                pending.append(_status(task / "status", "SigPnd:"))
    except OSError:  # the process is gone (killed: nothing waits for it), and the caller's wait says what it awaited
        return False
    return any(int(mask or "0", 16) & bit for mask in pending)


def all_stopped(pid: int) -> bool:
    """Every thread of the process is stopped (a SIGSTOP's group stop is complete): none can take a signal that
    comes now, which then waits, pending, where sigterm_pending sees it. A thread busy in the kernel (a checkpoint's
    write on a loaded machine) stops only once it is back."""
    states = []
    try:
        stats = list(Path(f"/proc/{pid}/task").glob("*/stat"))
    except OSError:  # the process ended between the glob's looks: not stopped, and the caller's seen() says why
        return False
    for stat in stats:
        try:
            states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):
            continue
    return bool(states) and all(state in ("T", "t") for state in states)


def first_half(progress_file: Path, after_epoch: int = 0) -> dict[str, Any] | None:
    """progress.json when it shows training in the first half of an epoch later than `after_epoch`, else None."""
    try:
        progress = json.loads(progress_file.read_text())
    except (OSError, ValueError):
        return None
    steps = progress.get("steps_per_epoch")
    in_half = steps and progress.get("epoch", 0) > after_epoch and 0 < progress.get("step", 0) <= steps // 2
    return progress if in_half and progress.get("phase", "train") == "train" else None


def freeze_mid_epoch(
    progress_file: Path,
    pid: int,
    ended: Callable[[], str | None],
    what: str,
    *,
    group: bool = False,
    after_epoch: int = 0,
    timeout: float = 300.0,
) -> dict[str, Any]:
    """Freeze the job `pid` (its process group with `group`) once progress.json shows it in the first half of an
    epoch after `after_epoch`, wait until every thread of it is stopped, then read the file again: the progress
    returned is where it stands. A job found past the half by then (the test was slow to freeze it) is thawed, and
    a later epoch waited for. `ended`: why the job can no longer be frozen mid-epoch (it ended: its output), or None
    while it runs. thaw(pid, group) lets it go on."""

    def seen() -> dict[str, Any] | None:
        if (progress := first_half(progress_file, after_epoch)) is not None:
            return progress
        if (why := ended()) is not None:
            pytest.fail(f"{what} ended before it was seen in the first half of an epoch:\n{why}")
        return None

    while True:
        wait_for(seen, f"{what} in the first half of an epoch after epoch {after_epoch}", timeout, poll_s=0.002)
        (os.killpg if group else os.kill)(pid, signal.SIGSTOP)
        wait_for(lambda: all_stopped(pid), f"every thread of {what} to stop", timeout=60, poll_s=0.002)
        if (progress := first_half(progress_file, after_epoch)) is not None:
            return progress
        thaw(pid, group)


def thaw(pid: int, group: bool = False) -> None:
    (os.killpg if group else os.kill)(pid, signal.SIGCONT)
