"""Emulated TPU VMs: each worker of a READY node runs the node's startup-script as a local process.

Every worker is `bash -c "$startup_script"` in its own session (so its process group is the VM), in its own
directory under the emulator's workdir, with its console output in console.log there and an environment that
points the script at the emulator (see `vm_env`). Every process of a VM also carries a marker variable, so
that stopping a VM finds and kills what left its process group (setsid, double forks) too: when a VM is
stopped nothing of it survives.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import itertools
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from runner.backends import container
from runner.launch import deps
from runner.launch.engine import Engine
from runner.worker import processes

MARKER = "RUNNER_EMULATOR_VM"  # <emulator id>:<boot number>:<worker>, in every VM process's environment
# Seconds a VM's clock is off (the clock_skew fault): its `date` (a shim first on its PATH) and its Python's
# time.time() (a sitecustomize the docker shim puts on the container's PYTHONPATH) read the real clock plus this.
# The API's own timestamps (node createTime, operations) stay on the emulator's clock, as Google's do.
CLOCK_SKEW = "RUNNER_EMULATOR_CLOCK_SKEW_S"
_SITECUSTOMIZE = f'''"""Python on an emulated TPU VM whose clock is off (tpu_emulator, the clock_skew fault):
time.time() is the real clock plus ${CLOCK_SKEW} seconds, as on a VM whose clock has drifted."""

import os
import time

_skew = int(os.environ.get("{CLOCK_SKEW}") or 0)
if _skew:
    _real, _real_ns = time.time, time.time_ns
    time.time = lambda: _real() + _skew
    time.time_ns = lambda: _real_ns() + _skew * 1_000_000_000
'''
# host:port where process 0 of a multi-host slice (or of every slice of a multislice) serves JAX's distributed
# coordinator: on a real TPU VM JAX finds it from the metadata server (worker 0's address, port 8482), but only when
# the VM has TPU chips; every emulated VM is this machine, so the emulator reserves a free local port instead.
COORDINATOR = "RUNNER_EMULATOR_COORDINATOR"


def storage_emulator_env(endpoint: str) -> dict[str, str]:
    """What a VM's programs need to reach the storage emulator in place of Cloud Storage; a real TPU VM sets none of
    it. google-cloud-storage and gcsfs read STORAGE_EMULATOR_HOST; Orbax writes its arrays through TensorStore, whose
    GCS driver takes its endpoint and a fixed token (else it asks a metadata server for credentials), and reaches
    its gs:// paths through etils.epath, here by gcsfs: with TensorFlow installed epath would take tf.io.gfile, which
    cannot reach an emulator (a JAX image has no TensorFlow, and gcsfs)."""
    return {
        "STORAGE_EMULATOR_HOST": endpoint,
        "TENSORSTORE_GCS_HTTP_URL": endpoint,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
        "EPATH_USE_TF": "false",
    }


STORAGE_EMULATOR_KEYS = tuple(storage_emulator_env(""))
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the directory that holds the runner and tpu_emulator packages


def marked_pids(prefix: str) -> list[int]:
    """Live processes whose environment has MARKER=<a value starting with prefix> (Linux /proc; else [])."""
    return container.marked_pids(MARKER, prefix)


def python_dir(shim_dir: Path) -> Path:
    """Beside the shims: the sitecustomize that gives a skewed VM's Python its clock (CLOCK_SKEW)."""
    return shim_dir.parent / "python"


def _signal_all(pgids: list[int], pids: list[int], sig: signal.Signals) -> None:
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


@dataclass(frozen=True)
class VmInfo:
    worker: int
    pid: int
    alive: bool
    exit_code: int | None  # the startup-script's exit status once it is over
    directory: Path
    console_log: Path
    hostname: str


class VmProcess:
    def __init__(self, worker: int, popen: subprocess.Popen[bytes], directory: Path, hostname: str) -> None:
        self.worker = worker
        self.popen = popen
        self.directory = directory
        self.console_log = directory / "console.log"
        self.hostname = hostname
        self.exit_code: int | None = None
        self._reaper = threading.Thread(target=self._reap, name=f"vm-reaper-{popen.pid}", daemon=True)
        self._reaper.start()

    def _reap(self) -> None:
        code = self.popen.wait()
        self.exit_code = code if code >= 0 else 128 - code
        with contextlib.suppress(OSError), self.console_log.open("a") as log:
            log.write(f"[tpu-emulator] startup-script exited with status {self.exit_code}\n")

    def info(self) -> VmInfo:
        alive = self.exit_code is None or processes.group_alive(self.popen.pid)
        return VmInfo(
            self.worker, self.popen.pid, alive, self.exit_code, self.directory, self.console_log, self.hostname
        )


class VmGroup:
    """The VMs (one per worker) of one node boot; `stop` ends all of their processes (and containers)."""

    def __init__(
        self,
        node: str,
        marker_prefix: str,
        processes: list[VmProcess],
        engine: Engine | None = None,
        roots: Iterable[Path] = (),
        memory: Iterable[Path] = (),
    ) -> None:
        self.node = node
        self.marker_prefix = marker_prefix
        self.processes = processes
        self.engine = engine  # the VMs run real containers under it (tpu_emulator.vm_engine)
        self.engine_roots: tuple[Path, ...] = tuple(roots)
        self.memory: tuple[Path, ...] = tuple(memory)  # each VM's tmpfs (its secrets): gone when the VM stops
        self._lock = threading.Lock()
        self._stopping = False
        self._stopped = threading.Event()

    def info(self) -> tuple[VmInfo, ...]:
        return tuple(p.info() for p in self.processes)

    def alive(self) -> bool:
        return any(processes.group_alive(p.popen.pid) for p in self.processes) or bool(marked_pids(self.marker_prefix))

    def stop(self, grace_s: float) -> None:
        """SIGTERM every process of every worker, SIGKILL what is left after grace_s; returns when none is left."""
        with self._lock:
            first = not self._stopping
            self._stopping = True
        if not first:
            self._stopped.wait(grace_s + 30)
            return
        try:
            pgids = [p.popen.pid for p in self.processes]
            _signal_all(pgids, marked_pids(self.marker_prefix), signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and self.alive():
                time.sleep(0.05)
            for _ in range(100):
                left = marked_pids(self.marker_prefix)  # one /proc scan a round: to test, then to signal
                if not left and not any(processes.group_alive(pgid) for pgid in pgids):
                    break
                _signal_all(pgids, left, signal.SIGKILL)
                time.sleep(0.05)
            for p in self.processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.popen.wait(5)
            if self.engine is not None:
                from tpu_emulator import vm_engine

                markers = [f"{self.marker_prefix}{p.worker}" for p in self.processes]
                vm_engine.cleanup(self.engine, markers, list(self.engine_roots))
            for path in self.memory:
                shutil.rmtree(path, ignore_errors=True)
        finally:
            self._stopped.set()


class VmLauncher:
    """Boots the VMs of READY nodes under `workdir` and keeps track of every one, to stop them all at the end."""

    def __init__(self, workdir: Path, emulator_id: str, gcs_endpoint: str | None, engine: Engine | None = None) -> None:
        self.workdir = workdir
        self.emulator_id = emulator_id
        self.gcs_endpoint = gcs_endpoint
        self.engine = engine  # None: the VMs run containers as processes (docker_shim); else under this engine
        self.endpoint = ""  # the emulator's http://host:port, set once the server listens
        self._boots = itertools.count(1)
        self._groups: list[VmGroup] = []
        self._lock = threading.Lock()

    @property
    def shim_dir(self) -> Path:
        return self.workdir / ".emulator" / "bin"

    @property
    def python_dir(self) -> Path:
        """Put first on a skewed VM's containers' PYTHONPATH (docker_shim): its sitecustomize skews time.time()."""
        return python_dir(self.shim_dir)

    def install_shim(self) -> None:
        """The `docker` executable the VMs find first on their PATH."""
        self.shim_dir.mkdir(parents=True, exist_ok=True)
        script = self.shim_dir / "docker"
        script.write_text(
            "#!/bin/sh\n"
            "# docker for emulated TPU VMs: runs containers as local processes (tpu_emulator.docker_shim)\n"
            f"PYTHONPATH={shlex.quote(str(_PACKAGE_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}} "
            f"RUNNER_DOCKER_SHIM_DIR={shlex.quote(str(self.shim_dir))} "
            f'exec {shlex.quote(sys.executable)} -m tpu_emulator.docker_shim "$@"\n'
        )
        script.chmod(0o755)
        real_date = shutil.which("date", path=os.environ.get("PATH", os.defpath)) or "/bin/date"
        date = self.shim_dir / "date"
        date.write_text(
            "#!/bin/sh\n"
            f"# date on an emulated TPU VM: the real clock, ${CLOCK_SKEW} seconds off (the clock_skew fault)\n"
            'case " $* " in *" -d"* | *" --date"* | *" -r"* | *" --reference"* | *" -s"* | *" --set"*)\n'
            f'  exec {shlex.quote(real_date)} "$@" ;;\n'
            "esac\n"
            f'exec {shlex.quote(real_date)} -d "${{{CLOCK_SKEW}:-0}} seconds" "$@"\n'
        )
        date.chmod(0o755)
        self.python_dir.mkdir(parents=True, exist_ok=True)
        (self.python_dir / "sitecustomize.py").write_text(_SITECUSTOMIZE)

    @property
    def secrets_root(self) -> Path:
        """Where the VMs keep the secrets they read (RUNNER_SECRETS_DIR, one folder per VM boot): a memory file
        system, as /run is on a TPU VM; the bootstrap refuses to write a secret anywhere else."""
        return Path("/dev/shm") / f"tpu-emulator-{self.emulator_id}"

    def memory_dir(self, marker: str) -> Path:
        """One VM boot's RUNNER_SECRETS_DIR under secrets_root."""
        return self.secrets_root / marker.replace(":", "-")

    def engine_root(self, marker: str) -> Path:
        """One VM boot's own image store (Podman): a new disk per boot, never shared with another VM."""
        return self.workdir / ".emulator" / "engine" / marker.replace(":", "-")

    def vm_dir(self, project: str, zone: str, node_id: str, worker: int) -> Path:
        return self.workdir / project / zone / node_id / f"worker-{worker}"

    def hostname(self, project: str, zone: str, node_id: str, worker: int) -> str:
        digest = hashlib.sha1(f"{project}/{zone}/{node_id}".encode()).hexdigest()[:8]
        return f"t1v-n-{digest}-w-{worker}"

    def vm_env(
        self,
        project: str,
        zone: str,
        node_id: str,
        worker: int,
        marker: str,
        coordinator: str | None = None,
        clock_skew_s: int = 0,
    ) -> dict[str, str]:
        """The environment of a TPU VM's startup-script: the contract bootstrap scripts rely on."""
        return self._env(
            self.vm_dir(project, zone, node_id, worker),
            self.hostname(project, zone, node_id, worker),
            f"{self.endpoint}/_vm/{project}/{zone}/{node_id}/{worker}/computeMetadata/v1",
            marker,
            coordinator,
            clock_skew_s,
        )

    def _env(
        self,
        directory: Path,
        hostname: str,
        metadata_url: str,
        marker: str,
        coordinator: str | None,
        clock_skew_s: int = 0,
    ) -> dict[str, str]:
        user = os.environ.get("USER") or getpass.getuser()
        env = {
            "PATH": f"{self.shim_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
            "HOME": str(directory / "home"),
            "TMPDIR": str(directory / "tmp"),
            "USER": user,
            "LOGNAME": user,
            "SHELL": "/bin/bash",
            "LANG": "C.UTF-8",
            "HOSTNAME": hostname,
            "RUNNER_METADATA_URL": metadata_url,
            # Both APIs are served at the same address: a VM deletes itself through the API that made it.
            "RUNNER_TPU_API": self.endpoint,
            "RUNNER_COMPUTE_API": self.endpoint,
            "RUNNER_SECRETMANAGER_API": self.endpoint,
            "RUNNER_SECRETS_DIR": str(self.memory_dir(marker)),
            MARKER: marker,
            # A job's own requirements, which a container played as a process (docker_shim) installs as a --local
            # process run does: into this machine's cache, shared with those runs (runner.launch.deps).
            deps.CACHE_ENV: str(deps.cache_root()),
        }
        if self.gcs_endpoint:
            env["RUNNER_STORAGE_API"] = self.gcs_endpoint
            env.update(storage_emulator_env(self.gcs_endpoint))
        if coordinator:
            env[COORDINATOR] = coordinator
        if clock_skew_s:
            env[CLOCK_SKEW] = str(int(clock_skew_s))
        if self.engine is not None:
            from tpu_emulator import vm_engine

            env.update(vm_engine.vm_env(self.engine, self.engine_root(marker)))
        return env

    def boot(
        self,
        project: str,
        zone: str,
        node_id: str,
        hosts: int,
        script: str | None,
        coordinator: str | None = None,
        *,
        clock_skew_s: int = 0,
    ) -> VmGroup | None:
        """Start the startup-script on every worker; None when the node has none (nothing runs). `coordinator`:
        the JAX coordinator address of a multi-host node's cluster (COORDINATOR); `clock_skew_s`: how far the VMs'
        clocks are off (CLOCK_SKEW)."""
        if script is None:
            return None
        boot = next(self._boots)
        prefix = f"{self.emulator_id}:{boot}:"
        name = f"projects/{project}/locations/{zone}/nodes/{node_id}"
        processes = []
        for worker in range(hosts):
            directory = self.vm_dir(project, zone, node_id, worker)
            env = self.vm_env(project, zone, node_id, worker, f"{prefix}{worker}", coordinator, clock_skew_s)
            header = f"{name} worker {worker} of {hosts}: running startup-script"
            processes.append(self._start(worker, directory, env, script, header))
        roots = [self.engine_root(f"{prefix}{worker}") for worker in range(hosts)] if self.engine else []
        memory = [self.memory_dir(f"{prefix}{worker}") for worker in range(hosts)]
        return self._keep(VmGroup(name, prefix, processes, self.engine, roots, memory))

    def instance_dir(self, project: str, zone: str, instance: str) -> Path:
        return self.workdir / "compute" / project / zone / instance

    def boot_instance(
        self, project: str, zone: str, instance: str, script: str | None, coordinator: str | None = None
    ) -> VmGroup | None:
        """Start a Compute Engine instance's startup-script (one VM, its own metadata server under /_gce/); None
        when it has none. A VM booting again (a restart after a host error, a recreation) boots from a fresh
        directory, as from a fresh boot disk."""
        if script is None:
            return None
        prefix = f"{self.emulator_id}:{next(self._boots)}:"
        directory = self.instance_dir(project, zone, instance)
        url = f"{self.endpoint}/_gce/{project}/{zone}/{instance}/computeMetadata/v1"
        env = self._env(directory, instance, url, f"{prefix}0", coordinator)
        path = f"projects/{project}/zones/{zone}/instances/{instance}"
        process = self._start(0, directory, env, script, f"{path}: running startup-script")
        roots = [self.engine_root(f"{prefix}0")] if self.engine else []
        return self._keep(VmGroup(path, prefix, [process], self.engine, roots, [self.memory_dir(f"{prefix}0")]))

    def _start(self, worker: int, directory: Path, env: dict[str, str], script: str, header: str) -> VmProcess:
        shutil.rmtree(directory, ignore_errors=True)  # a new VM boots from a fresh disk
        for sub in ("home", "tmp"):
            (directory / sub).mkdir(parents=True, exist_ok=True)
        with (directory / "console.log").open("ab") as console:
            console.write(f"[tpu-emulator] {header}\n".encode())
            console.flush()
            popen = subprocess.Popen(
                ["bash", "-c", script],
                cwd=directory,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return VmProcess(worker, popen, directory, env["HOSTNAME"])

    def _keep(self, group: VmGroup) -> VmGroup:
        with self._lock:
            self._groups.append(group)
        return group

    def hang(self, project: str, zone: str, node_id: str, hosts: int, has_script: bool) -> None:
        """Boot the workers' disks but run nothing (the boot_hang fault): a READY, HEALTHY node whose startup-script
        never starts. Only the console says so, as a serial console is all one can read on such a VM."""
        name = f"projects/{project}/locations/{zone}/nodes/{node_id}"
        for worker in range(hosts):
            directory = self.vm_dir(project, zone, node_id, worker)
            shutil.rmtree(directory, ignore_errors=True)
            for sub in ("home", "tmp"):
                (directory / sub).mkdir(parents=True, exist_ok=True)
            what = "the startup-script never started" if has_script else "no startup-script"
            (directory / "console.log").write_text(
                f"[tpu-emulator] {name} worker {worker} of {hosts}: booted; {what} "
                "(boot_hang fault: google-startup-scripts.service did not run)\n"
            )

    def console_logs(self, project: str, zone: str, node_id: str, hosts: int) -> tuple[Path, ...]:
        """The console logs the workers of a node have written so far."""
        logs = (self.vm_dir(project, zone, node_id, w) / "console.log" for w in range(hosts))
        return tuple(log for log in logs if log.exists())

    def stop_all(self, grace_s: float) -> None:
        """Stop every VM ever booted (in parallel), then kill anything still carrying this emulator's marker."""
        with self._lock:
            groups = list(self._groups)
        threads = [threading.Thread(target=g.stop, args=(grace_s,), daemon=True) for g in groups]
        for t in threads:
            t.start()
        for t in threads:
            t.join(grace_s + 30)
        for _ in range(50):
            left = marked_pids(f"{self.emulator_id}:")
            if not left:
                break
            _signal_all([], left, signal.SIGKILL)
            time.sleep(0.05)
        with self._lock:
            self._groups = [g for g in self._groups if g not in groups]
        shutil.rmtree(self.secrets_root, ignore_errors=True)  # what a killed VM's bootstrap had no time to remove
