"""`runner build --context DIR` with your requirements, built for real by the engine this machine has (Docker, or
Podman as `make containers` sets it up): the package importable in the container as its own user, the framework
untouched, and the dependency layer reused when only the code changes. Where no engine can run this skips (fails
with CI=true): tests/containers.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from runner.launch import build, code
from runner.launch.engine import Engine
from tests.containers import GROUP
from tests.launch.test_container import in_image
from tpu_emulator.registry import machine_ca_certs

pytestmark = [pytest.mark.slow, GROUP]
SHOW = (
    "import importlib.metadata as m, json, os, tabulate\n"
    "print(json.dumps({'file': tabulate.__file__, 'version': tabulate.__version__, 'uid': os.getuid(),\n"
    "  'keras': m.version('keras'), 'cwd': os.getcwd(), 'code': open('train.py').read()}))"
)


def layers(engine: Engine, ref: str) -> list[str]:
    result = engine.run("image", "inspect", "--format", "{{json .RootFS.Layers}}", ref)
    assert result.returncode == 0, result.stderr
    return list(json.loads(result.stdout))


def test_requirements_go_in_a_layer_of_their_own_that_a_code_change_reuses(
    container_engine: Engine, cpu_image: build.ImageResult, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('version 1')\n")
    (project / "requirements.txt").write_text("tabulate==0.9.0\nkeras>=3\n")
    keras = code.variant_pins("cpu").versions["keras"]  # type: ignore[union-attr]
    said: list[str] = []

    def build_code() -> tuple[build.ImageResult, float]:
        # an earlier run of this test on this machine left this content's image: the test is of a build
        container_engine.run("rmi", "--force", code.code_reference(cpu_image.reference, project))
        started = time.monotonic()
        result = code.ensure_code_image(
            cpu_image, project, engine=container_engine, say=said.append, ca_certs=machine_ca_certs()
        )
        return result, time.monotonic() - started

    first, cold_s = build_code()
    assert first.built and first.reference == code.code_reference(cpu_image.reference, project)
    assert any(line.startswith("dependencies: tabulate==0.9.0, in a layer under the code") for line in said)
    seen = json.loads(in_image(container_engine, first.reference, SHOW))
    assert seen == {
        "file": "/usr/local/lib/python3.11/site-packages/tabulate/__init__.py",  # beside the framework, not --user
        "version": "0.9.0",
        "uid": 1000,  # the image's own user again after the layer's root
        "keras": keras,  # keras>=3 asked for nothing: the image's stays
        "cwd": "/workspace",
        "code": "print('version 1')\n",
    }

    (project / "train.py").write_text("print('version 2')\n")  # the code alone changes
    second, warm_s = build_code()
    assert second.built and second.reference != first.reference
    base, one, two = (layers(container_engine, ref) for ref in (cpu_image.reference, first.reference, second.reference))
    assert one[: len(base)] == base == two[: len(base)]
    deps_layer = len(base)
    assert one[deps_layer] == two[deps_layer]  # the same dependency layer: reused, not installed again
    assert one[deps_layer + 1 :] != two[deps_layer + 1 :]  # a new code layer
    assert json.loads(in_image(container_engine, second.reference, SHOW))["code"] == "print('version 2')\n"
    print(f"code image with tabulate==0.9.0: {cold_s:.1f} s with the pip layer, {warm_s:.1f} s after a code change")
