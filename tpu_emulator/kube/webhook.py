"""A real mutating admission webhook the API server calls for every pod it creates: what Kubernetes 1.20 and a
cluster without GKE cannot do for a JobSet's pods, played where GKE does it (at admission).

1. Indexed completion (Kubernetes 1.21+; 1.20's API server prunes `completionMode`, and its Job controller makes
   plain pods). A Job that the played JobSet controller made carries COMPLETION_MODE=Indexed; each of its pods gets
   the lowest completion index no live pod of the Job holds (a failed pod's index is free again, so its
   replacement takes it), as the `batch.kubernetes.io/job-completion-index` annotation and JOB_COMPLETION_INDEX in
   every container, and with a subdomain the hostname `<job>-<index>`, as the 1.21 Job controller does.
2. GKE's TPU webhook: a pod of an Indexed Job with a subdomain that requests `google.com/tpu` gets TPU_WORKER_ID
   (its index) and TPU_WORKER_HOSTNAMES (`<job>-<i>.<subdomain>` for every index of the Job), computed at each
   pod's creation: a restarted JobSet's pods get fresh values, never the last attempt's.

3. Refusals, a fault a test injects (`refuse`): a DELETE of a JobSet, Job or pod matching one is denied by a
   ValidatingWebhookConfiguration, as the API server answers any denied request ("admission webhook ... denied
   the request: ..."), `count` times: the "delete that fails" of a teardown, on the real server.

The pod webhook is registered as a MutatingWebhookConfiguration with failurePolicy Fail (no pod of an Indexed Job starts
without its index); pods of other Jobs, and pods of no Job, pass untouched. When every index is held, the pod is
refused and the Job controller tries again later, as it does after any refused create.
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import json
import ssl
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tpu_emulator.kube.certs import serving_cert
from tpu_emulator.stderr import note

COMPLETION_MODE = "tpu-emulator.kube/completion-mode"  # on a Job: what 1.20 pruned from its spec
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
INDEX_ENV = "JOB_COMPLETION_INDEX"
TPU_RESOURCE = "google.com/tpu"
CONFIG_NAME = "tpu-emulator-gke-tpu"
REFUSALS_NAME = "tpu-emulator-refusals"
_REFUSABLE = [("jobset.x-k8s.io", "v1alpha2", "jobsets"), ("batch", "v1", "jobs"), ("", "v1", "pods")]
_PENDING_S = 30.0  # an index handed out but not yet seen on a stored pod is held this long


@dataclass
class Refusal:
    """Deny `operation` on `resource` (jobsets, jobs, pods) named like `name` (fnmatch), `count` times."""

    resource: str
    name: str = "*"
    operation: str = "DELETE"
    count: int = 1
    message: str = "the delete was refused (tpu-emulator fault)"
    code: int = 500  # the HTTP status the client gets

    def matches(self, request: dict[str, Any]) -> bool:
        return (
            request.get("operation") == self.operation
            and request.get("resource", {}).get("resource") == self.resource
            and fnmatch.fnmatchcase(str(request.get("name") or ""), self.name)
        )


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def requests_tpu(pod: dict[str, Any]) -> bool:
    for c in pod.get("spec", {}).get("containers", []):
        resources = c.get("resources") or {}
        if any(TPU_RESOURCE in (resources.get(k) or {}) for k in ("limits", "requests")):
            return True
    return False


def worker_hostnames(job: str, subdomain: str, completions: int) -> str:
    return ",".join(f"{job}-{i}.{subdomain}" for i in range(completions))


class PodWebhook:
    """The HTTPS server (127.0.0.1, its own CA) and the decisions; `register` points the API server at it."""

    def __init__(self, api_client: Any, workdir: Path) -> None:
        self.api_client = api_client
        self.cert = serving_cert(workdir / "certs", "webhook")
        self._lock = threading.Lock()
        self._pending: dict[str, dict[int, float]] = {}  # job uid -> index -> when it was handed out
        self._refusals: list[Refusal] = []
        self.admitted = 0
        self.refused = 0
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    review = json.loads(body)
                    refuse = self.path.partition("?")[0] == "/refuse"  # the API server adds ?timeout=
                    answer = webhook.refusal(review) if refuse else webhook.review(review)
                except Exception as exc:  # a bug here must not hang the API server: refuse, naming it
                    note(f"[kube] webhook: {exc!r}")
                    answer = {
                        "apiVersion": "admission.k8s.io/v1",
                        "kind": "AdmissionReview",
                        "response": {
                            "uid": "",
                            "allowed": False,
                            "status": {"code": 500, "message": f"tpu-emulator: {exc!r}"},
                        },
                    }
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(self.cert.cert), str(self.cert.key))
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.base = f"https://127.0.0.1:{self._server.server_address[1]}"
        self.url = f"{self.base}/mutate-pods"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.1,), name="kube-webhook")
        self._thread.daemon = True

    def start(self) -> None:
        self._thread.start()
        self.register()

    def stop(self) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        api: Any = client.AdmissionregistrationV1Api(self.api_client)
        with contextlib.suppress(ApiException, OSError):
            api.delete_mutating_webhook_configuration(CONFIG_NAME)
        with contextlib.suppress(ApiException, OSError):
            api.delete_validating_webhook_configuration(REFUSALS_NAME)
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def register(self) -> None:
        from kubernetes import client

        body: dict[str, Any] = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": CONFIG_NAME},
            "webhooks": [
                {
                    "name": "tpu.gke.tpu-emulator.local",
                    "clientConfig": {"url": self.url, "caBundle": base64.b64encode(self.cert.ca.read_bytes()).decode()},
                    "rules": [
                        {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
                    ],
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 10,
                }
            ],
        }
        api: Any = client.AdmissionregistrationV1Api(self.api_client)
        _create_or_replace(api, "mutating", body)
        ca = base64.b64encode(self.cert.ca.read_bytes()).decode()
        refusals: dict[str, Any] = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": REFUSALS_NAME},
            "webhooks": [
                {
                    "name": "refusals.tpu-emulator.local",
                    "clientConfig": {"url": f"{self.base}/refuse", "caBundle": ca},
                    "rules": [
                        {"operations": ["DELETE"], "apiGroups": [g], "apiVersions": [v], "resources": [r]}
                        for g, v, r in _REFUSABLE
                    ],
                    "failurePolicy": "Ignore",  # the fault's webhook never stands in the way otherwise
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 5,
                }
            ],
        }
        _create_or_replace(api, "validating", refusals)

    def refuse(self, refusal: Refusal) -> Refusal:
        """Inject a refusal (a delete that fails); it is used up after `count` denials."""
        with self._lock:
            self._refusals.append(refusal)
        return refusal

    def clear(self) -> None:
        """Every refusal not used up, forgotten."""
        with self._lock:
            self._refusals.clear()

    def refusal(self, review: dict[str, Any]) -> dict[str, Any]:
        request = review["request"]
        response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
        with self._lock:
            found = next((r for r in self._refusals if r.count > 0 and r.matches(request)), None)
            if found is not None:
                found.count -= 1
                response = {"uid": request["uid"], "allowed": False,
                            "status": {"code": found.code, "message": found.message}}  # fmt: skip
        return {"apiVersion": review.get("apiVersion", "admission.k8s.io/v1"), "kind": "AdmissionReview",
                "response": response}  # fmt: skip

    # -- decisions ----------------------------------------------------------------------------------------------

    def review(self, review: dict[str, Any]) -> dict[str, Any]:
        request = review["request"]
        response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
        patch, refusal = self.mutate(request["object"], request.get("namespace") or "default")
        if refusal:
            self.refused += 1
            response = {"uid": request["uid"], "allowed": False, "status": {"code": 409, "message": refusal}}
        elif patch:
            self.admitted += 1
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        return {
            "apiVersion": review.get("apiVersion", "admission.k8s.io/v1"),
            "kind": "AdmissionReview",
            "response": response,
        }

    def _job(self, pod: dict[str, Any], namespace: str) -> Any | None:
        from kubernetes import client

        owner = next(
            (
                o
                for o in pod.get("metadata", {}).get("ownerReferences") or []
                if o.get("kind") == "Job" and o.get("controller")
            ),
            None,
        )
        if owner is None:
            return None
        job: Any = client.BatchV1Api(self.api_client).read_namespaced_job(owner["name"], namespace)
        annotations = job.metadata.annotations or {}
        return job if annotations.get(COMPLETION_MODE) == "Indexed" else None

    def _index(self, job: Any, namespace: str) -> int | None:
        """The lowest index of `job` that no live or succeeded pod holds, nor one handed out moments ago."""
        from kubernetes import client

        core: Any = client.CoreV1Api(self.api_client)
        pods = core.list_namespaced_pod(namespace, label_selector=f"controller-uid={job.metadata.uid}")
        held: set[int] = set()
        for pod in pods.items:
            meta: Any = pod.metadata
            value = (meta.annotations or {}).get(INDEX_ANNOTATION)
            if value is None or pod.status.phase == "Failed" or meta.deletion_timestamp is not None:
                continue
            held.add(int(value))
        now = time.monotonic()
        pending = self._pending.setdefault(job.metadata.uid, {})
        for index, when in list(pending.items()):
            if index in held or now - when > _PENDING_S:
                del pending[index]
        taken = held | set(pending)
        free = next((i for i in range(job.spec.completions or 1) if i not in taken), None)
        if free is not None:
            pending[free] = now
        return free

    def mutate(self, pod: dict[str, Any], namespace: str) -> tuple[list[dict[str, Any]], str | None]:
        job = self._job(pod, namespace)
        if job is None:
            return [], None
        with self._lock:
            index = self._index(job, namespace)
        if index is None:
            return [], f"every completion index of Job {job.metadata.name} is held by a pod (tpu-emulator)"
        spec = pod["spec"]
        env = {INDEX_ENV: str(index)}
        subdomain = spec.get("subdomain")
        completions = job.spec.completions or 1
        if subdomain and requests_tpu(pod):  # GKE's TPU webhook
            env["TPU_WORKER_ID"] = str(index)
            env["TPU_WORKER_HOSTNAMES"] = worker_hostnames(job.metadata.name, subdomain, completions)
        patch: list[dict[str, Any]] = []
        if not pod["metadata"].get("annotations"):
            patch.append({"op": "add", "path": "/metadata/annotations", "value": {}})
        patch.append({"op": "add", "path": f"/metadata/annotations/{_escape(INDEX_ANNOTATION)}", "value": str(index)})
        if subdomain and not spec.get("hostname"):
            patch.append({"op": "add", "path": "/spec/hostname", "value": f"{job.metadata.name}-{index}"})
        for i, c in enumerate(spec.get("containers", [])):
            kept = [e for e in c.get("env") or [] if e.get("name") not in env]
            value = [*kept, *({"name": k, "value": v} for k, v in env.items())]
            patch.append({"op": "add", "path": f"/spec/containers/{i}/env", "value": value})
        return patch, None


def _create_or_replace(api: Any, kind: str, body: dict[str, Any]) -> None:
    from kubernetes.client.rest import ApiException

    name = body["metadata"]["name"]
    try:
        getattr(api, f"create_{kind}_webhook_configuration")(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        current = getattr(api, f"read_{kind}_webhook_configuration")(name)
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        getattr(api, f"replace_{kind}_webhook_configuration")(name, body)
