"""Processes and process groups on this machine (Linux /proc, with a kill(0) fallback elsewhere): whether one
still runs, and stopping a whole group. A job runs as a process group of its own (the supervisor's job, a local
run's supervisor, an attach's ssh), so that a stop reaches everything it started: a shell form's program is the
shell's child (/bin/sh -c does not exec it), and a SIGTERM to the shell alone never reaches it."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def process_alive(pid: int, start_ticks: int | None = None) -> bool:
    """True if `pid` runs and is the same process (same start time: pids are reused), not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return False
    return start_ticks is None or int(fields[19]) == start_ticks


def start_ticks(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies still count for killpg; look for a live member.
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def stop_group(pgid: int, grace_s: float) -> None:
    """SIGTERM the whole process group, wait up to `grace_s` for it to exit, then SIGKILL what is left."""
    stop_groups([pgid], grace_s)


def stop_groups(pgids: list[int], grace_s: float) -> None:
    """SIGTERM every one of the process groups at once, wait up to `grace_s` for all of them to exit, then SIGKILL
    what is left: one stop for all, each group with the whole grace."""
    signalled = []
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
            signalled.append(pgid)
    deadline = time.monotonic() + grace_s
    while signalled and time.monotonic() < deadline:
        signalled = [pgid for pgid in signalled if group_alive(pgid)]
        if signalled:
            time.sleep(0.1)
    for pgid in signalled:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
