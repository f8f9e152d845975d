"""One run, start to end: plan -> provision -> launch -> watch -> collect -> teardown.

Teardown is in a `finally`, and SIGINT/SIGTERM are turned into an exception during the run, so every way out of
`submit` (success, failure, Ctrl-C, kill, a bug) passes through it. Attached machines are never deleted.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from runner import contract, records
from runner.backends.base import Backend, Handle, MachineState
from runner.errors import BackendError
from runner.events import EventLog
from runner.plan import Plan
from runner.records import RunRecord
from runner.specfile import dump_spec
from runner.status import RunState, Snapshot, derive_state, read_snapshot
from runner.storage import Storage, open_storage
from runner.watch import LogTail, follow


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise Interrupted in the main thread (SIGTERM would otherwise kill us without cleanup)."""

    def handler(signum: int, _frame: Any) -> None:
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextmanager
def signals_deferred(say: Callable[[str], None]) -> Iterator[None]:
    """During teardown a second Ctrl-C must not leave a machine behind: note it and carry on."""

    def handler(signum: int, _frame: Any) -> None:
        say(f"{signal.Signals(signum).name} received; still tearing down, so nothing is left running")

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@dataclass(frozen=True)
class Outcome:
    record: RunRecord
    state: RunState
    snapshot: Snapshot | None
    detached: bool = False


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


def submit(
    plan: Plan,
    backend: Backend,
    *,
    say: Callable[[str], None],
    on_output: Callable[[bytes], None],
    detach: bool = False,
    poll_s: float | None = None,
    grace_s: float = 30.0,
) -> Outcome:
    storage = open_storage(plan.run_dir)
    record = start_record(plan, storage)
    events = EventLog(storage, "runner")
    events.emit("submitted", backend=plan.backend, spec=plan.spec_path)
    handle: Handle | None = None
    state = RunState.PENDING
    snapshot: Snapshot | None = None
    poll_s = poll_s or (0.5 if plan.storage_is_local else 2.0)
    tail = LogTail(storage)
    try:
        with signals_raise():
            record = records.save(record.updated(state=RunState.PROVISIONING))
            handle = backend.provision(plan)
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
                machine_gone=lambda: backend.status(handle) == MachineState.GONE,  # type: ignore[arg-type]
            )
            state = derive_state(
                snapshot, plan.num_workers, RunState.STARTING, machine_alive=False, heartbeat_timeout_s=0
            )
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
            # The workers' own records say best how it ended (a cancel the job finished anyway stays cancelled).
            if final.exits and state != RunState.CANCELLED:
                state = derive_state(final, plan.num_workers, state, machine_alive=False, heartbeat_timeout_s=0)
            if not state.is_terminal():
                state = RunState.LOST if not final.exits else state
            snapshot = final
            record = records.save(record.updated(state=state, finished_at=time.time()))
            events.emit("finished", state=str(state))
    return Outcome(record, state, snapshot)
