"""What the real API server of 1.20 does that a backend must live with: it prunes unknown fields silently (so our
own validator refuses them), answers 410 Gone to a watch from a compacted resourceVersion (the follower lists
again), and comes back after a restart."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest

from tests.kubecluster import GROUP, jobset_manifest
from tests.waiting import wait_for
from tpu_emulator.kube.cluster import JOBSET_CRD
from tpu_emulator.kube.jobset import GROUP as JS_GROUP
from tpu_emulator.kube.jobset import PLURAL, VERSION
from tpu_emulator.kube.validate import ManifestError, Schemas
from tpu_emulator.kube.watching import Follower

pytestmark = GROUP


@pytest.fixture(scope="module")
def schemas(kube: Any) -> Schemas:
    return Schemas.load(crds=[JOBSET_CRD], openapi=kube.cluster.get("/openapi/v2"))


def test_a_misspelled_field_is_pruned_by_the_server_and_refused_by_the_validator(
    kube_api: Any, kube_namespace: str, schemas: Schemas
) -> None:
    from kubernetes import client

    manifest = jobset_manifest("typo", "no-pool")
    manifest["spec"]["replicatedJob"] = manifest["spec"].pop("replicatedJobs")
    with pytest.raises(ManifestError) as refused:
        schemas.require(manifest)
    assert refused.value.problems == [(".spec.replicatedJob", "field not declared in schema")]

    # Why the validator exists: Kubernetes 1.20 takes the same manifest and drops the field without a word.
    custom = client.CustomObjectsApi(kube_api)
    stored = custom.create_namespaced_custom_object(JS_GROUP, VERSION, kube_namespace, PLURAL, manifest)
    assert "replicatedJob" not in stored["spec"] and "replicatedJobs" not in stored["spec"]


def test_built_in_objects_are_checked_against_the_servers_openapi(kube_api: Any, schemas: Schemas) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "labels": {"a": "b"}},
        "spec": {
            "parallelism": 2,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "c", "image": "x", "resources": {"limits": {"google.com/tpu": 4, "memory": "1Gi"}}}
                    ],
                }
            },
        },
    }
    assert schemas.check(job) == []
    bad = copy.deepcopy(job)
    bad["spec"]["parallelsim"] = 2
    bad["metadata"]["lables"] = {}
    bad["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "lots"
    assert sorted(p for p, _ in schemas.check(bad)) == [
        ".metadata.lables",
        ".spec.parallelsim",
        ".spec.template.spec.containers[0].resources.limits.cpu",
    ]
    # 1.20 knows no completionMode (1.21): the server's own document says so.
    modern = copy.deepcopy(job)
    modern["spec"]["completionMode"] = "Indexed"
    assert schemas.check(modern) == [(".spec.completionMode", "field not declared in schema")]


def test_a_watch_from_a_compacted_resource_version_gets_410_and_the_follower_lists_again(
    kube: Any, kube_api: Any, kube_namespace: str
) -> None:
    from kubernetes import client, watch
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(kube_api)
    seen: dict[str, str] = {}

    def on_event(kind: str, cm: Any) -> None:
        seen[cm.metadata.name] = kind

    def on_sync(items: list[Any]) -> None:
        for cm in items:
            seen[cm.metadata.name] = "LISTED"

    follower = Follower(
        "configmaps", core.list_namespaced_config_map, on_event, on_sync, {"namespace": kube_namespace}, timeout_s=1
    ).start()
    try:
        follower.synced.wait(30)
        core.create_namespaced_config_map(kube_namespace, {"metadata": {"name": "first"}})
        wait_for(lambda: seen.get("first") == "ADDED", "the first ConfigMap's event")
        old = follower.resource_version
        # Writes the follower does not see, then etcd compacted past them: every older resourceVersion expires.
        other = f"t-{uuid.uuid4().hex[:8]}"
        core.create_namespace({"metadata": {"name": other}})
        core.create_namespaced_config_map(other, {"metadata": {"name": "elsewhere"}})
        kube.cluster.expire_watches()

        with pytest.raises(ApiException) as gone:
            for _ in watch.Watch().stream(
                core.list_namespaced_config_map, kube_namespace, resource_version=old, timeout_seconds=5
            ):
                pass
        assert gone.value.status == 410

        wait_for(lambda: follower.relists >= 1, "the follower's list after 410 Gone")
        core.create_namespaced_config_map(kube_namespace, {"metadata": {"name": "second"}})
        wait_for(lambda: seen.get("second") in ("ADDED", "LISTED"), "the second ConfigMap seen after the relist")
    finally:
        follower.close()


def test_anonymous_requests_are_refused(kube: Any) -> None:
    import ssl
    import urllib.error
    import urllib.request

    context = ssl.create_default_context(cafile=str(kube.cluster.ca_file))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(kube.endpoint + "/api/v1/namespaces", timeout=10, context=context)
    assert refused.value.code == 403


def test_a_jobset_completes_across_an_api_server_restart(
    kube: Any, kube_api: Any, kube_namespace: str, tpu_pool: str, tmp_path: Any
) -> None:
    """The API server stopped and started mid-run: the played controllers' watches resume, the kubelet's status
    writes wait for it, and the run ends as if nothing happened."""
    from kubernetes import client

    release = tmp_path / "release"
    name = f"js-{uuid.uuid4().hex[:6]}"
    wait = f"while [ ! -e {release} ]; do sleep 0.1; done"
    client.CustomObjectsApi(kube_api).create_namespaced_custom_object(
        JS_GROUP, VERSION, kube_namespace, PLURAL, jobset_manifest(name, tpu_pool, command=["sh", "-c", wait])
    )
    core = client.CoreV1Api(kube_api)

    def phases() -> list[str]:
        pods = core.list_namespaced_pod(kube_namespace, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}")
        return [p.status.phase for p in pods.items]

    wait_for(lambda: phases() == ["Running", "Running"], "both pods Running")
    kube.cluster.restart_apiserver()
    release.touch()

    def completed() -> bool:
        js = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
            JS_GROUP, VERSION, kube_namespace, PLURAL, name
        )
        return (js.get("status") or {}).get("terminalState") == "Completed"

    wait_for(completed, "the JobSet Completed after the restart")
    assert phases() == ["Succeeded", "Succeeded"]
