"""How a container runs on this machine: the one place that decides, for the local backend and emulated VMs.

With a container engine (Docker or Podman: runner.launch.engine finds it) and the image present, the image runs
under `docker run` / `podman run`, the same command line for both. Otherwise the image's entrypoint
(`python -m runner.worker`) runs as a local process with the same environment: the same supervisor, trainer and
run-directory contract, without the isolation. Either way the job is started in a new session (process group),
so a Ctrl-C in the terminal reaches the runner alone, and the runner stops the job as a whole.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from runner import contract
from runner.environ import snapshot
from runner.launch import deps
from runner.launch import engine as engines
from runner.launch.engine import Engine
from runner.worker.processes import process_alive

ENTRYPOINT = ["python", "-m", "runner.worker"]  # the image's ENTRYPOINT (docker/Dockerfile)
# In the environment of every process of a local process run, with a value of its own: what a job started outside
# its process group (setsid, a double fork: a daemon) still carries, so stopping the run finds it too.
SESSION = "RUNNER_LOCAL_SESSION"
CONTAINER_DATA_DIR = "/data"
CONTAINER_CACHE_DIR = "/cache"  # the start-up cache (runner.train.startcache), read-write: a run adds to it
# How a job runs: in a container under one of the engines (the name is the CLI that stops it), or as a process.
Mode = Literal["docker", "podman", "process"]
Prefer = Literal["container", "process"]


@dataclass(frozen=True)
class Launch:
    """A container start, fully decided: what runs, with which environment, and why in this mode."""

    mode: Mode
    argv: list[str]
    # The job's environment (in a container passed by name, -e KEY, so values stay off argv), and what the engine's
    # CLI needs besides (the project's Podman settings).
    env: dict[str, str]
    reason: str
    name: str
    mounts: list[tuple[str, str, bool]] = field(default_factory=list)  # (host, container, read_only)
    # A process run's own requirements (the job's contract.REQUIREMENTS), installed into their cache before it starts.
    install: deps.Install | None = None


def _run_quiet(argv: list[str], timeout: float = 10) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def image_present(engine: Engine, image: str) -> bool:
    try:
        return engine.run("image", "inspect", "--format", "{{.Id}}", image, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def host_gpus() -> int:
    result = _run_quiet(["nvidia-smi", "-L"]) if shutil.which("nvidia-smi") else None
    return (
        len([ln for ln in result.stdout.splitlines() if ln.startswith("GPU ")])
        if result and result.returncode == 0
        else 0
    )


def local_flags(gpus: bool) -> list[str]:
    """`docker run` options of a local run: an init process (signals, zombies), the caller's user, the GPUs."""
    flags = ["--init"]
    if hasattr(os, "getuid"):
        # Files in bind-mounted run directories belong to the user, not root.
        flags += ["--user", f"{os.getuid()}:{os.getgid()}"]
    if gpus:
        flags += ["--gpus", "all"]
    return flags


def docker_argv(
    image: str,
    name: str,
    env: dict[str, str],
    mounts: list[tuple[str, str, bool]],
    gpus: bool,
    *,
    cli: list[str] | None = None,
    flags: list[str] | None = None,
) -> list[str]:
    """`docker run` (or `podman run`: `cli`) of `image`, the job's variables passed by name, never by value.
    `flags` replaces the local ones (local_flags): the emulator's VMs pass what their startup script gave."""
    argv = [*(cli or ["docker"]), "run", "--rm", "--name", name, *(local_flags(gpus) if flags is None else flags)]
    for key in sorted(env):
        argv += ["-e", key]  # value taken from the client's environment
    for host, inside, read_only in mounts:
        argv += ["-v", f"{host}:{inside}{':ro' if read_only else ''}"]
    return [*argv, image]


def plan_launch(
    image: str,
    env: dict[str, str],
    *,
    name: str,
    data_dir: Path | None,
    storage_root: Path | None,
    prefer: Prefer | None = None,
    cache_dir: Path | None = None,
    engine: Engine | None = None,
    flags: list[str] | None = None,
    secret_files: list[Path] | None = None,
) -> Launch:
    """Decide how the job's container runs here. `prefer="process"` skips the engine even when there is one;
    `prefer="container"` makes "no engine, or no image" an error. `engine`: this one, not the one detection finds
    (an emulated VM's, with its own image store); `flags`: its `docker run` options instead of the local ones;
    `secret_files`: the job's secrets as files, mounted read-only at the same path in a container (the variable
    that names each holds that path either way); `cache_dir`: the start-up cache, mounted read-write into a
    container (a process finds it by itself)."""
    if prefer != "process":
        found = engines.Found(engine, "") if engine else engines.detect()
        if found.engine and image_present(found.engine, image):
            mounts: list[tuple[str, str, bool]] = []
            env = dict(env)
            if data_dir and data_dir.is_dir():
                mounts.append((str(data_dir), CONTAINER_DATA_DIR, True))
                env["RUNNER_DATA_DIR"] = CONTAINER_DATA_DIR
            if cache_dir and _writable_dir(cache_dir):
                mounts.append((str(cache_dir), CONTAINER_CACHE_DIR, False))
                env[contract.CACHE_DIR] = CONTAINER_CACHE_DIR
            if storage_root:
                # Same path inside and out, so RUNNER_RUN_DIR means the same in both.
                mounts.append((str(storage_root), str(storage_root), False))
            mounts += [(str(path), str(path), True) for path in secret_files or ()]
            gpus = host_gpus() if flags is None else 0
            argv = docker_argv(image, name, env, mounts, gpus > 0, cli=found.engine.command(), flags=flags)
            reason = f"{found.engine.title}, image {image}" + (f", {gpus} GPU(s)" if gpus else ", CPU")
            return Launch(found.engine.name, argv, {**env, **found.engine.settings()}, reason, name, mounts)
        why = f"image {image} is not present in {found.engine.title}" if found.engine else found.why
        if prefer == "container":
            from runner.errors import BackendError

            raise BackendError(f"cannot run in a container: {why}", hint="`make image` builds the trainer image")
    else:
        why = "--process was given"
    # The entrypoint with this interpreter: the one that has the runner and TensorFlow installed. A custom command
    # (`python my_train.py`) finds the same interpreter first on its PATH, as it would in the image, not the
    # system's Python without TensorFlow.
    argv = [sys.executable, *ENTRYPOINT[1:]]
    env = dict(env)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(
        [bin_dir, *(p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if p != bin_dir)]
    )
    if data_dir:
        env.setdefault("RUNNER_DATA_DIR", str(data_dir))
    # What the image would hold besides the runner: the job's own requirements, from their cache, never over this
    # interpreter's packages (a conflict is an error here, before anything starts).
    requirements = deps.of_env(env)
    install = deps.prepare(requirements) if requirements is not None else None
    if install is not None:
        env = install.env(env)
    reason = f"local process ({why}); commands run with {bin_dir} first on PATH"
    return Launch("process", argv, env, reason, name, install=install)


def _writable_dir(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK)


def start(launch: Launch, output: Path) -> subprocess.Popen[bytes]:
    """Start the container (or process) in a new session; its stdout and stderr go to `output`. A process run's
    requirements are installed first, unless their cache has them (the first of several workers installs)."""
    if launch.install is not None:
        deps.ensure(launch.install)
    output.parent.mkdir(parents=True, exist_ok=True)
    env = {**snapshot(), **launch.env}
    with output.open("ab") as out:
        return subprocess.Popen(
            launch.argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )


def marked_pids(variable: str, prefix: str) -> list[int]:
    """Live processes whose environment has `variable`=<a value starting with `prefix`> (Linux /proc; else []).
    A process inherits its parent's environment across setsid and double forks, so this finds what a process group
    no longer holds."""
    needle = f"{variable}={prefix}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            data = (entry / "environ").read_bytes()
        except OSError:
            continue
        if any(item.startswith(needle) for item in data.split(b"\0")):
            pid = int(entry.name)
            if pid != os.getpid() and process_alive(pid):
                found.append(pid)
    return found


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def stop_marked(variable: str, value: str, grace_s: float) -> list[str]:
    """SIGTERM every process still carrying `variable`=`value`, SIGKILL what is left after grace_s; returns what
    there was ("PID: command line"), for the caller to say. A process may fork between a listing and its signal
    (setsid(1) forks before it runs its program), so each is frozen (SIGSTOP) as it is found and the listing is
    read again until it shows no new one: a frozen process forks nothing. What a stopping process starts in its
    handler is found by the next round."""
    said: dict[int, str] = {}
    for _ in range(_STOP_ROUNDS):
        pids = _freeze_marked(variable, value, said)
        if not pids:
            break
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
                    os.kill(pid, signal.SIGCONT)
            deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
            while pids and time.monotonic() < deadline:
                time.sleep(0.05)
                pids = [pid for pid in pids if process_alive(pid)]
            if not pids:
                break
    return [f"{pid}: {line}" for pid, line in said.items()]


_STOP_ROUNDS = 5


def _freeze_marked(variable: str, value: str, said: dict[int, str]) -> list[int]:
    frozen: list[int] = []
    while new := [pid for pid in marked_pids(variable, value) if pid not in frozen]:
        for pid in new:
            said.setdefault(pid, _command_line(pid)[:80])
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        frozen += new
    return frozen


def stop_container(mode: Mode, name: str, grace_s: float) -> None:
    """`docker stop` (or `podman stop`) the container `name`: SIGTERM, SIGKILL after grace_s; then remove it."""
    if mode == "process":
        return
    engine = Engine(mode, (mode,), "")
    for args, timeout in (("stop", "--time", str(int(grace_s)), name), grace_s + 15), (("rm", "--force", name), 15):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            engine.run(*args, timeout=timeout)
