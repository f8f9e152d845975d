"""Multislice end to end: `accelerator.slices: 2` of a v4-16 (2 hosts each) through the CLI on the two emulators:
one queued resource with multisliceParams, 4 workers with global ids, each told its slice and the coordinator
through the MEGASCALE_* variables, one preempted slice restarting every slice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from faults.scenario import STARTED
from runner.cli import app
from runner.launch.bootstrap import SPOT_GRACE_S
from runner.storage import Storage, open_storage
from tests.backends.test_tpu_vm_queued import api_calls, timeline
from tests.cloudjobs import IMAGE, UNTIL_PREEMPTED, preempt_when, run_id_of, submit

PRINT_ENV = (
    "import os\\ne = os.environ\\nprint('worker', e['RUNNER_WORKER_ID'], 'of', e['RUNNER_NUM_WORKERS'], 'slice', "
    "e['MEGASCALE_SLICE_ID'], 'of', e['MEGASCALE_NUM_SLICES'], 'hosts', e['RUNNER_HOSTS_PER_SLICE'], 'node', "
    "e['RUNNER_TPU_NAME'], 'coordinator', e['MEGASCALE_COORDINATOR_ADDRESS'], 'sync', e.get('RUNNER_SYNC_S'), "
    "flush=True)\\n"
)


def multislice_job(tmp_path: Path, bucket_url: str, script: str, extra: str = "") -> Path:
    path = tmp_path / "multi.yaml"
    path.write_text(
        f"name: multi\nimage: {IMAGE}\n"
        f"accelerator: {{type: v4-16, slices: 2, zone: us-central2-b, project: test-project{extra}}}\n"
        f'storage: {bucket_url}\ncommand: [python, -c, "{script}"]\n'
    )
    return path


def test_two_slices_run_four_workers_told_their_slice_and_go_once(cloud, tmp_path: Path, bucket_url: str) -> None:  # type: ignore[no-untyped-def]
    result = submit(str(multislice_job(tmp_path, bucket_url, PRINT_ENV)))
    assert result.exit_code == 0, result.output
    run_id = run_id_of(result.output)
    print("\n".join(timeline(result.output)))
    assert "(2 x v4-16 on-demand, $51.52/h x" in result.output  # the cost counts every slice
    (create,) = api_calls(cloud, "POST", r"/queuedResources$")
    (node_spec,) = create.body["tpu"]["nodeSpec"]
    assert node_spec["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": run_id} and "nodeId" not in node_spec
    for w in range(4):
        slice_id = w // 2
        line = (
            f"[worker {w}] worker {w} of 4 slice {slice_id} of 2 hosts 2 node {run_id}-{slice_id} "
            "coordinator 10.130.0.2:8080 sync 0.5"  # the runner's job_sync_s (FAST_TIMINGS), on every VM
        )
        assert line in result.output, result.output
    store = open_storage(f"{bucket_url}/runs/{run_id}")
    exits = [json.loads(store.read_bytes(f"exit/worker-{w}.json") or b"{}") for w in range(4)]
    assert [e["state"] for e in exits] == ["succeeded"] * 4
    assert {o.key for o in store.list("heartbeats/")} == {f"heartbeats/worker-{w}.json" for w in range(4)}
    assert {o.key for o in store.list("logs/")} == {f"logs/worker-{w}.log" for w in range(4)}
    # Teardown deleted every slice once: one forced delete of the queued resource; each slice's first host
    # deleted its own node (after every worker's exit record) at most once.
    (delete,) = api_calls(cloud, "DELETE", r"/queuedResources/")
    assert delete.query.get("force") == "true"
    assert len(api_calls(cloud, "DELETE", r"/nodes/")) <= 2
    assert not cloud.nodes() and not cloud.queued_resources()
    logs = CliRunner().invoke(app, ["logs", run_id], catch_exceptions=False)
    assert [line.split(" slice")[0] for line in logs.output.splitlines() if "] worker" in line] == [
        f"[worker {w}] worker {w} of 4" for w in range(4)
    ]


def test_one_preempted_slice_restarts_every_slice(cloud, tmp_path: Path, bucket_url: str) -> None:  # type: ignore[no-untyped-def]
    script = PRINT_ENV + UNTIL_PREEMPTED
    spec = multislice_job(tmp_path, bucket_url, script, extra=", spot: true")

    def first_attempt_under_way(node: Any, store: Storage) -> bool:
        return (
            node.node_id.endswith("-1")
            and len(store.list("heartbeats/")) == 4
            and store.read_bytes(STARTED) is not None
        )

    thread, preempted = preempt_when(cloud, first_attempt_under_way, timeout_s=90)
    result = submit(str(spec))
    thread.join(5)
    assert preempted, "slice 1 was never preempted"
    assert result.exit_code == 0, result.output
    print("\n".join(timeline(result.output)))
    assert "a slice was preempted: recreating all 2 slices (1/3)" in result.output
    creates = api_calls(cloud, "POST", r"/queuedResources$")
    assert len(creates) == 2 and creates[0].query["queuedResourceId"] == creates[1].query["queuedResourceId"]
    deletes = api_calls(cloud, "DELETE", r"/queuedResources/")
    assert len(deletes) == 2 and all(d.query.get("force") == "true" for d in deletes)  # replaced once, then done
    assert all(f"[worker {w}] tick 5" in result.output for w in range(4))
    assert not cloud.nodes() and not cloud.queued_resources()


def test_a_jax_job_on_two_slices_trains_as_one_cluster_and_a_preempted_slice_loses_no_step(
    cloud, tmp_path: Path, bucket_url: str, gcs_mnist: str
) -> None:  # type: ignore[no-untyped-def]
    """The JAX engine on 2 x v4-16: its 4 processes (one per host of either slice) form one jax.distributed cluster
    from what each VM is told (the emulator's stand-in for JAX's Cloud TPU detection, tpu_emulator.docker_shim
    .jax_cluster_env), DataParallel over all 4 devices. Slice 1 preempted mid-epoch: its hosts get SIGTERM first
    (then the service deletes slice 0 too), every worker stops at one agreed step, worker 0 saves it, all slices are
    recreated, and the run ends with exactly the steps of an uninterrupted one."""
    path = tmp_path / "jaxmulti.yaml"
    path.write_text(
        f"name: jaxmulti\nimage: {IMAGE}\n"
        "accelerator: {type: v4-16, slices: 2, zone: us-central2-b, project: test-project, spot: true}\n"
        f"storage: {bucket_url}\n"
        "training: {framework: jax, model: mnist_mlp, epochs: 1, batch_size: 32, max_train_examples: 8192,\n"
        f"           max_test_examples: 512, data: {gcs_mnist}}}\n"
    )
    # 256 steps: an epoch that lasts many times the second by which the bucket's progress.json trails the trainer
    # (the VMs sync and write progress every 0.5 s: conftest's FAST_TIMINGS), so it is seen in its first half.
    steps = 8192 // 32
    # A Spot VM's 30 s from SIGTERM to power-off, not the fixture's 3 s: on a loaded machine worker 0's stop
    # checkpoint and exit record took longer than 3 s to reach the bucket (the VM powers off once its job is gone).
    cloud.vm_grace_s = SPOT_GRACE_S

    def mid_epoch(node: Any, store: Storage) -> bool:
        raw = node.node_id.endswith("-1") and store.read_bytes("progress.json")
        return bool(raw) and 0 < json.loads(raw or b"{}").get("step", 0) < steps // 2

    thread, preempted = preempt_when(cloud, mid_epoch, timeout_s=240, poll_s=0.1)
    result = submit(str(path))
    thread.join(5)
    print("\n".join(line for line in result.output.splitlines() if "SIGTERM" in line or "worker 0 " in line))
    assert result.exit_code == 0, result.output
    assert preempted, "slice 1 was never preempted"
    assert "a slice was preempted: recreating all 2 slices (1/3)" in result.output
    assert "worker 0 has stopped" in result.output
    for w in range(4):
        assert f"[worker {w}] [trainer] strategy: DataParallel on CPU, 4 replicas" in result.output, result.output
        assert f"4 processes of 1 devices (this is process {w})" in result.output
    store = open_storage(f"{bucket_url}/runs/{run_id_of(result.output)}")
    summary = json.loads(store.read_bytes("summary.json") or b"{}")
    assert summary["strategy"]["processes"] == 4 and summary["strategy"]["replicas"] == 4
    resumed_at = (summary["resumed_from"] or {}).get("step", 0)
    assert 0 < resumed_at < steps, result.output  # the step all 4 agreed on, saved by worker 0
    assert summary["global_step"] == steps and summary["steps_this_attempt"] == steps - resumed_at
    assert 0.8 <= summary["test_accuracy"] <= 1.0  # 0.90 on this slice
    metrics = [json.loads(line) for line in (store.read_bytes("metrics.jsonl") or b"").splitlines()]
    assert [m["epoch"] for m in metrics] == [1]  # one writer, one row for the epoch cut in two
    assert not cloud.nodes() and not cloud.queued_resources()
