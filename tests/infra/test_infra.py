"""infra/gcp_setup.py: the dry-run plan (structured, exact), idempotence, and convergence after drift. The bucket
part runs against gcp-storage-emulator over HTTP; the IAM, Artifact Registry, Service Usage and Resource Manager
requests go to a small in-process fake of those REST APIs, through the same seam the real calls use."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("gcp_setup", REPO / "infra" / "gcp_setup.py")
assert _spec and _spec.loader
gcp_setup = importlib.util.module_from_spec(_spec)
sys.modules["gcp_setup"] = gcp_setup  # dataclasses look their module up there
_spec.loader.exec_module(gcp_setup)

P, R = "my-project", "us-central1"
SA = f"tpu-runner-vm@{P}.iam.gserviceaccount.com"
MEMBER = f"serviceAccount:{SA}"
ROLE = f"projects/{P}/roles/tpuRunnerNode"
BASE_ARGS = ["--project", P, "--region", R, "--bucket", "my-runs"]


def dry_run(*extra: str, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    assert gcp_setup.main([*BASE_ARGS, *extra, "--dry-run", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_dry_run_plan_is_every_change_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    plan = dry_run("--keep-days", "14", "--prefix", "team-a", capsys=capsys)
    su, iam, ar = (
        "https://serviceusage.googleapis.com/v1",
        "https://iam.googleapis.com/v1",
        "https://artifactregistry.googleapis.com/v1",
    )
    repo = f"{ar}/projects/{P}/locations/{R}/repositories"
    assert [(c["step"], c["method"], c["url"]) for c in plan] == [
        ("services", "POST", f"{su}/projects/{P}/services:batchEnable"),
        ("service-account", "POST", f"{iam}/projects/{P}/serviceAccounts"),
        ("role", "POST", f"{iam}/projects/{P}/roles"),
        ("repository", "POST", f"{repo}?repositoryId=tpu-runner"),
        ("bucket", "POST", f"https://storage.googleapis.com/storage/v1/b?project={P}"),
        ("repository-iam", "POST", f"{repo}/tpu-runner:setIamPolicy"),
        ("bucket-iam", "PUT", "https://storage.googleapis.com/storage/v1/b/my-runs/iam"),
        ("project-iam", "POST", f"https://cloudresourcemanager.googleapis.com/v1/projects/{P}:setIamPolicy"),
    ]
    body = {c["step"]: c["body"] for c in plan}
    assert body["services"] == {"serviceIds": list(gcp_setup.SERVICES)}
    assert {"tpu.googleapis.com", "storage.googleapis.com", "artifactregistry.googleapis.com"} <= set(
        gcp_setup.SERVICES
    )
    assert body["service-account"]["accountId"] == "tpu-runner-vm"
    assert body["role"]["roleId"] == "tpuRunnerNode"
    assert body["role"]["role"]["includedPermissions"] == ["tpu.nodes.delete", "tpu.nodes.get"]
    assert body["repository"] == {
        "format": "DOCKER",
        "description": "tpu-runner trainer images",
        "labels": gcp_setup.LABELS,
    }
    assert body["bucket"] == {
        "name": "my-runs",
        "location": "US-CENTRAL1",
        "storageClass": "STANDARD",
        "labels": gcp_setup.LABELS,
        "iamConfiguration": {"uniformBucketLevelAccess": {"enabled": True}, "publicAccessPrevention": "enforced"},
        "lifecycle": {
            "rule": [{"action": {"type": "Delete"}, "condition": {"age": 14, "matchesPrefix": ["team-a/runs/"]}}]
        },
    }
    assert body["repository-iam"] == {
        "policy": {"bindings": [{"role": "roles/artifactregistry.reader", "members": [MEMBER]}], "version": 3}
    }
    assert body["bucket-iam"] == {"bindings": [{"role": "roles/storage.objectUser", "members": [MEMBER]}], "version": 3}
    assert body["project-iam"] == {"policy": {"bindings": [{"role": ROLE, "members": [MEMBER]}], "version": 3}}
    # Nothing public, nothing broader than needed, anywhere in the plan.
    text = json.dumps(plan)
    assert "allUsers" not in text and "allAuthenticatedUsers" not in text
    assert not re.search(r"roles/(owner|editor|tpu\.admin|storage\.admin|artifactregistry\.admin)", text)


def test_submitters_get_what_submitting_needs(capsys: pytest.CaptureFixture[str]) -> None:
    plan = dry_run("--submitter", "user:alice@example.com", capsys=capsys)
    body = {c["step"]: c["body"] for c in plan}
    assert body["service-account-iam"] == {
        "policy": {
            "bindings": [{"role": "roles/iam.serviceAccountUser", "members": ["user:alice@example.com"]}],
            "version": 3,
        }
    }
    assert {"role": "roles/artifactregistry.writer", "members": ["user:alice@example.com"]} in body["repository-iam"][
        "policy"
    ]["bindings"]
    assert {"role": "roles/storage.objectUser", "members": [MEMBER, "user:alice@example.com"]} in body["bucket-iam"][
        "bindings"
    ]


def test_text_dry_run_prints_every_request_and_the_spec_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert gcp_setup.main([*BASE_ARGS, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n+ [") + out.startswith("+ [") == 8
    assert "would make 8 change(s)" in out
    assert f"service_account: {SA}" in out and "storage: gs://my-runs" in out
    assert "runner/launch/startup-script.sh" in out and (REPO / "runner" / "launch" / "startup-script.sh").is_file()


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--project", "X", "is not a project id"),
        ("--bucket", "Bad_Bucket", "is not a bucket name"),
        ("--region", "us-central1-a", "is not a region"),
        ("--keep-days", "0", "at least 1"),
        ("--submitter", "alice@example.com", "is not user:EMAIL"),
    ],
)
def test_bad_flags_are_refused_before_anything(
    flag: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = list(BASE_ARGS)
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    assert gcp_setup.main([*args, "--dry-run"]) == 1
    assert message in capsys.readouterr().err


# -- applying, against fakes of the APIs -----------------------------------------------------------------------------


class FakeCloud:
    """The non-storage REST APIs the setup calls, answering the way they do (404 for absent resources, operations
    for enablement and repository creation, etag-checked setIamPolicy)."""

    def __init__(self) -> None:
        self.services: set[str] = {"serviceusage.googleapis.com"}
        self.accounts: dict[str, dict[str, Any]] = {}
        self.roles: dict[str, dict[str, Any]] = {}
        self.repos: dict[str, dict[str, Any]] = {}
        self.policies: dict[str, dict[str, Any]] = {}
        self.operations: dict[str, Callable[[], None]] = {}
        self.writes: list[tuple[str, str]] = []
        self.fail_once: dict[str, tuple[int, dict[str, Any]]] = {}

    def policy(self, resource: str) -> dict[str, Any]:
        return self.policies.setdefault(resource, {"version": 1, "etag": "BwE=", "bindings": []})

    def set_policy(self, resource: str, policy: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        current = self.policy(resource)
        if policy.get("etag") not in (None, current["etag"]):
            return 409, {"error": {"code": 409, "message": "There were concurrent policy changes."}}
        stored = {**policy, "etag": current["etag"] + "x"}
        self.policies[resource] = stored
        return 200, stored

    def operation(self, name: str, finish: Callable[[], None]) -> tuple[int, dict[str, Any]]:
        self.operations[name] = finish
        return 200, {"name": name, "done": False}

    def __call__(self, method: str, url: str, body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        parts = urlsplit(url)
        path, query = parts.path, parse_qs(parts.query)
        if method != "GET" and not path.endswith(":getIamPolicy"):
            self.writes.append((method, url))
        for key, reply in list(self.fail_once.items()):
            if key in url and method != "GET":
                del self.fail_once[key]
                return reply
        host = parts.netloc.split(".")[0]
        if m := re.fullmatch(r"/v1/(operations/.+|projects/.+/operations/.+)", path):
            self.operations.pop(m.group(1), lambda: None)()
            return 200, {"name": m.group(1), "done": True, "response": {}}
        if host == "serviceusage":
            if m := re.fullmatch(r"/v1/projects/[^/]+/services/([^/:]+)", path):
                return 200, {"name": m.group(1), "state": "ENABLED" if m.group(1) in self.services else "DISABLED"}
            if path.endswith("/services:batchEnable"):
                return self.operation("operations/acf.1", lambda: self.services.update(body["serviceIds"]))
        if host == "iam":
            if m := re.fullmatch(r"/v1/projects/[^/]+/serviceAccounts/([^/:]+):(getIamPolicy|setIamPolicy)", path):
                if m.group(1) not in self.accounts:
                    return 404, {"error": {"message": "not found"}}
                if m.group(2) == "getIamPolicy":
                    return 200, self.policy(f"sa/{m.group(1)}")
                return self.set_policy(f"sa/{m.group(1)}", body["policy"])
            if m := re.fullmatch(r"/v1/projects/([^/]+)/serviceAccounts/([^/:]+)(:enable)?", path):
                account = self.accounts.get(m.group(2))
                if account is None:
                    return 404, {"error": {"message": f"Unknown service account {m.group(2)}"}}
                if m.group(3):
                    account["disabled"] = False
                return 200, account
            if m := re.fullmatch(r"/v1/projects/([^/]+)/serviceAccounts", path):
                email = f"{body['accountId']}@{m.group(1)}.iam.gserviceaccount.com"
                if email in self.accounts:
                    return 409, {"error": {"message": "already exists"}}
                self.accounts[email] = {"email": email, **body["serviceAccount"]}
                return 200, self.accounts[email]
            if m := re.fullmatch(r"/v1/projects/([^/]+)/roles/([^/:]+)(:undelete)?", path):
                role = self.roles.get(m.group(2))
                if role is None:
                    return 404, {"error": {"message": "not found"}}
                if m.group(3):
                    role["deleted"] = False
                elif method == "PATCH":
                    assert query["updateMask"] == ["includedPermissions"]
                    role["includedPermissions"] = body["includedPermissions"]
                return 200, role
            if m := re.fullmatch(r"/v1/projects/([^/]+)/roles", path):
                self.roles[body["roleId"]] = {"name": f"projects/{m.group(1)}/roles/{body['roleId']}", **body["role"]}
                return 200, self.roles[body["roleId"]]
        if host == "cloudresourcemanager" and (m := re.fullmatch(r"/v1/projects/([^/:]+):(\w+)", path)):
            if m.group(2) == "getIamPolicy":
                assert body == {"options": {"requestedPolicyVersion": 3}}
                return 200, self.policy("project")
            return self.set_policy("project", body["policy"])
        if host == "artifactregistry":
            repos = r"/v1/projects/([^/]+)/locations/([^/]+)/repositories"
            if m := re.fullmatch(repos + r"/([^/:]+):(getIamPolicy|setIamPolicy)", path):
                if m.group(3) not in self.repos:
                    return 404, {"error": {"message": "not found"}}
                if m.group(4) == "getIamPolicy":
                    return 200, self.policy(f"repo/{m.group(3)}")
                return self.set_policy(f"repo/{m.group(3)}", body["policy"])
            if m := re.fullmatch(repos + r"/([^/:]+)", path):
                found = self.repos.get(m.group(3))
                return (200, found) if found else (404, {"error": {"message": "not found"}})
            if m := re.fullmatch(repos, path):
                name = query["repositoryId"][0]
                resource = {"name": f"projects/{m.group(1)}/locations/{m.group(2)}/repositories/{name}", **body}
                return self.operation(
                    f"projects/{m.group(1)}/locations/{m.group(2)}/operations/op-{name}",
                    lambda: self.repos.__setitem__(name, resource),
                )
        raise AssertionError(f"the fake has no route for {method} {url}")


class Project:
    """FakeCloud plus the real Storage emulator behind one `http` seam, and a way to run the setup."""

    def __init__(self, gcs: str, bucket: str) -> None:
        self.cloud = FakeCloud()
        self.gcs = gcs
        self.bucket = bucket
        self.storage_writes: list[tuple[str, str]] = []
        self.session = requests.Session()

    def http(self, method: str, url: str, body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        if not url.startswith(self.gcs):
            return self.cloud(method, url, body)
        if method != "GET":
            self.storage_writes.append((method, url))
        response = self.session.request(method, url, json=body, timeout=30)
        return response.status_code, response.json() if response.content else {}

    def setup(self, *extra: str, dry_run: bool = False, check: bool = False) -> list[Any]:
        config, _ = gcp_setup.parse_args(["--project", P, "--region", R, "--bucket", self.bucket, *extra])
        endpoints = {**gcp_setup.ENDPOINTS, "storage": self.gcs}
        lines: list[str] = []
        setup = gcp_setup.Setup(
            config, self.http, endpoints, dry_run=dry_run, check=check, say=lines.append, sleep=lambda _: None
        )
        changes = setup.run()
        self.output = "\n".join(lines)
        return changes


@pytest.fixture
def project(gcs: str) -> Project:
    return Project(gcs, f"runs-{uuid.uuid4().hex[:10]}")


def test_apply_then_rerun_changes_nothing(project: Project) -> None:
    first = project.setup("--submitter", "user:alice@example.com")
    assert [c.step for c in first] == [
        "services",
        "service-account",
        "role",
        "repository",
        "bucket",
        "bucket",  # the emulator keeps only the name on create; the settings follow as a PATCH
        "repository-iam",
        "bucket-iam",
        "project-iam",
        "service-account-iam",
    ]
    cloud = project.cloud
    assert set(gcp_setup.SERVICES) <= cloud.services
    assert cloud.accounts[SA]["displayName"] == "tpu-runner TPU VMs"
    assert cloud.roles["tpuRunnerNode"]["includedPermissions"] == ["tpu.nodes.delete", "tpu.nodes.get"]
    assert cloud.repos["tpu-runner"]["format"] == "DOCKER"
    assert {"role": ROLE, "members": [MEMBER]} in cloud.policies["project"]["bindings"]
    assert {"role": "roles/artifactregistry.reader", "members": [MEMBER]} in cloud.policies["repo/tpu-runner"][
        "bindings"
    ]
    # The bucket, read back with the real google-cloud-storage client.
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project=P, credentials=AnonymousCredentials(), client_options={"api_endpoint": project.gcs})
    bucket = client.get_bucket(project.bucket)
    assert bucket.iam_configuration.uniform_bucket_level_access_enabled
    assert bucket.iam_configuration.public_access_prevention == "enforced"
    assert list(bucket.lifecycle_rules) == [
        {"action": {"type": "Delete"}, "condition": {"age": 30, "matchesPrefix": ["runs/"]}}
    ]
    policy = bucket.get_iam_policy(requested_policy_version=3)
    assert {"role": "roles/storage.objectUser", "members": {MEMBER, "user:alice@example.com"}} in [
        {"role": b["role"], "members": set(b["members"])} for b in policy.bindings
    ]

    cloud.writes.clear()
    project.storage_writes.clear()
    assert project.setup("--submitter", "user:alice@example.com") == []
    assert cloud.writes == [] and project.storage_writes == []
    assert project.output.count("= [") == 9  # every step (IAM: one per resource) says it is already right


def test_drift_is_repaired_and_nothing_else_is_touched(project: Project) -> None:
    project.setup()
    cloud = project.cloud
    # Someone made the repository public, added their own project binding, changed the role, and the bucket keeps
    # another lifecycle rule of its own; the retention is changed to 7 days.
    cloud.policies["repo/tpu-runner"]["bindings"].append(
        {"role": "roles/artifactregistry.reader", "members": ["allUsers"]}
    )
    cloud.policies["project"]["bindings"].append({"role": "roles/viewer", "members": ["user:bob@example.com"]})
    cloud.roles["tpuRunnerNode"]["includedPermissions"] = ["tpu.nodes.get"]
    other_rule = {"action": {"type": "Delete"}, "condition": {"age": 365, "matchesPrefix": ["archive/"]}}
    requests.patch(
        f"{project.gcs}/storage/v1/b/{project.bucket}",
        json={
            "lifecycle": {
                "rule": [
                    other_rule,
                    {"action": {"type": "Delete"}, "condition": {"age": 30, "matchesPrefix": ["runs/"]}},
                ]
            }
        },
        timeout=30,
    )
    changes = project.setup("--keep-days", "7")
    assert [(c.step, c.method) for c in changes] == [("role", "PATCH"), ("bucket", "PATCH"), ("repository-iam", "POST")]
    assert "remove public member allUsers" in changes[2].summary
    assert changes[1].body == {
        "lifecycle": {
            "rule": [other_rule, {"action": {"type": "Delete"}, "condition": {"age": 7, "matchesPrefix": ["runs/"]}}]
        }
    }
    repo_members = [m for b in cloud.policies["repo/tpu-runner"]["bindings"] for m in b["members"]]
    assert repo_members == [MEMBER]
    assert {"role": "roles/viewer", "members": ["user:bob@example.com"]} in cloud.policies["project"]["bindings"]
    assert cloud.roles["tpuRunnerNode"]["includedPermissions"] == ["tpu.nodes.delete", "tpu.nodes.get"]


def test_check_reads_the_project_and_writes_nothing(project: Project) -> None:
    project.setup()
    project.cloud.roles["tpuRunnerNode"]["deleted"] = True
    project.cloud.accounts[SA]["disabled"] = True
    project.cloud.writes.clear()
    project.storage_writes.clear()
    needed = project.setup(dry_run=True, check=True)
    assert [(c.step, c.summary.split(" ")[0]) for c in needed] == [("service-account", "enable"), ("role", "undelete")]
    assert project.cloud.writes == [] and project.storage_writes == []
    applied = project.setup()
    assert [c.step for c in applied] == ["service-account", "role"]
    assert project.setup() == []


def test_a_new_account_not_yet_known_to_iam_is_retried(project: Project) -> None:
    not_yet = (400, {"error": {"code": 400, "message": f"Service account {SA} does not exist."}})
    project.cloud.fail_once[":setIamPolicy"] = not_yet
    changes = project.setup()
    assert "repository-iam" in [c.step for c in changes]
    assert {"role": "roles/artifactregistry.reader", "members": [MEMBER]} in project.cloud.policies["repo/tpu-runner"][
        "bindings"
    ]


def test_a_refused_request_stops_with_its_message(project: Project) -> None:
    project.cloud.fail_once["/roles"] = (403, {"error": {"code": 403, "message": "Permission iam.roles.create denied"}})
    with pytest.raises(gcp_setup.SetupError, match=r"iam\.roles\.create denied"):
        project.setup()
