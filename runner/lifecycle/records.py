"""The run record at the start of an attempt: a new run's, or the next attempt of one `runner resume` continues.

Either way it is written locally and as run.json in the run directory, with the resolved spec, before anything is
created: whatever happens next, the run can be found, inspected and deleted. The local record goes first: a
$RUNNER_HOME that refuses it stops the run before the run directory holds anything no `runner list` would know.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from runner import contract
from runner.errors import RunnerError
from runner.plan.planner import Plan
from runner.spec.loader import dump_spec
from runner.storage import Storage
from runner.watch import runs
from runner.watch.runs import Attempt, RunRecord
from runner.watch.state import RunState


def start_record(plan: Plan, storage: Storage, claim: Callable[[], object] = lambda: None) -> RunRecord:
    """The local record, then `claim` (the run's lease), then the resolved spec and run.json in the run directory,
    before anything is created: whatever happens next, the run can be found and inspected. A run directory that
    cannot be written leaves the record `failed`, saying why, and nothing started."""
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
    runs.save(record)
    try:
        claim()
        storage.write_bytes(contract.SPEC, dump_spec(plan.spec).encode())
        storage.write_bytes(contract.RUN_INFO, runs.run_info(record))
    except RunnerError as exc:
        reason = f"nothing was started: {exc.message}"
        runs.update(record, state=RunState.FAILED, finished_at=time.time(), reason=reason)
        raise
    return record


def continue_record(plan: Plan, storage: Storage, previous: RunRecord, overrides: list[str]) -> RunRecord:
    """The record of the new attempt, its predecessor in the history; spec.yaml and run.json rewritten, and what
    the earlier attempt's workers left that would judge this one (exit records, heartbeats, summary) removed."""
    earlier = Attempt(
        started_at=previous.started_at or previous.created_at,
        finished_at=previous.finished_at,
        state=previous.state,
        reason=previous.reason,
        backend=previous.backend,
        overrides=previous.overrides,
    )
    changes: dict[str, Any] = dict(
        backend=plan.backend,
        spec_path=plan.spec_path,
        deadline=plan.deadline,
        num_workers=plan.num_workers,
        state=RunState.PENDING,
        finished_at=None,
        handle={},
        reason=None,
        attempts=[*previous.attempts, earlier],
        started_at=time.time(),
        overrides=list(overrides),
        down_at=None,
    )
    record = runs.update(previous, **changes)  # first, as for a new run
    try:
        stale = [
            *storage.list(contract.EXIT_DIR + "/"),
            *storage.list(contract.HEARTBEATS_DIR + "/"),
        ]
        for info in stale:
            storage.delete(info.key)
        for key in (contract.SUMMARY, contract.HEARTBEAT):
            storage.delete(key)
        storage.write_bytes(contract.SPEC, dump_spec(plan.spec).encode())
        storage.write_bytes(contract.RUN_INFO, runs.run_info(record))
    except RunnerError as exc:
        reason = f"nothing was started: {exc.message}"
        runs.update(record, state=RunState.FAILED, finished_at=time.time(), reason=reason)
        raise
    return record
