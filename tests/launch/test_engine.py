"""runner.launch.engine: which container engine answers here, found the same way for Docker and Podman, and the
project's Podman settings; and the command line container.plan_launch makes with each (stand-in CLIs that answer
`version` as the real ones do)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from runner import contract
from runner.backends import container
from runner.errors import BackendError, UsageError
from runner.launch import engine

STAND_IN = """\
#!{python}
import os, sys
args = sys.argv[1:]
answers = os.environ.get("STAND_IN_{name}", "")
if args[:3] == ["version", "--format", "{{{{.Server.Version}}}}"]:
    print(answers)
    sys.exit(0 if answers else 1)
if args[:2] == ["image", "inspect"]:
    sys.exit(0 if args[-1] == "img:1" else 1)
sys.exit(0)
"""


@pytest.fixture
def clis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`docker` and `podman` stand-ins on PATH, answering nothing until told to (STAND_IN_DOCKER / _PODMAN)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("docker", "podman"):
        script = bin_dir / name
        script.write_text(STAND_IN.format(python=sys.executable, name=name.upper()))
        script.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for key in engine.CONFIG_ENV:
        monkeypatch.delenv(key, raising=False)
    return bin_dir


def test_docker_first_then_podman_then_none_and_the_variable_chooses(
    clis: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert engine.detect() == engine.Found(None, "no container engine answers, neither Docker nor Podman")
    monkeypatch.setenv("STAND_IN_PODMAN", "4.3.1")
    assert engine.detect().engine == engine.Engine("podman", ("podman",), "4.3.1")  # a docker CLI alone is not one
    monkeypatch.setenv("STAND_IN_DOCKER", "24.0.7")
    assert engine.detect().engine == engine.Engine("docker", ("docker",), "24.0.7")
    monkeypatch.setenv(engine.ENGINE_ENV, "podman")
    assert engine.detect().engine == engine.Engine("podman", ("podman",), "4.3.1")
    monkeypatch.setenv("STAND_IN_PODMAN", "")
    found = engine.detect()
    assert found.engine is None and "Podman does not answer" in found.why
    assert "RUNNER_CONTAINER_ENGINE=podman" in found.why
    monkeypatch.setenv(engine.ENGINE_ENV, "containerd")
    with pytest.raises(UsageError, match="not a container engine"):
        engine.detect()


def test_the_podman_settings_are_written_to_the_cache_and_used_unless_given(
    clis: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert engine.podman_settings() == {}  # nothing written yet: Podman's own configuration
    written = engine.write_settings()
    root = tmp_path / "cache" / "tpu-runner" / "containers"
    assert written == {
        "CONTAINERS_CONF": str(root / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(root / "storage.conf"),
        "CONTAINERS_REGISTRIES_CONF": str(root / "registries.conf"),
    }
    assert engine.podman_settings() == written
    conf = (root / "containers.conf").read_text()
    assert 'runtime = "runc"' in conf and '"nofile=20000:20000"' in conf
    assert f'graphroot = "{root}/storage"' in (root / "storage.conf").read_text()
    assert engine.Engine("podman", ("podman",), "4.3.1").settings() == written
    assert engine.Engine("docker", ("docker",), "24.0.7").settings() == {}
    monkeypatch.setenv("CONTAINERS_CONF", "/elsewhere/containers.conf")
    assert engine.podman_settings() == {}  # the caller's own configuration is left whole


def test_plan_launch_runs_the_same_command_line_under_either_engine(
    clis: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("STAND_IN_PODMAN", "4.3.1")
    written = engine.write_settings()
    launch = container.plan_launch("img:1", {"SECRET": "x"}, name="n", data_dir=data, storage_root=tmp_path)
    assert launch.mode == "podman" and launch.reason == "Podman 4.3.1, image img:1, CPU"
    assert launch.argv[:6] == ["podman", "run", "--rm", "--name", "n", "--init"]
    assert launch.argv[launch.argv.index("SECRET") - 1] == "-e" and "x" not in launch.argv
    assert f"{data}:/data:ro" in launch.argv and launch.argv[-1] == "img:1"
    assert {k: launch.env[k] for k in written} == written  # the CLI runs with the project's settings
    monkeypatch.setenv("STAND_IN_DOCKER", "24.0.7")
    cache = tmp_path / "startup"  # made when missing: a run adds to it
    launch = container.plan_launch(
        "img:1", {"SECRET": "x"}, name="n", data_dir=data, storage_root=tmp_path, cache_dir=cache
    )
    assert launch.mode == "docker" and launch.argv[:2] == ["docker", "run"]
    assert not set(written) & set(launch.env)
    # The start-up cache, read-write, where the trainer inside looks for it.
    assert f"{cache}:{container.CONTAINER_CACHE_DIR}" in launch.argv and cache.is_dir()
    assert launch.env[contract.CACHE_DIR] == container.CONTAINER_CACHE_DIR
    cache.rmdir()
    cache.write_text("")  # not a directory: no mount, and the trainer inside keeps its own default
    launch = container.plan_launch("img:1", {}, name="n", data_dir=data, storage_root=tmp_path, cache_dir=cache)
    assert contract.CACHE_DIR not in launch.env and not any(str(cache) in a for a in launch.argv)
    # An image the engine does not have: the entrypoint as a process, saying why; or an error if asked for one.
    launch = container.plan_launch("img:2", {}, name="n", data_dir=None, storage_root=None)
    assert launch.mode == "process" and "image img:2 is not present in Docker 24.0.7" in launch.reason
    with pytest.raises(BackendError, match="cannot run in a container: image img:2 is not present"):
        container.plan_launch("img:2", {}, name="n", data_dir=None, storage_root=None, prefer="container")
    assert os.environ["PATH"] == str(clis)


def test_the_command_line_prints_the_settings_and_the_engine(
    clis: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert engine.main(["detect"]) == 1
    assert capsys.readouterr().out == "no container engine answers, neither Docker nor Podman\n"
    assert engine.main(["setup"]) == 0
    exports = capsys.readouterr().out.splitlines()
    assert [line.split("=")[0] for line in exports] == [f"export {key}" for key in engine.CONFIG_ENV]
    assert engine.main(["env"]) == 0 and capsys.readouterr().out.splitlines() == exports
    monkeypatch.setenv("STAND_IN_PODMAN", "4.3.1")
    assert engine.main(["detect"]) == 0 and capsys.readouterr().out == "Podman 4.3.1\n"
