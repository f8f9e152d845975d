"""The runner's own run states, and how a run's state is read back from its run directory.

A run's state is derived, never stored in one place that could go stale: the workers' exit records win; then what
the runner itself recorded as terminal (a cancel, a failed provision); then a fresh heartbeat means running.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from runner import contract
from runner.storage import Storage


class RunState(str, Enum):
    PENDING = "pending"  # submitted; nothing created yet
    PROVISIONING = "provisioning"  # the machine is being created
    STARTING = "starting"  # the machine is up; the container is starting
    RUNNING = "running"  # the job is alive (fresh heartbeat)
    SUCCEEDED = "succeeded"  # every worker exited 0
    FAILED = "failed"  # a worker exited non-zero, or the machine could not be created
    CANCELLED = "cancelled"  # stopped by the user (Ctrl-C, SIGTERM, runner down)
    TIMED_OUT = "timed_out"  # stopped because max_runtime passed
    LOST = "lost"  # no exit record and no heartbeat: the machine vanished or the job was killed hard

    def is_terminal(self) -> bool:
        return self in _TERMINAL

    def __str__(self) -> str:
        return self.value


_TERMINAL = {RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED, RunState.TIMED_OUT, RunState.LOST}
# When workers disagree, the worst one names the run.
_SEVERITY = [RunState.SUCCEEDED, RunState.TIMED_OUT, RunState.CANCELLED, RunState.FAILED]


@dataclass(frozen=True)
class WorkerExit:
    worker: int
    state: RunState
    exit_code: int
    finished_at: float
    error: str | None = None
    tail: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> WorkerExit:
        return cls(
            worker=int(raw["worker"]),
            state=RunState(raw["state"]),
            exit_code=int(raw["exit_code"]),
            finished_at=float(raw["finished_at"]),
            error=raw.get("error"),
            tail=list(raw.get("tail") or []),
        )


@dataclass(frozen=True)
class Snapshot:
    """What the run directory says right now."""

    exits: list[WorkerExit]
    heartbeat: dict[str, Any] | None
    metrics: list[dict[str, Any]]
    summary: dict[str, Any] | None

    @property
    def heartbeat_age_s(self) -> float | None:
        if not self.heartbeat:
            return None
        return max(0.0, time.time() - float(self.heartbeat.get("time", 0)))


def _json(storage: Storage, key: str) -> Any:
    data = storage.read_bytes(key)
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def read_snapshot(run_dir: Storage, *, with_metrics: bool = True) -> Snapshot:
    exits = []
    for info in run_dir.list(contract.EXIT_DIR + "/"):
        raw = _json(run_dir, info.key)
        try:
            exits.append(WorkerExit.from_json(raw))
        except (KeyError, TypeError, ValueError):
            continue
    metrics: list[dict[str, Any]] = []
    if with_metrics:
        for line in (run_dir.read_bytes(contract.METRICS) or b"").splitlines():
            try:
                metrics.append(json.loads(line))
            except ValueError:
                continue
    return Snapshot(
        sorted(exits, key=lambda e: e.worker),
        _json(run_dir, contract.HEARTBEAT),
        metrics,
        _json(run_dir, contract.SUMMARY),
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
