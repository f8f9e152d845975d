"""Attached nodes (accelerator.node): an existing TPU VM runs the same bootstrap over `gcloud compute tpus tpu-vm
ssh --worker=all`, and is never deleted: teardown stops the job's container and leaves the node running."""

from __future__ import annotations

import base64
import shlex
import subprocess

from runner import contract
from runner.backends.base import MachineState
from runner.backends.tpu_vm.common import Context
from runner.backends.tpu_vm.handles import AttachedHandle
from runner.backends.tpu_vm.nodes import machine_state
from runner.backends.tpu_vm.requests import target_of
from runner.errors import BackendError
from runner.launch import bootstrap
from runner.plan.planner import Plan
from runner.watch.runs import runner_home
from runner.worker import processes


def ssh_argv(handle: AttachedHandle, command: str) -> list[str]:
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


class Attached:
    """The attach flow of one TpuVmBackend."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def provision(self, plan: Plan) -> AttachedHandle:
        target = target_of(plan)
        node_id = target.machine_id
        zone = target.zones[0]
        node = self.ctx.api.get_node(target.project, zone, node_id)
        if node is None:
            raise BackendError(
                f"TPU node {node_id} does not exist in {zone}", hint="check accelerator.node and accelerator.zone"
            )
        if node.state.name != "READY":
            raise BackendError(f"TPU node {node_id} is {node.state.name}, not READY")
        if node.accelerator_type != target.accelerator.name:
            raise BackendError(
                f"TPU node {node_id} is a {node.accelerator_type}, the spec says {target.accelerator.name}",
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
                    ssh_argv(AttachedHandle(target.project, zone, node_id), remote),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        except FileNotFoundError as exc:
            raise BackendError("attach mode needs the gcloud CLI", hint="install the Google Cloud SDK") from exc
        self.ctx.say(f"attached to {node_id}: the bootstrap runs on every worker over ssh (log: {out})")
        return AttachedHandle(target.project, zone, node_id, ssh_pid=proc.pid)

    @staticmethod
    def owns(handle: AttachedHandle) -> bool:
        return False  # attached, never created: never deleted

    def observe(self, handle: AttachedHandle) -> tuple[MachineState, str | None]:
        node = self.ctx.api.get_node(handle.project, handle.zone, handle.node_id)
        state, native = machine_state(node), None if node is None else str(node.state.name)
        if state == MachineState.RUNNING and handle.ssh_pid:
            # The node stays; the job is over when the ssh session that ran it is.
            return (MachineState.RUNNING if processes.process_alive(handle.ssh_pid) else MachineState.GONE), native
        return state, native

    @staticmethod
    def what(handle: AttachedHandle) -> str:
        return f"TPU node {handle.node_id}"

    @staticmethod
    def delete_hint(handle: AttachedHandle) -> str:
        return "nothing to delete: the node was attached, not created by this run"

    def teardown(self, handle: AttachedHandle, *, grace_s: float, wait_s: float) -> bool:
        """Stop the job's container; the node is left running (True: nothing of this run's is left to delete)."""
        if handle.ssh_pid and processes.process_alive(handle.ssh_pid):
            stop = f"sudo docker stop --time {int(grace_s)} {shlex.quote(contract.JOB_CONTAINER)} || true"
            subprocess.run(ssh_argv(handle, stop), capture_output=True, timeout=grace_s + 60, check=False)
            processes.stop_group(handle.ssh_pid, grace_s=10)
        self.ctx.say(f"left TPU node {handle.node_id} running: it was attached, not created by this run")
        return True
