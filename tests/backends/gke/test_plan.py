"""The gke backend's plan, offline: the target from the spec (cluster, namespace, queue, node pool), the dry run's
exact requests (golden files: a v5p-16 of 2 hosts on a created pool, and 2 slices of TPU7x with Spot, a workload
policy and a Kueue queue), every JobSet checked against the JobSet CRD's own schema with unknown fields refused,
every node pool body against Google's container.v1.json, and plan-time refusals as exit 2."""

from __future__ import annotations

import copy
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from runner.backends import plan_cloud
from runner.backends.gke import requests
from runner.backends.gke.backend import GkeBackend
from runner.backends.gke.target import GkeTarget, names
from runner.cli import app
from runner.plan.planner import Plan
from runner.spec.loader import load_spec_text
from tpu_emulator import discovery
from tpu_emulator.kube.cluster import JOBSET_CRD
from tpu_emulator.kube.validate import Schemas

GOLDEN = Path(__file__).parent / "golden"
IMAGE = "us-central1-docker.pkg.dev/team-proj/runner/trainer:test"
CONTAINER = discovery.load("container.v1.json")
CREATE_POOL = "container.projects.locations.clusters.nodePools.create"
V5P_16 = "type: v5p-16, zones: [us-central1-a]"
CLUSTER = "location: us-central1, name: tpu-cluster, namespace: team-a"
TPU7X_2 = "type: tpu7x-16, slices: 2, spot: true, zones: [us-central1-c, us-central1-ai1a]"
TPU7X_CLUSTER = f"{CLUSTER}, queue: team-a-queue, workload_policy: ironwood-2x2x2"


def spec_text(accelerator: str, cluster: str, *, body: str = "command: [python, train.py]\n") -> str:
    return (
        textwrap.dedent(f"""\
        name: gke-job
        image: {IMAGE}
        storage: gs://bucket/tpu-runner
        accelerator: {{{accelerator}, backend: gke, project: team-proj, cluster: {{{cluster}}}}}
        """)
        + body
    )


def plan(accelerator: str = V5P_16, cluster: str = CLUSTER, **kwargs: Any) -> Plan:
    spec = load_spec_text(spec_text(accelerator, cluster, **kwargs))
    return plan_cloud(  # the registry's: the backend the spec names, and the platform's limits
        spec, None, environ={"CLOUDSDK_CONFIG": "/nonexistent"}, now=1_800_000_000.0, run_suffix="abcd",
        nonce="0123abcd",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("golden", "accelerator", "cluster"),
    [("dry_run_v5p_16.txt", V5P_16, CLUSTER), ("dry_run_tpu7x_2_slices.txt", TPU7X_2, TPU7X_CLUSTER)],
)
def test_dry_run_golden(golden: str, accelerator: str, cluster: str) -> None:
    """The whole dry run, byte for byte (UPDATE_GOLDEN=1 regenerates it)."""
    from runner.cli.submit import dry_run_text

    p = plan(accelerator, cluster)
    backend = GkeBackend(say=lambda s: None)
    assert p.cloud is not None
    rows = [("run", p.run_id), ("backend", f"{p.backend}  ({p.cloud.choice})"), *backend.describe(p)]
    text = dry_run_text(p, backend, rows) + "\n"
    path = GOLDEN / golden
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()


def test_the_v5p_16_jobset_is_one_slice_of_two_hosts_each_asking_its_whole_vm() -> None:
    js = requests.jobset(plan())
    (rjob,) = js["spec"]["replicatedJobs"]
    job = rjob["template"]["spec"]
    pod = job["template"]["spec"]
    assert (rjob["replicas"], job["parallelism"], job["completions"], job["completionMode"]) == (1, 2, 2, "Indexed")
    assert job["activeDeadlineSeconds"] == 86_400 and js["spec"]["failurePolicy"] == {"maxRestarts": 3}
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"] == "tpu-v5p-slice"
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "2x2x2"
    (container,) = pod["containers"]
    assert container["resources"]["limits"] == {"google.com/tpu": "4"}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "RUNNER_WORKER_ID" not in env  # computed in each pod, on every attempt, from its index
    assert "JOB_COMPLETION_INDEX" in container["command"][2] and env["RUNNER_NUM_WORKERS"] == "2"
    assert pod["tolerations"] == [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_the_tpu7x_jobset_has_a_replicated_job_per_slice_and_the_queue_label() -> None:
    p = plan(TPU7X_2, TPU7X_CLUSTER)
    js = requests.jobset(p)
    assert js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a-queue"
    (rjob,) = js["spec"]["replicatedJobs"]
    assert rjob["replicas"] == 2 and rjob["template"]["spec"]["parallelism"] == 2
    env = {e["name"]: e for e in rjob["template"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MEGASCALE_NUM_SLICES"]["value"] == "2" and "valueFrom" in env["MEGASCALE_SLICE_ID"]
    assert env["RUNNER_NUM_WORKERS"]["value"] == "4"
    assert isinstance(p.cloud, GkeTarget) and len(p.cloud.pool_names) == 2
    pool = requests.node_pool(p, p.cloud.pool_names[0], "us-central1-c")
    assert pool["placementPolicy"] == {"tpuTopology": "2x2x2", "policyName": "ironwood-2x2x2"}
    assert pool["config"]["spot"] is True and pool["config"]["machineType"] == "tpu7x-standard-4t"


CASES = {
    "v5p-16": (V5P_16, CLUSTER),
    "tpu7x x2": (TPU7X_2, TPU7X_CLUSTER),
    "v5e-8 flex-start": ("type: v5litepod-8, provisioning: queued, zones: [us-central1-a]", CLUSTER),
    "v6e-4 reserved": ("type: v6e-4, reserved: true, zones: [us-central1-b]", f"{CLUSTER}, reservation: trillium-r"),
    "existing pool": ("type: v5p-8", "context: prod, node_pool: v5p-pool, namespace: ml"),
}


@pytest.mark.parametrize("case", CASES)
def test_every_manifest_validates_against_its_schema_with_unknown_fields_refused(case: str) -> None:
    p = plan(*CASES[case])
    assert Schemas.load(crds=[JOBSET_CRD]).check(requests.jobset(p)) == []
    assert isinstance(p.cloud, GkeTarget) and CONTAINER is not None
    for name in p.cloud.pool_names:
        body = {"nodePool": requests.node_pool(p, name, p.cloud.zones[0])}
        path = f"/v1/{p.cloud.cluster_path}/nodePools"
        assert CONTAINER.check_request(CREATE_POOL, path, {}, body) == []


def test_a_misspelled_field_fails_the_check() -> None:
    js = requests.jobset(plan())
    schemas = Schemas.load(crds=[JOBSET_CRD])
    bad = copy.deepcopy(js)
    bad["spec"]["replicatedJob"] = bad["spec"].pop("replicatedJobs")  # a server of 1.20 would prune it silently
    assert (".spec.replicatedJob", "field not declared in schema") in schemas.check(bad)
    bad = copy.deepcopy(js)
    pod = bad["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["nodeSelecter"] = pod.pop("nodeSelector")
    where = ".spec.replicatedJobs[0].template.spec.template.spec.nodeSelecter"
    assert schemas.check(bad) == [(where, "field not declared in schema")]
    assert CONTAINER is not None
    body = {"nodePool": {**requests.node_pool(plan(), "p", "us-central1-a"), "topology": "2x2x2"}}
    found = CONTAINER.check_request(CREATE_POOL, "/v1/projects/p/locations/l/clusters/c/nodePools", {}, body)
    assert any('Unknown name "topology"' in text for _, text in found), found


def test_an_existing_pool_is_selected_by_name_and_never_created() -> None:
    p = plan("type: v5p-8", "context: prod, node_pool: v5p-pool, namespace: ml")
    assert isinstance(p.cloud, GkeTarget) and p.cloud.pool_names == () and p.cloud.cluster_ref == "context:prod"
    selector = requests.jobset(p)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["nodeSelector"]
    assert selector["cloud.google.com/gke-nodepool"] == "v5p-pool"
    rows = dict(GkeBackend(say=lambda s: None).describe(p))
    assert "bills while its nodes exist" in rows["idle cost"] and "$16.80/hour" in rows["idle cost"]
    assert "never created or deleted" in rows["node pool"]


def test_names_keep_the_run_ids_unique_end_within_gke_limits() -> None:
    jobset, pools = names("a-very-long-job-name-for-testing-xx-20261205-134224-3fba", 2)
    assert all(len(p) <= 40 for p in pools) and jobset.endswith("20261205-134224-3fba")
    assert pools == (f"{jobset}-0", f"{jobset}-1")


@pytest.mark.parametrize(
    ("accelerator", "cluster", "said"),
    [
        ("type: v4-8", CLUSTER, "TPU v4 has no TPU node pools on GKE"),
        ("type: tpu7x-16, zones: [us-central1-c]", CLUSTER, "needs a workload policy"),
        ("type: v5p-16, zones: [us-east5-a]", CLUSTER, "not in cluster tpu-cluster's location us-central1"),
        ("type: v5p-16", "context: prod", "give an existing `node_pool`"),
        ("type: v5p-16", "location: us-central1", "`location` and `name` together"),
        ("type: v5p-16, spot: true, provisioning: queued", CLUSTER, "flex-start"),
    ],
)
def test_plan_time_refusals_are_exit_2_with_the_reason(
    tmp_path: Path, accelerator: str, cluster: str, said: str
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(spec_text(accelerator, cluster))
    result = CliRunner().invoke(app, ["submit", str(path), "--dry-run"], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert said in " ".join(result.output.split()), result.output


def test_a_cluster_needs_backend_gke_and_gke_needs_a_cluster(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    text = spec_text(V5P_16, CLUSTER).replace(", backend: gke", "")
    path.write_text(text)
    result = CliRunner().invoke(app, ["validate", str(path)], catch_exceptions=False)
    assert result.exit_code == 2 and "`backend: gke` runs on a `cluster`" in result.output, result.output


def test_the_dry_run_needs_no_credentials_and_shows_the_jobset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CLOUDSDK_CONFIG", "/nonexistent")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent.json")
    path = tmp_path / "job.yaml"
    path.write_text(spec_text(V5P_16, CLUSTER))
    result = CliRunner().invoke(app, ["submit", str(path), "--dry-run"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "kind: JobSet" in result.output and '"tpuTopology": "2x2x2"' in result.output
