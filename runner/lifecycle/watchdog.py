"""The runner's own judgement while it follows a machine: when to stop following, and why (a Verdict).

Readiness is the machine's own word (an event from its startup script or its worker), never the API's READY alone:
a READY node can be silent (tensorflow/tpu#609), and slow creates have been taken for failures (marin#6087). The
deadlines are the runner's, whatever the machine does: max_runtime, boot_timeout and (opt-in) hang_timeout.
"""

from __future__ import annotations

import logging
import time
from enum import Enum

from runner.backends.base import Backend, Handle, MachineState
from runner.errors import RunnerError
from runner.plan.planner import Plan
from runner.watch.events import Event
from runner.watch.rundir import Snapshot

log = logging.getLogger(__name__)

# The runner's own hang check backs up the supervisor's (which stops the job at hang_timeout exactly): it acts
# only this much later, so that it never races the job's own, better-informed stop.
HANG_SLACK_S = 30.0


class Verdict(str, Enum):
    """Why following a machine stopped."""

    FINISHED = "finished"
    MACHINE_GONE = "machine_gone"
    SILENT = "silent"
    DEADLINE = "deadline"
    HUNG = "hung"
    DOWN = "down"


_GONE = (MachineState.GONE, MachineState.PREEMPTED, MachineState.STOPPED, MachineState.DELETING)


class Watchdog:
    """Decides, from the run directory, the clock and (rarely, the API has quotas) the backend, when following a
    machine must stop and why. Readiness is the machine's own word (an event from its startup script or its
    worker), never the API's READY alone: a READY node can be silent."""

    def __init__(self, plan: Plan, backend: Backend, handle: Handle, *, status_every_s: float) -> None:
        self.plan, self.backend, self.handle = plan, backend, handle
        self.status_every_s = status_every_s
        self.ready_at = time.time()
        self.booted = False
        self.down = False
        self.heard_at: float | None = None
        self._asked_at = float("-inf")
        self._gone = False

    def on_event(self, event: Event) -> None:
        if event.source.startswith(("bootstrap-", "worker-")) and not self.booted:
            self.booted = True
            self.heard_at = time.time()
        if event.event == "down_requested":
            self.down = True

    def machine_gone(self) -> bool:
        """Asks the backend at most every status_every_s; an API error is not an answer."""
        if time.monotonic() - self._asked_at >= self.status_every_s:
            try:
                self._gone = self.backend.status(self.handle) in _GONE
            except RunnerError as exc:
                self._gone = False
                log.warning("machine status unavailable: %s", exc)
            self._asked_at = time.monotonic()
        return self._gone

    def hung_for(self, snapshot: Snapshot) -> float | None:
        """Seconds the job's progress has stood still, by the machine's own clock, once past hang_timeout."""
        timeout = self.plan.spec.teardown.hang_timeout
        beat = snapshot.heartbeat
        if not timeout or beat is None or beat.phase == "exited" or beat.progress_at is None:
            return None
        still = beat.time - beat.progress_at
        return still if still > timeout + HANG_SLACK_S else None

    def check(self, snapshot: Snapshot) -> Verdict | None:
        if len(snapshot.exits) >= self.plan.num_workers:
            return Verdict.FINISHED
        if self.down:
            return Verdict.DOWN
        now = time.time()
        if now > self.plan.deadline:
            return Verdict.DEADLINE
        if not self.booted and now - self.ready_at > self.plan.spec.teardown.boot_timeout:
            return Verdict.SILENT
        if self.hung_for(snapshot) is not None:
            return Verdict.HUNG
        if self.machine_gone():
            return Verdict.MACHINE_GONE
        return None
