"""The gke backend under faults, on the rehearsal, beside its rows of `make faults` (test_fault_rows.py: a stockout,
the API server restarted, a busy cluster, an expired watch, the runner killed, failing deletes): the watch itself
through a 410 Gone, `runner gc` keeping a killed runner's run while its job lives, and `runner down` of a detached
run whose first delete the API server refuses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runner.backends.gke.requests import RUN_DIR_ANNOTATION
from tests.backends.gke.conftest import gke_job, wait_file_command
from tests.cloudjobs import submit
from tests.kubecluster import GROUP
from tests.waiting import wait_for
from tpu_emulator.kube.forker import Forker
from tpu_emulator.kube.webhook import Refusal

pytestmark = GROUP
REPO = Path(__file__).resolve().parents[3]


def _running_pods(kube_api: Any, namespace: str, count: int = 1) -> list[Any] | None:
    from kubernetes import client

    pods = client.CoreV1Api(kube_api).list_namespaced_pod(namespace).items
    running = [p for p in pods if p.status.phase == "Running"]
    return running if len(running) >= count else None


def _leftovers(gke: Any, kube_api: Any, namespace: str, run_id: str) -> list[str]:
    from kubernetes import client

    pools = [p for p in gke.node_pools() if run_id in p]
    pods = [p.metadata.name for p in client.CoreV1Api(kube_api).list_namespaced_pod(namespace).items]
    return pools + pods


def test_the_watch_lists_again_after_410_gone_and_goes_on(
    kube: Any, kube_api: Any, kube_namespace: str, tpu_pool: str, monkeypatch: pytest.MonkeyPatch, forker: Forker
) -> None:
    """The backend's watch on a JobSet: etcd compacted under it, then the API server restarted (every watch breaks
    and is resumed from the resourceVersion it saw, now 410 Gone): it lists again and sees what changes after."""
    from kubernetes import client

    from runner.backends.gke.api import KubeApi
    from runner.backends.gke.watch import JobSetWatch
    from tests.kubecluster import jobset_manifest

    name = "watched"
    client.CustomObjectsApi(kube_api).create_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", kube_namespace, "jobsets", jobset_manifest(name, tpu_pool, hosts=1)
    )
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))  # the cluster as a kubeconfig context names it
    kubeapi = KubeApi("context:rehearsal", context="rehearsal")
    try:
        watch = JobSetWatch(kubeapi, kube_namespace, name, timeout_s=2).start()  # renewed every 2 s
        wait_for(lambda: watch.synced and watch.jobset is not None, "the watch's first list")
        core = client.CoreV1Api(kube_api)
        for i in range(2):  # writes the watch does not see: its resourceVersion falls behind etcd's revision
            core.create_namespaced_config_map(kube_namespace, {"metadata": {"name": f"tick-{i}"}})
        kube.cluster.expire_watches()
        forker.run(kube.cluster.restart_apiserver)  # every open watch broken: each resumes from what it saw
        # A write the watch sees after the compaction (the JobSet controller's status after the restart) moves it
        # past the compacted revision, and its next renewal is not too old: compacted again at each look, until a
        # renewal finds its resourceVersion gone.
        wait_for(lambda: watch.relists >= 1 or not kube.cluster.expire_watches(), "a list after 410 Gone", poll_s=0.5)
        client.CustomObjectsApi(kube_api).patch_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", kube_namespace, "jobsets", name, {"metadata": {"labels": {"seen": "yes"}}}
        )
        wait_for(
            lambda: ((watch.jobset or {}).get("metadata", {}).get("labels") or {}).get("seen") == "yes",
            "the change after the compaction, through the watch",
        )
        watch.close()
    finally:
        kubeapi.close()


def test_a_sigkilled_runner_leaves_what_runner_gc_deletes_once_the_run_is_over(
    on_gke: Any, kube_api: Any, kube_namespace: str, tmp_path: Path, bucket_url: str
) -> None:
    marker = tmp_path / "release"
    spec = gke_job(tmp_path, bucket_url, kube_namespace, wait_file_command(marker), type_="v5p-8")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runner = subprocess.Popen(
        [sys.executable, "-m", "runner.cli", "submit", str(spec)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(lambda: _running_pods(kube_api, kube_namespace), "the job's pod Running", timeout=180)
    finally:
        os.killpg(runner.pid, signal.SIGKILL)
        output = runner.communicate()[0].decode(errors="replace")
    run_id = next(line.split()[1] for line in output.splitlines() if line.startswith("run "))
    from kubernetes import client

    (js,) = client.CustomObjectsApi(kube_api).list_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", kube_namespace, "jobsets"
    )["items"]
    assert js["metadata"]["annotations"][RUN_DIR_ANNOTATION].endswith(run_id)
    # While the job runs, gc keeps it: its run directory says it is alive.
    from typer.testing import CliRunner

    from runner.cli import app

    kept = CliRunner().invoke(app, ["gc", "--project", "test-project"], catch_exceptions=False)
    assert kept.exit_code == 0, kept.output
    assert [p for p in on_gke.node_pools() if run_id in p], kept.output
    marker.write_text("go")
    from runner.storage import open_storage

    store = open_storage(js["metadata"]["annotations"][RUN_DIR_ANNOTATION])
    wait_for(lambda: store.read_bytes("exit/worker-0.json"), "the job's exit record", timeout=120)
    swept = CliRunner().invoke(app, ["gc", "--project", "test-project"], catch_exceptions=False)
    assert swept.exit_code == 0, swept.output
    said = " ".join(swept.output.split())
    assert "jobset" in said and "node pool" in said, said
    assert _leftovers(on_gke, kube_api, kube_namespace, run_id) == [], swept.output


def test_down_of_a_detached_run_asks_again_when_its_delete_is_refused(
    on_gke: Any, kube: Any, kube_api: Any, kube_namespace: str, tmp_path: Path, bucket_url: str
) -> None:
    from typer.testing import CliRunner

    from runner.cli import app

    marker = tmp_path / "release"
    spec = gke_job(tmp_path, bucket_url, kube_namespace, wait_file_command(marker), type_="v5p-8")
    result = submit(str(spec), "--detach")
    assert result.exit_code == 0, result.output
    run_id = next(line.split()[1] for line in result.output.splitlines() if line.startswith("run "))
    wait_for(lambda: _running_pods(kube_api, kube_namespace), "the job's pod Running", timeout=180)
    status = CliRunner().invoke(app, ["status", run_id], catch_exceptions=False)
    assert status.exit_code == 0 and "gke" in status.output, status.output
    listed = CliRunner().invoke(app, ["list"], catch_exceptions=False)
    assert run_id in listed.output, listed.output
    kube.webhook.refuse(Refusal("jobsets", name="*", count=1, message="refused once (tpu-emulator fault)"))
    down = CliRunner().invoke(app, ["down", run_id], catch_exceptions=False)
    assert down.exit_code == 0, down.output
    said = " ".join(down.output.split())
    assert "refused once" in said and "asking again" in said, said
    assert _leftovers(on_gke, kube_api, kube_namespace, run_id) == [], down.output
