"""The admin API under /_emulator/: faults, preemption, requests and state over HTTP, for tests and for curl.

GET    /_emulator/health                 {"ok": true, "endpoint": ...}
GET    /_emulator/requests               every request answered so far (?path=REGEX filters)
POST   /_emulator/reset                  forget every node, operation, queued resource, fault and request
GET    /_emulator/nodes                  nodes with their VMs (pids, directories, console logs)
POST   /_emulator/nodes                  {"project", "zone", "nodeId", "acceleratorType"?, "runtimeVersion"?,
                                         "labels"?, "metadata"?}: a READY node that is just there (no operation)
GET    /_emulator/faults                 the active faults
POST   /_emulator/faults/<kind>          add one; kind: stockout, quota, permission, http, rate-limit,
                                         slow-create, missing-image, delete-fails, slow-delete, collision,
                                         boot-hang, drop-env, queued-fails, clock-skew, late-operation; JSON
                                         body: its fields (zone, node, count, status, seconds, ...)
DELETE /_emulator/faults[/<id>]          clear all faults, or one
POST   /_emulator/preempt                {"node": "<name or node id>"}: READY -> PREEMPTED, VMs stopped
GET    /_emulator/images?name=IMAGE      whether `docker pull IMAGE` works (the docker shim asks)
GET    /_emulator/container-env?image=IMAGE  variables `docker run IMAGE` leaves out (drop_env; the shim asks)
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from tpu_emulator.errors import ApiError
from tpu_emulator.faults import KINDS, fault_from_json
from tpu_emulator.server import Request, Response

if TYPE_CHECKING:
    from tpu_emulator.emulator import NodeInfo, TpuEmulator

URL_KINDS = {kind.replace("_", "-"): kind for kind in KINDS}  # /faults/slow-create -> slow_create


def _body(request: Request) -> dict[str, Any]:
    try:
        data = json.loads(request.body or b"{}")
    except ValueError as exc:
        raise ApiError("INVALID_ARGUMENT", f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError("INVALID_ARGUMENT", "the body must be a JSON object")
    return data


class Admin:
    def __init__(self, emulator: TpuEmulator) -> None:
        self.emulator = emulator

    def handle(self, request: Request) -> Response:
        path = request.path.removeprefix("/_emulator").rstrip("/") or "/"
        try:
            return self._route(request, path)
        except ApiError as exc:
            return Response.error(exc)
        except (ValueError, TypeError, KeyError, re.error) as exc:
            return Response.error(ApiError("INVALID_ARGUMENT", str(exc)))

    def _route(self, request: Request, path: str) -> Response:
        em = self.emulator
        method = request.method
        if (method, path) == ("GET", "/health"):
            return Response.json({"ok": True, "endpoint": em.endpoint})
        if (method, path) == ("GET", "/requests"):
            pattern = request.query.get("path")
            recorded = [r.to_json() for r in em.requests if not pattern or re.search(pattern, r.path)]
            return Response.json({"requests": recorded})
        if (method, path) == ("POST", "/reset"):
            em.reset()
            return Response.json({"reset": True})
        if (method, path) == ("GET", "/nodes"):
            return Response.json({"nodes": [n.to_json() for n in em.nodes()]})
        if (method, path) == ("POST", "/nodes"):
            return Response.json(self._create_node(_body(request)).to_json())
        if (method, path) == ("GET", "/faults"):
            return Response.json({"faults": [f.to_json() for f in em.active_faults()]})
        if (method, path) == ("DELETE", "/faults"):
            em.clear_faults()
            return Response.json({"faults": []})
        if method == "DELETE" and path.startswith("/faults/"):
            if not em.faults.remove(int(path.removeprefix("/faults/"))):
                raise ApiError("NOT_FOUND", f"no fault {path.removeprefix('/faults/')}")
            return Response.json({"removed": True})
        if method == "POST" and path.startswith("/faults/"):
            kind = URL_KINDS.get(path.removeprefix("/faults/"))
            if kind is None:
                raise ApiError("NOT_FOUND", f"unknown fault kind in {request.path}; known: {', '.join(URL_KINDS)}")
            fault = em.faults.add(fault_from_json(kind, _body(request)))
            return Response.json(fault.to_json())
        if (method, path) == ("POST", "/preempt"):
            node = _body(request).get("node")
            if not isinstance(node, str):
                raise ApiError("INVALID_ARGUMENT", 'the body must be {"node": "<node name or id>"}')
            name = em.preempt(node, wait=False)
            return Response.json({"preempted": name})
        if (method, path) == ("GET", "/images"):
            image = request.query.get("name", "")
            taken = em.faults.take("missing_image", image=image)
            present = taken is None
            message = (taken.message if taken else None) or (
                None if present else f"manifest for {image} not found: manifest unknown: manifest unknown"
            )
            return Response.json({"image": image, "present": present, "message": message})
        if (method, path) == ("GET", "/container-env"):
            image = request.query.get("image", "")
            dropped = em.faults.take("drop_env", image=image)
            return Response.json({"image": image, "drop": list(dropped.env or ()) if dropped else []})
        raise ApiError("NOT_FOUND", f"no admin route {method} {request.path}; see GET /_emulator/health")

    def _create_node(self, body: dict[str, Any]) -> NodeInfo:
        fields = {"project", "zone", "nodeId", "acceleratorType", "runtimeVersion", "labels", "metadata"}
        unknown = sorted(set(body) - fields)
        if unknown:
            raise ValueError(f"unknown field(s): {', '.join(unknown)}; known: {', '.join(sorted(fields))}")
        missing = [k for k in ("project", "zone", "nodeId") if not isinstance(body.get(k), str)]
        if missing:
            raise ValueError(f"missing field(s): {', '.join(missing)}")
        return self.emulator.create_node_direct(
            body["project"],
            body["zone"],
            body["nodeId"],
            accelerator_type=body.get("acceleratorType"),
            runtime_version=body.get("runtimeVersion"),
            labels=body.get("labels"),
            metadata=body.get("metadata"),
        )
