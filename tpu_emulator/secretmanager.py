"""Secret Manager API v1 on the emulator's port: secrets, versions, access, IAM, for the real client and for curl.

Routes are the REST ones of google-cloud-secret-manager and of the TPU VM bootstrap's curl (/v1/projects/P/secrets/
...), every request and successful answer checked against Google's secretmanager.v1.json (tpu_emulator.discovery).
What it keeps and answers as the real service does (cloud.google.com/secret-manager/docs, the REST reference):

- names: a request may name the project by id or number; answers name it by number (projects/123.../secrets/S);
- versions numbered from 1; `latest` is the most recently created version, whatever its state;
- access: payload.data (base64) with payload.dataCrc32c (decimal int64); a DISABLED or DESTROYED version answers
  400 FAILED_PRECONDITION "Secret Version [NAME] is in DISABLED state."; a DESTROYED version keeps no data and
  cannot be enabled or disabled again;
- not found: 404 "Secret [NAME] not found or has no versions." / "Secret Version [NAME] not found.";
- IAM: who calls is told by the Authorization header. No header (the runner's anonymous client, in a test the
  person submitting) is the project's owner, unless a `permission` fault (TpuEmulator.deny, e.g.
  "secretmanager.secrets.getIamPolicy") says otherwise. A VM's token (its metadata server's) is its service
  account, allowed only what the secret's own IAM policy grants it: roles/secretmanager.secretAccessor for access,
  roles/secretmanager.viewer for reading metadata, admin and owner for all. Anyone else: 401 UNAUTHENTICATED. A
  caller denied gets 403 PERMISSION_DENIED "Permission 'P' denied for resource 'R' (or it may not exist)." with
  an ErrorInfo IAM_PERMISSION_DENIED {permission, resource}, before the resource is looked up: as with the real
  service, a denied caller cannot tell a missing secret from one it may not read. Project-level grants are not
  emulated (stricter than the real service, never kinder).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import google_crc32c

from tpu_emulator import codec, discovery, errors
from tpu_emulator.errors import ApiError
from tpu_emulator.faults import Faults
from tpu_emulator.resources import project_number
from tpu_emulator.server import Request, Response, SchemaCheck

SEG = r"([^/:]+)"
_SECRET = rf"/v1/projects/{SEG}/secrets/{SEG}"
_VERSION = rf"{_SECRET}/versions/{SEG}"
MAX_PAYLOAD = 64 * 1024
STATES = {"ENABLED": 1, "DISABLED": 2, "DESTROYED": 3}
ROLES: dict[str, set[str] | None] = {  # None: every permission
    "roles/owner": None,
    "roles/secretmanager.admin": None,
    "roles/secretmanager.secretAccessor": {"secretmanager.versions.access"},
    "roles/secretmanager.viewer": {
        "secretmanager.secrets.get",
        "secretmanager.secrets.getIamPolicy",
        "secretmanager.versions.get",
        "secretmanager.versions.list",
    },
    "roles/secretmanager.secretVersionManager": {
        "secretmanager.versions.add",
        "secretmanager.versions.destroy",
        "secretmanager.versions.disable",
        "secretmanager.versions.enable",
        "secretmanager.versions.get",
        "secretmanager.versions.list",
    },
}
UNAUTHENTICATED = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid "
    "authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project."
)
_BODIES = {"secretmanager.projects.secrets.create": "secret", "secretmanager.projects.secrets.addVersion": "request"}
_SECRET_ID = re.compile(r"^[A-Za-z0-9_-]{1,255}$")


def _number(project: str) -> str:
    return project if project.isdigit() else project_number(project)


def _etag() -> str:
    return '"' + hashlib.sha1(str(time.time_ns()).encode()).hexdigest()[:13] + '"'


@dataclass
class Version:
    number: int
    data: bytes | None
    created: float
    checksum_given: bool
    state: str = "ENABLED"
    destroyed: float | None = None
    etag: str = field(default_factory=_etag)


@dataclass
class Secret:
    name: str  # projects/<number>/secrets/<id>
    body: dict[str, Any]  # what the create request gave (replication, labels, ...)
    created: float
    versions: list[Version] = field(default_factory=list)
    bindings: list[dict[str, Any]] = field(default_factory=list)
    policy_etag: str = "ACAB"
    etag: str = field(default_factory=_etag)


class SecretManager:
    """The /v1/ routes. `principal(token)`: the service account a VM's bearer token belongs to, or None."""

    def __init__(self, faults: Faults, principal: Callable[[str], str | None]) -> None:
        self.faults = faults
        self.principal = principal
        self.lock = threading.RLock()
        self.secrets: dict[str, Secret] = {}
        self.schema = SchemaCheck(discovery.load("secretmanager.v1.json"), _BODIES)
        base = "secretmanager.projects.secrets"
        routes: list[tuple[str, str, Callable[..., Any], str, str]] = [
            ("POST", rf"/v1/projects/{SEG}/secrets", self.create, "secretmanager.secrets.create", "create"),
            ("GET", _SECRET, self.get, "secretmanager.secrets.get", "get"),
            ("DELETE", _SECRET, self.delete, "secretmanager.secrets.delete", "delete"),
            ("POST", rf"{_SECRET}:addVersion", self.add_version, "secretmanager.versions.add", "addVersion"),
            ("GET", rf"{_SECRET}:getIamPolicy", self.get_policy, "secretmanager.secrets.getIamPolicy", "getIamPolicy"),
            ("POST", rf"{_SECRET}:setIamPolicy", self.set_policy, "secretmanager.secrets.setIamPolicy", "setIamPolicy"),
            ("GET", rf"{_SECRET}/versions", self.list_versions, "secretmanager.versions.list", "versions.list"),
            ("GET", _VERSION, self.get_version, "secretmanager.versions.get", "versions.get"),
            ("GET", rf"{_VERSION}:access", self.access, "secretmanager.versions.access", "versions.access"),
        ]
        for verb in ("enable", "disable", "destroy"):
            routes.append(
                ("POST", rf"{_VERSION}:{verb}", self.change, f"secretmanager.versions.{verb}", f"versions.{verb}")
            )
        self.routes = [(m, re.compile(p + "$"), fn, perm, f"{base}.{what}") for m, p, fn, perm, what in routes]

    def reset(self) -> None:
        with self.lock:
            self.secrets.clear()

    # -- dispatch -----------------------------------------------------------------------------------------------

    def handle(self, request: Request) -> Response:
        checked: str | None = None
        try:
            for method, pattern, fn, permission, method_id in self.routes:
                match = pattern.match(request.path)
                if not match or method != request.method:
                    continue
                checked = self.schema.label(method_id)
                problems = self.schema.request(method_id, request)
                if problems:
                    raise errors.invalid(problems)
                groups = match.groups()
                self._authorize(request, permission, groups[0], groups[1] if len(groups) > 1 else None)
                numeric = "enum-encoding=int" in request.query.get("$alt", "")
                with self.lock:
                    answer = fn(request, *match.groups())
                return self.schema.answer(method_id, Response.json(self._enums(answer, numeric)), numeric)
            raise ApiError("NOT_FOUND", f"The requested URL {request.path} was not found on this server.")
        except ApiError as exc:
            response = Response.error(exc)
            response.method_id = checked
            return response

    def _authorize(self, request: Request, permission: str, project: str, secret: str | None) -> None:
        """403 unless the caller may: the owner unless a permission fault denies it, a VM's service account as the
        secret's policy grants; 401 for a token no VM has."""
        auth = request.headers.get("authorization")
        message: str | None = None
        if not auth:
            fault = self.faults.take("permission", permission=permission)
            if fault is None:
                return
            message = fault.message
        else:
            account = self.principal(auth.removeprefix("Bearer ").strip()) if auth.startswith("Bearer ") else None
            if account is None:
                raise ApiError("UNAUTHENTICATED", UNAUTHENTICATED)
            if self._granted(f"serviceAccount:{account}", permission, project, secret):
                return
        resource = request.path.removeprefix("/v1/").split(":")[0]
        text = message or f"Permission '{permission}' denied for resource '{resource}' (or it may not exist)."
        raise errors.permission_denied(permission, resource, message=text)

    def _granted(self, who: str, permission: str, project: str, secret: str | None) -> bool:
        if secret is None:
            return False
        with self.lock:
            found = self.secrets.get(f"projects/{_number(project)}/secrets/{secret}")
            bindings = list(found.bindings) if found else []
        for binding in bindings:
            allowed = ROLES.get(str(binding.get("role")), set())
            if who in binding.get("members", []) and (allowed is None or permission in allowed):
                return True
        return False

    @staticmethod
    def _enums(answer: dict[str, Any], numeric: bool) -> dict[str, Any]:
        if numeric and isinstance(answer.get("state"), str):
            return {**answer, "state": STATES[answer["state"]]}
        if numeric and isinstance(answer.get("versions"), list):
            return {**answer, "versions": [{**v, "state": STATES[v["state"]]} for v in answer["versions"]]}
        return answer

    # -- secrets ------------------------------------------------------------------------------------------------

    def _secret(self, project: str, secret_id: str) -> Secret:
        name = f"projects/{_number(project)}/secrets/{secret_id}"
        found = self.secrets.get(name)
        if found is None:
            raise ApiError("NOT_FOUND", f"Secret [{name}] not found.")
        return found

    def _render(self, secret: Secret) -> dict[str, Any]:
        return {**secret.body, "name": secret.name, "createTime": codec.timestamp(secret.created), "etag": secret.etag}

    def create(self, request: Request, project: str) -> dict[str, Any]:
        secret_id = request.query.get("secretId", "")
        if not _SECRET_ID.match(secret_id):
            raise ApiError("INVALID_ARGUMENT", "The secret ID must be 1-255 letters, digits, '-' or '_'.")
        body = json.loads(request.body or b"{}")
        if not body.get("replication"):
            raise ApiError("INVALID_ARGUMENT", "Secret.replication must be specified.")
        name = f"projects/{_number(project)}/secrets/{secret_id}"
        if name in self.secrets:
            raise errors.already_exists(name, f"Secret [{name}] already exists.")
        keep = {k: v for k, v in body.items() if k in ("replication", "labels", "annotations", "topics")}
        self.secrets[name] = Secret(name, keep, time.time())
        return self._render(self.secrets[name])

    def get(self, request: Request, project: str, secret_id: str) -> dict[str, Any]:
        return self._render(self._secret(project, secret_id))

    def delete(self, request: Request, project: str, secret_id: str) -> dict[str, Any]:
        del self.secrets[self._secret(project, secret_id).name]
        return {}

    def get_policy(self, request: Request, project: str, secret_id: str) -> dict[str, Any]:
        secret = self._secret(project, secret_id)
        out: dict[str, Any] = {"version": 1, "etag": secret.policy_etag}
        if secret.bindings:
            out["bindings"] = secret.bindings
        return out

    def set_policy(self, request: Request, project: str, secret_id: str) -> dict[str, Any]:
        secret = self._secret(project, secret_id)
        policy = json.loads(request.body or b"{}").get("policy") or {}
        if policy.get("etag") and policy["etag"] != secret.policy_etag:
            raise ApiError("ABORTED", "There were concurrent policy changes. Please retry the whole read-modify-write.")
        for binding in policy.get("bindings") or []:
            if binding.get("role") not in ROLES:
                raise ApiError("INVALID_ARGUMENT", f"Role {binding.get('role')} is not supported for this resource.")
        secret.bindings = [b for b in policy.get("bindings") or [] if b.get("members")]
        secret.policy_etag = base64.b64encode(hashlib.sha1(str(time.time_ns()).encode()).digest()[:8]).decode()
        return self.get_policy(request, project, secret_id)

    # -- versions -----------------------------------------------------------------------------------------------

    def _version(self, project: str, secret_id: str, version: str) -> tuple[Secret, Version]:
        secret = self.secrets.get(f"projects/{_number(project)}/secrets/{secret_id}")
        if version == "latest":
            if secret is None or not secret.versions:
                whole = f"projects/{_number(project)}/secrets/{secret_id}"
                raise ApiError("NOT_FOUND", f"Secret [{whole}] not found or has no versions.")
            return secret, secret.versions[-1]
        name = f"projects/{_number(project)}/secrets/{secret_id}/versions/{version}"
        if not version.isdigit() or int(version) < 1:
            raise ApiError("INVALID_ARGUMENT", f"Invalid resource field value in the request: {name}")
        if secret is None or int(version) > len(secret.versions):
            raise ApiError("NOT_FOUND", f"Secret Version [{name}] not found.")
        return secret, secret.versions[int(version) - 1]

    def _render_version(self, secret: Secret, version: Version) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": f"{secret.name}/versions/{version.number}",
            "createTime": codec.timestamp(version.created),
            "state": version.state,
            "replicationStatus": {"automatic": {}},
            "etag": version.etag,
            "clientSpecifiedPayloadChecksum": version.checksum_given,
        }
        if version.destroyed is not None:
            out["destroyTime"] = codec.timestamp(version.destroyed)
        return out

    def add_version(self, request: Request, project: str, secret_id: str) -> dict[str, Any]:
        secret = self._secret(project, secret_id)
        payload = json.loads(request.body or b"{}").get("payload") or {}
        data = base64.b64decode(payload.get("data", "") + "=" * (-len(payload.get("data", "")) % 4), altchars=b"-_")
        if len(data) > MAX_PAYLOAD:
            raise ApiError("INVALID_ARGUMENT", f"Secret payload data must be at most {MAX_PAYLOAD} bytes.")
        given = payload.get("dataCrc32c")
        if given is not None and int(given) != google_crc32c.value(data):
            raise ApiError("INVALID_ARGUMENT", "Checksum mismatch: the payload's data_crc32c does not match its data.")
        secret.versions.append(Version(len(secret.versions) + 1, data, time.time(), given is not None))
        return self._render_version(secret, secret.versions[-1])

    def list_versions(self, request: Request, project: str, secret_id: str) -> dict[str, Any]:
        secret = self._secret(project, secret_id)
        versions = [self._render_version(secret, v) for v in reversed(secret.versions)]
        return {"versions": versions, "totalSize": len(versions)} if versions else {}

    def get_version(self, request: Request, project: str, secret_id: str, version: str) -> dict[str, Any]:
        return self._render_version(*self._version(project, secret_id, version))

    def access(self, request: Request, project: str, secret_id: str, version: str) -> dict[str, Any]:
        secret, found = self._version(project, secret_id, version)
        name = f"{secret.name}/versions/{found.number}"
        if found.state != "ENABLED" or found.data is None:
            raise ApiError("FAILED_PRECONDITION", f"Secret Version [{name}] is in {found.state} state.")
        data = found.data
        payload = {"data": base64.b64encode(data).decode(), "dataCrc32c": str(google_crc32c.value(data))}
        return {"name": name, "payload": payload}

    def change(self, request: Request, project: str, secret_id: str, version: str) -> dict[str, Any]:
        verb = request.path.rsplit(":", 1)[1]
        secret, found = self._version(project, secret_id, version)
        if found.state == "DESTROYED":
            name = f"{secret.name}/versions/{found.number}"
            raise ApiError("FAILED_PRECONDITION", f"Secret Version [{name}] is in DESTROYED state.")
        found.state = {"enable": "ENABLED", "disable": "DISABLED", "destroy": "DESTROYED"}[verb]
        if verb == "destroy":
            found.data, found.destroyed = None, time.time()
        found.etag = _etag()
        return self._render_version(secret, found)
