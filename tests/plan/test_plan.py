"""Pre-flight for TPU VM runs (no network, no credentials), the Node request, and the dry-run golden output."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from runner.backends import plan_cloud
from runner.backends.tpu_vm.backend import TpuVmBackend
from runner.backends.tpu_vm.requests import node_request
from runner.errors import PlanError
from runner.plan import catalog
from runner.spec import JobSpec
from runner.spec.loader import load_spec, load_spec_text
from tests.conftest import REPO

GOLDEN = Path(__file__).parent / "golden" / "dry_run_mnist.txt"
IMAGE = "us-central1-docker.pkg.dev/my-project/tpu-runner/trainer:v1"
NO_GCLOUD = {"CLOUDSDK_CONFIG": "/nonexistent"}


def spec(**overrides: object) -> JobSpec:
    base: dict[str, object] = {
        "name": "job",
        "image": IMAGE,
        "training": {"epochs": 1},
        "storage": "gs://my-bucket/p",
        "accelerator": {"type": "v5litepod-8", "zone": "us-west4-a", "project": "my-project"},
    }
    for key, value in overrides.items():
        if key.startswith("acc_"):
            base["accelerator"] = {**base["accelerator"], key[4:]: value}  # type: ignore[dict-item]
        else:
            base[key] = value
    return JobSpec.model_validate(base)


def plan(s: JobSpec, **kwargs: object):  # type: ignore[no-untyped-def]
    return plan_cloud(s, None, environ=NO_GCLOUD, **kwargs)  # type: ignore[arg-type]


def test_catalog_is_consistent() -> None:
    for t in catalog.all_types():
        assert t.chips >= 1 and t.hosts >= 1 and t.zones and t.generation.backends
        assert t.jax_devices in (t.chips, t.tensorcores)
        if t.generation.in_tpu_api:  # the Cloud TPU API's runtimes (Compute Engine boots an image instead)
            assert t.runtime_ok(t.generation.default_runtime), t.name
        if t.generation.priced:
            assert t.price_per_hour(spot=True) < t.price_per_hour(spot=False)
        else:
            assert t.price_per_hour(spot=False) == 0.0
    assert (catalog.accelerator("v2-8").chips, catalog.accelerator("v2-8").hosts) == (4, 1)
    assert (catalog.accelerator("v4-32").chips, catalog.accelerator("v4-32").hosts) == (16, 4)
    assert (catalog.accelerator("v5litepod-8").chips, catalog.accelerator("v5litepod-8").hosts) == (8, 1)
    assert (catalog.accelerator("v5litepod-16").chips, catalog.accelerator("v5litepod-16").hosts) == (16, 4)
    assert catalog.prices_info()["read_on"]


@pytest.mark.parametrize(
    ("overrides", "message", "hint"),
    [
        ({"acc_type": "v5litepod-9"}, "v5litepod comes in sizes", None),
        ({"acc_type": "v2-8", "acc_zone": "us-west4-a"}, "v2-8 is not offered in us-west4-a", "us-central1-b"),
        ({"acc_runtime_version": "tpu-vm-tf-2.18.0-pod-pjrt-v5e-and-v6"}, "not run on v5litepod-8", "without -pod"),
        ({"acc_runtime_version": "v2-alpha-tpuv6e"}, "does not run on v5litepod-8", None),
        ({"storage": "runs"}, "a TPU VM can only write its run directory to Cloud Storage", "gs://"),
        ({"image": "trainer:latest"}, "names no registry", "Artifact Registry"),
        ({"image": "us-docker.pkg.dev/proj-1/trainer"}, "is REGION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE", None),
        ({"acc_type": "v6e-8", "acc_zone": "us-east1-d"}, "framework tensorflow on v6e", "framework: jax"),
        ({"acc_type": "v4-32", "acc_zone": "us-central2-b"}, "TensorFlow needs a tpu-vm-tf-X.Y.Z-pod-pjrt", None),
    ],
)
def test_preflight_errors(overrides: dict, message: str, hint: str | None) -> None:
    with pytest.raises(PlanError) as info:
        plan(spec(**overrides))
    assert message in str(info.value)
    assert info.value.exit_code == 2
    if hint:
        assert hint in (info.value.hint or "")


def test_missing_project_and_zone_are_clear() -> None:
    s = JobSpec.model_validate({"name": "j", "image": IMAGE, "training": {}, "storage": "gs://my-bucket"})
    with pytest.raises(PlanError, match="no Google Cloud project"):
        plan(s)
    with pytest.raises(PlanError, match="no zone") as info:
        plan(s, project="my-project")
    assert "us-central1-a" in (info.value.hint or "")


def test_project_and_zone_from_gcloud_config(tmp_path: Path) -> None:
    (tmp_path / "configurations").mkdir()
    (tmp_path / "active_config").write_text("work\n")
    config = "[core]\nproject = from-gcloud\n[compute]\nzone = us-west1-c\n"
    (tmp_path / "configurations" / "config_work").write_text(config)
    shared = "us-central1-docker.pkg.dev/shared-images/tpu-runner/trainer:v1"  # another project's registry will do
    s = JobSpec.model_validate({"name": "j", "image": shared, "training": {}, "storage": "gs://my-bucket"})
    p = plan_cloud(s, None, environ={"CLOUDSDK_CONFIG": str(tmp_path)})
    assert p.cloud is not None and (p.cloud.project, p.cloud.zones) == ("from-gcloud", ("us-west1-c",))
    env_first = plan_cloud(s, None, environ={"CLOUDSDK_CONFIG": str(tmp_path), "CLOUDSDK_CORE_PROJECT": "from-env"})
    assert env_first.cloud is not None and env_first.cloud.project == "from-env"


def test_zones_keep_their_order_and_spot_price() -> None:
    p = plan(spec(acc_zone=None, acc_zones=["us-west4-a", "us-central1-a"], acc_spot=True))
    assert p.cloud is not None and p.cloud.zones == ("us-west4-a", "us-central1-a")
    assert p.cloud.price_per_hour == pytest.approx(catalog.accelerator("v5litepod-8").price_per_hour(spot=True))


def test_multi_host_tensorflow_runs_on_worker_zero_of_a_pod_runtime() -> None:
    pod_runtime = "tpu-vm-tf-2.17.0-pod-pjrt"
    p = plan(spec(acc_type="v4-32", acc_zone="us-central2-b", acc_runtime_version=pod_runtime))
    assert p.cloud is not None and p.cloud.trainer_workers == "0" and p.num_workers == 1
    assert p.env["RUNNER_TPU_NAME"] == p.cloud.machine_id  # the resolver is given the node name on a pod
    assert p.env["TPU_LOAD_LIBRARY"] == "0"  # worker 0 drives the slice through the TPU runtime
    custom = plan(spec(acc_type="v4-32", acc_zone="us-central2-b", training=None, command=["python", "x.py"]))
    assert custom.cloud is not None and custom.cloud.trainer_workers == "all" and custom.num_workers == 4
    assert "TPU_LOAD_LIBRARY" not in custom.env


def test_a_backends_target_adds_its_own_job_environment() -> None:
    """The planner sets the contract every backend shares; a TPU VM's own variables come from the VM backends'
    targets (Target.job_env), and a target of another kind adds its own instead of them, the rest unchanged."""
    from dataclasses import dataclass, fields

    from runner.backends.compute_engine import resolve as compute_resolve
    from runner.backends.tpu_vm import resolve as tpu_resolve
    from runner.plan.planner import plan_cloud as planned
    from runner.plan.target import Target

    @dataclass(frozen=True)
    class ClusterTarget(Target):
        def job_env(self, spec: JobSpec) -> dict[str, str]:
            return {"CLUSTER_JOB": spec.name}

    def cluster_resolve(*args: Any, **kwargs: Any) -> ClusterTarget:
        vm = tpu_resolve(*args, **kwargs)
        return ClusterTarget(**{f.name: getattr(vm, f.name) for f in fields(Target)})

    pod = spec(acc_type="v4-32", acc_zone="us-central2-b", acc_runtime_version="tpu-vm-tf-2.17.0-pod-pjrt")
    pinned: dict[str, Any] = {"environ": NO_GCLOUD, "now": 1_800_000_000.0, "run_suffix": "abcd"}
    vm = planned(pod, None, resolve=tpu_resolve, **pinned)
    assert (vm.env["RUNNER_TPU_NAME"], vm.env["TPU_LOAD_LIBRARY"]) == (vm.run_id, "0")
    other = planned(pod, None, resolve=cluster_resolve, **pinned)
    tpu_vm_only = {"RUNNER_TPU_NAME", "TPU_LOAD_LIBRARY"}
    assert other.env == {**{k: v for k, v in vm.env.items() if k not in tpu_vm_only}, "CLUSTER_JOB": "job"}
    one_host = spec(acc_type="v6e-8", acc_zone="us-east1-d", training=None, command=["python", "x.py"])
    compute = planned(one_host, None, resolve=compute_resolve, **pinned)
    assert compute.env["RUNNER_TPU_NAME"] == "local" and "TPU_LOAD_LIBRARY" not in compute.env


def test_provisioning_auto_queues_multi_host_slices_and_bounds_the_wait() -> None:
    single = plan(spec())
    assert single.cloud is not None and single.cloud.provisioning == "node"
    pod = plan(spec(acc_type="v4-32", acc_zone="us-central2-b", training=None, command=["python", "x.py"]))
    assert pod.cloud is not None and pod.cloud.provisioning == "queued"
    assert pod.cloud.max_wait_s == pod.spec.teardown.max_runtime  # never waits past the run's own deadline
    queued = plan(spec(acc_provisioning="queued", acc_max_wait="2h", teardown={"max_runtime": "1h"}))
    assert queued.cloud is not None and queued.cloud.provisioning == "queued" and queued.cloud.max_wait_s == 3600
    forced = plan(
        spec(acc_type="v4-32", acc_zone="us-central2-b", acc_provisioning="node", command=["x"], training=None)
    )
    assert forced.cloud is not None and forced.cloud.provisioning == "node"
    attached = plan(spec(acc_node="my-existing-vm"))
    assert attached.cloud is not None and attached.cloud.provisioning == "node"


def test_queued_resource_request_body() -> None:
    from google.cloud import tpu_v2

    from runner.backends.tpu_vm.requests import queued_request

    p = plan(spec(acc_provisioning="queued", acc_spot=True, acc_max_wait="30m"))
    body = queued_request(p, "us-west4-a", p.run_id)
    assert body["spot"] == {} and "guaranteed" not in body
    assert body["queueingPolicy"] == {"validUntilDuration": "1800s"}
    (node_spec,) = body["tpu"]["nodeSpec"]
    assert node_spec["parent"] == "projects/my-project/locations/us-west4-a" and node_spec["nodeId"] == p.run_id
    assert node_spec["node"]["labels"]["tpu-runner-nonce"] == p.nonce  # the same Node a direct create sends
    assert node_spec["node"]["schedulingConfig"] == {}  # the tier is the queued resource's: `spot: {}`
    qr = tpu_v2.QueuedResource.from_json(json.dumps(body))  # what the client sends, without loss
    assert "spot" in qr and qr.queueing_policy.valid_until_duration.seconds == 1800
    on_demand = queued_request(plan(spec(acc_provisioning="queued")), "us-west4-a", "x")
    assert on_demand["guaranteed"] == {} and "spot" not in on_demand
    reserved = queued_request(plan(spec(acc_provisioning="queued", acc_reserved=True)), "us-west4-a", "x")
    assert "guaranteed" not in reserved and reserved["tpu"]["nodeSpec"][0]["node"]["schedulingConfig"] == {
        "reserved": True
    }


def test_multislice_is_one_queued_resource_with_global_worker_ids() -> None:
    from google.cloud import tpu_v2

    from runner.backends.tpu_vm.requests import queued_request

    command = {"training": None, "command": ["python", "x.py"], "acc_zone": "us-central2-b"}
    p = plan(spec(acc_type="v4-16", acc_slices=3, **command))  # provisioning auto: queued
    assert p.cloud is not None and p.cloud.provisioning == "queued" and p.cloud.slices == 3
    assert p.num_workers == 6 and p.env["RUNNER_NUM_WORKERS"] == "6"  # 2 hosts x 3 slices, ids global
    assert "RUNNER_TPU_NAME" not in p.env  # each slice's VMs name their own node
    assert p.cloud.price_per_hour == pytest.approx(3 * catalog.accelerator("v4-16").price_per_hour(spot=False))
    (node_spec,) = queued_request(p, "us-central2-b", p.run_id)["tpu"]["nodeSpec"]
    assert node_spec["multisliceParams"] == {"nodeCount": 3, "nodeIdPrefix": p.run_id} and "nodeId" not in node_spec
    qr = tpu_v2.QueuedResource.from_json(json.dumps({"tpu": {"nodeSpec": [node_spec]}}))
    assert qr.tpu.node_spec[0].multislice_params.node_count == 3
    # The prefix leaves room for "-<slice>" in a node id's 63 characters.
    long_id = "a" * 62
    (long_spec,) = queued_request(p, "us-central2-b", long_id)["tpu"]["nodeSpec"]
    assert len(long_spec["multisliceParams"]["nodeIdPrefix"] + "-2") <= 63


def test_multislice_needs_tpu_v4_or_later() -> None:
    with pytest.raises(PlanError, match="Multislice needs TPU v4 or later"):
        plan(spec(acc_type="v3-32", acc_zone="europe-west4-a", acc_slices=2, training=None, command=["x"]))


def test_node_request_body() -> None:
    p = plan(spec(acc_spot=True, acc_service_account="tpu-vm@my-project.iam.gserviceaccount.com"))
    body = node_request(p, "us-west4-a")
    assert body["acceleratorType"] == "v5litepod-8"
    assert body["runtimeVersion"] == "v2-alpha-tpuv5-lite"
    assert body["schedulingConfig"] == {"spot": True}
    assert body["labels"]["managed-by"] == "tpu-runner" and body["labels"]["tpu-runner-run"] == p.run_id
    assert int(body["labels"]["tpu-runner-deadline"]) == int(p.deadline)
    assert body["serviceAccount"]["email"] == "tpu-vm@my-project.iam.gserviceaccount.com"
    assert "https://www.googleapis.com/auth/cloud-platform" in body["serviceAccount"]["scope"]
    assert "ZONE=us-west4-a" in body["metadata"]["startup-script"]
    # The body is exactly what the client sends: it converts into the SDK's Node without loss.
    from google.cloud import tpu_v2

    node = tpu_v2.Node.from_json(json.dumps(body))
    assert node.scheduling_config.spot and node.accelerator_type == "v5litepod-8"


def test_attach_mode_creates_nothing() -> None:
    p = plan(spec(acc_node="my-existing-vm"))
    assert p.attach and p.cloud is not None and p.cloud.machine_id == "my-existing-vm"
    rows = dict(TpuVmBackend(api=object()).describe(p))  # type: ignore[arg-type]
    assert "never delete" in rows["node"] and "est. cost" not in rows


@pytest.mark.parametrize(
    ("golden", "overrides"),
    [
        ("dry_run_mnist.txt", {}),
        # A v4-32 is queued by default (provisioning: auto): the exact QueuedResource request is shown.
        ("dry_run_pod_queued.txt", {"type": "v4-32", "zones": ["us-central2-b"], "spot": True, "max_wait": "2h"}),
        # Two v4-16 slices: one queued resource with multisliceParams instead of a nodeId.
        ("dry_run_multislice.txt", {"type": "v4-16", "zones": ["us-central2-b"], "slices": 2}),
    ],
)
def test_dry_run_golden(golden: str, overrides: dict[str, object], mnist_npz: Path) -> None:
    """The whole dry run, byte for byte (UPDATE_GOLDEN=1 pytest tests/plan regenerates it). With this machine's MNIST
    cache (mnist_npz), which a TPU VM run copies beside its run directory (RUNNER_DATA_URL)."""
    import os

    from runner.cli.submit import dry_run_text

    s = load_spec(REPO / "jobs" / "mnist.yaml")
    if overrides:  # a custom command: it runs on every worker of the slice
        accelerator = {**s.accelerator.model_dump(exclude_none=True, exclude={"zones"}), **overrides}
        s = s.model_copy(update={"training": None, "command": ["python", "train.py"]})
        s = JobSpec.model_validate({**s.model_dump(exclude_none=True), "accelerator": accelerator})
    p = plan_cloud(
        s,
        "jobs/mnist.yaml",
        storage="gs://my-bucket/tpu-runner",
        project="my-project",
        environ=NO_GCLOUD,
        now=1798761600.0,
        run_suffix="abcd",
        nonce="5eed5eed",
    )
    backend = TpuVmBackend(api=object())  # type: ignore[arg-type]  # a dry run never touches the API
    assert p.cloud is not None
    rows = [("run", p.run_id), ("backend", f"{p.backend}  ({p.cloud.choice})"), *backend.describe(p)]
    rows.append(("run directory", p.run_dir))
    text = dry_run_text(p, backend, rows) + "\n"
    path = GOLDEN.parent / golden
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()


def test_dry_run_cli_needs_no_credentials_or_network(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from runner.cli import app

    monkeypatch.setenv("CLOUDSDK_CONFIG", "/nonexistent")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent.json")
    result = CliRunner().invoke(
        app,
        [
            "submit",
            str(REPO / "jobs" / "mnist.yaml"),
            "--dry-run",
            "--project",
            "my-project",
            "--storage",
            "gs://my-bucket/x",
        ],
    )
    assert result.exit_code == 0, result.output
    assert '"acceleratorType": "v5litepod-8"' in result.output and "est. cost" in result.output
    bad = CliRunner().invoke(app, ["submit", str(REPO / "jobs" / "mnist.yaml"), "--dry-run", "--project", "p-123456"])
    assert bad.exit_code == 2 and "Cloud Storage" in bad.output


def test_spec_text_for_cloud_is_validated_before_planning() -> None:
    s = load_spec_text(
        textwrap.dedent(f"""\
        name: cmd
        image: {IMAGE}
        command: echo hi
        storage: gs://my-bucket/p
        accelerator: {{type: v2-8, zone: us-central1-b, project: my-project}}
        """)
    )
    p = plan(s)
    assert p.env["RUNNER_COMMAND"] == json.dumps(["/bin/sh", "-c", "echo hi"])


def test_dry_run_of_the_shipped_job_shows_the_whole_plan_then_every_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    """No project, local storage, the example's image: the plan and the request are shown with placeholders, and
    every problem is listed at the end (exit 2); a real submit names all of them at once too, and creates nothing."""
    from typer.testing import CliRunner

    from runner.cli import app

    monkeypatch.setenv("CLOUDSDK_CONFIG", "/nonexistent")
    monkeypatch.delenv("CLOUDSDK_CORE_PROJECT", raising=False)
    job = str(REPO / "jobs" / "mnist.yaml")
    result = CliRunner().invoke(app, ["submit", job, "--dry-run"])
    assert result.exit_code == 2, result.output
    out = result.output
    assert "POST /v2/projects/PROJECT/locations/us-central1-a/nodes?nodeId=mnist-" in out
    assert "RUN_DIR=gs://BUCKET/tpu-runner/runs/mnist-" in out and "startup-script" in out
    listed = out[out.index("Pre-flight problems (3)") :]
    assert "1. storage '.' is a local path" in listed
    assert "2. no Google Cloud project" in listed
    assert "3. image 'us-central1-docker.pkg.dev/my-project/" in listed and "make push VARIANT=tpu" in listed
    assert "the dry run found 3 pre-flight problems" in out
    fixed = [
        "--project",
        "acme-ml",
        "--storage",
        "gs://acme-runs/x",
        "--set",
        f"image={IMAGE.replace('my-project', 'acme-ml')}",
    ]
    assert CliRunner().invoke(app, ["submit", job, "--dry-run", *fixed]).exit_code == 0
    real = CliRunner().invoke(app, ["submit", job])
    assert real.exit_code == 2 and "3 pre-flight problems:" in real.output and "no Google Cloud project" in real.output
