"""`docker` on an emulated TPU VM that runs real containers: the startup script's commands reach Podman (or Docker).

A TpuEmulator started with `engine=` gives its VMs docker_shim.ENGINE_ENV in their environment, and the VMs' `docker`
(tpu_emulator.docker_shim) hands pull, run, stop, rm, kill, ps, images, version and info to this module instead of
running the image's entrypoint as a process. The startup script is the same; what differs is that the image is
really pulled from a registry (a local one: tpu_emulator.registry) and its entrypoint really runs in it, with the
script's own flags (--privileged --net=host --env-file): the job's code at /workspace, the image's user and
environment, its Python.

Every VM boot gets an image store of its own (Podman's --root/--runroot, under the emulator's workdir), as a VM
boots from an empty disk: `docker pull` then pulls every layer, and the startup breakdown's "image pull" phase is
the real time. Docker has one store per daemon: its VMs share it, and a second pull finds the layers there.
Container names are the VM's own (prefixed with the VM's marker), so VMs never see each other's containers.

What the VM adds to the container's environment is what it adds for a process (docker_shim.vm_additions): the
VM's STORAGE_EMULATOR_HOST (with --net=host the container reaches the emulators on loopback), its marker (stopping
the VM finds the container's processes), the JAX cluster of a multi-host slice, less a drop-env fault's variables;
the missing-image fault makes `docker pull` fail as Docker does. `cleanup` removes a stopped VM's containers and
image store.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from runner.backends import container
from runner.launch.engine import ENGINES, Engine, EngineName
from tpu_emulator import docker_shim
from tpu_emulator.vm import MARKER

ROOT_ENV = "RUNNER_EMULATOR_ENGINE_ROOT"  # this VM boot's image store (Podman)
LABEL = "tpu-emulator.vm"  # on every container a VM starts: its marker, to find them when the VM is stopped


def runroot(root: Path) -> Path:
    """The run state of the store at `root`: Podman refuses a runroot path longer than 50 characters (it holds
    sockets), so it lives in /tmp under a name derived from `root`."""
    return Path("/tmp") / f"tpu-emulator-{hashlib.sha1(str(root).encode()).hexdigest()[:12]}"


def engine_for(name: EngineName, version: str, root: Path | None) -> Engine:
    """The engine as one VM sees it: Podman with the VM's own image store, or the shared Docker daemon."""
    if name == "podman" and root is not None:
        return Engine(name, (name, "--root", str(root), "--runroot", str(runroot(root))), version)
    return Engine(name, (name,), version)


def vm_env(engine: Engine | None, root: Path) -> dict[str, str]:
    """What a VM's environment says about its engine (nothing when the VMs run containers as processes): which
    one, this boot's image store, and the engine's settings (the VM's HOME is its own: it would not find them)."""
    if engine is None:
        return {}
    return {**engine.settings(), docker_shim.ENGINE_ENV: f"{engine.name} {engine.version}", ROOT_ENV: str(root)}


def configured() -> Engine | None:
    """This VM's engine, from its environment; None when its containers are processes."""
    name, _, version = os.environ.get(docker_shim.ENGINE_ENV, "").partition(" ")
    if name not in ENGINES:
        return None
    root = os.environ.get(ROOT_ENV)
    return engine_for(name, version, Path(root) if root else None)


def _vm_name(name: str) -> str:
    """The engine's name for the VM's container `name`: the VM's marker first, so VMs never meet."""
    marker = os.environ.get(MARKER, "vm").replace(":", "-")
    return f"vm-{marker}-{name}"


def _exec(engine: Engine, args: list[str], env: dict[str, str] | None = None) -> int:
    """Become the engine's CLI: its exit status and signals are the command's, as with Docker's own CLI."""
    argv = engine.command(*args)
    cli = shutil.which(argv[0]) or argv[0]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(cli, argv, {**os.environ, **engine.settings(), **(env or {})})
    return 0  # not reached


def pull(engine: Engine, image: str, quiet: bool) -> int:
    ref = docker_shim.normalize(image)
    if error := docker_shim.missing_image(ref):
        print(f"Error response from daemon: {error}", file=sys.stderr)
        return 1
    return _exec(engine, ["pull", *(["--quiet"] if quiet else []), ref])


def run(engine: Engine, args: list[str]) -> int:
    """`docker run` as the VM's script wrote it, in the engine: the job's variables by name (-e KEY, never on argv),
    the VM's additions, its own container name; an image not pulled yet is pulled first, as Docker does."""
    flags, image, command = docker_shim.parse_run(args)
    ref = docker_shim.normalize(image)
    if "--detach" in flags:
        raise docker_shim.Exit(125, "docker: --detach is not supported when the emulator runs real containers.")
    if not container.image_present(engine, ref):
        print(f"Unable to find image '{ref}' locally", file=sys.stderr)
        error = docker_shim.missing_image(ref)
        if error is None:
            pulled = engine.run("pull", "--quiet", ref, timeout=1800)
            error = None if pulled.returncode == 0 else pulled.stderr.strip()
        if error:
            raise docker_shim.Exit(125, f"docker: Error response from daemon: {error}.\nSee 'docker run --help'.")
    env = docker_shim.vm_additions({**docker_shim.jax_cluster_env(), **docker_shim.container_env(flags)}, ref)
    options = ["--label", f"{LABEL}={os.environ.get(MARKER, '')}"]
    for flag, values in flags.items():
        if flag in ("--name", "--env", "--env-file", "--rm", "--label"):
            continue  # the name is the VM's, the environment comes by name below, --rm is always there
        for value in values:
            options += [flag] if flag in docker_shim.BOOL_FLAGS and value == "true" else [flag, value]
    name = _vm_name(flags.get("--name", ["job"])[-1])
    launch = container.plan_launch(
        ref, env, name=name, data_dir=None, storage_root=None, prefer="container", engine=engine, flags=options
    )
    return _exec(engine, [*launch.argv[len(engine.argv) :], *command], launch.env)


def main(engine: Engine, command: str, args: list[str]) -> int:
    """One `docker COMMAND ARGS` of the VM's script, in the engine."""
    if command == "pull":
        opts, refs = docker_shim.parse_options(args, {"--platform"})
        if len(refs) != 1:
            raise docker_shim.Exit(1, "\"docker pull\" requires exactly 1 argument.\nSee 'docker pull --help'.")
        return pull(engine, refs[0], quiet="-q" in opts or "--quiet" in opts)
    if command == "run":
        return run(engine, args)
    if command in ("stop", "rm", "kill"):
        value_flags = {"stop": {"-t", "--time", "-s", "--signal"}, "rm": set(), "kill": {"-s", "--signal"}}[command]
        opts, names = docker_shim.parse_options(args, value_flags)
        passed = [part for k, v in opts.items() for part in ((k,) if v == "true" else (k, v))]
        code = 0
        for name in names:
            result = engine.run(command, *passed, _vm_name(name), timeout=120)
            if result.returncode == 0:
                print(name)
            else:
                print(result.stderr.strip().replace(_vm_name(name), name), file=sys.stderr)
                code = code or result.returncode
        return code
    if command in ("ps", "images", "image", "version", "info"):
        return _exec(engine, [command, *args])
    raise docker_shim.Exit(1, f"docker: '{command}' is not a docker command.\nSee 'docker --help'")


def cleanup(engine: Engine, markers: list[str], roots: list[Path]) -> None:
    """After a VM is stopped: remove its containers and, with Podman, its image stores (one per worker)."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        if engine.name == "docker":
            for marker in markers:
                found = engine.run("ps", "--all", "--quiet", "--filter", f"label={LABEL}={marker}", timeout=60)
                if ids := found.stdout.split():
                    engine.run("rm", "--force", *ids, timeout=120)
        for root in roots:
            if engine.name == "podman" and root.exists():
                engine_for(engine.name, engine.version, root).run("rm", "--all", "--force", "--time", "0", timeout=120)
    for root in roots:
        for path in (root, runroot(root)):
            if path.exists():
                _unmount_below(path)
                shutil.rmtree(path, ignore_errors=True)


def _unmount_below(root: Path) -> None:
    """What a killed container left mounted under `root` (overlay, shm): unmounted, so the store can be removed."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    prefix = str(root.resolve()) + "/"
    points = [line.split()[4] for line in lines if len(line.split()) > 4 and line.split()[4].startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
