"""The clusters, node pools and operations of the GKE emulator, and what time does to them.

A node pool create answers an Operation (CREATE_NODE_POOL) at once: PROVISIONING, then after `create_delay_s` its
nodes are made in the cluster's real API server (tpu_emulator.kube: GKE's labels and taints) and it is RUNNING,
and only then is the operation DONE, so a client that saw DONE finds the nodes. A delete (DELETE_NODE_POOL) marks
it STOPPING, takes its nodes away (their pods end Failed, as a node shutdown leaves them), then removes it.

Capacity faults fail the create's operation the way GKE reports a Compute Engine failure under it, and leave the
pool in ERROR (it must be deleted, as on GKE: terraform-provider-google#10121, "create a node pool in error state"):
- stockout: "Google Compute Engine: Not all instances running in IGM after 1.0s. Expected N, running 0,
  transitioning N. Current errors: [GCE_STOCKOUT]: Instance '...' creation failed: The zone 'projects/P/zones/Z'
  does not have enough resources available to fulfill the request.  Try a different zone, or try again later."
  (akka/akka-core#32992, tranquilitybase-io/tb-gcp#589);
- quota: the same with "[QUOTA_EXCEEDED]: Instance '...' creation failed: Quota 'TPU_...' exceeded.  Limit: L in
  region R.". The operation's google.rpc code is 8 (RESOURCE_EXHAUSTED) for both: which code GKE puts there is
  unconfirmed; the bracketed reason is what tells them apart.
A node pool with config.maxRunDuration has its nodes taken away when it has run that long: the deadline the cluster
enforces when nobody else does. A node preempted (`preempt`: a Spot VM reclaimed, a maintenance event) is taken
away with its pods, and the pool's instance group makes the VM again, with the same name, after create_delay_s.

An operation that excludes node pool changes (`busy`: a control-plane upgrade, a repair, another user's change to
the cluster): while it runs, a node pool create or delete is answered 400 FAILED_PRECONDITION "Cluster is running
incompatible operation operation-...", with ErrorInfo CLUSTER_ALREADY_HAS_OPERATION
(kubernetes-sigs/cluster-api-provider-gcp#1363; terraform-provider-google#10366: "Operation ... is currently ...
Please wait and try again once it is done.").

A flex-start pool is otherwise played as an on-demand one (its nodes come when the pool is RUNNING).
"""

from __future__ import annotations

import hashlib
import itertools
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from tpu_emulator.errors import ApiError, error_info
from tpu_emulator.faults import Faults
from tpu_emulator.gke.machines import TpuMachine, topology_chips, tpu_machine
from tpu_emulator.kube.nodes import TpuNode
from tpu_emulator.stderr import note

_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
_DURATION = re.compile(r"^(\d+)(\.\d+)?s$")
VERSION = "1.20.2-gke.0"  # the rehearsal's real API server is Kubernetes 1.20.2


class NodeSink(Protocol):
    """Where a node pool's nodes go: tpu_emulator.kube.KubeRehearsal."""

    def add_nodes(self, *nodes: TpuNode) -> None: ...

    def take_node(self, name: str, grace_s: float = 0.0) -> None: ...


def _stamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Cluster:
    project: str
    location: str
    name: str
    sink: NodeSink | None
    endpoint: str = ""
    ca_certificate: str = ""  # base64 PEM
    created: float = field(default_factory=time.time)

    @property
    def path(self) -> str:
        return f"projects/{self.project}/locations/{self.location}/clusters/{self.name}"


@dataclass
class Operation:
    name: str
    project: str
    location: str
    kind: str  # CREATE_NODE_POOL, DELETE_NODE_POOL
    target: str  # the node pool's path
    started: float = field(default_factory=time.time)
    status: str = "RUNNING"
    ended: float | None = None
    error: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        link = f"https://container.googleapis.com/v1/projects/{self.project}/locations/{self.location}"
        out: dict[str, Any] = {
            "name": self.name,
            "zone": self.location,
            "location": self.location,
            "operationType": self.kind,
            "status": self.status,
            "selfLink": f"{link}/operations/{self.name}",
            "targetLink": f"https://container.googleapis.com/v1/{self.target}",
            "startTime": _stamp(self.started),
        }
        if self.ended is not None:
            out["endTime"] = _stamp(self.ended)
        if self.error is not None:
            out["error"] = self.error
            out["statusMessage"] = self.error["message"]
        return out


@dataclass
class NodePool:
    cluster: Cluster
    spec: dict[str, Any]  # the request's nodePool, as sent
    zone: str
    machine: TpuMachine | None
    count: int
    status: str = "PROVISIONING"
    message: str = ""
    nodes: list[str] = field(default_factory=list)
    running_since: float | None = None

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def path(self) -> str:
        return f"{self.cluster.path}/nodePools/{self.name}"

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.spec.items() if k not in ("status", "statusMessage", "selfLink")}
        out["config"] = {
            "diskSizeGb": 100,
            "diskType": "pd-balanced",
            "imageType": "COS_CONTAINERD",
            **(self.spec.get("config") or {}),
        }
        out["initialNodeCount"] = self.count
        out["locations"] = [self.zone]
        out["version"] = VERSION
        out["status"] = self.status
        if self.message:
            out["statusMessage"] = self.message
        out["selfLink"] = f"https://container.googleapis.com/v1/{self.path}"
        group = f"gke-{self.cluster.name}-{self.name}-{_short(self.path)}-grp"
        project, zone = self.cluster.project, self.zone
        out["instanceGroupUrls"] = [
            f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}/instanceGroupManagers/{group}"
        ]
        out["podIpv4CidrSize"] = 24
        out["etag"] = _short(repr(sorted(out.items(), key=lambda kv: kv[0])))
        return out


def _short(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:8]


class GkeCloud:
    def __init__(self, faults: Faults, *, create_delay_s: float, delete_delay_s: float) -> None:
        self.faults = faults
        self.create_delay_s = create_delay_s
        self.delete_delay_s = delete_delay_s
        self.lock = threading.RLock()
        self.clusters: dict[str, Cluster] = {}
        self.pools: dict[str, NodePool] = {}
        self.operations: dict[str, Operation] = {}
        self._changing: dict[str, Operation] = {}  # cluster path -> the operation changing it (busy) while it runs
        # busy operation -> (changes it refuses before its end is set, how long it runs after the last of them)
        self._busy_ends: dict[str, tuple[int, float]] = {}
        self._agenda: list[tuple[float, Callable[[], None]]] = []
        self._ids = itertools.count(1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, name="gke-emulator", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    # -- time ---------------------------------------------------------------------------------------------------

    def later(self, seconds: float, step: Callable[[], None]) -> None:
        with self.lock:
            self._agenda.append((time.monotonic() + seconds, step))

    def _tick(self) -> None:
        """Runs what is due, off the request threads: making nodes calls the API server."""
        while not self._stop.wait(0.05):
            with self.lock:
                now = time.monotonic()
                due = [step for when, step in self._agenda if when <= now]
                self._agenda = [(when, step) for when, step in self._agenda if when > now]
            for step in due:
                try:
                    step()
                except Exception as exc:  # the API server away: tell the pool, never kill the clock
                    note(f"[gke-emulator] {exc!r}")

    # -- reads --------------------------------------------------------------------------------------------------

    def cluster(self, project: str, location: str, name: str) -> Cluster:
        path = f"projects/{project}/locations/{location}/clusters/{name}"
        if path not in self.clusters:
            raise ApiError("NOT_FOUND", f"Not found: {path}.")
        return self.clusters[path]

    def pool(self, path: str) -> NodePool:
        if path not in self.pools:
            raise ApiError("NOT_FOUND", f"Not found: {path}.")
        return self.pools[path]

    def operation(self, project: str, location: str, name: str) -> Operation:
        if name not in self.operations or self.operations[name].project != project:
            raise ApiError("NOT_FOUND", f"Not found: projects/{project}/locations/{location}/operations/{name}.")
        return self.operations[name]

    # -- node pools ---------------------------------------------------------------------------------------------

    def _operation(self, cluster: Cluster, kind: str, target: str) -> Operation:
        name = f"operation-{int(time.time() * 1000)}-{uuid.uuid4().hex[:8]}"
        op = Operation(name, cluster.project, cluster.location, kind, target)
        self.operations[name] = op
        return op

    def busy(self, cluster: Cluster, seconds: float, kind: str = "UPGRADE_MASTER", *, refusals: int = 0) -> Operation:
        """Another operation changes `cluster` (not this client's: a teammate's, an upgrade): it ends `seconds` after
        it has refused `refusals` node pool changes (at once when 0). Counting refusals, not time from the start, lets
        a test be sure a client meets the operation however slowly the client comes."""
        with self.lock:
            op = self._operation(cluster, kind, cluster.path)
            self._changing[cluster.path] = op
            if refusals > 0:
                self._busy_ends[op.name] = (refusals, seconds)
        if refusals == 0:
            self._end_busy(cluster, op, seconds)
        return op

    def _end_busy(self, cluster: Cluster, op: Operation, seconds: float) -> None:
        def done() -> None:
            with self.lock:
                op.status, op.ended = "DONE", time.time()
                if self._changing.get(cluster.path) is op:
                    del self._changing[cluster.path]

        self.later(seconds, done)

    def _refuse_while_changing(self, cluster: Cluster) -> None:
        op = self._changing.get(cluster.path)
        if op is None:
            return
        if op.name in self._busy_ends:
            left, seconds = self._busy_ends.pop(op.name)
            if left > 1:
                self._busy_ends[op.name] = (left - 1, seconds)
            else:
                self._end_busy(cluster, op, seconds)
        raise ApiError(
            "FAILED_PRECONDITION",
            f"Cluster is running incompatible operation {op.name}.",
            [error_info("CLUSTER_ALREADY_HAS_OPERATION", "container.googleapis.com", {})],
        )

    def create_pool(self, cluster: Cluster, spec: dict[str, Any]) -> Operation:
        self._refuse_while_changing(cluster)
        name = str(spec.get("name", ""))
        if not _NAME.match(name):
            raise ApiError("INVALID_ARGUMENT", f'Invalid node pool name "{name}": must match {_NAME.pattern}.')
        path = f"{cluster.path}/nodePools/{name}"
        if path in self.pools:
            raise ApiError("ALREADY_EXISTS", f"Already exists: {path}.")
        zone, machine, count = self._shape(cluster, spec)
        pool = NodePool(cluster, spec, zone, machine, count)
        self.pools[path] = pool
        op = self._operation(cluster, "CREATE_NODE_POOL", path)
        slow = self.faults.take("slow_create", zone=zone, node=name)
        delay = slow.seconds if slow is not None and slow.seconds is not None else self.create_delay_s
        self.later(delay, lambda: self._provisioned(pool, op))
        return op

    def _shape(self, cluster: Cluster, spec: dict[str, Any]) -> tuple[str, TpuMachine | None, int]:
        """The pool's zone, TPU machine and node count, or INVALID_ARGUMENT in GKE's sense."""
        config = spec.get("config") or {}
        machine_type = str(config.get("machineType") or "e2-medium")
        machine = tpu_machine(machine_type)
        locations = spec.get("locations") or ([cluster.location] if cluster.location.count("-") == 2 else [])
        if machine is not None and len(locations) != 1:
            raise ApiError(
                "INVALID_ARGUMENT",
                f"TPU node pools ({machine_type}) must be in exactly one zone: "
                "set nodePool.locations to one zone of the cluster's region.",
            )
        zone = locations[0] if locations else f"{cluster.location}-a"
        if config.get("spot") and config.get("flexStart"):
            raise ApiError("INVALID_ARGUMENT", "spot and flexStart cannot both be set on a node pool.")
        if config.get("maxRunDuration") and not _DURATION.match(str(config["maxRunDuration"])):
            raise ApiError("INVALID_ARGUMENT", f'Invalid maxRunDuration "{config["maxRunDuration"]}".')
        count = int(spec.get("initialNodeCount") or 0)
        placement = spec.get("placementPolicy") or {}
        topology = placement.get("tpuTopology")
        if machine is None:
            if topology:
                raise ApiError(
                    "INVALID_ARGUMENT", f"placementPolicy.tpuTopology needs a TPU machine type, not {machine_type}."
                )
            return zone, None, count
        if topology:
            chips = topology_chips(topology)
            if chips is None or len(topology.split("x")) != machine.dimensions:
                raise ApiError(
                    "INVALID_ARGUMENT",
                    f'Invalid TPU topology "{topology}" for machine type {machine_type}: '
                    f"a topology of {machine.dimensions} dimensions such as {'x'.join(['2'] * machine.dimensions)}.",
                )
            hosts = max(1, chips // machine.chips)
            if count != hosts:
                raise ApiError(
                    "INVALID_ARGUMENT",
                    f"Node count {count} does not match TPU topology {topology} on "
                    f"{machine_type}: it needs {hosts} nodes ({chips} chips, {machine.chips} per node).",
                )
            if machine.workload_policy and hosts > 1 and not placement.get("policyName"):
                raise ApiError(
                    "INVALID_ARGUMENT",
                    f"A multi-host {machine.accelerator} node pool needs a workload "
                    "policy: set placementPolicy.policyName.",
                )
            if machine.workload_policy and placement.get("type") == "COMPACT":
                raise ApiError(
                    "INVALID_ARGUMENT",
                    f"A compact placement policy is not supported for "
                    f"{machine.accelerator}. Use workload policy instead.",
                )
        elif count < 1:
            raise ApiError("INVALID_ARGUMENT", "initialNodeCount must be at least 1 for a TPU node pool.")
        return zone, machine, count

    def _node(self, pool: NodePool, index: int) -> TpuNode:
        config = pool.spec.get("config") or {}
        machine = pool.machine
        assert machine is not None
        topology = (pool.spec.get("placementPolicy") or {}).get("tpuTopology") or _single(machine)
        group = _short(pool.path)
        taints = tuple(
            {"key": t["key"], "value": t.get("value", ""), "effect": _EFFECT.get(t.get("effect", ""), "NoSchedule")}
            for t in config.get("taints") or []
        )
        return TpuNode(
            name=f"gke-{pool.cluster.name}-{pool.name}-{group}-{index:04d}"[:63],
            accelerator=machine.accelerator,
            topology=topology,
            chips=machine.chips,
            node_pool=pool.name,
            machine_type=machine.machine_type,
            zone=pool.zone,
            spot=bool(config.get("spot")),
            flex_start=bool(config.get("flexStart")),
            labels=dict(config.get("labels") or {}),
            taints=taints,
        )

    def _provisioned(self, pool: NodePool, op: Operation) -> None:
        with self.lock:
            if self.pools.get(pool.path) is not pool or pool.status != "PROVISIONING":
                return
        stockout = self.faults.take("stockout", zone=pool.zone, node=pool.name)
        quota = None if stockout else self.faults.take("quota", zone=pool.zone, node=pool.name)
        if stockout or quota:
            instance = f"gke-{pool.cluster.name}-{pool.name}-{_short(pool.path)}-0000"
            if stockout:
                why = stockout.message or (
                    f"[GCE_STOCKOUT]: Instance '{instance}' creation failed: The zone 'projects/{pool.cluster.project}"
                    f"/zones/{pool.zone}' does not have enough resources available to fulfill the request.  Try a "
                    "different zone, or try again later."
                )
            else:
                assert quota is not None
                name = (
                    quota.quota
                    or f"TPU_{(pool.machine.accelerator if pool.machine else 'CPUS').upper().replace('-', '_')}"
                )
                why = quota.message or (
                    f"[QUOTA_EXCEEDED]: Instance '{instance}' creation failed: Quota '{name}' exceeded.  Limit: "
                    f"{float(quota.limit)} in region {pool.zone.rsplit('-', 1)[0]}."
                )
            message = (
                f"Google Compute Engine: Not all instances running in IGM after {self.create_delay_s:.1f}s. Expected "
                f"{pool.count}, running 0, transitioning {pool.count}. Current errors: {why}"
            )
            with self.lock:
                pool.status, pool.message = "ERROR", message
                op.status, op.ended, op.error = "DONE", time.time(), {"code": 8, "message": message}
            return
        nodes = [self._node(pool, i) for i in range(pool.count)] if pool.machine else []
        sink = pool.cluster.sink
        if sink is not None and nodes:
            sink.add_nodes(*nodes)
        with self.lock:
            pool.nodes = [n.name for n in nodes]
            pool.status, pool.running_since = "RUNNING", time.time()
            op.status, op.ended = "DONE", time.time()
        limit = (pool.spec.get("config") or {}).get("maxRunDuration")
        if limit:
            self.later(float(str(limit)[:-1]), lambda: self._expired(pool))

    def _expired(self, pool: NodePool) -> None:
        """maxRunDuration reached: GKE takes the nodes away (the pool stays, empty)."""
        with self.lock:
            if self.pools.get(pool.path) is not pool or pool.status != "RUNNING":
                return
            names, pool.nodes = pool.nodes, []
        self._take(pool, names)

    def _take(self, pool: NodePool, names: list[str]) -> None:
        sink = pool.cluster.sink
        if sink is not None:
            for name in names:
                sink.take_node(name)

    def preempt(self, node: str, grace_s: float = 0.0) -> str:
        """The VM under `node` reclaimed: taken away with its pods (SIGTERM, SIGKILL after grace_s), then made again
        by its pool's instance group after create_delay_s; the pool's path."""
        with self.lock:
            pool = next((p for p in self.pools.values() if node in p.nodes and p.status == "RUNNING"), None)
            if pool is None:
                raise KeyError(f"no RUNNING node pool has a node {node}")
        sink = pool.cluster.sink
        if sink is not None:
            sink.take_node(node, grace_s)
        index = pool.nodes.index(node)

        def recreated() -> None:
            with self.lock:
                if self.pools.get(pool.path) is not pool or pool.status != "RUNNING":
                    return  # deleted meanwhile: nothing to make again
            if sink is not None:
                sink.add_nodes(self._node(pool, index))

        self.later(self.create_delay_s, recreated)
        return pool.path

    def delete_pool(self, path: str) -> Operation:
        pool = self.pool(path)
        self._refuse_while_changing(pool.cluster)
        if pool.status in ("PROVISIONING", "STOPPING"):
            raise ApiError(
                "FAILED_PRECONDITION", f"Cluster is running incompatible operation on node pool {pool.name}."
            )
        op = self._operation(pool.cluster, "DELETE_NODE_POOL", path)
        failing = self.faults.take("delete_fails", zone=pool.zone, node=pool.name)
        pool.status = "STOPPING"
        failure = None if failing is None else failing.message or f"Internal error deleting node pool {pool.name}."
        self.later(self.delete_delay_s, lambda: self._deleted(pool, op, failure))
        return op

    def _deleted(self, pool: NodePool, op: Operation, failure: str | None) -> None:
        if failure is not None:  # the delete_fails fault: the pool stays, in ERROR, its nodes with it
            with self.lock:
                pool.status = "ERROR"
                op.status, op.ended, op.error = "DONE", time.time(), {"code": 13, "message": failure}
            return
        names = list(pool.nodes)
        self._take(pool, names)
        with self.lock:
            self.pools.pop(pool.path, None)
            op.status, op.ended = "DONE", time.time()


_EFFECT = {"NO_SCHEDULE": "NoSchedule", "PREFER_NO_SCHEDULE": "PreferNoSchedule", "NO_EXECUTE": "NoExecute"}


def _single(machine: TpuMachine) -> str:
    """A single-host pool's topology label (GKE sets one also without placementPolicy): 4 chips -> 2x2(x1)."""
    sides = {1: "1x1", 4: "2x2", 8: "2x4"}.get(machine.chips, f"1x{machine.chips}")
    return sides + ("x1" if machine.dimensions == 3 else "")
