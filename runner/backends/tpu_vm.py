"""The Cloud TPU VM backend: create a node whose startup script runs the job's container, watch it, delete it.

Launch is part of provisioning: the rendered bootstrap (runner/launch/startup-script.sh) travels as the node's
`startup-script` metadata and runs on every worker at boot. Attach mode runs the same script on an existing node
over `gcloud compute tpus tpu-vm ssh --worker=all` and never deletes that node. With `provisioning: queued` the
node is asked for through a queued resource (runner/backends/queued.py), which is then what the handle names and
what teardown deletes (with force: its node goes with it).
"""

from __future__ import annotations

import base64
import json
import secrets
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runner import contract
from runner.backends import container
from runner.backends.base import Backend, MachineState, handle_from
from runner.backends.tpu_api import CLOUD_PLATFORM, TpuApi, explain
from runner.errors import AlreadyExists, BackendError, NoCapacity, Preempted
from runner.launch import bootstrap, job
from runner.plan.planner import Plan
from runner.teardown.interrupts import hurry, signals_deferred
from runner.timings import Timings
from runner.watch.runs import runner_home

LABEL_MANAGED = "managed-by"
LABEL_RUN = "tpu-runner-run"
LABEL_JOB = "tpu-runner-job"
LABEL_DEADLINE = "tpu-runner-deadline"
LABEL_NONCE = "tpu-runner-nonce"  # unique per submit: tells this run's node from another's with the same name
MANAGED_BY = "tpu-runner"

# Node.State -> MachineState: what is there to pay for, and whether it can still run the job.
_STATES = {
    "CREATING": MachineState.CREATING,
    "STARTING": MachineState.CREATING,
    "RESTARTING": MachineState.CREATING,
    "REIMAGING": MachineState.CREATING,
    "REPAIRING": MachineState.CREATING,
    "UNHIDING": MachineState.CREATING,
    "READY": MachineState.RUNNING,
    "STOPPING": MachineState.STOPPED,
    "STOPPED": MachineState.STOPPED,
    "DELETING": MachineState.DELETING,
    "PREEMPTED": MachineState.PREEMPTED,
    "TERMINATED": MachineState.PREEMPTED,
    "HIDING": MachineState.UNKNOWN,
    "HIDDEN": MachineState.UNKNOWN,
    "STATE_UNSPECIFIED": MachineState.UNKNOWN,
}


def machine_state(node: Any | None) -> MachineState:
    if node is None:
        return MachineState.GONE
    return _STATES.get(node.state.name, MachineState.UNKNOWN)


@dataclass(frozen=True)
class TpuVmHandle:
    project: str
    zone: str
    node_id: str
    created: bool  # False when attached to an existing node: never deleted
    ssh_pid: int | None = None  # attach mode: the `gcloud ... ssh` that runs the bootstrap
    nonce: str | None = None  # the LABEL_NONCE value of a node this run creates
    queued_resource: str | None = None  # the queued resource (its id) that holds the node: deleted as a whole

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class NameTaken(Exception):
    """A node (or queued resource) with this run's id exists and is not this run's: it gets a new name, never a
    delete."""

    def __init__(self, node_id: str, owner: str, *, kind: str = "TPU node") -> None:
        super().__init__(f"{kind} {node_id} exists already (run {owner})")
        self.new_id = f"{node_id[:58].rstrip('-')}-{secrets.token_hex(2)}"


def owned(labels: dict[str, str], handle: TpuVmHandle) -> bool:
    """Created by this run: labelled by the runner with this submit's nonce."""
    return labels.get(LABEL_MANAGED) == MANAGED_BY and labels.get(LABEL_NONCE) == handle.nonce


def node_request(plan: Plan, zone: str, node_id: str | None = None) -> dict[str, Any]:
    """The Node resource to create, as JSON: what --dry-run prints is exactly what is sent."""
    cloud = plan.cloud
    assert cloud is not None
    node_id = node_id or cloud.node_id
    acc = plan.spec.accelerator
    scheduling: dict[str, bool] = {}
    if acc.spot:
        scheduling["spot"] = True
    if acc.reserved:
        scheduling["reserved"] = True
    service_account: dict[str, Any] = {"scope": [CLOUD_PLATFORM]}  # the resolver and the bucket need it
    if acc.service_account:
        service_account["email"] = acc.service_account
    return {
        "description": f"tpu-runner run {plan.run_id} (job {plan.spec.name})",
        "acceleratorType": cloud.accelerator.name,
        "runtimeVersion": cloud.runtime_version,
        "labels": {
            LABEL_MANAGED: MANAGED_BY,
            LABEL_RUN: plan.run_id,
            LABEL_JOB: plan.spec.name,
            LABEL_DEADLINE: str(int(plan.deadline)),
            LABEL_NONCE: plan.nonce,
        },
        "metadata": {"startup-script": bootstrap.render(plan, zone, node_id), contract.RUN_DIR_METADATA: plan.run_dir},
        "schedulingConfig": scheduling,
        "serviceAccount": service_account,
        # As gcloud does by default: the VM reaches Artifact Registry and Cloud Storage without Cloud NAT.
        "networkConfig": {"enableExternalIps": True},
    }


class TpuVmBackend(Backend[TpuVmHandle]):
    name = "tpu-vm"
    ephemeral = False

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
        self.poll_s = timings.api_poll_s
        self.backoff_s = timings.api_backoff_s
        self.delete_timeout_s = delete_timeout_s
        self.delete_retries = delete_retries
        self._ready_at: dict[str, float | None] = {}  # node id -> its create operation's end (the API's clock)

    # -- plan -------------------------------------------------------------------------------------------------

    def describe(self, plan: Plan) -> list[tuple[str, str]]:
        cloud = plan.cloud
        assert cloud is not None
        accel = cloud.accelerator
        acc = plan.spec.accelerator
        kind = "Spot" if acc.spot else "reserved" if acc.reserved else "on-demand"
        hours = plan.spec.teardown.max_runtime / 3600
        from runner.plan import catalog

        prices = catalog.prices_info()
        node = cloud.node_id
        shape = f"{accel.name}: {accel.chips} chips on {accel.hosts} host(s), {kind}"
        if cloud.slices > 1:
            from runner.backends.queued import slice_prefix

            node = f"{slice_prefix(cloud.node_id, cloud.slices)}-0 ... -{cloud.slices - 1}"
            shape = (
                f"{cloud.slices} slices of {accel.name} (multislice): {accel.chips * cloud.slices} chips on "
                f"{accel.hosts * cloud.slices} host(s), {kind}"
            )
        rows = [
            ("project", cloud.project),
            ("zones", " -> ".join(cloud.zones) + ("  (tried in order)" if len(cloud.zones) > 1 else "")),
            (
                "node" if cloud.slices == 1 else "nodes",
                node
                + ("  (existing: attach, never delete)" if cloud.attach_node else "")
                + (f"  (held by queued resource {cloud.node_id})" if cloud.provisioning == "queued" else ""),
            ),
            ("accelerator", shape),
            ("runtime", cloud.runtime_version),
            ("job runs on", "every worker" if cloud.trainer_workers == "all" else f"worker {cloud.trainer_workers}"),
            *job.plan_rows(plan, process=False),
        ]
        if not cloud.attach_node:
            rows.append(
                (
                    "est. cost",
                    f"${cloud.price_per_hour:.2f}/hour; at most ${cloud.price_per_hour * hours:.2f} "
                    f"for max_runtime {hours:g} h  ({prices['currency']} list prices per "
                    f"{prices['unit']} read {prices['read_on']})",
                )
            )
        if cloud.provisioning == "queued":
            tier = "guaranteed: {}"
            if acc.spot or acc.reserved:
                tier = "spot: {}" if acc.spot else "reserved: the node's schedulingConfig"
            rows.append(
                (
                    "provisioning",
                    f"queued resource ({tier}), waiting up to {cloud.max_wait_s}s for capacity in each zone",
                )
            )
        elif not cloud.attach_node:
            rows.append(("provisioning", "node (created at once; a stockout moves to the next zone)"))
        rows.append(("teardown", "never (attached node)" if cloud.attach_node else plan.spec.teardown.policy))
        return rows

    def dry_run(self, plan: Plan) -> str:
        """The exact create request (or, attached, what runs over ssh) and the startup script it carries."""
        cloud = plan.cloud
        assert cloud is not None
        zone = cloud.zones[0]
        body = node_request(plan, zone)
        if plan.attach:
            parts = [
                f"Attach: run the startup script below on every worker of {cloud.node_id} over "
                "`gcloud compute tpus tpu-vm ssh --worker=all`; the node is never deleted."
            ]
        elif cloud.provisioning == "queued":
            from runner.backends.queued import dry_run_request

            parts = dry_run_request(plan)
        else:
            parts = [
                f"Request: POST /v2/projects/{cloud.project}/locations/{zone}/nodes?nodeId={cloud.node_id}",
                dumps_request(body),
            ]
        workdir = job.working_directory(plan.spec.image, process=False, cwd=Path.cwd())
        per_worker = "the startup script sets each worker's RUNNER_WORKER_ID" + (
            ", and MEGASCALE_* from the VM's tpu-env" if cloud.slices > 1 else ""
        )
        parts += [
            "\n" + job.job_text(plan.spec.command, plan.env, workdir, per_worker=per_worker),
            "\nstartup-script (runs as root on every worker at boot; JOB_ENV_B64 is the environment above):",
            body["metadata"]["startup-script"].rstrip(),
        ]
        return "\n".join(parts)

    # -- provision --------------------------------------------------------------------------------------------

    def provision(self, plan: Plan, on_handle: Callable[[TpuVmHandle], None]) -> TpuVmHandle:
        """Create the node in the first zone with capacity, in the spec's order, backing off between attempts
        and cycling through the zones for up to retries.capacity_wait. Quota, permission and request errors stop
        at once: no other zone fixes those. `on_handle` gets each node's handle before its create request is sent,
        so that a runner killed at any moment has recorded what it may have created."""
        cloud = plan.cloud
        assert cloud is not None
        if cloud.attach_node:
            handle = self._attach(plan)
            on_handle(handle)
            return handle
        if cloud.provisioning == "queued":
            from runner.backends.queued import QueuedResources

            return QueuedResources(self).provision(plan, on_handle)
        give_up_at = time.monotonic() + plan.spec.retries.capacity_wait
        backoff = self.backoff_s
        node_id = cloud.node_id
        last: NoCapacity | None = None
        while True:
            for zone in cloud.zones:
                try:
                    try:
                        return self._create(plan, zone, node_id, on_handle)
                    except NameTaken as taken:
                        self.say(f"{taken}: this run's node is named {taken.new_id} instead")
                        node_id = taken.new_id
                        return self._create(plan, zone, node_id, on_handle)
                except NameTaken as taken:
                    raise AlreadyExists(f"{taken}, and so does the new name", hint="submit again") from None
                except NoCapacity as exc:
                    last = exc
                if time.monotonic() + backoff > give_up_at and zone == cloud.zones[-1]:
                    raise NoCapacity(
                        f"no capacity for {cloud.accelerator.name} in {', '.join(cloud.zones)}", hint=last.hint
                    ) from last
                self.say(f"{zone}: no capacity for {cloud.accelerator.name}; next attempt in {backoff:.0f}s")
                time.sleep(backoff)
                backoff = min(backoff * 2, 60.0)

    def _create(self, plan: Plan, zone: str, node_id: str, on_handle: Callable[[TpuVmHandle], None]) -> TpuVmHandle:
        cloud = plan.cloud
        assert cloud is not None
        handle = TpuVmHandle(cloud.project, zone, node_id, created=True, nonce=plan.nonce)
        on_handle(handle)
        self.say(f"creating TPU node {node_id} ({cloud.accelerator.name}) in {zone}")
        operation: str | None = None
        try:
            operation = self.api.create_node(cloud.project, zone, node_id, node_request(plan, zone, node_id))
        except AlreadyExists:
            # Ours when a retried request finds what its first try created; anyone else's is never touched.
            node = self.api.get_node(cloud.project, zone, node_id)
            if node is None or not self._ours(node, handle):
                owner = dict(node.labels).get(LABEL_RUN, "not a tpu-runner node") if node is not None else "gone"
                raise NameTaken(node_id, owner) from None
        except BaseException:
            # The request may have gone through before the error (a dropped answer, Ctrl-C): whatever of ours
            # exists is deleted; a node that is not ours is left alone.
            self.discard(handle)
            raise
        try:
            self._ready_at[node_id] = self._wait_ready(handle, operation, deadline=plan.deadline)
            return handle
        except BaseException:
            self.discard(handle)
            raise

    @staticmethod
    def _ours(node: Any, handle: TpuVmHandle) -> bool:
        return owned(dict(node.labels), handle)

    def _wait_ready(self, handle: TpuVmHandle, operation: str | None, *, deadline: float) -> float | None:
        """Until the create operation is done and the node READY, showing each state; polls every second at first,
        then every poll_s (a TPU VM takes a minute or more to create). The operation is read for its outcome (a
        stockout or a refusal is only told there); the node for its state. Returns when the node became READY by
        the API's clock (the operation's end), when it says so: the start of what the run is billed for."""
        t0 = time.monotonic()
        last = None
        done = operation is None
        ended_at: float | None = None
        while True:
            if not done and operation is not None:
                op = self.api.get_operation(operation, project=handle.project, zone=handle.zone)
                done, ended_at = op.done, op.ended_at
                if op.failure is not None:
                    raise explain(
                        op.failure, f"create TPU node {handle.node_id}", project=handle.project, zone=handle.zone
                    )
            node = self.api.get_node(handle.project, handle.zone, handle.node_id)
            state = node.state.name if node is not None else ("CREATED" if done else "PENDING")
            if state != last:
                self.say(f"node {handle.node_id}: {state} ({time.monotonic() - t0:.0f}s)")
                last = state
            if state == "READY" or (done and node is None):
                return ended_at  # created (a job short enough may already have deleted its node: the watch sees it)
            if state in ("PREEMPTED", "TERMINATED"):
                # Taken back before the job could start: a preemption, which the runner retries like any other.
                raise Preempted(
                    f"node {handle.node_id} was {state} as soon as it was created",
                    hint="Spot capacity is short here: list more zones, or drop accelerator.spot",
                )
            if state in ("STOPPED", "STOPPING"):
                raise BackendError(f"node {handle.node_id} went {state} while being created")
            if time.time() > deadline:
                # A slow create is waited for, not failed: only the run's own deadline (max_runtime) ends the wait.
                raise BackendError(
                    f"node {handle.node_id} was not READY when the run's max_runtime ran out",
                    hint="raise teardown.max_runtime, or list other zones",
                )
            time.sleep(min(self.poll_s, 1.0 + (time.monotonic() - t0) / 10))

    def discard(self, handle: TpuVmHandle) -> None:
        """Delete what this attempt created, and only that: a node (or queued resource) carrying this run's nonce."""
        try:
            with signals_deferred(self.say):  # a second Ctrl-C must not leave the half-created node behind
                if handle.queued_resource:
                    from runner.backends import queued

                    qr = self.api.get_queued_resource(
                        queued.queued_name(handle), project=handle.project, zone=handle.zone
                    )
                    if qr is not None and owned(queued.labels_of(qr), handle):
                        self._delete(handle, announce=True)
                    return
                node = self.api.get_node(handle.project, handle.zone, handle.node_id)
                if node is not None and self._ours(node, handle):
                    self._delete(handle, announce=False)
        except BackendError as exc:
            self.say(
                f"warning: could not make sure {self._what(handle)} in {handle.zone} is deleted: {exc}; "
                "`runner down RUN` or `runner gc` will"
            )

    # -- attach -----------------------------------------------------------------------------------------------

    def ssh_argv(self, handle: TpuVmHandle, command: str) -> list[str]:
        return [
            "gcloud",
            "compute",
            "tpus",
            "tpu-vm",
            "ssh",
            handle.node_id,
            f"--zone={handle.zone}",
            f"--project={handle.project}",
            "--worker=all",
            f"--command={command}",
        ]

    def _attach(self, plan: Plan) -> TpuVmHandle:
        cloud = plan.cloud
        assert cloud is not None and cloud.attach_node
        zone = cloud.zones[0]
        node = self.api.get_node(cloud.project, zone, cloud.attach_node)
        if node is None:
            raise BackendError(
                f"TPU node {cloud.attach_node} does not exist in {zone}",
                hint="check accelerator.node and accelerator.zone",
            )
        if node.state.name != "READY":
            raise BackendError(f"TPU node {cloud.attach_node} is {node.state.name}, not READY")
        if node.accelerator_type != cloud.accelerator.name:
            raise BackendError(
                f"TPU node {cloud.attach_node} is a {node.accelerator_type}, the spec says {cloud.accelerator.name}",
                hint="set accelerator.type to match the node",
            )
        script = base64.b64encode(bootstrap.render(plan, zone).encode()).decode()
        # The script travels base64-encoded: nothing of it is interpreted by the remote login shell.
        remote = (
            f"echo {script} | base64 -d > /tmp/tpu-runner-bootstrap.sh && sudo -E bash /tmp/tpu-runner-bootstrap.sh"
        )
        out = runner_home() / "runs" / f"{plan.run_id}.ssh.log"
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            with out.open("ab") as log:
                proc = subprocess.Popen(
                    self.ssh_argv(TpuVmHandle(cloud.project, zone, cloud.attach_node, created=False), remote),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        except FileNotFoundError as exc:
            raise BackendError("attach mode needs the gcloud CLI", hint="install the Google Cloud SDK") from exc
        self.say(f"attached to {cloud.attach_node}: the bootstrap runs on every worker over ssh (log: {out})")
        return TpuVmHandle(cloud.project, zone, cloud.attach_node, created=False, ssh_pid=proc.pid)

    # -- watch / teardown -------------------------------------------------------------------------------------

    def handle_from_dict(self, data: dict[str, Any]) -> TpuVmHandle:
        return handle_from(TpuVmHandle, data)

    def status(self, handle: TpuVmHandle) -> MachineState:
        return self.observe(handle)[0]

    def observe(self, handle: TpuVmHandle) -> tuple[MachineState, str | None]:
        if handle.queued_resource:
            from runner.backends import queued

            where = dict(project=handle.project, zone=handle.zone)
            qr = self.api.get_queued_resource(queued.queued_name(handle), **where)
            return queued.queued_state(qr), queued.state_of(qr)
        node = self.api.get_node(handle.project, handle.zone, handle.node_id)
        state, native = machine_state(node), None if node is None else str(node.state.name)
        if not handle.created and state == MachineState.RUNNING and handle.ssh_pid:
            # Attached: the node stays; the job is over when the ssh session that ran it is.
            return (MachineState.RUNNING if container.process_alive(handle.ssh_pid) else MachineState.GONE), native
        return state, native

    def ready_at(self, handle: TpuVmHandle) -> float | None:
        return self._ready_at.get(handle.node_id)

    def describe_handle(self, handle: TpuVmHandle) -> str:
        return f"{self._what(handle)} in {handle.zone}"

    def delete_hint(self, handle: TpuVmHandle) -> str:
        return self._delete_hint(handle)

    def console_hint(self, handle: TpuVmHandle) -> str:
        """Where to read what a VM did at boot: its startup-script's journal (google-startup-scripts.service)."""
        return (
            f"gcloud compute tpus tpu-vm ssh {handle.node_id} --zone={handle.zone} --project={handle.project} "
            "--worker=all --command='sudo journalctl -u google-startup-scripts.service --no-pager | tail -50'"
        )

    def teardown(self, handle: TpuVmHandle, *, grace_s: float = 30.0, wait_s: float = 300.0) -> bool:
        """Delete the node (a queued resource's as a whole: the queued resource, with force) and confirm it is gone,
        whoever deleted it: this call, or its VM when the job ended. A second Ctrl-C while waiting for the
        confirmation stops the wait (the delete request stands)."""
        if not handle.created:
            self._stop_attached(handle, grace_s)
            return True
        return self._delete(handle, announce=True, wait_s=wait_s)

    @staticmethod
    def _what(handle: TpuVmHandle) -> str:
        if handle.queued_resource:
            return f"queued resource {handle.queued_resource} (and any node it holds)"
        return f"TPU node {handle.node_id}"

    def _read_state(self, handle: TpuVmHandle) -> str | None:
        """The state name of what the handle names; None once it is gone."""
        if handle.queued_resource:
            from runner.backends import queued

            where = dict(project=handle.project, zone=handle.zone)
            return queued.state_of(self.api.get_queued_resource(queued.queued_name(handle), **where))
        node = self.api.get_node(handle.project, handle.zone, handle.node_id)
        return None if node is None else str(node.state.name)

    def _request_delete(self, handle: TpuVmHandle) -> str | None:
        if handle.queued_resource:
            from runner.backends import queued

            where = dict(project=handle.project, zone=handle.zone)
            return self.api.delete_queued_resource(queued.queued_name(handle), **where)  # force: nodes too
        return self.api.delete_node(handle.project, handle.zone, handle.node_id)

    def _delete(self, handle: TpuVmHandle, *, announce: bool, wait_s: float | None = None) -> bool:
        """Request the deletion, read its operation, and wait until it is gone. A failed delete operation is
        requested again (up to delete_retries) when the failure is transient, else reported at once. What is found
        DELETING by someone else's request (its VM's own) is watched, and deleted again if that deletion fails and
        it comes back. Returns False when it is still there after wait_s (default delete_timeout_s) or a second
        interrupt cut the wait short, after saying what is left and how to delete it."""
        wait_s = self.delete_timeout_s if wait_s is None else wait_s
        t0 = time.monotonic()
        where = dict(project=handle.project, zone=handle.zone)
        what = self._what(handle)
        operation: str | None = None
        attempts = 0
        announced = False
        while True:
            state = self._read_state(handle)
            if state is None:
                break
            if operation is None and state != "DELETING":
                if attempts > self.delete_retries:
                    raise BackendError(
                        f"{what} came back {state} after {attempts} deletion(s)", hint=self._delete_hint(handle)
                    )
                attempts += 1
                operation = self._request_delete(handle)
                if announce and not announced:
                    self.say(f"deleting {what}")
                    announced = True
            elif operation is None and not announced:
                self.say(f"{what} is being deleted already")
                announced = True
            if operation is not None:
                op = self.api.get_operation(operation, **where)
                if op.failure is not None:
                    error = explain(op.failure, f"delete {what}", **where)
                    if not op.failure.transient or attempts > self.delete_retries:
                        raise BackendError(
                            f"{error.message}; it is still there", hint=self._delete_hint(handle)
                        ) from error
                    self.say(f"deleting {what} failed ({op.failure.code}); asking again")
                    operation = None  # the next round asks again, once it is out of DELETING
                elif op.done:
                    operation = None  # the API says deleted; the read confirms it
            waited = time.monotonic() - t0
            if hurry.is_set() or waited > wait_s:
                why = "stopped waiting" if hurry.is_set() else f"still there after {waited:.0f}s"
                kind = "queued-resources" if handle.queued_resource else "tpu-vm"
                self.say(
                    f"{why}: {what} in {handle.zone} is being deleted but may still bill until it is gone. "
                    f"Check: gcloud compute tpus {kind} describe {handle.queued_resource or handle.node_id} "
                    f"--zone={handle.zone}; {self._delete_hint(handle)} (or `runner gc`)"
                )
                return False
            time.sleep(min(self.poll_s, 2.0))
        if announce:
            self.say(f"{what} is gone ({time.monotonic() - t0:.0f}s)")
        return True

    @staticmethod
    def _delete_hint(handle: TpuVmHandle) -> str:
        if handle.queued_resource:
            return (
                f"delete it yourself: gcloud compute tpus queued-resources delete {handle.queued_resource} "
                f"--zone={handle.zone} --project={handle.project} --force"
            )
        return (
            f"delete it yourself: gcloud compute tpus tpu-vm delete {handle.node_id} --zone={handle.zone} "
            f"--project={handle.project}"
        )

    def _stop_attached(self, handle: TpuVmHandle, grace_s: float) -> None:
        if handle.ssh_pid and container.process_alive(handle.ssh_pid):
            stop = f"sudo docker stop --time {int(grace_s)} {shlex.quote(contract.JOB_CONTAINER)} || true"
            subprocess.run(self.ssh_argv(handle, stop), capture_output=True, timeout=grace_s + 60, check=False)
            container.stop_group(handle.ssh_pid, grace_s=10)
        self.say(f"left TPU node {handle.node_id} running: it was attached, not created by this run")


def dumps_request(body: dict[str, Any]) -> str:
    """The request body for display: the startup script shown separately, the rest as JSON."""
    shown = json.loads(json.dumps(body))
    shown["metadata"]["startup-script"] = f"<{len(body['metadata']['startup-script'])} bytes, shown below>"
    return json.dumps(shown, indent=2)
