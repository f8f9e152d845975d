"""Managed instance groups (zonal) and their resize requests: how Compute Engine makes TPU slices.

A group makes instances from an instance template until it has targetSize of them. With a workload policy
(resourcePolicies.workloadPolicy naming a HIGH_THROUGHPUT ResourcePolicy whose acceleratorTopology is the slice)
it is a multi-host TPU slice in "gang mode": its size is the topology's VM count, every VM is created at once or
none is, and a target size (or a resize request) of any other size is refused ("Requested invalid target size
'16' for a Managed Instance Group in the gang mode of size '8'. Should be equal to the gang size.",
AI-Hypercomputer/xpk#751). Without one it creates its VMs one by one.

Creation goes on after the insert operation is DONE: the group exists at once and its VMs come with time. When the
zone has no capacity the attempt fails as a whole, and the group retries every create delay: each planned VM is
listed by listManagedInstances with currentAction CREATING and lastAttempt.errors, and listErrors has an entry per
attempt ("Atomic resize failed with [GCE_STOCKOUT]" for a gang). A member that Compute Engine stops (a Spot
preemption with termination action STOP, a host error) is recreated under its name; one that is deleted is replaced
under a new name (MIGs keep their target size: cloud.google.com/compute/docs/instance-groups). Deleting the group
deletes its VMs; its operation is DONE once they are gone.
Resize requests are in tpu_emulator.gce.resize.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runner.backends.local.backend import free_ports
from tpu_emulator.gce import checks, errors, machines
from tpu_emulator.gce.machines import MachineType
from tpu_emulator.gce.resources import (
    Instance,
    Operation,
    Policy,
    Template,
    link,
    new_fingerprint,
    new_id,
    parse_link,
    stamp,
)

if TYPE_CHECKING:
    from tpu_emulator.gce.resize import ResizeRequest
    from tpu_emulator.gce.state import After, ComputeCloud

CREATING = ("PENDING", "PROVISIONING", "STAGING")


@dataclass
class Group:
    project: str
    zone: str
    name: str
    spec: dict[str, Any]
    template: Template
    machine: MachineType
    policy: Policy | None
    gang: int  # VMs created together: the topology's VM count, 1 without a workload policy
    created: float
    id: str = field(default_factory=new_id)
    target: int = 0
    members: list[str] = field(default_factory=list)  # instance names, worker order
    planned: list[str] = field(default_factory=list)  # names of VMs being attempted (not created yet)
    last_error: tuple[str, str] | None = None  # (code, message) of the last failed attempt
    error_log: list[dict[str, Any]] = field(default_factory=list)  # listErrors items
    deleting: Operation | None = None
    requests: dict[str, ResizeRequest] = field(default_factory=dict)  # by name
    coordinator: str | None = None
    fingerprint: str = field(default_factory=new_fingerprint)

    @property
    def path(self) -> str:
        return f"projects/{self.project}/zones/{self.zone}/instanceGroupManagers/{self.name}"

    @property
    def base(self) -> str:
        return str(self.spec.get("baseInstanceName") or self.name)


def _camel(status: str) -> str:
    """PENDING_STOP -> pendingStop: an instance status as InstanceStatusSummary's field."""
    first, *rest = status.lower().split("_")
    return first + "".join(part.title() for part in rest)


def _all(afters: list[After]) -> After | None:
    """One After that runs every one of `afters` (None when there are none)."""
    if not afters:
        return None

    def run() -> None:
        for after in afters:
            after()

    return run


class Groups:
    def __init__(self, cloud: ComputeCloud) -> None:
        self.cloud = cloud
        self.items: dict[str, Group] = {}

    def clear(self) -> None:
        self.items.clear()

    def get(self, path: str) -> Group:
        found: Group = self.cloud.find(self.items, path)
        return found

    def in_zone(self, project: str, zone: str) -> list[Group]:
        return [g for g in self.items.values() if (g.project, g.zone) == (project, zone)]

    def using(self, path: str) -> str | None:
        """The group that uses a template or policy (by path), if any."""
        for group in self.items.values():
            if group.template.path == path or (group.policy is not None and group.policy.path == path):
                return group.path
        return None

    # -- insert and delete ------------------------------------------------------------------------------------

    def insert(self, project: str, zone: str, body: dict[str, Any], request_id: str | None) -> Operation:
        cloud = self.cloud
        name = checks.check_name(body.get("name"), "resource.name")
        if body.get("baseInstanceName") is not None:
            checks.check_name(body["baseInstanceName"], "resource.baseInstanceName")
        if "targetSize" not in body:
            raise errors.invalid("Required field 'resource.targetSize' not specified")
        template: Template = cloud.find(cloud.templates, parse_link(str(body.get("instanceTemplate", "")), project))
        machine = machines.offered_in(template.machine.name, zone)
        if machine is None:
            raise errors.invalid_field(
                "resource.instanceTemplate",
                template.name,
                f"Machine type {template.machine.name} is not offered in {zone}.",
            )
        policy, gang = self._workload(project, zone, body, machine)
        target = int(body["targetSize"])
        if target < 0 or (gang > 1 and target not in (0, gang)):
            raise errors.invalid_field(
                "resource.targetSize",
                target,
                f"Requested invalid target size '{target}' for a Managed Instance Group in the gang mode of size "
                f"'{gang}'. Should be equal to the gang size.",
            )
        group = Group(project, zone, name, copy.deepcopy(body), template, machine, policy, gang, cloud.agenda.wall())
        group.target = target
        if group.path in self.items:
            raise errors.already_exists(group.path)
        self.items[group.path] = group
        op = cloud.quick_op(project, f"zones/{zone}", "insert", group.path, group.id, request_id)
        if target:
            self.plan(group)
            cloud.agenda.at(cloud.step_s * 4, lambda: self.reconcile(group), wake=True)
        return op

    def _workload(
        self, project: str, zone: str, body: dict[str, Any], machine: MachineType
    ) -> tuple[Policy | None, int]:
        ref = (body.get("resourcePolicies") or {}).get("workloadPolicy")
        if not ref:
            return None, 1
        policy = self.cloud.policy(parse_link(ref, project))
        if policy.region != zone.rsplit("-", 1)[0]:
            raise errors.invalid_field("resource.resourcePolicies.workloadPolicy", ref, f"Must be in {zone}'s region.")
        if policy.compact and machine.generation.name == "tpu7x":
            raise errors.invalid_field(
                "resource.resourcePolicies.workloadPolicy",
                ref,
                f"A compact placement policy is not supported for {machine.name}. Use workload policy instead.",
            )
        workload = policy.workload
        if workload is None:
            raise errors.invalid_field("resource.resourcePolicies.workloadPolicy", ref, "Not a workload policy.")
        topology = workload.get("acceleratorTopology")
        if not topology:
            return policy, 1
        problem = machines.topology_problem(topology, machine)
        if problem:
            raise errors.invalid_field(
                "resource.resourcePolicies.workloadPolicy", ref, f"acceleratorTopology {problem}."
            )
        return policy, machines.hosts(topology, machine)

    def delete(self, path: str, request_id: str | None) -> tuple[Operation, After | None]:
        cloud = self.cloud
        group = self.get(path)
        op = cloud.new_op(group.project, f"zones/{group.zone}", "delete", path, group.id, request_id)
        if group.deleting is not None:
            cloud.agenda.at(cloud.delete_delay_s, lambda: self._gone(group, op), wake=True)
            return op, None
        group.deleting, group.target = op, 0
        for request in group.requests.values():
            if request.state in ("CREATING", "ACCEPTED"):
                request.state = "CANCELLED"
        afters = []
        for name in group.members:
            instance = cloud.instances.get(f"projects/{group.project}/zones/{group.zone}/instances/{name}")
            if instance is not None and instance.status != "STOPPING":
                after = cloud.take_down(instance, "gone", cloud.delete_delay_s)
                if after is not None:
                    afters.append(after)
        cloud.agenda.at(cloud.delete_delay_s, lambda: self._gone(group, op), wake=True)
        return op, _all(afters)

    def resize(self, path: str, size: int, request_id: str | None) -> tuple[Operation, After | None]:
        """Set the target size: the group creates what it lacks, or deletes its newest VMs down to it."""
        cloud = self.cloud
        group = self.get(path)
        if size < 0 or (group.gang > 1 and size not in (0, group.gang)):
            raise errors.invalid_field(
                "size",
                size,
                f"Requested invalid target size '{size}' for a Managed Instance Group in the gang mode of size "
                f"'{group.gang}'. Should be equal to the gang size.",
            )
        group.target = size
        op = cloud.quick_op(
            group.project, f"zones/{group.zone}", "compute.instanceGroupManagers.resize", path, group.id, request_id
        )
        afters = []
        for name in group.members[size:]:
            instance = cloud.instances.get(self.instance_path(group, name))
            if instance is not None and instance.status != "STOPPING":
                after = cloud.take_down(instance, "gone", cloud.delete_delay_s, cause="resize")
                if after is not None:
                    afters.append(after)
        group.planned = group.planned[: max(0, size - len(group.members))]
        cloud.agenda.at(cloud.step_s, lambda: self.reconcile(group), wake=True)
        return op, _all(afters)

    def _gone(self, group: Group, op: Operation) -> None:
        """The group is gone once every VM of it is."""
        cloud = self.cloud
        left = [
            n for n in group.members if f"projects/{group.project}/zones/{group.zone}/instances/{n}" in cloud.instances
        ]
        if left:
            cloud.agenda.at(cloud.step_s, lambda: self._gone(group, op), wake=True)
            return
        self.items.pop(group.path, None)
        cloud.finish_op(op)

    # -- making the VMs ---------------------------------------------------------------------------------------

    def instance_path(self, group: Group, name: str) -> str:
        return f"projects/{group.project}/zones/{group.zone}/instances/{name}"

    def plan(self, group: Group) -> list[str]:
        """Name the VMs the group lacks (listManagedInstances shows them CREATING from then on)."""
        cloud = self.cloud
        group.members = [n for n in group.members if self.instance_path(group, n) in cloud.instances]
        missing = group.target - len(group.members)
        if missing <= 0:
            group.planned = []
            return []
        taken = set(group.members) | set(group.planned)
        while len(group.planned) < missing:
            candidate = f"{group.base}-{os.urandom(2).hex()}"
            if candidate not in taken:
                group.planned.append(candidate)
                taken.add(candidate)
        return group.planned[:missing]

    def reconcile(self, group: Group) -> None:
        """Create what the group lacks, gang by gang: all of an attempt's VMs or none."""
        if self.items.get(group.path) is not group or group.deleting is not None:
            return
        names = self.plan(group)
        if names:
            self.attempt(group, names, retry=lambda: self.reconcile(group))

    def attempt(
        self,
        group: Group,
        names: list[str],
        *,
        retry: Callable[[], None],
        made: Callable[[list[str]], None] | None = None,
    ) -> None:
        """Try to create `names` together; on a stockout or quota fault, record why and `retry` later."""
        cloud = self.cloud
        failure = self._capacity(group, len(names))
        if failure is not None:
            group.last_error = failure
            first = link(self.instance_path(group, names[0]))
            group.error_log.append(
                {
                    "error": {"code": failure[0], "message": failure[1]},
                    "instanceActionDetails": {"action": "CREATING", "instance": first},
                    "timestamp": stamp(cloud.agenda.wall()),
                }
            )
            cloud.agenda.at(cloud.create_delay_s, retry, wake=True)
            return
        group.last_error = None
        if group.gang > 1 and (group.coordinator is None or not group.members):
            group.coordinator = f"127.0.0.1:{free_ports(1)[0]}"
        hosts = tuple(group.members) + tuple(n for n in names if n not in group.members)
        group.planned = [n for n in group.planned if n not in names]
        for name in names:
            props = copy.deepcopy(group.template.properties)
            instance = Instance(group.project, group.zone, name, props, group.machine, cloud.agenda.wall())
            instance.group, instance.worker = group.path, hosts.index(name)
            instance.slice_hosts, instance.coordinator = hosts, group.coordinator
            group.members.append(name)
            cloud.instances[instance.path] = instance
            cloud.provision(instance, None, capacity_checked=True)
        if made is not None:
            made(names)

    def _capacity(self, group: Group, count: int) -> tuple[str, str] | None:
        faults = self.cloud.faults
        stockout = faults.take("stockout", zone=group.zone, node=group.name)
        if stockout is not None:
            if group.gang > 1:
                return errors.gang_stockout(group.project, group.zone, count, stockout.message)
            entry = errors.stockout(group.project, group.zone, group.machine.name, stockout.message)["error"]["errors"][
                0
            ]
            return entry["code"], entry["message"]
        quota = faults.take("quota", zone=group.zone, node=group.name)
        if quota is not None:
            metric = quota.quota or "TPU_CHIPS"
            text = (
                quota.message or f"Quota '{metric}' exceeded.  Limit: {float(quota.limit)} in region {group.zone[:-2]}."
            )
            return "QUOTA_EXCEEDED", text
        return None

    def member_down(self, instance: Instance, cause: str) -> None:
        """A member stopped or deleted by Compute Engine (or by someone) : keep the target size."""
        group = self.items.get(instance.group or "")
        cloud = self.cloud
        if group is not None and group.deleting is not None and cloud.instances.get(instance.path) is instance:
            # Stopped (a preemption) while its group was being deleted: it goes with the group, as it would.
            del cloud.instances[instance.path]
            return
        if group is None or group.deleting is not None or cause in ("requestedRunDuration", "resize"):
            return
        if instance.path in cloud.instances and instance.status == "TERMINATED":
            # Recreated under its name: a fresh VM from the template (instance/preempted is FALSE again).
            def recreate() -> None:
                if cloud.instances.get(instance.path) is instance and instance.status == "TERMINATED":
                    instance.preempted, instance.generation = False, instance.generation + 1
                    # A recreation that meets a stockout loses the VM: the group then replaces it as a new one.
                    cloud.provision(instance, None, then=lambda _, ok: None if ok else self.reconcile(group))

            cloud.agenda.at(cloud.create_delay_s, recreate, wake=True)
        elif instance.path not in cloud.instances:
            cloud.agenda.at(cloud.step_s, lambda: self.reconcile(group), wake=True)

    # -- views --------------------------------------------------------------------------------------------------

    def to_json(self, group: Group) -> dict[str, Any]:
        cloud = self.cloud
        out = {
            k: copy.deepcopy(v)
            for k, v in group.spec.items()
            if k in ("description", "targetSizePolicy", "baseInstanceName")
        }
        counts = {"creating": 0, "deleting": 0, "recreating": 0, "none": 0}
        statuses: dict[str, int] = {}
        for view in self.managed(group):
            action = view["currentAction"].lower()
            counts[action] = counts.get(action, 0) + 1
            key = _camel(view.get("instanceStatus") or "NON_EXISTENT")
            statuses[key] = statuses.get(key, 0) + 1
        stable = counts["creating"] == counts["deleting"] == counts["recreating"] == 0 and not group.planned
        out.update(
            kind="compute#instanceGroupManager",
            id=group.id,
            name=group.name,
            baseInstanceName=group.base,
            creationTimestamp=stamp(group.created),
            zone=link(f"projects/{group.project}/zones/{group.zone}"),
            instanceTemplate=link(group.template.path),
            instanceGroup=link(f"projects/{group.project}/zones/{group.zone}/instanceGroups/{group.name}"),
            targetSize=group.target,
            currentActions={**{k: 0 for k in ("abandoning", "refreshing", "restarting", "verifying")}, **counts},
            selfLink=link(group.path),
            fingerprint=group.fingerprint,
        )
        summary: dict[str, Any] = {"isStable": stable}
        if group.policy is not None:
            out["resourcePolicies"] = {"workloadPolicy": link(group.policy.path)}
            topology = (group.policy.workload or {}).get("acceleratorTopology")
            if topology:
                running = sum(
                    1
                    for n in group.members
                    if (i := cloud.instances.get(self.instance_path(group, n))) and i.status == "RUNNING"
                )
                state = "ACTIVE" if running == group.gang else "ACTIVATING" if not group.last_error else "INCOMPLETE"
                summary["appliedAcceleratorTopologies"] = [{"acceleratorTopology": topology, "state": state}]
            summary["currentInstanceStatuses"] = statuses  # "Currently only shown for TPU MIGs" (compute.v1.json)
        out["status"] = summary
        return out

    def managed(self, group: Group) -> list[dict[str, Any]]:
        """listManagedInstances: each member with its status and current action, and each planned VM."""
        cloud = self.cloud
        out = []
        for name in group.members:
            instance = cloud.instances.get(self.instance_path(group, name))
            if instance is None:
                continue
            action = "NONE"
            if instance.status in CREATING:
                action = "RECREATING" if instance.generation else "CREATING"
            elif instance.status == "STOPPING" and group.deleting is not None:
                action = "DELETING"
            elif instance.status == "TERMINATED":
                action = "RECREATING"
            entry: dict[str, Any] = {
                "instance": link(instance.path),
                "id": instance.id,
                "name": name,
                "instanceStatus": instance.status,
                "currentAction": action,
            }
            out.append(entry)
        for name in group.planned:
            entry = {"instance": link(self.instance_path(group, name)), "name": name, "currentAction": "CREATING"}
            if group.last_error:
                entry["lastAttempt"] = {
                    "errors": {"errors": [{"code": group.last_error[0], "message": group.last_error[1]}]}
                }
            out.append(entry)
        return out
