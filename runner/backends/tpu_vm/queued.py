"""Queued resources: a TPU slice asked for through Cloud TPU's queue instead of created outright.

A queued resource (cloud.google.com/tpu/docs/queued-resources) holds the request for a node in the zone's queue
until capacity frees up, then creates the node:

    CREATING -> WAITING_FOR_RESOURCES (ACCEPTED in older answers) -> PROVISIONING -> ACTIVE
    FAILED: not provisioned before its validUntil (or refused); the reason is in state.failedData.error
    SUSPENDING -> SUSPENDED: its node was preempted (initiator SERVICE) or deleted (initiator USER)

The runner sends `queueingPolicy.validUntilDuration` = accelerator.max_wait (capped at the run's max_runtime, so a
request never outlives its run even when the runner is gone), follows the states with the elapsed time, and keeps
its own bound (max_wait and QUEUE_SLACK_S). A queued resource that FAILED, was SUSPENDED before it became ACTIVE, or
waited past its bound is deleted (force: its node goes with it) and the next zone is tried; the reason of the last
one is reported when none is left. A queued resource is deleted as a whole, never through its node.

Capacity tiers, as the v2 API has them: Spot -> the queued resource's `spot: {}`; reserved -> the node's
schedulingConfig.reserved; on-demand -> `guaranteed: {}`. Flex-start (Dynamic Workload Scheduler) exists only in
the v2alpha1 API (`gcloud alpha compute tpus queued-resources create --provisioning-model=flex-start
--max-run-duration=...`) and google-cloud-tpu's tpu_v2 has no field for it: it is not offered here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from runner.backends import labels
from runner.backends.base import MachineState
from runner.backends.deletion import Deletion
from runner.backends.flows import create_owned, owned_or_gone
from runner.backends.labels import NameTaken
from runner.backends.tpu_vm.api import explain, failure_of_status
from runner.backends.tpu_vm.common import Context
from runner.backends.tpu_vm.handles import QueuedHandle
from runner.backends.tpu_vm.requests import queued_request, slice_nodes, target_of
from runner.errors import AlreadyExists, BackendError, NoCapacity, Vanished
from runner.interrupts import signals_deferred
from runner.plan.planner import Plan

# The API fails a request at its validUntil; the runner gives it this long to say so before acting on its own.
QUEUE_SLACK_S = 30.0
WAITING_NOTE_S = 60.0  # while waiting, a line this often (besides one per state change)
# QueuedResourceState.State -> MachineState. SUSPENDING/SUSPENDED depend on who suspended it (queued_state).
_STATES = {
    "CREATING": MachineState.CREATING,
    "ACCEPTED": MachineState.CREATING,
    "WAITING_FOR_RESOURCES": MachineState.CREATING,
    "PROVISIONING": MachineState.CREATING,
    "ACTIVE": MachineState.RUNNING,
    "FAILED": MachineState.STOPPED,
    "DELETING": MachineState.DELETING,
    "STATE_UNSPECIFIED": MachineState.UNKNOWN,
}


def state_of(qr: Any | None) -> str | None:
    """The queued resource's state name; None when it does not exist."""
    return None if qr is None else str(qr.state.state.name)


def queued_state(qr: Any | None) -> MachineState:
    """What is there to pay for: a queued resource suspended by the service lost its node to a preemption."""
    if qr is None:
        return MachineState.GONE
    state = str(qr.state.state.name)
    if state in ("SUSPENDING", "SUSPENDED"):
        initiator = qr.state.state_initiator.name
        return MachineState.PREEMPTED if initiator == "SERVICE" else MachineState.GONE
    return _STATES.get(state, MachineState.UNKNOWN)


def labels_of(qr: Any) -> dict[str, str]:
    specs = list(qr.tpu.node_spec) if qr.tpu else []
    return dict(specs[0].node.labels) if specs else {}


def failure_reason(qr: Any) -> tuple[str, str]:
    """(canonical code, the API's words) of a FAILED queued resource (state.failedData.error)."""
    data = qr.state.failed_data
    if data is None or not data.error or not (data.error.code or data.error.message):
        return "UNKNOWN", "the API gave no reason"
    failure = failure_of_status(data.error)
    return failure.code, failure.said()


class _Ended(Exception):
    """The queued resource will not become ACTIVE in this zone: why, in the API's words. `capacity`: a wait that ran
    out (or a stockout): another zone may have capacity."""

    def __init__(self, reason: str, *, capacity: bool) -> None:
        super().__init__(reason)
        self.reason, self.capacity = reason, capacity


class QueuedResources:
    """The queued-resource flow of one TpuVmBackend: create and follow until ACTIVE, zone after zone; read, delete."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.api = ctx.api
        self.say = ctx.say

    def provision(self, plan: Plan, on_handle: Callable[[QueuedHandle], None]) -> QueuedHandle:
        """A queued resource in each zone in turn until one becomes ACTIVE. Quota, permission and request errors
        stop at once: no other zone fixes those."""
        target = target_of(plan)
        node_id = target.machine_id
        ended: list[tuple[str, _Ended]] = []
        for i, zone in enumerate(target.zones):
            try:
                try:
                    return self._create(plan, zone, node_id, on_handle)
                except NameTaken as taken:
                    self.say(f"{taken}: this run's queued resource is named {taken.new_id} instead")
                    node_id = taken.new_id
                    return self._create(plan, zone, node_id, on_handle)
            except NameTaken as taken:
                raise AlreadyExists(f"{taken}, and so does the new name", hint="submit again") from None
            except NoCapacity as exc:  # the create operation itself said stockout
                ended.append((zone, _Ended(exc.message, capacity=True)))
            except _Ended as exc:
                ended.append((zone, exc))
            if i + 1 < len(target.zones):
                self.say(f"{zone}: {ended[-1][1].reason}; queueing in {target.zones[i + 1]} next")
        reasons = "; ".join(f"{zone}: {exc.reason}" for zone, exc in ended)
        message = f"no queued resource for {target.accelerator.name} became ACTIVE ({reasons})"
        hint = "raise accelerator.max_wait, list more zones under accelerator.zones, or try Spot (accelerator.spot)"
        if all(exc.capacity for _, exc in ended):
            raise NoCapacity(message, hint=hint)
        raise BackendError(message, hint=hint)

    def _create(self, plan: Plan, zone: str, node_id: str, on_handle: Callable[[QueuedHandle], None]) -> QueuedHandle:
        target = target_of(plan)
        handle = QueuedHandle(target.project, zone, node_id, queued_resource=node_id, nonce=plan.nonce)
        on_handle(handle)
        what = target.accelerator.name
        if target.slices > 1:
            nodes = slice_nodes(node_id, target.slices)
            what = f"{target.slices} slices of {what} (nodes {nodes[0]} ... {nodes[-1]})"
        self.say(
            f"queueing {what} in {zone}: queued resource {node_id} (waits up to {target.max_wait_s}s for capacity)"
        )
        return create_owned(
            node_id,
            "queued resource",
            nonce=handle.nonce,
            run_id=plan.run_id,
            send=lambda: self.api.create_queued_resource(
                target.project, zone, node_id, queued_request(plan, zone, node_id)
            ),
            found_labels=lambda: self._labels(handle),
            wait=lambda operation: self._active(handle, operation, plan),
            discard=lambda: self.discard(handle),
        )

    def _labels(self, handle: QueuedHandle) -> dict[str, str] | None:
        qr = self.api.get_queued_resource(handle.name, project=handle.project, zone=handle.zone)
        return None if qr is None else labels_of(qr)

    def _active(self, handle: QueuedHandle, operation: str | None, plan: Plan) -> QueuedHandle:
        self._wait_active(handle, operation, plan)
        return handle

    def _wait_active(self, handle: QueuedHandle, operation: str | None, plan: Plan) -> None:
        """Until ACTIVE, one line per state with the seconds since the request, and one a minute while waiting.
        The create operation is read for its outcome (a refusal is only told there), the queued resource for its
        state; FAILED, SUSPENDED or a wait past the bound raise _Ended."""
        max_wait_s = target_of(plan).max_wait_s
        where = dict(project=handle.project, zone=handle.zone)
        t0 = time.monotonic()
        last, noted = None, t0
        done = operation is None
        while True:
            if not done and operation is not None:
                op = self.api.get_operation(operation, **where)
                done = op.done
                if op.failure is not None:
                    raise explain(op.failure, f"queue {handle.queued_resource}", **where)
            qr = self.api.get_queued_resource(handle.name, **where)
            state = state_of(qr) or ("CREATED" if done else "PENDING")
            now = time.monotonic()
            waited = now - t0
            if state != last:
                self.say(f"queued resource {handle.queued_resource}: {state} ({waited:.0f}s)")
                last, noted = state, now
            elif now - noted >= WAITING_NOTE_S:
                self.say(f"queued resource {handle.queued_resource}: still {state} ({waited:.0f}s)")
                noted = now
            if state == "ACTIVE":
                return
            if state == "DELETING" or (qr is None and done):  # deleted under the wait: it ends now, saying so
                raise Vanished(
                    f"queued resource {handle.queued_resource} was deleted before it became ACTIVE ({state}): by "
                    "`runner down`, in the console or by Cloud TPU",
                    hint=f"`gcloud compute tpus operations list --zone={handle.zone}` shows who deleted it",
                )
            if qr is not None and state == "FAILED":
                code, said = failure_reason(qr)
                raise _Ended(f"FAILED after {waited:.0f}s: {said} ({code})", capacity=code == "RESOURCE_EXHAUSTED")
            if qr is not None and state in ("SUSPENDING", "SUSPENDED"):
                who = qr.state.state_initiator.name
                raise _Ended(f"{state} (by {who}) before it became ACTIVE", capacity=who == "SERVICE")
            if state != "PROVISIONING" and waited > max_wait_s + QUEUE_SLACK_S:
                raise _Ended(
                    f"still {state} after {waited:.0f}s: accelerator.max_wait ({max_wait_s}s) passed",
                    capacity=True,
                )
            if time.time() > plan.deadline:
                raise BackendError(
                    f"queued resource {handle.queued_resource} was not ACTIVE when the run's max_runtime ran out",
                    hint="raise teardown.max_runtime, or list other zones",
                )
            time.sleep(min(self.ctx.poll_s, 1.0 + waited / 10))

    def discard(self, handle: QueuedHandle) -> None:
        """Delete what this attempt created, and only that: a queued resource carrying this run's nonce."""
        try:
            with signals_deferred(self.say):  # a second Ctrl-C must not leave the half-created request behind
                qr = self.api.get_queued_resource(handle.name, project=handle.project, zone=handle.zone)
                if qr is not None and labels.owned(labels_of(qr), handle.nonce):
                    self.ctx.delete(self.deletion(handle), announce=True)
        except BackendError as exc:
            self.say(
                f"warning: could not make sure {self.what(handle)} in {handle.zone} is deleted: {exc}; "
                "`runner down RUN` or `runner gc` will"
            )

    # -- read, delete ---------------------------------------------------------------------------------------------

    def observe(self, handle: QueuedHandle) -> tuple[MachineState, str | None]:
        qr = self.api.get_queued_resource(handle.name, project=handle.project, zone=handle.zone)
        return queued_state(qr), state_of(qr)

    def owns(self, handle: QueuedHandle) -> bool:
        return owned_or_gone(self._labels(handle), handle.nonce)

    @staticmethod
    def what(handle: QueuedHandle) -> str:
        return f"queued resource {handle.queued_resource} (and any node it holds)"

    @staticmethod
    def delete_hint(handle: QueuedHandle) -> str:
        return (
            f"delete it yourself: gcloud compute tpus queued-resources delete {handle.queued_resource} "
            f"--zone={handle.zone} --project={handle.project} --force"
        )

    def deletion(self, handle: QueuedHandle) -> Deletion:
        where = dict(project=handle.project, zone=handle.zone)
        return Deletion(
            what=self.what(handle),
            zone=handle.zone,
            hint=self.delete_hint(handle),
            check=f"gcloud compute tpus queued-resources describe {handle.queued_resource} --zone={handle.zone}",
            read_state=lambda: state_of(self.api.get_queued_resource(handle.name, **where)),
            request=lambda: self.api.delete_queued_resource(handle.name, **where),  # force: its nodes too
            outcome=lambda op: self.ctx.outcome(op, self.what(handle), **where),
        )

    def teardown(self, handle: QueuedHandle, *, grace_s: float, wait_s: float) -> bool:
        return self.ctx.delete(self.deletion(handle), announce=True, wait_s=wait_s)
