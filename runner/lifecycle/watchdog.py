"""The runner's own judgement while it follows a machine: when to stop following, and why (a Verdict).

Readiness is the machine's own word (an event from its startup script or its worker), never the API's READY alone:
a READY node can be silent (tensorflow/tpu#609), and slow creates have been taken for failures (marin#6087). The
deadlines are the runner's, whatever the machine does: max_runtime, boot_timeout and hang_timeout (opt-in; on a pod
slice a default that applies once the job reports progress: runner.plan.planner.hang_limit).

On a pod slice every worker is judged on its own word: each must report (a bootstrap or worker event, or its
heartbeat) within boot_timeout and keep its heartbeat going, and the first worker whose job ends badly ends the
run, since the others cannot go on without it (a collective waits for every host). A stop is one event for the
whole job: a worker whose job ended on a stop's exit code (143, 130) before its own supervisor was told (its peers
agreed to stop: JAX's preemption sync) is not a failure while the run is being stopped (a worker's stop, a
notice, a stopped worker's exit record), and waits for the others; with no stop anywhere within the run's stop
grace, it is one.

Durations judged from what the run directory shows (a silent boot, a heartbeat that stopped changing) are measured
on the runner's own clock, one clock, never against a time a VM wrote; and on a clock that stands still while the
run directory cannot be read (runner.watch.follow.Sight): losing sight of storage is no evidence about the run.
The machine's state as the API says it is shown as it changes (REPAIRING, HIDDEN, UNKNOWN ...).
When following ends, what the machine's end means: taken back (a preemption, or a notice of one or of a
maintenance that the bootstrap passed to the job: recreated) or stopped under the run (lost).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from runner.backends.base import Backend, Handle, MachineState
from runner.errors import RunnerError
from runner.plan.planner import Plan, hang_limit
from runner.watch.events import Event
from runner.watch.follow import Sight
from runner.watch.rundir import ExitRecord, Heartbeat, Snapshot
from runner.watch.state import STOPS, RunState

log = logging.getLogger(__name__)

# The runner's own hang check backs up the supervisor's (which stops the job at hang_timeout exactly): it acts
# only this much later, so that it never races the job's own, better-informed stop.
HANG_SLACK_S = 30.0
# A worker whose heartbeat has not changed for this long (by the runner's own clock) is lost. The supervisor beats
# every 10 s, but the upload of its heartbeat can wait behind a large checkpoint's: generous by default.
STALE_HEARTBEAT_S = 300.0
# What the VM's bootstrap says when the metadata server gives notice of the machine's end (it stops the job at once).
NOTICES = {"preemption_notice": "a preemption notice came", "maintenance_notice": "a maintenance notice came"}


class Verdict(str, Enum):
    """Why following a machine stopped."""

    FINISHED = "finished"
    MACHINE_GONE = "machine_gone"
    SILENT = "silent"
    DEADLINE = "deadline"
    HUNG = "hung"
    DOWN = "down"
    WORKER_FAILED = "worker_failed"  # one worker's job ended badly while others still run
    WORKER_LOST = "worker_lost"  # one worker never reported, or its heartbeat stopped


def stopped_reason(what: str, native: str, stop_command: str | None) -> str:
    """Why a run whose machine was stopped under it is lost, in words."""
    who = f"`{stop_command}`, or a maintenance event" if stop_command else "a maintenance event"
    return (
        f"{what} was {native} before its job ended (someone stopped it: {who}); a stopped machine runs no job, so "
        "the run is lost"
    )


@dataclass(frozen=True)
class MachineEnd:
    """What the end of following a machine means, from one read of it: `taken_back` (preempted, or gone without
    every worker's exit record: not the job's doing, so the machine is recreated; `notice`: taken back on the
    bootstrap's word alone, NOTICES' event, while the API still shows the machine), or `stopped` (why the run is
    lost: the machine was stopped under it before every worker succeeded), or neither."""

    taken_back: bool = False
    stopped: str | None = None
    notice: str | None = None


def machine_end(
    backend: Backend, handle: Handle, verdict: Verdict, snapshot: Snapshot, num_workers: int, notice: str | None = None
) -> MachineEnd:
    """One read of the machine (an ephemeral one is never taken back or stopped under a run). A STOPPED machine's
    workers record `cancelled`: that is the stop's doing, not the job's end. A `notice` the bootstrap passed to the
    job (NOTICES) takes the machine back too unless every worker had succeeded: the job stopped for the machine's
    end, whatever it exited with, and goes on on a new one."""
    if backend.ephemeral:
        return MachineEnd()
    complete = len(snapshot.exits) >= num_workers
    noticed = notice if notice is not None and not (complete and all_succeeded(snapshot)) else None
    try:
        machine, native = backend.observe(handle)
    except RunnerError:
        return MachineEnd(taken_back=verdict == Verdict.MACHINE_GONE or noticed is not None, notice=noticed)
    if machine == MachineState.PREEMPTED or (
        machine == MachineState.GONE and not (complete and all(e.state != RunState.CANCELLED for e in snapshot.exits))
    ):
        return MachineEnd(taken_back=True)
    if noticed is not None:
        return MachineEnd(taken_back=True, notice=noticed)
    succeeded = complete and all_succeeded(snapshot)
    if succeeded or verdict not in (Verdict.MACHINE_GONE, Verdict.FINISHED) or native not in backend.stopped_states:
        return MachineEnd()
    return MachineEnd(stopped=stopped_reason(backend.describe_handle(handle), native, backend.stop_command))


def all_succeeded(snapshot: Snapshot) -> bool:
    return all(e.state == RunState.SUCCEEDED for e in snapshot.exits)


_GONE = (MachineState.GONE, MachineState.PREEMPTED, MachineState.STOPPED, MachineState.DELETING)


class Watchdog:
    """Decides, from the run directory, the clock and (rarely, the API has quotas) the backend, when following a
    machine must stop and why. Readiness is the machine's own word (an event from its startup script or its
    worker), never the API's READY alone: a READY node can be silent."""

    def __init__(
        self,
        plan: Plan,
        backend: Backend,
        handle: Handle,
        *,
        status_every_s: float,
        stale_s: float = STALE_HEARTBEAT_S,
        stop_grace_s: float = 30.0,
        sight: Sight | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.plan, self.backend, self.handle = plan, backend, handle
        self.status_every_s = status_every_s
        self.stale_s = stale_s
        self.stop_grace_s = stop_grace_s  # how long a peer_stop exit waits for word of a stop before it is a failure
        self.clock = sight.clock if sight is not None else time.monotonic
        self.say = say
        self.native: str | None = None  # the machine's state as the API said it last
        self.ready_at = self.clock()
        self.reported: set[int] = set()  # workers that said a word: an event, or a heartbeat
        self.down = False
        self.stopping = False  # a worker's supervisor began to stop its job, or a notice came
        self.notice: str | None = None  # NOTICES' event the bootstrap recorded, if any
        self._peer_stops: dict[int, float] = {}  # worker -> when its peer_stop exit record was first seen
        self.heard_at: float | None = None
        self.reason: str | None = None  # why a worker verdict was given, naming the worker
        self._asked_at = float("-inf")
        self._gone = False
        self._beats: dict[int, tuple[float, float]] = {}  # worker -> (its heartbeat's mark, when that was first seen)

    @property
    def booted(self) -> bool:
        return bool(self.reported)

    def on_event(self, event: Event) -> None:
        source, _, worker = event.source.rpartition("-")
        if source in ("bootstrap", "worker") and worker.isdigit():
            if not self.booted:
                self.heard_at = self.clock()
            self.reported.add(int(worker))
        if event.event == "down_requested":
            self.down = True
        if event.event == "stopping" or event.event in NOTICES:
            self.stopping = True
        if event.event in NOTICES:
            self.notice = event.event

    @staticmethod
    def beats(snapshot: Snapshot) -> dict[int, Heartbeat]:
        """Each worker's heartbeat (worker 0's run heartbeat stands in for a supervisor that writes only that)."""
        if snapshot.heartbeats:
            return snapshot.heartbeats
        return {0: snapshot.heartbeat} if snapshot.heartbeat is not None else {}

    def running(self, snapshot: Snapshot) -> bool:
        """Every worker's own heartbeat says its job runs (or ran: a worker may finish before another starts):
        the run is RUNNING."""
        beats = self.beats(snapshot)
        return self.booted and all(
            (beat := beats.get(w)) is not None and beat.phase in ("running", "exited")
            for w in range(self.plan.num_workers)
        )

    def _note_heartbeats(self, snapshot: Snapshot, now: float) -> None:
        for worker, beat in self.beats(snapshot).items():
            # A new beat: its object stored again (the listing says when, whether or not it was read again), or,
            # where the storage did not say, a new time in it.
            mark = snapshot.heartbeats_at.get(worker, beat.time)
            if self._beats.get(worker, (None,))[0] != mark:
                self._beats[worker] = (mark, now)
            self.reported.add(worker)

    def machine_gone(self) -> bool:
        """Asks the backend at most every status_every_s; an API error is not an answer."""
        if time.monotonic() - self._asked_at >= self.status_every_s:
            try:
                state, native = self.backend.observe(self.handle)
                self._gone = state in _GONE
                self._show(native)
            except RunnerError as exc:
                self._gone = False
                log.warning("machine status unavailable: %s", exc)
            self._asked_at = time.monotonic()
        return self._gone

    def _show(self, native: str | None) -> None:
        if native is None or native == self.native:
            return
        ready = self.backend.ready_state
        if self.say is not None and (self.native is not None or native != ready):
            note = self.backend.state_note(native) or ("back" if native == ready and self.native else "")
            self.say(f"{self.backend.describe_handle(self.handle)}: {native}" + (f" ({note})" if note else ""))
        self.native = native

    def gone_reason(self) -> str:
        """Why following ended without every exit record, in words: what the API last said of the machine."""
        what = self.backend.describe_handle(self.handle)
        if self.native is not None and self.native in self.backend.stopped_states:
            return stopped_reason(what, self.native, self.backend.stop_command)
        said = f" (last {self.native})" if self.native else ""
        return f"{what} went away{said} before every worker recorded how its job ended"

    def hung_for(self, snapshot: Snapshot) -> float | None:
        """Seconds the job's progress has stood still on some worker, by the machine's own clock, once past the
        run's hang limit (a pod slice's default counts only workers whose job reports progress)."""
        hang = hang_limit(self.plan)
        if hang is None:
            return None
        still = [
            beat.time - beat.progress_at
            for beat in self.beats(snapshot).values()
            if beat.phase != "exited"
            and beat.progress_at is not None
            and (beat.progress is not None or not hang.default)
        ]
        longest = max(still, default=0.0)
        return longest if longest > hang.seconds + HANG_SLACK_S else None

    def first_failure(self, snapshot: Snapshot, now: float) -> ExitRecord | None:
        """The worker whose job ended badly first (by its own clock), or None. A peer_stop exit (the stop its peers
        agreed on reached it before its supervisor) is not one while the run is being stopped, nor for stop_grace_s
        after it is first seen (`now`, on self.clock), in which word of the stop may still come."""
        stopping = self.stopping or any(e.state in STOPS and not e.peer_stop for e in snapshot.exits)
        failed = []
        for record in snapshot.exits:
            if record.state == RunState.SUCCEEDED:
                continue
            if record.peer_stop:
                seen = self._peer_stops.setdefault(record.worker, now)
                if stopping or now - seen <= self.stop_grace_s:
                    continue
                record = dataclasses.replace(record, state=RunState.FAILED)  # it stopped alone
            failed.append(record)
        return min(failed, key=lambda e: e.finished_at) if failed else None

    def _failed_first(self, snapshot: Snapshot, now: float) -> bool:
        """Whether a worker of a multi-worker run failed; its reason set when it did."""
        failed = self.first_failure(snapshot, now) if self.plan.num_workers > 1 else None
        if failed is not None:
            self.reason = f"worker {failed.worker} {failed.state} first (exit code {failed.exit_code})" + (
                f": {failed.error}" if failed.error else ""
            )
        return failed is not None

    def lost_worker(self, snapshot: Snapshot, now: float) -> str | None:
        """Why a worker that has not exited counts as lost (naming it), or None: no word within boot_timeout while
        other workers reported, or a heartbeat that stopped for stale_s. `now` is on self.clock."""
        exited = {e.worker for e in snapshot.exits}
        boot_timeout = self.plan.spec.teardown.boot_timeout
        for worker in range(self.plan.num_workers):
            if worker in exited:
                continue
            seen = self._beats.get(worker)
            if worker not in self.reported and self.booted and now - self.ready_at > boot_timeout:
                limit = f"teardown.boot_timeout ({boot_timeout}s)"
                return f"worker {worker} sent no word within {limit} of the slice being up"
            beat = self.beats(snapshot).get(worker)
            if seen is not None and beat is not None and beat.phase != "exited" and now - seen[1] > self.stale_s:
                return f"worker {worker}'s heartbeat stopped: it has not changed for {now - seen[1]:.0f}s"
        return None

    def check(self, snapshot: Snapshot) -> Verdict | None:
        now = self.clock()
        if len(snapshot.exits) >= self.plan.num_workers:
            # Every record there at once: a worker's failure and those it took down came within one poll. The
            # worker that failed first is still the run's reason, unless a stop ended some (a stop, a preemption or
            # a stopped machine records `cancelled`: the machine's end decides those).
            unstopped = all(e.state in (RunState.SUCCEEDED, RunState.FAILED) for e in snapshot.exits)
            return Verdict.WORKER_FAILED if unstopped and self._failed_first(snapshot, now) else Verdict.FINISHED
        if self.down:
            return Verdict.DOWN
        if self._failed_first(snapshot, now):
            return Verdict.WORKER_FAILED
        if time.time() > self.plan.deadline:  # the runner's own promise, on its own clock
            return Verdict.DEADLINE
        self._note_heartbeats(snapshot, now)
        if not self.booted and now - self.ready_at > self.plan.spec.teardown.boot_timeout:
            return Verdict.SILENT
        if self.hung_for(snapshot) is not None:
            return Verdict.HUNG
        if self.machine_gone():
            return Verdict.MACHINE_GONE
        if self.plan.num_workers > 1 and (lost := self.lost_worker(snapshot, now)) is not None:
            self.reason = lost
            return Verdict.WORKER_LOST
        return None
