"""The Cloud TPU VM backend: create a node whose startup script runs the job's container, watch it, delete it.

Launch is part of provisioning: the rendered bootstrap (infra/startup-script.sh) travels as the node's
`startup-script` metadata and runs on every worker at boot. Attach mode runs the same script on an existing node
over `gcloud compute tpus tpu-vm ssh --worker=all` and never deletes that node.
"""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from runner import bootstrap, container
from runner.backends.base import MachineState
from runner.backends.tpu_api import CLOUD_PLATFORM, TpuApi, explain
from runner.errors import BackendError, NoCapacity, Preempted
from runner.interrupts import signals_deferred
from runner.plan import Plan
from runner.records import runner_home

LABEL_MANAGED = "managed-by"
LABEL_RUN = "tpu-runner-run"
LABEL_JOB = "tpu-runner-job"
LABEL_DEADLINE = "tpu-runner-deadline"
MANAGED_BY = "tpu-runner"
JOB_CONTAINER = "tpu-runner-job"  # the container name the bootstrap gives the job

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def node_request(plan: Plan, zone: str) -> dict[str, Any]:
    """The Node resource to create, as JSON: what --dry-run prints is exactly what is sent."""
    cloud = plan.cloud
    assert cloud is not None
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
        },
        "metadata": {"startup-script": bootstrap.render(plan, zone), "tpu-runner-run-dir": plan.run_dir},
        "schedulingConfig": scheduling,
        "serviceAccount": service_account,
        # As gcloud does by default: the VM reaches Artifact Registry and Cloud Storage without Cloud NAT.
        "networkConfig": {"enableExternalIps": True},
    }


class TpuVmBackend:
    name = "tpu-vm"
    ephemeral = False

    def __init__(
        self,
        api: TpuApi | None = None,
        *,
        say: Callable[[str], None] = print,
        poll_s: float = 5.0,
        delete_timeout_s: float = 600.0,
        backoff_s: float = 5.0,
    ) -> None:
        self.api = api or TpuApi()
        self.say = say
        self.poll_s = poll_s
        self.delete_timeout_s = delete_timeout_s
        self.backoff_s = backoff_s

    # -- plan -------------------------------------------------------------------------------------------------

    def describe(self, plan: Plan) -> list[tuple[str, str]]:
        cloud = plan.cloud
        assert cloud is not None
        accel = cloud.accelerator
        acc = plan.spec.accelerator
        kind = "Spot" if acc.spot else "reserved" if acc.reserved else "on-demand"
        hours = plan.spec.teardown.max_runtime / 3600
        from runner import catalog

        prices = catalog.prices_info()
        rows = [
            ("project", cloud.project),
            ("zones", " -> ".join(cloud.zones) + ("  (tried in order)" if len(cloud.zones) > 1 else "")),
            ("node", cloud.node_id + ("  (existing: attach, never delete)" if cloud.attach_node else "")),
            ("accelerator", f"{accel.name}: {accel.chips} chips on {accel.hosts} host(s), {kind}"),
            ("runtime", cloud.runtime_version),
            ("job runs on", "every worker" if cloud.trainer_workers == "all" else f"worker {cloud.trainer_workers}"),
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
        rows.append(("teardown", "never (attached node)" if cloud.attach_node else plan.spec.teardown.policy))
        return rows

    # -- provision --------------------------------------------------------------------------------------------

    def provision(self, plan: Plan) -> TpuVmHandle:
        """Create the node in the first zone with capacity, in the spec's order, backing off between attempts
        and cycling through the zones for up to retries.capacity_wait. Quota, permission and request errors stop
        at once: no other zone fixes those."""
        cloud = plan.cloud
        assert cloud is not None
        if cloud.attach_node:
            return self._attach(plan)
        give_up_at = time.monotonic() + plan.spec.retries.capacity_wait
        backoff = self.backoff_s
        last: NoCapacity | None = None
        while True:
            for zone in cloud.zones:
                try:
                    return self._create(plan, zone)
                except NoCapacity as exc:
                    last = exc
                if time.monotonic() + backoff > give_up_at and zone == cloud.zones[-1]:
                    raise NoCapacity(
                        f"no capacity for {cloud.accelerator.name} in {', '.join(cloud.zones)}", hint=last.hint
                    ) from last
                self.say(f"{zone}: no capacity for {cloud.accelerator.name}; next attempt in {backoff:.0f}s")
                time.sleep(backoff)
                backoff = min(backoff * 2, 60.0)

    def _create(self, plan: Plan, zone: str) -> TpuVmHandle:
        cloud = plan.cloud
        assert cloud is not None
        handle = TpuVmHandle(cloud.project, zone, cloud.node_id, created=True)
        self.say(f"creating TPU node {cloud.node_id} ({cloud.accelerator.name}) in {zone}")
        try:
            operation = self.api.create_node(cloud.project, zone, cloud.node_id, node_request(plan, zone))
            self._wait_ready(handle, operation, deadline=plan.deadline)
            return handle
        except BaseException:
            # A stockout, an error, Ctrl-C or a bug while creating: whatever was asked for is deleted.
            self._discard(handle)
            raise

    def _wait_ready(self, handle: TpuVmHandle, operation: Any, *, deadline: float) -> None:
        """Until the create operation is done and the node READY, showing each state; polls every second at first,
        then every poll_s (a TPU VM takes a minute or more to create)."""
        t0 = time.monotonic()
        last = None
        while True:
            done = operation.done()
            if done and (error := operation.exception()) is not None:
                raise explain(
                    error, f"create TPU node {handle.node_id}", project=handle.project, zone=handle.zone
                ) from error
            node = self.api.get_node(handle.project, handle.zone, handle.node_id)
            state = node.state.name if node is not None else ("CREATED" if done else "PENDING")
            if state != last:
                self.say(f"node {handle.node_id}: {state} ({time.monotonic() - t0:.0f}s)")
                last = state
            if state == "READY" or (done and node is None):
                return  # created (a job short enough may already have deleted its node: the watch sees it end)
            if state in ("PREEMPTED", "TERMINATED"):
                # Taken back before the job could start: a preemption, which the runner retries like any other.
                raise Preempted(
                    f"node {handle.node_id} was {state} as soon as it was created",
                    hint="Spot capacity is short here: list more zones, or drop accelerator.spot",
                )
            if state == "STOPPED":
                raise BackendError(f"node {handle.node_id} went STOPPED while being created")
            if time.time() > deadline:
                # A slow create is waited for, not failed: only the run's own deadline (max_runtime) ends the wait.
                raise BackendError(
                    f"node {handle.node_id} was not READY when the run's max_runtime ran out",
                    hint="raise teardown.max_runtime, or list other zones",
                )
            time.sleep(min(self.poll_s, 1.0 + (time.monotonic() - t0) / 10))

    def _discard(self, handle: TpuVmHandle) -> None:
        try:
            with signals_deferred(self.say):  # a second Ctrl-C must not leave the half-created node behind
                self._delete(handle, announce=False)
        except BackendError as exc:
            self.say(f"warning: could not delete {handle.node_id} in {handle.zone}: {exc}; `runner gc` will find it")

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
        return TpuVmHandle(**data)

    def status(self, handle: TpuVmHandle) -> MachineState:  # type: ignore[override]
        state = machine_state(self.api.get_node(handle.project, handle.zone, handle.node_id))
        if not handle.created and state == MachineState.RUNNING and handle.ssh_pid:
            # Attached: the node stays; the job is over when the ssh session that ran it is.
            return MachineState.RUNNING if container.process_alive(handle.ssh_pid) else MachineState.GONE
        return state

    def teardown(self, handle: TpuVmHandle, *, grace_s: float = 30.0) -> None:  # type: ignore[override]
        """Delete the node and confirm it is gone (whoever deleted it: this call, or its VM when the job ended)."""
        if not handle.created:
            self._stop_attached(handle, grace_s)
            return
        self._delete(handle, announce=True)

    def _delete(self, handle: TpuVmHandle, *, announce: bool) -> None:
        t0 = time.monotonic()
        requested = self.api.delete_node(handle.project, handle.zone, handle.node_id)
        if requested and announce:
            self.say(f"deleting TPU node {handle.node_id}")
        while self.api.get_node(handle.project, handle.zone, handle.node_id) is not None:
            if time.monotonic() - t0 > self.delete_timeout_s:
                raise BackendError(
                    f"node {handle.node_id} still exists {self.delete_timeout_s:.0f}s after its deletion was requested",
                    hint="check it in the console; `runner gc` retries",
                )
            time.sleep(min(self.poll_s, 2.0))
        if announce:
            by = f"{time.monotonic() - t0:.0f}s" if requested else "its VM deleted it when the job ended"
            self.say(f"TPU node {handle.node_id} is gone ({by})")

    def _stop_attached(self, handle: TpuVmHandle, grace_s: float) -> None:
        if handle.ssh_pid and container.process_alive(handle.ssh_pid):
            stop = f"sudo docker stop --time {int(grace_s)} {shlex.quote(JOB_CONTAINER)} || true"
            subprocess.run(self.ssh_argv(handle, stop), capture_output=True, timeout=grace_s + 60, check=False)
            container.stop_group(handle.ssh_pid, grace_s=10)
        self.say(f"left TPU node {handle.node_id} running: it was attached, not created by this run")


def dumps_request(body: dict[str, Any]) -> str:
    """The request body for display: the startup script shown separately, the rest as JSON."""
    shown = json.loads(json.dumps(body))
    shown["metadata"]["startup-script"] = f"<{len(body['metadata']['startup-script'])} bytes, shown below>"
    return json.dumps(shown, indent=2)
