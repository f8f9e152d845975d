"""The kubelet, played for the fake TPU nodes: every pod the real scheduler binds to one of them runs here, as the
emulator's VMs run their containers (runner.backends.container.plan_launch, the one place that decides): the
image's entrypoint as a local process with the pod's environment (`mode="process"`), or the image itself under
Podman or Docker (`mode="container"`, host network: the pod reaches the emulators on loopback). A pod's annotation
RUN_ANNOTATION chooses for that pod.

What a kubelet writes back goes through the API: phase Running with podIP/hostIP 127.0.0.1 and the containers'
running state once started, then Succeeded or Failed with each container's exit code and reason (Completed, Error,
OOMKilled is never claimed). A pod being deleted (deletionTimestamp) has its processes stopped within its grace
period, then is removed with grace 0, as the kubelet confirms a deletion: without that a pod bound to a node never
goes, and a foreground delete never ends. `take_node` is a node taken away (preemption, maintenance): its pods get
the DisruptionTarget condition (reason TerminationByKubelet, as a kubelet's graceful node shutdown sets it from
Kubernetes 1.26 on), then their processes are stopped and they end Failed, as GKE's graceful node shutdown leaves
them, then the Node is deleted.

Played, not real: no image pull (the process mode runs this checkout; the container mode needs the image in the
engine), no probes, volumes or resource limits, restartPolicy OnFailure restarts the container in place, and
there are no logs through the API (`kubectl logs` needs a kubelet's server): a run's logs are in its run directory,
and each container's output is in the kubelet's folder (`log_of`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from runner.backends import container
from runner.backends.container import Prefer
from runner.launch.engine import Engine
from tpu_emulator.kube.cluster import free_port
from tpu_emulator.kube.jobset import GLOBAL_INDEX, GLOBAL_REPLICAS, RESTARTS
from tpu_emulator.kube.jobset import UID as JOBSET_UID
from tpu_emulator.kube.nodes import PLAYED_LABEL
from tpu_emulator.kube.watching import Follower
from tpu_emulator.stderr import note

RUN_ANNOTATION = "tpu-emulator.kube/run"  # on a pod: "container" or "process", over the kubelet's own mode
MARKER = "RUNNER_EMULATOR_POD"  # <pod uid>, in every process of a pod: stopping the pod finds them all
SHUTDOWN_REASON = "Terminated"
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."
DISRUPTION = "DisruptionTarget"  # the pod condition a kubelet sets before it ends a pod for its node
DISRUPTION_REASON = "TerminationByKubelet"
ENGINE_EXITS = (125, 126, 127)  # `docker run`/`podman run`: the engine failed, the command cannot run, not found


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass
class Running:
    """One container of a pod as a process (or a container under an engine)."""

    name: str
    launch: container.Launch
    popen: subprocess.Popen[bytes]
    log: Path
    started: str
    restarts: int = 0
    exit_code: int | None = None
    finished: str | None = None


@dataclasses.dataclass
class PodRun:
    uid: str
    namespace: str
    name: str
    node: str
    folder: Path
    containers: list[Running] = dataclasses.field(default_factory=list)
    stopping: bool = False
    done: threading.Event = dataclasses.field(default_factory=threading.Event)


class Kubelet:
    def __init__(
        self,
        api_client: Any,
        workdir: Path,
        *,
        mode: Prefer = "process",
        engine: Engine | None = None,
        max_grace_s: float = 30.0,
        status_patience_s: float = 120.0,
    ) -> None:
        """`max_grace_s` caps a deleted pod's terminationGracePeriodSeconds (the tests do not wait 30 s);
        `status_patience_s` is how long a status write waits for an API server that is away."""
        from kubernetes import client

        self.core: Any = client.CoreV1Api(api_client)  # Any: the client's models are Optional everywhere
        self.workdir = Path(workdir)
        self.mode = mode
        self.engine = engine
        self.max_grace_s = max_grace_s
        self.status_patience_s = status_patience_s
        self._lock = threading.Lock()
        self._nodes: set[str] = set()
        self._parked: dict[str, dict[str, Any]] = {}  # node not seen yet -> its pods by uid, as last told
        self._pods: dict[str, PodRun] = {}
        self._coordinators: dict[tuple[str, str], str] = {}  # (JobSet uid, restart attempt) -> host:port
        self.started = 0
        self.errors: list[str] = []
        self.nodes_follower = Follower(
            "kubelet-nodes", self.core.list_node, self._on_node, self._sync_nodes, {"label_selector": PLAYED_LABEL}
        )
        self.pods_follower = Follower(
            "kubelet-pods", self.core.list_pod_for_all_namespaces, self._on_pod, self._sync_pods
        )

    def start(self) -> None:
        self.nodes_follower.start()
        self.nodes_follower.synced.wait(60)
        self.pods_follower.start()
        self.pods_follower.synced.wait(60)

    def stop(self) -> None:
        self.pods_follower.close()
        self.nodes_follower.close()
        with self._lock:
            runs = list(self._pods.values())
        for run in runs:
            self._kill(run, grace_s=2.0)

    def log_of(self, namespace: str, pod: str, container_name: str | None = None) -> Path | None:
        with self._lock:
            for run in self._pods.values():
                if run.namespace == namespace and run.name == pod:
                    for c in run.containers:
                        if container_name in (None, c.name):
                            return c.log
        return None

    def pids_of(self, uid: str = "") -> list[int]:
        """The live processes of the pod `uid` (every pod's with ""), found by their marker: none once it is gone."""
        return container.marked_pids(MARKER, uid)

    # -- nodes --------------------------------------------------------------------------------------------------

    def _on_node(self, kind: str, node: Any) -> None:
        with self._lock:
            if kind == "DELETED":
                self._nodes.discard(node.metadata.name)
                self._parked.pop(node.metadata.name, None)
            else:
                self._nodes.add(node.metadata.name)
        if kind == "DELETED":
            self._node_gone(node.metadata.name, grace_s=0.0)
        else:
            self._unpark({node.metadata.name})

    def _sync_nodes(self, items: list[Any]) -> None:
        with self._lock:
            self._nodes = {n.metadata.name for n in items}
        self._unpark({n.metadata.name for n in items})

    def _unpark(self, names: set[str]) -> None:
        """Pods bound to a node before this kubelet saw the node (its two watches are apart): handled now, as a
        kubelet that registers finds the pods already bound to it."""
        with self._lock:
            pods = [pod for name in names for pod in self._parked.pop(name, {}).values()]
        for pod in pods:
            self._on_pod("MODIFIED", pod)

    def kill_pod(self, namespace: str, name: str, sig: int = signal.SIGKILL) -> bool:
        """A pod's processes killed (the OOM killer, a crash): the pod ends Failed with 128 + sig. False when the
        kubelet runs no such pod."""
        with self._lock:
            run = next((r for r in self._pods.values() if (r.namespace, r.name) == (namespace, name)), None)
        if run is None or run.done.is_set():
            return False
        for pid in container.marked_pids(MARKER, run.uid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        return True

    def take_node(self, name: str, *, grace_s: float = 0.0) -> list[str]:
        """The node taken away: its pods stopped (SIGTERM, SIGKILL after grace_s) and Failed, then the Node deleted.
        Returns the pods it ran."""
        gone = self._node_gone(name, grace_s=grace_s)
        with contextlib.suppress(Exception):
            self.core.delete_node(name)
        return gone

    def _node_gone(self, name: str, *, grace_s: float) -> list[str]:
        with self._lock:
            runs = [r for r in self._pods.values() if r.node == name and not r.done.is_set()]
            for run in runs:
                run.stopping = True
        for run in runs:
            # Before the pod is stopped, as a kubelet's graceful node shutdown marks it (Kubernetes 1.26+, GA in
            # 1.31: PodDisruptionConditions): whoever sees the job stop can tell it was the node's doing.
            self._write_status(run, None, disruption=DISRUPTION_REASON)
        for run in runs:
            self._kill(run, grace_s)
            self._write_status(run, "Failed", reason=SHUTDOWN_REASON, message=SHUTDOWN_MESSAGE)
            run.done.set()
        return [f"{r.namespace}/{r.name}" for r in runs]

    # -- pods ---------------------------------------------------------------------------------------------------

    def _sync_pods(self, items: list[Any]) -> None:
        for pod in items:
            self._on_pod("ADDED", pod)

    def _on_pod(self, kind: str, pod: Any) -> None:
        node = pod.spec.node_name
        with self._lock:
            if node and node not in self._nodes:  # not seen yet: kept, the newest word on it, for when it is
                parked = self._parked.setdefault(node, {})
                if kind == "DELETED":
                    parked.pop(pod.metadata.uid, None)
                else:
                    parked[pod.metadata.uid] = pod
                return
            if not node:
                return
            run = self._pods.get(pod.metadata.uid)
        if kind == "DELETED":
            if run is not None and not run.done.is_set():
                threading.Thread(target=self._kill, args=(run, 2.0), daemon=True).start()
            return
        if pod.metadata.deletion_timestamp is not None:
            if run is None or not run.stopping:
                threading.Thread(target=self._delete, args=(pod, run), daemon=True).start()
            return
        if run is None and pod.status.phase in (None, "Pending"):
            threading.Thread(target=self._start_pod, args=(pod,), name=f"pod-{pod.metadata.name}", daemon=True).start()

    def _start_pod(self, pod: Any) -> None:
        meta = pod.metadata
        folder = self.workdir / "pods" / f"{meta.namespace}_{meta.name}_{meta.uid[:8]}"
        run = PodRun(meta.uid, meta.namespace, meta.name, pod.spec.node_name, folder)
        with self._lock:
            if meta.uid in self._pods:
                return
            self._pods[meta.uid] = run
        try:
            for spec in pod.spec.containers:
                run.containers.append(self._start_container(pod, spec, run))
        except Exception as exc:
            self.errors.append(f"{meta.namespace}/{meta.name}: {exc!r}")
            note(f"[kube] kubelet could not start {meta.namespace}/{meta.name}: {exc!r}")
            self._kill(run, 0.0)
            self._write_status(run, "Failed", reason="StartError", message=str(exc)[:500])
            run.done.set()
            return
        self.started += 1
        self._write_status(run, "Running")
        restart = pod.spec.restart_policy
        for c in run.containers:
            threading.Thread(target=self._reap, args=(run, c, pod, restart), daemon=True).start()

    def _start_container(self, pod: Any, spec: Any, run: PodRun, restarts: int = 0) -> Running:
        env = self._env(pod, spec)
        env[MARKER] = pod.metadata.uid
        home = run.folder / spec.name / "home"
        home.mkdir(parents=True, exist_ok=True)
        command, args = list(spec.command or []), list(spec.args or [])
        name = f"k8s_{spec.name}_{pod.metadata.name}_{pod.metadata.namespace}_{pod.metadata.uid[:8]}"
        mode = (pod.metadata.annotations or {}).get(RUN_ANNOTATION, self.mode)
        if mode == "container":
            flags = ["--network", "host", *(["--entrypoint", command[0]] if command else [])]
            if spec.working_dir:
                flags += ["--workdir", spec.working_dir]
            launch = container.plan_launch(
                spec.image,
                env,
                name=name,
                data_dir=None,
                storage_root=None,
                prefer="container",
                engine=self.engine,
                flags=flags,
            )
            launch = dataclasses.replace(launch, argv=[*launch.argv, *command[1:], *args])
        else:
            base = {"HOME": str(home), "TMPDIR": str(home), "LANG": "C.UTF-8"}
            if os.environ.get("PYTHONPATH"):
                base["PYTHONPATH"] = os.environ["PYTHONPATH"]  # the image has the runner installed; here, this tree
            launch = container.plan_launch(
                spec.image, {**base, **env}, name=name, data_dir=None, storage_root=None, prefer="process"
            )
            argv = [*command, *args] if command else [*launch.argv, *args]
            launch = dataclasses.replace(launch, argv=argv)
        log = run.folder / f"{spec.name}.log"
        popen = container.start(launch, log)
        return Running(spec.name, launch, popen, log, _now(), restarts)

    def _env(self, pod: Any, spec: Any) -> dict[str, str]:
        env: dict[str, str] = {"HOSTNAME": pod.spec.hostname or pod.metadata.name}
        for item in spec.env or []:
            if item.value_from is None:
                env[item.name] = item.value or ""
            elif item.value_from.field_ref is not None:
                env[item.name] = _field(pod, item.value_from.field_ref.field_path)
            elif item.value_from.config_map_key_ref is not None:
                ref = item.value_from.config_map_key_ref
                data = self.core.read_namespaced_config_map(ref.name, pod.metadata.namespace).data or {}
                env[item.name] = data.get(ref.key, "")
            elif item.value_from.secret_key_ref is not None:
                import base64

                ref = item.value_from.secret_key_ref
                data = self.core.read_namespaced_secret(ref.name, pod.metadata.namespace).data or {}
                env[item.name] = base64.b64decode(str(data.get(ref.key, ""))).decode()
        return {**self._jax_cluster(pod, env), **env}

    def _jax_cluster(self, pod: Any, env: dict[str, str]) -> dict[str, str]:
        """JAX's cluster for a multi-host TPU pod, as keras.distribution.initialize() reads it from the environment.
        On GKE, jax.distributed.initialize() finds it by itself from TPU_WORKER_HOSTNAMES and TPU_WORKER_ID (the
        coordinator: host 0's name), times the JobSet's slices; every pod here is this machine, where those
        hostnames do not resolve, so the coordinator is a port this kubelet reserves per JobSet attempt (as the
        emulator's VMs get one: tpu_emulator.vm.COORDINATOR). {} for a pod without TPU_WORKER_HOSTNAMES."""
        hostnames = env.get("TPU_WORKER_HOSTNAMES", "")
        if not hostnames or "TPU_WORKER_ID" not in env:
            return {}
        labels = pod.metadata.labels or {}
        owner = labels.get(JOBSET_UID) or labels.get("controller-uid", "")
        key = (owner, labels.get(RESTARTS, "0"))
        with self._lock:
            if key not in self._coordinators:
                self._coordinators[key] = f"127.0.0.1:{free_port()}"
            coordinator = self._coordinators[key]
        hosts = len(hostnames.split(","))
        slices = int(labels.get(GLOBAL_REPLICAS, "1"))
        slice_index = int(labels.get(GLOBAL_INDEX, "0"))
        return {
            "KERAS_DISTRIBUTION_JOB_ADDRESSES": coordinator,
            "KERAS_DISTRIBUTION_NUM_PROCESSES": str(hosts * slices),
            "KERAS_DISTRIBUTION_PROCESS_ID": str(slice_index * hosts + int(env["TPU_WORKER_ID"])),
        }

    def _reap(self, run: PodRun, c: Running, pod: Any, restart: str | None) -> None:
        while True:
            code = c.popen.wait()
            c.exit_code = code if code >= 0 else 128 - code
            c.finished = _now()
            if run.stopping or restart != "OnFailure" or c.exit_code == 0:
                break
            spec = next(s for s in pod.spec.containers if s.name == c.name)
            fresh = self._start_container(pod, spec, run, c.restarts + 1)
            run.containers[run.containers.index(c)] = c = fresh
            self._write_status(run, "Running")
        if run.stopping or any(x.exit_code is None for x in run.containers):
            return
        with self._lock:
            if run.done.is_set():
                return
            run.done.set()
        phase = "Succeeded" if all(x.exit_code == 0 for x in run.containers) else "Failed"
        refused = [x for x in run.containers if x.launch.mode != "process" and x.exit_code in ENGINE_EXITS]
        if refused:  # the engine could not run the container: its own words, as a kubelet's StartError says them
            tail = refused[0].log.read_text(errors="replace").strip()[-400:] if refused[0].log.is_file() else ""
            message = f"{refused[0].launch.argv[0]} run exited {refused[0].exit_code}: {tail or 'no output'}"
            self._write_status(run, phase, reason="StartError", message=message)
        else:
            self._write_status(run, phase)

    def _kill(self, run: PodRun, grace_s: float) -> None:
        run.stopping = True
        for c in run.containers:
            if c.launch.mode != "process":
                container.stop_container(c.launch.mode, c.launch.name, grace_s)
        container.stop_marked(MARKER, run.uid, grace_s)
        for c in run.containers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.popen.wait(10)

    def _delete(self, pod: Any, run: PodRun | None) -> None:
        """A pod being deleted: its processes stopped within its grace period, then the object removed."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        if run is not None:
            grace = pod.metadata.deletion_grace_period_seconds
            self._kill(run, min(float(grace if grace is not None else 30), self.max_grace_s))
            run.done.set()
        options = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=pod.metadata.uid)
        )
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, body=options)

    # -- status -------------------------------------------------------------------------------------------------

    def _write_status(
        self,
        run: PodRun,
        phase: str | None,
        *,
        reason: str | None = None,
        message: str | None = None,
        disruption: str | None = None,
    ) -> None:
        """Read the pod, write its status with that resourceVersion (a conflict reads again); while the API server
        is away (restarting) keep trying, as a kubelet does, for up to `status_patience_s`. `disruption`: only the
        DisruptionTarget condition added, with that reason (phase None: the phase stays)."""
        from kubernetes.client.rest import ApiException

        deadline = time.monotonic() + self.status_patience_s
        while time.monotonic() < deadline:
            try:
                pod = self.core.read_namespaced_pod(run.name, run.namespace)
                if pod.metadata.uid != run.uid or pod.status.phase in ("Succeeded", "Failed"):
                    return
                body = self.core.api_client.sanitize_for_serialization(pod)
                if disruption is not None:
                    status = body.get("status") or {}
                    condition = {"type": DISRUPTION, "status": "True", "reason": disruption,
                                 "message": SHUTDOWN_MESSAGE, "lastTransitionTime": _now()}  # fmt: skip
                    status["conditions"] = [*(status.get("conditions") or []), condition]
                    body["status"] = status
                else:
                    assert phase is not None
                    body["status"] = self._status(run, phase, body.get("status") or {}, reason, message)
                self.core.replace_namespaced_pod_status(run.name, run.namespace, body)
                return
            except ApiException as exc:
                if exc.status == 404:
                    return  # gone
                if exc.status != 409 and exc.status < 500:
                    self.errors.append(f"status of {run.namespace}/{run.name}: {exc.status} {exc.reason}")
                    return
            except Exception:  # the API server away: connection refused or reset
                time.sleep(0.2)
        self.errors.append(f"status of {run.namespace}/{run.name}: the API server did not answer")

    def _status(
        self, run: PodRun, phase: str, old: dict[str, Any], reason: str | None, message: str | None
    ) -> dict[str, Any]:
        now = _now()
        running = phase == "Running"
        ready = "True" if running else "False"
        conditions = [c for c in old.get("conditions", []) if c["type"] in ("PodScheduled", DISRUPTION)]
        for kind, value in (("Initialized", "True"), ("ContainersReady", ready), ("Ready", ready)):
            conditions.append({"type": kind, "status": value, "lastTransitionTime": now})
        statuses = []
        for c in run.containers:
            if c.exit_code is None and phase == "Running":
                state: dict[str, Any] = {"running": {"startedAt": c.started}}
            else:
                code = c.exit_code if c.exit_code is not None else 137
                why = "Completed" if code == 0 else "Error"
                state = {
                    "terminated": {
                        "exitCode": code,
                        "reason": why,
                        "startedAt": c.started,
                        "finishedAt": c.finished or now,
                    }
                }
            statuses.append(
                {
                    "name": c.name,
                    "image": c.launch.name,
                    "imageID": "",
                    "ready": running and c.exit_code is None,
                    "restartCount": c.restarts,
                    "started": c.exit_code is None,
                    "state": state,
                    "containerID": f"emulated://{c.popen.pid}",
                }
            )
        status = {
            **old,
            "phase": phase,
            "conditions": conditions,
            "containerStatuses": statuses,
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": old.get("startTime") or now,
        }
        if reason:
            status["reason"] = reason
        if message:
            status["message"] = message
        return status


def _field(pod: Any, path: str) -> str:
    """A downward-API fieldRef, as the kubelet resolves it."""
    meta = pod.metadata
    simple = {
        "metadata.name": meta.name,
        "metadata.namespace": meta.namespace,
        "metadata.uid": meta.uid,
        "spec.nodeName": pod.spec.node_name,
        "spec.serviceAccountName": pod.spec.service_account_name,
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
    }
    if path in simple:
        return str(simple[path] or "")
    for prefix, values in (("metadata.labels", meta.labels), ("metadata.annotations", meta.annotations)):
        if path.startswith(prefix + "['") and path.endswith("']"):
            return str((values or {}).get(path[len(prefix) + 2 : -2], ""))
    return ""
