"""ComputeEngine: the Compute Engine half of the emulator, as one object to inject faults into and inspect.

TpuEmulator holds one as `.compute` and serves it on the same port: /compute/v1/ (the API), /_gce/ (its VMs'
metadata servers) and /_emulator/compute/ (this admin API):

GET    /_emulator/compute/instances        every instance with its VM (pid, directory, console log)
GET    /_emulator/compute/faults           the active Compute Engine faults
POST   /_emulator/compute/faults/<kind>    add one: stockout, quota, permission, http, rate-limit, slow-create,
                                           delete-fails, slow-delete, queued-fails (a resize request FAILED);
                                           JSON body: its fields (zone, node = instance or group name pattern,
                                           count, message, ...)
DELETE /_emulator/compute/faults[/<id>]    clear all, or one
POST   /_emulator/compute/preempt          {"instance": "<name or path>"}: a Spot VM preempted now
POST   /_emulator/compute/host-error       {"instance": ..., "seconds"?: S}: REPAIRING, then restarted or TERMINATED
POST   /_emulator/compute/advance          {"seconds": S}: what is due within S seconds happens now (run durations)
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tpu_emulator.errors import ApiError
from tpu_emulator.faults import Fault, Faults, fault_from_json
from tpu_emulator.gce import metadata
from tpu_emulator.gce.api import ComputeApi
from tpu_emulator.gce.resources import Instance
from tpu_emulator.gce.state import ComputeCloud
from tpu_emulator.metadata import Answer, answer, etag, wait_for_change
from tpu_emulator.scheduler import Scheduler
from tpu_emulator.server import Request, Response
from tpu_emulator.vm import VmInfo, VmLauncher

_KINDS = (
    "stockout",
    "quota",
    "permission",
    "http",
    "rate_limit",
    "slow_create",
    "late_operation",
    "delete_fails",
    "slow_delete",
)
KINDS = (*_KINDS, "queued_fails")
_GCE_PATH = re.compile(r"^/_gce/([^/]+)/([^/]+)/([^/]+)/computeMetadata/v1(?:/(.*))?$")


@dataclass(frozen=True)
class InstanceInfo:
    """An instance as the emulator holds it: the API's view (`json`) plus its VM."""

    path: str
    project: str
    zone: str
    name: str
    status: str
    machine_type: str
    provisioning_model: str
    group: str | None
    worker: int
    labels: dict[str, str]
    metadata: dict[str, str]
    vm: VmInfo | None
    console_log: Path
    json: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["vm"] = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self.vm).items()} if self.vm else None
        out["console_log"] = str(self.console_log)
        return out


class ComputeEngine:
    def __init__(
        self,
        scheduler: Scheduler,
        launcher: VmLauncher,
        *,
        create_delay_s: float,
        delete_delay_s: float,
        vm_grace_s: float,
        wait_s: float = 1.0,
    ) -> None:
        self.faults = Faults()
        self.launcher = launcher
        self.cloud = ComputeCloud(
            faults=self.faults,
            launcher=launcher,
            scheduler=scheduler,
            create_delay_s=create_delay_s,
            delete_delay_s=delete_delay_s,
            vm_grace_s=vm_grace_s,
            wait_s=wait_s,
        )
        self.api = ComputeApi(self.cloud, self.faults)

    # -- lifecycle (driven by TpuEmulator) ----------------------------------------------------------------------

    def start(self) -> None:
        self.cloud.closing.clear()
        self.cloud.agenda.paused = False

    def stop(self, grace_s: float) -> None:
        self.cloud.closing.set()
        self.cloud.agenda.paused = True
        self.cloud.join_threads(grace_s + 10)

    def reset(self) -> None:
        self.faults.clear()
        self.cloud.forget_all()

    # -- inspection ---------------------------------------------------------------------------------------------

    def instances(self) -> list[InstanceInfo]:
        with self.cloud.lock:
            self.cloud.settle()
            return [self._info(i) for i in self.cloud.instances.values()]

    def instance(self, name: str) -> InstanceInfo | None:
        with self.cloud.lock:
            self.cloud.settle()
            found = self.cloud.instances.get(self._resolve(name, must_exist=False))
            return self._info(found) if found is not None else None

    def _info(self, i: Instance) -> InstanceInfo:
        vm = i.vms.info()[0] if i.vms is not None else None
        log = self.launcher.instance_dir(i.project, i.zone, i.name) / "console.log"
        return InstanceInfo(
            i.path,
            i.project,
            i.zone,
            i.name,
            i.status,
            i.machine.name,
            i.provisioning_model,
            i.group,
            i.worker,
            dict(i.spec.get("labels") or {}),
            i.metadata_items(),
            vm,
            log,
            i.to_json(),
        )

    def _resolve(self, name: str, *, must_exist: bool = True) -> str:
        if name.startswith("projects/"):
            return name
        matches = [path for path, i in self.cloud.instances.items() if i.name == name]
        if len(matches) == 1:
            return matches[0]
        if must_exist or matches:
            raise ApiError(
                "NOT_FOUND" if not matches else "INVALID_ARGUMENT", f"{len(matches)} instances named {name!r}"
            )
        return name

    # -- faults and events --------------------------------------------------------------------------------------

    def add_fault(self, kind: str, **fields: Any) -> Fault:
        """A fault of `kind` (KINDS) with the fields of tpu_emulator.faults.Fault; `node` is an fnmatch pattern of
        instance names (or of group names, for what a group creates)."""
        if kind not in KINDS:
            raise ValueError(f"unknown Compute Engine fault {kind!r}; known: {', '.join(KINDS)}")
        return self.faults.add(fault_from_json(kind, {k: v for k, v in fields.items() if v is not None}))

    def stockout(self, zone: str | None = None, *, count: int | None = None, node: str | None = None) -> Fault:
        """Inserts in `zone` fail in their operation with ZONE_RESOURCE_POOL_EXHAUSTED (the instance is gone); a
        Flex-start VM waits PENDING instead; a group's attempt fails as a whole ("Atomic resize failed with
        [GCE_STOCKOUT]") and is retried. Each attempt uses one count."""
        return self.add_fault("stockout", zone=zone, count=count, node=node)

    def quota_exceeded(
        self, zone: str | None = None, *, count: int | None = None, quota: str | None = None, limit: int = 0,
        in_operation: bool = False,
    ) -> Fault:  # fmt: skip
        """Inserts answered 403 quotaExceeded at once, or (`in_operation`) accepted and failed in the operation
        with QUOTA_EXCEEDED and a quotaInfo detail."""
        return self.add_fault("quota", zone=zone, count=count, quota=quota, limit=limit, in_operation=in_operation)

    def deny(self, permission: str = "compute.instances.delete", *, count: int | None = None) -> Fault:
        """Requests needing `permission` (fnmatch: compute.instances.*) get 403 forbidden."""
        return self.add_fault("permission", permission=permission, count=count)

    def slow_create(self, seconds: float, *, zone: str | None = None, count: int | None = None) -> Fault:
        return self.add_fault("slow_create", seconds=seconds, zone=zone, count=count)

    def late_operation(self, seconds: float, *, zone: str | None = None, count: int | None = None) -> Fault:
        """Instances inserted in `zone` are RUNNING `seconds` before their insert operation ends (a step, without
        it)."""
        return self.add_fault("late_operation", seconds=seconds, zone=zone, count=count)

    def delete_fails(
        self, zone: str | None = None, *, count: int | None = None, status: str = "INTERNAL", node: str | None = None
    ) -> Fault:
        return self.add_fault("delete_fails", zone=zone, count=count, status=status, node=node)

    def resize_fails(self, zone: str | None = None, *, count: int | None = None, message: str | None = None) -> Fault:
        """A resize request waiting in `zone` goes FAILED at its next try."""
        return self.add_fault("queued_fails", zone=zone, count=count, message=message)

    def preempt(self, instance: str) -> str:
        """A Spot VM preempted now: STOPPING (its VM gets SIGTERM, SIGKILL after the grace), then TERMINATED or
        gone by its instanceTerminationAction; a compute.instances.preempted zone operation. Returns its path."""
        with self.cloud.lock:
            self.cloud.settle()
            path = self._resolve(instance)
            after = self.cloud.preempt(path)
        if after is not None:
            after()
        return path

    def host_error(self, instance: str, seconds: float | None = None) -> str:
        with self.cloud.lock:
            self.cloud.settle()
            path = self._resolve(instance)
            dead = self.cloud.host_error(path, seconds)
        if dead is not None:
            self.cloud.spawn(dead.stop, 0.0)
        return path

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass for the emulated Compute Engine: what is due within them (a maxRunDuration's end, a
        resize request's run duration) happens now. Operations already done keep their times."""
        with self.cloud.lock:
            self.cloud.agenda.advance(seconds)
            self.cloud.settle()

    # -- HTTP ---------------------------------------------------------------------------------------------------

    def metadata(self, request: Request) -> Response | None:
        match = _GCE_PATH.match(request.path)
        if match is None:
            return None
        project, zone, name, rest = match.groups()

        def read() -> Answer:
            with self.cloud.lock:
                self.cloud.settle()
                found = self.cloud.instances.get(f"projects/{project}/zones/{zone}/instances/{name}")
                data = metadata.tree(found) if found is not None else None
                token = metadata.token(found) if found is not None else {}
                return answer(data, token, rest or "", dict(request.query), request.headers.get("metadata-flavor"))

        status, kind, body = wait_for_change(read, request.query)  # the lock is not held while waiting
        return Response(status, body, kind, {"Metadata-Flavor": "Google", "ETag": etag(body)})

    def admin(self, request: Request, path: str) -> Response:
        """/_emulator/compute/<path>."""
        try:
            data = json.loads(request.body or b"{}") if request.method == "POST" else {}
            if not isinstance(data, dict):
                raise ValueError("the body must be a JSON object")
            method = request.method
            if (method, path) == ("GET", "/instances"):
                return Response.json({"instances": [i.to_json() for i in self.instances()]})
            if (method, path) == ("GET", "/faults"):
                return Response.json({"faults": [f.to_json() for f in self.faults.list()]})
            if (method, path) == ("DELETE", "/faults"):
                self.faults.clear()
                return Response.json({"faults": []})
            if method == "DELETE" and path.startswith("/faults/"):
                if not self.faults.remove(int(path.removeprefix("/faults/"))):
                    raise ApiError("NOT_FOUND", f"no fault {path.removeprefix('/faults/')}")
                return Response.json({"removed": True})
            if method == "POST" and path.startswith("/faults/"):
                kind = path.removeprefix("/faults/").replace("-", "_")
                return Response.json(self.add_fault(kind, **data).to_json())
            if (method, path) == ("POST", "/preempt"):
                return Response.json({"preempted": self.preempt(str(data["instance"]))})
            if (method, path) == ("POST", "/advance"):
                self.advance(float(data["seconds"]))
                return Response.json({"advanced": float(data["seconds"])})
            if (method, path) == ("POST", "/host-error"):
                return Response.json({"repairing": self.host_error(str(data["instance"]), data.get("seconds"))})
            raise ApiError("NOT_FOUND", f"no admin route {method} /_emulator/compute{path}")
        except ApiError as exc:
            return Response.error(exc)
        except (ValueError, TypeError, KeyError) as exc:
            return Response.error(ApiError("INVALID_ARGUMENT", f"{type(exc).__name__}: {exc}"))
