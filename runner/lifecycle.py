"""One run, start to end: plan -> provision -> launch -> watch -> collect -> teardown.

Teardown is in a `finally`, and SIGINT/SIGTERM are turned into an exception during the run, so every way out of
`submit` (success, failure, Ctrl-C, kill, a bug) passes through it. Attached machines are never deleted.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from runner import contract, records
from runner.backends.base import Backend, Handle, MachineState
from runner.errors import BackendError, Preempted, RunnerError, UsageError
from runner.events import Event, EventLog
from runner.interrupts import Interrupted, signals_deferred, signals_raise
from runner.plan import Plan
from runner.records import RunRecord
from runner.specfile import dump_spec
from runner.status import RunState, Snapshot, derive_state, read_snapshot
from runner.storage import Storage, open_storage
from runner.watch import LogTail, follow


@dataclass(frozen=True)
class Outcome:
    record: RunRecord
    state: RunState
    snapshot: Snapshot | None
    detached: bool = False


_GONE = (MachineState.GONE, MachineState.PREEMPTED, MachineState.STOPPED, MachineState.DELETING)


def _machine_gone(backend: Backend, handle: Handle, *, every_s: float) -> Callable[[], bool]:
    """Asks the backend whether the machine is gone, at most every `every_s` (cloud APIs have quotas); an API
    error is not an answer: the run directory keeps being watched."""
    last = [float("-inf"), False]

    def check() -> bool:
        if time.monotonic() - last[0] >= every_s:
            try:
                last[1] = backend.status(handle) in _GONE
            except RunnerError as exc:
                last[1] = False
                logging.getLogger(__name__).warning("machine status unavailable: %s", exc)
            last[0] = time.monotonic()
        return bool(last[1])

    return check


def _show_event(event: Event, say: Callable[[str], None]) -> None:
    """The machine's lifecycle events as they happen (the runner's own are already on screen)."""
    if event.source == "runner":
        return
    detail = ", ".join(f"{k} {v}" for k, v in event.fields.items() if k in ("exit_code", "state", "image", "host"))
    say(f"{event.source}: {event.event.replace('_', ' ')}" + (f" ({detail})" if detail else ""))


def should_delete(policy: str, state: RunState, attached: bool) -> bool:
    if attached:
        return False
    if policy == "never":
        return False
    if policy == "on_success":
        return state in (RunState.SUCCEEDED, RunState.CANCELLED)  # keep a failed machine for debugging
    return True


def start_record(plan: Plan, storage: Storage) -> RunRecord:
    """Write the resolved spec and run.json to the run directory and the local record, before anything is
    created: whatever happens next, the run can be found and inspected."""
    record = RunRecord(
        run_id=plan.run_id,
        job=plan.spec.name,
        backend=plan.backend,
        run_dir=plan.run_dir,
        spec_path=plan.spec_path,
        created_at=plan.created_at,
        deadline=plan.deadline,
        num_workers=plan.num_workers,
    )
    storage.write_bytes(contract.SPEC, dump_spec(plan.spec).encode())
    storage.write_bytes(contract.RUN_INFO, records.run_info(record))
    return records.save(record)


class RunnerHeartbeat:
    """While the runner watches, `runner-heartbeat` in the run directory says so (every `every_s`). A run that set
    teardown.runner_heartbeat_timeout stops itself, and its VM goes, when this stops for longer than that."""

    def __init__(self, storage: Storage, every_s: float = 30.0) -> None:
        self.storage, self.every_s = storage, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _beat(self) -> None:
        beat = {"time": round(time.time(), 3), "pid": os.getpid(), "host": socket.gethostname()}
        try:
            self.storage.write_bytes(contract.RUNNER_HEARTBEAT, json.dumps(beat).encode())
        except RunnerError as exc:
            logging.getLogger(__name__).warning("could not write the runner heartbeat: %s", exc)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._beat()

    def __enter__(self) -> RunnerHeartbeat:
        self._beat()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()


def _replace(backend: Backend, handle: Handle, storage: Storage, events: EventLog, grace_s: float) -> None:
    """Tear the old machine down (confirmed gone) and forget its exit records, before provisioning anew."""
    events.emit("teardown_requested", state="replacing")
    backend.teardown(handle, grace_s=grace_s)
    _clear_exit_records(storage)


def _clear_exit_records(storage: Storage) -> None:
    """Before a machine is recreated: the old attempt's exit records (a preempted worker records `cancelled`) must
    not end the new attempt. The old machine is gone, so nothing else writes them any more."""
    for info in storage.list(contract.EXIT_DIR + "/"):
        storage.delete(info.key)


def _was_preempted(backend: Backend, handle: Handle, snapshot: Snapshot, num_workers: int) -> bool:
    """A machine taken away (PREEMPTED), or gone without every worker's exit record: not the job's doing."""
    if backend.ephemeral:
        return False
    try:
        machine = backend.status(handle)
    except RunnerError:
        return False
    finished = len(snapshot.exits) >= num_workers and all(e.state != RunState.CANCELLED for e in snapshot.exits)
    return machine == MachineState.PREEMPTED or (machine == MachineState.GONE and not finished)


def submit(
    plan: Plan,
    backend: Backend,
    *,
    say: Callable[[str], None],
    on_output: Callable[[bytes], None],
    detach: bool = False,
    poll_s: float | None = None,
    grace_s: float = 30.0,
    status_every_s: float = 10.0,
) -> Outcome:
    if detach and plan.spec.teardown.runner_heartbeat_timeout:
        raise UsageError(
            "--detach and teardown.runner_heartbeat_timeout do not go together: the run would stop "
            "itself once this runner returns",
            hint="drop one of them",
        )
    storage = open_storage(plan.run_dir)
    record = start_record(plan, storage)
    events = EventLog(storage, "runner")
    events.emit("submitted", backend=plan.backend, spec=plan.spec_path)
    handle: Handle | None = None
    state = RunState.PENDING
    snapshot: Snapshot | None = None
    poll_s = poll_s or (0.5 if plan.storage_is_local else 2.0)
    tail = LogTail(storage)
    seen: set[tuple[float, str, str]] = set()
    retries = plan.spec.retries
    preemptions = failures = 0
    try:
        with signals_raise(), RunnerHeartbeat(storage):
            while True:
                record = records.save(record.updated(state=RunState.PROVISIONING))
                try:
                    handle = backend.provision(plan)
                except Preempted as exc:  # taken back while booting; the backend already deleted it
                    if preemptions >= retries.preemptions:
                        raise
                    preemptions += 1
                    events.emit("preempted", attempt=preemptions, retry=True, at="boot")
                    say(f"{exc}: creating it again ({preemptions}/{retries.preemptions})")
                    continue
                record = records.save(record.updated(state=RunState.STARTING, handle=handle.to_dict()))
                storage.write_bytes(contract.RUN_INFO, records.run_info(record))
                events.emit("provisioned", handle=handle.to_dict())
                if detach:
                    state = RunState.STARTING
                    return Outcome(record, state, None, detached=True)
                say("following the run; Ctrl-C stops it and tears everything down")
                snapshot = follow(
                    storage,
                    on_output,
                    num_workers=plan.num_workers,
                    interval_s=poll_s,
                    tail=tail,
                    seen_events=seen,
                    on_event=lambda e: _show_event(e, say),
                    machine_gone=_machine_gone(backend, handle, every_s=0 if backend.ephemeral else status_every_s),
                )
                if _was_preempted(backend, handle, snapshot, plan.num_workers):
                    if preemptions >= retries.preemptions:
                        state = RunState.FAILED
                        events.emit("preempted", attempt=preemptions + 1, retry=False)
                        say(f"preempted again, after {preemptions} recreation(s): giving up (retries.preemptions)")
                        break
                    preemptions += 1
                    events.emit("preempted", attempt=preemptions, retry=True)
                    say(
                        f"the machine was preempted: recreating it ({preemptions}/{retries.preemptions}); the job "
                        "resumes from its newest checkpoint"
                    )
                    _replace(backend, handle, storage, events, grace_s)
                    handle = None  # gone, confirmed: nothing for the finally below to tear down
                    continue
                state = derive_state(
                    snapshot, plan.num_workers, RunState.STARTING, machine_alive=False, heartbeat_timeout_s=0
                )
                if state == RunState.FAILED and failures < retries.failures:
                    failures += 1
                    events.emit("retrying_failure", attempt=failures)
                    say(f"the job failed: running it again ({failures}/{retries.failures})")
                    _replace(backend, handle, storage, events, grace_s)
                    handle = None  # gone, confirmed: nothing for the finally below to tear down
                    continue
                break
    except Interrupted as exc:
        state = RunState.CANCELLED
        say(f"{exc}: stopping the run")
        events.emit("cancel_requested", signal=str(exc))
    except BackendError as exc:
        state = RunState.FAILED
        events.emit("provision_failed", error=str(exc))
        raise
    finally:
        left_running = detach and state == RunState.STARTING  # detached on purpose: the job runs on
        if handle is not None and not left_running:
            delete = getattr(backend, "ephemeral", False) or should_delete(
                plan.spec.teardown.policy, state, plan.attach
            )
            with signals_deferred(say):
                if delete:
                    t0 = time.time()
                    events.emit("teardown_requested", state=str(state))
                    backend.teardown(handle, grace_s=grace_s)
                    events.emit("teardown_done", seconds=round(time.time() - t0, 2))
                else:
                    events.emit("teardown_skipped", policy=plan.spec.teardown.policy, state=str(state))
        if not left_running:
            rest = tail.read_new()  # what the job wrote while it was being stopped
            if rest:
                on_output(rest)
            final = read_snapshot(storage)
            # A state decided above stands (derive_state); one still open is settled by the workers' records.
            if final.exits:
                state = derive_state(final, plan.num_workers, state, machine_alive=False, heartbeat_timeout_s=0)
            if not state.is_terminal():
                state = RunState.LOST if not final.exits else state
            snapshot = final
            record = records.save(record.updated(state=state, finished_at=time.time()))
            events.emit("finished", state=str(state))
    return Outcome(record, state, snapshot)
