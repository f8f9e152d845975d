"""Compute Engine's resources as the emulator holds them, each with the JSON the API answers for it.

Links are full URLs under https://www.googleapis.com/compute/v1/, as Compute Engine writes selfLink, zone,
machineType and targetLink; requests may name resources by full or partial URL (`parse_link`). Times are RFC 3339
with an offset, ids are uint64 strings, fingerprints base64.
"""

from __future__ import annotations

import base64
import copy
import datetime
import hashlib
import os
import random
import re
from dataclasses import dataclass, field
from typing import Any

from tpu_emulator.gce.machines import MachineType
from tpu_emulator.resources import project_number, region_of
from tpu_emulator.vm import VmGroup

BASE = "https://www.googleapis.com/compute/v1/"
_LINK_PREFIXES = (BASE, "https://compute.googleapis.com/compute/v1/", "compute/v1/", "/compute/v1/")
NAME_RE = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")


def stamp(t: float) -> str:
    """RFC 3339 with milliseconds and an offset, as Compute Engine writes creationTimestamp."""
    moment = datetime.datetime.fromtimestamp(t, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}+00:00"


def new_id() -> str:
    return str(random.randrange(10**18, 2**63))


def new_fingerprint() -> str:
    return base64.b64encode(os.urandom(8)).decode()


def parse_link(value: str, project: str) -> str:
    """A full or partial resource URL as a path relative to the API: projects/p/zones/z/instances/x. Partial links
    (zones/z/..., regions/r/..., global/...) are the request's project's."""
    text = value
    for prefix in _LINK_PREFIXES:
        if text.startswith(prefix):
            text = text[len(prefix) :]
            break
    if not text.startswith("projects/"):
        text = f"projects/{project}/{text}"
    return text


def link(path: str) -> str:
    return BASE + path


@dataclass
class Operation:
    project: str
    scope: str  # "zones/<zone>", "regions/<region>" or "global"
    operation_type: str  # insert, delete, stop, compute.instances.preempted, ...
    target: str  # the target's path: projects/p/zones/z/instances/x
    target_id: str
    created: float
    name: str = ""
    id: str = field(default_factory=new_id)
    status: str = "PENDING"  # PENDING -> RUNNING -> DONE
    progress: int = 0
    started: float | None = None
    ended: float | None = None
    failure: dict[str, Any] | None = None  # error + httpErrorStatusCode + httpErrorMessage
    request_id: str | None = None
    system_event: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            prefix = "systemevent" if self.system_event else "operation"
            millis = int(self.created * 1000)
            self.name = f"{prefix}-{millis}-{os.urandom(7).hex()[:13]}-{os.urandom(4).hex()}-{os.urandom(4).hex()}"

    @property
    def path(self) -> str:
        return f"projects/{self.project}/{self.scope}/operations/{self.name}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "compute#operation",
            "id": self.id,
            "name": self.name,
            "operationType": self.operation_type,
            "targetLink": link(self.target),
            "targetId": self.target_id,
            "status": self.status,
            "user": "system" if self.system_event else "emulated-user@example.com",
            "progress": self.progress,
            "insertTime": stamp(self.created),
            "selfLink": link(self.path),
        }
        if self.scope.startswith("zones/"):
            out["zone"] = link(f"projects/{self.project}/{self.scope}")
        elif self.scope.startswith("regions/"):
            out["region"] = link(f"projects/{self.project}/{self.scope}")
        if self.started is not None:
            out["startTime"] = stamp(self.started)
        if self.ended is not None:
            out["endTime"] = stamp(self.ended)
        if self.request_id:
            out["clientOperationId"] = self.request_id
        if self.failure:
            out.update(copy.deepcopy(self.failure))
        return out


def _ip(seed: str) -> str:
    digest = hashlib.sha1(seed.encode()).digest()
    return f"10.128.{digest[0]}.{digest[1] % 250 + 2}"


@dataclass
class Instance:
    project: str
    zone: str
    name: str
    spec: dict[str, Any]  # the request's (or template's) properties, canonical JSON
    machine: MachineType
    created: float
    id: str = field(default_factory=new_id)
    status: str = "PROVISIONING"
    status_message: str | None = None
    started: float | None = None
    stopped: float | None = None
    group: str | None = None  # the managed instance group's path that created it
    worker: int = 0  # its index in a multi-host slice
    slice_hosts: tuple[str, ...] = ()  # the names of every VM of its slice, worker order
    coordinator: str | None = None  # the JAX coordinator address its slice shares (tpu_emulator.vm.COORDINATOR)
    preempted: bool = False  # instance/preempted in its metadata server
    vms: VmGroup | None = None
    fingerprint: str = field(default_factory=new_fingerprint)
    label_fingerprint: str = field(default_factory=new_fingerprint)
    metadata_fingerprint: str = field(default_factory=new_fingerprint)
    generation: int = 0  # bumped on every transition, so stale agenda entries can tell they are stale

    @property
    def path(self) -> str:
        return f"projects/{self.project}/zones/{self.zone}/instances/{self.name}"

    @property
    def scheduling(self) -> dict[str, Any]:
        return dict(self.spec.get("scheduling") or {})

    @property
    def provisioning_model(self) -> str:
        return str(self.scheduling.get("provisioningModel", "STANDARD"))

    @property
    def termination_action(self) -> str:
        return str(self.scheduling.get("instanceTerminationAction", "STOP"))

    def metadata_items(self) -> dict[str, str]:
        items = (self.spec.get("metadata") or {}).get("items") or []
        return {str(i.get("key")): str(i.get("value", "")) for i in items}

    @property
    def internal_ip(self) -> str:
        return _ip(f"{self.project}/{self.zone}/{self.name}/{self.id}")

    def to_json(self) -> dict[str, Any]:
        spec = self.spec
        number = project_number(self.project)
        out: dict[str, Any] = {
            "kind": "compute#instance",
            "id": self.id,
            "creationTimestamp": stamp(self.created),
            "name": self.name,
            "machineType": link(f"projects/{self.project}/zones/{self.zone}/machineTypes/{self.machine.name}"),
            "status": self.status,
            "zone": link(f"projects/{self.project}/zones/{self.zone}"),
            "selfLink": link(self.path),
            "canIpForward": bool(spec.get("canIpForward", False)),
            "cpuPlatform": "Unknown CPU Platform",  # a TPU host's CPU platform: not known, so not made up
            "deletionProtection": bool(spec.get("deletionProtection", False)),
            "startRestricted": False,
            "fingerprint": self.fingerprint,
            "labelFingerprint": self.label_fingerprint,
        }
        for key in ("description", "labels", "tags", "reservationAffinity", "shieldedInstanceConfig", "hostname"):
            if key in spec:
                out[key] = copy.deepcopy(spec[key])
        if self.status_message:
            out["statusMessage"] = self.status_message
        scheduling = self.scheduling
        scheduling.setdefault("provisioningModel", "STANDARD")
        scheduling.setdefault("onHostMaintenance", "TERMINATE")
        scheduling.setdefault("automaticRestart", scheduling["provisioningModel"] == "STANDARD")
        scheduling.setdefault("preemptible", False)
        out["scheduling"] = scheduling
        items = (spec.get("metadata") or {}).get("items") or []
        metadata: dict[str, Any] = {"kind": "compute#metadata", "fingerprint": self.metadata_fingerprint}
        if items:
            metadata["items"] = copy.deepcopy(items)
        out["metadata"] = metadata
        accounts = copy.deepcopy(spec.get("serviceAccounts") or [])
        for account in accounts:
            if account.get("email") in (None, "", "default"):
                account["email"] = f"{number}-compute@developer.gserviceaccount.com"
        if accounts:
            out["serviceAccounts"] = accounts
        out["networkInterfaces"] = [self._nic(i, nic) for i, nic in enumerate(spec.get("networkInterfaces") or [{}])]
        out["disks"] = [self._disk(i, d) for i, d in enumerate(spec.get("disks") or [])]
        if spec.get("resourcePolicies"):
            out["resourcePolicies"] = [link(parse_link(p, self.project)) for p in spec["resourcePolicies"]]
        if self.started is not None:
            out["lastStartTimestamp"] = stamp(self.started)
        if self.stopped is not None:
            out["lastStopTimestamp"] = stamp(self.stopped)
        return out

    def _nic(self, index: int, nic: dict[str, Any]) -> dict[str, Any]:
        region = region_of(self.zone)
        out = {
            "kind": "compute#networkInterface",
            "name": f"nic{index}",
            "network": link(parse_link(nic.get("network") or "global/networks/default", self.project)),
            "subnetwork": link(
                parse_link(nic.get("subnetwork") or f"regions/{region}/subnetworks/default", self.project)
            ),
            "networkIP": self.internal_ip,
            "fingerprint": self.fingerprint,
            "stackType": nic.get("stackType", "IPV4_ONLY"),
        }
        if nic.get("nicType"):
            out["nicType"] = nic["nicType"]
        configs = []
        for config in nic.get("accessConfigs") or []:
            made = {
                "kind": "compute#accessConfig",
                "type": "ONE_TO_ONE_NAT",
                "name": config.get("name", "External NAT"),
            }
            made["networkTier"] = config.get("networkTier", "PREMIUM")
            if self.status == "RUNNING":
                digest = hashlib.sha1(self.id.encode()).digest()
                made["natIP"] = f"34.{digest[0] % 200 + 20}.{digest[1]}.{digest[2] % 250 + 2}"
            configs.append(made)
        if configs:
            out["accessConfigs"] = configs
        return out

    def _disk(self, index: int, disk: dict[str, Any]) -> dict[str, Any]:
        params = disk.get("initializeParams") or {}
        name = params.get("diskName") or (self.name if index == 0 else f"{self.name}-{index}")
        out: dict[str, Any] = {
            "kind": "compute#attachedDisk",
            "type": disk.get("type", "PERSISTENT"),
            "mode": disk.get("mode", "READ_WRITE"),
            "source": link(parse_link(disk.get("source") or f"zones/{self.zone}/disks/{name}", self.project)),
            "deviceName": disk.get("deviceName") or (f"persistent-disk-{index}"),
            "index": index,
            "boot": bool(disk.get("boot", False)),
            "autoDelete": bool(disk.get("autoDelete", False)),
            "interface": disk.get("interface", "NVME"),
            "diskSizeGb": str(params.get("diskSizeGb", "100")),
        }
        return out


@dataclass
class Template:
    project: str
    name: str
    spec: dict[str, Any]  # the whole InstanceTemplate body
    created: float
    machine: MachineType
    id: str = field(default_factory=new_id)

    @property
    def path(self) -> str:
        return f"projects/{self.project}/global/instanceTemplates/{self.name}"

    @property
    def properties(self) -> dict[str, Any]:
        return dict(self.spec.get("properties") or {})

    def to_json(self) -> dict[str, Any]:
        out = {k: copy.deepcopy(v) for k, v in self.spec.items() if k in ("description", "properties")}
        out.update(
            kind="compute#instanceTemplate",
            id=self.id,
            name=self.name,
            creationTimestamp=stamp(self.created),
            selfLink=link(self.path),
        )
        return out


@dataclass
class Policy:
    project: str
    region: str
    name: str
    spec: dict[str, Any]
    created: float
    id: str = field(default_factory=new_id)

    @property
    def path(self) -> str:
        return f"projects/{self.project}/regions/{self.region}/resourcePolicies/{self.name}"

    @property
    def workload(self) -> dict[str, Any] | None:
        return self.spec.get("workloadPolicy")

    @property
    def compact(self) -> bool:
        return (self.spec.get("groupPlacementPolicy") or {}).get("collocation") == "COLLOCATED"

    def to_json(self) -> dict[str, Any]:
        out = {k: copy.deepcopy(v) for k, v in self.spec.items() if k not in ("name", "region")}
        out.update(
            kind="compute#resourcePolicy",
            id=self.id,
            name=self.name,
            region=link(f"projects/{self.project}/regions/{self.region}"),
            creationTimestamp=stamp(self.created),
            selfLink=link(self.path),
            status="READY",
        )
        return out
