"""The Cloud TPU VM backend: create a node whose startup script runs the job's container, watch it, delete it.

Launch is part of provisioning: the rendered bootstrap (runner/launch/startup-script.sh) travels as the node's
`startup-script` metadata and runs on every worker at boot. What the run holds is one of three kinds, each with its
own flow: a node created outright (nodes.py), a queued resource that holds the node or a multislice's nodes
(queued.py: deleted as a whole, with force), or an existing node it attached to (attach.py: never deleted). The
backend picks the flow by the plan to create, and by the handle's type to read and delete.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runner.backends import describe
from runner.backends.flows import ByKind, Kind
from runner.backends.tpu_vm.api import TpuApi
from runner.backends.tpu_vm.attach import Attached
from runner.backends.tpu_vm.common import Context
from runner.backends.tpu_vm.handles import AttachedHandle, NodeHandle, QueuedHandle, TpuHandle, handle_of
from runner.backends.tpu_vm.nodes import Nodes
from runner.backends.tpu_vm.queued import QueuedResources
from runner.backends.tpu_vm.requests import request_text, slice_prefix, target_of
from runner.launch import bootstrap
from runner.plan.planner import Plan
from runner.timings import Timings

# What the Cloud TPU API's states mean for the run, said as the runner follows it (the rest are shown as they are).
STATE_NOTES = {
    "REPAIRING": "Cloud TPU is repairing it; the job may be restarted on it",
    "HIDING": "Cloud TPU is hiding it",
    "HIDDEN": "hidden by Cloud TPU; the job does not run while it is",
    "UNHIDING": "Cloud TPU is bringing it back",
    "STATE_UNSPECIFIED": "the API does not say what it is doing",
    "UNKNOWN": "the API does not say what it is doing",
    "STOPPING": "it is being stopped: a stopped node runs no job",
    "STOPPED": "a stopped node runs no job",
}


class TpuVmBackend(ByKind[TpuHandle]):
    """Cloud TPU VMs through the Cloud TPU API: a node, or a queued resource's node, created for the run or attached.
    Teardown deletes the node (a queued resource as a whole: the queued resource, with force) and confirms it is
    gone, whoever deleted it: this call, or its VM when the job ended; an attached node's job is stopped and the node
    left running. A second Ctrl-C while waiting for the confirmation stops the wait (the request stands)."""

    name = "tpu-vm"
    ephemeral = False
    ready_state = "READY"
    stop_command = "gcloud compute tpus tpu-vm stop"
    stopped_states = ("STOPPED", "STOPPING")
    state_notes = STATE_NOTES

    def __init__(
        self,
        api: TpuApi | None = None,
        *,
        say: Callable[[str], None] = print,
        timings: Timings | None = None,
        delete_timeout_s: float = 600.0,
        delete_retries: int = 3,
    ) -> None:
        timings = timings or Timings()
        self.api = api or TpuApi(timings=timings)
        self.say = say
        self.ctx = Context(self.api, say, timings.api_poll_s, timings.api_backoff_s, delete_timeout_s, delete_retries)
        self.nodes = Nodes(self.ctx)
        self.queued = QueuedResources(self.ctx)
        self.attached = Attached(self.ctx)

    def _kind(self, handle: TpuHandle) -> Kind[Any]:
        kinds: dict[type, Kind[Any]] = {
            NodeHandle: self.nodes,
            QueuedHandle: self.queued,
            AttachedHandle: self.attached,
        }
        return kinds[type(handle)]

    # -- plan -------------------------------------------------------------------------------------------------

    def describe(self, plan: Plan) -> list[tuple[str, str]]:
        target = target_of(plan)
        acc = plan.spec.accelerator
        node = target.machine_id
        if target.slices > 1:
            node = f"{slice_prefix(target.machine_id, target.slices)}-0 ... -{target.slices - 1}"
        rows = [
            ("project", target.project),
            describe.zones_row(target),
            (
                "node" if target.slices == 1 else "nodes",
                node
                + ("  (existing: attach, never delete)" if target.attach else "")
                + (f"  (held by queued resource {target.machine_id})" if target.provisioning == "queued" else ""),
            ),
            ("accelerator", describe.shape(target, describe.capacity(plan))),
            ("runtime", target.runtime_version),
            describe.workers_row(target),
            *describe.job_rows(plan),
        ]
        if not target.attach:
            rows.append(describe.cost_row(plan, target))
        rows += describe.storage_rows(target)
        if target.provisioning == "queued":
            tier = "guaranteed: {}"
            if acc.spot or acc.reserved:
                tier = "spot: {}" if acc.spot else "reserved: the node's schedulingConfig"
            rows.append(
                (
                    "provisioning",
                    f"queued resource ({tier}), waiting up to {target.max_wait_s}s for capacity in each zone",
                )
            )
        elif not target.attach:
            rows.append(("provisioning", "node (created at once; a stockout moves to the next zone)"))
        rows.append(("teardown", "never (attached node)" if target.attach else plan.spec.teardown.policy))
        return rows

    def dry_run(self, plan: Plan) -> str:
        """The exact create request (or, attached, what runs over ssh) and the startup script it carries."""
        target = target_of(plan)
        if target.attach:
            parts = [
                f"Attach: run the startup script below on every worker of {target.machine_id} over "
                "`gcloud compute tpus tpu-vm ssh --worker=all`; the node is never deleted."
            ]
            script = bootstrap.render(plan, target.zones[0])
        else:
            parts, script = request_text(plan)
        per_worker = "the startup script sets each worker's RUNNER_WORKER_ID" + (
            ", and MEGASCALE_* from the VM's tpu-env" if target.slices > 1 else ""
        )
        parts += describe.dry_run_tail(plan, script, per_worker=per_worker, runs="runs as root on every worker at boot")
        return "\n".join(parts)

    # -- provision --------------------------------------------------------------------------------------------

    def provision(self, plan: Plan, on_handle: Callable[[TpuHandle], None]) -> TpuHandle:
        """An attached node's bootstrap over ssh; a queued resource in each zone in turn until one is ACTIVE; or a
        node in the first zone with capacity (cycling through the zones for retries.capacity_wait). Quota,
        permission and request errors stop at once: no other zone fixes those."""
        target = target_of(plan)
        if target.attach:
            handle = self.attached.provision(plan)
            on_handle(handle)
            return handle
        if target.provisioning == "queued":
            return self.queued.provision(plan, on_handle)
        return self.nodes.provision(plan, on_handle)

    # -- watch / teardown -------------------------------------------------------------------------------------

    def handle_from_dict(self, data: dict[str, Any]) -> TpuHandle:
        return handle_of(data)

    def ready_at(self, handle: TpuHandle) -> float | None:
        return self.nodes.ready_at.get(handle.node_id) if isinstance(handle, NodeHandle) else None

    def console_hint(self, handle: TpuHandle) -> str:
        """Where to read what a VM did at boot: its startup-script's journal (google-startup-scripts.service)."""
        return (
            f"gcloud compute tpus tpu-vm ssh {handle.node_id} --zone={handle.zone} --project={handle.project} "
            "--worker=all --command='sudo journalctl -u google-startup-scripts.service --no-pager | tail -50'"
        )
