"""One run, start to end, as explicit phases: provision -> watch -> (replace and again) -> teardown.

    submitted -> provisioning (handle recorded BEFORE the create request) -> starting (machine up)
              -> running (the job's own heartbeat) -> a verdict:
                   finished      every worker wrote its exit record: succeeded / failed (retries.failures)
                   machine gone  preempted or vanished: recreate (retries.preemptions), the job resumes
                   silent        up, but no word from its startup script within teardown.boot_timeout:
                                 recreate once, then fail with the reason
                   deadline      max_runtime passed: timed_out, whatever the machine does
                   hung          no progress for teardown.hang_timeout (a pod slice: a default): hung
                   down          `runner down` from another shell: cancelled
                   worker        on a pod slice, one worker's job ended badly, never reported, or its
                                 heartbeat stopped: the run ends (failed, naming the worker), the slice goes
              -> teardown (per policy) -> finished

The run record (local, and run.json in the run directory) is saved at every transition, so `runner status`,
`down` and `gc` know what exists at any moment, including while a node is being created. Teardown is in a
`finally`, and SIGINT/SIGTERM are turned into an exception during the run, so every way out of `submit` passes
through it. Attached machines are never deleted.

Deleting needs nothing but the API: teardown sends the delete from the handle it holds, and only then records it
in the run directory. Once the machine exists, the run directory is where the run is watched, never what keeps it
alive: an event that cannot be written waits for the next write, a run directory that cannot be read is "unknown"
(runner.watch.follow.Sight), and only a bucket that no longer exists ends the run (nothing it writes can land).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runner import contract
from runner.backends.base import Backend, Handle, MachineState
from runner.errors import (
    BackendError,
    BucketMissing,
    Preempted,
    RunBusy,
    RunnerError,
    SpecError,
    StorageError,
    UsageError,
    Vanished,
)
from runner.interrupts import Interrupted, hurry, signals_raise
from runner.launch.datacache import share_data
from runner.lifecycle import machines
from runner.lifecycle.decision import STOPPED_BY_DOWN, Deciding, Retry
from runner.lifecycle.ending import Ending
from runner.lifecycle.failure import runner_failed
from runner.lifecycle.heartbeat import RunnerHeartbeat
from runner.lifecycle.lease import Lease
from runner.lifecycle.records import continue_record, start_record
from runner.lifecycle.resume import resume_note
from runner.lifecycle.watchdog import Verdict, Watchdog, all_succeeded
from runner.plan.planner import Plan
from runner.storage import open_storage
from runner.timings import Timings
from runner.watch import runs
from runner.watch.events import Event, EventLog, read_events
from runner.watch.follow import Sight, fault, follow, say_event, show_new, tail_for
from runner.watch.rundir import Snapshot, read_snapshot
from runner.watch.runs import RunRecord
from runner.watch.state import RunState, derive_state
from runner.watch.view import RunDirView

_IN_RUN_INFO = ("handle", "machines")  # record fields run.json carries: rewritten when they change


@dataclass(frozen=True)
class Outcome:
    record: RunRecord
    state: RunState
    snapshot: Snapshot | None
    detached: bool = False


class _HandedOver(Exception):
    """Another runner took the run over (this one's lease was taken: it was judged dead): it acts on it now."""


class Run(Deciding, Ending):
    """The phases of one `submit`; `execute` drives them. Attributes are the run's state as it goes."""

    def __init__(
        self,
        plan: Plan,
        backend: Backend,
        *,
        say: Callable[[str], None],
        on_output: Callable[[bytes], None],
        timings: Timings | None = None,
        grace_s: float = 30.0,
        previous: RunRecord | None = None,
        overrides: list[str] | None = None,
        lease: Lease | None = None,
    ) -> None:
        self.plan, self.backend, self.say, self.on_output = plan, backend, say, on_output
        timings = timings or Timings()
        self.poll_s = timings.follow_local_s if plan.storage_is_local else timings.follow_gcs_s
        self.stale_s = timings.worker_stale_s
        self.grace_s = grace_s
        self.status_every_s = 0.0 if backend.ephemeral else timings.machine_status_every_s
        self.storage = open_storage(plan.run_dir, patience_s=timings.storage_patience_s)
        # One owner at a time (runner.lifecycle.lease): `runner resume` takes the lease before it reads the run's
        # state; a new run takes it right after its local record is written, before its run directory is.
        self.lease = lease

        def claim() -> None:
            self.lease = Lease.take(self.storage, plan.run_id, command="submit", timings=timings, say=say)

        try:
            if previous is None:
                self.record = start_record(plan, self.storage, claim if lease is None else lambda: None)
            else:  # `runner resume`: a new attempt of a run that ended short (runner.lifecycle.resume)
                if self.lease is None:
                    claim()
                self.record = continue_record(plan, self.storage, previous, overrides or [])
        except BaseException:
            if self.lease is not None and lease is None:
                self.lease.release()
            raise
        self.sight = Sight(say, self.poll_s)
        self.storage_trouble: StorageError | None = None  # the last failed write to the run directory (said once)
        self.events = EventLog(self.storage, "runner", on_error=self._storage_failed)
        self.tail = tail_for(self.storage, plan.num_workers)  # every worker's log, prefixed, on a pod slice
        # The run directory as read so far: each poll reads only what changed (runner.watch.view).
        self.view = RunDirView(self.storage, tail=self.tail, events=True, beats_every_s=timings.heartbeat_read_every_s)
        self.seen: set[tuple[float, str, str]] = set()
        if previous is not None:  # what the earlier attempts wrote was shown then
            self.tail.skip_existing()
            self.seen = {(e.time, e.source, e.event) for e in read_events(self.storage)}
        self.handle: Handle | None = None
        self.state = RunState.PENDING
        self.reason: str | None = None
        self.snapshot: Snapshot | None = None
        self.since: float | None = None  # the storage's time when this attempt's machine was asked for
        self.preemptions = self.failures = self.silent_boots = 0
        self.safety_stop = False  # timed out, hung or silent: deleted even under teardown.policy on_success
        self.watchdog: Watchdog | None = None  # the current attempt's

    # -- record ---------------------------------------------------------------------------------------------------

    def _save(self, *, required: bool = False, **changes: Any) -> None:
        """The local record and, when the handle changes, run.json: both always say what may exist. `required`:
        before a create request, where a run.json that cannot be written stops the run before anything exists;
        once something does, the local record is what deleting needs, and run.json is written when it can be."""
        handle_changed = any(changes.get(k, getattr(self.record, k)) != getattr(self.record, k) for k in _IN_RUN_INFO)
        self.record = runs.update(self.record, **changes)  # what `runner down` wrote meanwhile stays
        if handle_changed:
            try:
                self.storage.write_bytes(contract.RUN_INFO, runs.run_info(self.record))
            except StorageError as exc:
                if required:
                    raise
                self._storage_failed(exc)

    def _storage_failed(self, exc: StorageError) -> None:
        """A write to the run directory failed: said once, and the run goes on (a missing bucket ends it, at the
        next read: runner.watch.follow)."""
        if self.storage_trouble is None:
            self.say(f"warning: {exc.message}; the run goes on, and this is written when the run directory can be")
        self.storage_trouble = exc

    def _on_handle(self, handle: Handle) -> None:
        """Called by the backend before it sends a create request: recorded first (with every machine the run asked
        for before it, until each is confirmed gone), then created."""
        self.handle = handle
        data = handle.to_dict()
        mine = machines.added(self.record.machines, data)
        self._save(state=RunState.PROVISIONING, handle=data, machines=mine, required=True)
        self.events.emit("provisioning", handle=data)

    def _storage_now(self) -> float | None:
        """The storage's own time now (runner-heartbeat written, and its `updated` read), for `since`: whatever a
        machine asked for after it writes is newer, whatever the machine's clock says. None when it cannot say."""
        try:
            RunnerHeartbeat.write(self.storage)
            key = contract.RUNNER_HEARTBEAT
            return next((info.updated for info in self.storage.list(key) if info.key == key), None)
        except StorageError:
            return None

    # -- phases ---------------------------------------------------------------------------------------------------

    def provision(self) -> Handle:
        retries = self.plan.spec.retries
        while True:
            # What the run directory holds from before this request is an older machine's (read_snapshot's since).
            self.since = self._storage_now() or self.since
            try:
                handle = self._provision()
            except Preempted as exc:  # taken back while booting; the backend already deleted it
                self.handle = None
                if self.preemptions >= retries.preemptions:
                    raise
                self.preemptions += 1
                self.events.emit("preempted", attempt=self.preemptions, retry=True, at="boot")
                self.say(f"{exc}: creating it again ({self.preemptions}/{retries.preemptions})")
                continue
            self.handle = handle
            self._save(state=RunState.STARTING, handle=handle.to_dict())
            self.events.emit(
                "provisioned",
                handle=handle.to_dict(),
                ready_at=self.backend.ready_at(handle),
                machine=self.backend.describe_handle(handle),
                attached=self.plan.attach,
            )
            return handle

    def _provision(self) -> Handle:
        """The backend's provision. A machine deleted while it was being created (Vanished) ends the wait at once:
        a job short enough to have ended (and its VM deleted its machine) goes on to be read; otherwise the error,
        which the run's end tells apart from a stop by `runner down` (its record says so)."""
        try:
            return self.backend.provision(self.plan, self._on_handle)
        except Vanished as exc:
            if self.handle is None or self._down_elsewhere():
                raise
            try:
                ended = read_snapshot(self.storage, with_metrics=False, since=self.since)
            except StorageError:
                raise exc from None
            if len(ended.exits) < self.plan.num_workers:
                raise
            return self.handle

    def watch(self, handle: Handle) -> tuple[Verdict, Snapshot]:
        dog = Watchdog(
            self.plan,
            self.backend,
            handle,
            status_every_s=self.status_every_s,
            stale_s=self.stale_s,
            stop_grace_s=self.grace_s,
            sight=self.sight,
            say=self.say,
        )
        self.watchdog = dog
        verdict: list[Verdict] = []

        def on_event(event: Event) -> None:
            dog.on_event(event)
            say_event(event, self.say)

        def stop(snapshot: Snapshot) -> bool:
            if self.lease is not None and self.lease.lost.is_set():
                raise _HandedOver
            if self.record.state == RunState.STARTING and dog.running(snapshot):
                self._save(state=RunState.RUNNING)  # every worker's own heartbeat: now it runs
            found = dog.check(snapshot)
            if found is not None:
                verdict.append(found)
            return found is not None

        snapshot = self._follow(on_event, stop)
        if not verdict:  # follow's own end: every exit record is there (finished, or a worker failed first)
            verdict.append(dog.check(snapshot) or Verdict.FINISHED)
            if not all_succeeded(snapshot):
                self._read_listed_events(on_event)
        self.events.hold()  # from here to the delete, the API alone: what is said goes to storage after it
        if verdict[0] == Verdict.MACHINE_GONE and self._nothing_to_delete(handle):
            # A VM that finished writes its exit record, then deletes itself: read again what it left.
            snapshot = self._read_again(snapshot)
        if verdict[0] == Verdict.MACHINE_GONE:
            if len(snapshot.exits) >= self.plan.num_workers:
                verdict[0] = Verdict.FINISHED
            elif not self.backend.ephemeral:
                self.reason = dog.gone_reason()
        if verdict[0] == Verdict.SILENT:
            self.reason = (
                f"the machine was up for {self.plan.spec.teardown.boot_timeout}s without a word from its startup "
                "script (teardown.boot_timeout)"
            )
        if verdict[0] in (Verdict.WORKER_FAILED, Verdict.WORKER_LOST):
            self.reason = dog.reason
        return verdict[0], snapshot

    def _nothing_to_delete(self, handle: Handle) -> bool:
        """The machine is gone or going (GONE, DELETING): nothing bills any more, so the run directory may be read
        before anything else is done. A PREEMPTED or STOPPED one is deleted first."""
        try:
            return self.backend.status(handle) in (MachineState.GONE, MachineState.DELETING)
        except RunnerError:
            return False

    def _read_again(self, snapshot: Snapshot) -> Snapshot:
        """The run directory once more: the machine is gone, and what it left decides the run's state. While it
        cannot be read that is unknown, so this waits (saying so), up to the run's deadline: a job that finished
        must never be taken for one that was preempted, and run again."""
        self.view.since = self.since
        while True:
            try:
                read = self.view.poll()
                self.sight.back()
                return read
            except BucketMissing:
                raise
            except StorageError as exc:
                wait = self.sight.lost(exc)
                if time.time() + wait > self.plan.deadline:
                    return snapshot
                time.sleep(wait)

    def _failed(self, exc: Exception, left_running: bool) -> RunnerError:
        """A fault of this runner's own (runner.lifecycle.failure): said, with the job left running or stopped."""
        what = fault(exc)
        self.events.emit("runner_failed", error=what, job="left running" if left_running else "stopped")
        if not left_running:
            self.events.hold()
            self.reason = f"the runner failed: {what}"
        return runner_failed(self.plan.run_id, what, left_running=left_running)

    def _let_the_chief_save(self) -> None:
        """One slice of a multislice taken back: its hosts got the preemption notice, and through the workers'
        agreement (runner.train.agreement) every worker stops at one step, where the chief (worker 0) saves. Cloud
        TPU suspends the queued resource and deletes the other slices itself, each VM with its shutdown grace; the
        runner's own forced delete waits until the chief's exit record is in (its checkpoint was uploaded before
        it), or grace_s, so as not to cut that save short and lose the steps since the last one."""

        def chief_exited(snapshot: Snapshot) -> bool:
            return any(e.worker == 0 for e in snapshot.exits)

        self.say(f"waiting up to {self.grace_s:.0f}s for the workers to stop at one step and worker 0 to save")
        deadline = time.monotonic() + self.grace_s
        last = self._follow(
            lambda event: say_event(event, self.say), lambda snap: chief_exited(snap) or time.monotonic() > deadline
        )
        if chief_exited(last):
            self.say("worker 0 has stopped")
        else:
            self.say(f"worker 0 did not stop within {self.grace_s:.0f}s: the run resumes from its newest checkpoint")

    def _read_listed_events(self, on_event: Callable[[Event], None]) -> None:
        """The events the end's poll listed, read before a stopped job's end is judged: what the stop means can rest
        on one (the bootstrap's notice, uploaded before it stopped the job) that the streams' reader, behind the
        poll on a loaded machine, has not read yet. A successful end needs none, and is judged at once."""
        try:
            self.view.read_streams()
        except StorageError:
            return  # judged on what was read; the end's own read (settle) says what the rest was
        show_new(self.view, self.seen, on_event, self.on_output)

    def _follow(self, on_event: Callable[[Event], None], stop: Callable[[Snapshot], bool]) -> Snapshot:
        """Every worker's log and the run's events, shown as they come, until `stop` or every exit record."""
        return follow(
            self.storage,
            self.on_output,
            num_workers=self.plan.num_workers,
            interval_s=self.poll_s,
            tail=self.tail,
            seen_events=self.seen,
            on_event=on_event,
            stop=stop,
            since=self.since,
            sight=self.sight,
            judge_blind=True,  # the runner's deadlines and the API's word on the machine do not wait for storage
            view=self.view,
            last_read=False,  # what the end's poll did not read is read after the verdict's delete (settle)
        )

    def settle(self) -> None:
        """The final state: a state decided above stands; one still open is settled by the workers' records. A run
        directory that cannot be read leaves it open: `lost`, saying why (exit records read later overturn it)."""
        unreadable: StorageError | None = None
        try:
            self.view.since = self.since
            final = self.view.poll(metrics=True, summary=True)
            self.view.read_streams(flush=True)  # what the job wrote and said as it ended, or while it was stopped
            # What following did not show: the end's output and events, after the verdict.
            show_new(self.view, self.seen, lambda event: say_event(event, self.say), self.on_output)
        except StorageError as exc:
            unreadable, final = exc, self.snapshot or Snapshot([], None, [], None)
        if final.exits:
            self.state = derive_state(
                final, self.plan.num_workers, self.state, machine_alive=False, heartbeat_timeout_s=0
            )
        if not self.state.is_terminal():
            self.state = RunState.LOST if not final.exits else self.state
            if unreadable is not None:
                self.reason = f"the run directory could not be read at the end: {unreadable.message}"
        self.snapshot = final
        self._save(state=self.state, finished_at=time.time(), reason=self.reason)
        self.events.emit("finished", state=str(self.state), reason=self.reason)
        try:
            self.events.flush()  # what waited for storage, once more
        except StorageError as exc:
            self.say(f"warning: some of this run's events are not in its run directory: {exc.message}")

    # -- the whole run --------------------------------------------------------------------------------------------

    def execute(self, detach: bool) -> Outcome:
        hurry.clear()
        self.events.emit("submitted", backend=self.plan.backend, spec=self.plan.spec_path)
        share_data(self.plan, self.say)
        if self.record.attempts:
            before = self.record.attempts[-1]
            self.events.emit(
                "resumed",
                attempt=len(self.record.attempts) + 1,
                after=str(before.state),
                overrides=self.record.overrides,
            )
        left_running = False
        try:
            with signals_raise(), RunnerHeartbeat(self.storage):
                following: Handle | None = None  # the next attempt a platform restarted by itself
                while True:
                    handle = following or self.provision()
                    if detach:
                        left_running, self.state = True, RunState.STARTING
                        return Outcome(self.record, self.state, None, detached=True)
                    self.say("following the run; Ctrl-C stops it and tears everything down")
                    try:
                        verdict, self.snapshot = self.watch(handle)
                    except Exception as exc:  # a fault of this runner's own, not the job's: the job is left as it is
                        left_running = not isinstance(exc, RunnerError)
                        raise
                    try:
                        self.state = self.decide(verdict, self.snapshot, handle)
                    except Retry as retry:
                        following = self.replace(handle)
                        if following is not None:
                            # What the run directory holds from before now is the ended attempt's.
                            self.since = self._storage_now() or self.since
                        if retry.resumes:
                            # Read once the old machine is gone: a preempted job saves in its notice's grace period,
                            # and its supervisor uploads that checkpoint as it ends.
                            self.say(resume_note(self.storage))
                        continue
                    break
        except Interrupted as exc:
            self.events.hold()  # the delete first: Ctrl-C with storage out of reach must not wait on it
            self.state = RunState.CANCELLED
            self.say(f"{exc}: stopping the run")
            self.events.emit("cancel_requested", signal=str(exc))
        except _HandedOver:
            left_running = True  # the machine is the other runner's to follow and delete now
            raise RunBusy(
                f"another runner took run {self.plan.run_id} over while this one followed it (this one's lease was "
                "not refreshed in time); it follows the run now",
                hint=f"`runner status {self.plan.run_id}`",
            ) from None
        except (BackendError, SpecError) as exc:  # SpecError: the job's own requirements, refused by pip (deps)
            self.events.hold()
            if self._down_elsewhere():  # deleted under the wait by `runner down`: that is the run's end, not exc
                self.state, self.reason = RunState.CANCELLED, STOPPED_BY_DOWN
                self.say(f"{exc.message}: the run was stopped by `runner down`")
                self.events.emit("cancel_requested", by="runner down", error=exc.message)
            else:
                self.state, self.reason = RunState.FAILED, exc.message
                self.events.emit("provision_failed", error=exc.message)
                raise
        except StorageError as exc:
            # The bucket is gone, or the run directory could not take run.json before a create: nothing this run
            # writes can be kept, so it ends (what it created is deleted below, from the handle alone).
            self.events.hold()
            self.state, self.reason = RunState.FAILED, exc.message
            raise
        except Exception as exc:
            if isinstance(exc, RunnerError):
                raise
            raise self._failed(exc, left_running) from exc
        finally:
            try:
                self._end(left_running)
            finally:
                if self.lease is not None:  # settled first: the next runner finds the run as this one left it
                    self.lease.release()
        return Outcome(self.record, self.state, self.snapshot)

    def _end(self, left_running: bool) -> None:
        try:
            self.teardown(left_running)
        except BackendError as exc:
            # Settled and recorded first, then reported: a machine that could not be deleted is the one thing the
            # user must hear about, with how to delete it.
            self.reason = f"{self.reason + '; ' if self.reason else ''}teardown failed: {exc.message}"
            self.events.emit("teardown_failed", error=exc.message)
            if not left_running:
                self.settle()
            raise
        if not left_running:
            self.settle()


def submit(
    plan: Plan,
    backend: Backend,
    *,
    say: Callable[[str], None],
    on_output: Callable[[bytes], None],
    detach: bool = False,
    timings: Timings | None = None,
    grace_s: float = 30.0,
    previous: RunRecord | None = None,
    overrides: list[str] | None = None,
    lease: Lease | None = None,
) -> Outcome:
    """Run `plan` on `backend` from start to end; `previous`: the record of the run this continues (runner resume),
    with the --set `overrides` it was given; `lease`: the run's lease, when the caller took it (resume does, before
    it reads the run's state), released when the run ends here."""
    try:
        if detach and plan.spec.teardown.runner_heartbeat_timeout:
            raise UsageError(
                "--detach and teardown.runner_heartbeat_timeout do not go together: the run would stop "
                "itself once this runner returns",
                hint="drop one of them",
            )
        run = Run(
            plan,
            backend,
            say=say,
            on_output=on_output,
            timings=timings,
            grace_s=grace_s,
            previous=previous,
            overrides=overrides,
            lease=lease,
        )
    except BaseException:
        if lease is not None:
            lease.release()
        raise
    return run.execute(detach)
