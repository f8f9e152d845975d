"""The one seam every Cloud TPU API call passes through: client construction, retries, and SDK errors in words.

The client is google-cloud-tpu's TpuClient over REST. $RUNNER_TPU_ENDPOINT (e.g. http://127.0.0.1:8470, the TPU
API emulator) points it at another server with anonymous credentials, the same way STORAGE_EMULATOR_HOST does for
Cloud Storage. TPU RPCs have no default retry: transient 429/503/5xx answers are retried here with backoff.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, TypeVar

from runner.errors import BackendError, NoCapacity

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
ENDPOINT_ENV = "RUNNER_TPU_ENDPOINT"
T = TypeVar("T")


def _transient(exc: BaseException) -> bool:
    from google.api_core import exceptions as gexc

    if isinstance(exc, gexc.ResourceExhausted | gexc.TooManyRequests):
        return "quota" not in str(exc).lower()  # a rate limit passes; an exhausted quota does not
    return isinstance(
        exc,
        gexc.ServiceUnavailable
        | gexc.InternalServerError
        | gexc.BadGateway
        | gexc.GatewayTimeout
        | gexc.DeadlineExceeded,
    )


def default_retry(deadline_s: float = 120.0, initial_s: float = 1.0) -> Any:
    from google.api_core import retry

    return retry.Retry(predicate=_transient, initial=initial_s, maximum=20.0, multiplier=2.0, timeout=deadline_s)


def make_client() -> Any:
    from google.cloud import tpu_v2

    endpoint = os.environ.get(ENDPOINT_ENV)
    if endpoint:
        from google.auth.credentials import AnonymousCredentials

        return tpu_v2.TpuClient(
            transport="rest", credentials=AnonymousCredentials(), client_options={"api_endpoint": endpoint}
        )
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM])
    except DefaultCredentialsError as exc:
        raise BackendError(
            "no Google Cloud credentials found",
            hint="run `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS "
            "to a service-account key)",
        ) from exc
    return tpu_v2.TpuClient(transport="rest", credentials=credentials)


def explain(exc: Exception, action: str, *, project: str, zone: str) -> BackendError:
    """An SDK error as something a user can act on."""
    from google.api_core import exceptions as gexc

    message = getattr(exc, "message", None) or str(exc)
    if isinstance(exc, gexc.PermissionDenied | gexc.Forbidden):
        permission = _quoted_after(message, "Permission ")
        return BackendError(
            f"permission denied to {action}: {message}",
            hint=(f"the account lacks {permission}; " if permission else "")
            + f"grant it roles/tpu.admin on project {project} (roles/tpu.viewer is enough to read), and check "
            "that the Cloud TPU API is enabled: `gcloud services enable tpu.googleapis.com`",
        )
    if isinstance(exc, gexc.ResourceExhausted | gexc.TooManyRequests) and "quota" in message.lower():
        return BackendError(
            f"quota exhausted in {zone}: {message}",
            hint="request more TPU quota (IAM & Admin > Quotas), use a smaller type, or another zone",
        )
    if isinstance(exc, gexc.ResourceExhausted):
        return NoCapacity(
            f"no capacity in {zone} (stockout): {message}",
            hint="list more zones under accelerator.zones, or try Spot (accelerator.spot: true)",
        )
    if isinstance(exc, gexc.InvalidArgument | gexc.BadRequest):
        return BackendError(f"the TPU API rejected the request to {action}: {message}")
    if isinstance(exc, gexc.NotFound):
        return BackendError(
            f"not found while trying to {action}: {message}",
            hint=f"check that project {project} exists and zone {zone} is right",
        )
    if isinstance(exc, gexc.Unauthenticated):
        return BackendError(
            f"not authenticated to {action}: {message}", hint="run `gcloud auth application-default login`"
        )
    return BackendError(f"could not {action}: {message}")


def _quoted_after(message: str, marker: str) -> str | None:
    start = message.find(marker + "'")
    if start < 0:
        return None
    rest = message[start + len(marker) + 1 :]
    end = rest.find("'")
    return rest[:end] if end > 0 else None


class TpuApi:
    """Nodes in one project, through an injected or default TpuClient."""

    def __init__(self, client: Any | None = None, *, retry: Any | None = None) -> None:
        self._client = client
        self.retry = retry if retry is not None else default_retry()

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = make_client()
        return self._client

    def call(self, fn: Callable[..., T], action: str, *, project: str, zone: str, **kwargs: Any) -> T:
        from google.api_core import exceptions as gexc

        try:
            return fn(retry=self.retry, **kwargs)
        except gexc.GoogleAPICallError as exc:
            raise explain(exc, action, project=project, zone=zone) from exc
        except gexc.RetryError as exc:
            cause = exc.cause if isinstance(exc.cause, Exception) else exc
            raise explain(cause, action, project=project, zone=zone) from exc

    def create_node(self, project: str, zone: str, node_id: str, body: dict[str, Any]) -> Any:
        from google.cloud import tpu_v2

        node = tpu_v2.Node.from_json(json.dumps(body))
        return self.call(
            self.client.create_node,
            f"create TPU node {node_id}",
            project=project,
            zone=zone,
            parent=f"projects/{project}/locations/{zone}",
            node_id=node_id,
            node=node,
        )

    def _unless_missing(self, fn: Callable[..., T], action: str, *, project: str, zone: str, **kwargs: Any) -> T | None:
        """`call`, with None for a resource that does not exist (never retried: NotFound is not transient)."""
        from google.api_core import exceptions as gexc

        try:
            return self.call(fn, action, project=project, zone=zone, **kwargs)
        except BackendError as exc:
            if isinstance(exc.__cause__, gexc.NotFound):
                return None
            raise

    def get_node(self, project: str, zone: str, node_id: str) -> Any | None:
        """The node, or None if it does not exist."""
        return self._unless_missing(
            self.client.get_node,
            f"read TPU node {node_id}",
            project=project,
            zone=zone,
            name=node_name(project, zone, node_id),
        )

    def delete_node(self, project: str, zone: str, node_id: str) -> bool:
        """Ask for the node's deletion; False if it was already gone."""
        operation = self._unless_missing(
            self.client.delete_node,
            f"delete TPU node {node_id}",
            project=project,
            zone=zone,
            name=node_name(project, zone, node_id),
        )
        return operation is not None

    def delete_queued_resource(self, name: str, *, project: str, zone: str) -> bool:
        """Delete a queued resource and, with force, the nodes it holds; False if it was already gone."""
        from google.cloud import tpu_v2

        operation = self._unless_missing(
            self.client.delete_queued_resource,
            f"delete queued resource {name}",
            project=project,
            zone=zone,
            request=tpu_v2.DeleteQueuedResourceRequest(name=name, force=True),
        )
        return operation is not None

    def _list(self, fn: Callable[..., Any], what: str, project: str, zone: str) -> list[Any]:
        return list(
            self.call(
                fn, f"list {what} in {zone}", project=project, zone=zone, parent=f"projects/{project}/locations/{zone}"
            )
        )

    def list_nodes(self, project: str, zone: str) -> list[Any]:
        return self._list(self.client.list_nodes, "TPU nodes", project, zone)

    def list_queued_resources(self, project: str, zone: str) -> list[Any]:
        return self._list(self.client.list_queued_resources, "queued resources", project, zone)


def node_name(project: str, zone: str, node_id: str) -> str:
    return f"projects/{project}/locations/{zone}/nodes/{node_id}"
