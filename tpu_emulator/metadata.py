"""The GCE metadata server of each emulated TPU VM, served at /_vm/<project>/<zone>/<node>/<worker>/computeMetadata/v1.

What a TPU VM's scripts read: project/project-id and numeric-project-id, instance/zone, name, hostname, id,
network-interfaces/0/ip, instance/attributes/ (agent-worker-number, accelerator-type, instance-id = the node's
name, tpu-env, and every key of the node's metadata such as startup-script), the default service account's
email, scopes and token, and the notices a VM watches for: instance/preempted (TRUE once the node is preempted,
set before its VMs get the soft-off signal, as Compute Engine does: cloud.google.com/compute/docs/instances/
create-use-spot#detect-preemption) and instance/maintenance-event (NONE, or what a maintenance notice says:
TERMINATE_ON_HOST_MAINTENANCE; cloud.google.com/compute/docs/metadata/getting-live-migration-notice). Like the
real server it answers only requests carrying `Metadata-Flavor: Google`, lists a directory one entry a line
(subdirectories end in /), gives a subtree as JSON with `?recursive=true` (or `alt=json`), sends every value's
ETag, and holds a `?wait_for_change=true` request until the value changes (at once when `last_etag` is not the
value's ETag any more; with `timeout_sec`, at most that long, then the value as it is): `wait_for_change`.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from tpu_emulator.resources import Node, project_number

TOKEN = object()  # a leaf rendered as the access-token JSON


def tpu_env(node: Node, worker: int, hostnames: list[str]) -> str:
    """instance/attributes/tpu-env: KEY: 'value' lines, as on a TPU VM (a subset of the real keys)."""
    values = {
        "ACCELERATOR_TYPE": node.accel.name,
        "CONSUMER_PROJECT_ID": node.project,
        "CONSUMER_PROJECT_NUMBER": project_number(node.project),
        "NODE_ID": node.node_id,
        "RUNTIME_VERSION": str(node.spec.get("runtimeVersion", "")),
        "WORKER_HOSTNAMES": ",".join(hostnames),
        "WORKER_ID": str(worker),
        "ZONE": node.zone,
        **node.megascale(),
    }
    return "".join(f"{key}: '{value}'\n" for key, value in sorted(values.items()))


def token(node: Node, worker: int) -> dict[str, Any]:
    digest = hashlib.sha256(f"{node.name}/{node.id}/{worker}".encode()).hexdigest()[:40]
    return {"access_token": f"ya29.emulated-{digest}", "expires_in": 3599, "token_type": "Bearer"}


def tree(node: Node, worker: int, hostnames: list[str]) -> dict[str, Any]:
    number = project_number(node.project)
    data = node.to_json()
    account = data["serviceAccount"]
    attributes = {str(k): str(v) for k, v in (node.spec.get("metadata") or {}).items()}
    attributes.update(
        {
            "accelerator-type": node.accel.name,
            "agent-worker-number": str(worker),
            "instance-id": node.node_id,
            "tpu-env": tpu_env(node, worker, hostnames),
        }
    )
    service_account = {
        "aliases": "default\n",
        "email": account["email"],
        "scopes": "".join(f"{s}\n" for s in account.get("scope", [])),
        "token": TOKEN,
    }
    return {
        "instance": {
            "attributes": attributes,
            "hostname": f"{hostnames[worker]}.{node.zone}.c.{node.project}.internal",
            "id": str(int(node.id) + worker),
            "name": hostnames[worker],
            "network-interfaces": {
                "0": {"ip": node.internal_ip(worker), "network": f"projects/{number}/networks/default"}
            },
            "maintenance-event": node.maintenance_event,
            "preempted": "TRUE" if node.preempted else "FALSE",
            "service-accounts": {"default": service_account, account["email"]: service_account},
            "zone": f"projects/{number}/zones/{node.zone}",
        },
        "project": {"attributes": {}, "numeric-project-id": number, "project-id": node.project},
    }


def _camel(key: str) -> str:
    return re.sub(r"-([a-z0-9])", lambda m: m.group(1).upper(), key)


def _as_json(value: Any, keep_keys: bool = False) -> Any:
    if isinstance(value, dict):
        return {
            (k if keep_keys else _camel(k)): _as_json(v, keep_keys or k == "attributes")
            for k, v in value.items()
            if v is not TOKEN
        }
    return value


def serve(
    node: Node | None, worker: int, hostnames: list[str], path: str, query: dict[str, str], flavor: str | None
) -> tuple[int, str, bytes]:
    """(status, content type, body) for one metadata request of a TPU VM; `path` is what follows computeMetadata/v1/."""
    if node is None or worker not in node.workers:  # a VM shutting down (DELETING) still reads its metadata
        return answer(None, {}, path, query, flavor)
    return answer(tree(node, worker, hostnames), token(node, worker), path, query, flavor)


def answer(
    data: dict[str, Any] | None, access_token: dict[str, Any], path: str, query: dict[str, str], flavor: str | None
) -> tuple[int, str, bytes]:
    """One metadata server answer from a VM's tree (None: no such VM), as the real server gives it."""
    if flavor != "Google":
        return (
            403,
            "text/html",
            b"Your client does not have permission to get URL from this server. "
            b"Missing Metadata-Flavor:Google header.\n",
        )
    if data is None:
        return 404, "text/html", b"Not Found: no such VM is running\n"
    value: Any = data
    for part in [p for p in path.split("/") if p]:
        if not isinstance(value, dict) or part not in value:
            return 404, "text/html", f"Not Found: /computeMetadata/v1/{path}\n".encode()
        value = value[part]
    if value is TOKEN:
        return 200, "application/json", json.dumps(access_token).encode()
    as_json = query.get("recursive") == "true" or query.get("alt") == "json"
    if as_json:
        return 200, "application/json", json.dumps(_as_json(value, path.rstrip("/").endswith("attributes"))).encode()
    if isinstance(value, dict):
        listing = "".join(f"{k}/\n" if isinstance(v, dict) else f"{k}\n" for k, v in value.items())
        return 200, "application/text", listing.encode()
    return 200, "application/text", str(value).encode()


Answer = tuple[int, str, bytes]
POLL_S = 0.1  # how often a held request looks at its value again


def etag(body: bytes) -> str:
    """The ETag of a value, as the real server sends with each one (the value's own hash: the same value, the same
    ETag)."""
    return hashlib.sha256(body).hexdigest()[:16]


def wait_for_change(read: Callable[[], Answer], query: Mapping[str, str]) -> Answer:
    """`read()` (one answer, taken under whatever lock guards the state), held as the real server holds a
    `?wait_for_change=true` request: answered at once when `last_etag` names another ETag than the value's now (a
    change the client has not seen), else when the value's ETag changes, when it is no longer a value (the VM is
    gone), or after `timeout_sec`, with the value as it is then."""
    answer = read()
    if query.get("wait_for_change") != "true" or answer[0] != 200:
        return answer
    seen = etag(answer[2])
    last = query.get("last_etag")
    if last and last != seen:
        return answer
    try:
        timeout = float(query["timeout_sec"]) if "timeout_sec" in query else None
    except ValueError:
        return 400, "text/html", b"Bad Request: timeout_sec must be a number\n"
    deadline = None if timeout is None else time.monotonic() + timeout
    while deadline is None or time.monotonic() < deadline:
        time.sleep(POLL_S)
        answer = read()
        if answer[0] != 200 or etag(answer[2]) != seen:
            return answer
    return answer
