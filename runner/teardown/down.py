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
    """Delete what `record`'s run created (an attached node is left running). BackendError (exit 5) when it is not
    confirmed gone, after recording that it may still bill."""
    if not record.handle:
        return Down(False)
    backend = backend_named(record.backend, say)
    handle = backend.handle_from_dict(record.handle)
    asked_at = time.time()
    if not record.state.is_terminal():  # recorded first: what the workers write while being stopped changes nothing
        record = runs.save(record.updated(state=RunState.CANCELLED, finished_at=asked_at))
    with signals_deferred(say):
        try:
            gone = backend.teardown(handle)
        except BackendError as exc:
            note = f"{backend.describe_handle(handle)} may still bill: {exc.message}"
            runs.save(record.updated(still_billing=f"{note}. Retry: `runner down {record.run_id}`"))
            _tell_run_directory(record, asked_at, confirmed=False, failed=exc.message)
            raise
    record = runs.save(record.updated(still_billing=None))
    record, storage_error = _tell_run_directory(record, asked_at, confirmed=gone)
    if not gone:
        note = f"{backend.describe_handle(handle)} is being deleted, but it is not confirmed gone"
        runs.save(record.updated(still_billing=f"{note}. Check again: `runner down {record.run_id}`"))
        raise BackendError(
            f"{note}: it may still bill", hint=f"`runner down {record.run_id}` again, or {backend.delete_hint(handle)}"
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
        record = runs.save(record.updated(state=state))
    return record, None
