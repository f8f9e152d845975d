"""Queued resources: requests for nodes that wait in a queue until the zone can provide them.

States (the API's QueuedResourceState.State; cloud.google.com/tpu/docs/queued-resources):
  CREATING -> WAITING_FOR_RESOURCES, or ACCEPTED with the older API (queue style "accepted"): the create operation
      is done here, and the request waits while the zone is stocked out or before its validAfter time
  -> PROVISIONING: its nodes are created (they never meet a stockout: the queue waited it out)
  -> ACTIVE once they are all READY.
  valid-until passed while waiting -> FAILED (code 8); a node it would create exists -> FAILED (ALREADY_EXISTS);
  the queued_fails fault -> FAILED with the fault's status and message.
  A node preempted or deleted -> SUSPENDING; no node left -> SUSPENDED. A preempted node is deleted by the service.
  FAILED and SUSPENDED stay until the queued resource is deleted ("the request remains in the queue until it is
  explicitly deleted"); deleting one that still has nodes needs force=true, which deletes them first.
Node specs give a nodeId, or multisliceParams {nodeCount, nodeIdPrefix} for nodes <prefix>-0 ... <prefix>-N-1
(prefix: the queued resource's id when absent); the two are a oneof, so codec.parse_body refuses both. The slices
of a multislice are created together, and each VM's tpu-env says which slice it is (resources.Node.slice).

Every step is on the agenda with `wake`: a queued resource provisions, and its nodes boot, whether or not anyone
reads it.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from runner.plan import catalog
from tpu_emulator import codec, validate
from tpu_emulator.errors import ApiError, already_exists, invalid, not_found
from tpu_emulator.resources import Node, Operation, QueuedResource

if TYPE_CHECKING:
    from tpu_emulator.state import After, Cloud

_WAITING = ("ACCEPTED", "WAITING_FOR_RESOURCES")


class QueuedResources:
    def __init__(self, cloud: Cloud, style: str, *, step_s: float) -> None:
        if style not in ("waiting", "accepted"):
            raise ValueError(f"queue style must be 'waiting' or 'accepted', not {style!r}")
        self.cloud = cloud
        self.waiting_state = "ACCEPTED" if style == "accepted" else "WAITING_FOR_RESOURCES"
        self.step_s = step_s
        self.items: dict[str, QueuedResource] = {}

    # -- create -------------------------------------------------------------------------------------------------

    def create(self, project: str, zone: str, qr_id: str | None, spec: dict[str, Any]) -> Operation:
        problems = validate.check_id(qr_id, "queued_resource_id", "queued resource")
        parent = f"projects/{project}/locations/{zone}"
        node_specs = (spec.get("tpu") or {}).get("nodeSpec") or []
        if not node_specs:
            problems.append(("queued_resource.tpu.node_spec", "tpu.nodeSpec is required: the node(s) to create."))
        planned: list[tuple[str, dict[str, Any], tuple[int, int] | None, catalog.AcceleratorType]] = []
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
                prefix = multi.get("nodeIdPrefix") or qr_id or ""
                problems += validate.check_id(prefix, f"{where}.multislice_params.node_id_prefix", "node")
                slices: list[tuple[str, tuple[int, int] | None]] = [(f"{prefix}-{k}", (k, count)) for k in range(count)]
            else:
                problems += validate.check_id(node_spec.get("nodeId"), f"{where}.node_id", "node")
                slices = [(node_spec.get("nodeId") or "", None)]
            if accel is not None:
                planned += [(node_id, node, part, accel) for node_id, part in slices]
        if len({node_id for node_id, *_ in planned}) < len(planned):
            problems.append(("queued_resource.tpu.node_spec", "Two node specs name the same node."))
        if problems or qr_id is None:
            raise invalid(problems)
        cloud = self.cloud
        with cloud.lock:
            qr = QueuedResource(project, zone, qr_id, spec, [(n, s, m) for n, s, m, _ in planned])
            qr.created = cloud.agenda.wall()
            if qr.name in self.items:
                raise already_exists(qr.name)
            for node_id, *_ in planned:
                if f"{parent}/nodes/{node_id}" in cloud.nodes:
                    raise already_exists(f"{parent}/nodes/{node_id}")
            self.items[qr.name] = qr
            op = cloud.new_op(project, zone, "create", qr.name, codec.QUEUED_RESOURCE_TYPE)
            accels = {node_id: accel for node_id, _, _, accel in planned}
            cloud.agenda.at(self.step_s, lambda: self._accept(qr, op, accels), wake=True)
            return op

    def _accept(self, qr: QueuedResource, op: Operation, accels: dict[str, catalog.AcceleratorType]) -> None:
        accepted = self.items.get(qr.name) is qr and qr.state == "CREATING"
        if accepted:
            qr.state = self.waiting_state  # before the operation's response is rendered from it
        self.cloud.finish_op(op, response={"@type": codec.QUEUED_RESOURCE_TYPE, **qr.to_json()})
        if accepted:
            self.cloud.agenda.at(self.step_s, lambda: self._try(qr, accels), wake=True)

    def _try(self, qr: QueuedResource, accels: dict[str, catalog.AcceleratorType]) -> None:
        cloud = self.cloud
        if self.items.get(qr.name) is not qr or qr.state not in _WAITING:
            return
        not_before, not_after = qr.window()
        now = cloud.agenda.wall()
        if not_after is not None and now > not_after:
            qr.state, qr.initiator = "FAILED", "SERVICE"
            qr.error = ApiError(
                "RESOURCE_EXHAUSTED",
                f"The queued resource {qr.name} could not be provisioned before its valid-until time.",
            ).rpc_status()
            return
        failure = cloud.faults.take("queued_fails", zone=qr.zone)
        if failure is not None:
            qr.state, qr.initiator = "FAILED", "SERVICE"
            status = failure.status if failure.status is not None else "INTERNAL"
            text = failure.message or f"The queued resource {qr.name} could not be provisioned."
            qr.error = ApiError.of(status, text).rpc_status()
            return
        if (not_before is not None and now < not_before) or cloud.faults.take("stockout", zone=qr.zone):
            qr.state = self.waiting_state
            cloud.agenda.at(self.step_s * 2, lambda: self._try(qr, accels), wake=True)
            return
        parent = f"projects/{qr.project}/locations/{qr.zone}"
        taken = [node_id for node_id, _, _ in qr.planned if f"{parent}/nodes/{node_id}" in cloud.nodes]
        if taken:
            qr.state, qr.initiator = "FAILED", "SERVICE"
            qr.error = ApiError(
                "ALREADY_EXISTS", f"Node(s) {', '.join(taken)} that the queued resource would create exist."
            ).rpc_status()
            return
        qr.state = "PROVISIONING"
        for node_id, spec, part in qr.planned:
            cloud.start_node(qr.project, qr.zone, node_id, spec, accels[node_id], queued_resource=qr.name, slice=part)
            qr.node_names.append(f"{parent}/nodes/{node_id}")

    # -- what its nodes do --------------------------------------------------------------------------------------

    def node_ready(self, node: Node) -> None:
        qr = self.items.get(node.queued_resource or "")
        if qr is None or qr.state != "PROVISIONING":
            return
        nodes = self.cloud.nodes
        if all(nodes.get(n) is not None and nodes[n].state == "READY" for n in qr.node_names):
            qr.state = "ACTIVE"

    def node_leaving(self, node: Node, initiator: str) -> None:
        qr = self.items.get(node.queued_resource or "")
        if qr is not None and qr.state in ("PROVISIONING", "ACTIVE"):
            qr.state, qr.initiator = "SUSPENDING", initiator

    def node_gone(self, node: Node) -> None:
        qr = self.items.get(node.queued_resource or "")
        if qr is None or any(n in self.cloud.nodes for n in qr.node_names):
            return
        if qr.state == "DELETING":
            self._finish_delete(qr)
        elif qr.state in ("SUSPENDING", "PROVISIONING", "ACTIVE"):
            qr.state = "SUSPENDED"
            qr.initiator = qr.initiator or "USER"

    # -- read and delete ----------------------------------------------------------------------------------------

    def get(self, name: str) -> QueuedResource:
        with self.cloud.lock:
            found = self.items.get(name)
            if found is None:
                raise not_found(name)
            return found

    def in_zone(self, project: str, zone: str) -> list[QueuedResource]:
        return self.cloud.in_zone(self.items, project, zone)

    def delete(self, name: str, *, force: bool) -> tuple[Operation, After | None]:
        cloud = self.cloud
        with cloud.lock:
            qr = self.get(name)
            existing = [cloud.nodes[n] for n in qr.node_names if n in cloud.nodes]
            if existing and not force:
                raise ApiError(
                    "FAILED_PRECONDITION",
                    f"Queued resource '{name}' is {qr.state} and still has node(s) "
                    f"{', '.join(n.node_id for n in existing)}: delete them first, or delete the queued resource "
                    "with force=true (gcloud: --force).",
                )
            op = cloud.new_op(qr.project, qr.zone, "delete", name, codec.EMPTY_TYPE)
            qr.delete_ops.append(op)
            if qr.state == "DELETING":
                return op, None
            qr.state = "DELETING"
            afters = []
            for node in existing:
                if node.state != "DELETING":
                    _, after = cloud.delete_node_now(node, faults=False)
                    if after is not None:
                        afters.append(after)
            if not existing:
                cloud.agenda.at(cloud.delete_delay_s, lambda: self._finish_delete(qr))

            def run_afters() -> None:
                for after in afters:
                    after()

            return op, run_afters if afters else None

    def _finish_delete(self, qr: QueuedResource) -> None:
        if self.items.get(qr.name) is qr:
            del self.items[qr.name]
        for op in qr.delete_ops:
            self.cloud.finish_op(op, response={"@type": codec.EMPTY_TYPE})
