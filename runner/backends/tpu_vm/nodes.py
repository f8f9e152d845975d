"""TPU nodes the run creates outright: created in the first zone with capacity, followed until READY, read for
their state, and deleted on their own.

Node.State maps onto MachineState through one table: what is there to pay for, and whether it can still run the
job. A node taken back before its job could start is a preemption, which the runner retries like any other.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from runner.backends import labels
from runner.backends.base import MachineState
from runner.backends.deletion import Deletion
from runner.backends.flows import create_owned, labels_of, owned_or_gone
from runner.backends.locations import first_with_capacity
from runner.backends.tpu_vm.api import explain
from runner.backends.tpu_vm.common import Context
from runner.backends.tpu_vm.handles import NodeHandle
from runner.backends.tpu_vm.requests import node_request, target_of
from runner.errors import BackendError, Preempted, Vanished
from runner.interrupts import signals_deferred
from runner.plan.planner import Plan

# Node.State -> MachineState.
STATES = {
    "CREATING": MachineState.CREATING,
    "STARTING": MachineState.CREATING,
    "RESTARTING": MachineState.CREATING,
    "REIMAGING": MachineState.CREATING,
    "REPAIRING": MachineState.CREATING,
    "UNHIDING": MachineState.CREATING,
    "READY": MachineState.RUNNING,
    "STOPPING": MachineState.STOPPED,
    "STOPPED": MachineState.STOPPED,
    "DELETING": MachineState.DELETING,
    "PREEMPTED": MachineState.PREEMPTED,
    "TERMINATED": MachineState.PREEMPTED,
    "HIDING": MachineState.UNKNOWN,
    "HIDDEN": MachineState.UNKNOWN,
    "STATE_UNSPECIFIED": MachineState.UNKNOWN,
}


def vanished(handle: NodeHandle, how: str) -> Vanished:
    return Vanished(
        f"TPU node {handle.node_id} was deleted while it was being created ({how}): by `runner down`, in the "
        "console or by Cloud TPU",
        hint=f"`runner status RUN` shows the run; `gcloud compute tpus operations list --zone={handle.zone}` who "
        "deleted it",
    )


def machine_state(node: Any | None) -> MachineState:
    if node is None:
        return MachineState.GONE
    return STATES.get(node.state.name, MachineState.UNKNOWN)


class Nodes:
    """The node flow of one TpuVmBackend."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.ready_at: dict[str, float | None] = {}  # node id -> its create operation's end (the API's clock)

    # -- create ---------------------------------------------------------------------------------------------------

    def provision(self, plan: Plan, on_handle: Callable[[NodeHandle], None]) -> NodeHandle:
        """The node in the first zone with capacity (runner.backends.locations). `on_handle` gets each node's handle
        before its create request is sent, so that a runner killed at any moment has recorded what it may have
        created."""
        target = target_of(plan)
        return first_with_capacity(
            target.zones,
            lambda zone, name: self._create(plan, zone, name, on_handle),
            name=target.machine_id,
            what=target.accelerator.name,
            kind="node",
            capacity_wait_s=plan.spec.retries.capacity_wait,
            backoff_s=self.ctx.backoff_s,
            say=self.ctx.say,
        )

    def _create(self, plan: Plan, zone: str, node_id: str, on_handle: Callable[[NodeHandle], None]) -> NodeHandle:
        target = target_of(plan)
        api, project = self.ctx.api, target.project
        handle = NodeHandle(project, zone, node_id, nonce=plan.nonce)
        on_handle(handle)
        self.ctx.say(f"creating TPU node {node_id} ({target.accelerator.name}) in {zone}")
        return create_owned(
            node_id,
            "TPU node",
            nonce=handle.nonce,
            run_id=plan.run_id,
            send=lambda: api.create_node(project, zone, node_id, node_request(plan, zone, node_id)),
            found_labels=lambda: labels_of(api.get_node(project, zone, node_id)),
            wait=lambda operation: self._ready(handle, operation, plan.deadline),
            discard=lambda: self.discard(handle),
        )

    def _ready(self, handle: NodeHandle, operation: str | None, deadline: float) -> NodeHandle:
        self.ready_at[handle.node_id] = self._wait_ready(handle, operation, deadline=deadline)
        return handle

    def _wait_ready(self, handle: NodeHandle, operation: str | None, *, deadline: float) -> float | None:
        """Until the create operation is done and the node READY, showing each state; polls every second at first,
        then every poll_s (a TPU VM takes a minute or more to create). The operation is read for its outcome (a
        stockout or a refusal is only told there); the node for its state. Returns when the node became READY by
        the API's clock (the operation's end), when it says so: the start of what the run is billed for."""
        api, say = self.ctx.api, self.ctx.say
        t0 = time.monotonic()
        last = None
        done = operation is None
        ended_at: float | None = None
        seen = missing = False
        while True:
            if not done and operation is not None:
                op = api.get_operation(operation, project=handle.project, zone=handle.zone)
                done, ended_at = op.done, op.ended_at
                if op.failure is not None:
                    # A create cut short by a delete ends ABORTED (or CANCELLED); a stockout's node is gone too, but
                    # that is RESOURCE_EXHAUSTED: another zone may have capacity.
                    gone = api.get_node(handle.project, handle.zone, handle.node_id)
                    cut = op.failure.code in ("ABORTED", "CANCELLED")
                    if cut and (gone is None or gone.state.name == "DELETING"):
                        raise vanished(handle, f"its create operation ended {op.failure.code}")
                    raise explain(
                        op.failure, f"create TPU node {handle.node_id}", project=handle.project, zone=handle.zone
                    )
            node = api.get_node(handle.project, handle.zone, handle.node_id)
            if node is None and last == "READY":  # up, then gone: its job may have ended it (the watch sees it)
                return ended_at
            if node is None and seen and not done:  # there, then gone while its create is still under way
                if missing:  # its operation read again since, and still not ended: deleted, not a stockout
                    raise vanished(handle, "it is gone before its create operation ended")
                missing = True  # a stockout also ends the node, with its operation: read that again, a poll later
                time.sleep(min(self.ctx.poll_s, 1.0))
                continue
            seen, missing = seen or node is not None, False
            state = node.state.name if node is not None else ("CREATED" if done else "PENDING")
            if state != last:
                say(f"node {handle.node_id}: {state} ({time.monotonic() - t0:.0f}s)")
                last = state
            if state == "DELETING":
                raise vanished(handle, "it is DELETING")
            if (state == "READY" and done) or (done and node is None):
                # Created. READY may come before the create's operation ends: its end (when billing starts) is read on
                # for. A job short enough may already have deleted its node: the watch sees it.
                return ended_at
            if state in ("PREEMPTED", "TERMINATED"):
                raise Preempted(
                    f"node {handle.node_id} was {state} as soon as it was created",
                    hint="Spot capacity is short here: list more zones, or drop accelerator.spot",
                )
            if state in ("STOPPED", "STOPPING"):
                raise BackendError(f"node {handle.node_id} went {state} while being created")
            if time.time() > deadline:
                # A slow create is waited for, not failed: only the run's own deadline (max_runtime) ends the wait.
                raise BackendError(
                    f"node {handle.node_id} was not READY when the run's max_runtime ran out",
                    hint="raise teardown.max_runtime, or list other zones",
                )
            time.sleep(min(self.ctx.poll_s, 1.0 + (time.monotonic() - t0) / 10))

    def discard(self, handle: NodeHandle) -> None:
        """Delete what this attempt created, and only that: a node carrying this run's nonce."""
        try:
            with signals_deferred(self.ctx.say):  # a second Ctrl-C must not leave the half-created node behind
                node = self.ctx.api.get_node(handle.project, handle.zone, handle.node_id)
                if node is not None and labels.owned(dict(node.labels), handle.nonce):
                    self.ctx.delete(self.deletion(handle), announce=False)
        except BackendError as exc:
            self.ctx.say(
                f"warning: could not make sure {self.what(handle)} in {handle.zone} is deleted: {exc}; "
                "`runner down RUN` or `runner gc` will"
            )

    # -- read, delete ---------------------------------------------------------------------------------------------

    def observe(self, handle: NodeHandle) -> tuple[MachineState, str | None]:
        node = self.ctx.api.get_node(handle.project, handle.zone, handle.node_id)
        return machine_state(node), None if node is None else str(node.state.name)

    def owns(self, handle: NodeHandle) -> bool:
        node = self.ctx.api.get_node(handle.project, handle.zone, handle.node_id)
        return owned_or_gone(labels_of(node), handle.nonce)

    @staticmethod
    def what(handle: NodeHandle) -> str:
        return f"TPU node {handle.node_id}"

    @staticmethod
    def delete_hint(handle: NodeHandle) -> str:
        return (
            f"delete it yourself: gcloud compute tpus tpu-vm delete {handle.node_id} --zone={handle.zone} "
            f"--project={handle.project}"
        )

    def deletion(self, handle: NodeHandle) -> Deletion:
        api, where = self.ctx.api, dict(project=handle.project, zone=handle.zone)

        def state() -> str | None:
            node = api.get_node(handle.project, handle.zone, handle.node_id)
            return None if node is None else str(node.state.name)

        return Deletion(
            what=self.what(handle),
            zone=handle.zone,
            hint=self.delete_hint(handle),
            check=f"gcloud compute tpus tpu-vm describe {handle.node_id} --zone={handle.zone}",
            read_state=state,
            request=lambda: api.delete_node(handle.project, handle.zone, handle.node_id),
            outcome=lambda op: self.ctx.outcome(op, self.what(handle), **where),
        )

    def teardown(self, handle: NodeHandle, *, grace_s: float, wait_s: float) -> bool:
        return self.ctx.delete(self.deletion(handle), announce=True, wait_s=wait_s)
