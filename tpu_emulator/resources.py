"""The emulated resources as data: long-running operations, nodes and queued resources, each with its JSON."""

from __future__ import annotations

import copy
import datetime
import hashlib
import random
import time
from dataclasses import dataclass, field
from typing import Any

from runner.credentials import CLOUD_PLATFORM
from runner.plan import catalog
from tpu_emulator import codec
from tpu_emulator.vm import VmGroup

TPU_PORT = 8470
MEGASCALE_PORT = 8080


def _internal_ip(slice_id: int, worker: int) -> str:
    n = 2 + worker + 256 * slice_id  # the slices of a multislice share a subnet, each with its own addresses
    return f"10.130.{n // 256}.{n % 256}"


# Node fields a create request may set (the rest are output only and ignored, as the API does).
INPUT_FIELDS = (
    "description",
    "runtimeVersion",
    "networkConfig",
    "networkConfigs",
    "schedulingConfig",
    "labels",
    "metadata",
    "tags",
    "dataDisks",
    "shieldedInstanceConfig",
    "acceleratorConfig",
)
_QR_DATA = {
    "CREATING": "creatingData",
    "ACCEPTED": "acceptedData",
    "PROVISIONING": "provisioningData",
    "FAILED": "failedData",
    "DELETING": "deletingData",
    "ACTIVE": "activeData",
    "SUSPENDING": "suspendingData",
    "SUSPENDED": "suspendedData",
}


def project_number(project: str) -> str:
    """A stable 12-digit project number for a project id."""
    return str(10**11 + int(hashlib.sha1(project.encode()).hexdigest(), 16) % (9 * 10**11))


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def _seconds(duration: str) -> float:
    return float(duration.rstrip("s"))


def _epoch(stamp: str) -> float:
    text = stamp.rstrip("Z")
    if "." in text:
        head, frac = text.split(".", 1)
        text = f"{head}.{frac[:6]}"
    return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.timezone.utc).timestamp()


@dataclass
class Operation:
    name: str
    verb: str
    target: str
    response_type: str
    created: float = field(default_factory=time.time)
    done: bool = False
    ended: float | None = None
    error: dict[str, Any] | None = None
    response: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "@type": codec.OPERATION_METADATA_TYPE,
            "createTime": codec.timestamp(self.created),
            "target": self.target,
            "verb": self.verb,
            "apiVersion": "v2",
        }
        if self.ended is not None:
            meta["endTime"] = codec.timestamp(self.ended)
        out: dict[str, Any] = {"name": self.name, "metadata": meta}
        if self.done:
            out["done"] = True
            if self.error is not None:
                out["error"] = self.error
            else:
                out["response"] = self.response or {"@type": self.response_type}
        return out


@dataclass
class Node:
    project: str
    zone: str
    node_id: str
    spec: dict[str, Any]  # the create request's node, canonical JSON
    accel: catalog.AcceleratorType
    id: str = field(default_factory=lambda: str(random.randrange(10**17, 10**18)))
    created: float = field(default_factory=time.time)
    state: str = "CREATING"
    health: str | None = None
    queued_resource: str | None = None
    slice: tuple[int, int] | None = None  # multislice: (slice id, number of slices) of the queued resource's
    vms: VmGroup | None = None
    # A preempted node's VMs, still shutting down: its deletion completes only once they are gone, as on Cloud TPU
    # (a node of the same name created after that gets a fresh VM, never one its predecessor's shutdown can reach).
    preempted_vms: VmGroup | None = None
    hung: bool = False  # READY, but its VMs never ran the startup-script (boot_hang)
    preempted: bool = False  # instance/preempted in its VMs' metadata: TRUE from the preemption on
    maintenance_event: str = "NONE"  # instance/maintenance-event: what a maintenance notice says
    clock_skew_s: int = 0  # how far its VMs' clocks are off (clock_skew): what they write, not what the API says
    delete_ops: list[Operation] = field(default_factory=list)  # of the deletion in progress
    delete_error: dict[str, Any] | None = None  # the google.rpc.Status the deletion in progress will end with
    restore: tuple[str, str | None] = ("READY", "HEALTHY")  # state and health a failed deletion goes back to
    vms_stopped: bool = True  # False while a deletion is still stopping the VMs
    gone_when_stopped: bool = False  # the deletion's time has come, but not the end of its VMs

    @property
    def name(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/nodes/{self.node_id}"

    def to_json(self) -> dict[str, Any]:
        spec = self.spec
        out: dict[str, Any] = {k: copy.deepcopy(spec[k]) for k in INPUT_FIELDS if k in spec}
        number = project_number(self.project)
        network = dict(spec.get("networkConfig") or {})
        network.setdefault("network", f"projects/{self.project}/global/networks/default")
        network.setdefault("subnetwork", f"projects/{self.project}/regions/{region_of(self.zone)}/subnetworks/default")
        account = dict(spec.get("serviceAccount") or {})
        account.setdefault("email", f"{number}-compute@developer.gserviceaccount.com")
        account.setdefault("scope", [CLOUD_PLATFORM])
        out.update(
            name=self.name,
            acceleratorType=self.accel.name,
            state=self.state,
            networkConfig=network,
            serviceAccount=account,
            cidrBlock="10.130.0.0/20",
            createTime=codec.timestamp(self.created),
            id=self.id,
            apiVersion="V2",
        )
        if self.state not in ("CREATING", "DELETING"):
            out["networkEndpoints"] = [self.endpoint(w, bool(network.get("enableExternalIps"))) for w in self.workers]
        if self.health:
            out["health"] = self.health
        if self.queued_resource:
            out["queuedResource"] = self.queued_resource
        if self.slice is not None:
            out["multisliceNode"] = True
        return out

    @property
    def workers(self) -> range:
        return range(self.accel.hosts)

    def internal_ip(self, worker: int) -> str:
        return _internal_ip(self.slice[0] if self.slice else 0, worker)

    def megascale(self) -> dict[str, str]:
        """What a multislice node's VMs find in tpu-env to join the other slices: slice 0's first host coordinates,
        on port 8080 ("the MXLA coordinator, which is set to 8080 in multislice GCE": jax/_src/clusters/
        cloud_tpu_cluster.py, which reads these four keys)."""
        if self.slice is None:
            return {}
        slice_id, count = self.slice
        return {
            "MEGASCALE_COORDINATOR_ADDRESS": f"{_internal_ip(0, 0)}:{MEGASCALE_PORT}",
            "MEGASCALE_NUM_SLICES": str(count),
            "MEGASCALE_PORT": str(MEGASCALE_PORT),
            "MEGASCALE_SLICE_ID": str(slice_id),
        }

    def endpoint(self, worker: int, external: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"ipAddress": self.internal_ip(worker), "port": TPU_PORT}
        if external:
            n = 2 + worker
            out["accessConfig"] = {"externalIp": f"34.{int(self.id) % 200 + 20}.{n // 256}.{n % 256}"}
        return out


@dataclass
class QueuedResource:
    project: str
    zone: str
    qr_id: str
    spec: dict[str, Any]
    planned: list[tuple[str, dict[str, Any], tuple[int, int] | None]]  # (node id, node spec, multislice part)
    created: float = field(default_factory=time.time)
    state: str = "CREATING"
    initiator: str | None = None
    error: dict[str, Any] | None = None
    node_names: list[str] = field(default_factory=list)
    delete_ops: list[Operation] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/queuedResources/{self.qr_id}"

    def to_json(self) -> dict[str, Any]:
        out = copy.deepcopy(self.spec)
        out.update(name=self.name, createTime=codec.timestamp(self.created))
        state: dict[str, Any] = {"state": self.state}
        if self.state in _QR_DATA:
            state[_QR_DATA[self.state]] = {"error": self.error} if self.state == "FAILED" and self.error else {}
        if self.initiator:
            state["stateInitiator"] = self.initiator
        out["state"] = state
        return out

    def window(self) -> tuple[float | None, float | None]:
        """(not before, not after) as epoch seconds, from the queueing policy."""
        policy = self.spec.get("queueingPolicy") or {}
        after = until = None
        if "validAfterDuration" in policy:
            after = self.created + _seconds(policy["validAfterDuration"])
        if "validAfterTime" in policy:
            after = _epoch(policy["validAfterTime"])
        if "validUntilDuration" in policy:
            until = self.created + _seconds(policy["validUntilDuration"])
        if "validUntilTime" in policy:
            until = _epoch(policy["validUntilTime"])
        if "validInterval" in policy:
            interval = policy["validInterval"]
            after = _epoch(interval["startTime"]) if "startTime" in interval else after
            until = _epoch(interval["endTime"]) if "endTime" in interval else until
        return after, until
