"""A real Kubernetes control plane on loopback: etcd, kube-apiserver and, when asked, kube-scheduler and
kube-controller-manager, from the binaries `make kube` built (tpu_emulator.kube.binaries).

    with KubeCluster(workdir) as cluster:       # ready: /readyz answered, the JobSet CRD Established
        api = cluster.client()                  # the official `kubernetes` client, from cluster.kubeconfig

The API server serves only its secure port on 127.0.0.1: a self-signed certificate it makes in its --cert-dir
(the kubeconfig trusts that file), a bearer token from a token file (user `admin` in system:masters), RBAC on:
anonymous requests get 403, as on GKE. Kubernetes 1.20 wants a service-account signing key: one is made with
openssl. Its ServiceAccount admission plugin is off (no token controller runs: every pod would be refused for the
missing `default` service account); everything else is the API server's default admission chain, the
MutatingAdmissionWebhook among it (tpu_emulator.kube.webhook registers there).

The watch cache is off (--watch-cache=false): a watch is served by etcd itself, so compacting etcd
(`expire_watches`) makes every older resourceVersion answer 410 Gone at once, the real fault a long-running
watcher meets on GKE (there when the watch cache's window has moved on). The API server also compacts every
5 minutes by itself, as it does everywhere.

Every process runs in a session of its own, dies with this one (PR_SET_PDEATHSIG), and `stop` ends them all.
etcd keeps its data in /dev/shm where there is one: fsync on a busy disk is what slows an API server most.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from tpu_emulator.kube import binaries

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

CRDS = Path(__file__).resolve().parent / "crds"
JOBSET_CRD = CRDS / "jobset.x-k8s.io_jobsets.yaml"
SERVICE_RANGE = "10.96.0.0/16"


class ClusterError(RuntimeError):
    """A control-plane process that would not start or answer; the message ends with its log's last lines."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Started through this small program, which asks for SIGKILL when the thread that started it dies (Linux prctl
# PR_SET_PDEATHSIG, kept across exec) and then execs the component. Not a preexec_fn: the process that starts the
# components is multi-threaded (the test session's emulators, JAX), and Python run between fork and exec can wait
# forever on a lock another thread held at the fork (ctypes' dlopen among them), which is what JAX's os.fork()
# warning says. The parent's pid, passed in, closes the race with a parent that died before the prctl.
DIE_WITH_PARENT = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass  # not Linux: only stop() ends it
if os.getppid() != int(sys.argv[1]):
    sys.exit("the process that started this one has already ended")
os.execvp(sys.argv[2], sys.argv[2:])
"""


def _server_error(exc: Exception) -> bool:
    """A 5xx from the Kubernetes client: the API server's storage not answering yet, as a server that has just said
    ready may ("rpc error: code = Internal desc = unexpected EOF" from etcd, seen at a full run's start)."""
    from kubernetes.client.rest import ApiException  # only a predicate that uses the client raises one

    return isinstance(exc, ApiException) and (exc.status or 0) >= 500


@dataclass
class Component:
    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    started: float = 0.0

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", DIE_WITH_PARENT, str(os.getpid()), *self.argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.started = time.monotonic()

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self, grace_s: float = 10.0) -> None:
        if self.popen is None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(wait)
                break
        self.popen = None


# The controllers a GKE control plane runs that a run's objects meet: the garbage collector (owner references, the
# foreground delete), the Job controller (the JobSet's Jobs make pods) and the pod garbage collector, which deletes
# a pod bound to a node that is gone (40 s after it last saw the node, checking every 20 s): with no kubelet left to
# confirm its deletion, nothing else ever removes such a pod.
CONTROLLERS = ("garbagecollector", "job", "podgc")


@dataclass
class KubeCluster:
    """etcd + kube-apiserver (+ kube-scheduler, + kube-controller-manager with `controllers`) on 127.0.0.1."""

    workdir: Path
    scheduler: bool = True
    controllers: tuple[str, ...] = CONTROLLERS  # () runs no kube-controller-manager
    crds: tuple[Path, ...] = (JOBSET_CRD,)
    ready_timeout_s: float = 180.0
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    components: dict[str, Component] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)  # seconds: apiserver-ready, crds-established, ...

    def __post_init__(self) -> None:
        found = binaries.find()
        if isinstance(found, str):
            raise ClusterError(found)
        self.bin = found
        self.workdir = Path(self.workdir)
        self.port = free_port()
        self.etcd_port = free_port()
        self.endpoint = f"https://127.0.0.1:{self.port}"
        self.etcd_endpoint = f"http://127.0.0.1:{self.etcd_port}"
        self.cert_dir = self.workdir / "certs"
        self.ca_file = self.cert_dir / "apiserver.crt"  # the self-signed certificate and its CA, in one file
        self.kubeconfig = self.workdir / "kubeconfig"
        self._etcd_data: Path | None = None
        self._health_ports: dict[str, int] = {}  # component -> its own /healthz port

    # -- start and stop -----------------------------------------------------------------------------------------

    def __enter__(self) -> KubeCluster:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        began = time.monotonic()
        try:
            self._prepare()
            self._start("etcd", self._etcd_argv())
            self._wait(lambda: self._etcd_revision() is not None, "etcd", "answering on its client URL")
            self._start("kube-apiserver", self._apiserver_argv())
            self._wait(self._ready, "kube-apiserver", "/readyz answering ok")
            self.timings["apiserver-ready"] = time.monotonic() - began
            self._write_kubeconfig()
            # The CRDs before the controller manager: its garbage collector learns the resources to follow from
            # discovery at its start, and then only every 30 s (a JobSet's foreground delete would wait for that).
            for crd in self.crds:
                self.apply_crd(crd)
            self.timings["crds-established"] = time.monotonic() - began
            if self.scheduler:
                self._start("kube-scheduler", self._scheduler_argv())
            if self.controllers:
                self._start("kube-controller-manager", self._controller_manager_argv())
            for name in ("kube-scheduler", "kube-controller-manager"):
                if name in self.components:
                    self._wait(functools.partial(self._healthy, name), name, "/healthz answering ok")
            self.timings["ready"] = time.monotonic() - began
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Every process ended (the reverse of their start), etcd's data removed; safe to call twice."""
        for name in reversed(list(self.components)):
            self.components[name].stop()
        if self._etcd_data is not None:
            shutil.rmtree(self._etcd_data, ignore_errors=True)
            self._etcd_data = None

    def pids(self) -> list[int]:
        return [c.popen.pid for c in self.components.values() if c.popen is not None and c.alive()]

    def restart_apiserver(self) -> float:
        """The API server stopped and started again on the same port and etcd (a control-plane upgrade or repair,
        as GKE does them); returns the seconds it was away. Clients keep their configuration."""
        began = time.monotonic()
        component = self.components["kube-apiserver"]
        component.stop()
        component.start()
        self._wait(self._ready, "kube-apiserver", "/readyz answering ok after a restart")
        return time.monotonic() - began

    # -- what tests and backends use ----------------------------------------------------------------------------

    def client(self) -> ApiClient:
        """The official client, configured from the kubeconfig (as a backend given a kubeconfig context would).

        No proxy, said outright (the API server is on loopback): a configuration left to find its proxy in the
        environment reads all of os.environ again on every request (the kubeconfig's token hook sets its host
        anew), and a test runner changing a variable meanwhile makes that request raise KeyError."""
        from kubernetes import client, config

        configuration = client.Configuration(proxy="", no_proxy="")
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=configuration)
        return client.ApiClient(configuration)

    def apply_crd(self, path: Path) -> None:
        """Create the CRD in `path` unmodified and wait until it is Established and its API is served."""
        import yaml
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        doc = yaml.safe_load(path.read_text())
        with self.client() as api_client:
            crds: Any = client.ApiextensionsV1Api(api_client)
            name = doc["metadata"]["name"]

            def created() -> bool:
                try:
                    crds.create_custom_resource_definition(doc)
                except ApiException as exc:
                    if exc.status != 409:  # 409: there already (an earlier try answered 5xx, or an earlier apply)
                        raise
                return True

            def established() -> bool:
                status = crds.read_custom_resource_definition(name).status
                return any(c.type == "Established" and c.status == "True" for c in (status.conditions or []))

            self._wait(created, "kube-apiserver", f"the CRD {name} created")
            self._wait(established, "kube-apiserver", f"the CRD {name} Established")
        group, version = doc["spec"]["group"], doc["spec"]["versions"][0]["name"]
        plural = doc["spec"]["names"]["plural"]
        self._wait(lambda: plural in self._get(f"/apis/{group}/{version}"), "kube-apiserver", f"{group} served")

    def expire_watches(self) -> int:
        """The 410 Gone fault: two writes to a key of no resource, then etcd compacted at its revision, so every
        watch or list from a resourceVersion seen before is answered 410 Gone by the API server (a watch from
        revision R resumes at R + 1, which a compaction at R + 1 keeps: the writes put it behind); returns the
        revision."""
        import urllib.error

        key = base64.b64encode(b"/tpu-emulator/compaction-tick").decode()
        try:
            for _ in range(2):
                self._etcd("/v3/kv/put", {"key": key, "value": base64.b64encode(b"tick").decode()})
        except (OSError, ValueError) as exc:
            raise ClusterError(f"etcd does not answer: cannot compact it ({exc})") from exc
        revision = self._etcd_revision()
        if revision is None:
            raise ClusterError("etcd does not answer: cannot compact it")
        try:
            self._etcd("/v3/kv/compaction", {"revision": revision, "physical": True})
        except urllib.error.HTTPError as exc:
            said = exc.read().decode(errors="replace")
            if "compacted" not in said:  # "required revision has been compacted": nothing written since the last
                raise ClusterError(f"etcd refused the compaction at {revision}: {said}") from exc
        return revision

    def get(self, path: str) -> Any:
        """GET `path` on the API server as the admin, parsed (the OpenAPI document, discovery)."""
        return json.loads(self._get(path))

    # -- internals ----------------------------------------------------------------------------------------------

    def _prepare(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cert_dir.mkdir(exist_ok=True)
        (self.workdir / "tokens.csv").write_text(f'{self.token},admin,admin-uid,"system:masters"\n')
        key = self.workdir / "service-account.key"
        if not key.exists():
            subprocess.run(
                ["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True, timeout=120
            )
        shm = Path("/dev/shm")
        self._etcd_data = Path(tempfile.mkdtemp(prefix="kube-etcd-", dir=shm if shm.is_dir() else None))

    def _start(self, name: str, argv: list[str]) -> None:
        component = Component(name, argv, self.workdir / "logs" / f"{name}.log")
        self.components[name] = component
        component.start()

    def _wait(self, ready: Callable[[], bool], name: str, what: str) -> None:
        """Until `ready()` (what a starting server passes through is not yet: no connection, a torn answer, a 5xx);
        a ClusterError naming `what` with the component's log when it dies or never is."""
        deadline = time.monotonic() + self.ready_timeout_s
        component = self.components.get(name)
        while True:
            try:
                if ready():
                    return
            except (OSError, ValueError, ssl.SSLError):
                pass
            except Exception as exc:
                if not _server_error(exc):
                    raise
            if component is not None and not component.alive():
                raise ClusterError(f"{name} exited before {what}:\n{component.tail()}")
            if time.monotonic() > deadline:
                tail = component.tail() if component else ""
                raise ClusterError(f"{name}: no {what} after {self.ready_timeout_s:g} s:\n{tail}")
            time.sleep(0.1)

    def _etcd_argv(self) -> list[str]:
        peer = f"http://127.0.0.1:{free_port()}"
        return [
            self.bin.path("etcd"),
            "--name=kube",
            f"--data-dir={self._etcd_data}",
            f"--listen-client-urls={self.etcd_endpoint}",
            f"--advertise-client-urls={self.etcd_endpoint}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=kube={peer}",
            "--log-level=warn",
        ]

    def _apiserver_argv(self) -> list[str]:
        key = self.workdir / "service-account.key"
        return [
            self.bin.path("kube-apiserver"),
            f"--etcd-servers={self.etcd_endpoint}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            "--insecure-port=0",
            f"--cert-dir={self.cert_dir}",
            f"--token-auth-file={self.workdir / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--anonymous-auth=true",  # anonymous is 403 under RBAC, as on a real cluster
            f"--service-account-key-file={key}",
            f"--service-account-signing-key-file={key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_RANGE}",
            "--disable-admission-plugins=ServiceAccount",
            "--allow-privileged=true",
            "--watch-cache=false",
            "--profiling=false",
            "--v=1",
        ]

    def _component_flags(self) -> list[str]:
        return [f"--kubeconfig={self.kubeconfig}", "--leader-elect=false", "--port=0", "--bind-address=127.0.0.1"]

    def _scheduler_argv(self) -> list[str]:
        self._health_ports["kube-scheduler"] = port = free_port()
        return [
            self.bin.path("kube-scheduler"),
            *self._component_flags(),
            f"--secure-port={port}",
            f"--cert-dir={self.workdir / 'certs-scheduler'}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--v=1",
        ]

    def _controller_manager_argv(self) -> list[str]:
        self._health_ports["kube-controller-manager"] = port = free_port()
        return [
            self.bin.path("kube-controller-manager"),
            *self._component_flags(),
            f"--secure-port={port}",
            f"--cert-dir={self.workdir / 'certs-controller-manager'}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            f"--controllers={','.join(self.controllers)}",
            "--use-service-account-credentials=false",
            "--v=1",
        ]

    def _write_kubeconfig(self) -> None:
        self.kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "rehearsal",
                            "cluster": {"server": self.endpoint, "certificate-authority": str(self.ca_file)},
                        }
                    ],
                    "users": [{"name": "admin", "user": {"token": self.token}}],
                    "contexts": [{"name": "rehearsal", "context": {"cluster": "rehearsal", "user": "admin"}}],
                    "current-context": "rehearsal",
                },
                indent=2,
            )
            + "\n"
        )

    def _ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def _get(self, path: str, timeout: float = 10) -> str:
        request = urllib.request.Request(self.endpoint + path, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=timeout, context=self._ssl()) as answer:
            return str(answer.read().decode())

    def _ready(self) -> bool:
        if not self.ca_file.is_file():
            return False  # the API server writes its certificate before it serves
        try:
            return self._get("/readyz", timeout=5).strip() == "ok"
        except urllib.error.HTTPError:
            return False  # 500 while its post-start hooks run

    def _healthy(self, name: str) -> bool:
        # The component's own self-signed certificate on loopback: this probe checks liveness, not identity.
        context = ssl._create_unverified_context()
        url = f"https://127.0.0.1:{self._health_ports[name]}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=5, context=context) as answer:
                return bool(answer.read().decode().strip() == "ok")
        except urllib.error.HTTPError:
            return False

    def _etcd(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            self.etcd_endpoint + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            return dict(json.load(answer))

    def _etcd_revision(self) -> int | None:
        try:
            found = self._etcd("/v3/kv/range", {"key": base64.b64encode(b"/").decode()})
        except (OSError, ValueError):
            return None
        return int(found["header"]["revision"])
