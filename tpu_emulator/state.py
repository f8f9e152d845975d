"""The emulated cloud: nodes and long-running operations, and the state machine between them (queued resources
are in tpu_emulator.queued).

Nodes:  CREATING --create delay--> READY (VMs boot)          --preempt--> PREEMPTED (stays until deleted)
        READY --stop--> STOPPING (VMs stopped) --delete delay--> STOPPED (stays until deleted)
        READY --maintain--> REPAIRING, HIDDEN, UNKNOWN ... (VMs go on) --seconds--> READY
        CREATING --create delay--> gone, operation failed    (stockout, or a quota fault reported in the operation)
        any --delete--> DELETING --VMs stopped, delete delay--> gone
        READY --delete (delete_fails fault)--> DELETING --delete delay--> READY again, VMs never stopped,
                                                                            the delete operation failed
Operations are never done in the answer that starts them (the lock is held from the request to its answer, and
every transition is due later). The error of a failed create or delete is only in its operation: a client that
never reads the operation sees the node vanish (or come back READY) and never learns why.

Time (see tpu_emulator.scheduler): every transition is due at a time and is applied by the first read after
it, or on time by the scheduler for the ones marked `wake`:
- on time alone: a create's end (READY and the VMs boot, so a node whose runner died while it was CREATING still
  comes up and runs its job, as on Cloud TPU; or the node gone, for a failed create), stopping the VMs of a
  deleted node, a preempted queued node's deletion by the service, and what a queued resource does
  (tpu_emulator.queued);
- at the first read after their time: the end of a deletion (the node gone, or back after a failed one, and the
  delete operation done). Nothing outside the API can see these before someone reads, so reads suffice.
An operation turns done in the transition that ends its work, with a response or a google.rpc.Status error.

Everything is guarded by one lock; slow work (stopping VMs) runs outside it, in threads, after the HTTP answer
that asked for it was sent: a VM that deletes its own node gets its answer before it is killed.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from runner.backends.local.backend import free_ports
from runner.plan import catalog
from tpu_emulator import codec, errors, validate
from tpu_emulator.errors import ApiError, already_exists, invalid, not_found
from tpu_emulator.faults import OTHER_RUN_LABELS, Faults
from tpu_emulator.queued import QueuedResources
from tpu_emulator.resources import Node, Operation, QueuedResource, region_of
from tpu_emulator.scheduler import Agenda, Scheduler
from tpu_emulator.stderr import note
from tpu_emulator.vm import VmGroup, VmLauncher

_R = TypeVar("_R")
_Zoned = TypeVar("_Zoned", Node, QueuedResource)

After = Callable[[], None]
QueueStyle = Literal["waiting", "accepted"]


class Cloud:
    def __init__(
        self,
        *,
        faults: Faults,
        launcher: VmLauncher,
        scheduler: Scheduler,
        create_delay_s: float,
        delete_delay_s: float,
        vm_grace_s: float,
        queue_style: QueueStyle = "waiting",
    ) -> None:
        self.faults = faults
        self.launcher = launcher
        self.create_delay_s = create_delay_s
        self.delete_delay_s = delete_delay_s
        self.vm_grace_s = vm_grace_s
        self.lock = threading.RLock()
        self._maintained: dict[str, Callable[[], None]] = {}  # node -> what makes it READY after maintain
        self.agenda = Agenda(scheduler, self.lock)
        self.nodes: dict[str, Node] = {}
        self.operations: dict[str, Operation] = {}
        self.queued = QueuedResources(self, queue_style, step_s=max(0.02, create_delay_s / 5))
        self.closing = threading.Event()
        self._threads: list[threading.Thread] = []
        self._op_seq = itertools.count(1)
        self._coordinators: dict[str, str] = {}  # multislice queued resource -> its slices' JAX coordinator
        self._last_coordinator: dict[str, str] = {}  # node or queued resource -> the coordinator its last boot had

    # -- helpers ------------------------------------------------------------------------------------------------

    def settle(self) -> None:
        """Bring the state up to now: what every read does first (the lock must be held)."""
        if not self.closing.is_set():
            self.agenda.settle()

    def new_op(self, project: str, zone: str, verb: str, target: str, response_type: str) -> Operation:
        suffix = f"operation-{int(time.time() * 1000)}-{next(self._op_seq):04d}-{uuid.uuid4().hex[:12]}"
        name = f"projects/{project}/locations/{zone}/operations/{suffix}"
        op = Operation(name, verb, target, response_type, created=self.agenda.wall())
        self.operations[op.name] = op
        return op

    def finish_op(
        self, op: Operation, *, error: dict[str, Any] | None = None, response: dict[str, Any] | None = None
    ) -> None:
        if op.done:
            return
        op.done, op.ended, op.error, op.response = True, self.agenda.wall(), error, response

    def spawn(self, fn: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=fn, args=args, daemon=True)
        with self.lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def join_threads(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))

    def _get(self, table: dict[str, _R], name: str) -> _R:
        with self.lock:
            found = table.get(name)
            if found is None:
                raise not_found(name)
            return found

    def in_zone(self, table: dict[str, _Zoned], project: str, zone: str) -> list[_Zoned]:
        """What the table holds in project/zone; zone "-" is every zone, as in the real API."""
        with self.lock:
            return [r for r in table.values() if (r.project, r.zone) == (project, zone) or zone == "-"]

    # -- creating nodes -----------------------------------------------------------------------------------------

    def create_node(self, project: str, zone: str, node_id: str | None, spec: dict[str, Any]) -> Operation:
        problems = validate.check_id(node_id, "node_id", "node")
        accel, more = validate.validate_node(spec, zone)
        problems += more
        if problems or accel is None or node_id is None:
            raise invalid(problems)
        with self.lock:
            name = f"projects/{project}/locations/{zone}/nodes/{node_id}"
            if name not in self.nodes:
                collision = self.faults.take("collision", zone=zone, node=node_id)
                if collision is not None:
                    # Someone else got the name first: their node, labelled as their run, running nothing of ours.
                    # Not the request's labels: another run's node carries nothing that is unique to this request.
                    labels = dict(collision.labels or OTHER_RUN_LABELS)
                    other = {"acceleratorType": accel.name, "runtimeVersion": spec["runtimeVersion"], "labels": labels}
                    self.insert_node(project, zone, node_id, other)
                    raise already_exists(name, collision.message)
            if name in self.nodes:
                raise already_exists(name)
            failure = None
            quota = self.faults.take("quota", zone=zone, node=node_id)
            if quota is not None:
                scheduling = spec.get("schedulingConfig") or {}
                preemptible = bool(scheduling.get("spot") or scheduling.get("preemptible"))
                quota_name = quota.quota or validate.quota_name(accel, preemptible=preemptible)
                error = errors.quota_exceeded(
                    project, region_of(zone), quota_name, quota.limit, message=quota.message, reason=quota.reason
                )
                if not quota.in_operation:
                    raise error
                failure = error.rpc_status()
            return self.start_node(project, zone, node_id, spec, accel, queued_resource=None, failure=failure)

    def start_node(
        self,
        project: str,
        zone: str,
        node_id: str,
        spec: dict[str, Any],
        accel: catalog.AcceleratorType,
        *,
        queued_resource: str | None,
        slice: tuple[int, int] | None = None,
        failure: dict[str, Any] | None = None,
    ) -> Operation:
        node = Node(project, zone, node_id, spec, accel, queued_resource=queued_resource, slice=slice)
        node.created = self.agenda.wall()
        op = self.new_op(project, zone, "create", node.name, codec.NODE_TYPE)
        self.nodes[node.name] = node
        slow = self.faults.take("slow_create", zone=zone, node=node_id)
        # A queued resource waits out a stockout before it creates its nodes: they never meet one.
        stockout = None if queued_resource or failure else self.faults.take("stockout", zone=zone, node=node_id)
        if stockout is not None:
            failure = errors.stockout(zone, accel.name, message=stockout.message, reason=stockout.reason).rpc_status()
        hang = failure is None and self.faults.take("boot_hang", zone=zone, node=node_id) is not None
        skew = self.faults.take("clock_skew", zone=zone, node=node_id)
        node.clock_skew_s = int(skew.seconds or 0) if skew is not None else 0
        delay = slow.seconds if slow is not None and slow.seconds is not None else self.create_delay_s
        late = self.faults.take("late_operation", zone=zone, node=node_id)
        lag = (late.seconds or 0.0) if late is not None else 0.0
        self.agenda.at(delay, lambda: self._finish_create(node, op, failure, hang, lag), wake=True)
        return op

    def _finish_create(
        self, node: Node, op: Operation, failure: dict[str, Any] | None, hang: bool, lag: float = 0.0
    ) -> None:
        if op.done:
            return
        if self.nodes.get(node.name) is not node or node.state != "CREATING":
            aborted = ApiError("ABORTED", f"The node {node.name} was deleted while it was being created.")
            self.finish_op(op, error=aborted.rpc_status())
            return
        if failure is not None:
            del self.nodes[node.name]
            self.finish_op(op, error=failure)
            return
        node.state, node.health = "READY", "HEALTHY"
        response = {"@type": codec.NODE_TYPE, **node.to_json()}
        if lag:  # the late_operation fault: READY while the create is still under way
            self.agenda.at(lag, lambda: self.finish_op(op, response=response), wake=True)
        else:
            self.finish_op(op, response=response)
        self._boot(node, hang=hang)
        self.queued.node_ready(node)

    def _boot(self, node: Node, *, hang: bool = False) -> None:
        script = (node.spec.get("metadata") or {}).get("startup-script")
        try:
            if hang:
                node.hung = True
                self.launcher.hang(node.project, node.zone, node.node_id, node.accel.hosts, script is not None)
            else:
                node.vms = self.launcher.boot(
                    node.project,
                    node.zone,
                    node.node_id,
                    node.accel.hosts,
                    script,
                    self._coordinator(node),
                    clock_skew_s=node.clock_skew_s,
                )
        except OSError as exc:
            note(f"[tpu-emulator] could not boot the VMs of {node.name}: {exc}")

    def _coordinator(self, node: Node) -> str | None:
        """The JAX coordinator address the VMs of a multi-host node share, and with it every slice of the same
        multislice queued resource (one cluster over all of them); None for a single host. Reserved afresh for
        every boot (a multislice's once its slices are all gone): a recreated slice never meets the old one."""
        if node.accel.hosts == 1 and node.slice is None:
            return None
        group = node.queued_resource if node.slice is not None and node.queued_resource else node.name
        if group not in self._coordinators:
            before = self._last_coordinator.get(group)
            fresh = next(a for a in (f"127.0.0.1:{port}" for port in free_ports(2)) if a != before)
            self._coordinators[group] = self._last_coordinator[group] = fresh
        coordinator = self._coordinators[group]
        if group == node.name:  # a plain node's VMs boot together: the next boot reserves its own
            del self._coordinators[group]
        return coordinator

    def _leaving(self, node: Node, initiator: str) -> None:
        """A node is preempted or being deleted: its queued resource hears of it, and a multislice's cluster ends
        with it (every slice restarts)."""
        self._coordinators.pop(node.queued_resource or "", None)
        self.queued.node_leaving(node, initiator)

    def insert_node(self, project: str, zone: str, node_id: str, spec: dict[str, Any]) -> Node:
        """A READY node that is simply there (no operation): someone else's, or one made before the test began.
        It runs its startup-script, if it has one, like any READY node."""
        problems = validate.check_id(node_id, "node_id", "node")
        accel, more = validate.validate_node(spec, zone)
        problems += more
        if problems or accel is None:
            raise invalid(problems)
        with self.lock:
            node = Node(project, zone, node_id, spec, accel, state="READY", health="HEALTHY")
            if node.name in self.nodes:
                raise already_exists(node.name)
            node.created = self.agenda.wall()
            self.nodes[node.name] = node
            self._boot(node)
            return node

    # -- reading nodes ------------------------------------------------------------------------------------------

    def get_node(self, name: str) -> Node:
        return self._get(self.nodes, name)

    def list_nodes(self, project: str, zone: str) -> list[Node]:
        return self.in_zone(self.nodes, project, zone)

    # -- deleting nodes -----------------------------------------------------------------------------------------

    def delete_node(self, name: str) -> tuple[Operation, After | None]:
        with self.lock:
            return self.delete_node_now(self.get_node(name), faults=True)

    def delete_node_now(self, node: Node, *, faults: bool, initiator: str = "USER") -> tuple[Operation, After | None]:
        """Start deleting `node`; returns the operation and what to do once the answer is sent (stop the VMs).
        `faults`: whether delete faults may apply (not to deletions a queued resource makes)."""
        op = self.new_op(node.project, node.zone, "delete", node.name, codec.EMPTY_TYPE)
        if node.state == "DELETING":
            node.delete_ops.append(op)  # the deletion in progress decides for this operation too
            return op, None
        fail = slow = None
        if faults:
            # A create in flight always yields to a deletion: only a node that exists can refuse to go.
            if node.state != "CREATING":
                fail = self.faults.take("delete_fails", zone=node.zone, node=node.node_id)
            slow = self.faults.take("slow_delete", zone=node.zone, node=node.node_id)
        delay = next((f.seconds for f in (slow, fail) if f is not None and f.seconds is not None), self.delete_delay_s)
        node.restore = (node.state, node.health)
        node.state, node.health = "DELETING", None
        node.delete_ops = [op]
        if fail is not None:
            status = fail.status if fail.status is not None else "INTERNAL"
            error = errors.delete_failed(node.name, status, message=fail.message, reason=fail.reason)
            node.delete_error = error.rpc_status()
            self.agenda.at(delay, lambda: self._fail_delete(node))
            return op, None  # the VMs keep running: this deletion will not happen
        node.delete_error = None
        group, node.vms, node.preempted_vms = node.vms or node.preempted_vms, None, None
        node.vms_stopped, node.gone_when_stopped = group is None, False
        self._leaving(node, initiator)
        self.agenda.at(delay, lambda: self._finish_delete(node))
        if group is None:
            return op, None

        def stop_vms_soon() -> None:
            # The VMs shut down a moment into the deletion, as on Cloud TPU: a VM that asked for it has its answer.
            with self.lock:
                self.agenda.at(min(1.0, delay / 2), lambda: self.spawn(self._stop_vms, node, group), wake=True)

        return op, stop_vms_soon

    def _stop_vms(self, node: Node, group: VmGroup) -> None:
        group.stop(self.vm_grace_s)
        with self.lock:
            node.vms_stopped = True
            if node.gone_when_stopped:  # its time has come already: it is gone from now on
                self.agenda.at(0.0, lambda: self._finish_delete(node))

    def _finish_delete(self, node: Node) -> None:
        if self.nodes.get(node.name) is not node:
            return
        if not node.vms_stopped:
            # The operation is done only once nothing of the VMs is left (a VM may ignore SIGTERM for the grace).
            node.gone_when_stopped = True
            return
        del self.nodes[node.name]
        for op in node.delete_ops:
            self.finish_op(op, response={"@type": codec.EMPTY_TYPE})
        self.queued.node_gone(node)

    def _fail_delete(self, node: Node) -> None:
        if self.nodes.get(node.name) is not node or node.state != "DELETING":
            return
        node.state, node.health = node.restore
        for op in node.delete_ops:
            self.finish_op(op, error=node.delete_error)
        node.delete_ops, node.delete_error = [], None
        qr = self.queued.items.get(node.queued_resource or "")
        if qr is not None and qr.state == "DELETING":  # a forced queued-resource deletion joined it: try again
            _, after = self.delete_node_now(node, faults=False)
            if after is not None:
                after()

    def preempt(self, name: str) -> VmGroup | None:
        """READY -> PREEMPTED; returns the node's VMs, which the caller stops. A queued resource's nodes are then
        all deleted by the service, and it goes SUSPENDED (cloud.google.com/tpu/docs/queued-resources: SUSPENDING,
        "the resources associated with the request are currently being deleted"; its slices restart together)."""
        with self.lock:
            node = self.get_node(name)
            if node.state != "READY":
                raise ApiError("FAILED_PRECONDITION", f"{name} is {node.state}: only a READY node can be preempted")
            node.state, node.health = "PREEMPTED", None
            group, node.vms = node.vms, None
            node.preempted_vms = group  # stopped by the caller; a deletion waits for that (VmGroup.stop is shared)
            node.preempted = True  # instance/preempted: TRUE before the soft-off the caller sends
            self._leaving(node, "SERVICE")
            if node.queued_resource:
                qr_name = node.queued_resource
                self.agenda.at(self.delete_delay_s, lambda: self._service_delete(qr_name), wake=True)
            return group

    def stop(self, name: str) -> VmGroup | None:
        """READY -> STOPPING -> STOPPED (after delete_delay_s), as `gcloud compute tpus tpu-vm stop` leaves a node:
        its VMs shut down (the caller stops them, as for a preemption) and it runs nothing until started again."""
        with self.lock:
            node = self.get_node(name)
            if node.state != "READY":
                raise ApiError("FAILED_PRECONDITION", f"{name} is {node.state}: only a READY node can be stopped")
            node.state, node.health = "STOPPING", None
            group, node.vms = node.vms, None
            node.preempted_vms = group  # a deletion waits for them to be gone (VmGroup.stop is shared)

            def stopped() -> None:
                if self.nodes.get(node.name) is node and node.state == "STOPPING":
                    node.state = "STOPPED"

            self.agenda.at(self.delete_delay_s, stopped, wake=True)
            return group

    def maintain(self, name: str, state: str, seconds: float | None) -> None:
        """A state the service gives a READY node for `seconds` (REPAIRING, HIDING, HIDDEN, UNKNOWN ...), then READY
        again; its VMs go on. What a follower can only show: the node says it is not simply READY. `seconds` None:
        until end_maintenance."""
        with self.lock:
            node = self.get_node(name)
            if node.state != "READY":
                raise ApiError("FAILED_PRECONDITION", f"{name} is {node.state}: maintenance needs a READY node")
            node.state = state

            def back() -> None:
                if self.nodes.get(node.name) is node and node.state == state:
                    node.state = "READY"

            self._maintained[name] = back
            if seconds is not None:
                self.agenda.at(seconds, back, wake=True)

    def end_maintenance(self, name: str) -> None:
        """READY again, now, after maintain (unless the node has left its maintenance state since)."""
        with self.lock:
            back = self._maintained.pop(name, None)
            if back is not None:
                back()

    def _service_delete(self, qr_name: str) -> None:
        qr = self.queued.items.get(qr_name)
        for name in qr.node_names if qr is not None else []:
            node = self.nodes.get(name)
            if node is not None and node.state != "DELETING":
                _, stop_vms = self.delete_node_now(node, faults=False, initiator="SERVICE")
                if stop_vms is not None:
                    stop_vms()  # no answer to wait for: the service deletes them

    # -- operations ---------------------------------------------------------------------------------------------

    def get_operation(self, name: str) -> Operation:
        return self._get(self.operations, name)

    def list_operations(self, project: str, zone: str) -> list[Operation]:
        prefix = f"projects/{project}/locations/{zone}/operations/"
        with self.lock:
            return [op for op in self.operations.values() if op.name.startswith(prefix)]

    def delete_operation(self, name: str) -> None:
        with self.lock:
            if self.operations.pop(name, None) is None:
                raise not_found(name)

    # -- all of it ----------------------------------------------------------------------------------------------

    def forget_all(self) -> None:
        """Forget every resource and pending transition; the VMs are the launcher's to stop."""
        with self.lock:
            self.agenda.clear()
            for node in self.nodes.values():
                node.vms = None
            self.nodes.clear()
            self.operations.clear()
            self.queued.items.clear()
