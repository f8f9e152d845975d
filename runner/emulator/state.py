"""The emulated cloud: nodes, long-running operations and queued resources, and the state machine between them.

Nodes:  CREATING --create_delay_s--> READY --preempt--> PREEMPTED      (a preempted node stays until deleted)
        any --delete--> DELETING --VMs stopped (from delete_delay_s/2 on), delete_delay_s--> gone
        A stockout fails the create operation (code 8) and the node goes away; a quota fault answers 429 at once.
Queued resources:  CREATING -> ACCEPTED -> WAITING_FOR_RESOURCES (while the zone is stocked out) -> PROVISIONING
        (its nodes are created) -> ACTIVE (all READY); a node preempted or deleted -> SUSPENDING, gone -> SUSPENDED;
        valid-until passed while waiting -> FAILED; delete (force=true when nodes exist) -> DELETING -> gone.

Everything is guarded by one lock; slow work (stopping VMs) runs outside it, in threads, after the HTTP answer
that asked for it was sent: a VM that deletes its own node gets its answer before it is killed.
"""

from __future__ import annotations

import copy
import itertools
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from runner import catalog
from runner.emulator import codec, validate
from runner.emulator.errors import ApiError, already_exists, invalid, not_found
from runner.emulator.faults import Faults
from runner.emulator.resources import Node, Operation, QueuedResource, region_of, stockout_message
from runner.emulator.scheduler import Scheduler
from runner.emulator.vm import VmGroup, VmLauncher

_R = TypeVar("_R")
_Zoned = TypeVar("_Zoned", Node, QueuedResource)

After = Callable[[], None]


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
    ) -> None:
        self.faults = faults
        self.launcher = launcher
        self.scheduler = scheduler
        self.create_delay_s = create_delay_s
        self.delete_delay_s = delete_delay_s
        self.vm_grace_s = vm_grace_s
        self.queue_step_s = max(0.02, create_delay_s / 5)
        self.lock = threading.RLock()
        self.nodes: dict[str, Node] = {}
        self.operations: dict[str, Operation] = {}
        self.queued: dict[str, QueuedResource] = {}
        self.closing = threading.Event()
        self._threads: list[threading.Thread] = []
        self._op_seq = itertools.count(1)

    # -- helpers ------------------------------------------------------------------------------------------------

    def _new_op(self, project: str, zone: str, verb: str, target: str, response_type: str) -> Operation:
        suffix = f"operation-{int(time.time() * 1000)}-{next(self._op_seq):04d}-{uuid.uuid4().hex[:12]}"
        op = Operation(f"projects/{project}/locations/{zone}/operations/{suffix}", verb, target, response_type)
        self.operations[op.name] = op
        return op

    @staticmethod
    def _finish_op(
        op: Operation, *, error: dict[str, Any] | None = None, response: dict[str, Any] | None = None
    ) -> None:
        if op.done:
            return
        op.done, op.ended, op.error, op.response = True, time.time(), error, response

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

    # -- nodes --------------------------------------------------------------------------------------------------

    def create_node(self, project: str, zone: str, node_id: str | None, spec: dict[str, Any]) -> Operation:
        problems = validate.check_id(node_id, "node_id", "node")
        accel, more = validate.validate_node(spec, zone)
        problems += more
        if problems or accel is None or node_id is None:
            raise invalid(problems)
        with self.lock:
            name = f"projects/{project}/locations/{zone}/nodes/{node_id}"
            if name in self.nodes:
                raise already_exists(name)
            scheduling = spec.get("schedulingConfig") or {}
            quota = self.faults.take("quota", zone=zone)
            if quota is not None:
                preemptible = bool(scheduling.get("spot") or scheduling.get("preemptible"))
                quota_name = quota.quota or validate.quota_name(accel, preemptible=preemptible)
                where = f"Limit: {quota.limit} in region {region_of(zone)}"
                message = quota.message or f"Quota limit '{quota_name}' has been exceeded. {where}."
                raise ApiError("RESOURCE_EXHAUSTED", message)
            return self._start_node(project, zone, node_id, spec, accel, queued_resource=None)

    def _start_node(
        self,
        project: str,
        zone: str,
        node_id: str,
        spec: dict[str, Any],
        accel: catalog.AcceleratorType,
        *,
        queued_resource: str | None,
        multislice: bool = False,
    ) -> Operation:
        node = Node(project, zone, node_id, spec, accel, queued_resource=queued_resource, multislice=multislice)
        op = self._new_op(project, zone, "create", node.name, codec.NODE_TYPE)
        self.nodes[node.name] = node
        slow = self.faults.take("slow_create", zone=zone)
        # A queued resource waits out a stockout before it creates its nodes.
        stockout = None if queued_resource else self.faults.take("stockout", zone=zone)
        delay = slow.seconds if slow is not None else self.create_delay_s
        message = (stockout.message or stockout_message(zone)) if stockout is not None else None
        self.scheduler.after(delay, lambda: self._finish_create(node, op, message))
        return op

    def _finish_create(self, node: Node, op: Operation, stockout: str | None) -> None:
        with self.lock:
            if op.done or self.closing.is_set():
                return
            if self.nodes.get(node.name) is not node or node.state != "CREATING":
                aborted = ApiError("ABORTED", f"The node {node.name} was deleted while it was being created.")
                self._finish_op(op, error=aborted.rpc_status())
                return
            if stockout is not None:
                del self.nodes[node.name]
                self._finish_op(op, error=ApiError("RESOURCE_EXHAUSTED", stockout).rpc_status())
                return
            node.state, node.health = "READY", "HEALTHY"
            self._finish_op(op, response={"@type": codec.NODE_TYPE, **node.to_json()})
            try:
                node.vms = self.launcher.boot(
                    node.project,
                    node.zone,
                    node.node_id,
                    node.accel.hosts,
                    (node.spec.get("metadata") or {}).get("startup-script"),
                )
            except OSError as exc:
                print(f"[tpu-emulator] could not boot the VMs of {node.name}: {exc}", flush=True)
            self._queued_node_ready(node)

    def get_node(self, name: str) -> Node:
        return self._get(self.nodes, name)

    def list_nodes(self, project: str, zone: str) -> list[Node]:
        return self._in_zone(self.nodes, project, zone)

    def _get(self, table: dict[str, _R], name: str) -> _R:
        with self.lock:
            found = table.get(name)
            if found is None:
                raise not_found(name)
            return found

    def _in_zone(self, table: dict[str, _Zoned], project: str, zone: str) -> list[_Zoned]:
        """What the table holds in project/zone; zone "-" is every zone, as in the real API."""
        with self.lock:
            return [r for r in table.values() if (r.project, r.zone) == (project, zone) or zone == "-"]

    def delete_node(self, name: str) -> tuple[Operation, After | None]:
        with self.lock:
            node = self.get_node(name)
            return self._delete_node(node)

    def _delete_node(self, node: Node) -> tuple[Operation, After | None]:
        op = self._new_op(node.project, node.zone, "delete", node.name, codec.EMPTY_TYPE)
        node.delete_ops.append(op)
        if node.state == "DELETING":
            return op, None
        node.state, node.health = "DELETING", None
        group, node.vms = node.vms, None
        self._queued_node_leaving(node, "USER")
        started = time.monotonic()
        return op, lambda: self.spawn(self._run_delete, node, group, started)

    def _run_delete(self, node: Node, group: VmGroup | None, started: float) -> None:
        # The VMs shut down a moment into the deletion, as on Cloud TPU: a VM that asked for it has read the answer.
        self.closing.wait(min(1.0, self.delete_delay_s / 2))
        if group is not None:
            group.stop(self.vm_grace_s)
        self.closing.wait(max(0.0, self.delete_delay_s - (time.monotonic() - started)))
        with self.lock:
            if self.nodes.get(node.name) is node:
                del self.nodes[node.name]
            for op in node.delete_ops:
                self._finish_op(op, response={"@type": codec.EMPTY_TYPE})
            self._queued_node_gone(node)

    def preempt(self, name: str) -> VmGroup | None:
        """READY -> PREEMPTED; returns the node's VMs, which the caller stops."""
        with self.lock:
            node = self.get_node(name)
            if node.state != "READY":
                raise ApiError("FAILED_PRECONDITION", f"{name} is {node.state}: only a READY node can be preempted")
            node.state, node.health = "PREEMPTED", None
            group, node.vms = node.vms, None
            self._queued_node_leaving(node, "SERVICE")
            return group

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

    # -- queued resources ---------------------------------------------------------------------------------------

    def create_queued_resource(self, project: str, zone: str, qr_id: str | None, spec: dict[str, Any]) -> Operation:
        problems = validate.check_id(qr_id, "queued_resource_id", "queued resource")
        parent = f"projects/{project}/locations/{zone}"
        node_specs = (spec.get("tpu") or {}).get("nodeSpec") or []
        if not node_specs:
            problems.append(("queued_resource.tpu.node_spec", "tpu.nodeSpec is required: the node(s) to create."))
        planned: list[tuple[str, dict[str, Any], bool, catalog.AcceleratorType]] = []
        for i, node_spec in enumerate(node_specs):
            where = f"queued_resource.tpu.node_spec[{i}]"
            if node_spec.get("parent") != parent:
                problems.append(
                    (f"{where}.parent", f"nodeSpec parent must be {parent}; got {node_spec.get('parent')!r}.")
                )
            node = copy.deepcopy(node_spec.get("node") or {})
            if "spot" in spec:
                node.setdefault("schedulingConfig", {})["spot"] = True
            accel, more = validate.validate_node(node, zone, f"{where}.node")
            problems += more
            multi = node_spec.get("multisliceParams")
            if multi is not None:
                count = int(multi.get("nodeCount", 0))
                if count < 2:
                    problems.append((f"{where}.multislice_params.node_count", "nodeCount must be greater than 1."))
                ids = [f"{multi.get('nodeIdPrefix') or qr_id}-{k}" for k in range(count)]
            else:
                problems += validate.check_id(node_spec.get("nodeId"), f"{where}.node_id", "node")
                ids = [node_spec.get("nodeId") or ""]
            if accel is not None:
                planned += [(node_id, node, multi is not None, accel) for node_id in ids]
        if problems or qr_id is None:
            raise invalid(problems)
        with self.lock:
            qr = QueuedResource(project, zone, qr_id, spec, [(n, s, m) for n, s, m, _ in planned])
            if qr.name in self.queued:
                raise already_exists(qr.name)
            for node_id, *_ in planned:
                if f"{parent}/nodes/{node_id}" in self.nodes:
                    raise already_exists(f"{parent}/nodes/{node_id}")
            self.queued[qr.name] = qr
            op = self._new_op(project, zone, "create", qr.name, codec.QUEUED_RESOURCE_TYPE)
            accels = {node_id: accel for node_id, _, _, accel in planned}
            self.scheduler.after(self.queue_step_s, lambda: self._queued_accept(qr, op, accels))
            return op

    def _queued_accept(self, qr: QueuedResource, op: Operation, accels: dict[str, catalog.AcceleratorType]) -> None:
        with self.lock:
            accepted = self.queued.get(qr.name) is qr and qr.state == "CREATING"
            if accepted:
                qr.state = "ACCEPTED"  # before the operation's response is rendered from it
            self._finish_op(op, response={"@type": codec.QUEUED_RESOURCE_TYPE, **qr.to_json()})
            if accepted:
                self.scheduler.after(self.queue_step_s, lambda: self._queued_try(qr, accels))

    def _queued_try(self, qr: QueuedResource, accels: dict[str, catalog.AcceleratorType]) -> None:
        with self.lock:
            if self.queued.get(qr.name) is not qr or qr.state not in ("ACCEPTED", "WAITING_FOR_RESOURCES"):
                return
            not_before, not_after = qr.window()
            now = time.time()
            if not_after is not None and now > not_after:
                qr.state, qr.initiator = "FAILED", "SERVICE"
                qr.error = ApiError(
                    "RESOURCE_EXHAUSTED",
                    f"The queued resource {qr.name} could not be provisioned before its valid-until time.",
                ).rpc_status()
                return
            retry = self.queue_step_s * 2
            if (not_before is not None and now < not_before) or self.faults.take("stockout", zone=qr.zone):
                qr.state = "WAITING_FOR_RESOURCES"
                self.scheduler.after(retry, lambda: self._queued_try(qr, accels))
                return
            parent = f"projects/{qr.project}/locations/{qr.zone}"
            if any(f"{parent}/nodes/{node_id}" in self.nodes for node_id, _, _ in qr.planned):
                qr.state, qr.initiator = "FAILED", "SERVICE"
                qr.error = ApiError("ALREADY_EXISTS", "A node the queued resource would create exists.").rpc_status()
                return
            qr.state = "PROVISIONING"
            for node_id, spec, multislice in qr.planned:
                self._start_node(
                    qr.project, qr.zone, node_id, spec, accels[node_id], queued_resource=qr.name, multislice=multislice
                )
                qr.node_names.append(f"{parent}/nodes/{node_id}")

    def _queued_node_ready(self, node: Node) -> None:
        qr = self.queued.get(node.queued_resource or "")
        if qr is None or qr.state != "PROVISIONING":
            return
        if all(self.nodes.get(n) is not None and self.nodes[n].state == "READY" for n in qr.node_names):
            qr.state = "ACTIVE"

    def _queued_node_leaving(self, node: Node, initiator: str) -> None:
        qr = self.queued.get(node.queued_resource or "")
        if qr is not None and qr.state in ("PROVISIONING", "ACTIVE"):
            qr.state, qr.initiator = "SUSPENDING", initiator

    def _queued_node_gone(self, node: Node) -> None:
        qr = self.queued.get(node.queued_resource or "")
        if qr is None or any(n in self.nodes for n in qr.node_names):
            return
        if qr.state == "DELETING":
            self._queued_finish_delete(qr)
        elif qr.state in ("SUSPENDING", "PROVISIONING", "ACTIVE"):
            qr.state = "SUSPENDED"
            qr.initiator = qr.initiator or "USER"

    def _queued_finish_delete(self, qr: QueuedResource) -> None:
        with self.lock:
            if self.queued.get(qr.name) is qr:
                del self.queued[qr.name]
            for op in qr.delete_ops:
                self._finish_op(op, response={"@type": codec.EMPTY_TYPE})

    def get_queued_resource(self, name: str) -> QueuedResource:
        return self._get(self.queued, name)

    def list_queued_resources(self, project: str, zone: str) -> list[QueuedResource]:
        return self._in_zone(self.queued, project, zone)

    def delete_queued_resource(self, name: str, *, force: bool) -> tuple[Operation, After | None]:
        with self.lock:
            qr = self.get_queued_resource(name)
            existing = [self.nodes[n] for n in qr.node_names if n in self.nodes]
            if existing and not force:
                raise ApiError(
                    "FAILED_PRECONDITION",
                    f"Queued resource '{name}' is {qr.state} and still has node(s) "
                    f"{', '.join(n.node_id for n in existing)}: delete them first, or delete the queued resource "
                    "with force=true (gcloud: --force).",
                )
            op = self._new_op(qr.project, qr.zone, "delete", name, codec.EMPTY_TYPE)
            qr.delete_ops.append(op)
            if qr.state == "DELETING":
                return op, None
            qr.state = "DELETING"
            afters = [after for n in existing if n.state != "DELETING" for _, after in [self._delete_node(n)] if after]
            if not existing:
                self.scheduler.after(self.delete_delay_s, lambda: self._queued_finish_delete(qr))
            return op, (lambda: [after() for after in afters]) if afters else None

    # -- all of it ----------------------------------------------------------------------------------------------

    def forget_all(self) -> None:
        """Forget every resource; the VMs are the launcher's to stop."""
        with self.lock:
            for node in self.nodes.values():
                node.vms = None
            self.nodes.clear()
            self.operations.clear()
            self.queued.clear()
