"""The gke backend's two seams: GKE's API for clusters and node pools (google-cloud-container, REST), and the
cluster's own Kubernetes API (the official `kubernetes` client) for the JobSet and its pods.

$RUNNER_GKE_ENDPOINT (e.g. http://127.0.0.1:8480, the GKE emulator) points the container client at another server
with anonymous credentials, as the other backends' endpoints do; a cluster reached through it is then called with
the bearer token in $RUNNER_GKE_TOKEN (an emulated cluster's own), where a real one takes the caller's Google
access token (Application Default Credentials), as `gke-gcloud-auth-plugin` gives kubectl. A cluster named by a
kubeconfig context is reached as kubectl would ($KUBECONFIG or ~/.kube/config).

Kubernetes answers are errors in words here: 403 (RBAC) and 404 said as such, 409 AlreadyExists (or a conflict
the caller reads again), a refused or failed request with the server's own message. A server that does not answer
(an API server restarting: a control-plane upgrade or repair) is `Unreachable`, which the callers wait out.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from runner.backends.google_api import ApiFailure, default_retry, failure_of, plain_failure
from runner.credentials import anonymous, default_credentials
from runner.errors import AlreadyExists, BackendError, NoCapacity, QuotaExceeded
from runner.timings import Timings

ENDPOINT_ENV = "RUNNER_GKE_ENDPOINT"
TOKEN_ENV = "RUNNER_GKE_TOKEN"
GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
STOCKOUT = "GCE_STOCKOUT"  # GKE passes Compute Engine's reason on in the operation's message
QUOTA = "QUOTA_EXCEEDED"
T = TypeVar("T")


class Unreachable(BackendError):
    """The cluster's API server did not answer (connection refused or reset, a timeout): nothing is known."""


class ClusterBusy(BackendError):
    """Another operation is changing the cluster (a teammate's node pool, an upgrade, a repair): GKE refuses node
    pool creates and deletes until it is done (FAILED_PRECONDITION, CLUSTER_ALREADY_HAS_OPERATION); ask again."""


BUSY_REASON = "CLUSTER_ALREADY_HAS_OPERATION"


@dataclass(frozen=True)
class OperationState:
    done: bool
    failure: ApiFailure | None = None


def explain(failure: ApiFailure, action: str, *, project: str, zone: str) -> BackendError:
    """A failure of GKE's API in words: a stockout (NoCapacity: the next zone may have it), a quota, the rest."""
    message = failure.said()
    if STOCKOUT in message or "does not have enough resources" in message:
        return NoCapacity(
            f"no capacity to {action} in {zone}: {message}", hint="another zone (accelerator.zones) may have it"
        )
    if QUOTA in message or failure.is_quota:
        return QuotaExceeded(
            f"quota exceeded to {action}: {message}", hint="request more TPU quota for the region, or a smaller type"
        )
    if failure.code == "PERMISSION_DENIED":
        return BackendError(
            f"permission denied to {action}: {message}",
            hint="the account needs container.clusters.update on the cluster (roles/container.admin)",
        )
    return plain_failure(failure, action, project=project, zone=zone)


class GkeApi:
    """google-cloud-container's ClusterManagerClient: clusters (read) and node pools (create, read, delete)."""

    def __init__(self, timings: Timings | None = None) -> None:
        self.timings = timings or Timings()
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            from google.cloud import container_v1

            endpoint = os.environ.get(ENDPOINT_ENV)
            if endpoint:
                self._client = container_v1.ClusterManagerClient(
                    transport="rest", credentials=anonymous(), client_options={"api_endpoint": endpoint}
                )
            else:
                self._client = container_v1.ClusterManagerClient(transport="rest", credentials=default_credentials())
        return self._client

    def call(self, action: str, fn: Callable[..., T], *, where: str, **kwargs: Any) -> T:
        retry = default_retry(initial_s=self.timings.api_retry_initial_s)
        try:
            return fn(**kwargs, retry=retry)
        except Exception as exc:
            failure = failure_of(exc)
            if failure is None:
                raise
            if failure.code == "ALREADY_EXISTS":
                raise AlreadyExists(f"could not {action}: {failure.said()}") from exc
            if failure.code == "FAILED_PRECONDITION" and (
                failure.reason == BUSY_REASON or "incompatible operation" in failure.message
            ):
                raise ClusterBusy(f"could not {action} yet: {failure.said()}") from exc
            raise explain(failure, action, project=where, zone=where) from exc

    def cluster(self, path: str) -> tuple[str, str]:
        """(endpoint, base64 CA certificate) of the cluster at `path`."""
        found = self.call(f"read cluster {path}", self.client.get_cluster, where=path, name=path)
        return str(found.endpoint), str(found.master_auth.cluster_ca_certificate)

    def create_pool(self, cluster: str, body: dict[str, Any]) -> str:
        """The create's operation name."""
        from google.cloud import container_v1

        pool = container_v1.NodePool.from_json(json.dumps(body), ignore_unknown_fields=False)
        op = self.call(
            f"create node pool {body['name']}",
            self.client.create_node_pool,
            where=body["locations"][0],
            parent=cluster,
            node_pool=pool,
        )
        return str(op.name)

    def pool(self, path: str) -> Any | None:
        """The node pool at `path`, None once it is gone."""
        try:
            return self.call(f"read node pool {path}", self.client.get_node_pool, where=path, name=path)
        except BackendError as exc:
            if isinstance(exc.__cause__, Exception) and (f := failure_of(exc.__cause__)) and f.code == "NOT_FOUND":
                return None
            raise

    def pools(self, cluster: str) -> list[Any]:
        answer = self.call(f"list node pools of {cluster}", self.client.list_node_pools, where=cluster, parent=cluster)
        return list(answer.node_pools)

    def delete_pool(self, path: str) -> str | None:
        """The delete's operation name; None when the pool was gone already."""
        try:
            op = self.call(f"delete node pool {path}", self.client.delete_node_pool, where=path, name=path)
        except BackendError as exc:
            if isinstance(exc.__cause__, Exception) and (f := failure_of(exc.__cause__)) and f.code == "NOT_FOUND":
                return None
            raise
        return str(op.name)

    def operation(self, cluster: str, name: str) -> OperationState:
        from google.cloud import container_v1

        location = cluster.split("/clusters/")[0]
        op = self.call(
            f"read operation {name}", self.client.get_operation, where=cluster, name=f"{location}/operations/{name}"
        )
        done = op.status == container_v1.Operation.Status.DONE
        if done and op.error and op.error.code:
            codes = {3: "INVALID_ARGUMENT", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION", 13: "INTERNAL"}
            code = codes.get(op.error.code, "UNKNOWN")
            return OperationState(True, ApiFailure(code, op.error.message or op.status_message, from_operation=True))
        return OperationState(done)


class KubeApi:
    """The cluster's Kubernetes API through the official client, from a kubeconfig context or a GKE cluster."""

    def __init__(self, cluster: str, *, context: str | None = None, gke: GkeApi | None = None) -> None:
        self.cluster = cluster  # projects/P/locations/L/clusters/N or context:NAME: what messages name
        self.context = context
        self.gke = gke
        self._client: Any = None
        self._ca: str | None = None

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self._connect()
        return self._client

    def _connect(self) -> Any:
        from kubernetes import client, config

        if self.cluster.startswith("context:") or self.gke is None:
            context = self.context or self.cluster.removeprefix("context:")
            try:
                loaded: Any = client.Configuration()
                # $KUBECONFIG as it is now (the client read it once, at its import)
                config.load_kube_config(
                    config_file=os.environ.get("KUBECONFIG"), context=context, client_configuration=loaded
                )
                loaded.retries = False  # this seam retries itself; urllib3's would sleep out a Retry-After unseen
                return client.ApiClient(loaded)
            except (config.ConfigException, OSError, ValueError) as exc:
                raise BackendError(
                    f"kubeconfig context {context!r}: {exc}",
                    hint="check $KUBECONFIG (or ~/.kube/config) and `kubectl config get-contexts`",
                ) from None
        endpoint, ca = self.gke.cluster(self.cluster)
        configuration: Any = client.Configuration()
        configuration.host = f"https://{endpoint}"
        with tempfile.NamedTemporaryFile("wb", prefix="gke-ca-", suffix=".crt", delete=False) as out:
            out.write(base64.b64decode(ca))
        self._ca = out.name
        configuration.ssl_ca_cert = out.name
        configuration.api_key_prefix["authorization"] = "Bearer"
        configuration.api_key["authorization"] = _token()
        configuration.retries = False
        if not os.environ.get(ENDPOINT_ENV):
            configuration.refresh_api_key_hook = lambda c: c.api_key.update(authorization=_token())
        return client.ApiClient(configuration)

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
        if self._ca is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._ca)
            self._ca = None

    def custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.client)

    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.client)

    def call(self, action: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One request, its failure in words (Unreachable when the server did not answer)."""
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        kwargs.setdefault("_request_timeout", 30)
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            raise self.explain(exc, action) from exc
        except (OSError, HTTPError) as exc:  # refused, reset, a timeout: urllib3's MaxRetryError, ProtocolError
            raise Unreachable(
                f"the API server of {self.cluster} did not answer to {action}: {type(exc).__name__}",
                hint="it may be restarting (a control-plane upgrade or repair); try again shortly",
            ) from exc

    def explain(self, exc: Any, action: str) -> BackendError:
        status = int(exc.status or 0)
        try:
            message = json.loads(exc.body or "{}").get("message") or exc.reason
        except (TypeError, ValueError):
            message = exc.reason
        if status == 409:
            return AlreadyExists(f"could not {action}: {message}")
        if status in (401, 403):
            return BackendError(
                f"not allowed to {action} on {self.cluster}: {message}",
                hint="the account needs to create, read and delete JobSets and read pods in the namespace",
            )
        if status in (0, 502, 503, 504):  # no answer of the server's own: it is away, or behind a proxy that is
            return Unreachable(f"could not {action} on {self.cluster}: {message} ({status or 'no answer'})")
        return BackendError(f"could not {action} on {self.cluster}: {message} ({status})")

    # -- JobSets and pods -----------------------------------------------------------------------------------------

    def create_jobset(self, body: dict[str, Any]) -> dict[str, Any]:
        meta = body["metadata"]
        return dict(
            self.call(
                f"create JobSet {meta['name']}",
                self.custom().create_namespaced_custom_object,
                GROUP,
                VERSION,
                meta["namespace"],
                PLURAL,
                body,
            )
        )

    def jobset(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found = self.call(
                f"read JobSet {name}",
                self.custom().get_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
            )
        except BackendError as exc:
            if getattr(exc.__cause__, "status", None) == 404:
                return None
            raise
        return dict(found)

    def delete_jobset(self, namespace: str, name: str) -> bool:
        """Delete in the foreground (its Jobs and their pods first); False when it was gone already."""
        try:
            self.call(
                f"delete JobSet {name}",
                self.custom().delete_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                propagation_policy="Foreground",
            )
        except BackendError as exc:
            if getattr(exc.__cause__, "status", None) == 404:
                return False
            raise
        return True

    def jobsets(self, selector: str) -> list[dict[str, Any]]:
        found = self.call(
            "list JobSets", self.custom().list_cluster_custom_object, GROUP, VERSION, PLURAL, label_selector=selector
        )
        return list(found.get("items") or [])

    def pods(self, namespace: str, selector: str) -> tuple[list[Any], str]:
        """The pods `selector` picks, and the list's resourceVersion."""
        found: Any = self.call("list pods", self.core().list_namespaced_pod, namespace, label_selector=selector)
        return list(found.items or []), str(found.metadata.resource_version)


def _token() -> str:
    """The bearer token a GKE cluster takes: an emulated one's ($RUNNER_GKE_TOKEN), else the caller's Google one."""
    if os.environ.get(ENDPOINT_ENV):
        return os.environ.get(TOKEN_ENV, "")
    from google.auth.transport.requests import Request

    credentials = default_credentials()
    credentials.refresh(Request())
    return str(credentials.token)
