"""The local backend (emulation mode): the job's container on this machine, CPU or GPU, no cloud.

The "machine" is the container (or the entrypoint process); provisioning starts it, teardown stops it. The TPU
strategy resolution inside falls back to GPU or CPU, so the same job runs unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runner import contract
from runner.backends import container
from runner.backends.base import Backend, MachineState, handle_from
from runner.errors import BackendError
from runner.plan.planner import Plan
from runner.watch.runs import runner_home


@dataclass(frozen=True)
class LocalHandle:
    mode: container.Mode
    pid: int
    pgid: int
    start_ticks: int | None
    container_name: str
    output: str  # the supervisor's own stdout/stderr (before and around the job's log)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class LocalBackend(Backend[LocalHandle]):
    name = "local"
    ephemeral = True

    def __init__(self, prefer: container.Mode | None = None) -> None:
        self.prefer = prefer
        self._launches: dict[str, container.Launch] = {}
        self.procs: dict[int, Any] = {}  # pid -> Popen, while this process is the parent

    def launch_for(self, plan: Plan) -> container.Launch:
        if plan.run_id not in self._launches:
            data_dir = Path(plan.env[contract.DATA_DIR]) if contract.DATA_DIR in plan.env else None
            self._launches[plan.run_id] = container.plan_launch(
                plan.spec.image,
                plan.env,
                name=f"runner-{plan.run_id}",
                data_dir=data_dir,
                storage_root=Path(plan.storage_url) if plan.storage_is_local else None,
                prefer=self.prefer,
            )
        return self._launches[plan.run_id]

    def describe(self, plan: Plan) -> list[tuple[str, str]]:
        launch = self.launch_for(plan)
        return [("runs as", launch.reason), ("command", " ".join(launch.argv))]

    def dry_run(self, plan: Plan) -> str:
        """The job's environment (the command line is in the plan's rows)."""
        width = max((len(k) for k in plan.env), default=0)
        return "Job environment\n" + "\n".join(f"{k:<{width}}  {v}" for k, v in sorted(plan.env.items()))

    def provision(self, plan: Plan, on_handle: Callable[[LocalHandle], None]) -> LocalHandle:
        """Start the container or process. Starting is one system call with nothing to leak before it, so the
        handle is reported right after it."""
        launch = self.launch_for(plan)
        output = runner_home() / "runs" / f"{plan.run_id}.out"
        try:
            proc = container.start(launch, output)
        except OSError as exc:
            raise BackendError(f"cannot start {launch.argv[0]}: {exc.strerror}") from exc
        self.procs[proc.pid] = proc
        handle = LocalHandle(launch.mode, proc.pid, proc.pid, container.start_ticks(proc.pid), launch.name, str(output))
        on_handle(handle)
        return handle

    def console_hint(self, handle: LocalHandle) -> str:
        return f"the supervisor's own output: {handle.output}"

    def handle_from_dict(self, data: dict[str, Any]) -> LocalHandle:
        return handle_from(LocalHandle, data)

    def status(self, handle: LocalHandle) -> MachineState:
        proc = self.procs.get(handle.pid)
        if proc is not None:
            return MachineState.RUNNING if proc.poll() is None else MachineState.GONE
        return MachineState.RUNNING if container.process_alive(handle.pid, handle.start_ticks) else MachineState.GONE

    def teardown(self, handle: LocalHandle, *, grace_s: float = 30.0, wait_s: float = 300.0) -> bool:
        """Stop the container or process group (SIGTERM, SIGKILL after grace_s) and reap it."""
        if handle.mode == "docker":
            container.stop_container(handle.container_name, grace_s)
        if container.process_alive(handle.pid, handle.start_ticks) or container.group_alive(handle.pgid):
            container.stop_group(handle.pgid, grace_s)
        proc = self.procs.pop(handle.pid, None)
        if proc is not None:
            proc.wait()  # reap it: a stopped run leaves not even a zombie
        return True
