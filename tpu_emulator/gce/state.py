"""The emulated Compute Engine: instances, operations, instance templates and resource policies, and the state
machine between them (managed instance groups are in tpu_emulator.gce.groups, their resize requests in
tpu_emulator.gce.resize).

Instances (Instance.status):
    insert -> PROVISIONING -> STAGING -> RUNNING (the VM boots: its startup-script runs)     the operation DONE a
        step later (the late_operation fault: later still): a client can read the VM RUNNING while its insert is
        still under way, and must read on for the operation's end (when billing started)
    insert, zone stocked out -> PROVISIONING -> gone; the operation DONE with ZONE_RESOURCE_POOL_EXHAUSTED
    insert FLEX_START, zone stocked out -> PENDING (the operation DONE) until capacity, then PROVISIONING ...
    stop -> STOPPING -> TERMINATED (the VM stopped)      delete -> STOPPING -> gone (once the VM is stopped)
    Spot preempted -> STOPPING -> TERMINATED (instanceTerminationAction STOP, the default) or gone (DELETE), with a
        DONE zone operation of type compute.instances.preempted (cloud.google.com/compute/docs/instances/
        create-use-spot#detect-preemption; an operation named systemevent-..., karpenter-provider-gcp#37)
    maxRunDuration passed -> the termination action, as above (no operation is listed for it: unconfirmed)
    host error -> REPAIRING -> RUNNING again (automaticRestart) or TERMINATED, with a compute.instances.hostError
        system event (unconfirmed)
Operations go PENDING -> RUNNING -> DONE with time only: never DONE in the answer that starts them. Failures are
told only in the operation (error.errors[].code, httpErrorStatusCode); a client that reads only the instance sees
it vanish. operations.wait returns once DONE or after wait_s (Compute Engine waits up to 2 minutes; the emulator
less, so that clients must loop).

Time works as in the Cloud TPU emulator (tpu_emulator.scheduler): every transition is on an agenda, applied by the
first read after it is due, and on time by the scheduler for those with effects outside the API (VMs booted or
stopped, operations other clients wait for).
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from typing import Any

from tpu_emulator.faults import Faults
from tpu_emulator.gce import checks, errors
from tpu_emulator.gce.groups import Groups
from tpu_emulator.gce.machines import MachineType
from tpu_emulator.gce.resize import ResizeRequests
from tpu_emulator.gce.resources import Instance, Operation, Policy, Template, parse_link
from tpu_emulator.resources import region_of
from tpu_emulator.scheduler import Agenda, Scheduler
from tpu_emulator.stderr import note
from tpu_emulator.vm import VmGroup, VmLauncher

After = Callable[[], None]
QUOTA_METRIC = {"tpu7x": "TPU7X_CHIPS", "v6e": "TPU_V6E_CHIPS", "v5p": "TPU_V5P_CHIPS"}  # names: unconfirmed


class ComputeCloud:
    def __init__(
        self,
        *,
        faults: Faults,
        launcher: VmLauncher,
        scheduler: Scheduler,
        create_delay_s: float,
        delete_delay_s: float,
        vm_grace_s: float,
        wait_s: float = 1.0,
    ) -> None:
        self.faults = faults
        self.launcher = launcher
        self.create_delay_s = create_delay_s
        self.delete_delay_s = delete_delay_s
        self.vm_grace_s = vm_grace_s
        self.wait_s = wait_s
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # notified when an operation is DONE (operations.wait)
        self.agenda = Agenda(scheduler, self.lock)
        self.instances: dict[str, Instance] = {}
        self.operations: dict[str, Operation] = {}
        self.templates: dict[str, Template] = {}
        self.policies: dict[str, Policy] = {}
        self.groups = Groups(self)
        self.resize_requests = ResizeRequests(self.groups)
        self.closing = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- helpers ------------------------------------------------------------------------------------------------

    @property
    def step_s(self) -> float:
        return max(0.02, self.create_delay_s / 10)

    def settle(self) -> None:
        if not self.closing.is_set():
            self.agenda.settle()

    def spawn(self, fn: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=fn, args=args, daemon=True)
        with self.lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def join_threads(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))

    def find(self, table: dict[str, Any], path: str) -> Any:
        found = table.get(path)
        if found is None:
            raise errors.not_found(path)
        return found

    def policy(self, path: str) -> Policy:
        found: Policy = self.find(self.policies, path)
        return found

    # -- operations ---------------------------------------------------------------------------------------------

    def new_op(
        self, project: str, scope: str, kind: str, target: str, target_id: str, request_id: str | None = None
    ) -> Operation:
        op = Operation(project, scope, kind, target, target_id, self.agenda.wall(), request_id=request_id)
        self.operations[op.path] = op

        def running() -> None:
            if op.status == "PENDING":
                op.status, op.started, op.progress = "RUNNING", self.agenda.wall(), 0

        self.agenda.at(self.step_s, running)
        return op

    def system_event(self, instance: Instance, kind: str) -> Operation:
        """A DONE zone operation that Compute Engine itself made (compute.instances.preempted, ...)."""
        now = self.agenda.wall()
        op = Operation(
            instance.project, f"zones/{instance.zone}", kind, instance.path, instance.id, now, system_event=True
        )
        op.status, op.progress, op.started, op.ended = "DONE", 100, now, now
        self.operations[op.path] = op
        return op

    def finish_op(self, op: Operation, failure: dict[str, Any] | None = None) -> None:
        if op.status == "DONE":
            return
        op.started = op.started or self.agenda.wall()
        op.status, op.progress, op.ended, op.failure = "DONE", 100, self.agenda.wall(), failure
        self.changed.notify_all()

    def wait_op(self, path: str) -> Operation:
        """operations.wait: until DONE or wait_s; the lock must be held (the condition releases it while waiting)."""
        deadline = time.monotonic() + self.wait_s
        op: Operation = self.find(self.operations, path)
        while op.status != "DONE" and not self.closing.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.changed.wait(min(left, self.step_s))
            self.settle()
        return op

    def ops_in(self, project: str, scope: str) -> list[Operation]:
        return [op for op in self.operations.values() if (op.project, op.scope) == (project, scope)]

    def delete_op(self, path: str) -> None:
        self.find(self.operations, path)
        del self.operations[path]

    # -- instances: create ----------------------------------------------------------------------------------

    def insert_instance(self, project: str, zone: str, body: dict[str, Any], request_id: str | None) -> Operation:
        name = checks.check_name(body.get("name"), "resource.name")
        machine = checks.instance_properties(body, project, zone, "resource", self.policy)
        path = f"projects/{project}/zones/{zone}/instances/{name}"
        if path in self.instances:
            raise errors.already_exists(path)
        failure = self.quota(project, zone, name, machine)
        instance = Instance(project, zone, name, copy.deepcopy(body), machine, self.agenda.wall())
        op = self.new_op(project, f"zones/{zone}", "insert", path, instance.id, request_id)
        self.instances[path] = instance
        self.provision(instance, op, failure=failure)
        return op

    def quota(self, project: str, zone: str, name: str, machine: MachineType) -> dict[str, Any] | None:
        """An exhausted quota fault: raised at once (403), or the failure its operation will end with."""
        fault = self.faults.take("quota", zone=zone, node=name)
        if fault is None:
            return None
        metric = fault.quota or QUOTA_METRIC.get(machine.generation.name, "TPU_CHIPS")
        if not fault.in_operation:
            raise errors.quota_answer(metric, fault.limit, region_of(zone), fault.message)
        return errors.quota_in_operation(project, region_of(zone), metric, fault.limit, fault.message)

    def provision(
        self,
        instance: Instance,
        op: Operation | None,
        *,
        failure: dict[str, Any] | None = None,
        capacity_checked: bool = False,
        then: Callable[[Instance, bool], None] | None = None,
    ) -> None:
        """PROVISIONING, STAGING, RUNNING over the create delay, unless a stockout (or `failure`) ends it.
        `capacity_checked`: a group already took the zone's stockouts for all its VMs at once. `then(instance,
        ok)` runs when it is RUNNING (ok) or gone."""
        name, zone = instance.name, instance.zone
        slow = self.faults.take("slow_create", zone=zone, node=name)
        delay = slow.seconds if slow is not None and slow.seconds is not None else self.create_delay_s
        if failure is None and not capacity_checked and self.faults.take("stockout", zone=zone, node=name):
            if instance.provisioning_model == "FLEX_START":
                instance.status = "PENDING"  # waits for capacity instead of failing
                if op is not None:
                    self.agenda.at(self.step_s * 2, lambda: self.finish_op(op), wake=True)
                self.agenda.at(delay, lambda: self._retry_pending(instance, then), wake=True)
                return
            what = f"A {instance.machine.name} VM instance"
            failure = errors.stockout(instance.project, zone, what)
        instance.status = "PROVISIONING"
        seen = instance.generation

        def staging() -> None:
            if self.instances.get(instance.path) is instance and instance.generation == seen:
                instance.status = "STAGING"

        self.agenda.at(delay * 0.6, staging)
        self.agenda.at(delay, lambda: self._created(instance, op, failure, seen, then), wake=True)

    def _retry_pending(self, instance: Instance, then: Callable[[Instance, bool], None] | None) -> None:
        if self.instances.get(instance.path) is not instance or instance.status != "PENDING":
            return
        if self.faults.take("stockout", zone=instance.zone, node=instance.name):
            self.agenda.at(self.create_delay_s, lambda: self._retry_pending(instance, then), wake=True)
            return
        self.provision(instance, None, capacity_checked=True, then=then)

    def _created(
        self,
        instance: Instance,
        op: Operation | None,
        failure: dict[str, Any] | None,
        seen: int,
        then: Callable[[Instance, bool], None] | None,
    ) -> None:
        current = self.instances.get(instance.path) is instance and instance.generation == seen
        if not current or failure is not None:
            if current:
                del self.instances[instance.path]
            if op is not None:
                aborted = errors.failed("ABORTED", f"The resource '{instance.path}' was deleted while it was created.")
                self.finish_op(op, failure or aborted)
            if then is not None:
                then(instance, False)
            return
        instance.status, instance.started = "RUNNING", self.agenda.wall()
        self.boot(instance)
        if op is not None:
            late = self.faults.take("late_operation", zone=instance.zone, node=instance.name)
            lag = late.seconds if late is not None and late.seconds is not None else self.step_s
            self.agenda.at(lag, lambda: self.finish_op(op), wake=True)
        self._schedule_run_end(instance)
        if then is not None:
            then(instance, True)

    def boot(self, instance: Instance) -> None:
        script = instance.metadata_items().get("startup-script")
        try:
            instance.vms = self.launcher.boot_instance(
                instance.project, instance.zone, instance.name, script, instance.coordinator
            )
        except OSError as exc:
            note(f"[tpu-emulator] could not boot {instance.path}: {exc}")

    def _schedule_run_end(self, instance: Instance) -> None:
        duration = instance.scheduling.get("maxRunDuration")
        if not duration:
            return
        seen = instance.generation

        def end() -> None:
            if self.instances.get(instance.path) is instance and instance.generation == seen:
                self.terminate(instance, instance.termination_action, cause="maxRunDuration")

        self.agenda.at(float(duration.get("seconds", 0)) + duration.get("nanos", 0) / 1e9, end, wake=True)

    # -- instances: read ----------------------------------------------------------------------------------------

    def get_instance(self, path: str) -> Instance:
        found: Instance = self.find(self.instances, path)
        return found

    def instances_in(self, project: str, zone: str) -> list[Instance]:
        return [i for i in self.instances.values() if (i.project, i.zone) == (project, zone)]

    # -- instances: stop, delete, and what Compute Engine does to them ------------------------------------------

    def delete_instance(self, path: str, request_id: str | None) -> tuple[Operation, After | None]:
        instance = self.get_instance(path)
        op = self.new_op(instance.project, f"zones/{instance.zone}", "delete", path, instance.id, request_id)
        fail = None
        if instance.status not in ("PROVISIONING", "STAGING", "PENDING"):
            fail = self.faults.take("delete_fails", zone=instance.zone, node=instance.name)
        slow = self.faults.take("slow_delete", zone=instance.zone, node=instance.name)
        delay = next((f.seconds for f in (slow, fail) if f is not None and f.seconds is not None), self.delete_delay_s)
        if fail is not None:
            message = fail.message or f"The resource '{path}' could not be deleted; retry later."
            failure = errors.failed(fail.status or "INTERNAL", message, fail.reason)
            self.agenda.at(delay, lambda: self.finish_op(op, failure), wake=True)
            return op, None  # the VM keeps running: this deletion will not happen
        return op, self.take_down(instance, "gone", delay, op=op)

    def stop_instance(self, path: str, request_id: str | None) -> tuple[Operation, After | None]:
        instance = self.get_instance(path)
        if instance.provisioning_model == "FLEX_START":
            raise errors.invalid(f"The resource '{path}' is a Flex-start VM, which cannot be stopped; delete it.")
        op = self.new_op(instance.project, f"zones/{instance.zone}", "stop", path, instance.id, request_id)
        if instance.status in ("TERMINATED", "STOPPED"):
            self.agenda.at(self.step_s * 2, lambda: self.finish_op(op), wake=True)
            return op, None
        return op, self.take_down(instance, "TERMINATED", self.delete_delay_s, op=op)

    def terminate(self, instance: Instance, action: str, *, cause: str) -> None:
        """What Compute Engine does itself at the end of a run duration: STOP or DELETE, nobody's answer to wait for."""
        end = "gone" if action == "DELETE" else "TERMINATED"
        after = self.take_down(instance, end, self.delete_delay_s, cause=cause)
        if after is not None:
            self.agenda.at(0.0, after, wake=True)

    def take_down(
        self, instance: Instance, end: str, delay: float, *, op: Operation | None = None, cause: str = "user"
    ) -> After | None:
        """STOPPING, the VM stopped (SIGTERM, SIGKILL after the grace), then `end` ("gone" or TERMINATED) once
        `delay` has passed and the VM is gone. Returns what stops the VM, to run after the answer is sent."""
        instance.generation += 1
        seen = instance.generation
        instance.status = "STOPPING"
        group, instance.vms = instance.vms, None
        state = {"stopped": group is None, "due": False}

        def finish() -> None:
            if self.instances.get(instance.path) is not instance or instance.generation != seen:
                if op is not None:
                    self.finish_op(op)
                return
            if not state["stopped"]:
                state["due"] = True  # the VM is still shutting down: finish when it is gone
                return
            if end == "gone":
                del self.instances[instance.path]
            else:
                instance.status, instance.stopped = end, self.agenda.wall()
            if op is not None:
                self.finish_op(op)
            self.groups.member_down(instance, cause)

        self.agenda.at(delay, finish, wake=True)
        if group is None:
            return None

        def stop_vm() -> None:
            group.stop(self.vm_grace_s)
            with self.lock:
                state["stopped"] = True
                if state["due"]:
                    self.agenda.at(0.0, finish, wake=True)

        return lambda: self.spawn(stop_vm)

    def preempt(self, path: str) -> After | None:
        """A Spot VM taken back: STOPPING now (instance/preempted TRUE), then its termination action."""
        instance = self.get_instance(path)
        if instance.provisioning_model != "SPOT":
            raise errors.precondition(f"{path} is {instance.provisioning_model}: only Spot VMs are preempted")
        if instance.status != "RUNNING":
            raise errors.precondition(f"{path} is {instance.status}: only a RUNNING VM can be preempted")
        instance.preempted = True
        self.system_event(instance, "compute.instances.preempted")
        end = "gone" if instance.termination_action == "DELETE" else "TERMINATED"
        return self.take_down(instance, end, self.delete_delay_s, cause="preempted")

    def host_error(self, path: str, seconds: float | None = None) -> VmGroup | None:
        """A host failure: REPAIRING (the VM dies at once), then RUNNING again on a fresh boot when the instance
        restarts automatically (standard VMs, by default), else TERMINATED. Returns the dead VM to kill."""
        instance = self.get_instance(path)
        if instance.status != "RUNNING":
            raise errors.precondition(f"{path} is {instance.status}: only a RUNNING VM meets a host error")
        instance.generation += 1
        seen = instance.generation
        instance.status = "REPAIRING"
        group, instance.vms = instance.vms, None
        self.system_event(instance, "compute.instances.hostError")
        restart = instance.scheduling.get("automaticRestart", instance.provisioning_model == "STANDARD")

        def repaired() -> None:
            if self.instances.get(instance.path) is not instance or instance.generation != seen:
                return
            if restart:
                instance.status, instance.started = "RUNNING", self.agenda.wall()
                self.boot(instance)
            else:
                instance.status, instance.stopped = "TERMINATED", self.agenda.wall()
                self.groups.member_down(instance, "hostError")

        self.agenda.at(self.create_delay_s if seconds is None else seconds, repaired, wake=True)
        return group

    # -- templates and policies ---------------------------------------------------------------------------------

    def insert_template(self, project: str, body: dict[str, Any], request_id: str | None) -> Operation:
        name = checks.check_name(body.get("name"), "resource.name")
        props = body.get("properties")
        if not isinstance(props, dict):
            raise errors.invalid("Required field 'resource.properties' not specified")
        machine = checks.instance_properties(props, project, None, "resource.properties", self.policy)
        template = Template(project, name, copy.deepcopy(body), self.agenda.wall(), machine)
        if template.path in self.templates:
            raise errors.already_exists(template.path)
        self.templates[template.path] = template
        return self.quick_op(project, "global", "insert", template.path, template.id, request_id)

    def delete_template(self, path: str, request_id: str | None) -> Operation:
        template: Template = self.find(self.templates, path)
        user = self.groups.using(path)
        if user:
            raise errors.in_use(path, user)
        del self.templates[path]
        return self.quick_op(template.project, "global", "delete", path, template.id, request_id)

    def insert_policy(self, project: str, region: str, body: dict[str, Any], request_id: str | None) -> Operation:
        name = checks.check_name(body.get("name"), "resource.name")
        workload = body.get("workloadPolicy")
        every = ("workloadPolicy", "groupPlacementPolicy", "instanceSchedulePolicy", "snapshotSchedulePolicy")
        kinds = [k for k in (*every, "diskConsistencyGroupPolicy") if k in body]
        if len(kinds) != 1:
            raise errors.invalid(f"A resource policy has exactly one kind of policy; got {', '.join(kinds) or 'none'}.")
        if workload is not None:
            if not workload.get("type"):
                raise errors.invalid("Required field 'resource.workloadPolicy.type' not specified")
            if (
                workload["type"] == "HIGH_THROUGHPUT"
                and not workload.get("acceleratorTopology")
                and not workload.get("maxTopologyDistance")
            ):
                raise errors.invalid(
                    "Required field 'resource.workloadPolicy.acceleratorTopology' not specified: a HIGH_THROUGHPUT "
                    "workload policy for TPUs names the slice's topology, e.g. 2x2x2"
                )
        policy = Policy(project, region, name, copy.deepcopy(body), self.agenda.wall())
        if policy.path in self.policies:
            raise errors.already_exists(policy.path)
        self.policies[policy.path] = policy
        return self.quick_op(project, f"regions/{region}", "insert", policy.path, policy.id, request_id)

    def delete_policy(self, path: str, request_id: str | None) -> Operation:
        policy = self.policy(path)
        user = self.groups.using(path) or next(
            (
                i.path
                for i in self.instances.values()
                if any(parse_link(p, i.project) == path for p in i.spec.get("resourcePolicies") or [])
            ),
            None,
        )
        if user:
            raise errors.in_use(path, user)
        del self.policies[path]
        return self.quick_op(policy.project, f"regions/{policy.region}", "delete", path, policy.id, request_id)

    def quick_op(self, project: str, scope: str, kind: str, target: str, target_id: str, rid: str | None) -> Operation:
        """An operation about a resource that exists (or is gone) at once: DONE a moment later."""
        op = self.new_op(project, scope, kind, target, target_id, rid)
        self.agenda.at(self.step_s * 3, lambda: self.finish_op(op), wake=True)
        return op

    # -- all of it ----------------------------------------------------------------------------------------------

    def forget_all(self) -> None:
        with self.lock:
            self.agenda.clear()
            for instance in self.instances.values():
                instance.vms = None
            self.instances.clear()
            self.operations.clear()
            self.templates.clear()
            self.policies.clear()
            self.groups.clear()
