"""How a run's machines go: replaced after a preemption (confirmed gone first), deleted at the run's end per
teardown.policy, and every other machine the run asked for confirmed gone (runner.lifecycle.machines). Part of
runner.lifecycle.run's Run, kept apart for its size: the delete goes first, from the handle and the API alone, and
the run directory is told after."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from runner import contract
from runner.backends.base import Backend, Handle
from runner.errors import BackendError, StorageError
from runner.interrupts import signals_deferred
from runner.lifecycle import machines
from runner.plan.planner import Plan
from runner.storage import Storage
from runner.storage.parallel import delete_many, list_many
from runner.watch.events import EventLog
from runner.watch.runs import RunRecord
from runner.watch.state import RunState

# Before a machine is recreated its predecessor must be gone; a real TPU VM takes a minute or two to delete.
REPLACE_WAIT_S = 600.0


def should_delete(policy: str, state: RunState, attached: bool) -> bool:
    """on_success keeps a failed machine for debugging; a safety stop (timed out, hung) never keeps one."""
    if attached or policy == "never":
        return False
    if policy == "on_success":
        return state not in (RunState.FAILED, RunState.LOST)
    return True


class Ending:
    """The teardown half of a Run (runner.lifecycle.run), which sets these."""

    plan: Plan
    backend: Backend[Any]
    say: Callable[[str], None]
    storage: Storage
    events: EventLog
    record: RunRecord
    handle: Handle | None
    state: RunState
    reason: str | None
    safety_stop: bool
    grace_s: float

    def _save(self, *, required: bool = False, **changes: Any) -> None:
        raise NotImplementedError

    def _storage_failed(self, exc: StorageError) -> None:
        raise NotImplementedError

    def replace(self, handle: Handle) -> Handle | None:
        """Tear the old machine down (confirmed gone) and forget its exit records, before provisioning anew. The
        old machine is gone, so nothing writes them any more; a preempted worker records `cancelled`, which must
        not end the next attempt. The delete goes first; the run directory is told after. Where the platform
        restarted the job itself (Backend.next_attempt), nothing is deleted: the records of the attempt that ended
        are forgotten the same way, and the handle of the next one is returned, to follow; None: provision anew."""
        following = self.backend.next_attempt(handle, wait_s=REPLACE_WAIT_S)
        if following is not None:
            self.handle = following
            mine = machines.added(machines.without(self.record.machines, handle.to_dict()), following.to_dict())
            self._save(handle=following.to_dict(), machines=mine)
            self.events.release()  # held since the verdict, for a delete that is not needed
            self.events.emit("restarted", handle=following.to_dict())
        else:
            t0 = time.time()
            gone = self._delete(handle, "replacing", t0, wait_s=REPLACE_WAIT_S)
            if not gone:
                # Its successor would take its name: never create beside a machine that may still run the job.
                raise BackendError(
                    "the old machine was not confirmed gone, so no new one was created", hint="`runner down RUN`"
                )
            self.handle = None
        # Nothing writes these any more: the next attempt's workers must not be judged by the old ones' words (and
        # what cannot be cleared now is older than the next attempt's `since`).
        try:
            listed = list_many(self.storage, [contract.EXIT_DIR + "/", contract.HEARTBEATS_DIR + "/"])
            delete_many(self.storage, [info.key for found in listed for info in found])
        except StorageError as exc:
            self._storage_failed(exc)
        return following

    def _delete(self, handle: Handle, state: str, t0: float, *, wait_s: float | None = None) -> bool:
        """The backend's teardown, from the handle alone; then teardown_requested (stamped when it was sent) and
        teardown_done in the run directory, after what was held since the verdict. A deletion that failed leaves
        the run marked as still billing, with the node and how to retry, before the error goes on."""
        kwargs: dict[str, Any] = {"grace_s": self.grace_s} | ({"wait_s": wait_s} if wait_s is not None else {})
        self.events.hold()
        try:
            gone = self.backend.teardown(handle, **kwargs)
        except BackendError as exc:
            self.events.release()
            self.events.emit("teardown_requested", happened_at=t0, state=state)
            self.events.emit("delete_failed", error=exc.message, handle=handle.to_dict())
            note = self._billing_note(handle, exc.message)
            self._save(still_billing=note)
            self.say(f"warning: {note}")
            raise
        self.events.release()
        self.events.emit("teardown_requested", happened_at=t0, state=state)
        self.events.emit("teardown_done", seconds=round(time.time() - t0, 2), confirmed=gone)
        if gone:
            self._save(still_billing=None, machines=machines.without(self.record.machines, handle.to_dict()))
        else:
            self._save(still_billing=self._billing_note(handle, "its deletion is not confirmed"))
        return gone

    def _clear_others(self) -> None:
        """Every other machine this run asked for (another zone's, a renamed one, a predecessor) confirmed gone; what
        is not is named as still billing."""
        current = self.handle.to_dict() if self.handle is not None else None
        if not [m for m in self.record.machines if m != current]:
            return
        left, notes = machines.clear(self.backend, self.record.machines, keep=current, say=self.say)
        note = "; ".join(notes) + f". Retry: `runner down {self.plan.run_id}`" if notes else self.record.still_billing
        self._save(machines=left, still_billing=note)

    def _billing_note(self, handle: Handle, why: str) -> str:
        what = self.backend.describe_handle(handle)
        return (
            f"{what} may still bill: {why}. Retry: `runner down {self.plan.run_id}` "
            f"(or {self.backend.delete_hint(handle)})"
        )

    def teardown(self, left_running: bool) -> None:
        if not left_running:
            with signals_deferred(self.say):
                self._clear_others()
        if self.handle is None or left_running:
            self.events.release()
            return
        policy = self.plan.spec.teardown.policy
        # An attached machine's teardown stops the job and leaves the machine (the backend never deletes it).
        delete = (
            self.backend.ephemeral
            or self.plan.attach
            or self.safety_stop
            or should_delete(policy, self.state, self.plan.attach)
        )
        with signals_deferred(self.say):
            if delete:
                gone = self._delete(self.handle, str(self.state), time.time())
                if not gone:
                    self.reason = (self.reason + "; " if self.reason else "") + "its machine was still being deleted"
            else:
                self.events.release()
                self.events.emit("teardown_skipped", policy=policy, state=str(self.state))
