"""What the runner does after a run, by the spec's word: teardown.policy on_success and never (the runner's side,
besides the VM's own), retries.failures, and attach mode, which never deletes the node it attached to."""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
from pathlib import Path

from typer.testing import CliRunner

from runner.cli import app
from tests.cloudjobs import events, job, run_id_of, submit

PROJECT, ZONE = "test-project", "us-central1-b"


def test_policy_never_keeps_the_node_and_says_so(cloud, tmp_path: Path, bucket_url: str) -> None:  # type: ignore[no-untyped-def]
    spec = job(tmp_path, bucket_url, "command: [python, -c, 'print(1)']\nteardown: {policy: never}\n")
    result = submit(str(spec))
    assert result.exit_code == 0, result.output
    run_id = run_id_of(result.output)
    (node,) = cloud.nodes()
    assert node.node_id == run_id and node.state == "READY"  # neither the VM nor the runner deleted it
    skipped = [e for e in events(f"{bucket_url}/runs/{run_id}") if e["event"] == "teardown_skipped"]
    assert skipped and skipped[0]["policy"] == "never"
    assert CliRunner().invoke(app, ["down", run_id], catch_exceptions=False).exit_code == 0
    assert not cloud.nodes()


def test_on_success_keeps_a_failed_node_and_deletes_a_succeeded_one(cloud, tmp_path: Path, bucket_url: str) -> None:  # type: ignore[no-untyped-def]
    failing = job(
        tmp_path, bucket_url, "command: [python, -c, 'import sys; sys.exit(4)']\nteardown: {policy: on_success}\n"
    )
    result = submit(str(failing))
    assert result.exit_code == 6, result.output
    (kept,) = cloud.nodes()
    assert kept.state == "READY"  # kept to debug
    assert CliRunner().invoke(app, ["down", run_id_of(result.output)], catch_exceptions=False).exit_code == 0
    passing = job(tmp_path, bucket_url, "command: [python, -c, 'print(1)']\nteardown: {policy: on_success}\n")
    assert submit(str(passing)).exit_code == 0
    assert not cloud.nodes()


def test_a_failed_job_runs_again_under_retries_failures(tmp_path: Path, runner_home: Path) -> None:
    marker = tmp_path / "failed-once"
    script = (
        f"import pathlib, sys; m = pathlib.Path({str(marker)!r})\n"
        "if not m.exists():\n    m.touch(); print('first try fails', flush=True); sys.exit(3)\n"
        "print('second try passes', flush=True)"
    )
    spec = tmp_path / "job.yaml"
    spec.write_text(
        textwrap.dedent(f"""\
        name: flaky
        image: trainer:test
        command: [{json.dumps(sys.executable)}, "-c", {json.dumps(script)}]
        storage: {tmp_path / "store"}
        retries: {{failures: 1}}
        """)
    )
    result = CliRunner().invoke(app, ["submit", str(spec), "--local", "--process"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "the job failed: running it again (1/1)" in result.output and "second try passes" in result.output
    run_dir = next((tmp_path / "store" / "runs").iterdir())
    assert [e["event"] for e in events(str(run_dir))].count("retrying_failure") == 1


def fake_gcloud(tmp_path: Path, cloud, node_id: str) -> Path:  # type: ignore[no-untyped-def]
    """`gcloud compute tpus tpu-vm ssh NODE ... --command=CMD` that runs CMD as worker 0 of the emulated node (its
    metadata server, the emulator's docker): what attach mode does over ssh on a real node. `sudo -E` is a no-op."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = cloud.launcher.vm_env(PROJECT, ZONE, node_id, 0, f"{cloud.id}:attach:0")
    exports = "".join(f"export {k}={json.dumps(v)}\n" for k, v in env.items() if k not in ("PATH", "HOME"))
    os.makedirs(env["TMPDIR"], exist_ok=True)
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(
        "#!/bin/bash\n" + exports + f'export PATH="{bin_dir}:{cloud.launcher.shim_dir}:$PATH"\n'
        'for a in "$@"; do case "$a" in --command=*) cmd="${a#--command=}" ;; esac; done\n'
        'exec bash -c "$cmd"\n'
    )
    sudo = bin_dir / "sudo"
    sudo.write_text('#!/bin/bash\n[ "$1" = -E ] && shift\nexec "$@"\n')
    for path in (gcloud, sudo):
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def test_attach_runs_the_job_on_an_existing_node_and_never_deletes_it(
    cloud, tmp_path: Path, bucket_url: str, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    cloud.create_node_direct(PROJECT, ZONE, "existing-vm", accelerator_type="v2-8", labels={"team": "research"})
    monkeypatch.setenv("PATH", f"{fake_gcloud(tmp_path, cloud, 'existing-vm')}:{os.environ['PATH']}")
    spec = job(tmp_path, bucket_url, "command: [python, -c, 'print(\"on the attached node\")']\n")
    spec.write_text(
        spec.read_text().replace(
            "zones: [us-central1-b, us-central1-c], project: test-project",
            f"zone: {ZONE}, project: {PROJECT}, node: existing-vm",
        )
    )
    result = submit(str(spec))
    assert result.exit_code == 0, result.output
    assert "attached to existing-vm" in result.output and "on the attached node" in result.output
    assert "left TPU node existing-vm running" in result.output
    assert cloud.node("existing-vm").state == "READY"
    assert not [r for r in cloud.requests if r.method in ("POST", "DELETE") and "/nodes" in r.path]
