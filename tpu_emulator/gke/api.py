"""The GKE REST routes (/v1/projects/*/locations/*/...), exactly the google-cloud-container REST transport's.

Every route is one method of container.v1.json: the request is checked against Google's discovery document before
the route runs and the answer after (tpu_emulator.server.SchemaCheck: a request that breaks it is 400
INVALID_ARGUMENT, an answer that breaks it is the emulator's own bug, a 500). Injected HTTP errors and permission
denials get their turn first. Real routes the emulator does not serve answer 501 UNIMPLEMENTED, never a 404 that
would read as "not found".
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from tpu_emulator import discovery, errors
from tpu_emulator.errors import ApiError
from tpu_emulator.faults import Faults
from tpu_emulator.gke.state import GkeCloud
from tpu_emulator.server import Request, Response, SchemaCheck

S = r"([^/:]+)"
LOC = rf"/v1/projects/{S}/locations/{S}"
CLUSTER = rf"{LOC}/clusters/{S}"
# The request messages are the bodies themselves: a violation is named from their fields (node_pool.config), as
# Google's front end names them.
_BODIES = {"container.projects.locations.clusters.nodePools.create": ""}


class GkeApi:
    def __init__(self, cloud: GkeCloud, faults: Faults) -> None:
        self.cloud = cloud
        self.faults = faults
        table: list[tuple[str, str, Callable[..., Response], str, str]] = [
            ("GET", rf"{LOC}/clusters", self.list_clusters, "clusters.list", "clusters.list"),
            ("GET", CLUSTER, self.get_cluster, "clusters.get", "clusters.get"),
            ("POST", rf"{CLUSTER}/nodePools", self.create_pool, "clusters.nodePools.create", "clusters.update"),
            ("GET", rf"{CLUSTER}/nodePools", self.list_pools, "clusters.nodePools.list", "clusters.get"),
            ("GET", rf"{CLUSTER}/nodePools/{S}", self.get_pool, "clusters.nodePools.get", "clusters.get"),
            ("DELETE", rf"{CLUSTER}/nodePools/{S}", self.delete_pool, "clusters.nodePools.delete", "clusters.update"),
            ("GET", rf"{LOC}/operations", self.list_ops, "operations.list", "operations.list"),
            ("GET", rf"{LOC}/operations/{S}", self.get_op, "operations.get", "operations.get"),
        ]
        self.routes = [
            (verb, re.compile("^" + path + "$"), fn, f"container.projects.locations.{mid}", f"container.{perm}")
            for verb, path, fn, mid, perm in table
        ]
        self.schema = SchemaCheck(discovery.load("container.v1.json"), _BODIES)

    def handle(self, request: Request) -> Response:
        checked: str | None = None
        try:
            burst = self.faults.take("http", method=request.method, path=request.path)
            if burst is not None:
                raise ApiError.for_http(int(burst.status or 503), burst.message)
            for verb, pattern, fn, method_id, permission in self.routes:
                match = pattern.match(request.path)
                if match and verb == request.method:
                    denied = self.faults.take("permission", permission=permission)
                    if denied is not None:
                        resource = request.path.removeprefix("/v1/")
                        raise errors.permission_denied(permission, resource, message=denied.message)
                    checked = self.schema.label(method_id)
                    problems = self.schema.request(method_id, request)
                    if problems:
                        raise errors.invalid(problems)
                    numeric = "enum-encoding=int" in request.query.get("$alt", "")
                    return self.schema.answer(method_id, fn(request, *match.groups()), numeric)
            if request.path.startswith("/v1/projects/"):
                raise ApiError("UNIMPLEMENTED", f"The GKE emulator does not implement {request.method} {request.path}")
            raise ApiError("NOT_FOUND", f"The requested URL {request.path} was not found on this server.")
        except ApiError as exc:
            response = Response.error(exc)
            response.method_id = checked
            return response

    # -- clusters -----------------------------------------------------------------------------------------------

    def _cluster_json(self, project: str, location: str, name: str) -> dict[str, Any]:
        cluster = self.cloud.cluster(project, location, name)
        pools = [p.to_json() for p in self.cloud.pools.values() if p.cluster is cluster]
        out: dict[str, Any] = {
            "name": cluster.name,
            "location": cluster.location,
            "zone": cluster.location,
            "status": "RUNNING",
            "endpoint": cluster.endpoint,
            "currentMasterVersion": "1.20.2-gke.0",
            "currentNodeVersion": "1.20.2-gke.0",
            "selfLink": f"https://container.googleapis.com/v1/{cluster.path}",
            "createTime": _time(cluster.created),
            "id": cluster.name.encode().hex()[:32].ljust(32, "0"),
            "masterAuth": {"clusterCaCertificate": cluster.ca_certificate},
        }
        if pools:
            out["nodePools"] = pools
        return out

    def list_clusters(self, request: Request, project: str, location: str) -> Response:
        with self.cloud.lock:
            found = [c for c in self.cloud.clusters.values() if c.project == project and location in ("-", c.location)]
            clusters = [self._cluster_json(c.project, c.location, c.name) for c in found]
        return Response.json({"clusters": clusters} if clusters else {})

    def get_cluster(self, request: Request, project: str, location: str, name: str) -> Response:
        with self.cloud.lock:
            return Response.json(self._cluster_json(project, location, name))

    # -- node pools ---------------------------------------------------------------------------------------------

    def create_pool(self, request: Request, project: str, location: str, cluster: str) -> Response:
        try:
            body = json.loads(request.body or b"{}")
        except ValueError as exc:
            raise ApiError("INVALID_ARGUMENT", f"Invalid JSON payload received. {exc}.") from None
        spec = body.get("nodePool")
        if not isinstance(spec, dict):
            raise ApiError("INVALID_ARGUMENT", "Invalid value for field 'node_pool': a node pool is required.")
        with self.cloud.lock:
            op = self.cloud.create_pool(self.cloud.cluster(project, location, cluster), spec)
            return Response.json(op.to_json())

    def list_pools(self, request: Request, project: str, location: str, cluster: str) -> Response:
        with self.cloud.lock:
            found = self.cloud.cluster(project, location, cluster)
            pools = [p.to_json() for p in self.cloud.pools.values() if p.cluster is found]
        return Response.json({"nodePools": pools} if pools else {})

    def get_pool(self, request: Request, project: str, location: str, cluster: str, pool: str) -> Response:
        with self.cloud.lock:
            self.cloud.cluster(project, location, cluster)
            found = self.cloud.pool(f"projects/{project}/locations/{location}/clusters/{cluster}/nodePools/{pool}")
            return Response.json(found.to_json())

    def delete_pool(self, request: Request, project: str, location: str, cluster: str, pool: str) -> Response:
        with self.cloud.lock:
            self.cloud.cluster(project, location, cluster)
            op = self.cloud.delete_pool(f"projects/{project}/locations/{location}/clusters/{cluster}/nodePools/{pool}")
            return Response.json(op.to_json())

    # -- operations ---------------------------------------------------------------------------------------------

    def list_ops(self, request: Request, project: str, location: str) -> Response:
        with self.cloud.lock:
            ops = [
                o.to_json()
                for o in self.cloud.operations.values()
                if o.project == project and location in ("-", o.location)
            ]
        return Response.json({"operations": ops} if ops else {})

    def get_op(self, request: Request, project: str, location: str, name: str) -> Response:
        with self.cloud.lock:
            return Response.json(self.cloud.operation(project, location, name).to_json())


def _time(epoch: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
