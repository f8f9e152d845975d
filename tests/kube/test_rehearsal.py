"""The GKE rehearsal against the real servers: a JobSet through the official client becomes Jobs (played JobSet
controller) and pods (the real Job controller), the real scheduler binds them to fake TPU nodes by nodeSelector,
taint and google.com/tpu, the played kubelet runs them, and the real garbage collector removes them."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.containers import GROUP as CONTAINERS_GROUP
from tests.kubecluster import GROUP, jobset_manifest
from tests.waiting import wait_for
from tpu_emulator.kube.cluster import JOBSET_CRD
from tpu_emulator.kube.jobset import GROUP as JS_GROUP
from tpu_emulator.kube.jobset import NAME, PLURAL, VERSION
from tpu_emulator.kube.validate import Schemas
from tpu_emulator.kube.watching import Follower
from tpu_emulator.kube.webhook import INDEX_ANNOTATION

pytestmark = GROUP

# What each pod prints: the variables GKE's TPU webhook sets and the completion index, then JAX's cluster as the
# kubelet gives it (process id, processes, coordinator), then exits.
REPORT = [
    "python",
    "-c",
    "import os; e = os.environ; print('worker', e['TPU_WORKER_ID'], e['JOB_COMPLETION_INDEX'],"
    " e['TPU_WORKER_HOSTNAMES'], 'jax', e['KERAS_DISTRIBUTION_PROCESS_ID'], e['KERAS_DISTRIBUTION_NUM_PROCESSES'],"
    " e['KERAS_DISTRIBUTION_JOB_ADDRESSES'], flush=True)",
]


def _apis(api: Any) -> tuple[Any, Any, Any]:
    from kubernetes import client

    return client.CustomObjectsApi(api), client.CoreV1Api(api), client.BatchV1Api(api)


def _create(api: Any, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
    assert Schemas.load(crds=[JOBSET_CRD]).check(manifest) == []
    custom, _, _ = _apis(api)
    return dict(custom.create_namespaced_custom_object(JS_GROUP, VERSION, namespace, PLURAL, manifest))


def _jobset(api: Any, namespace: str, name: str) -> dict[str, Any]:
    custom, _, _ = _apis(api)
    return dict(custom.get_namespaced_custom_object(JS_GROUP, VERSION, namespace, PLURAL, name))


def _condition(js: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (js.get("status") or {}).get("conditions", []) if c["type"] == kind), None)


def _jobset_with(api: Any, namespace: str, name: str, kind: str) -> dict[str, Any] | None:
    """The JobSet once its condition `kind` is there."""
    js = _jobset(api, namespace, name)
    return js if _condition(js, kind) else None


def _running(api: Any, namespace: str, name: str, count: int = 2) -> list[Any] | None:
    """The JobSet's pods once `count` of them are Running."""
    pods = _pods(api, namespace, name)
    return pods if [p.status.phase for p in pods] == ["Running"] * count else None


def _failed_or_refused(kube: Any, api: Any, namespace: str, name: str) -> dict[str, Any] | None:
    """The JobSet once Failed; the test fails at once, with the kubelet's words, when a pod could not start."""
    if js := _jobset_with(api, namespace, name, "Failed"):
        return js
    errors = [e for e in kube.kubelet.errors if e.startswith(f"{namespace}/") or f" {namespace}/" in e]
    for pod in _pods(api, namespace, name):
        if pod.status.reason == "StartError" or errors:
            pytest.fail(f"{pod.metadata.name} did not start: {pod.status.message} {errors}")
    return None


def _pods(api: Any, namespace: str, name: str) -> list[Any]:
    _, core, _ = _apis(api)
    return list(core.list_namespaced_pod(namespace, label_selector=f"{NAME}={name}").items)


def _together(directory: Path, hosts: int = 2) -> list[str]:
    """REPORT once every host of the slice has started (a file each in `directory`, the pods being processes on this
    machine): a slice's hosts run at once, as on a TPU slice. Without it the Job controller may make the second pod
    after the first has ended, and the scheduler may put it on the node the first left free."""
    wait = (
        f"import os, pathlib, time; d = pathlib.Path({str(directory)!r}); (d / e['TPU_WORKER_ID']).touch()\n"
        f"while len(list(d.iterdir())) < {hosts}: time.sleep(0.05)\n"
    )
    return [*REPORT[:2], "import os; e = os.environ\n" + wait + REPORT[2]]


def test_a_jobset_runs_on_tpu_nodes_and_completes(
    kube: Any, kube_api: Any, kube_namespace: str, tpu_pool: str, tmp_path: Path
) -> None:
    name = f"js-{uuid.uuid4().hex[:6]}"
    _create(kube_api, kube_namespace, jobset_manifest(name, tpu_pool, command=_together(tmp_path)))

    js = wait_for(
        lambda: _jobset_with(kube_api, kube_namespace, name, "Completed"),
        "the JobSet Completed",
    )
    assert js["status"]["terminalState"] == "Completed"
    assert _condition(js, "Completed")["reason"] == "AllJobsCompleted"

    _, core, batch = _apis(kube_api)
    (job,) = batch.list_namespaced_job(kube_namespace, label_selector=f"{NAME}={name}").items
    assert job.metadata.name == f"{name}-slice-0"
    assert (job.spec.parallelism, job.spec.completions) == (2, 2)
    assert job.metadata.owner_references[0].kind == "JobSet"
    assert any(c.type == "Complete" and c.status == "True" for c in job.status.conditions)

    pods = _pods(kube_api, kube_namespace, name)
    assert sorted(p.status.phase for p in pods) == ["Succeeded", "Succeeded"]
    assert {p.spec.node_name for p in pods} == {f"{tpu_pool}-0", f"{tpu_pool}-1"}  # one host per node: 4 chips each
    indexes = sorted(int(p.metadata.annotations[INDEX_ANNOTATION]) for p in pods)
    assert indexes == [0, 1]
    hostnames = f"{name}-slice-0-0.{name},{name}-slice-0-1.{name}"
    coordinators = set()
    for pod in pods:
        index = pod.metadata.annotations[INDEX_ANNOTATION]
        assert pod.spec.hostname == f"{name}-slice-0-{index}" and pod.spec.subdomain == name
        log = kube.kubelet.log_of(kube_namespace, pod.metadata.name)
        assert log is not None
        line = next(ln for ln in log.read_text().splitlines() if ln.startswith("worker "))
        assert line.startswith(f"worker {index} {index} {hostnames} jax {index} 2 127.0.0.1:")
        coordinators.add(line.rsplit(" ", 1)[1])
        (state,) = pod.status.container_statuses
        assert state.state.terminated.exit_code == 0 and state.state.terminated.reason == "Completed"
    assert len(coordinators) == 1  # one JAX cluster: both hosts name the same coordinator
    service = core.read_namespaced_service(name, kube_namespace)
    assert service.spec.cluster_ip == "None"


def test_a_reconcile_that_fails_once_is_tried_again(
    kube: Any, kube_api: Any, kube_namespace: str, tpu_pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A passing fault in the JobSet controller (the API server away, a connection reset) is not the JobSet's end:
    the reconcile is tried again after a backoff, as the real controller's work queue does, and the Jobs come."""
    name = f"js-{uuid.uuid4().hex[:6]}"
    controller = kube.jobsets
    reconcile, failed = controller.reconcile, []

    def failing_once(namespace: str, js: str) -> None:
        if js == name and not failed:
            failed.append(js)
            raise ConnectionResetError("connection reset by peer")
        reconcile(namespace, js)

    monkeypatch.setattr(controller, "reconcile", failing_once)
    _create(kube_api, kube_namespace, jobset_manifest(name, tpu_pool, command=REPORT))
    _, _, batch = _apis(kube_api)
    wait_for(lambda: batch.list_namespaced_job(kube_namespace, label_selector=f"{NAME}={name}").items, "its Job")
    assert failed == [name]
    assert any(e.startswith(f"{kube_namespace}/{name}: ConnectionResetError") for e in controller.errors)


def test_the_real_scheduler_leaves_what_does_not_fit_pending(kube_api: Any, kube_namespace: str, tpu_pool: str) -> None:
    _, core, _ = _apis(kube_api)

    def pod(name: str, accelerator: str, chips: int) -> dict[str, Any]:
        selector = {"cloud.google.com/gke-tpu-accelerator": accelerator, "cloud.google.com/gke-nodepool": tpu_pool}
        return {
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": selector,
                "tolerations": [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [
                    {
                        "name": "c",
                        "image": "x",
                        "command": ["true"],
                        "resources": {"limits": {"google.com/tpu": str(chips)}},
                    }
                ],
            },
        }

    core.create_namespaced_pod(kube_namespace, pod("wrong-accelerator", "tpu7x", 4))
    core.create_namespaced_pod(kube_namespace, pod("too-many-chips", "tpu-v5p-slice", 8))
    untolerated = pod("no-toleration", "tpu-v5p-slice", 4)
    del untolerated["spec"]["tolerations"]
    core.create_namespaced_pod(kube_namespace, untolerated)

    def unschedulable(name: str) -> str | None:
        status = core.read_namespaced_pod(name, kube_namespace).status
        found = [c for c in status.conditions or [] if c.type == "PodScheduled" and c.reason == "Unschedulable"]
        return found[0].message if found else None

    assert "node affinity" in wait_for(lambda: unschedulable("wrong-accelerator"), "the tpu7x pod Unschedulable")
    assert "Insufficient google.com/tpu" in wait_for(lambda: unschedulable("too-many-chips"), "the 8-chip pod")
    assert "taint" in wait_for(lambda: unschedulable("no-toleration"), "the untolerating pod Unschedulable")


def test_a_foreground_delete_removes_jobs_pods_and_processes(
    kube: Any, kube_api: Any, kube_namespace: str, tpu_pool: str
) -> None:
    name = f"js-{uuid.uuid4().hex[:6]}"
    _create(kube_api, kube_namespace, jobset_manifest(name, tpu_pool, command=["sleep", "600"]))
    pods = wait_for(
        lambda: _running(kube_api, kube_namespace, name),
        "both pods Running",
    )
    uids = {p.metadata.uid for p in pods}
    assert wait_for(lambda: {u for u in uids if any(kube.kubelet.pids_of(u))} == uids, "both pods' processes")

    custom, _, batch = _apis(kube_api)
    custom.delete_namespaced_custom_object(
        JS_GROUP, VERSION, kube_namespace, PLURAL, name, propagation_policy="Foreground"
    )

    def gone() -> bool:
        from kubernetes.client.rest import ApiException

        try:
            _jobset(kube_api, kube_namespace, name)
            return False
        except ApiException as exc:
            return exc.status == 404

    wait_for(gone, "the JobSet gone (after its Jobs and pods: foreground)")
    assert _pods(kube_api, kube_namespace, name) == []
    assert batch.list_namespaced_job(kube_namespace, label_selector=f"{NAME}={name}").items == []
    assert not any(kube.kubelet.pids_of(u) for u in uids)


def test_a_failed_pod_restarts_the_jobset_with_fresh_pods(kube_api: Any, kube_namespace: str, tpu_pool: str) -> None:
    """Attempt 0 fails (exit 3 on host 1); failurePolicy.maxRestarts 1 restarts the whole JobSet, and attempt 1
    completes: its pods are new ones, labelled with the new attempt."""
    name = f"js-{uuid.uuid4().hex[:6]}"
    manifest = jobset_manifest(
        name,
        tpu_pool,
        max_restarts=1,
        command=["sh", "-c", 'if [ "$ATTEMPT" = 0 ] && [ "$TPU_WORKER_ID" = 1 ]; then exit 3; fi'],
    )
    container = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    label = "metadata.labels['jobset.sigs.k8s.io/restart-attempt']"
    container["env"] = [{"name": "ATTEMPT", "valueFrom": {"fieldRef": {"fieldPath": label}}}]
    _create(kube_api, kube_namespace, manifest)

    js = wait_for(
        lambda: _jobset_with(kube_api, kube_namespace, name, "Completed"),
        "the JobSet Completed after one restart",
    )
    assert js["status"]["restarts"] == 1
    pods = _pods(kube_api, kube_namespace, name)
    attempts = {p.metadata.labels["jobset.sigs.k8s.io/restart-attempt"] for p in pods if p.status.phase == "Succeeded"}
    assert attempts == {"1"}


def test_a_jobset_without_restarts_left_fails(kube_api: Any, kube_namespace: str, tpu_pool: str) -> None:
    name = f"js-{uuid.uuid4().hex[:6]}"
    _create(kube_api, kube_namespace, jobset_manifest(name, tpu_pool, command=["sh", "-c", "exit 7"]))
    js = wait_for(
        lambda: _jobset_with(kube_api, kube_namespace, name, "Failed"),
        "the JobSet Failed",
    )
    assert js["status"]["terminalState"] == "Failed"
    assert _condition(js, "Failed")["reason"] == "FailedJobs"
    codes = {
        p.status.container_statuses[0].state.terminated.exit_code
        for p in _pods(kube_api, kube_namespace, name)
        if p.status.phase == "Failed"
    }
    assert codes == {7}


@pytest.mark.parametrize("grace", [0.0])
def test_a_node_taken_away_fails_its_pod_and_restarts_the_jobset(
    kube: Any, kube_api: Any, kube_namespace: str, grace: float
) -> None:
    """A host preempted: its pod ends Failed (node shutdown), the Job fails (backoffLimit 0), and the JobSet is
    restarted onto the nodes that are left."""
    from tpu_emulator.kube.nodes import TpuNode

    pool = f"pool-{uuid.uuid4().hex[:8]}"
    nodes = [TpuNode(f"{pool}-{i}", "tpu-v5p-slice", "2x2x2", 4, node_pool=pool) for i in range(3)]
    kube.add_nodes(*nodes)
    try:
        name = f"js-{uuid.uuid4().hex[:6]}"
        manifest = jobset_manifest(name, pool, max_restarts=1, command=["sleep", "600"])
        _create(kube_api, kube_namespace, manifest)
        running = wait_for(
            lambda: _running(kube_api, kube_namespace, name),
            "both pods Running",
        )
        victim, pod = running[0].spec.node_name, running[0].metadata.name
        # What the victim pod went through, as a watcher sees it: it is deleted with its Job when the JobSet restarts.
        seen: list[tuple[str | None, str | None]] = []
        _, core, _ = _apis(kube_api)
        follower = Follower(
            "victim",
            core.list_namespaced_pod,
            lambda kind, p: seen.append((p.status.phase, p.status.reason)) if p.metadata.name == pod else None,
            lambda items: None,
            {"namespace": kube_namespace},
        ).start()
        try:
            follower.synced.wait(30)
            assert kube.kubelet.take_node(victim, grace_s=grace) == [f"{kube_namespace}/{pod}"]
            js = wait_for(
                lambda: (js := _jobset(kube_api, kube_namespace, name)) and js["status"].get("restarts") == 1 and js,
                "the JobSet restarted",
            )
            wait_for(lambda: ("Failed", "Terminated") in seen, "the victim pod Failed by the node's shutdown")
        finally:
            follower.close()
        assert js["status"].get("terminalState") is None

        def new_attempt_running() -> list[Any] | None:
            pods = [
                p
                for p in _pods(kube_api, kube_namespace, name)
                if p.metadata.labels["jobset.sigs.k8s.io/restart-attempt"] == "1"
            ]
            return pods if [p.status.phase for p in pods] == ["Running"] * 2 else None

        again = wait_for(new_attempt_running, "the restarted attempt's pods Running")
        assert victim not in {p.spec.node_name for p in again}
    finally:
        kube.remove_nodes(*(n.name for n in nodes))


# With the tests that build and run images (xdist group "containers"), not beside them: a `podman run` waits on
# Podman's storage lock while another worker's build commits gigabytes of layers, and the pod stayed Running for
# minutes (twice in CI-like runs). Its own rehearsal starts on that worker.
@CONTAINERS_GROUP
def test_a_pod_runs_in_a_real_container(
    kube: Any, kube_api: Any, kube_namespace: str, tpu_pool: str, container_engine: Any
) -> None:
    """The kubelet's container mode: the pod's image under the machine's engine (Podman or Docker), its command as
    the entrypoint, the webhook's variables passed in, the exit code read back."""
    from tests.containers import BASE_IMAGE
    from tpu_emulator.kube.kubelet import RUN_ANNOTATION

    name = f"js-{uuid.uuid4().hex[:6]}"
    manifest = jobset_manifest(name, tpu_pool, hosts=1, command=[*REPORT[:2], REPORT[2] + "; import sys; sys.exit(4)"])
    pod_template = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    pod_template["metadata"] = {"annotations": {RUN_ANNOTATION: "container"}}
    pod_template["spec"]["containers"][0]["image"] = BASE_IMAGE
    _create(kube_api, kube_namespace, manifest)
    try:
        wait_for(lambda: _failed_or_refused(kube, kube_api, kube_namespace, name), "the JobSet Failed (exit 4)")
    except pytest.fail.Exception as exc:  # what each part was doing, for the next reader of a timeout
        import subprocess

        pods = [(p.metadata.name, p.status.phase, p.spec.node_name, p.status.container_statuses)
                for p in _pods(kube_api, kube_namespace, name)]  # fmt: skip
        ps = subprocess.run([*container_engine.argv, "ps", "-a"], capture_output=True, text=True, timeout=60)
        status = (_jobset(kube_api, kube_namespace, name) or {}).get("status")
        engine = f"{container_engine.name} ps -a:\n{ps.stdout}{ps.stderr}"
        pytest.fail(f"{exc}\npods: {pods}\njobset status: {status}\nkubelet errors: {kube.kubelet.errors}\n{engine}")
    (pod,) = _pods(kube_api, kube_namespace, name)
    assert pod.status.container_statuses[0].state.terminated.exit_code == 4
    log = kube.kubelet.log_of(kube_namespace, pod.metadata.name)
    assert log is not None and f"worker 0 0 {name}-slice-0-0.{name}" in log.read_text()


def test_a_command_the_engine_cannot_run_fails_the_pod_with_the_engine_s_words(
    kube: Any, kube_api: Any, kube_namespace: str, tpu_pool: str, container_engine: Any
) -> None:
    """`podman run` (or `docker run`) refusing (exit 125-127) ends the pod Failed, StartError, with the engine's own
    message, never a pod left Running."""
    from tests.containers import BASE_IMAGE
    from tpu_emulator.kube.kubelet import ENGINE_EXITS, RUN_ANNOTATION

    name = f"js-{uuid.uuid4().hex[:6]}"
    manifest = jobset_manifest(name, tpu_pool, hosts=1, command=["no-such-command-here"])
    pod_template = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    pod_template["metadata"] = {"annotations": {RUN_ANNOTATION: "container"}}
    pod_template["spec"]["containers"][0]["image"] = BASE_IMAGE
    _create(kube_api, kube_namespace, manifest)
    wait_for(lambda: _jobset_with(kube_api, kube_namespace, name, "Failed"), "the JobSet Failed")
    (pod,) = _pods(kube_api, kube_namespace, name)
    assert pod.status.container_statuses[0].state.terminated.exit_code in ENGINE_EXITS
    assert pod.status.reason == "StartError" and "no-such-command-here" in pod.status.message, pod.status


def test_a_killed_pod_fails_the_jobset_with_its_exit_code(
    kube: Any, kube_api: Any, kube_namespace: str, tpu_pool: str
) -> None:
    name = f"js-{uuid.uuid4().hex[:6]}"
    _create(kube_api, kube_namespace, jobset_manifest(name, tpu_pool, command=["sleep", "600"]))
    running = wait_for(lambda: _running(kube_api, kube_namespace, name), "both pods Running")
    assert kube.kubelet.kill_pod(kube_namespace, running[0].metadata.name)
    js = wait_for(lambda: _jobset_with(kube_api, kube_namespace, name, "Failed"), "the JobSet Failed")
    assert js["status"]["terminalState"] == "Failed"
    _, core, _ = _apis(kube_api)
    killed = core.read_namespaced_pod(running[0].metadata.name, kube_namespace)
    assert killed.status.phase == "Failed"
    assert killed.status.container_statuses[0].state.terminated.exit_code == 137
    custom, _, _ = _apis(kube_api)
    custom.delete_namespaced_custom_object(
        JS_GROUP, VERSION, kube_namespace, PLURAL, name, propagation_policy="Foreground"
    )


def test_a_refused_delete_fails_as_the_api_server_says_it(kube: Any, kube_api: Any, kube_namespace: str) -> None:
    from kubernetes.client.rest import ApiException

    from tpu_emulator.kube.webhook import Refusal

    name = f"js-{uuid.uuid4().hex[:6]}"
    _create(kube_api, kube_namespace, jobset_manifest(name, "no-such-pool"))
    kube.webhook.refuse(Refusal("jobsets", name=name, count=1, message="etcd is having a bad day"))
    custom, _, _ = _apis(kube_api)
    with pytest.raises(ApiException) as refused:
        custom.delete_namespaced_custom_object(JS_GROUP, VERSION, kube_namespace, PLURAL, name)
    assert refused.value.status == 500
    assert "denied the request: etcd is having a bad day" in str(refused.value.body)
    custom.delete_namespaced_custom_object(JS_GROUP, VERSION, kube_namespace, PLURAL, name)  # the fault is used up
