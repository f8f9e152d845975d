"""The TPU VM backend's catalog slice and plan target: what the Cloud TPU API serves (runner/plan/tpu_catalog.yaml:
types, zones, runtime versions), checked before any API call (runner.plan.compat), and what a TPU VM run needs
beyond every backend's target: the runtime version, node or queued resource, the queue's wait, an attached node."""

from __future__ import annotations

from dataclasses import dataclass, replace

from runner.backends.tpu_env import tpu_vm_env
from runner.plan import catalog, compat
from runner.plan.target import Problems, Target, location, require_project, require_zones, settle
from runner.spec import JobSpec

NAME = "tpu-vm"


@dataclass(frozen=True)
class TpuVmTarget(Target):
    runtime_version: str = ""
    provisioning: str = "node"  # "node": create the node; "queued": a queued resource that waits for capacity
    max_wait_s: int = 0  # queued: how long it may wait in each zone (its validUntilDuration)
    attach_node: str | None = None  # an existing node: attach, never create or delete

    @property
    def self_delete(self) -> str:
        """What the VM's bootstrap deletes when its job is over (its SELF_DELETE value): its Cloud TPU node."""
        return "tpu-node"

    def job_env(self, spec: JobSpec) -> dict[str, str]:
        return tpu_vm_env(self)

    def within(self, max_runtime_s: int) -> TpuVmTarget:
        """A queued resource never waits past the run's deadline, even when the runner that asked for it is gone."""
        return replace(self, max_wait_s=min(self.max_wait_s, max_runtime_s))


def findings(
    spec: JobSpec, zones: tuple[str, ...] | None = None
) -> tuple[catalog.AcceleratorType | None, list[compat.Finding]]:
    """Every finding about where `spec` would run on the Cloud TPU API (`runner validate` shows them offline)."""
    return compat.check(spec, NAME, zones)


def resolve(
    spec: JobSpec,
    run_id: str,
    *,
    project: str | None,
    zone: str | None,
    environ: dict[str, str] | None = None,
    problems: Problems | None = None,
) -> TpuVmTarget:
    """Pre-flight for a TPU VM run: everything that can be checked without the network or credentials."""
    acc = spec.accelerator
    project, zones = location(spec, project=project, zone=zone, environ=environ)
    checked, found = compat.check(spec, NAME, zones)
    accel, warnings = settle(found, checked, problems)
    project = require_project(project, problems)
    zones = require_zones(zones, accel.zones, accel.name, "TPU VM", problems)
    runtime = acc.runtime_version or accel.generation.default_runtime or ""
    # TensorFlow on a pod slice runs on worker 0 (the other hosts serve the TPU runtime); JAX and commands run on
    # every worker.
    tensorflow = spec.training is not None and spec.training.framework == "tensorflow"
    trainer_workers = "0" if tensorflow and accel.multi_host else "all"
    provisioning = accel.provisioning if acc.provisioning == "auto" else acc.provisioning
    if acc.slices > 1:
        # Multislice exists only through queued resources (cloud.google.com/tpu/docs/multislice-introduction); the
        # spec refuses `provisioning: node` and TensorFlow with it, compat.check TPU v2 and v3.
        provisioning = "queued"
    if acc.node:
        provisioning = "node"  # attached: nothing is created
    if acc.max_wait is not None and provisioning == "node":
        warnings.append(
            f"accelerator.max_wait applies to queued resources; {accel.name} gets a node (provisioning auto)"
        )
    if provisioning == "queued" and spec.retries.capacity_wait:
        warnings.append("retries.capacity_wait applies to nodes; a queued resource waits max_wait in each zone instead")
    return TpuVmTarget(
        backend=NAME,
        project=project,
        zones=zones,
        accelerator=accel,
        machine_id=acc.node or run_id,
        trainer_workers=trainer_workers,
        price_per_hour=accel.price_per_hour(spot=acc.spot) * acc.slices,
        slices=acc.slices,
        attach=acc.node is not None,
        warnings=tuple(warnings),
        runtime_version=runtime,
        provisioning=provisioning,
        max_wait_s=min(acc.max_wait or spec.teardown.max_runtime, spec.teardown.max_runtime),
        attach_node=acc.node,
    )
