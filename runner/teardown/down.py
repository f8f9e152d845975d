"""`runner down RUN`: stop a run and delete what it created, now, in any phase, from any shell.

The handle of what a run may have created is in its record before the create request is sent (runner.lifecycle),
so a run whose runner was killed while its node was CREATING is found and deleted like any other. Deleting needs
the record and the API, nothing else: the local record is marked cancelled first (a submitter still following the
run on this machine sees it and does not recreate anything), the delete is sent, and only then is the run directory
told (`down_requested`, stamped when the delete was asked for, in a file of its own: the submitter may still be
writing events/runner.jsonl). A run directory that cannot be written is reported after the delete, never instead of
it; a node not confirmed gone keeps the run marked as still billing, with how to retry.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runner.backends import backend_named
from runner.errors import BackendError, StorageError
from runner.interrupts import signals_deferred
from runner.storage import open_storage
from runner.timings import Timings
from runner.watch import runs
from runner.watch.events import EventLog
from runner.watch.rundir import read_snapshot
from runner.watch.runs import RunRecord
from runner.watch.state import RunState, derive_state


@dataclass(frozen=True)
class Down:
    """What `down` did: whether it created anything to delete, and what the run directory could not be told."""

    created: bool
    storage_error: StorageError | None = None


def down(record: RunRecord, *, say: Callable[[str], None]) -> Down:
    """Delete what `record`'s run created: its machine and every other one it asked for that is not confirmed gone
    (RunRecord.machines; an attached node is left running). BackendError (exit 5) when one is not confirmed gone,
    after recording that it may still bill."""
    handles = [m for m in record.machines if m != record.handle] + ([record.handle] if record.handle else [])
    if not handles:
        return Down(False)
    backend = backend_named(record.backend, say)
    asked_at = time.time()
    if not record.state.is_terminal():  # recorded first: what the workers write while being stopped changes nothing
        record = runs.update(record, state=RunState.CANCELLED, finished_at=asked_at, down_at=asked_at)
    left: list[dict[str, Any]] = []
    notes: list[str] = []
    failed: BackendError | None = None
    with signals_deferred(say):
        for data in handles:
            handle = backend.handle_from_dict(data)
            try:
                if data != record.handle and not backend.owns(handle):
                    continue  # a name the run found taken: another run's machine, never this run's to delete
                gone = backend.teardown(handle)
            except BackendError as exc:
                failed = failed or exc
                left.append(data)
                notes.append(f"{backend.describe_handle(handle)} may still bill: {exc.message}")
                continue
            if not gone:
                left.append(data)
                notes.append(f"{backend.describe_handle(handle)} is being deleted, but it is not confirmed gone")
    billing = "; ".join(notes) + f". Retry: `runner down {record.run_id}`" if notes else None
    record = runs.update(record, machines=left, still_billing=billing)
    message = failed.message if failed is not None else None
    record, storage_error = _tell_run_directory(record, asked_at, confirmed=not notes, failed=message)
    if failed is not None:
        raise BackendError("; ".join(notes), hint=failed.hint) from failed
    if notes:
        last = backend.handle_from_dict(left[-1])
        raise BackendError(
            f"{'; '.join(notes)}: it may still bill",
            hint=f"`runner down {record.run_id}` again, or {backend.delete_hint(last)}",
        )
    return Down(True, storage_error)


def _tell_run_directory(
    record: RunRecord, asked_at: float, *, confirmed: bool, failed: str | None = None
) -> tuple[RunRecord, StorageError | None]:
    """down_requested (when the delete was asked for) and its outcome, in the run directory; and the run's state,
    when its workers had all finished on their own before (their records say succeeded or failed, not the
    `cancelled` a stop writes). Returns the record, and the StorageError that kept the run directory from being
    told."""
    try:
        storage = open_storage(record.run_dir, patience_s=Timings.from_env().storage_patience_s)
        events = EventLog(storage, "runner-down")
        events.emit("down_requested", happened_at=asked_at, state=str(record.state))
        if failed is not None:
            events.emit("delete_failed", error=failed)
        else:
            events.emit("down_done", confirmed=confirmed)
        snapshot = read_snapshot(storage, with_metrics=False)
    except StorageError as exc:
        return record, exc
    finished = len(snapshot.exits) >= record.num_workers and all(e.state != RunState.CANCELLED for e in snapshot.exits)
    if finished and record.state == RunState.CANCELLED:
        state = derive_state(snapshot, record.num_workers, RunState.PENDING, machine_alive=False, heartbeat_timeout_s=0)
        record = runs.update(record, state=state)
    return record, None
