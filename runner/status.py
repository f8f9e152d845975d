"""The runner's own run states, and how a run's state is read back from its run directory.

A run's state is derived, never stored in one place that could go stale: the workers' exit records win; then what
the runner itself recorded as terminal (a cancel, a failed provision); then a fresh heartbeat means running.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeVar

from runner import contract
from runner.storage import Storage

T = TypeVar("T")


class RunState(str, Enum):
    PENDING = "pending"  # submitted; nothing created yet
    PROVISIONING = "provisioning"  # the machine is being created
    STARTING = "starting"  # the machine is up; the container is starting
    RUNNING = "running"  # the job is alive (fresh heartbeat)
    SUCCEEDED = "succeeded"  # every worker exited 0
    FAILED = "failed"  # a worker exited non-zero, or the machine could not be created
    CANCELLED = "cancelled"  # stopped by the user (Ctrl-C, SIGTERM, runner down)
    TIMED_OUT = "timed_out"  # stopped because max_runtime passed
    HUNG = "hung"  # stopped because its progress did not advance for teardown.hang_timeout
    LOST = "lost"  # no exit record and no heartbeat: the machine vanished or the job was killed hard

    def is_terminal(self) -> bool:
        return self in _TERMINAL

    def __str__(self) -> str:
        return self.value


_TERMINAL = {
    RunState.SUCCEEDED,
    RunState.FAILED,
    RunState.CANCELLED,
    RunState.TIMED_OUT,
    RunState.HUNG,
    RunState.LOST,
}
# When workers disagree, the worst one names the run.
_SEVERITY = [RunState.SUCCEEDED, RunState.TIMED_OUT, RunState.CANCELLED, RunState.HUNG, RunState.FAILED]


@dataclass(frozen=True)
class WorkerExit:
    worker: int
    state: RunState
    exit_code: int
    finished_at: float
    error: str | None = None
    tail: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, raw: Any) -> WorkerExit:
        """Raises KeyError, TypeError or ValueError (with what is wrong) for anything but a worker's exit record."""
        if not isinstance(raw, dict):
            raise TypeError(f"a JSON {json_kind(raw)}, not an object")
        tail = raw.get("tail") or []
        return cls(
            worker=int(raw["worker"]),
            state=RunState(raw["state"]),
            exit_code=int(raw["exit_code"]),
            finished_at=float(raw["finished_at"]),
            error=None if raw.get("error") is None else str(raw["error"]),
            tail=[str(line) for line in tail] if isinstance(tail, list) else [str(tail)],
        )


@dataclass(frozen=True)
class Snapshot:
    """What the run directory says right now. Files that could not be understood are left out of the fields and
    named in `problems`, one line each, so that one corrupt file costs a warning, never the whole status."""

    exits: list[WorkerExit]
    heartbeat: dict[str, Any] | None
    metrics: list[dict[str, Any]]
    summary: dict[str, Any] | None
    problems: list[str] = field(default_factory=list)

    @property
    def heartbeat_age_s(self) -> float | None:
        if not self.heartbeat:
            return None
        return max(0.0, time.time() - float(self.heartbeat.get("time", 0)))


def json_kind(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words (for messages about a file that holds the wrong one)."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def where(storage: Storage, key: str) -> str:
    """A run-directory object as a user can find it: the full path or gs:// URL."""
    return f"{storage.url.rstrip('/')}/{key}"


def _loads(data: bytes) -> Any:
    """json.loads; a ValueError (with the reason) for anything that is not JSON, including nesting too deep to parse."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _json_object(storage: Storage, key: str, problems: list[str]) -> dict[str, Any] | None:
    """The JSON object stored at `key`; None when it is missing, or corrupt (then named in `problems`)."""
    data = storage.read_bytes(key)
    if data is None:
        return None
    try:
        value = _loads(data)
    except ValueError as exc:
        problems.append(f"{where(storage, key)} is corrupt: not JSON ({exc})")
        return None
    if not isinstance(value, dict):
        problems.append(f"{where(storage, key)} is corrupt: a JSON {json_kind(value)}, not an object")
        return None
    return value


def parse_jsonl(data: bytes, name: str, problems: list[str] | None, convert: Callable[[dict[str, Any]], T]) -> list[T]:
    """The lines of a JSON-lines file that are JSON objects `convert` accepts (it raises KeyError, TypeError or
    ValueError for those it does not).

    A last line without its newline that starts like an object is a write cut short (the writer died mid-line,
    or is writing it now) and is dropped silently. Other bad lines are counted in `problems`, and a file with no
    good line at all is reported as corrupt, naming `name`."""
    lines = data.split(b"\n")
    last = lines.pop().strip()  # b"" when the file ends with a newline, as a complete file does
    out: list[T] = []
    bad: list[int] = []
    for number, line in enumerate([*lines, last], start=1):
        if not line.strip():
            continue
        try:
            raw = _loads(line)
            if not isinstance(raw, dict):
                raise TypeError("not an object")
            out.append(convert(raw))
        except (KeyError, TypeError, ValueError, OverflowError):
            torn = number == len(lines) + 1 and line.startswith(b"{")
            if not torn:
                bad.append(number)
    if problems is not None and bad:
        if out:
            problems.append(f"{name}: skipped {len(bad)} corrupt line(s), the first is line {bad[0]}")
        else:
            problems.append(f"{name} is corrupt: not one line is a valid JSON record")
    return out


def _heartbeat(storage: Storage, problems: list[str]) -> dict[str, Any] | None:
    beat = _json_object(storage, contract.HEARTBEAT, problems)
    if beat is None:
        return None
    stamp = beat.get("time", 0)
    try:
        ok = not isinstance(stamp, bool) and math.isfinite(float(stamp))
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        problems.append(f"{where(storage, contract.HEARTBEAT)} is corrupt: its time is {stamp!r}, not a number")
        return None
    return beat


def read_snapshot(run_dir: Storage, *, with_metrics: bool = True) -> Snapshot:
    """Everything the run directory says now. Never fails on what a file holds: a corrupt file is left out and
    named in `problems` (a storage that cannot be read at all still raises StorageError)."""
    problems: list[str] = []
    exits = []
    for info in run_dir.list(contract.EXIT_DIR + "/"):
        raw = _json_object(run_dir, info.key, problems)
        if raw is None:
            continue
        try:
            exits.append(WorkerExit.from_json(raw))
        except KeyError as exc:
            problems.append(f"{where(run_dir, info.key)} is corrupt: {exc} is missing")
        except (TypeError, ValueError, OverflowError) as exc:
            problems.append(f"{where(run_dir, info.key)} is corrupt: {exc}")
    metrics: list[dict[str, Any]] = []
    if with_metrics:
        data = run_dir.read_bytes(contract.METRICS) or b""
        metrics = parse_jsonl(data, where(run_dir, contract.METRICS), problems, lambda raw: raw)
    return Snapshot(
        sorted(exits, key=lambda e: e.worker),
        _heartbeat(run_dir, problems),
        metrics,
        _json_object(run_dir, contract.SUMMARY, problems),
        problems,
    )


def derive_state(
    snapshot: Snapshot, num_workers: int, recorded: RunState, *, machine_alive: bool | None, heartbeat_timeout_s: float
) -> RunState:
    """The run's state from its exit records, the runner's own record and the heartbeat.

    A terminal state the runner recorded stands (LOST aside, which exit records may still overturn): the runner
    decides it after reading every exit record, and what workers write while their machine is being stopped must
    not change it. A run the user stopped stays cancelled; a run given up after its last preemption stays failed,
    though its workers recorded `cancelled` as the VM shut down."""
    if recorded.is_terminal() and recorded != RunState.LOST:
        return recorded
    if snapshot.exits and len(snapshot.exits) >= num_workers:
        return max((e.state for e in snapshot.exits), key=_SEVERITY.index)
    if snapshot.exits and any(e.state != RunState.SUCCEEDED for e in snapshot.exits):
        return max((e.state for e in snapshot.exits), key=_SEVERITY.index)
    if recorded.is_terminal():
        return recorded
    age = snapshot.heartbeat_age_s
    if age is not None and age <= heartbeat_timeout_s and snapshot.heartbeat.get("phase") != "exited":  # type: ignore[union-attr]
        return RunState.RUNNING
    if machine_alive:
        return RunState.STARTING if age is None else RunState.RUNNING
    if machine_alive is False:
        return RunState.LOST
    return recorded
