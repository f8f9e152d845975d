"""Multi-host TPU slices as managed instance groups (cloud.google.com/tpu/docs/tpus-and-migs): a workload policy
(HIGH_THROUGHPUT on the slice's acceleratorTopology), an instance template, and a group naming both, whose VMs
Compute Engine makes all at once or not at all. Flex-start: the group starts empty and one resize request asks for
every VM at once, waiting for capacity.

A group with the workload policy keeps trying by itself when the zone has no capacity ("Atomic resize failed with
[GCE_STOCKOUT]" on each planned VM); the runner instead deletes what it made and moves to the next zone, as it does
for a TPU node. Deleting a group deletes its VMs; the template and the policy can only go once it is gone.

A slice is one machine to the runner: RUNNING when every VM runs; PREEMPTED when Compute Engine preempted one of its
VMs since the group was made (the group would recreate that VM alone; the runner deletes the whole slice and makes
it again, so that every host restarts the job together from its checkpoint).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from runner.backends import labels
from runner.backends.base import MachineState
from runner.backends.compute_engine.api import GANG_STOCKOUT, STOCKOUT_CODES, operation_ref, timestamp
from runner.backends.compute_engine.common import Context
from runner.backends.compute_engine.handles import GroupHandle
from runner.backends.compute_engine.instances import DOWN
from runner.backends.compute_engine.requests import base_instance_name, names, slice_requests, target_of
from runner.backends.deletion import Deletion
from runner.backends.flows import same_run
from runner.backends.labels import NameTaken
from runner.backends.locations import first_with_capacity
from runner.errors import AlreadyExists, BackendError, NoCapacity, Preempted, Vanished
from runner.interrupts import signals_deferred
from runner.plan.planner import Plan

# What the slice is made of, in the order it is deleted: each one's client and what names it in a call.
KINDS = {"group": "groups", "template": "templates", "policy": "policies", "resize request": "resize_requests"}


class Groups:
    """The slice flow of one ComputeEngineBackend."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    # -- create ---------------------------------------------------------------------------------------------------

    def provision(self, plan: Plan, on_handle: Callable[[GroupHandle], None]) -> GroupHandle:
        target = target_of(plan)
        return first_with_capacity(
            target.zones,
            lambda zone, name: self._create(plan, zone, name, on_handle),
            name=target.machine_id,
            what=f"{target.accelerator.name} ({target.topology})",
            kind="instance group",
            capacity_wait_s=plan.spec.retries.capacity_wait,
            backoff_s=self.ctx.backoff_s,
            say=self.ctx.say,
        )

    def _create(self, plan: Plan, zone: str, name: str, on_handle: Callable[[GroupHandle], None]) -> GroupHandle:
        target = target_of(plan)
        template, policy, flex = names(name)
        flexible = target.provisioning_model == "FLEX_START"
        handle = GroupHandle(target.project, zone, name, template, policy, flex if flexible else None, plan.nonce)
        on_handle(handle)
        self.ctx.say(
            f"creating instance group {name}: {target.hosts} x {target.machine_type} as one {target.topology} "
            f"slice ({target.provisioning_model}) in {zone}"
        )
        try:
            for what, _, body in slice_requests(plan, zone, name):
                self._insert(handle, what, body, plan.deadline, plan.run_id)
            self._wait_ready(handle, plan)
            return handle
        except BaseException:
            self.discard(handle)
            raise

    def _insert(self, handle: GroupHandle, what: str, body: dict[str, Any], deadline: float, run_id: str) -> None:
        where = dict(project=handle.project, zone=handle.zone)
        try:
            ref = self.ctx.api.insert(what, body, group=handle.name, **where)
        except AlreadyExists:
            # Ours when a retried request finds what its first try made; anyone else's is never touched: the run's
            # group (and so its template and policy) gets another name; another try of this run's is never doubled.
            found = self._read(handle, KINDS[what])
            if self._ours(found, handle):
                return
            marks = labels.from_description(found.description) if found is not None else {}
            if marks.get(labels.RUN) == run_id:
                raise same_run(what, body["name"], run_id) from None
            raise NameTaken(body["name"], "another run", kind=what) from None
        self.ctx.finish(ref, f"create {what} {body['name']}", deadline=deadline, **where)

    def _wait_ready(self, handle: GroupHandle, plan: Plan) -> None:
        """Until every VM of the slice is RUNNING. A stockout shows on the planned VMs' last attempt (the group
        keeps trying; the runner moves on); a flex-start request waits up to max_wait for capacity."""
        target = target_of(plan)
        t0, last = time.monotonic(), None
        while True:
            members = self.members(handle)
            if not members and self.get(handle) is None:  # deleted under the wait: it ends now, saying so
                raise Vanished(
                    f"instance group {handle.name} was deleted while its VMs were being created: by `runner down`, "
                    "in the console or by Compute Engine",
                    hint=f"`gcloud compute operations list --zones={handle.zone}` shows who deleted it",
                )
            running = sum(1 for m in members if m.instance_status == "RUNNING")
            errors = [e for m in members if m.last_attempt for e in m.last_attempt.errors.errors]
            waiting = self._resize_state(handle) if handle.resize_request else None
            state = f"{running}/{target.hosts} RUNNING" + (f", resize request {waiting}" if waiting else "")
            if state != last:
                self.ctx.say(f"instance group {handle.name}: {state} ({time.monotonic() - t0:.0f}s)")
                last = state
            if running == target.hosts and waiting in (None, "SUCCEEDED"):  # flex-start: granted, by its own word
                return
            stockout = next((e for e in errors if e.code in STOCKOUT_CODES or GANG_STOCKOUT in e.message), None)
            if stockout is not None and not handle.resize_request:
                self.ctx.say(f"instance group {handle.name}: {stockout.message}")  # the cloud's words, then a move
                raise NoCapacity(
                    f"no capacity in {handle.zone} for the {target.topology} slice (stockout): {stockout.message}",
                    hint="list more zones under accelerator.zones, set retries.capacity_wait, or try flex-start "
                    "(accelerator.provisioning: queued)",
                )
            if waiting == "FAILED":
                raise BackendError(f"the resize request of instance group {handle.name} FAILED")
            if waiting == "ACCEPTED" and time.monotonic() - t0 > target.max_wait_s:
                raise NoCapacity(
                    f"flex-start: no capacity in {handle.zone} for the {target.topology} slice within "
                    f"{target.max_wait_s}s",
                    hint="raise accelerator.max_wait, or list more zones",
                )
            if any(m.instance_status in DOWN for m in members) and self._preempted(handle):
                raise Preempted(f"a VM of instance group {handle.name} was preempted as soon as it was created")
            if time.time() > plan.deadline:
                raise BackendError(f"instance group {handle.name} was not RUNNING when the run's max_runtime ran out")
            time.sleep(self.ctx.pause(t0))

    def discard(self, handle: GroupHandle) -> None:
        """Delete what this attempt made, and only that: the group when it carries this run's nonce, then the
        template and the policy (which a group in use keeps)."""
        try:
            with signals_deferred(self.ctx.say):
                self._delete_all(handle, announce=False, wait_s=None, only_ours=True)
        except BackendError as exc:
            self.ctx.say(
                f"warning: could not make sure {self.what(handle)} in {handle.zone} is deleted: {exc}; "
                "`runner down RUN` or `runner gc` will"
            )

    # -- read -----------------------------------------------------------------------------------------------------

    def get(self, handle: GroupHandle) -> Any | None:
        return self._read(handle, "groups")

    def _keys(self, handle: GroupHandle, kind: str) -> dict[str, str]:
        return {
            "groups": {"zone": handle.zone, "instance_group_manager": handle.name},
            "templates": {"instance_template": handle.template},
            "policies": {"region": handle.region, "resource_policy": handle.policy},
            "resize_requests": {
                "zone": handle.zone,
                "instance_group_manager": handle.name,
                "resize_request": handle.resize_request or "",
            },
        }[kind]

    def _read(self, handle: GroupHandle, kind: str) -> Any | None:
        keys = self._keys(handle, kind)
        what = f"read {kind.rstrip('s')} {next(reversed(keys.values()))}"
        return self.ctx.api.unless_missing(
            kind, "get", what, (handle.project, handle.zone), project=handle.project, **keys
        )

    def members(self, handle: GroupHandle) -> list[Any]:
        from google.cloud import compute_v1

        request = compute_v1.ListManagedInstancesInstanceGroupManagersRequest(
            project=handle.project, zone=handle.zone, instance_group_manager=handle.name
        )
        try:
            found = self.ctx.api.listed(
                "groups", "list_managed_instances", "the group's VMs", (handle.project, handle.zone), request=request
            )
        except BackendError:
            if self.get(handle) is None:
                return []
            raise
        return found

    def _resize_state(self, handle: GroupHandle) -> str | None:
        found = self._read(handle, "resize_requests")
        return None if found is None else str(found.state)

    @staticmethod
    def _ours(found: Any | None, handle: GroupHandle) -> bool:
        return found is not None and labels.owned(labels.from_description(found.description), handle.nonce)

    def _preempted(self, handle: GroupHandle, group: Any | None = None) -> bool:
        group = group if group is not None else self.get(handle)
        if group is None:
            return False
        since = timestamp(group.creation_timestamp)
        return self.ctx.api.preempted_since(handle.project, handle.zone, f"{base_instance_name(handle.name)}-*", since)

    def observe(self, handle: GroupHandle) -> tuple[MachineState, str | None]:
        group = self.get(handle)
        if group is None:
            return MachineState.GONE, None
        counts = group.status.current_instance_statuses
        if group.target_size == 0 and group.current_actions.deleting:
            return MachineState.DELETING, "DELETING"
        hosts = counts.running
        native = f"{hosts}/{group.target_size} RUNNING"
        # Asked every time, not only while a VM is down: the group recreates a preempted VM within minutes, and the
        # slice's job lost that host all the same.
        if self._preempted(handle, group):
            return MachineState.PREEMPTED, f"{native} (a VM preempted)"
        if group.target_size and hosts == group.target_size:
            return MachineState.RUNNING, native
        return MachineState.CREATING, native

    # -- delete ---------------------------------------------------------------------------------------------------

    def owns(self, handle: GroupHandle) -> bool:
        found = self.get(handle)
        return found is None or handle.nonce is None or self._ours(found, handle)

    @staticmethod
    def what(handle: GroupHandle) -> str:
        return f"instance group {handle.name}"

    @staticmethod
    def delete_hint(handle: GroupHandle) -> str:
        where = f"--project={handle.project}"
        return (
            f"delete it yourself: gcloud compute instance-groups managed delete {handle.name} --zone={handle.zone} "
            f"{where} --quiet, then gcloud compute instance-templates delete {handle.template} {where} --quiet and "
            f"gcloud compute resource-policies delete {handle.policy} --region={handle.region} {where} --quiet"
        )

    def deletions(self, handle: GroupHandle) -> list[tuple[str, Deletion]]:
        """(kind, deletion) of the group (its VMs go with it), then its template and its workload policy."""
        api, project, zone = self.ctx.api, handle.project, handle.zone
        at = (project, zone)

        def state(kind: str) -> str | None:
            found = self._read(handle, kind)
            if found is None:
                return None
            if kind == "groups" and found.target_size == 0 and found.current_actions.deleting:
                return "DELETING"
            return "EXISTS"

        def send(kind: str) -> str | None:
            keys = self._keys(handle, kind)
            op = api.unless_missing(kind, "delete_unary", f"delete {kind.rstrip('s')}", at, project=project, **keys)
            return None if op is None else operation_ref(op)

        parts = [
            ("groups", self.what(handle)),
            ("templates", f"instance template {handle.template}"),
            ("policies", f"workload policy {handle.policy}"),
        ]
        return [
            (
                kind,
                Deletion(
                    what=what,
                    zone=zone,
                    hint=self.delete_hint(handle),
                    check=f"gcloud compute instance-groups managed describe {handle.name} --zone={zone}",
                    read_state=lambda kind=kind: state(kind),  # type: ignore[misc]
                    request=lambda kind=kind: send(kind),  # type: ignore[misc]
                    outcome=lambda op, what=what: self.ctx.outcome(op, what, project=project, zone=zone),  # type: ignore[misc]
                    going=("DELETING",),
                ),
            )
            for kind, what in parts
        ]

    def _delete_all(self, handle: GroupHandle, *, announce: bool, wait_s: float | None, only_ours: bool) -> bool:
        """The group first (what bills), then its template and policy, which Compute Engine keeps while a group uses
        them; with only_ours, each only when it carries this run's nonce."""
        gone = True
        for kind, deletion in self.deletions(handle):
            if only_ours and (found := self._read(handle, kind)) is not None and not self._ours(found, handle):
                continue  # another run's of that name: never touched
            if not self.ctx.delete(deletion, announce=announce, wait_s=wait_s):
                gone = False
                if kind == "groups":
                    return False  # still there: its template and policy cannot go yet (`runner gc` takes them)
        return gone

    def teardown(self, handle: GroupHandle, *, grace_s: float, wait_s: float) -> bool:
        return self._delete_all(handle, announce=True, wait_s=wait_s, only_ours=False)
