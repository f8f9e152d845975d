"""The trainer image: lint (hadolint, shellcheck), what its Dockerfile declares, its entrypoint trained for real as a
local process with the image's environment, and a real image build where a Docker engine answers."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from runner import contract
from runner.backends import container
from runner.launch import image
from runner.spec import TrainingSpec
from tests.conftest import REPO
from tests.dockerfile import image_config


def _load(path: Path, name: str):  # type: ignore[no-untyped-def]
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec and module_spec.loader
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


image_requirements = _load(REPO / "docker" / "requirements.py", "image_requirements")  # what the image build runs

BIN = Path(sys.executable).parent
SKIP_DIRS = {".venv", ".git", "runs", ".pytest_cache", ".ruff_cache", "node_modules"}


def repo_files(match: re.Pattern[str]) -> list[Path]:
    """Regular files (not symlinks, so each file once) in the repository outside caches and the venv."""
    found = []
    for dirpath, dirnames, filenames in os.walk(REPO):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        found += [Path(dirpath, f) for f in filenames if match.search(f) and not Path(dirpath, f).is_symlink()]
    return sorted(found)


DOCKERFILES = repo_files(re.compile(r"^(Dockerfile(\.[\w-]+)?|[\w.-]+\.Dockerfile)$(?<!\.dockerignore)"))
SHELL_SCRIPTS = repo_files(re.compile(r"\.sh$"))


def tool(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{name} is missing: `pip install -e '.[dev]'` (make install) installs it"
    return str(path)


# -- lint -----------------------------------------------------------------------------------------------------------


def test_the_lint_targets_find_the_files() -> None:
    assert REPO / "docker" / "Dockerfile" in DOCKERFILES
    assert REPO / "runner" / "launch" / "startup-script.sh" in SHELL_SCRIPTS
    assert not any(p.name.endswith(".dockerignore") for p in DOCKERFILES)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_hadolint_clean(dockerfile: Path) -> None:
    result = subprocess.run(
        [tool("hadolint"), "--format", "json", str(dockerfile)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0 and json.loads(result.stdout or "[]") == [], result.stdout + result.stderr


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shellcheck_clean(script: Path) -> None:
    result = subprocess.run([tool("shellcheck"), "--format", "gcc", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# -- what the Dockerfile declares ---------------------------------------------------------------------------------


def test_every_variant_runs_the_supervisor_and_only_tpu_runs_as_root() -> None:
    for variant in image.VARIANTS:
        config = image_config(variant)
        assert config.argv == container.ENTRYPOINT == ["python", "-m", "runner.worker"]
        assert config.env["PYTHONPATH"] == "/opt/app" and config.env["PYTHONUNBUFFERED"] == "1"
    assert image_config("cpu").user == image_config("gpu").user == "1000:1000"
    assert image_config("gpu").env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    tpu = image_config("tpu")
    assert tpu.user is None  # root: libtpu needs the capabilities --privileged gives root (docker/README.md)
    assert tpu.env["TPU_LIBRARY_PATH"] == tpu.env["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] == "/lib/libtpu.so"
    assert tpu.env["NEXT_PLUGGABLE_DEVICE_USE_C_API"] == "true"
    assert "TPU_LIBRARY_PATH" not in image_config("cpu").env


def test_every_variant_installs_the_tensorflow_of_pyproject(tmp_path: Path) -> None:
    pins = dict(
        line.split("==")
        for line in (REPO / "docker" / "constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    tf = pins["tensorflow"]
    out = {}
    for variant in image.VARIANTS:
        generator = [sys.executable, str(REPO / "docker" / "requirements.py"), "requirements"]
        subprocess.run([*generator, "--variant", variant, "--out", str(tmp_path / variant)], check=True)
        out[variant] = (tmp_path / variant / "requirements.txt").read_text().splitlines()
        out[variant] += (tmp_path / variant / "no-deps.txt").read_text().splitlines()
    assert f"tensorflow-cpu=={tf}" in out["cpu"]  # the same TensorFlow without CUDA kernels
    assert f"tensorflow[and-cuda]=={tf}" in out["gpu"]
    assert f"tensorflow-tpu=={tf}" in out["tpu"]
    assert f"--find-links {image_requirements.LIBTPU_FIND_LINKS}" in out["tpu"]
    assert f"libtpu=={image_requirements.LIBTPU}" in out["tpu"]
    for variant in ("cpu", "tpu"):
        assert not any(r.startswith("tensorflow==") for r in out[variant])
        # tf-keras requires `tensorflow`, which would install the full build over tensorflow-cpu / -tpu
        assert (tmp_path / variant / "no-deps.txt").read_text().split() == [f"tf-keras=={pins['tf-keras']}"]
    assert (tmp_path / "gpu" / "no-deps.txt").read_text() == ""
    # One version for everything, the same in the Dockerfile, the generator and the lock.
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    assert f"ARG LIBTPU_VERSION={image_requirements.LIBTPU}" in dockerfile
    assert pins["libtpu"] == image_requirements.LIBTPU
    assert pins["tensorflow-tpu"] == pins["tensorflow-cpu"] == tf
    cuda = [name for name in pins if name.startswith("nvidia-")]
    assert pins["nvidia-cudnn-cu12"].startswith("9.3.") and pins["nvidia-cuda-runtime-cu12"].startswith("12.5.")
    assert len(cuda) == 12  # the CUDA TensorFlow 2.20 was built with: the floors of its and-cuda extra
    for variant in image.VARIANTS:
        for req in out[variant]:
            if not req.startswith("--"):
                name = re.split(r"[\[=<>~! ]", req, maxsplit=1)[0].lower().replace("_", "-")
                assert name in pins, f"{req}: not pinned in docker/constraints.txt (`make image-lock`)"


# -- the entrypoint, as a local process with the image's environment ----------------------------------------------


def image_env(variant: str = "cpu") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNNER_", "TF_USE_LEGACY_KERAS"))}
    return {**env, **image_config(variant).env}


def entrypoint_argv(variant: str = "cpu") -> list[str]:
    """The image's ENTRYPOINT + CMD, with `python` being this interpreter (the one with the runner and TensorFlow),
    as runner.backends.container runs it when there is no Docker engine."""
    argv = image_config(variant).argv
    assert argv[0] == "python"
    return [sys.executable, *argv[1:]]


@pytest.mark.slow
def test_the_entrypoint_trains_a_tiny_real_job(tmp_path: Path, mnist_npz: Path) -> None:
    training = TrainingSpec.model_validate({"max_train_examples": 256, "epochs": 1, "batch_size": 128})
    run_dir = tmp_path / "run"
    env = image_env()
    env.update(
        {
            contract.RUN_DIR: str(run_dir),
            contract.RUN_ID: "image-entrypoint",
            contract.TRAINING: training.model_dump_json(),
            contract.DATA_DIR: str(mnist_npz.parent),  # the real cache, ~/.cache/tpu-runner/datasets
        }
    )
    result = subprocess.run(
        entrypoint_argv(), env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((run_dir / contract.SUMMARY).read_text())
    assert summary["train_examples"] == 256 and summary["strategy"]["kind"] == "cpu"
    assert len((run_dir / contract.METRICS).read_text().splitlines()) == 1
    # Two steps of 128 real images: 0.32, 0.30 and 0.25 with seeds 0-2, where chance is 0.1.
    assert summary["test_accuracy"] >= 0.2
    exit_record = json.loads((run_dir / contract.exit_key(0)).read_text())
    assert (exit_record["state"], exit_record["exit_code"]) == ("succeeded", 0)


def test_the_entrypoint_runs_a_custom_command_under_the_same_contract(tmp_path: Path) -> None:
    script = (
        "import json, os; print('custom', json.dumps({k: os.environ[k] for k in "
        "['RUNNER_RUN_ID', 'RUNNER_OUTPUT_DIR', 'RUNNER_CHECKPOINT_DIR', 'PYTHONPATH']}))"
    )
    run_dir = tmp_path / "run"
    env = image_env()
    env.update(
        {
            contract.RUN_DIR: str(run_dir),
            contract.RUN_ID: "custom",
            contract.COMMAND: json.dumps([sys.executable, "-c", script]),
        }
    )
    result = subprocess.run(entrypoint_argv(), env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    seen = json.loads(result.stdout.split("custom ", 1)[1].splitlines()[0])
    assert seen == {
        "RUNNER_RUN_ID": "custom",
        "RUNNER_OUTPUT_DIR": str(run_dir),
        "RUNNER_CHECKPOINT_DIR": str(run_dir / "checkpoints"),
        "PYTHONPATH": "/opt/app",
    }
    assert "custom" in (run_dir / contract.log_key(0)).read_text()
    assert json.loads((run_dir / contract.exit_key(0)).read_text())["state"] == "succeeded"


def test_the_entrypoint_refuses_to_start_without_a_run_directory() -> None:
    result = subprocess.run(entrypoint_argv(), env=image_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "RUNNER_RUN_DIR is not set" in result.stderr


# -- the image itself, where a Docker engine answers ----------------------------------------------------------------

ENGINE = container.docker_engine()
needs_engine = pytest.mark.skipif(
    ENGINE is None,
    reason="no Docker engine answers `docker info` here"
    + ("" if os.path.exists("/var/run/docker.sock") or os.environ.get("DOCKER_HOST") else " (no docker socket)")
    + ": the image build and the containerized run are tested only where one does",
)


@pytest.mark.slow
@needs_engine
def test_build_the_cpu_image_and_train_in_it(tmp_path: Path, mnist_npz: Path) -> None:
    result = image.ensure_image("cpu")
    again = image.ensure_image("cpu")
    assert again.built is False and again.reference == result.reference  # same code, same tag: no rebuild
    inspect = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .Config}}", result.reference],
        capture_output=True,
        text=True,
        check=True,
    )
    config = json.loads(inspect.stdout)
    assert config["Entrypoint"] == container.ENTRYPOINT and config["User"] == "1000:1000"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.chmod(run_dir, 0o777)  # the container's user writes here
    training = TrainingSpec.model_validate({"max_train_examples": 256, "epochs": 1, "batch_size": 128})
    env = {
        contract.RUN_DIR: str(run_dir),
        contract.RUN_ID: "in-docker",
        contract.TRAINING: training.model_dump_json(),
        contract.DATA_DIR: container.CONTAINER_DATA_DIR,
    }
    mounts = [(str(mnist_npz.parent), container.CONTAINER_DATA_DIR, True), (str(run_dir), str(run_dir), False)]
    argv = container.docker_argv(result.reference, "tpu-runner-image-test", env, mounts, gpus=False)
    run = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=900, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert json.loads((run_dir / contract.SUMMARY).read_text())["train_examples"] == 256
