"""The runner's own run states, and the one place that decides a run's state from what its run directory says.

A run's state is derived, never stored in one place that could go stale: the workers' exit records win; then what
the runner itself recorded as terminal (a cancel, a failed provision); then a fresh heartbeat means running; then
what the backend says of the machine. The lifecycle, `status`, `logs -f` and `list` all ask derive_state.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runner.watch.rundir import ExitRecord, Snapshot


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
STOPS = frozenset({RunState.CANCELLED, RunState.TIMED_OUT, RunState.HUNG})  # a worker stopped, by someone or a net
# How a process that a stop ended exits (128 + SIGTERM, or SIGINT), as a shell reports it; never a SIGKILL's 137.
STOP_EXIT_CODES = frozenset({128 + signal.SIGTERM, 128 + signal.SIGINT})


def worker_states(exits: Sequence[ExitRecord]) -> list[RunState]:
    """Each exit record's state, as the run counts it. A worker whose job ended on a stop its supervisor did not
    send (ExitRecord.peer_stop: on a pod slice, the stop its peers agreed on, JAX's preemption sync) is stopped with
    the others while any other worker was stopped, and failed when none was: a stop is one event for the whole job,
    and a job that stopped alone could not go on."""
    stop = max((e.state for e in exits if e.state in STOPS and not e.peer_stop), key=_SEVERITY.index, default=None)
    return [(stop or RunState.FAILED) if e.peer_stop else e.state for e in exits]


def derive_state(
    snapshot: Snapshot, num_workers: int, recorded: RunState, *, machine_alive: bool | None, heartbeat_timeout_s: float
) -> RunState:
    """The run's state from its exit records, the runner's own record and the heartbeat.

    A terminal state the runner recorded stands (LOST aside, which exit records of jobs that ended on their own may
    still overturn): the runner decides it after reading every exit record, and what workers write while their
    machine is being stopped must not change it. A run the user stopped stays cancelled; a run given up after its
    last preemption stays failed, and one whose machine was stopped under it stays lost, though their workers
    recorded `cancelled` as the VM shut down."""
    if recorded.is_terminal() and recorded != RunState.LOST:
        return recorded
    if recorded == RunState.LOST and all(e.state == RunState.CANCELLED for e in snapshot.exits):
        return recorded  # a stop's doing (SIGTERM), not how the job ended: what the runner saw says more
    states = worker_states(snapshot.exits)
    if states and len(states) >= num_workers:
        return max(states, key=_SEVERITY.index)
    if any(state != RunState.SUCCEEDED for state in states):
        return max(states, key=_SEVERITY.index)
    if recorded.is_terminal():
        return recorded
    age = snapshot.heartbeat_age_s
    beat = snapshot.heartbeat
    if beat is not None and age is not None and age <= heartbeat_timeout_s and beat.phase != "exited":
        return RunState.RUNNING
    if machine_alive:
        return RunState.STARTING if age is None else RunState.RUNNING
    if machine_alive is False:
        return RunState.LOST
    return recorded
