"""The Compute Engine backend: create a TPU VM instance (or a multi-host slice's managed instance group) whose
startup script runs the job's container, watch it, delete it.

Launch is part of provisioning, as on Cloud TPU VMs: the rendered bootstrap (runner/launch/startup-script.sh, the
same script) travels as the `startup-script` metadata item and runs on every VM at boot. The backend picks the flow
by the plan to create (instances.py, groups.py) and by the handle's type to read and delete.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runner.backends import describe
from runner.backends.compute_engine.api import ComputeApi
from runner.backends.compute_engine.common import Context
from runner.backends.compute_engine.groups import Groups
from runner.backends.compute_engine.handles import ComputeHandle, GroupHandle, InstanceHandle, handle_of
from runner.backends.compute_engine.instances import PREEMPTED, Instances
from runner.backends.compute_engine.requests import request_text, target_of
from runner.backends.flows import ByKind, Kind
from runner.plan.planner import Plan
from runner.timings import Timings

# What Compute Engine's states mean for the run, said as the runner follows it (the rest are shown as they are).
STATE_NOTES = {
    "PENDING": "flex-start: waiting for capacity",
    "REPAIRING": "Compute Engine is repairing its host; the VM restarts and the job with it",
    "STOPPING": "it is being stopped or deleted",
    "TERMINATED": "a stopped VM runs no job",
    "SUSPENDED": "a suspended VM runs no job",
    PREEMPTED: "Compute Engine took the Spot VM back; the runner creates it again",
}


class ComputeEngineBackend(ByKind[ComputeHandle]):
    """TPU7x through Compute Engine: one instance for a single host, a managed instance group for a multi-host slice.
    Teardown deletes the instance, or the group (its VMs go with it) and then its template and workload policy, and
    confirms they are gone, whoever deleted them: this call, or the VM itself when the job ended."""

    name = "compute-engine"
    ephemeral = False
    ready_state = "RUNNING"
    stop_command = "gcloud compute instances stop"
    stopped_states = ("PENDING_STOP", "STOPPING", "DEPROVISIONING", "STOPPED", "TERMINATED", "SUSPENDING", "SUSPENDED")
    state_notes = STATE_NOTES

    def __init__(
        self,
        api: ComputeApi | None = None,
        *,
        say: Callable[[str], None] = print,
        timings: Timings | None = None,
        delete_timeout_s: float = 600.0,
        delete_retries: int = 3,
    ) -> None:
        timings = timings or Timings()
        self.api = api or ComputeApi(timings=timings)
        self.say = say
        self.ctx = Context(self.api, say, timings.api_poll_s, timings.api_backoff_s, delete_timeout_s, delete_retries)
        self.instances = Instances(self.ctx)
        self.groups = Groups(self.ctx)

    def _kind(self, handle: ComputeHandle) -> Kind[Any]:
        return self.groups if isinstance(handle, GroupHandle) else self.instances

    # -- plan -------------------------------------------------------------------------------------------------

    def describe(self, plan: Plan) -> list[tuple[str, str]]:
        target = target_of(plan)
        if target.topology:
            machine = (
                f"instance group {target.machine_id}: {target.hosts} x {target.machine_type}, one {target.topology} "
                "slice (workload policy HIGH_THROUGHPUT)"
            )
        else:
            machine = f"instance {target.machine_id} ({target.machine_type})"
        provisioning = {
            "STANDARD": "on demand, created at once; a stockout moves to the next zone",
            "SPOT": "Spot: preemptible; a preempted VM is deleted and created again",
            "FLEX_START": f"flex-start: waits for capacity up to {target.max_wait_s}s in each zone",
            "RESERVATION_BOUND": f"from reservation {target.reservation}",
        }[target.provisioning_model]
        if target.reserved and not target.reservation:
            provisioning = "on demand, from any matching reservation"
        rows = [
            ("project", target.project),
            describe.zones_row(target),
            ("machine", machine),
            ("accelerator", describe.shape(target, describe.capacity(plan))),
            ("boot image", f"{target.image} ({target.disk_type}, {target.disk_size_gb} GB)"),
            describe.workers_row(target),
            *describe.job_rows(plan),
        ]
        if target.price_per_hour:
            rows.append(describe.cost_row(plan, target))
        rows += describe.storage_rows(target)
        rows += [
            ("provisioning", f"{target.provisioning_model} ({provisioning})"),
            ("cloud deadline", f"maxRunDuration {target.max_run_duration_s}s, then {target.termination_action}"),
            ("teardown", plan.spec.teardown.policy),
        ]
        return rows

    def dry_run(self, plan: Plan) -> str:
        """The exact create requests and the startup script they carry."""
        target = target_of(plan)
        parts, script = request_text(plan)
        per_worker = "the startup script sets each worker's RUNNER_WORKER_ID" + (
            " from the VM's agent-worker-number" if target.topology else ""
        )
        parts += describe.dry_run_tail(plan, script, per_worker=per_worker, runs="runs as root on every VM at boot")
        return "\n".join(parts)

    # -- provision --------------------------------------------------------------------------------------------

    def provision(self, plan: Plan, on_handle: Callable[[ComputeHandle], None]) -> ComputeHandle:
        """An instance, or a slice's group, in the first zone with capacity (cycling through the zones for
        retries.capacity_wait). Quota, permission and request errors stop at once: no other zone fixes those."""
        if target_of(plan).topology:
            return self.groups.provision(plan, on_handle)
        return self.instances.provision(plan, on_handle)

    # -- watch / teardown -------------------------------------------------------------------------------------

    def handle_from_dict(self, data: dict[str, Any]) -> ComputeHandle:
        return handle_of(data)

    def ready_at(self, handle: ComputeHandle) -> float | None:
        return self.instances.ready_at.get(handle.name) if isinstance(handle, InstanceHandle) else None

    def console_hint(self, handle: ComputeHandle) -> str:
        """Where to read what a VM did at boot: its serial console, where the startup script logs."""
        name = handle.name if isinstance(handle, InstanceHandle) else f"<a VM of group {handle.name}>"
        return f"gcloud compute instances get-serial-port-output {name} --zone={handle.zone} --project={handle.project}"
