"""One-time setup of a Google Cloud project for tpu-runner; idempotent, with a dry-run that prints every change.

    python infra/gcp_setup.py --project P --region us-central1 --bucket B --dry-run     # the plan; calls nothing
    python infra/gcp_setup.py --project P --region us-central1 --bucket B               # apply (ADC credentials)
    python infra/gcp_setup.py ... --dry-run --check     # read the project, print only the changes it still needs

Steps, in order (infra/README.md explains each role):
  1. enable the Cloud TPU, Cloud Storage and Artifact Registry APIs (and IAM, Resource Manager: steps 2-6 use them)
  2. a service account for the TPU VMs
  3. a custom role with tpu.nodes.get and tpu.nodes.delete (no predefined role is that narrow)
  4. a private Docker repository in Artifact Registry; the VM account may read it; allUsers never
  5. a bucket for run directories: uniform bucket-level access, public access prevention enforced, a lifecycle rule
     that deletes objects under <prefix>runs/ after --keep-days; the VM account gets roles/storage.objectUser on it
  6. the custom role for the VM account on the project; for each --submitter, roles/iam.serviceAccountUser on the
     VM account (to create nodes that run as it), roles/artifactregistry.writer and roles/storage.objectUser

Every step reads the current state first and changes only what differs; bindings it did not make are kept (except
public members of the repository and bucket, which it removes). Every request goes through one function (`http`),
so the dry-run and the tests see exactly what would be sent. Standard library, plus google-auth when applying.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Http = Callable[[str, str, "dict[str, Any] | None"], "tuple[int, dict[str, Any]]"]

ENDPOINTS = {
    "serviceusage": "https://serviceusage.googleapis.com",
    "iam": "https://iam.googleapis.com",
    "crm": "https://cloudresourcemanager.googleapis.com",
    "artifactregistry": "https://artifactregistry.googleapis.com",
    "storage": "https://storage.googleapis.com",
}
SERVICES = (
    "tpu.googleapis.com",
    "storage.googleapis.com",
    "artifactregistry.googleapis.com",
    "iam.googleapis.com",
    "cloudresourcemanager.googleapis.com",
)
ROLE_ID = "tpuRunnerNode"
ROLE_PERMISSIONS = ("tpu.nodes.delete", "tpu.nodes.get")  # self-delete; TPUClusterResolver(tpu=<node>) on pod slices
PUBLIC = ("allUsers", "allAuthenticatedUsers")
LABELS = {"managed-by": "tpu-runner"}
_CHECKS = {
    "project": (r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$", "a project id: 6-30 lowercase letters, digits, '-'"),
    "region": (r"^[a-z]+-[a-z]+[0-9]+$", "a region like us-central1"),
    "bucket": (r"^[a-z0-9][-a-z0-9_.]{1,61}[a-z0-9]$", "a bucket name: 3-63 lowercase letters, digits, '-_.'"),
    "repo": (r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", "a repository id: lowercase letters, digits, '-'"),
    "service_account": (r"^[a-z]([-a-z0-9]{4,28}[a-z0-9])$", "an account id: 6-30 lowercase letters, digits, '-'"),
}


class SetupError(Exception):
    """A step cannot be done; the message says what and what to do."""


@dataclass(frozen=True)
class Config:
    project: str
    region: str
    bucket: str
    repo: str = "tpu-runner"
    service_account: str = "tpu-runner-vm"
    prefix: str = ""  # run directories live under gs://BUCKET/<prefix>runs/
    keep_days: int = 30
    submitters: tuple[str, ...] = ()

    @property
    def sa_email(self) -> str:
        return f"{self.service_account}@{self.project}.iam.gserviceaccount.com"

    @property
    def sa_member(self) -> str:
        return f"serviceAccount:{self.sa_email}"

    @property
    def role(self) -> str:
        return f"projects/{self.project}/roles/{ROLE_ID}"

    @property
    def runs_prefix(self) -> str:
        return f"{self.prefix.strip('/')}/runs/" if self.prefix.strip("/") else "runs/"

    def validate(self) -> None:
        for name, (pattern, meaning) in _CHECKS.items():
            if not re.match(pattern, getattr(self, name)):
                raise SetupError(f"--{name.replace('_', '-')} {getattr(self, name)!r} is not {meaning}")
        if self.keep_days < 1:
            raise SetupError("--keep-days must be at least 1")
        for member in self.submitters:
            if not re.match(r"^(user|group|serviceAccount|domain):\S+$", member):
                raise SetupError(f"--submitter {member!r} is not user:EMAIL, group:EMAIL, serviceAccount:EMAIL")


@dataclass(frozen=True)
class Change:
    step: str
    summary: str
    method: str
    url: str
    body: dict[str, Any] | None

    def render(self) -> str:
        text = f"+ [{self.step}] {self.summary}\n    {self.method} {self.url}"
        if self.body is not None:
            text += "\n    " + json.dumps(self.body, sort_keys=True)
        return text


@dataclass
class Setup:
    """Runs the steps. dry_run: nothing is written; check: reads are real (else everything reads as absent)."""

    config: Config
    http: Http | None = None
    endpoints: dict[str, str] = field(default_factory=lambda: dict(ENDPOINTS))
    dry_run: bool = False
    check: bool = False
    say: Callable[[str], None] = print
    sleep: Callable[[float], None] = time.sleep
    changes: list[Change] = field(default_factory=list)

    def url(self, api: str, path: str) -> str:
        return f"{self.endpoints[api]}/{path}"

    # -- the seam -------------------------------------------------------------------------------------------------

    def read(self, url: str, method: str = "GET", body: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The resource, or None when it does not exist (and always None in a dry-run without --check)."""
        if self.dry_run and not self.check:
            return None
        assert self.http is not None
        status, reply = self.http(method, url, body)
        if status == 404:
            return None
        if status >= 400:
            raise SetupError(f"{method} {url}: HTTP {status}: {_message(reply)}")
        return reply

    def change(self, step: str, summary: str, method: str, url: str, body: dict[str, Any] | None) -> dict[str, Any]:
        change = Change(step, summary, method, url, body)
        self.changes.append(change)
        self.say(change.render())
        if self.dry_run:
            return {}
        assert self.http is not None
        for attempt in range(6):
            status, reply = self.http(method, url, body)
            # A new service account takes a few seconds to be known to IAM policies.
            if status == 400 and "does not exist" in _message(reply) and attempt < 5:
                self.sleep(5)
                continue
            if status >= 400:
                raise SetupError(f"{summary}: {method} {url}: HTTP {status}: {_message(reply)}")
            return self.wait(reply)
        raise AssertionError("unreachable")

    def wait(self, reply: dict[str, Any], timeout_s: float = 600) -> dict[str, Any]:
        """Long-running operations (API enablement, repository creation): poll until done."""
        name = reply.get("name", "")
        if "done" not in reply or not re.search(r"(^|/)operations/", name):
            return reply
        api = "serviceusage" if name.startswith("operations/") else "artifactregistry"
        waited = 0.0
        while not reply.get("done"):
            if waited > timeout_s:
                raise SetupError(f"operation {name} is not done after {timeout_s:.0f}s")
            self.sleep(2)
            waited += 2
            assert self.http is not None
            _, reply = self.http("GET", self.url(api, f"v1/{name}"), None)
        if "error" in reply:
            raise SetupError(f"operation {name} failed: {_message(reply)}")
        return reply

    def unchanged(self, step: str, what: str) -> None:
        if not self.dry_run or self.check:
            self.say(f"= [{step}] {what}")

    # -- steps ----------------------------------------------------------------------------------------------------

    def run(self) -> list[Change]:
        self.config.validate()
        for step in (self.services, self.service_account, self.custom_role, self.repository, self.bucket):
            step()
        self.grants()
        return self.changes

    def services(self) -> None:
        base = f"v1/projects/{self.config.project}/services"
        missing = [
            s for s in SERVICES if (self.read(self.url("serviceusage", f"{base}/{s}")) or {}).get("state") != "ENABLED"
        ]
        if missing:
            url = self.url("serviceusage", f"{base}:batchEnable")
            self.change("services", f"enable {', '.join(missing)}", "POST", url, {"serviceIds": missing})
        else:
            self.unchanged("services", "all APIs enabled")

    def service_account(self) -> None:
        c = self.config
        base = f"v1/projects/{c.project}/serviceAccounts"
        current = self.read(self.url("iam", f"{base}/{c.sa_email}"))
        if current is None:
            body = {
                "accountId": c.service_account,
                "serviceAccount": {
                    "displayName": "tpu-runner TPU VMs",
                    "description": "Runs tpu-runner jobs on TPU VMs: pulls the image, writes run directories, "
                    "deletes its own node",
                },
            }
            self.change("service-account", f"create {c.sa_email}", "POST", self.url("iam", base), body)
        elif current.get("disabled"):
            url = self.url("iam", f"{base}/{c.sa_email}:enable")
            self.change("service-account", f"enable {c.sa_email}", "POST", url, {})
        else:
            self.unchanged("service-account", c.sa_email)

    def custom_role(self) -> None:
        c = self.config
        base = f"v1/projects/{c.project}/roles"
        current = self.read(self.url("iam", f"{base}/{ROLE_ID}"))
        wanted = sorted(ROLE_PERMISSIONS)
        if current is None:
            body = {
                "roleId": ROLE_ID,
                "role": {
                    "title": "tpu-runner TPU node self-delete",
                    "description": "Read and delete TPU nodes: a tpu-runner VM deletes its own node when its job ends",
                    "includedPermissions": wanted,
                    "stage": "GA",
                },
            }
            self.change("role", f"create {c.role}: {', '.join(wanted)}", "POST", self.url("iam", base), body)
            return
        if current.get("deleted"):
            url = self.url("iam", f"{base}/{ROLE_ID}:undelete")
            current = self.change("role", f"undelete {c.role}", "POST", url, {"etag": current.get("etag")}) or current
        if sorted(current.get("includedPermissions", [])) != wanted:
            url = self.url("iam", f"{base}/{ROLE_ID}?updateMask=includedPermissions")
            body = {"includedPermissions": wanted, "etag": current.get("etag")}
            self.change("role", f"set the permissions of {c.role} to {', '.join(wanted)}", "PATCH", url, body)
        else:
            self.unchanged("role", f"{c.role}: {', '.join(wanted)}")

    def repository(self) -> None:
        c = self.config
        parent = f"v1/projects/{c.project}/locations/{c.region}/repositories"
        current = self.read(self.url("artifactregistry", f"{parent}/{c.repo}"))
        if current is None:
            url = self.url("artifactregistry", f"{parent}?repositoryId={c.repo}")
            body = {"format": "DOCKER", "description": "tpu-runner trainer images", "labels": LABELS}
            what = f"create Docker repository {c.region}-docker.pkg.dev/{c.project}/{c.repo}"
            self.change("repository", what, "POST", url, body)
        elif current.get("format") != "DOCKER":
            raise SetupError(f"repository {c.repo} in {c.region} is a {current.get('format')} repository, not DOCKER")
        else:
            self.unchanged("repository", f"{c.region}-docker.pkg.dev/{c.project}/{c.repo}")

    def bucket(self) -> None:
        c = self.config
        url = self.url("storage", f"storage/v1/b/{c.bucket}")
        try:
            current = self.read(url)
        except SetupError as exc:
            if "HTTP 403" in str(exc):
                raise SetupError(
                    f"bucket {c.bucket} exists in a project you cannot read (bucket names are global)",
                ) from exc
            raise
        wanted = {
            "iamConfiguration": {"uniformBucketLevelAccess": {"enabled": True}, "publicAccessPrevention": "enforced"},
            "lifecycle": {"rule": self._lifecycle((current or {}).get("lifecycle", {}).get("rule", []))},
        }
        if current is None:
            body = {"name": c.bucket, "location": c.region.upper(), "storageClass": "STANDARD", "labels": LABELS}
            create = self.url("storage", f"storage/v1/b?project={c.project}")
            self.change("bucket", f"create gs://{c.bucket} in {c.region}", "POST", create, {**body, **wanted})
            current = {**body, **wanted} if self.dry_run else self.read(url) or {}
        patch = {}
        iam = current.get("iamConfiguration", {})
        uniform = iam.get("uniformBucketLevelAccess", {}).get("enabled")
        if not uniform or iam.get("publicAccessPrevention") != "enforced":
            patch["iamConfiguration"] = wanted["iamConfiguration"]
        if current.get("lifecycle", {}).get("rule", []) != wanted["lifecycle"]["rule"]:
            patch["lifecycle"] = wanted["lifecycle"]
        if patch:
            words = {"iamConfiguration": "uniform access, no public access", "lifecycle": f"the {c.keep_days}-day rule"}
            what = " and ".join(words[k] for k in patch)
            self.change("bucket", f"set {what} on gs://{c.bucket}", "PATCH", url, patch)
        else:
            self.unchanged("bucket", f"gs://{c.bucket}: uniform access, no public access, {c.keep_days}-day rule")

    def _lifecycle(self, rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The bucket's rules with ours (Delete, matchesPrefix [runs prefix]) in place; other rules are kept."""
        c = self.config
        ours = {"action": {"type": "Delete"}, "condition": {"age": c.keep_days, "matchesPrefix": [c.runs_prefix]}}
        mine = {"type": "Delete"}, [c.runs_prefix]
        others = [r for r in rules if (r.get("action"), r.get("condition", {}).get("matchesPrefix")) != mine]
        return [*others, ours]

    def grants(self) -> None:
        c = self.config
        repo = f"v1/projects/{c.project}/locations/{c.region}/repositories/{c.repo}"
        sa = f"v1/projects/{c.project}/serviceAccounts/{c.sa_email}"
        plans = [
            (
                "repository-iam",
                f"{c.region}-docker.pkg.dev/{c.project}/{c.repo}",
                ("GET", self.url("artifactregistry", f"{repo}:getIamPolicy?options.requestedPolicyVersion=3"), None),
                ("POST", self.url("artifactregistry", f"{repo}:setIamPolicy"), True),
                [("roles/artifactregistry.reader", c.sa_member)]
                + [("roles/artifactregistry.writer", m) for m in c.submitters],
            ),
            (
                "bucket-iam",
                f"gs://{c.bucket}",
                ("GET", self.url("storage", f"storage/v1/b/{c.bucket}/iam?optionsRequestedPolicyVersion=3"), None),
                ("PUT", self.url("storage", f"storage/v1/b/{c.bucket}/iam"), False),
                [("roles/storage.objectUser", m) for m in (c.sa_member, *c.submitters)],
            ),
            (
                "project-iam",
                f"project {c.project}",
                (
                    "POST",
                    self.url("crm", f"v1/projects/{c.project}:getIamPolicy"),
                    {"options": {"requestedPolicyVersion": 3}},
                ),
                ("POST", self.url("crm", f"v1/projects/{c.project}:setIamPolicy"), True),
                [(c.role, c.sa_member)],
            ),
        ]
        if c.submitters:
            plans.append(
                (
                    "service-account-iam",
                    c.sa_email,
                    ("POST", self.url("iam", f"{sa}:getIamPolicy"), None),
                    ("POST", self.url("iam", f"{sa}:setIamPolicy"), True),
                    [("roles/iam.serviceAccountUser", m) for m in c.submitters],
                )
            )
        for step, what, (get_method, get_url, get_body), (set_method, set_url, wrapped), wanted in plans:
            policy = self.read(get_url, get_method, get_body) or {"bindings": []}
            updated, added, removed = _merge(policy, wanted)
            if not added and not removed:
                self.unchanged(step, f"{what}: {', '.join(f'{r} for {m}' for r, m in wanted)}")
                continue
            words = [f"grant {r} to {m}" for r, m in added] + [f"remove public member {m}" for m in removed]
            body = {"policy": updated} if wrapped else updated
            self.change(step, f"{'; '.join(words)} on {what}", set_method, set_url, body)


def _merge(policy: dict[str, Any], wanted: list[tuple[str, str]]) -> tuple[dict[str, Any], list, list]:
    """The policy with every (role, member) of `wanted` bound unconditionally and public members removed.
    Returns (policy, added, removed); the etag travels along so a concurrent change is refused, not lost."""
    bindings = [dict(b, members=list(b.get("members", []))) for b in policy.get("bindings", [])]
    removed = sorted({m for b in bindings for m in b["members"] if m in PUBLIC})
    for b in bindings:
        b["members"] = [m for m in b["members"] if m not in PUBLIC]
    added = []
    for role, member in wanted:
        binding = next((b for b in bindings if b.get("role") == role and "condition" not in b), None)
        if binding is None:
            binding = {"role": role, "members": []}
            bindings.append(binding)
        if member not in binding["members"]:
            binding["members"].append(member)
            added.append((role, member))
    updated = {k: v for k, v in policy.items() if k not in ("bindings", "kind", "resourceId")}
    updated["bindings"] = [b for b in bindings if b["members"]]
    updated["version"] = 3
    return updated, added, removed


def _message(reply: dict[str, Any]) -> str:
    error = reply.get("error")
    if isinstance(error, dict):
        return str(error.get("message", error))
    return str(error or reply)[:300]


def google_http(storage_endpoint: str | None = None) -> Http:
    """Requests with Application Default Credentials; an emulator (STORAGE_EMULATOR_HOST) is called without them."""
    import google.auth
    import google.auth.transport.requests
    import requests

    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    session = google.auth.transport.requests.AuthorizedSession(credentials)
    plain = requests.Session()

    def http(method: str, url: str, body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        client = plain if storage_endpoint and url.startswith(storage_endpoint) else session
        response = client.request(method, url, json=body, timeout=60)
        try:
            return response.status_code, response.json() if response.content else {}
        except ValueError:
            return response.status_code, {"error": response.text[:300]}

    return http


def parse_args(argv: list[str] | None) -> tuple[Config, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--project", required=True)
    p.add_argument("--region", default="us-central1", help="of the repository and the bucket (default us-central1)")
    p.add_argument("--bucket", required=True, help="for run directories (storage: gs://BUCKET/PREFIX)")
    p.add_argument("--prefix", default="", help="the PREFIX of storage: gs://BUCKET/PREFIX (default: none)")
    p.add_argument("--repo", default="tpu-runner", help="Artifact Registry repository (default tpu-runner)")
    p.add_argument("--service-account", default="tpu-runner-vm", help="account id of the TPU VMs' service account")
    p.add_argument("--keep-days", type=int, default=30, help="delete run-directory objects after this many days")
    p.add_argument("--submitter", action="append", default=[], help="user:EMAIL who submits jobs (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="print every change; call nothing")
    p.add_argument("--check", action="store_true", help="with --dry-run: read the project, show only what is needed")
    p.add_argument("--json", action="store_true", help="print the changes as JSON (for tools and tests)")
    a = p.parse_args(argv)
    if a.check and not a.dry_run:
        p.error("--check only goes with --dry-run")
    config = Config(a.project, a.region, a.bucket, a.repo, a.service_account, a.prefix, a.keep_days, tuple(a.submitter))
    return config, a


def main(argv: list[str] | None = None, http: Http | None = None) -> int:
    config, args = parse_args(argv)
    endpoints = dict(ENDPOINTS)
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        endpoints["storage"] = os.environ["STORAGE_EMULATOR_HOST"].rstrip("/")
    lines: list[str] = []
    say = lines.append if args.json else print
    try:
        if http is None and (not args.dry_run or args.check):
            http = google_http(endpoints["storage"] if endpoints["storage"] != ENDPOINTS["storage"] else None)
        setup = Setup(config, http, endpoints, dry_run=args.dry_run, check=args.check, say=say)
        changes = setup.run()
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # no credentials, no network: one line, not a traceback
        if type(exc).__module__.startswith(("google.", "requests")):
            print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
            print("  hint: `gcloud auth application-default login`, or --dry-run to see the plan", file=sys.stderr)
            return 1
        raise
    if args.json:
        print(json.dumps([c.__dict__ for c in changes], indent=1, sort_keys=True))
        return 0
    verb = "would make" if args.dry_run else "made"
    print(f"\n{verb} {len(changes)} change(s). For the job spec:")
    print(f"  storage: gs://{config.bucket}" + (f"/{config.prefix.strip('/')}" if config.prefix.strip("/") else ""))
    print(f"  accelerator: {{service_account: {config.sa_email}}}")
    registry = f"{config.region}-docker.pkg.dev/{config.project}/{config.repo}"
    print(
        f"  image: {registry}/trainer-tpu:TAG  (`make push VARIANT=tpu PROJECT={config.project} "
        f"REGION={config.region} REPO={config.repo}` prints it)"
    )
    print("The startup script (runner/launch/startup-script.sh) is not installed here: the runner renders it")
    print("for every run and passes it as the node's startup-script metadata.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
