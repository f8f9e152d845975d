"""Single-host TPU VMs as Compute Engine instances: created in the first zone with capacity, followed until RUNNING,
read for their state, and deleted on their own.

Instance.status maps onto MachineState through one table. Compute Engine has no PREEMPTED status: a preempted Spot
VM goes STOPPING, then away by its termination action (DELETE here: at maxRunDuration or a preemption nothing of it
is left billing, its boot disk included), and Compute Engine records a compute.instances.preempted operation
against it. A Spot VM found going down with such an operation since it was created is PREEMPTED, and one gone
without every exit record was taken back: the runner creates it again, as for a TPU node.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from runner.backends import labels
from runner.backends.base import MachineState
from runner.backends.compute_engine.api import explain, operation_ref, timestamp
from runner.backends.compute_engine.common import GOING, Context
from runner.backends.compute_engine.handles import InstanceHandle
from runner.backends.compute_engine.requests import instance_request, target_of
from runner.backends.deletion import Deletion
from runner.backends.flows import create_owned, labels_of, owned_or_gone
from runner.backends.locations import first_with_capacity
from runner.errors import BackendError, NoCapacity, Preempted, Vanished
from runner.interrupts import signals_deferred
from runner.plan.planner import Plan

# Instance.status -> MachineState (compute.v1.json's enum; a preempted Spot VM: PREEMPTED, above).
STATES = {
    "PROVISIONING": MachineState.CREATING,
    "STAGING": MachineState.CREATING,
    "PENDING": MachineState.CREATING,  # flex-start: waiting for capacity
    "REPAIRING": MachineState.CREATING,  # a host error: Compute Engine restarts it (or TERMINATEs it)
    "RUNNING": MachineState.RUNNING,
    "PENDING_STOP": MachineState.STOPPED,  # shutting down gracefully: being stopped or deleted
    "STOPPING": MachineState.STOPPED,
    "DEPROVISIONING": MachineState.STOPPED,  # halted, its resources being released
    "STOPPED": MachineState.STOPPED,
    "SUSPENDING": MachineState.STOPPED,
    "SUSPENDED": MachineState.STOPPED,
    "TERMINATED": MachineState.STOPPED,
}
# Down, or going down: where a Spot VM's preemption shows.
DOWN = ("PENDING_STOP", "STOPPING", "DEPROVISIONING", "STOPPED", "TERMINATED")
PREEMPTED = "TERMINATED (preempted)"  # what a follower is shown for a preempted Spot VM


class Instances:
    """The instance flow of one ComputeEngineBackend."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.ready_at: dict[str, float | None] = {}  # instance name -> its insert operation's end (the API's clock)

    # -- create ---------------------------------------------------------------------------------------------------

    def provision(self, plan: Plan, on_handle: Callable[[InstanceHandle], None]) -> InstanceHandle:
        """The instance in the first zone with capacity (runner.backends.locations); `on_handle` gets each handle before
        its insert is sent."""
        target = target_of(plan)
        return first_with_capacity(
            target.zones,
            lambda zone, name: self._create(plan, zone, name, on_handle),
            name=target.machine_id,
            what=target.accelerator.name,
            kind="instance",
            capacity_wait_s=plan.spec.retries.capacity_wait,
            backoff_s=self.ctx.backoff_s,
            say=self.ctx.say,
        )

    def _create(self, plan: Plan, zone: str, name: str, on_handle: Callable[[InstanceHandle], None]) -> InstanceHandle:
        target = target_of(plan)
        api, project = self.ctx.api, target.project
        handle = InstanceHandle(project, zone, name, nonce=plan.nonce)
        on_handle(handle)
        self.ctx.say(f"creating instance {name} ({target.machine_type}, {target.provisioning_model}) in {zone}")
        return create_owned(
            name,
            "instance",
            nonce=handle.nonce,
            run_id=plan.run_id,
            send=lambda: api.insert("instance", instance_request(plan, zone, name), project=project, zone=zone),
            found_labels=lambda: labels_of(self.get(handle)),
            wait=lambda operation: self._ready(handle, operation, plan),
            discard=lambda: self.discard(handle),
        )

    def _ready(self, handle: InstanceHandle, operation: str | None, plan: Plan) -> InstanceHandle:
        self.ready_at[handle.name] = self._wait_ready(handle, operation, plan)
        return handle

    def _wait_ready(self, handle: InstanceHandle, operation: str | None, plan: Plan) -> float | None:
        """Until the insert operation is DONE and the instance RUNNING, showing each status; returns when the operation
        ended (the API's clock). A stockout is told only in the operation; a flex-start VM waits PENDING (its
        operation DONE) up to max_wait, then the next zone."""
        target = target_of(plan)
        t0 = time.monotonic()
        last, done, ended_at, seen, missing = None, operation is None, None, False, False
        where = dict(project=handle.project, zone=handle.zone)
        while True:
            if not done and operation is not None:
                op = self.ctx.api.get_operation(operation, **where)
                done, ended_at = op.done, op.ended_at
                if op.failure is not None:
                    raise explain(op.failure, f"create instance {handle.name}", **where)
            found = self.get(handle)
            if found is None and last == "RUNNING":  # up, then gone: its job may have ended it (the watch sees it)
                return ended_at
            if found is None and seen and not done and not missing:  # its operation read again, a poll later (stockout)
                missing = True
                time.sleep(min(self.ctx.poll_s, 1.0))
                continue
            if found is None and seen and not done:  # there, then gone while its insert is still under way
                raise Vanished(
                    f"instance {handle.name} was deleted while it was being created: by `runner down`, in the console "
                    "or by Compute Engine",
                    hint=f"`gcloud compute operations list --zones={handle.zone}` shows who deleted it",
                )
            seen, missing = seen or found is not None, False
            state = str(found.status) if found is not None else ("CREATED" if done else "PENDING")
            if state != last:
                self.ctx.say(f"instance {handle.name}: {state} ({time.monotonic() - t0:.0f}s)")
                last = state
            if (state == "RUNNING" and done) or (done and found is None):
                # RUNNING may come before the insert's operation ends: its end (when billing starts) is read on for.
                # A job short enough may already have deleted its VM: the watch sees it.
                return ended_at
            if state in DOWN and self.preempted(handle, found):
                raise Preempted(
                    f"instance {handle.name} was preempted as soon as it was created",
                    hint="Spot capacity is short here: list more zones, or drop accelerator.spot",
                )
            if state in (*DOWN, "SUSPENDING", "SUSPENDED"):
                raise BackendError(f"instance {handle.name} went {state} while being created")
            if state == "PENDING" and done and time.monotonic() - t0 > target.max_wait_s:
                raise NoCapacity(
                    f"flex-start instance {handle.name} got no capacity in {handle.zone} within {target.max_wait_s}s",
                    hint="raise accelerator.max_wait, or list more zones",
                )
            if time.time() > plan.deadline:
                raise BackendError(
                    f"instance {handle.name} was not RUNNING when the run's max_runtime ran out",
                    hint="raise teardown.max_runtime, or list other zones",
                )
            time.sleep(self.ctx.pause(t0))

    def discard(self, handle: InstanceHandle) -> None:
        """Delete what this attempt created, and only that: an instance carrying this run's nonce."""
        try:
            with signals_deferred(self.ctx.say):  # a second Ctrl-C must not leave the half-created VM behind
                found = self.get(handle)
                if found is not None and labels.owned(dict(found.labels), handle.nonce):
                    self.ctx.delete(self.deletion(handle), announce=False)
        except BackendError as exc:
            self.ctx.say(
                f"warning: could not make sure {self.what(handle)} in {handle.zone} is deleted: {exc}; "
                "`runner down RUN` or `runner gc` will"
            )

    # -- read, delete ---------------------------------------------------------------------------------------------

    def get(self, handle: InstanceHandle) -> Any | None:
        return self.ctx.api.unless_missing(
            "instances",
            "get",
            f"read instance {handle.name}",
            (handle.project, handle.zone),
            project=handle.project,
            zone=handle.zone,
            instance=handle.name,
        )

    def preempted(self, handle: InstanceHandle, found: Any) -> bool:
        """A Spot VM stopped by Compute Engine's preemption (its system event since this VM was created)."""
        if found.scheduling.provisioning_model != "SPOT":
            return False
        created = timestamp(found.creation_timestamp)
        return self.ctx.api.preempted_since(handle.project, handle.zone, handle.name, created)

    def observe(self, handle: InstanceHandle) -> tuple[MachineState, str | None]:
        found = self.get(handle)
        if found is None:
            return MachineState.GONE, None
        status = str(found.status)
        if status in DOWN and self.preempted(handle, found):
            return MachineState.PREEMPTED, PREEMPTED
        return STATES.get(status, MachineState.UNKNOWN), status

    def owns(self, handle: InstanceHandle) -> bool:
        return owned_or_gone(labels_of(self.get(handle)), handle.nonce)

    @staticmethod
    def what(handle: InstanceHandle) -> str:
        return f"instance {handle.name}"

    @staticmethod
    def delete_hint(handle: InstanceHandle) -> str:
        return (
            f"delete it yourself: gcloud compute instances delete {handle.name} --zone={handle.zone} "
            f"--project={handle.project} --quiet"
        )

    def deletion(self, handle: InstanceHandle) -> Deletion:
        api, where = self.ctx.api, dict(project=handle.project, zone=handle.zone)

        def state() -> str | None:
            found = self.get(handle)
            return None if found is None else str(found.status)

        def request() -> str | None:
            op = api.unless_missing(
                "instances",
                "delete_unary",
                f"delete instance {handle.name}",
                (handle.project, handle.zone),
                project=handle.project,
                zone=handle.zone,
                instance=handle.name,
            )
            return None if op is None else operation_ref(op)

        return Deletion(
            what=self.what(handle),
            zone=handle.zone,
            hint=self.delete_hint(handle),
            check=f"gcloud compute instances describe {handle.name} --zone={handle.zone}",
            read_state=state,
            request=request,
            outcome=lambda op: self.ctx.outcome(op, self.what(handle), **where),
            going=GOING,
        )

    def teardown(self, handle: InstanceHandle, *, grace_s: float, wait_s: float) -> bool:
        return self.ctx.delete(self.deletion(handle), announce=True, wait_s=wait_s)
