"""The container engine on this machine, Docker or Podman, found the same way for both.

    RUNNER_CONTAINER_ENGINE=docker    Docker only (its client, its engine); none if that engine does not answer
    RUNNER_CONTAINER_ENGINE=podman    Podman only
    unset                             Docker if its engine answers, else Podman, else none

An engine answers when `<cli> version --format '{{.Server.Version}}'` prints its version: Docker's client asks its
daemon; Podman answers itself. (`docker info --format '{{.ServerVersion}}'` exits 125 under Podman.) Both take the
same `build`, `run`, `stop`, `image inspect`, `push` and `pull` command lines, so everything after the detection
is one code path with a different first word.

Podman's settings for this project live in the cache, never in /etc: `python -m runner.launch.engine setup`
(`make podman`) writes them under ~/.cache/tpu-runner/containers (PODMAN_DIR), and every Podman command the runner
starts gets them, unless CONTAINERS_CONF or CONTAINERS_STORAGE_CONF is set already:

    containers.conf   runtime runc (crun 1.8 refuses to start containers on hosts with hybrid cgroups) and
                      default_ulimits (without CAP_SYS_RESOURCE, Podman's default rlimits for root are refused)
    storage.conf      images and layers under PODMAN_DIR/storage: the base image and the build cache stay between
                      runs, so only the first build on a machine pays the minutes
    registries.conf   plain-HTTP registries on loopback (the local registry the emulator's VMs pull from)

Standard library only; nothing here runs at import.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from runner.environ import snapshot

ENGINE_ENV = "RUNNER_CONTAINER_ENGINE"
EngineName = Literal["docker", "podman"]
ENGINES: tuple[EngineName, ...] = ("docker", "podman")
TITLES = {"docker": "Docker", "podman": "Podman"}
CONFIG_ENV = {
    "CONTAINERS_CONF": "containers.conf",
    "CONTAINERS_STORAGE_CONF": "storage.conf",
    "CONTAINERS_REGISTRIES_CONF": "registries.conf",
}


@dataclass(frozen=True)
class Engine:
    """A container engine that answered: its name, the command line that starts its CLI, its version."""

    name: EngineName
    argv: tuple[str, ...]  # ("podman",), or with global options: ("podman", "--root", DIR, "--runroot", DIR)
    version: str

    @property
    def title(self) -> str:
        return f"{TITLES[self.name]} {self.version}"

    def command(self, *args: str) -> list[str]:
        return [*self.argv, *args]

    def settings(self) -> dict[str, str]:
        """What its CLI needs in its environment beyond this process's: the project's Podman settings, if any."""
        return podman_settings() if self.name == "podman" else {}

    def env(self) -> dict[str, str]:
        """The environment its CLI runs with."""
        return {**snapshot(), **self.settings()}

    def run(self, *args: str, timeout: float = 60, capture: bool = True) -> subprocess.CompletedProcess[str]:
        """The CLI with `args`; never raises for a failing command (see returncode), only for a missing CLI."""
        return subprocess.run(
            self.command(*args), env=self.env(), capture_output=capture, text=True, timeout=timeout, check=False
        )


@dataclass(frozen=True)
class Found:
    """What detection found: the engine, or None and why not (in words, for the plan and error messages)."""

    engine: Engine | None
    why: str


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/tpu-runner/containers, else ~/.cache/tpu-runner/containers (beside the data cache)."""
    from runner.datasets import cache_root

    return cache_root() / "containers"


def podman_settings(environ: dict[str, str] | None = None) -> dict[str, str]:
    """CONTAINERS_* variables for the project's Podman settings that exist and are not set already."""
    environ = snapshot() if environ is None else dict(environ)
    if any(key in environ for key in CONFIG_ENV):
        return {}  # the caller chose its own configuration: leave all of it alone
    found = {key: cache_dir() / name for key, name in CONFIG_ENV.items()}
    return {key: str(path) for key, path in found.items() if path.is_file()}


def probe(name: EngineName, environ: dict[str, str] | None = None) -> Engine | None:
    """The engine `name` if its CLI is installed and the engine answers, else None."""
    cli = shutil.which(name)
    if cli is None:
        return None
    env = snapshot() if environ is None else dict(environ)
    if name == "podman":
        env.update(podman_settings(env))
    try:
        result = subprocess.run(
            [name, "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=20,
            env=env,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    version = result.stdout.strip()
    return Engine(name, (name,), version) if result.returncode == 0 and version else None


def detect(environ: dict[str, str] | None = None) -> Found:
    """The engine to use here (see the module docstring). Raises UsageError for an unknown RUNNER_CONTAINER_ENGINE."""
    environ = snapshot() if environ is None else dict(environ)
    chosen = environ.get(ENGINE_ENV, "").strip().lower()
    if chosen and chosen not in ENGINES:
        from runner.errors import UsageError

        raise UsageError(f"{ENGINE_ENV}={chosen!r} is not a container engine", hint="docker or podman (or unset)")
    names: tuple[EngineName, ...] = (chosen,) if chosen in ENGINES else ENGINES
    for name in names:
        if found := probe(name, environ):
            return Found(found, "")
    if chosen:
        return Found(None, f"{TITLES[chosen]} does not answer (`{chosen} version`; {ENGINE_ENV}={chosen})")
    return Found(None, "no container engine answers, neither Docker nor Podman")


# -- the project's Podman settings ------------------------------------------------------------------------------

CONTAINERS_CONF = """\
# Written by `python -m runner.launch.engine setup` (make podman); runner.launch.engine docs say why.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=20000:20000"]

[engine]
runtime = "runc"
"""

STORAGE_CONF = """\
# Written by `python -m runner.launch.engine setup` (make podman): images and the build cache stay here.
[storage]
driver = "overlay"
graphroot = "{root}/storage"
runroot = "{root}/run"
"""

REGISTRIES_CONF = """\
# Written by `python -m runner.launch.engine setup` (make podman): a registry on loopback speaks plain HTTP.
unqualified-search-registries = ["docker.io"]

[[registry]]
location = "127.0.0.1"
insecure = true

[[registry]]
location = "localhost"
insecure = true
"""


def write_settings(root: Path | None = None) -> dict[str, str]:
    """Write the three files under `root` (default cache_dir()); returns the variables that point at them."""
    root = root or cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    texts = {
        "CONTAINERS_CONF": CONTAINERS_CONF,
        "CONTAINERS_STORAGE_CONF": STORAGE_CONF.format(root=root),
        "CONTAINERS_REGISTRIES_CONF": REGISTRIES_CONF,
    }
    for key, text in texts.items():
        (root / CONFIG_ENV[key]).write_text(text)
    return {key: str(root / name) for key, name in CONFIG_ENV.items()}


def main(argv: list[str] | None = None) -> int:
    """`setup`: write the settings and print them as shell exports; `env`: print the exports of those present;
    `detect`: print the engine this machine would use, or why none (exit 1)."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["setup"]:
        settings = write_settings()
    elif args == ["env"]:
        settings = podman_settings({})
    elif args == ["detect"]:
        found = detect()
        print(found.engine.title if found.engine else found.why)
        return 0 if found.engine else 1
    else:
        print("usage: python -m runner.launch.engine setup|env|detect", file=sys.stderr)
        return 2
    print("".join(f"export {key}={value}\n" for key, value in settings.items()), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
