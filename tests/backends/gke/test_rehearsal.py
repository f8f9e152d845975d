"""`runner submit` on the gke backend, end to end on the rehearsal (a real Kubernetes API server, scheduler, Job
controller and garbage collector; the JobSet controller, GKE's TPU webhook and the kubelet played): the node pool
made through the GKE API emulator, the JobSet's pods running the job's supervisor as processes, the run followed,
and everything deleted after."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from runner.backends.gke.requests import ACCELERATOR, NODE_POOL, RUN_DIR_ANNOTATION, TOPOLOGY
from runner.backends.labels import RUN as RUN_LABEL
from runner.storage import open_storage
from runner.watch import rundir
from tests.backends.gke.conftest import CLUSTER_PATH, gke_job
from tests.backends.test_tpu_vm import COMMAND_JOB, TRAIN
from tests.cloudjobs import events, run_id_of, submit
from tests.kubecluster import GROUP

pytestmark = GROUP

HELLO = 'command: [python, -c, \'import os; print("hi from worker", os.environ["RUNNER_WORKER_ID"])\']\n'


def _pods(kube_api: Any, namespace: str) -> list[Any]:
    from kubernetes import client

    return list(client.CoreV1Api(kube_api).list_namespaced_pod(namespace).items)


def test_a_command_runs_on_a_created_two_host_node_pool_and_everything_goes(
    on_gke: Any, kube_api: Any, kube_namespace: str, tmp_path: Path, bucket_url: str
) -> None:
    result = submit(str(gke_job(tmp_path, bucket_url, kube_namespace, HELLO)))
    assert result.exit_code == 0, result.output
    run_id = run_id_of(result.output)
    assert "hi from worker 0" in result.output and "hi from worker 1" in result.output, result.output
    run_dir = f"{bucket_url}/runs/{run_id}"
    store = open_storage(run_dir)
    for worker in (0, 1):
        record = json.loads(store.read_bytes(f"exit/worker-{worker}.json") or b"{}")
        assert record["state"] == "succeeded", record
    created = [r for r in on_gke.requests if r.method == "POST" and r.path.endswith("/nodePools")]
    assert [r.path for r in created] == [f"/v1/{CLUSTER_PATH}/nodePools"]
    assert not [p for p in on_gke.node_pools() if run_id[:20] in p]  # its node pool is gone
    assert _pods(kube_api, kube_namespace) == []  # and every pod of its JobSet
    seen = [e["event"] for e in events(run_dir)]
    assert "teardown_done" in seen


def _node_of(kube_api: Any, namespace: str) -> Any | None:
    """The node the JobSet's one running pod is on."""
    from kubernetes import client

    for pod in _pods(kube_api, namespace):
        if pod.status.phase == "Running" and pod.spec.node_name:
            return client.CoreV1Api(kube_api).read_node(pod.spec.node_name)
    return None


@pytest.mark.slow  # as the TPU VM backend's preempted command job (tests/backends/test_tpu_vm.py)
def test_training_resumes_after_its_node_is_taken_away_mid_epoch_losing_no_step(
    on_gke: Any, kube: Any, kube_api: Any, kube_namespace: str, tmp_path: Path, bucket_url: str
) -> None:
    """A user's Keras script on real MNIST (tests/backends/test_tpu_vm.py's, paced to EPOCH_FLOOR_S an epoch) on a
    single-host v5p-8 pool: once the bucket shows a step with a whole epoch still to go, the node is taken away (a
    Spot VM's preemption: the kubelet marks the pod DisruptionTarget and stops it with its grace, and the Node
    goes); GKE's node pool makes a new VM (the test plays that), the JobSet restarts itself, the runner follows
    its next attempt, and the script goes on from the step its stop saved: every step of the three epochs once."""
    from tpu_emulator.kube.nodes import TpuNode

    script = tmp_path / "train.py"
    script.write_text(COMMAND_JOB)
    spec = gke_job(
        tmp_path,
        bucket_url,
        kube_namespace,
        f"command: [python, {script}]\nenv: {{KERAS_BACKEND: tensorflow}}\n",
        name="resume",
        type_="v5p-8",
    )
    taken: list[int] = []  # the global step the bucket showed when the node was taken

    def take_mid_epoch() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not taken:
            for js in _jobsets(kube_api, kube_namespace):
                raw = open_storage(js["metadata"]["annotations"][RUN_DIR_ANNOTATION]).read_bytes("progress.json")
                p = rundir.Progress.from_json(json.loads(raw)) if raw else rundir.Progress()
                node = _node_of(kube_api, kube_namespace)
                if node is None or not (p.phase == "train" and p.global_step and p.epochs and p.steps_per_epoch):
                    continue
                if p.global_step > (p.epochs - 1) * p.steps_per_epoch:
                    continue
                taken.append(p.global_step)
                labels = node.metadata.labels
                kube.kubelet.take_node(node.metadata.name, grace_s=20.0)
                kube.add_nodes(  # GKE's node pool replaces the VM it lost
                    TpuNode(
                        f"{node.metadata.name}-r",
                        labels[ACCELERATOR],
                        labels[TOPOLOGY],
                        4,
                        node_pool=labels[NODE_POOL],
                        labels={RUN_LABEL: labels[RUN_LABEL]},
                    )
                )
            time.sleep(0.2)

    thread = threading.Thread(target=take_mid_epoch, daemon=True)
    thread.start()
    result = submit(str(spec))
    thread.join(5)
    assert taken, f"the node was never taken away:\n{result.output[-3000:]}"
    assert result.exit_code == 0, result.output
    assert "preempted: recreating it (1/3)" in result.output and "restarted (attempt 2)" in result.output
    assert "the job resumes from its newest checkpoint" in result.output, result.output
    run_dir = f"{bucket_url}/runs/{run_id_of(result.output)}"
    store = open_storage(run_dir)
    log = (store.read_bytes("logs/worker-0.log") or b"").decode()
    assert re.search(r"\[runner\] resumed from ckpt-\d{6}(-s\d{6})?\.keras", log), log
    metrics = [json.loads(line) for line in (store.read_bytes("metrics.jsonl") or b"").splitlines()]
    assert [m["epoch"] for m in metrics] == [1, 2, 3]  # one line per epoch, none twice
    assert metrics[-1]["global_step"] == 3 * TRAIN // 16  # steps of 16: none lost, none trained twice
    assert re.search(r"resumed +from step \d+ \(Keras, [^)]*\); 0 steps redone", result.output), result.output
    assert [e["event"] for e in events(run_dir)].count("preempted") == 1
    assert _pods(kube_api, kube_namespace) == []


def _jobsets(kube_api: Any, namespace: str) -> list[dict[str, Any]]:
    from kubernetes import client

    found = client.CustomObjectsApi(kube_api).list_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets"
    )
    return list(found.get("items") or [])
