"""The emulator's Secret Manager API: the real google-cloud-secret-manager client (REST, anonymous credentials) and
the bootstrap's own curl with a VM's token, every request and answer checked against Google's secretmanager.v1.json;
versions and their states, access with its CRC32C, not found, IAM granted and denied in the real error shape."""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import google_crc32c
import pytest
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.cloud import secretmanager

from tests.emulator.api import PROJECT, ZONE, quick_api_emulator
from tpu_emulator import TpuEmulator
from tpu_emulator.resources import project_number

NUMBER = project_number(PROJECT)
ACCESSOR = "roles/secretmanager.secretAccessor"


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[TpuEmulator]:
    with quick_api_emulator(tmp_path) as emulator:
        yield emulator


def client(emulator: TpuEmulator) -> Any:
    options = {"api_endpoint": emulator.endpoint}
    return secretmanager.SecretManagerServiceClient(
        transport="rest", credentials=AnonymousCredentials(), client_options=options
    )


def new_secret(sm: Any, secret_id: str, *values: bytes) -> str:
    replicated = {"replication": {"automatic": {}}}
    secret = sm.create_secret(parent=f"projects/{PROJECT}", secret_id=secret_id, secret=replicated)
    for value in values:
        sm.add_secret_version(parent=secret.name, payload={"data": value})
    return f"projects/{PROJECT}/secrets/{secret_id}"


def all_checked(emulator: TpuEmulator) -> None:
    for r in emulator.requests:
        if r.path.startswith("/v1/"):
            assert r.checked and r.checked.startswith("secretmanager.v1 "), f"{r.method} {r.path} was not checked"
            assert r.status != 500, f"{r.method} {r.path}: the answer broke secretmanager.v1.json"


def test_versions_their_states_and_access(emulator: TpuEmulator) -> None:
    sm = client(emulator)
    name = new_secret(sm, "token", b"first-value", b"second-value")
    answer = sm.access_secret_version(name=f"{name}/versions/latest")
    assert answer.name == f"projects/{NUMBER}/secrets/token/versions/2"  # the API names the project by number
    assert answer.payload.data == b"second-value"
    assert answer.payload.data_crc32c == google_crc32c.value(b"second-value")
    assert [v.name.rsplit("/", 1)[1] for v in sm.list_secret_versions(parent=name)] == ["2", "1"]
    sm.disable_secret_version(name=f"{name}/versions/2")
    with pytest.raises(gexc.BadRequest, match=r"Secret Version \[.*/versions/2\] is in DISABLED state"):
        sm.access_secret_version(name=f"{name}/versions/latest")  # latest: the newest, whatever its state
    assert sm.access_secret_version(name=f"{name}/versions/1").payload.data == b"first-value"
    destroyed = sm.destroy_secret_version(name=f"{name}/versions/1")
    assert destroyed.state == secretmanager.SecretVersion.State.DESTROYED and destroyed.destroy_time
    with pytest.raises(gexc.BadRequest, match="is in DESTROYED state"):
        sm.enable_secret_version(name=f"{name}/versions/1")
    with pytest.raises(gexc.NotFound, match=r"Secret Version \[.*/versions/9\] not found"):
        sm.get_secret_version(name=f"{name}/versions/9")
    with pytest.raises(gexc.NotFound, match=r"Secret \[projects/\d+/secrets/none\] not found or has no versions"):
        sm.access_secret_version(name=f"projects/{PROJECT}/secrets/none/versions/latest")
    with pytest.raises(gexc.Conflict, match="already exists"):
        new_secret(sm, "token")
    all_checked(emulator)


def test_what_the_api_refuses_to_store(emulator: TpuEmulator) -> None:
    sm = client(emulator)
    name = new_secret(sm, "big")
    with pytest.raises(gexc.BadRequest, match="at most 65536 bytes"):
        sm.add_secret_version(parent=name, payload={"data": b"x" * (64 * 1024 + 1)})
    with pytest.raises(gexc.BadRequest, match="Checksum mismatch"):
        sm.add_secret_version(parent=name, payload={"data": b"abc", "data_crc32c": 1})
    with pytest.raises(gexc.BadRequest, match="replication"):
        sm.create_secret(parent=f"projects/{PROJECT}", secret_id="no-replication", secret={})
    all_checked(emulator)


def vm_token(emulator: TpuEmulator, node: str) -> tuple[str, str]:
    """(token, service account) from a VM's own metadata server, as its bootstrap asks for them."""
    base = f"{emulator.endpoint}/_vm/{PROJECT}/{ZONE}/{node}/0/computeMetadata/v1/instance/service-accounts/default"
    answers = []
    for leaf in ("token", "email"):
        request = urllib.request.Request(f"{base}/{leaf}", headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            answers.append(answer.read().decode())
    return json.loads(answers[0])["access_token"], answers[1]


def curl_access(emulator: TpuEmulator, version: str, token: str) -> tuple[int, dict[str, Any]]:
    """The bootstrap's call: GET v1/<version>:access with the VM's bearer token."""
    result = subprocess.run(
        ["curl", "-s", "-w", "\n%{http_code}", "-H", f"Authorization: Bearer {token}",
         f"{emulator.endpoint}/v1/{version}:access"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    body, _, code = result.stdout.rpartition("\n")
    return int(code), json.loads(body)


def test_a_vm_reads_a_secret_with_its_token_only_once_granted(emulator: TpuEmulator) -> None:
    sm = client(emulator)
    name = new_secret(sm, "token", b"vm-secret\n")
    emulator.create_node_direct(PROJECT, ZONE, "vm-1", accelerator_type="v4-8")  # no startup script: nothing runs
    token, account = vm_token(emulator, "vm-1")
    assert account == f"{NUMBER}-compute@developer.gserviceaccount.com"
    code, body = curl_access(emulator, f"{name}/versions/latest", token)
    assert code == 403
    resource = f"projects/{PROJECT}/secrets/token/versions/latest"
    assert body["error"]["status"] == "PERMISSION_DENIED"
    assert body["error"]["message"] == (
        f"Permission 'secretmanager.versions.access' denied for resource '{resource}' (or it may not exist)."
    )
    assert body["error"]["details"] == [
        {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": "IAM_PERMISSION_DENIED",
            "domain": "googleapis.com",
            "metadata": {"permission": "secretmanager.versions.access", "resource": resource},
        }
    ]
    code, body = curl_access(emulator, f"projects/{PROJECT}/secrets/missing/versions/1", token)
    assert code == 403  # denied before looked up: a missing secret and an unreadable one look the same
    policy = sm.get_iam_policy(request={"resource": name})
    policy.bindings.add(role=ACCESSOR, members=[f"serviceAccount:{account}"])
    sm.set_iam_policy(request={"resource": name, "policy": policy})
    code, body = curl_access(emulator, f"{name}/versions/latest", token)
    assert code == 200
    data = base64.b64decode(body["payload"]["data"])
    assert data == b"vm-secret\n" and body["payload"]["dataCrc32c"] == str(google_crc32c.value(data))
    code, body = curl_access(emulator, f"{name}/versions/latest", "ya29.not-a-vms-token")
    assert code == 401 and body["error"]["status"] == "UNAUTHENTICATED"
    with pytest.raises(
        gexc.Conflict, match="concurrent policy changes"
    ):  # a stale etag: someone changed the policy in between
        sm.set_iam_policy(request={"resource": name, "policy": policy})
    all_checked(emulator)


def test_the_submitter_can_be_denied_too(emulator: TpuEmulator) -> None:
    sm = client(emulator)
    name = new_secret(sm, "token", b"value-1234")
    emulator.deny("secretmanager.secrets.getIamPolicy", count=1)
    with pytest.raises(gexc.Forbidden) as info:
        sm.get_iam_policy(request={"resource": name})
    assert info.value.details and info.value.details[0]["reason"] == "IAM_PERMISSION_DENIED"
    assert sm.get_iam_policy(request={"resource": name}).etag  # the fault was used up
    all_checked(emulator)
