"""The local backend (emulation mode): the job's container on this machine, CPU or GPU, no cloud.

The "machine" is the container (or the entrypoint process); provisioning starts it, teardown stops it. The TPU
strategy resolution inside falls back to GPU or CPU, so the same job runs unchanged.

With `--workers N` (the multi-worker rehearsal) it starts N entrypoint processes, one per "host" of a pod slice:
each with its RUNNER_WORKER_ID, writing its own logs/worker-N.log, heartbeat and exit record into the one run
directory, so the runner's pod-slice logic (per-worker verdicts, prefixed logs) applies unchanged. Each also gets
the addresses of the others, picked free on 127.0.0.1 at every launch (every attempt has its own): TF_CONFIG for
TensorFlow's MultiWorkerMirroredStrategy (tensorflow.org/tutorials/distribute/multi_worker_with_keras),
RUNNER_COORDINATOR_ADDRESS, which a bare jax.distributed.initialize() reads through the runner's cluster
(runner.train.jaxcluster), and KERAS_DISTRIBUTION_JOB_ADDRESSES / _NUM_PROCESSES / _PROCESS_ID for
keras.distribution.initialize(): both connect the JAX processes (on the CPU over gloo, JAX's default CPU
collectives). A stop reaches every worker at the same moment, as a preemption reaches every host of a slice.
"""

from __future__ import annotations

import json
import secrets
import socket
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from runner import contract
from runner.backends import container
from runner.backends.base import Backend, MachineState, handle_from
from runner.backends.local import secrets as local_secrets
from runner.errors import BackendError
from runner.launch import job
from runner.plan.planner import Plan
from runner.watch.runs import runner_home
from runner.worker import processes


@dataclass(frozen=True)
class LocalHandle:
    mode: container.Mode
    pid: int
    pgid: int
    start_ticks: int | None
    container_name: str
    output: str  # the supervisor's own stdout/stderr (before and around the job's log)
    others: list[list[int]] = field(default_factory=list)  # [pid, start ticks] of workers 1..N-1 (--workers N)
    session: str | None = None  # container.SESSION's value in every process of this run (a process run)
    secrets_dir: str | None = None  # where the job's secrets as files are (a memory file system), removed at teardown

    def processes(self) -> list[tuple[int, int | None]]:
        """(pid, start ticks) of every worker's process, worker 0's first; each leads its own process group."""
        return [(self.pid, self.start_ticks), *((pid, ticks or None) for pid, ticks in self.others)]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class LocalBackend(Backend[LocalHandle]):
    name = "local"
    ephemeral = True

    def __init__(self, prefer: container.Prefer | None = None, say: Callable[[str], None] = print) -> None:
        self.prefer = prefer
        self.say = say
        self._launches: dict[str, container.Launch] = {}
        self.procs: dict[int, Any] = {}  # pid -> Popen, while this process is the parent

    def launch_for(self, plan: Plan) -> container.Launch:
        if plan.run_id not in self._launches:
            from runner.train import startcache

            data_dir = Path(plan.env[contract.DATA_DIR]) if contract.DATA_DIR in plan.env else None
            self._launches[plan.run_id] = container.plan_launch(
                plan.spec.image,
                plan.env,
                name=f"runner-{plan.run_id}",
                data_dir=data_dir,
                storage_root=Path(plan.storage_url) if plan.storage_is_local else None,
                cache_dir=startcache.cache_dir(),
                # Several workers talk over 127.0.0.1 and share the run directory: processes, not containers.
                prefer="process" if plan.num_workers > 1 else self.prefer,
            )
        return self._launches[plan.run_id]

    def describe(self, plan: Plan) -> list[tuple[str, str]]:
        launch = self.launch_for(plan)
        return [
            ("runs as", launch.reason),
            ("entrypoint", " ".join(launch.argv)),
            *job.plan_rows(plan, process=launch.mode == "process"),
        ]

    def dry_run(self, plan: Plan) -> str:
        """What the job runs: its command, working directory and environment."""
        launch = self.launch_for(plan)
        workdir = job.working_directory(plan.spec.image, process=launch.mode == "process", cwd=Path.cwd())
        return job.job_text(plan.spec.command, plan.env, workdir, secrets=plan.secrets)

    def provision(self, plan: Plan, on_handle: Callable[[LocalHandle], None]) -> LocalHandle:
        """Start the container or process (one per worker with --workers). Starting is one system call with nothing
        to leak before it, so the handle is reported right after it (after the last one, for several workers: a
        failed start stops the ones before it)."""
        launch = self.launch_for(plan)
        folder = None
        if plan.secrets:  # read now, kept in memory (and files on a tmpfs): never in the plan or the run record
            secret_env, files, folder = local_secrets.hand_over(plan)
            launch = self._with_secrets(plan, launch, secret_env, files)
        output = runner_home() / "runs" / f"{plan.run_id}.out"
        session = f"{plan.run_id}:{secrets.token_hex(4)}" if launch.mode == "process" else None
        if session is not None:
            launch = replace(launch, env={**launch.env, container.SESSION: session})
        envs = worker_envs(plan.num_workers)
        started: list[Any] = []
        try:
            for worker, extra in enumerate(envs):
                each = replace(launch, env={**launch.env, **extra}) if extra else launch
                out = output if worker == 0 else output.with_name(f"{plan.run_id}-worker-{worker}.out")
                started.append(container.start(each, out))
        except OSError as exc:
            for proc in started:
                processes.stop_group(proc.pid, 5.0)
                proc.wait()
            local_secrets.forget(str(folder) if folder else None)
            raise BackendError(f"cannot start {launch.argv[0]}: {exc.strerror}") from exc
        for proc in started:
            self.procs[proc.pid] = proc
        first = started[0]
        others = [[proc.pid, processes.start_ticks(proc.pid) or 0] for proc in started[1:]]
        handle = LocalHandle(
            launch.mode,
            first.pid,
            first.pid,
            processes.start_ticks(first.pid),
            launch.name,
            str(output),
            others,
            session,
            str(folder) if folder else None,
        )
        on_handle(handle)
        return handle

    def _with_secrets(
        self, plan: Plan, launch: container.Launch, env: dict[str, str], files: list[Path]
    ) -> container.Launch:
        """The launch with the job's secrets: variables (by name in a container: never on its argv) and files."""
        if launch.mode == "process":
            return replace(launch, env={**launch.env, **env})
        data_dir = Path(plan.env[contract.DATA_DIR]) if contract.DATA_DIR in plan.env else None
        return container.plan_launch(
            plan.spec.image,
            {**plan.env, **env},
            name=launch.name,
            data_dir=data_dir,
            storage_root=Path(plan.storage_url) if plan.storage_is_local else None,
            prefer="container",
            secret_files=files,
        )

    def console_hint(self, handle: LocalHandle) -> str:
        return f"the supervisor's own output: {handle.output}"

    def handle_from_dict(self, data: dict[str, Any]) -> LocalHandle:
        return handle_from(LocalHandle, data)

    def _alive(self, pid: int, ticks: int | None) -> bool:
        proc = self.procs.get(pid)
        return proc.poll() is None if proc is not None else processes.process_alive(pid, ticks)

    def status(self, handle: LocalHandle) -> MachineState:
        """RUNNING while any worker's process runs (the run directory says how each worker ended)."""
        alive = any(self._alive(pid, ticks) for pid, ticks in handle.processes())
        return MachineState.RUNNING if alive else MachineState.GONE

    def teardown(self, handle: LocalHandle, *, grace_s: float = 30.0, wait_s: float = 300.0) -> bool:
        """Stop the container or every worker's process group and reap them: SIGTERM to every worker at the same
        moment, as a preemption reaches every host (one after another, a job's collective save waited for a worker
        not told yet), SIGKILL what is left after grace_s; then whatever the job started outside those groups (a
        daemon: setsid, double forks), found by the session marker every process of the run carries, and said."""
        if handle.mode != "process":
            container.stop_container(handle.mode, handle.container_name, grace_s)
        groups = [  # each process leads its own group (pgid == pid)
            pid
            for pid, ticks in handle.processes()
            if processes.process_alive(pid, ticks) or processes.group_alive(pid)
        ]
        processes.stop_groups(groups, grace_s)
        for pid, _ticks in handle.processes():
            proc = self.procs.pop(pid, None)
            if proc is not None:
                proc.wait()  # reap it: a stopped run leaves not even a zombie
        local_secrets.forget(handle.secrets_dir)
        if handle.session:
            left = container.stop_marked(container.SESSION, handle.session, min(grace_s, 10.0))
            if left:
                self.say(
                    f"stopped {len(left)} process(es) the job left running outside its process group "
                    f"(daemons: setsid or a double fork): {'; '.join(left)}"
                )
        return True


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports free on `host` now: each bound to port 0 (the kernel picks), all held open until the
    last is picked so none repeats, then released for the workers to bind a moment later."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for sock in socks:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in socks]


def worker_envs(workers: int) -> list[dict[str, str]]:
    """What each of `workers` local processes adds to the job's environment: nothing for one; for several, its
    worker id and the cluster's addresses (TF_CONFIG, the runner's coordinator, and keras.distribution's for JAX),
    worker 0 the chief and the JAX coordinator. Fresh ports every call: a retry or a resume never meets the old
    coordinator."""
    if workers <= 1:
        return [{}]
    ports = free_ports(workers + 1)
    tf_hosts = [f"127.0.0.1:{port}" for port in ports[:workers]]
    coordinator = f"127.0.0.1:{ports[workers]}"
    return [
        {
            contract.WORKER_ID: str(worker),
            contract.NUM_WORKERS: str(workers),
            "TF_CONFIG": json.dumps({"cluster": {"worker": tf_hosts}, "task": {"type": "worker", "index": worker}}),
            contract.COORDINATOR_ADDRESS: coordinator,
            "KERAS_DISTRIBUTION_JOB_ADDRESSES": coordinator,
            "KERAS_DISTRIBUTION_NUM_PROCESSES": str(workers),
            "KERAS_DISTRIBUTION_PROCESS_ID": str(worker),
        }
        for worker in range(workers)
    ]
