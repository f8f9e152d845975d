"""`docker` for emulated TPU VMs: the commands a TPU VM startup script uses, with containers as local processes.

An emulated VM finds this first on its PATH (as `docker`, a two-line wrapper). `run` decides how the container
runs through runner.backends.container.plan_launch(prefer="process") - the one place that decides that - and then
execs the launch's argv in place of itself, so the container's exit status is `docker run`'s and signals sent
to `docker run` reach the container. The container gets the launch's environment (from -e and --env-file), the
image's own basics (PATH with this interpreter first, HOME and TMPDIR of its own, PYTHONPATH), the VM's settings
for the storage emulator (STORAGE_EMULATOR_HOST, and what Orbax's gs:// paths need) and, on a VM whose clock is off
(the clock_skew fault), that clock: its skew, and the sitecustomize that applies it to time.time(). Volumes, users,
--privileged and the like are accepted and have no effect: there is no isolation to configure.

On a multi-host node (and on every slice of a multislice) the container also gets what JAX's Cloud TPU cluster
detection would find on the VM (`jax_cluster_env`), as the runner's RUNNER_COORDINATOR_ADDRESS (which a bare
jax.distributed.initialize() reads through the runner's cluster, runner.train.jaxcluster) and the
KERAS_DISTRIBUTION_* variables keras.distribution.initialize() reads: so the JAX processes on the emulated hosts
form one jax.distributed cluster.

`pull` asks the emulator ($RUNNER_TPU_API/_emulator/images) whether the image "exists", so the missing-image
fault makes it fail as Docker does; `run` asks it ($RUNNER_TPU_API/_emulator/container-env) which variables to leave
out of the container (the drop-env fault). `stop`, `rm -f` and `kill` find containers by name through per-name records
under $TMPDIR/docker-shim/.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

from runner.worker import processes

# Every emulated VM boot runs `docker login`, `pull`, `run` and `stop`, each a Python process: what only `run` (and
# `pull`) need is imported there, so the others start with the interpreter and this module alone (about 0.08 CPU s
# less each, a few hundred times in a test session).

DETACHED_CHILD = "RUNNER_DOCKER_SHIM_DETACHED"
# "<name> <version>": the engine a VM's containers run under (tpu_emulator.vm_engine), set where the emulator runs
# real containers; without it a container is a process.
ENGINE_ENV = "RUNNER_EMULATOR_ENGINE"
SHIM_DIR = "RUNNER_DOCKER_SHIM_DIR"  # set by the wrapper: the directory the VM finds `docker` in
SHORT = {"e": "--env", "v": "--volume", "u": "--user", "h": "--hostname", "m": "--memory", "w": "--workdir"}
SHORT |= {"l": "--label", "p": "--publish", "t": "--tty", "i": "--interactive", "d": "--detach", "P": "--publish-all"}
BOOL_FLAGS = {"--rm", "--privileged", "--init", "--tty", "--interactive", "--detach", "--read-only", "--publish-all"}
VALUE_FLAGS = {
    "--name", "--env", "--env-file", "--volume", "--user", "--network", "--net", "--shm-size", "--ulimit",
    "--log-driver", "--log-opt", "--gpus", "--ipc", "--pid", "--cap-add", "--cap-drop", "--device",
    "--security-opt", "--restart", "--hostname", "--platform", "--pull", "--memory", "--cpus", "--workdir",
    "--mount", "--add-host", "--label", "--publish", "--tmpfs", "--stop-timeout", "--stop-signal", "--dns",
    "--group-add",
}  # fmt: skip
UNSUPPORTED = {"--entrypoint"}
GLOBAL_VALUE_FLAGS = {"--config", "-H", "--host", "--log-level", "--context", "-c"}


class Exit(Exception):
    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message)
        self.code, self.message = code, message


def state_dir() -> Path:
    path = Path(os.environ.get("TMPDIR") or "/tmp") / "docker-shim"
    (path / "containers").mkdir(parents=True, exist_ok=True)
    return path


def normalize(image: str) -> str:
    """With its tag spelled out; Docker keeps library/ out of a Docker Hub name, and so does this."""
    from runner.launch.imageref import ImageRef

    try:
        parsed = ImageRef.parse(image)
    except ValueError:
        return image  # `docker run` reports what it cannot parse; the shim runs what it was given
    return parsed.normalized.removeprefix("library/") if parsed.host is None else parsed.normalized


def _image_id(ref: str) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(ref.encode()).hexdigest()


def _pulled() -> set[str]:
    path = state_dir() / "images.json"
    return set(json.loads(path.read_text())) if path.exists() else set()


def missing_image(ref: str) -> str | None:
    """Docker's error for `ref`, as the emulator's `/_emulator/images` words it, when its missing-image fault names
    `ref`; else None. Without an emulator to ask, every image exists."""
    api = os.environ.get("RUNNER_TPU_API")
    if not api:
        return None
    import urllib.parse
    import urllib.request

    url = f"{api}/_emulator/images?{urllib.parse.urlencode({'name': ref})}"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            data = json.load(answer)
    except (OSError, ValueError):
        return None
    return None if data.get("present", True) else str(data["message"])


def dropped_env(ref: str) -> list[str]:
    """The variable names (fnmatch patterns) a drop-env fault leaves out of this container; none without an
    emulator to ask, or when it cannot be asked."""
    api = os.environ.get("RUNNER_TPU_API")
    if not api:
        return []
    import urllib.parse
    import urllib.request

    url = f"{api}/_emulator/container-env?{urllib.parse.urlencode({'image': ref})}"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return [str(name) for name in json.load(answer).get("drop", [])]
    except (OSError, ValueError, AttributeError):
        return []


def _metadata(key: str) -> str:
    import urllib.request

    url = f"{os.environ['RUNNER_METADATA_URL']}/{key}"
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.read().decode()


def jax_cluster_env() -> dict[str, str]:
    """JAX's cluster on a multi-host slice or a multislice, as the runner's cluster and keras.distribution
    .initialize() read it from the environment. On a Cloud TPU VM, jax.distributed.initialize() finds it by itself
    (jax/_src/clusters/cloud_tpu_cluster.py): the process count is the hosts per slice (tpu-env WORKER_HOSTNAMES) times
    MEGASCALE_NUM_SLICES, the process id MEGASCALE_SLICE_ID x hosts + agent-worker-number, the coordinator process
    0's host. It looks only where there are TPU chips, which an emulated VM has not, so the same facts are read here
    from the same metadata; the coordinator's address is the one the emulator reserved for the node's cluster
    (vm.COORDINATOR, reserved afresh for every boot: every emulated host is this machine). {} for a single host or
    without an emulator."""
    from runner import contract
    from tpu_emulator.vm import COORDINATOR

    coordinator = os.environ.get(COORDINATOR)
    if not coordinator or not os.environ.get("RUNNER_METADATA_URL"):
        return {}
    try:
        host = int(_metadata("instance/attributes/agent-worker-number"))
        tpu_env = dict(
            (key.strip(), value.strip().strip("'"))
            for key, _, value in (line.partition(":") for line in _metadata("instance/attributes/tpu-env").splitlines())
        )
    except (OSError, ValueError) as exc:
        print(f"[emulator] no JAX cluster for this container: the metadata did not answer ({exc})", file=sys.stderr)
        return {}
    hosts = len(tpu_env.get("WORKER_HOSTNAMES", "").split(","))
    slices = int(tpu_env.get("MEGASCALE_NUM_SLICES") or 1)
    slice_id = int(tpu_env.get("MEGASCALE_SLICE_ID") or 0)
    return {
        contract.COORDINATOR_ADDRESS: coordinator,
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": coordinator,
        "KERAS_DISTRIBUTION_NUM_PROCESSES": str(hosts * slices),
        "KERAS_DISTRIBUTION_PROCESS_ID": str(slice_id * hosts + host),
    }


def pull(image: str, *, quiet: bool = False) -> str | None:
    """Pull `image`; None on success, else Docker's error message."""
    ref = normalize(image)
    if error := missing_image(ref):
        return error
    images = _pulled() | {ref}
    (state_dir() / "images.json").write_text(json.dumps(sorted(images)))
    if not quiet:
        repo, _, tag = ref.rpartition(":")
        print(f"{tag}: Pulling from {repo}\nDigest: {_image_id(ref)}\nStatus: Downloaded newer image for {ref}\n{ref}")
    return None


# -- container records ----------------------------------------------------------------------------------------


def _record_path(name: str) -> Path:
    return state_dir() / "containers" / f"{name}.json"


def load(name: str) -> dict | None:
    try:
        return json.loads(_record_path(name).read_text())
    except (OSError, ValueError):
        return None


def running(record: dict | None) -> bool:
    return record is not None and processes.process_alive(record["pid"], record.get("ticks"))


def _save(record: dict) -> None:
    _record_path(record["name"]).write_text(json.dumps(record))


def _wait_dead(record: dict, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while running(record):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _signal(record: dict, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(record["pid"], sig)


# -- docker run -------------------------------------------------------------------------------------------------


def parse_run(args: list[str]) -> tuple[dict[str, list[str]], str, list[str]]:
    """(flags by long name, image, command args) as Docker's CLI parses them; Exit(125) on a bad flag."""
    flags: dict[str, list[str]] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if name in BOOL_FLAGS:
                flags.setdefault(name, []).append(value if eq else "true")
                i += 1
                continue
            if name not in VALUE_FLAGS and name not in UNSUPPORTED:
                raise Exit(125, f"unknown flag: {name}\nSee 'docker run --help'.")
            if not eq:
                if i + 1 >= len(args):
                    raise Exit(125, f"flag needs an argument: {name}\nSee 'docker run --help'.")
                value, i = args[i + 1], i + 1
            if name in UNSUPPORTED:
                raise Exit(125, f"docker: {name} is not supported by the emulator's docker shim.")
            flags.setdefault("--network" if name == "--net" else name, []).append(value)
            i += 1
            continue
        j = 1
        while j < len(arg):
            long = SHORT.get(arg[j])
            if long is None:
                raise Exit(125, f"unknown shorthand flag: '{arg[j]}' in {arg}\nSee 'docker run --help'.")
            if long in BOOL_FLAGS:
                flags.setdefault(long, []).append("true")
                j += 1
                continue
            value = arg[j + 1 :].removeprefix("=")
            if not value:
                if i + 1 >= len(args):
                    raise Exit(125, f"flag needs an argument: '{arg[j]}' in -{arg[j]}\nSee 'docker run --help'.")
                value, i = args[i + 1], i + 1
            flags.setdefault(long, []).append(value)
            break
        i += 1
    if i >= len(args):
        raise Exit(125, "docker: 'docker run' requires at least 1 argument.\nSee 'docker run --help'.")
    return flags, args[i], args[i + 1 :]


def _on(flags: dict[str, list[str]], name: str) -> bool:
    return bool(flags.get(name)) and flags[name][-1].lower() not in ("false", "0")


def container_env(flags: dict[str, list[str]]) -> dict[str, str]:
    """-e and --env-file as Docker reads them: files first, then -e; `KEY` alone takes the client's value."""
    items: list[str] = []
    for env_file in flags.get("--env-file", []):
        try:
            lines = Path(env_file).read_text().splitlines()
        except OSError as exc:
            raise Exit(125, f"docker: open {env_file}: {exc.strerror.lower() if exc.strerror else exc}.") from None
        items += [ln.lstrip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    items += flags.get("--env", [])
    env: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not key or any(c.isspace() for c in key):
            raise Exit(125, f"docker: invalid environment variable: {item!r}.")
        if eq:
            env[key] = value
        elif key in os.environ:
            env[key] = os.environ[key]
    return env


def vm_additions(env: dict[str, str], ref: str) -> dict[str, str]:
    """A container's environment as the VM starts it: `env` with the VM's settings for the storage emulator
    (STORAGE_EMULATOR_HOST and what Orbax needs: vm.storage_emulator_env; the VM's network reaches it) and its
    marker (stopping the VM finds every process of it), less what a drop-env fault takes away (said on the VM's
    console, docker run's stderr, never in the job's log)."""
    import fnmatch

    from tpu_emulator.vm import CLOCK_SKEW, MARKER, STORAGE_EMULATOR_KEYS

    final = dict(env)
    for key in (*STORAGE_EMULATOR_KEYS, MARKER, CLOCK_SKEW):
        if key in os.environ:
            final[key] = os.environ[key]
    drop = dropped_env(ref)
    if drop:
        gone = sorted(k for k in final if k != MARKER and any(fnmatch.fnmatchcase(k, p) for p in drop))
        for key in gone:
            del final[key]
        print(
            f"[emulator] drop-env fault: the container starts without {', '.join(gone) or 'nothing'}", file=sys.stderr
        )
    return final


def run(args: list[str]) -> int:
    import subprocess
    import uuid

    from runner.backends import container
    from runner.errors import RunnerError
    from runner.launch import deps
    from tpu_emulator.vm import CLOCK_SKEW, python_dir

    flags, image, command = parse_run(args)
    ref = normalize(image)
    detached_child = os.environ.get(DETACHED_CHILD) == "1"
    name = flags.get("--name", [f"emulated_{uuid.uuid4().hex[:8]}"])[-1]
    record = load(name)
    if not detached_child and record and (running(record) or not record.get("rm")):
        raise Exit(
            125,
            f'docker: Error response from daemon: Conflict. The container name "/{name}" is already in use by '
            f'container "{record["id"]}". You have to remove (or rename) that container to be able to reuse that '
            "name.\nSee 'docker run --help'.",
        )
    if ref not in _pulled():
        print(f"Unable to find image '{ref}' locally", file=sys.stderr)
        error = pull(ref, quiet=True)
        if error:
            raise Exit(125, f"docker: Error response from daemon: {error}.\nSee 'docker run --help'.")
    cid = uuid.uuid4().hex + uuid.uuid4().hex
    root = state_dir() / "containers" / name
    if _on(flags, "--detach") and not detached_child:
        log = state_dir() / "containers" / f"{name}.log"
        with log.open("ab") as out:
            child = subprocess.Popen(
                [sys.executable, "-m", "tpu_emulator.docker_shim", "run", *args],
                env={**os.environ, DETACHED_CHILD: "1"},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        ticks = processes.start_ticks(child.pid)
        _save({"id": cid, "name": name, "image": ref, "pid": child.pid, "ticks": ticks, "rm": _on(flags, "--rm")})
        print(cid)
        return 0
    env = container_env(flags)
    try:  # the job's own requirements, as the local process run installs them (the same cache on this machine)
        launch = container.plan_launch(ref, env, name=name, data_dir=None, storage_root=None, prefer="process")
        if launch.install is not None:
            deps.ensure(launch.install, say=lambda line: print(f"[emulator] {line}", file=sys.stderr))
    except RunnerError as exc:
        raise Exit(125, f"docker: Error response from daemon: {exc}.") from None
    shim_dir = os.environ.get(SHIM_DIR, "")
    vm_path = [p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if p and p != shim_dir]
    for sub in ("home", "tmp"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    base = {
        "PATH": os.pathsep.join(dict.fromkeys([str(Path(sys.executable).parent), *vm_path])),
        "HOME": str(root / "home"),
        "TMPDIR": str(root / "tmp"),
        "HOSTNAME": os.environ.get("HOSTNAME", "") if flags.get("--network") == ["host"] else cid[:12],
        "LANG": "C.UTF-8",
    }
    if os.environ.get("PYTHONPATH"):
        base["PYTHONPATH"] = os.environ["PYTHONPATH"]  # the image has the runner installed; here it is this tree
    # What the job's own environment says comes first.
    final = vm_additions({**base, **jax_cluster_env(), **launch.env}, ref)
    if os.environ.get(CLOCK_SKEW) and shim_dir:  # the VM's clock is off: so is its containers' time.time()
        final["PYTHONPATH"] = os.pathsep.join(filter(None, [str(python_dir(Path(shim_dir))), final.get("PYTHONPATH")]))
    if not detached_child:
        _save(
            {
                "id": cid,
                "name": name,
                "image": ref,
                "pid": os.getpid(),
                "ticks": processes.start_ticks(os.getpid()),
                "rm": _on(flags, "--rm"),
            }
        )
    if not _on(flags, "--interactive"):
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
    workdir = flags.get("--workdir", [str(root)])[-1]
    os.chdir(workdir if os.path.isdir(workdir) else root)
    argv = [*launch.argv, *command]
    sys.stdout.flush()
    try:
        os.execve(argv[0], argv, final)
    except OSError as exc:
        raise Exit(127, f"docker: Error response from daemon: failed to create task: exec: {argv[0]}: {exc}.") from None
    return 0  # not reached


# -- the other commands -----------------------------------------------------------------------------------------


def parse_options(args: list[str], value_flags: set[str]) -> tuple[dict[str, str], list[str]]:
    """(flags, the rest) of a docker subcommand's arguments: `value_flags` take a value (--time 5, --time=5), every
    other flag is "true". The emulator's real-container VMs (vm_engine.py) parse through it too."""
    opts: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if name in value_flags:
            if not eq:
                if i + 1 >= len(args):
                    raise Exit(125, f"flag needs an argument: {name}")
                value, i = args[i + 1], i + 1
            opts[name] = value
        elif arg.startswith("-") and arg != "-":
            opts[arg] = "true"
        else:
            rest.append(arg)
        i += 1
    return opts, rest


def stop(args: list[str]) -> int:
    opts, names = parse_options(args, {"-t", "--time", "-s", "--signal"})
    timeout = float(opts.get("-t") or opts.get("--time") or 10)
    code = 0
    for name in names:
        record = load(name)
        if record is None:
            print(f"Error response from daemon: No such container: {name}", file=sys.stderr)
            code = 1
            continue
        if running(record):
            _signal(record, signal.SIGTERM)
            if not _wait_dead(record, timeout):
                _signal(record, signal.SIGKILL)
                _wait_dead(record, 5)
        print(name)
    return code


def rm(args: list[str]) -> int:
    opts, names = parse_options(args, set())
    force = any(k in opts for k in ("-f", "--force", "-fv", "-vf"))
    code = 0
    for name in names:
        record = load(name)
        if record is None:
            if not force:
                print(f"Error response from daemon: No such container: {name}", file=sys.stderr)
                code = 1
            continue
        if running(record):
            if not force:
                print(
                    f'Error response from daemon: cannot remove container "/{name}": container is running: stop the '
                    "container before removing or force remove",
                    file=sys.stderr,
                )
                code = 1
                continue
            _signal(record, signal.SIGKILL)
            _wait_dead(record, 5)
        _record_path(name).unlink(missing_ok=True)
        print(name)
    return code


def kill(args: list[str]) -> int:
    opts, names = parse_options(args, {"-s", "--signal"})
    sig_name = (opts.get("-s") or opts.get("--signal") or "KILL").upper().removeprefix("SIG")
    sig = int(sig_name) if sig_name.isdigit() else getattr(signal, f"SIG{sig_name}")
    code = 0
    for name in names:
        record = load(name)
        if not running(record):
            print(f"Error response from daemon: container {name} is not running", file=sys.stderr)
            code = 1
            continue
        _signal(record, sig)  # type: ignore[arg-type]
        print(name)
    return code


def ps(args: list[str]) -> int:
    opts, _ = parse_options(args, {"--format", "-f", "--filter"})
    records = [r for p in sorted((state_dir() / "containers").glob("*.json")) if (r := load(p.stem))]
    shown = [r for r in records if "-a" in opts or "--all" in opts or running(r)]
    if "-q" in opts or "--quiet" in opts:
        print("".join(f"{r['id'][:12]}\n" for r in shown), end="")
        return 0
    print("CONTAINER ID   IMAGE   STATUS   NAMES")
    for r in shown:
        print(f"{r['id'][:12]}   {r['image']}   {'Up' if running(r) else 'Exited'}   {r['name']}")
    return 0


def login(args: list[str], stdin_text: str | None = None) -> int:
    opts, rest = parse_options(args, {"-u", "--username", "-p", "--password"})
    if "--password-stdin" in opts:
        password = (stdin_text if stdin_text is not None else sys.stdin.read()).strip()
    else:
        password = opts.get("-p") or opts.get("--password") or ""
    if not password:
        raise Exit(1, "Error: Cannot perform an interactive login from a non TTY device")
    server = rest[0] if rest else "https://index.docker.io/v1/"
    config = state_dir() / "config.json"
    data = json.loads(config.read_text()) if config.exists() else {"auths": {}}
    data["auths"][server] = {"username": opts.get("-u") or opts.get("--username") or ""}
    config.write_text(json.dumps(data, indent=1))
    print("Login Succeeded")
    return 0


def images(args: list[str]) -> int:
    if args[:1] == ["inspect"]:
        _, refs = parse_options(args[1:], {"--format", "-f"})
        for ref in refs:
            if normalize(ref) not in _pulled():
                raise Exit(1, f"Error: No such image: {ref}")
            print(_image_id(normalize(ref)))
        return 0
    print("REPOSITORY:TAG   IMAGE ID")
    for ref in sorted(_pulled()):
        print(f"{ref}   {_image_id(ref)[7:19]}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    while args and args[0].startswith("-") and args[0] not in ("--help", "-h", "--version", "-v"):
        flag = args.pop(0)
        if flag in GLOBAL_VALUE_FLAGS and "=" not in flag and args:
            args.pop(0)
    if not args or args[0] in ("--help", "-h", "help"):
        print("Usage: docker COMMAND (emulated: login, logout, pull, run, stop, rm, kill, ps, images, version, info)")
        return 0
    command, rest = args[0], args[1:]
    try:
        if os.environ.get(ENGINE_ENV) and command not in ("login", "logout"):
            from tpu_emulator import vm_engine

            engine = vm_engine.configured()
            if engine is not None:
                return vm_engine.main(engine, command, rest)
        if command == "run":
            return run(rest)
        if command == "pull":
            opts, refs = parse_options(rest, {"--platform"})
            if len(refs) != 1:
                raise Exit(1, "\"docker pull\" requires exactly 1 argument.\nSee 'docker pull --help'.")
            error = pull(refs[0], quiet="-q" in opts or "--quiet" in opts)
            if error:
                raise Exit(1, f"Error response from daemon: {error}")
            return 0
        if command in ("login", "logout", "stop", "rm", "kill", "ps"):
            if command == "logout":
                print(f"Removing login credentials for {rest[0] if rest else 'https://index.docker.io/v1/'}")
                return 0
            return {"login": login, "stop": stop, "rm": rm, "kill": kill, "ps": ps}[command](rest)
        if command in ("images", "image"):
            return images(rest if command == "image" else [])
        if command in ("version", "info", "--version", "-v"):
            formatted = "--format" in " ".join(rest) or any(a.startswith("-f") for a in rest)
            print(
                "emulated" if formatted else "Docker (emulated by tpu_emulator.docker_shim), Server Version: emulated"
            )
            return 0
        raise Exit(1, f"docker: '{command}' is not a docker command.\nSee 'docker --help'")
    except Exit as exc:
        if exc.message:
            print(exc.message, file=sys.stderr)
        return exc.code


if __name__ == "__main__":
    sys.exit(main())
