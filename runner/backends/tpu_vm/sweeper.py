"""The TPU VM backend's part of `runner gc`: runner-labelled nodes and queued resources, zone by zone.

A queued resource is judged and deleted as a whole (with force: its node goes with it); its node is never listed on
its own. FAILED and SUSPENDED queued resources never provision, PREEMPTED, TERMINATED and STOPPED nodes never run
the job again: those are orphaned whatever their run says. A queued resource's run directory is read only once it
is ACTIVE (before, nothing runs that could say anything).
"""

from __future__ import annotations

from typing import Any

from runner import contract
from runner.backends import labels
from runner.backends.sweep import Found, ZonalSweep
from runner.backends.tpu_vm.api import TpuApi
from runner.plan import catalog

_DEAD_NODE_STATES = {"PREEMPTED", "TERMINATED", "STOPPED"}
_DEAD_QUEUED_STATES = {"FAILED", "SUSPENDED"}


def _seconds(ts: Any) -> float | None:
    try:
        return float(ts.timestamp()) if ts else None
    except (AttributeError, ValueError):
        return None


def found_node(node: Any, zone: str) -> Found:
    state = str(node.state.name)
    return Found(
        kind="node",
        name=str(node.name),
        location=zone,
        state=state,
        labels=dict(node.labels),
        created_at=_seconds(node.create_time),
        run_dir=dict(node.metadata).get(contract.RUN_DIR_METADATA),
        dead=f"it is {state} and can never run the job again" if state in _DEAD_NODE_STATES else None,
        going=state == "DELETING",
    )


def found_queued(qr: Any, zone: str) -> Found | None:
    specs = list(qr.tpu.node_spec) if qr.tpu else []
    found_labels = dict(specs[0].node.labels) if specs else {}
    if not labels.managed(found_labels):
        return None
    state = str(qr.state.state.name) if qr.state else "STATE_UNSPECIFIED"
    return Found(
        kind="queued resource",
        name=str(qr.name),
        location=zone,
        state=state,
        labels=found_labels,
        created_at=_seconds(qr.create_time),
        run_dir=dict(specs[0].node.metadata).get(contract.RUN_DIR_METADATA) if specs else None,
        dead=f"it is {state}: it will never provision" if state in _DEAD_QUEUED_STATES else None,
        judge=state == "ACTIVE",
        going=state == "DELETING",
    )


class TpuVmSweep(ZonalSweep):
    backend = "tpu-vm"

    def __init__(self, api: TpuApi) -> None:
        self.api = api

    def locations(self) -> set[str]:
        return {z for t in catalog.all_types() if "tpu-vm" in t.generation.backends for z in t.zones}

    def scan(self, project: str, location: str) -> list[Found]:
        zone = location  # its locations are zones
        queued = [
            found
            for qr in self.api.list_queued_resources(project, zone)
            if (found := found_queued(qr, zone)) is not None
        ]
        held = {q.name for q in queued}
        nodes = [
            found_node(node, zone)
            for node in self.api.list_nodes(project, zone)
            if node.queued_resource not in held  # judged, and deleted, with its queued resource
            and labels.managed(dict(node.labels))
        ]
        return nodes + queued

    def api_now(self) -> float | None:
        return self.api.clock.now()

    def request_delete(self, project: str, found: Found) -> str | None:
        if found.kind == "node":
            return self.api.delete_node(project, found.location, found.short_name)
        return self.api.delete_queued_resource(found.name, project=project, zone=found.location)

    def outcome(self, project: str, found: Found, operation: str) -> tuple[bool, str | None]:
        op = self.api.get_operation(operation, project=project, zone=found.location)
        return op.done, op.failure.said() if op.failure is not None else None

    def exists(self, project: str, found: Found) -> bool:
        if found.kind == "node":
            return self.api.get_node(project, found.location, found.short_name) is not None
        return self.api.get_queued_resource(found.name, project=project, zone=found.location) is not None
