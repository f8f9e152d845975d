"""The container engine for the tests that build and run the trainer image for real (tests/launch/test_container.py,
tests/emulator/test_emulator_containers.py).

They need an engine that answers (Docker, or Podman as `make containers` sets it up) and, under Podman, the Python
base image. Where either is missing they skip, naming why; with CI=true, where `make containers` must have made both
ready, the same absence fails them. `make test` builds the images before pytest (`make test-images`: prebuild
below), timed apart; a fixture builds what is still missing, once per test process (session fixtures), with this
machine's extra CA certificates as the build's secret. They run in one xdist group, one after the other: one build,
and never two jobs in containers at once on a 2-core machine.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.launch import build
from runner.launch import engine as engines
from runner.launch.engine import Engine
from tpu_emulator import registry as registries
from tpu_emulator.registry import LocalRegistry

GROUP = pytest.mark.xdist_group("containers")
BASE_IMAGE = next(
    line.split("=", 1)[1].strip()
    for line in (Path(__file__).resolve().parent.parent / "docker" / "Dockerfile").read_text().splitlines()
    if line.startswith("ARG PYTHON_IMAGE=")
)


def unavailable(why: str) -> None:
    """Skip, saying why; with CI=true fail instead: CI sets the engine up, so its absence is a defect there."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true, and the tests that build and run the image cannot run: {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def container_engine() -> Engine:
    found = engines.detect()
    if found.engine is None:
        unavailable(f"{found.why}: `make containers` installs Podman (as root, with apt) or start Docker")
    assert found.engine is not None
    if found.engine.name == "podman" and found.engine.run("image", "exists", BASE_IMAGE).returncode != 0:
        unavailable(f"Podman has no {BASE_IMAGE} and cannot pull it: `make containers` makes it (make base-image)")
    return found.engine


@pytest.fixture
def use_container_engine(container_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Engine:
    """The runner started by a test takes the engine the image was built with (conftest clears RUNNER_*)."""
    monkeypatch.setenv(engines.ENGINE_ENV, container_engine.name)
    return container_engine


@pytest.fixture(scope="session")
def cpu_image(container_engine: Engine) -> build.ImageResult:
    """The cpu image of this checkout, as `runner build --variant cpu --ca-certs ...` makes it."""
    return build.ensure_image("cpu", ca_certs=registries.machine_ca_certs(), engine=container_engine)


@pytest.fixture(scope="session")
def image_registry(container_engine: Engine) -> Iterator[LocalRegistry]:
    """A real image registry on loopback (Debian's docker-registry), its storage kept in the cache."""
    if registries.binary() is None:
        unavailable("no image registry binary (docker-registry): `make containers` installs it")
    with LocalRegistry() as running:
        yield running


# The images the fixtures above ask for, built before pytest starts (`make test-images`, run by `make test`): tagged
# by content, so a build is paid once per change of the image's inputs, outside the suite's time, and a test
# finds its image present. The same calls as the fixtures (cpu_image, the gpu variant of test_container), so the
# tags agree.
PREBUILT = ("cpu", "gpu")


def prebuild() -> int:
    """Build what is missing; 0 when every image is there, 1 (the reason on stderr) when no engine can build."""
    import sys
    import time

    found = engines.detect()
    if found.engine is None:
        print(f"[test-images] {found.why}: the container tests build the images themselves, or skip", file=sys.stderr)
        return 1
    for variant in PREBUILT:
        started = time.monotonic()
        result = build.ensure_image(variant, ca_certs=registries.machine_ca_certs(), engine=found.engine)
        what = "built" if result.built else "already there"
        print(f"[test-images] {result.reference}: {what} in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(prebuild())
