"""A job's secrets end to end: the real google-cloud-secret-manager client and the bootstrap's curl against the
emulator's Secret Manager, the real bootstrap on an emulated TPU VM, and --local runs on this machine. The job gets
the real values; no file in the run directory, the run records, the VM's metadata, the machine's own files or
anything printed holds their bytes; a secret the VM may not read stops the run before any VM is created."""

from __future__ import annotations

import base64
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from runner.backends.secretmanager import ACCESSOR
from runner.storage import open_storage
from tests.cloudjobs import job, run_id_of, submit
from tests.waiting import wait_for
from tpu_emulator.resources import project_number

VM_ACCOUNT = f"{project_number('test-project')}-compute@developer.gserviceaccount.com"  # the TPU VM's default
# The job shows what it got without writing it anywhere: digests in a file of its run directory; then it prints the
# values themselves, which the run's log must not keep.
JOB = """\
import hashlib, json, os, stat
token = os.environ["API_TOKEN"].encode()
path = os.environ["KEY_FILE"]
key = open(path, "rb").read()
info = os.stat(path)
print("the token is", token.decode(), flush=True)
print("the key file says:", key.decode(), flush=True)
password = os.environ.get("DB_PASSWORD", "").encode()
print("and the password:", password.decode(), flush=True)
with open(os.path.join(os.environ["RUNNER_OUTPUT_DIR"], "got.json"), "w") as out:
    json.dump({"token": hashlib.sha256(token).hexdigest(), "key": hashlib.sha256(key).hexdigest(),
               "password": hashlib.sha256(password).hexdigest(),
               "mode": oct(stat.S_IMODE(info.st_mode)), "names": os.environ["RUNNER_SECRETS"]}, out)
"""


def client(cloud: Any) -> Any:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import secretmanager

    options = {"api_endpoint": cloud.endpoint}
    return secretmanager.SecretManagerServiceClient(
        transport="rest", credentials=AnonymousCredentials(), client_options=options
    )


def put_secret(cloud: Any, secret_id: str, data: bytes, reader: str | None = VM_ACCOUNT) -> str:
    """A secret with one version, through the real client (as `gcloud secrets create` would), readable by
    `reader`'s service account when one is given."""
    sm = client(cloud)
    secret = sm.create_secret(
        parent="projects/test-project", secret_id=secret_id, secret={"replication": {"automatic": {}}}
    )
    sm.add_secret_version(parent=secret.name, payload={"data": data})
    if reader:
        policy = sm.get_iam_policy(request={"resource": secret.name})
        policy.bindings.add(role=ACCESSOR, members=[f"serviceAccount:{reader}"])
        sm.set_iam_policy(request={"resource": secret.name, "policy": policy})
    return secret.name


def holders(root: Path, needles: list[bytes]) -> list[str]:
    """Every file under `root` whose bytes hold one of `needles`."""
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if any(n in data for n in needles):
                found.append(str(path))
    return found


def needles_of(*values: bytes) -> list[bytes]:
    """A value's bytes, its base64 (a metadata value or an env file carried so would hold it), and each line of a
    multi-line one."""
    out = []
    for value in values:
        out += [value, base64.b64encode(value)]
        out += [line for line in value.split(b"\n") if len(line) >= 8]
    return out


def digest(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


@pytest.mark.slow
def test_a_command_job_on_a_tpu_vm_gets_its_secrets_and_nothing_keeps_them(
    cloud, tmp_path: Path, bucket_url: str, runner_home: Path
) -> None:  # type: ignore[no-untyped-def]
    token = f"tok-{uuid.uuid4().hex}".encode()
    key = f"-----BEGIN KEY-----\nline-one-{uuid.uuid4().hex}\nline-two-{uuid.uuid4().hex}\n".encode()
    put_secret(cloud, "api-token", token)
    put_secret(cloud, "key-file", key)
    (tmp_path / "job.py").write_text(JOB)
    spec = job(
        tmp_path,
        bucket_url,
        f"""\
        command: [python, -c, {json.dumps(JOB)}]
        secrets:
          API_TOKEN: api-token/versions/latest
          KEY_FILE: {{ref: projects/test-project/secrets/key-file/versions/1, as: file}}
        """,
    )
    result = submit(str(spec))
    assert result.exit_code == 0, result.output
    run_dir = f"{bucket_url}/runs/{run_id_of(result.output)}"
    store = open_storage(run_dir)
    got = json.loads(store.read_bytes("got.json") or b"{}")
    assert got["token"] == digest(token) and got["key"] == digest(key)  # the real values, not a redaction
    assert got["mode"] in ("0o400", "0o440")  # readable by the job alone
    # The plan said who reads what, and the pre-flight found the VM may.
    said = "secret API_TOKEN: projects/test-project/secrets/api-token, version 1 (latest), enabled; the VM reads it"
    assert f"{said} as {VM_ACCOUNT} ({ACCESSOR} on the secret)" in result.output
    assert "projects/test-project/secrets/key-file/versions/1" in result.output
    log = (store.read_bytes("logs/worker-0.log") or b"").decode()
    assert "the token is [redacted API_TOKEN]" in log and "[redacted KEY_FILE]" in log
    needles = needles_of(token, key)
    # Nothing the runner or the VM wrote or printed holds a value: the run directory, the run records, the output,
    # every file of the emulated VMs (their consoles, the containers' homes), every request the APIs got (the
    # node's metadata: the startup script) but the test's own set-up of the secrets.
    leaks = [info.key for info in store.list() if any(n in (store.read_bytes(info.key) or b"") for n in needles)]
    assert not leaks
    assert not any(n in result.output.encode() for n in needles)
    assert not holders(runner_home, needles)
    assert not holders(tmp_path, needles)
    requests = [r for r in cloud.requests if not r.path.endswith(":addVersion")]
    assert not any(n in json.dumps([r.to_json() for r in requests]).encode() for n in needles)
    assert not [p for p in cloud.launcher.secrets_root.rglob("*") if p.is_file()], "the VM left a secret on its tmpfs"
    assert sum(r.path.endswith(":access") and r.authorization is not None for r in cloud.requests) == 2


def test_a_secret_the_vm_may_not_read_stops_the_run_before_anything_is_created(
    cloud, tmp_path: Path, bucket_url: str
) -> None:  # type: ignore[no-untyped-def]
    put_secret(cloud, "api-token", b"never-read", reader=None)
    spec = job(
        tmp_path, bucket_url, "command: [python, -c, 'print(1)']\nsecrets: {API_TOKEN: api-token/versions/latest}\n"
    )
    result = submit(str(spec))
    assert result.exit_code == 2, result.output
    assert f"the VM's service account ({VM_ACCOUNT}) may not read it" in result.output
    fix = (
        f"gcloud secrets add-iam-policy-binding api-token --project test-project "
        f"--member=serviceAccount:{VM_ACCOUNT} --role={ACCESSOR}"
    )
    assert fix in result.output.replace("\n", " ").replace("  ", " ") or fix in result.output
    assert "Traceback" not in result.output
    assert not any(
        r.path.startswith(("/v2/projects", "/compute/v1/projects")) and r.method == "POST" for r in cloud.requests
    )


@pytest.mark.parametrize(
    ("setup", "said"),
    [
        (lambda sm, name: None, "there is no such secret version"),
        (lambda sm, name: sm.disable_secret_version(name=f"{name}/versions/1"), "version 1 is DISABLED"),
        (lambda sm, name: sm.destroy_secret_version(name=f"{name}/versions/1"), "version 1 is DESTROYED"),
    ],
)
def test_a_missing_or_unreadable_version_is_a_preflight_error(
    cloud, tmp_path: Path, bucket_url: str, setup: Any, said: str
) -> None:  # type: ignore[no-untyped-def]
    name = put_secret(cloud, "api-token", b"x" * 16)
    setup(client(cloud), name)
    ref = "missing/versions/latest" if "no such" in said else "api-token/versions/1"
    result = submit(str(job(tmp_path, bucket_url, f"command: [python, -c, 'print(1)']\nsecrets: {{T: {ref}}}\n")))
    assert result.exit_code == 2, result.output
    assert said in result.output and "gcloud secrets" in result.output
    assert not any(r.path.startswith("/v2/projects") and r.method == "POST" for r in cloud.requests)


@pytest.mark.parametrize(
    ("reader", "value", "said"),
    [
        (
            None,
            b"not-for-this-vm",
            [
                "HTTP 403: Permission 'secretmanager.versions.access' denied for resource",
                f"to grant it: gcloud secrets add-iam-policy-binding api-token --project test-project "
                f"--member=serviceAccount:{VM_ACCOUNT} --role={ACCESSOR}",
            ],
        ),
        (
            VM_ACCOUNT,
            b"two\nlines-of-it\n",
            ["it holds a line break or a NUL, which an environment variable cannot: use as: file"],
        ),
    ],
    ids=["denied", "two-lines-as-env"],
)
def test_a_vm_that_cannot_use_its_secret_fails_before_the_job_with_the_reason(
    cloud, tmp_path: Path, bucket_url: str, reader: str | None, value: bytes, said: list[str]
) -> None:  # type: ignore[no-untyped-def]
    """The bootstrap's own checks, which the pre-flight cannot make for it (a grant revoked after the pre-flight, a
    value an environment variable cannot hold): Secret Manager's real answer through curl, the job never started,
    the exit record with the reason and the fix, and not a byte of the value anywhere."""
    from runner.backends import plan_cloud
    from runner.launch import bootstrap
    from runner.spec.loader import load_spec

    put_secret(cloud, "api-token", value, reader=reader)
    body = "command: [python, -c, 'print(1)']\nsecrets: {T: api-token/versions/latest}\n"
    plan = plan_cloud(load_spec(job(tmp_path, bucket_url, body)), None, project="test-project", zone="us-central1-b")
    script = bootstrap.render(plan, "us-central1-b", "secrets-vm")
    cloud.create_node_direct(
        "test-project", "us-central1-b", "secrets-vm", accelerator_type="v2-8", metadata={"startup-script": script}
    )
    store = open_storage(plan.run_dir)
    record = json.loads(wait_for(lambda: store.read_bytes("exit/worker-0.json"), "the bootstrap's exit record"))
    assert record["exit_code"] == 78 and record["state"] == "failed"
    assert (
        "secret T (projects/test-project/secrets/api-token/versions/latest) could not be read on the VM"
        in record["error"]
    )
    for text in said:
        assert text in record["error"]
    assert store.read_bytes("logs/worker-0.log") is None  # the container never started
    events = [json.loads(line)["event"] for line in (store.read_bytes("events/bootstrap-0.jsonl") or b"").splitlines()]
    assert "secret_unreadable" in events and "container_started" not in events
    wait_for(lambda: cloud.node("secrets-vm") is None, "the VM deleting its node (teardown policy always)")
    assert not holders(tmp_path, needles_of(value)) and not holders(cloud.launcher.secrets_root, needles_of(value))


@pytest.mark.slow
def test_a_local_run_gets_secrets_from_this_machine_and_nothing_keeps_them(
    cloud, tmp_path: Path, runner_home: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    """env: and file: references, and a Secret Manager one read with the submitter's own credentials."""
    token = f"tok-{uuid.uuid4().hex}".encode()
    key = f"-----BEGIN KEY-----\nline-one-{uuid.uuid4().hex}\n".encode()
    password = f"pw-{uuid.uuid4().hex}".encode()
    (tmp_path / "key.pem").write_bytes(key)
    put_secret(cloud, "db-password", password + b"\n", reader=None)  # the submitter owns it; no VM is involved
    monkeypatch.setenv("MY_TOKEN", token.decode())
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: local-secrets\nimage: trainer:test\nstorage: runs\n"
        f"command: [python, -c, {json.dumps(JOB)}]\n"
        "secrets:\n  API_TOKEN: env:MY_TOKEN\n  KEY_FILE: {ref: 'file:key.pem', as: file}\n"
        "  DB_PASSWORD: projects/test-project/secrets/db-password/versions/latest\n"
    )
    from typer.testing import CliRunner

    from runner.cli import app

    result = CliRunner().invoke(app, ["submit", str(spec), "--local", "--process"], catch_exceptions=False)
    printed = result.output + "".join(capfd.readouterr())
    assert result.exit_code == 0, printed
    run_dir = next((tmp_path / "runs" / "runs").iterdir())
    got = json.loads((run_dir / "got.json").read_text())
    assert got["token"] == digest(token) and got["key"] == digest(key) and got["mode"] == "0o600"
    assert got["password"] == digest(password)  # its final line break dropped, as for a VM's env file
    assert "the token is [redacted API_TOKEN]" in (run_dir / "logs" / "worker-0.log").read_text()
    needles = needles_of(token, key, password)
    assert not holders(run_dir, needles)
    assert not holders(runner_home, needles)
    assert not any(n in printed.encode() for n in needles)
    assert "env:MY_TOKEN" in printed and "read from this machine" in printed
    assert "read with your Google credentials" in printed
    leftover = [p for p in Path("/dev/shm").glob(f"tpu-runner-{os.getuid()}/*") if run_dir.name in p.name]
    assert not leftover, "the run's secret files outlived it"
