"""The compute-engine backend's plan target: where and how a run's TPU VM (an instance) or multi-host slice (a managed
instance group with a workload policy) is created, checked against its catalog slice (catalog.yaml) before any API
call. The scheduling follows from the spec:

    accelerator.spot                 SPOT (automaticRestart false; a preempted VM is STOPped: its state says so)
    accelerator.reserved             RESERVATION_BOUND on accelerator.reservation when the spec names one, else
                                     STANDARD consuming any matching reservation (ANY_RESERVATION)
    accelerator.provisioning queued  FLEX_START: waits for capacity up to max_wait in each zone (a slice through a
                                     resize request), then runs at most its run duration
    otherwise                        STANDARD

Every VM carries a maxRunDuration: the run's max_runtime plus RUN_DURATION_MARGIN_S, so that Compute Engine ends a
VM that every other layer (the job, the bootstrap's watchdog, the runner, `runner gc`) failed to end.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from runner.backends.compute_engine import catalog as slice_catalog
from runner.backends.tpu_env import tpu_vm_env
from runner.plan import catalog, compat
from runner.plan.target import Problems, Target, location, require_project, require_zones, settle
from runner.spec import JobSpec

NAME = "compute-engine"
# Boot, the bootstrap's watchdog (5 minutes past the deadline) and its last uploads, beyond max_runtime.
RUN_DURATION_MARGIN_S = 15 * 60
FLEX_START_MIN_S, FLEX_START_MAX_S = 600, 7 * 86_400  # a resize request's run duration: 10 minutes to 7 days


@dataclass(frozen=True)
class ComputeTarget(Target):
    machine_type: str = ""
    topology: str | None = None  # a multi-host slice's acceleratorTopology; None: one instance
    provisioning_model: str = "STANDARD"  # STANDARD | SPOT | FLEX_START | RESERVATION_BOUND
    termination_action: str = "DELETE"  # what Compute Engine does at maxRunDuration (and to a preempted Spot VM)
    max_run_duration_s: int = 0
    reservation: str | None = None  # RESERVATION_BOUND: the reservation's name; None with reserved: ANY_RESERVATION
    reserved: bool = False
    max_wait_s: int = 0  # FLEX_START: how long it may wait for capacity in each zone
    image: str = ""
    disk_type: str = ""
    disk_size_gb: int = 100

    @property
    def self_delete(self) -> str:
        """What the VM's bootstrap deletes when the job ends (its SELF_DELETE value)."""
        return "compute-group" if self.topology else "compute-instance"

    def job_env(self, spec: JobSpec) -> dict[str, str]:
        return tpu_vm_env(self)

    def within(self, max_runtime_s: int) -> ComputeTarget:
        """The VM's own run duration and a flex-start wait never outlast the run's deadline (the budget's included)."""
        duration = max_runtime_s + RUN_DURATION_MARGIN_S
        if self.provisioning_model == "FLEX_START":
            duration = min(max(duration, FLEX_START_MIN_S), FLEX_START_MAX_S)
        return replace(self, max_run_duration_s=duration, max_wait_s=min(self.max_wait_s, max_runtime_s))


def findings(
    spec: JobSpec, zones: tuple[str, ...] | None = None
) -> tuple[catalog.AcceleratorType | None, list[compat.Finding]]:
    """Every finding about where `spec` would run on Compute Engine (`runner validate` shows them offline)."""
    acc = spec.accelerator
    try:
        offer = slice_catalog.offer(acc.type)
    except slice_catalog.NotOffered as exc:
        return None, [compat.Finding(True, exc.message, exc.hint)]
    accel, found = offer.accelerator, []
    where = zones if zones is not None else tuple(acc.candidate_zones)
    missing = [z for z in where if z not in offer.zones]
    if missing and len(missing) == len(where):
        found.append(
            compat.Finding(
                True,
                f"{accel.name} ({offer.machine_type}) is not offered on Compute Engine in {', '.join(missing)}",
                f"it is offered in {', '.join(offer.zones)}",
            )
        )
    elif missing:
        found.append(compat.Finding(False, f"{accel.name} is not offered in {', '.join(missing)}: skipped"))
    if spec.training is not None:
        refused = accel.generation.frameworks.get(spec.training.framework, "the catalog does not list it")
        if refused:
            found.append(
                compat.Finding(
                    True,
                    f"training.framework {spec.training.framework} on {accel.generation.title}: {refused}",
                    "set training.framework: jax, or run a `command`",
                )
            )
    if acc.node:
        found.append(compat.Finding(True, "accelerator.node attaches to a Cloud TPU node: use the tpu-vm backend"))
    if acc.slices > 1:
        found.append(
            compat.Finding(True, "accelerator.slices: multislice is the Cloud TPU API's (queued resources) only")
        )
    if acc.provisioning == "queued" and (acc.spot or acc.reserved):
        found.append(
            compat.Finding(
                True,
                "provisioning queued is Compute Engine's flex-start, a provisioning model of its own: not Spot or "
                "reserved",
                "drop accelerator.spot / reserved, or provisioning: queued",
            )
        )
    if not slice_catalog.price_known(accel.generation.name):
        if spec.budget is not None:
            found.append(
                compat.Finding(
                    True,
                    f"budget: no list price of {accel.generation.title} is known (unconfirmed), so a budget cannot "
                    "be checked",
                    "drop `budget` and bound the run with teardown.max_runtime",
                )
            )
        else:
            found.append(
                compat.Finding(False, f"no list price of {accel.generation.title} is known: the cost is not estimated")
            )
    if unconfirmed := slice_catalog.boot().unconfirmed:
        found.append(
            compat.Finding(
                False,
                f"the {' and '.join(unconfirmed)} of a Compute Engine TPU VM are the catalog's (unconfirmed)",
                "set $RUNNER_COMPUTE_IMAGE / $RUNNER_COMPUTE_DISK_TYPE to the ones your project uses",
            )
        )
    return accel, found


def scheduling_of(spec: JobSpec) -> tuple[str, str, str | None]:
    """(provisioning model, termination action, reservation name) for the spec."""
    acc = spec.accelerator
    reservation: str | None = getattr(acc, "reservation", None)  # a spec field the tpu-vm backend has no use for
    if acc.provisioning == "queued":
        return "FLEX_START", "DELETE", None
    if acc.spot:
        # DELETE: a Spot VM at its maxRunDuration (or preempted) leaves nothing billing, its boot disk included; a
        # preemption is still told, by its compute.instances.preempted operation while it stops, then as GONE.
        return "SPOT", "DELETE", None
    if acc.reserved and reservation:
        return "RESERVATION_BOUND", "DELETE", reservation
    return "STANDARD", "DELETE", None


def resolve(
    spec: JobSpec,
    run_id: str,
    *,
    project: str | None,
    zone: str | None,
    environ: dict[str, str] | None = None,
    problems: Problems | None = None,
) -> ComputeTarget:
    """Pre-flight for a Compute Engine run: everything that can be checked without the network or credentials."""
    acc = spec.accelerator
    project, zones = location(spec, project=project, zone=zone, environ=environ)
    found_type, found = findings(spec, zones or None)
    accel, warnings = settle(found, found_type, problems)
    offer = slice_catalog.offer(accel.name)
    project = require_project(project, problems)
    zones = require_zones(zones, offer.zones, accel.name, "Compute Engine TPU VM", problems)
    model, action, reservation = scheduling_of(spec)
    boot = slice_catalog.boot(environ)
    max_runtime = spec.teardown.max_runtime
    return ComputeTarget(
        backend=NAME,
        project=project,
        zones=zones,
        accelerator=accel,
        machine_id=run_id,
        trainer_workers="all",  # JAX and commands run on every worker (TensorFlow is refused where it cannot)
        price_per_hour=accel.price_per_hour(spot=acc.spot),
        warnings=tuple(warnings),
        machine_type=offer.machine_type,
        topology=offer.topology,
        provisioning_model=model,
        termination_action=action,
        max_run_duration_s=max_runtime + RUN_DURATION_MARGIN_S,
        reservation=reservation,
        reserved=acc.reserved,
        max_wait_s=min(acc.max_wait or max_runtime, max_runtime),
        image=boot.image,
        disk_type=boot.disk_type,
        disk_size_gb=boot.disk_size_gb,
    )
