"""`runner down RUN`: stop a run and delete what it created, now, in any phase, from any shell.

The handle of what a run may have created is in its record before the create request is sent (runner.lifecycle),
so a run whose runner was killed while its node was CREATING is found and deleted like any other. `down_requested`
goes into the run directory first (in a file of its own: the submitter may still be writing events/runner.jsonl),
so a submitter still following the run sees it and ends the run cancelled instead of recreating anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from runner.backends import backend_named
from runner.storage import open_storage
from runner.teardown.interrupts import signals_deferred
from runner.watch import runs
from runner.watch.events import EventLog
from runner.watch.lookup import current_state
from runner.watch.rundir import read_snapshot
from runner.watch.runs import RunRecord
from runner.watch.state import RunState


def down(record: RunRecord, *, say: Callable[[str], None]) -> bool:
    """Delete what `record`'s run created (an attached node is left running). False when it created nothing."""
    if not record.handle:
        return False
    backend = backend_named(record.backend, say)
    storage = open_storage(record.run_dir)
    finished = current_state(record, read_snapshot(storage, with_metrics=False), backend).is_terminal()
    events = EventLog(storage, "runner-down")
    events.emit("down_requested", state=str(record.state))
    if not finished:  # recorded first: what the workers write while being stopped does not change what this was
        runs.save(record.updated(state=RunState.CANCELLED, finished_at=time.time()))
    with signals_deferred(say):
        gone = backend.teardown(backend.handle_from_dict(record.handle))
    events.emit("down_done", confirmed=gone)
    return True
