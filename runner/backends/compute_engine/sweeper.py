"""The compute-engine backend's part of `runner gc`: runner-labelled instances, instance groups, and the templates and
workload policies made for the groups, zone by zone.

A group's VMs are judged and deleted with their group, never on their own. Its template (global) and workload policy
(regional) follow it (Found.follows): orphaned with it, deleted after it. They name their group and its zone in their
description (requests.py), which is how a zone's scan finds them; one whose group is gone, or was never made (a
runner killed between the inserts), is judged like a machine: by its labels and its run's state, from the run
directory its template names (a run that started no job within the startup grace, or ended, does not use it).
STOPPED, TERMINATED and SUSPENDED instances never run the job again: orphaned whatever their run says.
"""

from __future__ import annotations

from typing import Any

from runner import contract
from runner.backends import labels
from runner.backends.compute_engine import catalog
from runner.backends.compute_engine.api import ComputeApi, operation_ref, region_of, timestamp
from runner.backends.compute_engine.requests import GROUP, GROUP_ZONE, base_instance_name
from runner.backends.sweep import Found, ZonalSweep

_DEAD = {"STOPPED", "TERMINATED", "SUSPENDED"}
_GOING = {"PENDING_STOP", "STOPPING", "DEPROVISIONING"}
_FILTER = f'labels.{labels.MANAGED} = "{labels.MANAGED_BY}"'


def _items(metadata: Any) -> dict[str, str]:
    return {item.key: item.value for item in (metadata.items if metadata else [])}


class ComputeSweep(ZonalSweep):
    backend = "compute-engine"

    def __init__(self, api: ComputeApi) -> None:
        self.api = api

    def locations(self) -> set[str]:
        return catalog.all_zones()

    def scan(self, project: str, location: str) -> list[Found]:
        from google.cloud import compute_v1

        zone = location  # its locations are zones
        at = (project, zone)
        templates = {
            t.name: t
            for t in self.api.listed("templates", "list", "instance templates", at, project=project)
            if labels.managed(labels.from_description(t.description))
        }
        groups = [
            g
            for g in self.api.listed("groups", "list", "instance groups", at, project=project, zone=zone)
            if labels.managed(labels.from_description(g.description))
        ]
        found = [self._group(g, zone, templates) for g in groups]
        members = tuple(f"{base_instance_name(g.name)}-" for g in groups)
        request = compute_v1.ListInstancesRequest(project=project, zone=zone, filter=_FILTER)
        for vm in self.api.listed("instances", "list", "instances", at, request=request):
            if labels.managed(dict(vm.labels)) and not vm.name.startswith(members or ("\0",)):
                found.append(self._instance(vm, zone))
        policies = self.api.listed("policies", "list", "resource policies", at, project=project, region=region_of(zone))
        # A template names its run directory (its VMs' metadata); its group's policy is judged by the same one.
        run_dirs = {
            labels.from_description(t.description).get(GROUP): _items(t.properties.metadata).get(
                contract.RUN_DIR_METADATA
            )
            for t in templates.values()
        }
        for kind, resource in [("instance template", t) for t in templates.values()] + [
            ("workload policy", p) for p in policies
        ]:
            marks = labels.from_description(resource.description)
            if labels.managed(marks) and marks.get(GROUP_ZONE) == zone:
                run_dir = run_dirs.get(marks.get(GROUP))
                found.append(self._follower(kind, resource, marks, project, zone, run_dir))
        return found

    @staticmethod
    def _instance(vm: Any, zone: str) -> Found:
        status = str(vm.status)
        return Found(
            kind="instance",
            name=_path(vm.self_link),
            location=zone,
            state=status,
            labels=dict(vm.labels),
            created_at=timestamp(vm.creation_timestamp),
            run_dir=_items(vm.metadata).get(contract.RUN_DIR_METADATA),
            dead=f"it is {status} and can never run the job again" if status in _DEAD else None,
            going=status in _GOING,
        )

    @staticmethod
    def _group(group: Any, zone: str, templates: dict[str, Any]) -> Found:
        template = templates.get(group.instance_template.rsplit("/", 1)[-1])
        run_dir = _items(template.properties.metadata).get(contract.RUN_DIR_METADATA) if template else None
        deleting = group.target_size == 0 and group.current_actions.deleting > 0
        return Found(
            kind="instance group",
            name=_path(group.self_link),
            location=zone,
            state="DELETING" if deleting else f"{group.status.current_instance_statuses.running}/{group.target_size}",
            labels=labels.from_description(group.description),
            created_at=timestamp(group.creation_timestamp),
            run_dir=run_dir,
            going=deleting,
        )

    @staticmethod
    def _follower(
        kind: str, resource: Any, marks: dict[str, str], project: str, zone: str, run_dir: str | None
    ) -> Found:
        group = f"projects/{project}/zones/{zone}/instanceGroupManagers/{marks.get(GROUP, '')}"
        return Found(
            kind=kind,
            name=_path(resource.self_link),
            location="global" if kind == "instance template" else region_of(zone),
            state="EXISTS",
            labels=marks,
            created_at=timestamp(resource.creation_timestamp),
            # It runs nothing: orphaned with its group; without one (never made, or gone), by its run's state and
            # its age, like a machine (a run that never started its job in the startup grace is not using it).
            run_dir=run_dir,
            follows=group,
        )

    def api_now(self) -> float | None:
        return self.api.clock.now()

    def _call(self, method: str, project: str, found: Found) -> Any:
        parts = found.name.split("/")
        kind, keys = {
            "instance": ("instances", {"zone": parts[3], "instance": parts[-1]}),
            "instance group": ("groups", {"zone": parts[3], "instance_group_manager": parts[-1]}),
            "instance template": ("templates", {"instance_template": parts[-1]}),
            "workload policy": ("policies", {"region": parts[3], "resource_policy": parts[-1]}),
        }[found.kind]
        action = f"{'delete' if method.startswith('delete') else 'read'} {found.kind} {parts[-1]}"
        return self.api.unless_missing(kind, method, action, (project, found.location), project=project, **keys)

    def request_delete(self, project: str, found: Found) -> str | None:
        op = self._call("delete_unary", project, found)
        return None if op is None else operation_ref(op)

    def outcome(self, project: str, found: Found, operation: str) -> tuple[bool, str | None]:
        op = self.api.get_operation(operation, project=project, zone=found.location)
        return op.done, op.failure.said() if op.failure is not None else None

    def exists(self, project: str, found: Found) -> bool:
        return self._call("get", project, found) is not None


def _path(link: str) -> str:
    """projects/... of a selfLink (https://compute.googleapis.com/compute/v1/projects/...)."""
    return link[link.index("projects/") :] if "projects/" in link else link
