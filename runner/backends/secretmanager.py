"""Secret Manager, the one seam every call to it passes: the cloud pre-flight, and the values of a --local run.

The client is google-cloud-secret-manager's over REST, imported only here and only when a spec has secrets.
$RUNNER_SECRETMANAGER_ENDPOINT (the emulator's http://127.0.0.1:PORT) points it at another server with anonymous
credentials, as $RUNNER_TPU_ENDPOINT does for the Cloud TPU API.

Before a cloud run creates anything, `preflight` checks each secret with the submitter's own credentials: the
version exists and is ENABLED, and the secret's IAM policy lets the VM's service account read it (a role with
secretmanager.versions.access, granted on the secret). What cannot be checked so is a PlanError (exit 2) with the
command that fixes it; a grant on the whole project is not visible to this check, and the fix is the narrower grant
Google recommends anyway. Values are never read here for a cloud run: the VM reads them with its own account.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from runner.backends.google_api import ApiFailure, failure_of
from runner.credentials import anonymous, default_credentials
from runner.errors import PlanError
from runner.plan.planner import Plan, PlannedSecret

ENDPOINT_ENV = "RUNNER_SECRETMANAGER_ENDPOINT"
ACCESSOR = "roles/secretmanager.secretAccessor"
READING_ROLES = {ACCESSOR, "roles/secretmanager.admin", "roles/owner"}  # the predefined roles that can access
_STATES = {1: "ENABLED", 2: "DISABLED", 3: "DESTROYED"}


def make_client() -> Any:
    from google.cloud import secretmanager

    endpoint = os.environ.get(ENDPOINT_ENV)
    if endpoint:
        options = {"api_endpoint": endpoint}
        return secretmanager.SecretManagerServiceClient(
            transport="rest", credentials=anonymous(), client_options=options
        )
    return secretmanager.SecretManagerServiceClient(transport="rest", credentials=default_credentials())


def _parts(name: str) -> tuple[str, str, str]:
    """(project, secret, version) of projects/P/secrets/S/versions/V."""
    _, project, _, secret, _, version = name.split("/")
    return project, secret, version


def vm_member(plan: Plan, number: str | None) -> str:
    """The IAM member the VM reads as: the spec's service account, else the project's Compute Engine default one
    (which Cloud TPU and Compute Engine VMs run as), named by the project's number, or by the command that gives it."""
    account = plan.spec.accelerator.service_account
    if account:
        return f"serviceAccount:{account}"
    project = plan.cloud.project if plan.cloud else "PROJECT"
    number = number or f"$(gcloud projects describe {project} --format='value(projectNumber)')"
    return f"serviceAccount:{number}-compute@developer.gserviceaccount.com"


def grant_command(secret: str, project: str, member: str) -> str:
    quoted = f'"{member}"' if "$(" in member else shlex.quote(member)
    return f"gcloud secrets add-iam-policy-binding {secret} --project {project} --member={quoted} --role={ACCESSOR}"


def _explain(failure: ApiFailure, what: str, project: str, secret: str, version: str, member: str) -> PlanError:
    said = failure.said()
    if failure.reason == "SERVICE_DISABLED":
        return PlanError(
            f"{what}: the Secret Manager API is not enabled in project {project}: {said}",
            hint=f"`gcloud services enable secretmanager.googleapis.com --project {project}`",
        )
    if failure.code == "PERMISSION_DENIED":
        permission = failure.metadata.get("permission", "a Secret Manager permission")
        return PlanError(
            f"{what}: cannot be checked, your account lacks {permission}: {said}",
            hint=f"ask for roles/secretmanager.viewer on secret {secret} (project {project}); the VM itself will "
            f"need `{grant_command(secret, project, member)}`",
        )
    if failure.code == "NOT_FOUND":
        return PlanError(
            f"{what}: there is no such secret version: {said}",
            hint=f"`gcloud secrets create {secret} --project {project} --data-file=FILE` creates it (or "
            f"`gcloud secrets versions add {secret}` adds a version), or check the secret and project names",
        )
    if failure.code == "UNAUTHENTICATED":
        return PlanError(f"{what}: not authenticated: {said}", hint="run `gcloud auth application-default login`")
    return PlanError(f"{what}: Secret Manager could not be asked: {said} ({failure.code})")


def _call(fn: Any, what: str, source: str, member: str, **kwargs: Any) -> Any:
    import requests

    project, secret, version = _parts(source)
    try:
        return fn(**kwargs)
    except requests.RequestException as exc:
        raise PlanError(
            f"{what}: cannot reach Secret Manager ({type(exc).__name__})",
            hint=f"check the network (and ${ENDPOINT_ENV} if it is set)",
        ) from exc
    except Exception as exc:
        failure = failure_of(exc)
        if failure is None:
            raise
        raise _explain(failure, what, project, secret, version, member) from exc


def check_one(client: Any, plan: Plan, planned: PlannedSecret) -> str:
    """One secret's pre-flight: the line that says what was found, or PlanError with the fix."""
    what = f"secrets.{planned.name} ({planned.source})"
    project, secret, version = _parts(planned.source)
    found = _call(client.get_secret_version, what, planned.source, vm_member(plan, None), name=planned.source)
    number = found.name.split("/")[1]  # Secret Manager names the project by its number
    member = vm_member(plan, number if number.isdigit() else None)
    state = _STATES.get(int(found.state), str(found.state))
    shown = found.name.rsplit("/", 1)[1]
    if state != "ENABLED":
        fix = (
            f"`gcloud secrets versions enable {shown} --secret {secret} --project {project}`"
            if state == "DISABLED"
            else f"add a version (`gcloud secrets versions add {secret} --project {project} --data-file=FILE`)"
        )
        raise PlanError(f"{what}: version {shown} is {state}, and cannot be read", hint=fix)
    secret_name = f"projects/{project}/secrets/{secret}"
    policy = _call(client.get_iam_policy, what, planned.source, member, request={"resource": secret_name})
    granted = [
        b.role
        for b in policy.bindings
        if b.role in READING_ROLES and member in b.members and not b.condition.expression
    ]
    if not granted:
        raise PlanError(
            f"{what}: the VM's service account ({member.removeprefix('serviceAccount:')}) may not read it: the "
            f"secret's IAM policy grants it none of {', '.join(sorted(READING_ROLES))} (without a condition; a "
            "grant on the whole project is not seen by this check)",
            hint=f"`{grant_command(secret, project, member)}`",
        )
    latest = f"version {shown}" + (" (latest)" if version == "latest" else "")
    return (
        f"secret {planned.name}: {secret_name}, {latest}, enabled; the VM reads it as "
        f"{member.removeprefix('serviceAccount:')} ({granted[0]} on the secret)"
    )


def preflight(plan: Plan, client: Any | None = None) -> list[str]:
    """Every Secret Manager secret of a cloud plan checked before anything is created: a line for each, or one
    PlanError (exit 2) naming every one that fails, each with its fix."""
    wanted = [s for s in plan.secrets if s.secret_manager]
    if not wanted:
        return []
    client = client or make_client()
    lines, problems = [], []
    for planned in wanted:
        try:
            lines.append(check_one(client, plan, planned))
        except PlanError as exc:
            problems.append(exc)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        text = "".join(f"\n  {p.message}" + (f"\n    fix: {p.hint}" if p.hint else "") for p in problems)
        raise PlanError(f"{len(problems)} secrets cannot be read by the VM:{text}")
    return lines


def access(planned: PlannedSecret, client: Any | None = None) -> bytes:
    """A secret's value with the submitter's own credentials (a --local run), its CRC32C checked."""
    import google_crc32c

    client = client or make_client()
    what = f"secrets.{planned.name} ({planned.source})"
    answer = _call(client.access_secret_version, what, planned.source, "your account", name=planned.source)
    data = bytes(answer.payload.data)
    if answer.payload.data_crc32c and int(answer.payload.data_crc32c) != google_crc32c.value(data):
        raise PlanError(f"{what}: the payload does not match its CRC32C (damaged in transit); try again")
    return data
