"""Resize requests (flex-start, Dynamic Workload Scheduler): CREATING -> ACCEPTED (the insert operation DONE) -> the
VMs created all at once when capacity allows, the group's target size raised by resizeBy -> SUCCEEDED; at the end
of requestedRunDuration (600 s to 7 days: "Must be from 600 to 604800 inclusive", GoogleCloudPlatform/
magic-modules#11968; "The run duration must be between 10 minutes and 7 days. At the end of the run duration, the
MIG deletes the created VMs", cloud.google.com/compute/docs/instance-groups/about-resize-requests-mig) the VMs are
deleted and the target size lowered again. cancel: CREATING or ACCEPTED -> CANCELLED. FAILED by the queued_fails
fault, with status.error. The template must use the FLEX_START (or RESERVATION_BOUND) provisioning model (the
resize-request docs); that an ACCEPTED request must be cancelled before it can be deleted: unconfirmed.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tpu_emulator.gce import checks, errors
from tpu_emulator.gce.groups import CREATING, Group
from tpu_emulator.gce.resources import Operation, link, new_id, stamp

if TYPE_CHECKING:
    from tpu_emulator.gce.groups import Groups

RUN_MIN_S, RUN_MAX_S = 600, 604800


@dataclass
class ResizeRequest:
    group: str  # the group's path
    name: str
    count: int
    run_s: int | None
    spec: dict[str, Any]
    created: float
    id: str = field(default_factory=new_id)
    state: str = "CREATING"
    error: dict[str, Any] | None = None  # status.error: final
    last_attempt: tuple[str, str] | None = None  # (code, message) of the last attempt that found no capacity
    members: list[str] = field(default_factory=list)  # instance names it created

    @property
    def path(self) -> str:
        return f"{self.group}/resizeRequests/{self.name}"

    def to_json(self) -> dict[str, Any]:
        out = {
            k: copy.deepcopy(v)
            for k, v in self.spec.items()
            if k in ("description", "resizeBy", "requestedRunDuration")
        }
        out.update(
            kind="compute#instanceGroupManagerResizeRequest",
            id=self.id,
            name=self.name,
            creationTimestamp=stamp(self.created),
            selfLink=link(self.path),
            zone=link("/".join(self.group.split("/")[:4])),
            state=self.state,
        )
        status: dict[str, Any] = {}
        if self.error:
            status["error"] = copy.deepcopy(self.error)
        if self.last_attempt and self.state == "ACCEPTED":
            code, message = self.last_attempt
            status["lastAttempt"] = {"error": {"errors": [{"code": code, "message": message}]}}
        out["status"] = status
        return out


class ResizeRequests:
    """The resize requests of every group (each group keeps its own, by name)."""

    def __init__(self, groups: Groups) -> None:
        self.groups = groups

    def insert(self, group_path: str, body: dict[str, Any], request_id: str | None) -> Operation:
        cloud = self.groups.cloud
        group = self.groups.get(group_path)
        name = checks.check_name(body.get("name"), "resource.name")
        if ("resizeBy" in body) == ("instances" in body):
            raise errors.invalid("Exactly one of 'resource.resizeBy' and 'resource.instances' must be specified.")
        count = int(body["resizeBy"]) if "resizeBy" in body else len(body["instances"])
        if count < 1 or (group.gang > 1 and count != group.gang):
            raise errors.invalid_field(
                "resource.resizeBy",
                count,
                f"Requested invalid target size '{count}' for a Managed Instance Group in the gang mode of size "
                f"'{group.gang}'. Should be equal to the gang size.",
            )
        run_s = None
        if "requestedRunDuration" in body:
            run_s = checks.seconds(body["requestedRunDuration"], "resource.requestedRunDuration")
            if not RUN_MIN_S <= run_s <= RUN_MAX_S:
                raise errors.invalid_field(
                    "resource.requestedRunDuration.seconds",
                    run_s,
                    f"Must be from {RUN_MIN_S} to {RUN_MAX_S} inclusive.",
                )
        model = (group.template.properties.get("scheduling") or {}).get("provisioningModel", "STANDARD")
        if model not in ("FLEX_START", "RESERVATION_BOUND"):
            raise errors.invalid(
                f"Resize requests need an instance template with provisioningModel FLEX_START or RESERVATION_BOUND; "
                f"{group.template.name} has {model}."
            )
        if name in group.requests:
            raise errors.already_exists(f"{group.path}/resizeRequests/{name}")
        request = ResizeRequest(group.path, name, count, run_s, copy.deepcopy(body), cloud.agenda.wall())
        group.requests[name] = request
        op = cloud.new_op(group.project, f"zones/{group.zone}", "insert", request.path, request.id, request_id)

        def accept() -> None:
            if request.state == "CREATING":
                request.state = "ACCEPTED"
                cloud.finish_op(op)
                cloud.agenda.at(cloud.step_s * 2, lambda: self._try(group, request), wake=True)
            else:
                cloud.finish_op(op)

        cloud.agenda.at(cloud.step_s * 3, accept, wake=True)
        return op

    def _try(self, group: Group, request: ResizeRequest) -> None:
        cloud = self.groups.cloud
        if request.state != "ACCEPTED" or self.groups.items.get(group.path) is not group:
            return
        failed = cloud.faults.take("queued_fails", zone=group.zone)
        if failed is not None:
            request.state = "FAILED"
            message = failed.message or f"The resize request {request.name} could not be provisioned."
            request.error = errors.failed(failed.status or "INTERNAL", message)["error"]
            return
        names: list[str] = []
        while len(names) < request.count:
            candidate = f"{group.base}-{os.urandom(2).hex()}"
            if candidate not in group.members and candidate not in names:
                names.append(candidate)

        def made(created: list[str]) -> None:
            request.members = created
            group.target += len(created)
            cloud.agenda.at(cloud.create_delay_s * 1.1, lambda: self._succeeded(group, request), wake=True)

        self.groups.attempt(group, names, retry=lambda: self._try(group, request), made=made)
        request.last_attempt = group.last_error if not request.members else None

    def _succeeded(self, group: Group, request: ResizeRequest) -> None:
        cloud = self.groups.cloud
        if request.state != "ACCEPTED":
            return
        paths = [self.groups.instance_path(group, n) for n in request.members]
        if any(p in cloud.instances and cloud.instances[p].status in CREATING for p in paths):
            cloud.agenda.at(cloud.step_s, lambda: self._succeeded(group, request), wake=True)
            return
        request.state = "SUCCEEDED"
        if request.run_s is None:
            return

        def run_over() -> None:
            if self.groups.items.get(group.path) is not group or group.deleting is not None:
                return
            group.target = max(0, group.target - len(request.members))
            for path in paths:
                instance = cloud.instances.get(path)
                if instance is not None and instance.status != "STOPPING":
                    after = cloud.take_down(instance, "gone", cloud.delete_delay_s, cause="requestedRunDuration")
                    if after is not None:
                        cloud.agenda.at(0.0, after, wake=True)

        cloud.agenda.at(float(request.run_s), run_over, wake=True)

    def get(self, group_path: str, name: str) -> ResizeRequest:
        group = self.groups.get(group_path)
        found = group.requests.get(name)
        if found is None:
            raise errors.not_found(f"{group.path}/resizeRequests/{name}")
        return found

    def cancel(self, group_path: str, name: str, request_id: str | None) -> Operation:
        group = self.groups.get(group_path)
        request = self.get(group_path, name)
        if request.state not in ("CREATING", "ACCEPTED"):
            raise errors.precondition(f"The resize request {request.path} is {request.state}: it cannot be cancelled.")
        request.state = "CANCELLED"
        return self.groups.cloud.quick_op(
            group.project, f"zones/{group.zone}", "cancel", request.path, request.id, request_id
        )

    def delete(self, group_path: str, name: str, request_id: str | None) -> Operation:
        group = self.groups.get(group_path)
        request = self.get(group_path, name)
        if request.state in ("CREATING", "ACCEPTED"):
            raise errors.precondition(
                f"The resize request {request.path} is {request.state}: cancel it before deleting it."
            )
        del group.requests[name]
        return self.groups.cloud.quick_op(
            group.project, f"zones/{group.zone}", "delete", request.path, request.id, request_id
        )
