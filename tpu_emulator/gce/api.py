"""The Compute Engine REST routes (/compute/v1/...), exactly the google-cloud-compute REST transport's.

Every route is one method of compute.v1.json: the request is checked against it before the route runs and the
answer after (tpu_emulator.server.SchemaCheck), then the emulator's own rules apply (tpu_emulator.gce.checks).
Before a route, injected HTTP errors, rate limits and permission denials get their turn. Errors are answered in
Compute Engine's shape (tpu_emulator.gce.errors). List methods take maxResults (0-500, default 500), pageToken and
a filter (tpu_emulator.gce.filters).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from typing import Any

from tpu_emulator import discovery
from tpu_emulator.errors import ApiError
from tpu_emulator.faults import Faults
from tpu_emulator.gce import errors, filters, machines
from tpu_emulator.gce.errors import ComputeError
from tpu_emulator.gce.resources import link
from tpu_emulator.gce.state import ComputeCloud
from tpu_emulator.server import Request, Response, SchemaCheck

PREFIX = "/compute/v1/"
S = r"([^/]+)"
ZONE = rf"projects/{S}/zones/{S}"
REGION = rf"projects/{S}/regions/{S}"
GLOBAL = rf"projects/{S}/global"
IGM = rf"{ZONE}/instanceGroupManagers/{S}"
_REASON = {"NOT_FOUND": "notFound", "ALREADY_EXISTS": "alreadyExists", "PERMISSION_DENIED": "forbidden"}
_REASON |= {"INVALID_ARGUMENT": "invalid", "FAILED_PRECONDITION": "conditionNotMet", "UNIMPLEMENTED": "notImplemented"}


def as_compute(exc: ApiError) -> ComputeError:
    if isinstance(exc, ComputeError):
        return exc
    return ComputeError(exc.status, exc.message, _REASON.get(exc.status, "backendError"), http=exc.http)


class ComputeApi:
    def __init__(self, cloud: ComputeCloud, faults: Faults) -> None:
        self.cloud = cloud
        self.faults = faults
        c = self
        # (verb, path, handler, method id in compute.v1.json after "compute.", IAM permission after "compute.")
        ig, rr, it, rp = (
            "instanceGroupManagers",
            "instanceGroupManagerResizeRequests",
            "instanceTemplates",
            "resourcePolicies",
        )
        table: list[tuple[str, str, Callable[..., Response], str, str]] = [
            ("POST", rf"{ZONE}/instances", c.insert_instance, "instances.insert", "instances.create"),
            ("GET", rf"{ZONE}/instances", c.list_instances, "instances.list", "instances.list"),
            ("GET", rf"{ZONE}/instances/{S}", c.get_instance, "instances.get", "instances.get"),
            ("DELETE", rf"{ZONE}/instances/{S}", c.delete_instance, "instances.delete", "instances.delete"),
            ("POST", rf"{ZONE}/instances/{S}/stop", c.stop_instance, "instances.stop", "instances.stop"),
            ("POST", rf"{ZONE}/instances/{S}/suspend", c.suspend_instance, "instances.suspend", "instances.suspend"),
            ("GET", rf"{ZONE}/machineTypes", c.list_machine_types, "machineTypes.list", "machineTypes.list"),
            ("GET", rf"{ZONE}/machineTypes/{S}", c.get_machine_type, "machineTypes.get", "machineTypes.get"),
            ("GET", rf"{ZONE}/operations", c.list_zone_ops, "zoneOperations.list", "zoneOperations.list"),
            ("GET", rf"{ZONE}/operations/{S}", c.get_zone_op, "zoneOperations.get", "zoneOperations.get"),
            ("POST", rf"{ZONE}/operations/{S}/wait", c.wait_zone_op, "zoneOperations.wait", "zoneOperations.get"),
            ("DELETE", rf"{ZONE}/operations/{S}", c.delete_zone_op, "zoneOperations.delete", "zoneOperations.delete"),
            ("GET", rf"{REGION}/operations", c.list_region_ops, "regionOperations.list", "regionOperations.list"),
            ("GET", rf"{REGION}/operations/{S}", c.get_region_op, "regionOperations.get", "regionOperations.get"),
            (
                "POST",
                rf"{REGION}/operations/{S}/wait",
                c.wait_region_op,
                "regionOperations.wait",
                "regionOperations.get",
            ),
            ("GET", rf"{GLOBAL}/operations", c.list_global_ops, "globalOperations.list", "globalOperations.list"),
            ("GET", rf"{GLOBAL}/operations/{S}", c.get_global_op, "globalOperations.get", "globalOperations.get"),
            (
                "POST",
                rf"{GLOBAL}/operations/{S}/wait",
                c.wait_global_op,
                "globalOperations.wait",
                "globalOperations.get",
            ),
            ("POST", rf"{GLOBAL}/{it}", c.insert_template, f"{it}.insert", f"{it}.create"),
            ("GET", rf"{GLOBAL}/{it}", c.list_templates, f"{it}.list", f"{it}.list"),
            ("GET", rf"{GLOBAL}/{it}/{S}", c.get_template, f"{it}.get", f"{it}.get"),
            ("DELETE", rf"{GLOBAL}/{it}/{S}", c.delete_template, f"{it}.delete", f"{it}.delete"),
            ("POST", rf"{REGION}/{rp}", c.insert_policy, f"{rp}.insert", f"{rp}.create"),
            ("GET", rf"{REGION}/{rp}", c.list_policies, f"{rp}.list", f"{rp}.list"),
            ("GET", rf"{REGION}/{rp}/{S}", c.get_policy, f"{rp}.get", f"{rp}.get"),
            ("DELETE", rf"{REGION}/{rp}/{S}", c.delete_policy, f"{rp}.delete", f"{rp}.delete"),
            ("POST", rf"{ZONE}/{ig}", c.insert_group, f"{ig}.insert", f"{ig}.create"),
            ("GET", rf"{ZONE}/{ig}", c.list_groups, f"{ig}.list", f"{ig}.list"),
            ("GET", IGM, c.get_group, f"{ig}.get", f"{ig}.get"),
            ("DELETE", IGM, c.delete_group, f"{ig}.delete", f"{ig}.delete"),
            ("POST", rf"{IGM}/resize", c.resize_group, f"{ig}.resize", f"{ig}.update"),
            ("POST", rf"{IGM}/listManagedInstances", c.list_managed, f"{ig}.listManagedInstances", f"{ig}.get"),
            ("GET", rf"{IGM}/listErrors", c.list_errors, f"{ig}.listErrors", f"{ig}.get"),
            ("POST", rf"{IGM}/resizeRequests", c.insert_request, f"{rr}.insert", f"{ig}.update"),
            ("GET", rf"{IGM}/resizeRequests", c.list_requests, f"{rr}.list", f"{ig}.get"),
            ("GET", rf"{IGM}/resizeRequests/{S}", c.get_request, f"{rr}.get", f"{ig}.get"),
            ("DELETE", rf"{IGM}/resizeRequests/{S}", c.delete_request, f"{rr}.delete", f"{ig}.update"),
            ("POST", rf"{IGM}/resizeRequests/{S}/cancel", c.cancel_request, f"{rr}.cancel", f"{ig}.update"),
        ]
        self.routes = [
            (verb, re.compile("^" + re.escape(PREFIX) + path + "$"), fn, f"compute.{mid}", f"compute.{perm}")
            for verb, path, fn, mid, perm in table
        ]
        self.schema = SchemaCheck(discovery.load("compute.v1.json"), {})

    def handle(self, request: Request) -> Response:
        with self.cloud.lock:
            self.cloud.settle()
        checked: str | None = None  # the method the request was checked against, once it was
        try:
            burst = self.faults.take("http", method=request.method, path=request.path)
            if burst is not None:
                raise errors.of_http(int(burst.status or 503), burst.message)
            if self.faults.take("rate_limit", method=request.method, path=request.path) is not None:
                raise errors.of_http(429, "Rate Limit Exceeded")
            for verb, pattern, fn, method_id, permission in self.routes:
                match = pattern.match(request.path)
                if match and verb == request.method:
                    denied = self.faults.take("permission", permission=permission)
                    if denied is not None:
                        raise errors.permission_denied(permission, request.path.removeprefix(PREFIX), denied.message)
                    checked = self.schema.label(method_id)
                    problems = self.schema.request(method_id, request)
                    if problems:
                        raise errors.schema_invalid(problems)
                    return self.schema.answer(method_id, fn(request, *match.groups()), False)
            raise errors.ComputeError(
                "NOT_FOUND", f"The requested URL {request.path} was not found on this server.", "notFound"
            )
        except ApiError as exc:
            response = Response.error(as_compute(exc))
            response.method_id = checked
            return response

    # -- helpers ------------------------------------------------------------------------------------------------

    @staticmethod
    def _body(request: Request) -> dict[str, Any]:
        try:
            data = json.loads(request.body or b"{}")
        except ValueError as exc:
            raise errors.schema_invalid([("resource", f"Invalid JSON payload received. {exc}.")]) from None
        if not isinstance(data, dict):
            raise errors.schema_invalid([("resource", "Invalid JSON payload received. Expected an object.")])
        return data

    def _list(self, request: Request, kind: str, path: str, items: list[dict[str, Any]]) -> Response:
        if request.query.get("filter"):
            terms = filters.parse(request.query["filter"])
            items = [item for item in items if filters.matches(item, terms)]
        size = int(request.query.get("maxResults") or 500)
        if size > 500:
            raise errors.invalid_field("maxResults", size, "Must be 0 to 500.")
        size = size or 500
        try:
            start = (
                int(base64.urlsafe_b64decode(request.query["pageToken"]).decode())
                if request.query.get("pageToken")
                else 0
            )
        except ValueError:
            raise errors.invalid_field("pageToken", request.query["pageToken"], "Not a page token.") from None
        out: dict[str, Any] = {"kind": kind, "id": path, "items": items[start : start + size], "selfLink": link(path)}
        if start + size < len(items):
            out["nextPageToken"] = base64.urlsafe_b64encode(str(start + size).encode()).decode()
        return Response.json(out)

    def _op(self, op: Any, after: Any = None) -> Response:
        return Response.json(op.to_json(), after=after)

    # -- instances ----------------------------------------------------------------------------------------------

    def insert_instance(self, request: Request, project: str, zone: str) -> Response:
        body = self._body(request)
        with self.cloud.lock:
            return self._op(self.cloud.insert_instance(project, zone, body, request.query.get("requestId")))

    def list_instances(self, request: Request, project: str, zone: str) -> Response:
        with self.cloud.lock:
            items = [i.to_json() for i in self.cloud.instances_in(project, zone)]
        return self._list(request, "compute#instanceList", f"projects/{project}/zones/{zone}/instances", items)

    def get_instance(self, request: Request, project: str, zone: str, name: str) -> Response:
        with self.cloud.lock:
            return Response.json(self.cloud.get_instance(f"projects/{project}/zones/{zone}/instances/{name}").to_json())

    def delete_instance(self, request: Request, project: str, zone: str, name: str) -> Response:
        with self.cloud.lock:
            path = f"projects/{project}/zones/{zone}/instances/{name}"
            return self._op(*self.cloud.delete_instance(path, request.query.get("requestId")))

    def stop_instance(self, request: Request, project: str, zone: str, name: str) -> Response:
        with self.cloud.lock:
            path = f"projects/{project}/zones/{zone}/instances/{name}"
            return self._op(*self.cloud.stop_instance(path, request.query.get("requestId")))

    def suspend_instance(self, request: Request, project: str, zone: str, name: str) -> Response:
        with self.cloud.lock:
            instance = self.cloud.get_instance(f"projects/{project}/zones/{zone}/instances/{name}")
        # Suspending keeps memory, which an accelerator's state cannot be (Compute Engine refuses GPU VMs; for TPU
        # machine types, the only ones emulated, this refusal is unconfirmed).
        raise errors.invalid(f"Instances with TPUs ({instance.machine.name}) cannot be suspended; stop or delete it.")

    # -- machine types ------------------------------------------------------------------------------------------

    def _machine_json(self, project: str, zone: str, machine: machines.MachineType) -> dict[str, Any]:
        return {
            "kind": "compute#machineType",
            "id": str(int.from_bytes(machine.name.encode()[:7], "big")),
            "name": machine.name,
            "description": f"{machine.chips} {machine.generation.title} chip(s)",
            "guestCpus": machine.vcpus,
            "memoryMb": machine.memory_mb,
            "maximumPersistentDisks": 128,
            "maximumPersistentDisksSizeGb": "263168",
            "zone": zone,
            "isSharedCpu": False,
            "architecture": "X86_64",
            "selfLink": link(f"projects/{project}/zones/{zone}/machineTypes/{machine.name}"),
        }

    def list_machine_types(self, request: Request, project: str, zone: str) -> Response:
        items = [self._machine_json(project, zone, m) for m in machines.in_zone(zone)]
        return self._list(request, "compute#machineTypeList", f"projects/{project}/zones/{zone}/machineTypes", items)

    def get_machine_type(self, request: Request, project: str, zone: str, name: str) -> Response:
        machine = machines.offered_in(name, zone)
        if machine is None:
            raise errors.not_found(f"projects/{project}/zones/{zone}/machineTypes/{name}")
        return Response.json(self._machine_json(project, zone, machine))

    # -- operations ---------------------------------------------------------------------------------------------

    def _ops(self, request: Request, project: str, scope: str) -> Response:
        with self.cloud.lock:
            items = [op.to_json() for op in self.cloud.ops_in(project, scope)]
        return self._list(request, "compute#operationList", f"projects/{project}/{scope}/operations", items)

    def _get_op(self, path: str) -> Response:
        with self.cloud.lock:
            return Response.json(self.cloud.find(self.cloud.operations, path).to_json())

    def _wait_op(self, path: str) -> Response:
        with self.cloud.lock:
            return Response.json(self.cloud.wait_op(path).to_json())

    def list_zone_ops(self, request: Request, project: str, zone: str) -> Response:
        return self._ops(request, project, f"zones/{zone}")

    def get_zone_op(self, request: Request, project: str, zone: str, name: str) -> Response:
        return self._get_op(f"projects/{project}/zones/{zone}/operations/{name}")

    def wait_zone_op(self, request: Request, project: str, zone: str, name: str) -> Response:
        return self._wait_op(f"projects/{project}/zones/{zone}/operations/{name}")

    def delete_zone_op(self, request: Request, project: str, zone: str, name: str) -> Response:
        with self.cloud.lock:
            self.cloud.delete_op(f"projects/{project}/zones/{zone}/operations/{name}")
        # The method has no response schema; google-cloud-compute parses the body as JSON, so it gets {} (what
        # Compute Engine itself sends here: unconfirmed).
        return Response.json({})

    def list_region_ops(self, request: Request, project: str, region: str) -> Response:
        return self._ops(request, project, f"regions/{region}")

    def get_region_op(self, request: Request, project: str, region: str, name: str) -> Response:
        return self._get_op(f"projects/{project}/regions/{region}/operations/{name}")

    def wait_region_op(self, request: Request, project: str, region: str, name: str) -> Response:
        return self._wait_op(f"projects/{project}/regions/{region}/operations/{name}")

    def list_global_ops(self, request: Request, project: str) -> Response:
        return self._ops(request, project, "global")

    def get_global_op(self, request: Request, project: str, name: str) -> Response:
        return self._get_op(f"projects/{project}/global/operations/{name}")

    def wait_global_op(self, request: Request, project: str, name: str) -> Response:
        return self._wait_op(f"projects/{project}/global/operations/{name}")

    # -- instance templates and resource policies ---------------------------------------------------------------

    def insert_template(self, request: Request, project: str) -> Response:
        body = self._body(request)
        with self.cloud.lock:
            return self._op(self.cloud.insert_template(project, body, request.query.get("requestId")))

    def list_templates(self, request: Request, project: str) -> Response:
        with self.cloud.lock:
            items = [t.to_json() for t in self.cloud.templates.values() if t.project == project]
        return self._list(
            request, "compute#instanceTemplateList", f"projects/{project}/global/instanceTemplates", items
        )

    def get_template(self, request: Request, project: str, name: str) -> Response:
        with self.cloud.lock:
            path = f"projects/{project}/global/instanceTemplates/{name}"
            return Response.json(self.cloud.find(self.cloud.templates, path).to_json())

    def delete_template(self, request: Request, project: str, name: str) -> Response:
        with self.cloud.lock:
            path = f"projects/{project}/global/instanceTemplates/{name}"
            return self._op(self.cloud.delete_template(path, request.query.get("requestId")))

    def insert_policy(self, request: Request, project: str, region: str) -> Response:
        body = self._body(request)
        with self.cloud.lock:
            return self._op(self.cloud.insert_policy(project, region, body, request.query.get("requestId")))

    def list_policies(self, request: Request, project: str, region: str) -> Response:
        with self.cloud.lock:
            items = [p.to_json() for p in self.cloud.policies.values() if (p.project, p.region) == (project, region)]
        path = f"projects/{project}/regions/{region}/resourcePolicies"
        return self._list(request, "compute#resourcePolicyList", path, items)

    def get_policy(self, request: Request, project: str, region: str, name: str) -> Response:
        with self.cloud.lock:
            return Response.json(
                self.cloud.policy(f"projects/{project}/regions/{region}/resourcePolicies/{name}").to_json()
            )

    def delete_policy(self, request: Request, project: str, region: str, name: str) -> Response:
        with self.cloud.lock:
            path = f"projects/{project}/regions/{region}/resourcePolicies/{name}"
            return self._op(self.cloud.delete_policy(path, request.query.get("requestId")))

    # -- managed instance groups --------------------------------------------------------------------------------

    @staticmethod
    def _group_path(project: str, zone: str, name: str) -> str:
        return f"projects/{project}/zones/{zone}/instanceGroupManagers/{name}"

    def insert_group(self, request: Request, project: str, zone: str) -> Response:
        body = self._body(request)
        with self.cloud.lock:
            return self._op(self.cloud.groups.insert(project, zone, body, request.query.get("requestId")))

    def list_groups(self, request: Request, project: str, zone: str) -> Response:
        with self.cloud.lock:
            items = [self.cloud.groups.to_json(g) for g in self.cloud.groups.in_zone(project, zone)]
        path = f"projects/{project}/zones/{zone}/instanceGroupManagers"
        return self._list(request, "compute#instanceGroupManagerList", path, items)

    def get_group(self, request: Request, project: str, zone: str, name: str) -> Response:
        with self.cloud.lock:
            groups = self.cloud.groups
            return Response.json(groups.to_json(groups.get(self._group_path(project, zone, name))))

    def delete_group(self, request: Request, project: str, zone: str, name: str) -> Response:
        with self.cloud.lock:
            path = self._group_path(project, zone, name)
            return self._op(*self.cloud.groups.delete(path, request.query.get("requestId")))

    def resize_group(self, request: Request, project: str, zone: str, name: str) -> Response:
        with self.cloud.lock:
            path = self._group_path(project, zone, name)
            return self._op(*self.cloud.groups.resize(path, int(request.query["size"]), request.query.get("requestId")))

    def list_managed(self, request: Request, project: str, zone: str, name: str) -> Response:
        with self.cloud.lock:
            groups = self.cloud.groups
            items = groups.managed(groups.get(self._group_path(project, zone, name)))
        return Response.json({"managedInstances": items} if items else {})

    def list_errors(self, request: Request, project: str, zone: str, name: str) -> Response:
        with self.cloud.lock:
            items = list(reversed(self.cloud.groups.get(self._group_path(project, zone, name)).error_log))
        return Response.json({"items": items} if items else {})

    def insert_request(self, request: Request, project: str, zone: str, name: str) -> Response:
        body = self._body(request)
        with self.cloud.lock:
            path = self._group_path(project, zone, name)
            return self._op(self.cloud.resize_requests.insert(path, body, request.query.get("requestId")))

    def list_requests(self, request: Request, project: str, zone: str, name: str) -> Response:
        with self.cloud.lock:
            group = self.cloud.groups.get(self._group_path(project, zone, name))
            items = [r.to_json() for r in group.requests.values()]
        path = f"{group.path}/resizeRequests"
        return self._list(request, "compute#instanceGroupManagerResizeRequestList", path, items)

    def get_request(self, request: Request, project: str, zone: str, name: str, rr: str) -> Response:
        with self.cloud.lock:
            return Response.json(self.cloud.resize_requests.get(self._group_path(project, zone, name), rr).to_json())

    def delete_request(self, request: Request, project: str, zone: str, name: str, rr: str) -> Response:
        with self.cloud.lock:
            path = self._group_path(project, zone, name)
            return self._op(self.cloud.resize_requests.delete(path, rr, request.query.get("requestId")))

    def cancel_request(self, request: Request, project: str, zone: str, name: str, rr: str) -> Response:
        with self.cloud.lock:
            path = self._group_path(project, zone, name)
            return self._op(self.cloud.resize_requests.cancel(path, rr, request.query.get("requestId")))
