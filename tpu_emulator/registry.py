"""A real image registry on loopback, for the emulator's VMs to pull real images from (tpu_emulator.vm_engine).

    with LocalRegistry() as registry:               # http://127.0.0.1:PORT
        ref = registry.push(engine, "trainer-cpu:0.1.0-3fa2...", "tpu-runner/trainer")
        # -> 127.0.0.1:PORT/tpu-runner/trainer:0.1.0-3fa2...; RUNNER_REGISTRY_ENDPOINT=registry.endpoint makes the
        #    runner's pre-flight check ask it, and the VMs' `docker pull` pulls from it

The registry is the CNCF distribution Debian packages (`docker-registry`; `make podman` installs it), speaking the
Docker Registry HTTP API v2 over plain HTTP. Its storage is kept in the cache (~/.cache/tpu-runner/containers/
registry), so a layer is pushed once per machine: the next push of the same image sends a manifest.

`trainer_image` is what a rehearsal on emulated VMs pushes: the cpu image of this checkout (built if needed, with
this machine's extra CA certificates), under a name without a variant: an emulated VM has no TPU, the tpu image
cannot be built where Google's libtpu index is unreachable, and the planner takes an image of another name as it
is (runner.launch.variants).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from runner.launch import engine as engines
from runner.launch.engine import Engine

BINARIES = ("docker-registry", "registry")  # Debian's name, upstream's
# The port when it is free, else any: Podman remembers the compressed digest of each layer it pushed per registry
# host:port, so on the same port a push of an image whose layers were pushed before compresses nothing (the cpu
# image's dependency layer took a minute to compress here; a new port each time meant a minute per push).
PREFERRED_PORT = 41777
MACHINE_CA_CERTS = Path("/usr/local/share/ca-certificates")  # where Debian and Ubuntu keep a machine's own CAs
CONFIG = """\
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""


def _port() -> int:
    for port in (PREFERRED_PORT, 0):
        with socket.socket() as s, contextlib.suppress(OSError):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the registry binds it: TIME_WAIT is free
            s.bind(("127.0.0.1", port))
            return int(s.getsockname()[1])
    raise RuntimeError("no free port on 127.0.0.1")


def binary() -> str | None:
    return next((found for name in BINARIES if (found := shutil.which(name))), None)


def machine_ca_certs() -> Path | None:
    """This machine's own extra CA certificates (a TLS-intercepting proxy's, say), when it has any."""
    return MACHINE_CA_CERTS if any(MACHINE_CA_CERTS.glob("*.crt")) else None


class LocalRegistry:
    """docker-registry serving on a free loopback port until stop()."""

    def __init__(self, storage: Path | None = None) -> None:
        self.storage = storage or engines.cache_dir() / "registry"
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30) -> LocalRegistry:
        program = binary()
        if program is None:
            raise RuntimeError("no image registry here: `make podman` installs Debian's docker-registry")
        self.storage.mkdir(parents=True, exist_ok=True)
        self.port = _port()
        config = self.storage.parent / f"registry-{self.port}.yml"
        config.write_text(CONFIG.format(root=self.storage, port=self.port))
        log = (self.storage.parent / f"registry-{self.port}.log").open("ab")
        with log:
            self._proc = subprocess.Popen(
                [program, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.endpoint}/v2/", timeout=2) as answer:
                if answer.status == 200:
                    config.unlink(missing_ok=True)
                    return self
            if self._proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the registry did not answer on {self.endpoint} (see {log.name})")

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        for leftover in self.storage.parent.glob(f"registry-{self.port}.*"):
            leftover.unlink(missing_ok=True)

    def __enter__(self) -> LocalRegistry:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def push(self, engine: Engine, local: str, path: str) -> str:
        """Push the local image `local` as <this registry>/<path>:<its tag>; returns that reference."""
        tag = local.rsplit(":", 1)[1]
        remote = f"{self.host}/{path}:{tag}"
        steps = [("push", local, remote)] if engine.name == "podman" else [("tag", local, remote), ("push", remote)]
        for args in steps:
            result = engine.run(*args, timeout=1800)
            if result.returncode != 0:
                raise RuntimeError(f"{engine.name} {' '.join(args)} failed: {result.stderr.strip()[-2000:]}")
        return remote


def trainer_image(
    registry: LocalRegistry, engine: Engine, *, context: Path | None = None, say: Callable[[str], None] = print
) -> str:
    """The cpu trainer image of this checkout (with the code of `context` at /workspace, if given), pushed to
    `registry` as tpu-runner/trainer (module docstring); returns the reference a job spec names."""
    from runner.launch import build, code

    image = build.ensure_image("cpu", ca_certs=machine_ca_certs(), engine=engine, say=say)
    if context is not None:
        image = code.ensure_code_image(image, context, engine=engine, say=say, ca_certs=machine_ca_certs())
    return registry.push(engine, image.reference, "tpu-runner/trainer")
