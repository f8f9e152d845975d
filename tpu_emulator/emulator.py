"""TpuEmulator: the Cloud TPU API v2 emulator as one object to start, inject faults into, inspect and stop."""

from __future__ import annotations

import contextlib
import re
import threading
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from runner.launch.engine import Engine
from runner.plan import catalog
from tpu_emulator import metadata
from tpu_emulator.admin import Admin
from tpu_emulator.errors import ApiError
from tpu_emulator.faults import Fault, Faults, fault_from_json
from tpu_emulator.gce.emulator import ComputeEngine
from tpu_emulator.resources import Node
from tpu_emulator.scheduler import Scheduler
from tpu_emulator.secretmanager import SecretManager
from tpu_emulator.server import Api, HttpServer, RecordedRequest, Request, Response
from tpu_emulator.state import Cloud, QueueStyle
from tpu_emulator.vm import VmInfo, VmLauncher

# The Docker Registry HTTP API v2, as Artifact Registry serves it: HEAD/GET /v2/<name>/manifests/<tag or digest>.
_MANIFEST_PATH = re.compile(r"^/v2/(?!projects/)(.+)/manifests/([^/]+)$")
_VM_PATH = re.compile(r"^/_vm/([^/]+)/([^/]+)/([^/]+)/(\d+)/computeMetadata/v1(?:/(.*))?$")


@dataclass(frozen=True)
class NodeInfo:
    """A node as the emulator holds it: the API's view (`json`) plus its VMs."""

    name: str
    project: str
    zone: str
    node_id: str
    state: str
    accelerator_type: str
    runtime_version: str
    hosts: int
    labels: dict[str, str]
    metadata: dict[str, str]
    queued_resource: str | None
    vms: tuple[VmInfo, ...]
    json: dict[str, Any]
    console_logs: tuple[Path, ...] = ()  # the workers' serial consoles (also of VMs that never ran anything)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["vms"] = [{k: str(v) if isinstance(v, Path) else v for k, v in asdict(vm).items()} for vm in self.vms]
        out["console_logs"] = [str(log) for log in self.console_logs]
        return out


class TpuEmulator:
    """A Cloud TPU API v2 server on loopback whose READY nodes run their startup-script as local "VMs".

    Point the real client at `endpoint` (transport="rest", anonymous credentials). `stop()` (or leaving the
    `with` block) stops the server and every VM process.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        workdir: Path,
        gcs_endpoint: str | None = None,
        create_delay_s: float = 0.5,
        delete_delay_s: float = 0.2,
        vm_grace_s: float = 3.0,
        queue_style: QueueStyle = "waiting",
        compute_wait_s: float = 1.0,
        engine: Engine | None = None,
    ) -> None:
        """`queue_style`: where a queued resource waits, "waiting" (WAITING_FOR_RESOURCES, the current API) or
        "accepted" (ACCEPTED, as the older API answered). `compute_wait_s`: the longest a Compute Engine
        operations.wait waits (the real one, 2 minutes). `engine`: the VMs pull and run real containers under it
        (tpu_emulator.vm_engine), the image from a registry such as tpu_emulator.registry's; None: the image's
        entrypoint runs as a process (tpu_emulator.docker_shim)."""
        self.host, self._port = host, port
        self.workdir = Path(workdir).absolute()
        self.gcs_endpoint = gcs_endpoint
        self.id = uuid.uuid4().hex[:12]
        self.faults = Faults()
        self.scheduler = Scheduler()
        self.launcher = VmLauncher(self.workdir, self.id, gcs_endpoint, engine)
        self.cloud = Cloud(
            faults=self.faults,
            launcher=self.launcher,
            scheduler=self.scheduler,
            create_delay_s=create_delay_s,
            delete_delay_s=delete_delay_s,
            vm_grace_s=vm_grace_s,
            queue_style=queue_style,
        )
        self.api = Api(self.cloud, self.faults)
        # Compute Engine, on the same port, with the same clock and VMs (tpu_emulator.gce).
        self.compute = ComputeEngine(
            self.scheduler,
            self.launcher,
            create_delay_s=create_delay_s,
            delete_delay_s=delete_delay_s,
            vm_grace_s=vm_grace_s,
            wait_s=compute_wait_s,
        )
        # Secret Manager, on the same port: its callers are told apart by the tokens the VMs' metadata servers give.
        self.secrets = SecretManager(self.faults, self._principal)
        self.admin = Admin(self)
        self._requests: list[RecordedRequest] = []
        self._requests_lock = threading.Lock()
        self._http: HttpServer | None = None

    @property
    def vm_grace_s(self) -> float:
        """Seconds a VM gets from SIGTERM to SIGKILL when it is preempted, deleted or the emulator stops."""
        return self.cloud.vm_grace_s

    @vm_grace_s.setter
    def vm_grace_s(self, seconds: float) -> None:
        self.cloud.vm_grace_s = seconds

    # -- lifecycle ----------------------------------------------------------------------------------------------

    def start(self) -> TpuEmulator:
        if self._http is not None:
            return self
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.launcher.install_shim()
        self._http = HttpServer(self.host, self._port, self._dispatch, self._record)
        self.launcher.endpoint = self.endpoint
        self.cloud.closing.clear()
        self.cloud.agenda.paused = False
        self.compute.start()
        self.scheduler.start()
        self._http.start()
        return self

    def stop(self) -> None:
        """Stop serving, then stop every VM (SIGTERM, vm_grace_s, SIGKILL): nothing is left running."""
        if self._http is None:
            return
        self._http.stop()
        self.cloud.closing.set()
        self.cloud.agenda.paused = True  # nothing boots or changes any more, not even when someone looks
        self.compute.stop(self.vm_grace_s)
        self.scheduler.stop()
        self.launcher.stop_all(self.vm_grace_s)
        self.cloud.join_threads(self.vm_grace_s + 10)
        self._http = None

    def __enter__(self) -> TpuEmulator:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._http is None:
            raise RuntimeError("the emulator is not started")
        return self._http.port

    @property
    def endpoint(self) -> str:
        """http://127.0.0.1:PORT: the api_endpoint for TpuClient, and $RUNNER_TPU_ENDPOINT for the runner."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def reset(self) -> None:
        """Forget every node (stopping its VMs), operation, queued resource, fault and recorded request."""
        self.faults.clear()
        self.scheduler.clear()
        self.cloud.forget_all()
        self.compute.reset()
        self.secrets.reset()
        self.launcher.stop_all(self.vm_grace_s)
        with self._requests_lock:
            self._requests.clear()

    # -- time -----------------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """The emulator's clock stands still inside the block: nothing on its agenda happens (a create's or a
        deletion's end, a stop's, a queued resource's next state), on either API, so a test can read a state that
        lasts a fraction of a second however busy the machine is. What fell due meanwhile happens at the block's
        end, in order, each at the time it was due."""
        clouds = (self.cloud, self.compute.cloud)
        for cloud in clouds:
            with cloud.lock:
                cloud.agenda.held = True
        try:
            yield
        finally:
            for cloud in clouds:
                with cloud.lock:
                    cloud.agenda.held = False
                    cloud.settle()

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass for the emulated Cloud TPU and Compute Engine: what is due within them happens now, in
        order, the rest that much sooner (a slow create or delete, rehearsed without waiting it out)."""
        with self.cloud.lock:
            self.cloud.agenda.advance(seconds)
            self.cloud.settle()
        self.compute.advance(seconds)

    # -- inspection ---------------------------------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request answered so far, oldest first (a copy)."""
        with self._requests_lock:
            return list(self._requests)

    def _record(self, request: RecordedRequest) -> None:
        with self._requests_lock:
            self._requests.append(request)

    def nodes(self) -> list[NodeInfo]:
        """Every node, as of now (a look settles the state, as an API read does)."""
        with self.cloud.lock:
            self.cloud.settle()
            return [self._info(n) for n in self.cloud.nodes.values()]

    def node(self, node: str) -> NodeInfo | None:
        with self.cloud.lock:
            self.cloud.settle()
            found = self.cloud.nodes.get(self._resolve(node, must_exist=False))
            return self._info(found) if found is not None else None

    def queued_resources(self) -> list[dict[str, Any]]:
        with self.cloud.lock:
            self.cloud.settle()
            return [q.to_json() for q in self.cloud.queued.items.values()]

    def _info(self, n: Node) -> NodeInfo:
        data = n.to_json()
        if n.vms is not None:
            logs = tuple(vm.console_log for vm in n.vms.info())
        elif n.hung:
            logs = self.launcher.console_logs(n.project, n.zone, n.node_id, n.accel.hosts)
        else:
            logs = ()
        return NodeInfo(
            n.name,
            n.project,
            n.zone,
            n.node_id,
            n.state,
            n.accel.name,
            str(n.spec.get("runtimeVersion", "")),
            n.accel.hosts,
            dict(n.spec.get("labels") or {}),
            dict(n.spec.get("metadata") or {}),
            n.queued_resource,
            n.vms.info() if n.vms is not None else (),
            data,
            logs,
        )

    def _principal(self, access_token: str) -> str | None:
        """The service account whose token this is: a TPU VM's or a Compute Engine VM's, as its metadata server
        gives it (tpu_emulator.metadata, tpu_emulator.gce.metadata); None for a token no VM was given."""
        from tpu_emulator.gce import metadata as gce_metadata

        with self.cloud.lock:
            for node in self.cloud.nodes.values():
                if any(metadata.token(node, w)["access_token"] == access_token for w in node.workers):
                    return str(node.to_json()["serviceAccount"]["email"])
        with self.compute.cloud.lock:
            for instance in self.compute.cloud.instances.values():
                if gce_metadata.token(instance)["access_token"] == access_token:
                    accounts = gce_metadata.tree(instance)["instance"]["service-accounts"]
                    return str(accounts["default"]["email"]) if "default" in accounts else None
        return None

    def _resolve(self, node: str, *, must_exist: bool = True) -> str:
        """A full node name from a full name or a bare node id."""
        if node.startswith("projects/"):
            return node
        matches = [name for name, n in self.cloud.nodes.items() if n.node_id == node]
        if len(matches) == 1:
            return matches[0]
        if must_exist or matches:
            what = "no node" if not matches else f"{len(matches)} nodes"
            raise ApiError("NOT_FOUND" if not matches else "INVALID_ARGUMENT", f"{what} with id {node!r}")
        return node

    # -- faults -------------------------------------------------------------------------------------------------

    def _add(self, kind: str, **fields: Any) -> Fault:
        return self.faults.add(fault_from_json(kind, {k: v for k, v in fields.items() if v is not None}))

    def stockout(
        self,
        zone: str | None = None,
        *,
        count: int | None = None,
        message: str | None = None,
        reason: str | None = None,
        node: str | None = None,
    ) -> Fault:
        """Creates in `zone` (every zone when None; of node ids matching `node`) are accepted, then their operation
        fails with code 8 RESOURCE_EXHAUSTED; `reason` adds an ErrorInfo. Queued resources wait instead."""
        return self._add("stockout", zone=zone, count=count, message=message, reason=reason, node=node)

    def quota_exceeded(
        self,
        zone: str | None = None,
        *,
        count: int | None = None,
        quota: str | None = None,
        limit: int = 0,
        message: str | None = None,
        reason: str | None = None,
        in_operation: bool = False,
    ) -> Fault:
        """Creates in `zone` are answered with HTTP 429 RESOURCE_EXHAUSTED carrying a google.rpc.QuotaFailure (plus
        an ErrorInfo with `reason` when given); with `in_operation` the create is accepted and its operation fails
        with code 8 and the same details instead."""
        fields = {"quota": quota, "limit": limit, "message": message, "reason": reason, "in_operation": in_operation}
        return self._add("quota", zone=zone, count=count, **fields)

    def deny(
        self, permission: str = "tpu.nodes.create", *, count: int | None = None, message: str | None = None
    ) -> Fault:
        """Requests needing `permission` (an fnmatch pattern: tpu.nodes.* ...) get 403 PERMISSION_DENIED with an
        ErrorInfo IAM_PERMISSION_DENIED {permission, resource}."""
        return self._add("permission", permission=permission, count=count, message=message)

    def rate_limit(
        self, count: int | None = 1, *, method: str | None = None, path: str | None = None, message: str | None = None
    ) -> Fault:
        """The next `count` /v2/ requests get 429 RESOURCE_EXHAUSTED with an ErrorInfo RATE_LIMIT_EXCEEDED, and by
        default Google's real message for it, which says "Quota exceeded": retry these, unlike an exhausted quota."""
        return self._add("rate_limit", count=count, method=method, path=path, message=message)

    def delete_fails(
        self,
        zone: str | None = None,
        *,
        node: str | None = None,
        count: int | None = None,
        status: str | int = "INTERNAL",
        message: str | None = None,
        reason: str | None = None,
        seconds: float | None = None,
    ) -> Fault:
        """Deletes of existing nodes (not CREATING ones) are accepted, show DELETING for `seconds` (delete_delay_s),
        then their operation fails with `status` (a name or gRPC code) and the node is back as it was, its VMs
        never stopped."""
        fields = {"status": status, "message": message, "reason": reason, "seconds": seconds}
        return self._add("delete_fails", zone=zone, node=node, count=count, **fields)

    def queued_fails(
        self,
        zone: str | None = None,
        *,
        count: int | None = None,
        status: str | int = "INTERNAL",
        message: str | None = None,
    ) -> Fault:
        """A queued resource waiting in `zone` (every zone when None) goes FAILED at its next try, with `status` (a
        name or gRPC code) and `message` in state.failedData.error, instead of provisioning."""
        return self._add("queued_fails", zone=zone, count=count, status=status, message=message)

    def slow_delete(
        self, seconds: float, *, zone: str | None = None, node: str | None = None, count: int | None = None
    ) -> Fault:
        """Nodes deleted in `zone` stay DELETING for `seconds` instead of delete_delay_s."""
        return self._add("slow_delete", seconds=seconds, zone=zone, node=node, count=count)

    def collision(
        self,
        zone: str | None = None,
        *,
        node: str | None = None,
        count: int | None = 1,
        labels: dict[str, str] | None = None,
        message: str | None = None,
    ) -> Fault:
        """The next create (in `zone`, of a node id matching `node`) finds the name taken: a READY node of the same
        type appears, labelled as another run (`labels`, by default OTHER_RUN_LABELS; none of the request's), and
        the create is answered 409 ALREADY_EXISTS (with `message`, if given)."""
        return self._add("collision", zone=zone, node=node, count=count, labels=labels, message=message)

    def boot_hang(self, zone: str | None = None, *, node: str | None = None, count: int | None = None) -> Fault:
        """Nodes created in `zone` become READY and HEALTHY, but their VMs never run the startup-script; their
        console logs say so."""
        return self._add("boot_hang", zone=zone, node=node, count=count)

    def clock_skew(
        self, seconds: int, *, zone: str | None = None, node: str | None = None, count: int | None = None
    ) -> Fault:
        """The VMs of nodes created in `zone` run with their clock `seconds` ahead (negative: behind): what their
        startup-script, supervisor and job write carries that clock; the API's own timestamps do not."""
        return self._add("clock_skew", seconds=seconds, zone=zone, node=node, count=count)

    def create_node_direct(
        self,
        project: str,
        zone: str,
        node_id: str,
        *,
        accelerator_type: str | None = None,
        runtime_version: str | None = None,
        labels: dict[str, str] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> NodeInfo:
        """A READY node that is just there, with no operation (another run's, or one from before): validated like a
        create, it runs its startup-script if `metadata` has one. The type defaults to the smallest single-host
        type offered in `zone`, the runtime to its generation's default."""
        if accelerator_type is None:
            offered = [t for t in catalog.all_types() if zone in t.zones and t.generation.in_tpu_api]
            if not offered:
                raise ApiError("INVALID_ARGUMENT", f"no accelerator type is offered in zone {zone}")
            accelerator_type = min(offered, key=lambda t: (t.hosts, t.chips)).name
        if runtime_version is None:
            try:
                runtime_version = catalog.accelerator(accelerator_type).generation.default_runtime
            except catalog.CatalogError as exc:
                raise ApiError("INVALID_ARGUMENT", str(exc)) from None
        spec: dict[str, Any] = {"acceleratorType": accelerator_type, "runtimeVersion": runtime_version}
        if labels:
            spec["labels"] = dict(labels)
        if metadata:
            spec["metadata"] = dict(metadata)
        with self.cloud.lock:
            self.cloud.settle()
            return self._info(self.cloud.insert_node(project, zone, node_id, spec))

    def http_errors(
        self,
        status: int,
        count: int | None = 1,
        *,
        method: str | None = None,
        path: str | None = None,
        message: str | None = None,
    ) -> Fault:
        """The next `count` /v2/ requests (matching method and path regex) are answered with `status`."""
        return self._add("http", status=status, count=count, method=method, path=path, message=message)

    def slow_create(self, seconds: float, *, zone: str | None = None, count: int | None = None) -> Fault:
        """Nodes created in `zone` stay CREATING for `seconds` instead of create_delay_s."""
        return self._add("slow_create", seconds=seconds, zone=zone, count=count)

    def late_operation(self, seconds: float, *, zone: str | None = None, count: int | None = None) -> Fault:
        """Nodes created in `zone` are READY `seconds` before their create operation ends (the end a client reads
        for when billing started)."""
        return self._add("late_operation", seconds=seconds, zone=zone, count=count)

    def missing_image(self, image: str = "*", *, count: int | None = None, message: str | None = None) -> Fault:
        """`docker pull` (and `docker run`) of images matching the fnmatch pattern fails as for a missing image."""
        return self._add("missing_image", image=image, count=count, message=message)

    def drop_env(self, *names: str, image: str = "*", count: int | None = None) -> Fault:
        """`docker run` of images matching `image` (fnmatch) starts the container without the variables matching
        `names` (fnmatch patterns), whatever -e or --env-file say: e.g. a job that never learns its deadline
        (RUNNER_MAX_RUNTIME_S, RUNNER_DEADLINE), so that only the bootstrap and the runner can stop it."""
        return self._add("drop_env", env=list(names), image=image, count=count)

    def active_faults(self) -> list[Fault]:
        return self.faults.list()

    def clear_faults(self, kind: str | None = None) -> None:
        self.faults.clear(kind)

    def preempt(self, node: str, *, wait: bool = True) -> str:
        """READY -> PREEMPTED: its VMs get SIGTERM, SIGKILL after vm_grace_s. Returns the node's full name."""
        with self.cloud.lock:
            self.cloud.settle()
            name = self._resolve(node)
            group = self.cloud.preempt(name)
        if group is not None:
            if wait:
                group.stop(self.vm_grace_s)
            else:
                self.cloud.spawn(group.stop, self.vm_grace_s)
        return name

    def stop_node(self, node: str) -> str:
        """READY -> STOPPING -> STOPPED, as `gcloud compute tpus tpu-vm stop` does: its VMs get SIGTERM, SIGKILL
        after vm_grace_s, and it runs nothing. Returns the node's full name."""
        with self.cloud.lock:
            self.cloud.settle()
            name = self._resolve(node)
            group = self.cloud.stop(name)
        if group is not None:
            self.cloud.spawn(group.stop, self.vm_grace_s)
        return name

    def maintain(self, node: str, state: str = "REPAIRING", seconds: float | None = 5.0) -> str:
        """The node shows `state` (REPAIRING, HIDING, HIDDEN, UNKNOWN ...) for `seconds` (None: until
        end_maintenance), then READY again; its VMs go on. Returns the node's full name."""
        with self.cloud.lock:
            self.cloud.settle()
            name = self._resolve(node)
            self.cloud.maintain(name, state, seconds)
        return name

    def maintenance_notice(self, node: str, event: str = "TERMINATE_ON_HOST_MAINTENANCE") -> str:
        """The node's VMs read `event` at instance/maintenance-event from now on (NONE takes the notice back): the
        notice of a maintenance to come, which a VM's bootstrap acts on. The node itself goes on. Returns its full
        name."""
        with self.cloud.lock:
            self.cloud.settle()
            name = self._resolve(node)
            self.cloud.get_node(name).maintenance_event = event
        return name

    def end_maintenance(self, node: str) -> None:
        """The node maintain put in a state is READY again now."""
        with self.cloud.lock:
            self.cloud.settle()
            self.cloud.end_maintenance(self._resolve(node))

    # -- dispatch -----------------------------------------------------------------------------------------------

    def _manifest(self, name: str, tag: str) -> Response:
        """The emulator doubles as the image registry, so pre-flight checks and `docker pull` on its VMs agree:
        an image is there unless a missing_image fault names it. Point runner.launch.image at it with
        RUNNER_REGISTRY_ENDPOINT=<endpoint>."""
        image = f"{name}{'@' if tag.startswith('sha256:') else ':'}{tag}"
        # A presence check uses no fault count up: only a `docker pull` does.
        if self.faults.peek("missing_image", image=image, registry=True) is not None:
            return Response.json({"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}]}, 404)
        return Response(
            200,
            b"{}",
            "application/vnd.docker.distribution.manifest.v2+json",
            {"Docker-Content-Digest": "sha256:" + "0" * 64},
        )

    def _dispatch(self, request: Request) -> Response:
        manifest = _MANIFEST_PATH.match(request.path)
        if manifest and request.method in ("HEAD", "GET"):
            return self._manifest(*manifest.groups())
        if request.path.startswith("/v2/"):
            return self.api.handle(request)
        if request.path.startswith("/compute/v1/"):
            return self.compute.api.handle(request)
        if request.path.startswith("/v1/"):
            return self.secrets.handle(request)
        if request.path.startswith("/_emulator/compute/"):
            return self.compute.admin(request, request.path.removeprefix("/_emulator/compute").rstrip("/"))
        if request.path == "/_emulator" or request.path.startswith("/_emulator/"):
            return self.admin.handle(request)
        if request.path.startswith("/_gce/"):
            found = self.compute.metadata(request)
            if found is not None:
                return found
        match = _VM_PATH.match(request.path)
        if match:
            project, zone, node_id, worker, rest = match.groups()

            def read() -> metadata.Answer:
                with self.cloud.lock:
                    self.cloud.settle()
                    node = self.cloud.nodes.get(f"projects/{project}/locations/{zone}/nodes/{node_id}")
                    workers = node.workers if node else []
                    hostnames = [self.launcher.hostname(project, zone, node_id, w) for w in workers]
                    return metadata.serve(
                        node,
                        int(worker),
                        hostnames,
                        rest or "",
                        dict(request.query),
                        request.headers.get("metadata-flavor"),
                    )

            status, kind, body = metadata.wait_for_change(read, request.query)  # the lock is not held while waiting
            return Response(status, body, kind, {"Metadata-Flavor": "Google", "ETag": metadata.etag(body)})
        if request.path == "/":
            return Response.json(
                {
                    "service": "Cloud TPU API v2 and Compute Engine API v1 emulator",
                    "api": f"{self.endpoint}/v2/",
                    "compute": f"{self.endpoint}/compute/v1/",
                    "secretmanager": f"{self.endpoint}/v1/",
                    "admin": f"{self.endpoint}/_emulator/",
                }
            )
        return Response.error(ApiError("NOT_FOUND", f"The requested URL {request.path} was not found on this server."))
