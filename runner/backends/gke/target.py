"""The gke backend's plan target: which cluster, namespace and queue a run's JobSet goes to, and on which TPU node
pool: an existing one (accelerator.cluster.node_pool, never created or deleted), or one the runner creates for the
run per slice and deletes when the run ends. A created pool's capacity follows from the spec:

    accelerator.spot                 Spot VMs (config.spot)
    accelerator.provisioning queued  flex-start (config.flexStart): capacity when GKE finds it
    accelerator.reserved             a reservation: cluster.reservation when named, else any matching one
    otherwise                        on demand

Deadlines the cluster keeps if the runner dies: every Job's activeDeadlineSeconds is max_runtime (the Job
controller ends its pods), and a created node pool's nodes carry maxRunDuration (max_runtime and a margin: GKE
takes them away); the node pool itself is left, empty, for `runner gc` to delete.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from runner import contract
from runner.backends.gke import catalog as slice_catalog
from runner.plan import catalog, compat
from runner.plan.target import Problems, Target, require_project, settle
from runner.spec import JobSpec

NAME = "gke"
# After max_runtime: a pod's grace, the supervisor's last uploads, and the node pool's own start, before GKE's
# maxRunDuration takes a created pool's nodes away.
RUN_DURATION_MARGIN_S = 15 * 60
MAX_POOL_NAME = 40  # GKE's node pool names
GRACE_S = 30  # the pods' terminationGracePeriodSeconds: what GKE gives a pod on a node's shutdown


@dataclass(frozen=True)
class GkeTarget(Target):
    cluster_location: str | None = None  # the GKE cluster (None: only a kubeconfig context)
    cluster_name: str | None = None
    context: str | None = None
    namespace: str = "default"
    queue: str | None = None
    node_pool: str | None = None  # an existing pool; None: the runner creates `pool_names`
    pool_names: tuple[str, ...] = ()  # one per slice
    jobset: str = ""
    gke_accelerator: str = ""
    machine_type: str = ""
    topology: str = ""
    chips_per_vm: int = 0
    spot: bool = False
    flex_start: bool = False
    reserved: bool = False
    reservation: str | None = None
    workload_policy: str | None = None
    active_deadline_s: int = 0
    max_run_duration_s: int = 0
    max_restarts: int = 0

    @property
    def creates_pool(self) -> bool:
        return self.node_pool is None

    @property
    def cluster_path(self) -> str | None:
        if self.cluster_location is None or self.cluster_name is None:
            return None
        return f"projects/{self.project}/locations/{self.cluster_location}/clusters/{self.cluster_name}"

    @property
    def cluster_ref(self) -> str:
        """The cluster in words and as `runner gc` lists it: its GKE path, else context:NAME."""
        return self.cluster_path or f"context:{self.context}"

    def job_env(self, spec: JobSpec) -> dict[str, str]:
        """TensorFlow's cluster resolver names the TPU of the VM it runs on (one host); JAX finds its slice from
        what GKE's TPU webhook sets (TPU_WORKER_ID, TPU_WORKER_HOSTNAMES): nothing to add for it."""
        return {contract.TPU_NAME: contract.THIS_TPU} if not self.accelerator.multi_host and self.slices == 1 else {}

    def within(self, max_runtime_s: int) -> GkeTarget:
        return replace(self, active_deadline_s=max_runtime_s, max_run_duration_s=max_runtime_s + RUN_DURATION_MARGIN_S)


def names(run_id: str, slices: int) -> tuple[str, tuple[str, ...]]:
    """The JobSet's name and the node pools' (one per slice): the run id, its unique end kept when it is cut to
    GKE's 40 characters of a node pool name (a run id ends with its UTC time and 4 hex digits)."""
    tail = "-".join(run_id.rsplit("-", 3)[-3:])  # 20261205-123456-abcd
    room = MAX_POOL_NAME - len(tail) - 3  # "-<slice>" and the '-' before the tail
    head = run_id[: len(run_id) - len(tail) - 1]
    base = f"{head[:room].rstrip('-')}-{tail}" if len(run_id) > MAX_POOL_NAME - 2 else run_id
    return base, tuple(f"{base}-{i}" for i in range(slices))


def findings(spec: JobSpec) -> tuple[catalog.AcceleratorType | None, list[compat.Finding]]:
    """Every finding about where `spec` would run on GKE (`runner validate` shows them offline)."""
    acc = spec.accelerator
    accel, found = compat.common(spec, NAME)
    if accel is None:
        return None, found
    try:
        offer = slice_catalog.offer(acc.type)
    except slice_catalog.NotOffered as exc:
        return accel, [*found, compat.Finding(True, exc.message, exc.hint)]
    cluster = acc.cluster
    if acc.node:
        found.append(compat.Finding(True, "accelerator.node attaches to a Cloud TPU node: use the tpu-vm backend"))
    if spec.training is not None and spec.training.framework == "tensorflow" and (accel.multi_host or acc.slices > 1):
        found.append(
            compat.Finding(
                True,
                "training.framework tensorflow on a multi-host GKE slice: TensorFlow drives a pod slice from one "
                "host through the TPU runtime, which a JobSet of one pod per host does not set up",
                "set training.framework: jax, run a `command`, or use a single-host type",
            )
        )
    if spec.secrets:
        found.append(
            compat.Finding(
                True,
                "secrets on gke: the job's pods cannot read Secret Manager through the runner yet",
                "mount a Kubernetes Secret in your own image's entrypoint, or use the tpu-vm backend",
            )
        )
    if cluster is not None and cluster.creates_pool:
        if acc.spot and acc.provisioning == "queued":
            found.append(
                compat.Finding(True, "provisioning queued is GKE's flex-start, a capacity of its own: not Spot")
            )
        if cluster.reservation and not acc.reserved:
            found.append(compat.Finding(True, "cluster.reservation needs accelerator.reserved: true"))
        if offer.workload_policy and accel.multi_host and not cluster.workload_policy:
            found.append(
                compat.Finding(
                    True,
                    f"a multi-host {accel.generation.title} node pool needs a workload policy (GKE's rule)",
                    f"create one: `gcloud compute resource-policies create workload-policy NAME "
                    f"--type=HIGH_THROUGHPUT --accelerator-topology={offer.topology} --region=REGION`, and name "
                    "it in accelerator.cluster.workload_policy",
                )
            )
    elif cluster is not None and (acc.spot or acc.reserved or acc.provisioning == "queued"):
        found.append(
            compat.Finding(
                False,
                f"node pool {cluster.node_pool} exists: its own capacity applies, not accelerator.spot, reserved or "
                "provisioning",
            )
        )
    return accel, found


def pool_zones(spec: JobSpec, accel: catalog.AcceleratorType, location: str | None) -> tuple[str, ...]:
    """The zones a created node pool is tried in, in order: the spec's; else, for a zonal cluster, its zone; for a
    regional one, the zones of its region where the catalog offers the type."""
    if spec.accelerator.candidate_zones:
        return tuple(spec.accelerator.candidate_zones)
    if location is None:
        return ()
    if location.count("-") == 2:
        return (location,)
    return tuple(z for z in accel.zones if z.rsplit("-", 1)[0] == location)


def resolve(
    spec: JobSpec,
    run_id: str,
    *,
    project: str | None,
    zone: str | None,
    environ: dict[str, str] | None = None,
    problems: Problems | None = None,
) -> GkeTarget:
    """Pre-flight for a GKE run: everything that can be checked without the network or credentials."""
    from runner.errors import PlanError
    from runner.plan import gcloud

    acc = spec.accelerator
    cluster = acc.cluster
    if cluster is None:  # the spec's own validator holds backend gke to a cluster
        raise PlanError("accelerator.backend gke needs accelerator.cluster")
    found_type, found = findings(spec)
    accel, warnings = settle(found, found_type, problems)
    offer = slice_catalog.offer(accel.name)
    project = acc.project or project or gcloud.default_project(environ)
    if cluster.location is not None:
        project = require_project(project, problems)
    zones: tuple[str, ...] = ()
    if cluster.creates_pool:
        location = cluster.location
        zones = pool_zones(spec, accel, location) or ((zone,) if zone else ())
        outside = [z for z in zones if location and not z.startswith(location)]
        if not zones or outside:
            error = PlanError(
                f"no zone of cluster {cluster.name}'s location {location} for its node pool"
                if not zones
                else f"zone(s) {', '.join(outside)} are not in cluster {cluster.name}'s location {location}",
                hint=f"{accel.name} is offered in {', '.join(accel.zones)}; set accelerator.zone(s) to zones of "
                f"{location}",
            )
            if problems is None:
                raise error
            problems.append(error)
            zones = zones or (f"{location}-a",)
    jobset, pools = names(run_id, acc.slices)
    retries = spec.retries
    return GkeTarget(
        backend=NAME,
        project=project or "",
        zones=zones,
        accelerator=accel,
        machine_id=jobset,
        trainer_workers="all",
        price_per_hour=accel.price_per_hour(spot=acc.spot),
        slices=acc.slices,
        warnings=tuple(warnings),
        cluster_location=cluster.location,
        cluster_name=cluster.name,
        context=cluster.context,
        namespace=cluster.namespace,
        queue=cluster.queue,
        node_pool=cluster.node_pool,
        pool_names=pools if cluster.creates_pool else (),
        jobset=jobset,
        gke_accelerator=offer.gke_accelerator,
        machine_type=offer.machine_type,
        topology=offer.topology,
        chips_per_vm=offer.chips_per_vm,
        spot=acc.spot and cluster.creates_pool,
        flex_start=acc.provisioning == "queued" and cluster.creates_pool,
        reserved=acc.reserved and cluster.creates_pool,
        reservation=cluster.reservation,
        workload_policy=cluster.workload_policy if offer.workload_policy and accel.multi_host else None,
        active_deadline_s=spec.teardown.max_runtime,
        max_run_duration_s=spec.teardown.max_runtime + RUN_DURATION_MARGIN_S,
        # A JobSet restarts on any failed Job: it cannot tell a node taken away from the job's own failure (no
        # failurePolicy.rules here), so its budget is both of the runner's, which counts them apart.
        max_restarts=retries.preemptions + retries.failures,
    )
